"""A ``publisher_acl`` user is root-equivalent (issue 34 #4), shown on a real salt-master (no minion needed):
Salt 3008.5's ``LoadAuth.authenticate_key`` accepts a ``publisher_acl`` user's own key for a claimed ``root``,
the master's user or ``sudo_<name>``, and ``ClearFuncs.publish`` checks no ACL for a claimed root. The runner
cannot tell such a job from root's, so salt-virt gives a ``publisher_acl`` user no tenant; eauth stays the
tenants' door (docs/topics/tenants.md).

    pubann  publisher_acl {pubann: [test.*]}, listed as a member of tenant acme (refused)
    alice   file eauth, @runner virt.*, member of tenant acme (salt-run --eauth's way to the master)

Requests go to the master's request server as the ``salt``/``salt-run`` CLIs send them (clear load with
``user``/``key``, or eauth credentials), from this process (root: it reads the key files a user would own).
"""

import pathlib

import pytest
import salt.channel.client
import salt.config
import salt.exceptions
import salt.runner

from tests.support.paths import ROOT
from tests.support.saltd import master_config

PUB = "pubann"
ALICE = ("alice", "alice-pw-93d")
OPERATOR = {"operator": True, "tenant": None, "why": "root on the master"}
PUB_REFUSAL = f"user {PUB} is in this master's publisher_acl, whose users Salt lets run any job as root"


@pytest.fixture(scope="module")
def master(salt_factories, state_tree, tmp_path_factory):
    users = tmp_path_factory.mktemp("eauth") / "users"
    users.write_text(f"{ALICE[0]}:{ALICE[1]}\n")
    eauth = {
        "^filename": str(users),
        "^filetype": "text",
        "^hashtype": "plaintext",
        ALICE[0]: [{"@runner": ["virt.*"]}],
    }
    virt = {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob"}, "tenants": {"acme": {"members": [PUB, ALICE[0]]}}}
    config = master_config(
        state_tree,
        publisher_acl={PUB: ["test.*"]},
        client_acl_verify=False,  # pubann needs no OS account for the master to make its key
        external_auth={"file": eauth},
        runner_dirs=[str(ROOT / "_runners")],
        ext_pillar=[],
        virt=virt,
    )
    factory = salt_factories.salt_master_daemon("pacl-master", overrides=config)
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def pub_key(master):
    """The key the master made for pubann (``<cachedir>/.pubann_key``, pubann's to read)."""
    return (pathlib.Path(master.config["cachedir"]) / f".{PUB}_key").read_text()


def runner(master, fun, **creds):
    """``fun``'s answer for a runner job started with ``creds``, as ``salt-run`` sends it to the master."""
    with salt.runner.RunnerClient(salt.config.client_config(master.config_file)) as client:
        return client.cmd_sync({"fun": fun, **creds}, timeout=120)


def publish(master, fun, **creds):
    """The master's answer to a publication of ``fun`` to a target no minion matches, as ``salt`` sends it."""
    load = {"cmd": "publish", "tgt": "nobody-here*", "tgt_type": "glob", "fun": fun, "arg": ["id"]}
    load.update(ret="", jid="", kwargs={}, **creds)
    with salt.channel.client.ReqChannel.factory(salt.config.client_config(master.config_file), crypt="clear") as ch:
        return ch.send(load)


def test_a_key_holder_runs_runner_jobs_as_root(master, pub_key):
    """The claim: pubann's own key starts runner jobs as root, as the master's user and as sudo_<anyone> (the
    master's user), which the runner takes for root on the master. A name that holds no key is refused."""
    master_user = master.config.get("user") or "root"
    for claimed in ("root", master_user, "sudo_mallory"):
        who = runner(master, "virt.whoami", user=claimed, key=pub_key)
        assert who == {"user": master_user if claimed.startswith("sudo_") else claimed, **OPERATOR}, (claimed, who)
    with pytest.raises(salt.exceptions.SaltException, match='Authentication failure of type "user"'):
        runner(master, "virt.whoami", user="mallory", key=pub_key)


def test_a_key_holder_publishes_as_root_past_its_acl(master, pub_key):
    """The same key publishes cmd.run as root: authorised (the master only finds no minion), where as
    itself the publisher_acl allows test.* only. So a publisher_acl user is root on every minion too."""
    assert publish(master, "cmd.run", user=PUB, key=pub_key)["error"]["name"] == "AuthorizationError"
    as_root = publish(master, "cmd.run", user="root", key=pub_key)
    assert "Master could not resolve minions" in as_root["load"]["error"], as_root


def test_a_key_holder_gets_no_tenant_and_eauth_users_do(master, pub_key):
    """salt-virt refuses pubann the tenant virt:tenants lists it in, with what the operator does instead;
    alice, the same tenant's eauth member (salt-run --eauth), acts for it."""
    refused = runner(master, "virt.whoami", user=PUB, key=pub_key)["data"]["error"]
    assert refused.startswith(PUB_REFUSAL) and "virt:operators" in refused and "eauth" in refused, refused
    alice = runner(master, "virt.whoami", username=ALICE[0], password=ALICE[1], eauth="file")
    assert alice == {"user": "alice", "operator": False, "tenant": "acme", "why": "member of tenant acme"}
