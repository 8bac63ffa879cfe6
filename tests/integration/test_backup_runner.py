"""``salt-run virt.backup`` with a real salt-master and hypervisor minion over a real libvirtd (hv15): every
VM backed up on its hypervisor, retention from the master config applied, failures reported with exit
code 1; with tenants (bkrun1 belongs to tenant acme), a tenant member (``file`` eauth through salt-run) backs
up its own VMs only; ``salt-run virt.restore`` asks every hypervisor before it restores on another one
(bkhv2: libvirt's test driver, a hypervisor minion that mounts the same backup directory; the restore
itself on a real second libvirtd: tests/integration/test_backup_real.py); a tenant member restores its own
tenant's backups only, a copy within its quota (acme: 2 VMs). The VMs are stopped (offline
copies): the live path is tests/integration/test_backup_real.py."""

import os
import pathlib

import pytest

from tests.support import lab
from tests.support.paths import GUEST_DIR, TEST_NODE_XML
from tests.support.saltd import hypervisor_minion_config, master_config, presync, start_minion
from tests.support.saltloader import make_minion_mods

MASTER_VIRT = {
    "hypervisors": {"tgt": ["bkhv1", "bkhv2"], "tgt_type": "list", "timeout": 5, "gather_job_timeout": 8},
    "backup": {"per_host": 1, "retention": {"keep": 1}},
    "tenants": {
        "acme": {"members": ["alice"], "quota": {"vms": 2, "backup_mib": 100000}},
        "beta": {"members": ["bob"]},
    },
}
ALICE = ("--eauth", "file", "--username", "alice", "--password", "alice-secret")  # salt-run as tenant acme


@pytest.fixture(scope="module")
def hv15(lab_dir, fabric):
    hv = lab.Hypervisor(lab_dir, 15, fabric).start()  # 15: used by no other module
    yield hv
    hv.stop()


@pytest.fixture(scope="module")
def bkmaster(salt_factories, state_tree, tmp_path_factory):
    users = tmp_path_factory.mktemp("eauth") / "users"
    users.write_text("alice:alice-secret\n")
    users.chmod(0o600)
    eauth = {"file": {"^filename": str(users), "^filetype": "text", "^hashtype": "plaintext", "alice": ["@runner"]}}
    overrides = master_config(state_tree, virt=MASTER_VIRT, external_auth=eauth)
    factory = presync(salt_factories.salt_master_daemon("bk-master", overrides=overrides))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def fleet(bkmaster, hv15, lab_dir, tmp_path_factory):
    """Minion bkhv1 managing hv15 with a backup directory; two stopped VMs defined there."""
    root = pathlib.Path(lab_dir) / "bk-runner"
    (root / "backups").mkdir(parents=True)
    (root / "backups").chmod(0o755)
    config = hypervisor_minion_config(hv15, root / "images")
    key = root / "backup.key"  # both hypervisors sign and check manifests with it (virt:backup:key_file)
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    config["virt"]["backup"] = {"dir": str(root / "backups"), "key_file": str(key)}
    mods = make_minion_mods(tmp_path_factory.mktemp("bkmods"), hv15.uri, images_dir=root / "images")
    for name, owner in (("bkrun1", {"tenant": "acme", "creator": "alice"}), ("bkrun2", None)):
        image = str(GUEST_DIR / "disk.qcow2")
        mods["virt.init"](name, 1, 128, image=image, seed=False, start=False, nic=None, owner=owner)
    other = {  # a second hypervisor on libvirt's test driver (a node with no VMs), same backup directory
        "virt": {"connection": {"uri": f"test://{TEST_NODE_XML}"}, "images": str(root / "images2")},
        "grains": {"virt_hypervisor": True},
    }
    other["virt"]["backup"] = config["virt"]["backup"]
    with start_minion(bkmaster, "bkhv1", config).started(), start_minion(bkmaster, "bkhv2", other).started():
        ret = bkmaster.salt_cli(timeout=180).run("test.ping", minion_tgt="bkhv*")
        assert ret.returncode == 0 and sorted(ret.data) == ["bkhv1", "bkhv2"], ret
        yield root


def test_runner_backs_up_every_vm_and_applies_retention(bkmaster, fleet):
    run = bkmaster.salt_run_cli(timeout=600).run
    first = run("virt.backup", "all")
    assert first.returncode == 0, first
    made = first.data["made"]
    assert sorted(made) == ["bkrun1", "bkrun2"] and first.data["failed"] == {} and first.data["down"] == []
    assert {m["host"] for m in made.values()} == {"bkhv1"} and {m["type"] for m in made.values()} == {"full"}
    assert first.data["pruned"]["bkrun1"] == {"pruned": [], "kept": [made["bkrun1"]["id"]]}
    assert first.data["backup_mib"]["acme"]["quota"] == 100000  # acme's backup_mib quota applies to every run

    second = run("virt.backup", "bkrun1")
    assert second.returncode == 0, second
    newer = second.data["made"]["bkrun1"]["id"]
    assert "stopped" in second.data["made"]["bkrun1"]["note"]  # incremental asked: a stopped VM gets a full one
    assert second.data["pruned"]["bkrun1"] == {"pruned": [made["bkrun1"]["id"]], "kept": [newer]}
    (vm_dir,) = (fleet / "backups" / "bkrun1").iterdir()  # one VM of that name: <backups>/bkrun1/<uuid>
    left = sorted(p.name for p in vm_dir.iterdir() if not p.name.startswith("."))
    assert left == [f"{newer}.json", f"{newer}.vda.qcow2"]

    missing = run("virt.backup", "nosuchvm")
    assert missing.returncode == 1 and "not defined on any hypervisor" in missing.data["failed"]["nosuchvm"]


def test_runner_backs_up_a_tenants_vms_only(bkmaster, fleet):
    run = bkmaster.salt_run_cli(timeout=600).run
    ops = run("virt.backup", "all", "tenant=acme")  # an operator (root on the master) picks one tenant
    assert ops.returncode == 0 and sorted(ops.data["made"]) == ["bkrun1"] and ops.data["failed"] == {}, ops

    mine = run(*ALICE, "virt.backup", "all")  # alice's "all" is tenant acme's VMs
    assert sorted(mine.data["made"]) == ["bkrun1"] and mine.data["failed"] == {}, mine
    assert 0 < mine.data["backup_mib"]["acme"]["used"] < 100000, mine  # its backups, counted by the hypervisors
    assert mine.data["made"]["bkrun1"]["host"] == "bkhv1"
    other = run(*ALICE, "virt.backup", "bkrun2")  # another tenant's (here: no tenant's) VM is not there
    assert other.data["made"] == {} and other.data["failed"] == {"bkrun2": "no VM named bkrun2 in tenant acme"}
    refused = run(*ALICE, "virt.backup", "all", "tenant=beta")
    assert refused.data == {"error": "user alice is in tenant acme: tenant=beta is refused", "retcode": 1}


def test_restore_on_another_hypervisor_never_runs_one_vm_twice(bkmaster, fleet):
    run = bkmaster.salt_run_cli(timeout=600).run
    made = run("virt.backup", "bkrun2", "incremental=False")
    assert made.returncode == 0, made
    bid = made.data["made"]["bkrun2"]["id"]

    twice = run("virt.restore", "bkrun2", bid, "host=bkhv2")  # bkrun2 is still defined on bkhv1
    assert twice.returncode == 1 and twice.data["error"].startswith(
        "VM bkrun2 is defined on bkhv1 (shutoff): restoring it on bkhv2 under the same name could run it twice"
    ), twice
    assert not (fleet / "images2" / "bkrun2").exists()  # bkhv2 was never asked
    taken = run("virt.restore", "bkrun2", bid, "host=bkhv2", "as=bkrun1")
    assert taken.returncode == 1 and taken.data["error"].startswith("a VM named bkrun1 is defined on bkhv1"), taken

    copy = run("virt.restore", "bkrun2", bid, "host=bkhv2", "as=bkrun2-copy")  # a new identity: allowed
    assert copy.returncode == 0 and (copy.data["host"], copy.data["name"]) == ("bkhv2", "bkrun2-copy"), copy
    assert copy.data["result"]["chain"] == [bid]
    assert copy.data["result"]["disks"]["vda"].startswith(str(fleet / "images2" / "bkrun2-copy"))


def test_a_tenant_restores_its_own_backups_within_its_quota(bkmaster, fleet):
    """The owner comes from the domain XML the backup recorded; a copy is a new VM of the tenant's quota
    (restored on bkhv1, a real libvirtd: the test driver of bkhv2 forgets its VMs between calls)."""
    run = bkmaster.salt_run_cli(timeout=600).run
    mine = run(*ALICE, "virt.backup", "bkrun1", "incremental=False")
    assert mine.returncode == 0, mine
    bid = mine.data["made"]["bkrun1"]["id"]
    copy = run(*ALICE, "virt.restore", "bkrun1", bid, "host=bkhv1", "as=bkrun1-copy")  # acme: bkrun1 + the copy
    assert copy.returncode == 0 and (copy.data["host"], copy.data["name"]) == ("bkhv1", "bkrun1-copy"), copy
    info = bkmaster.salt_cli(timeout=120).run("virt.vm_info", "bkrun1-copy", minion_tgt="bkhv1")
    assert info.data["bkrun1-copy"]["owner"] == {"tenant": "acme", "creator": "alice"}, info  # as recorded
    # a name another VM has (here: one of no tenant's): taken, whose and where not said (issue 34 #7)
    taken = run(*ALICE, "virt.restore", "bkrun1", bid, "host=bkhv1", "as=bkrun2")
    assert taken.data == {"error": "the name bkrun2 is taken: pick another name", "retcode": 1}, taken
    refused = run(*ALICE, "virt.restore", "bkrun1", bid, "host=bkhv1", "as=bkrun1-two")
    assert refused.returncode == 1 and refused.data["error"].startswith(
        "tenant acme: 2 of 2 VMs used, asked 1: no room for bkrun1-two"
    ), refused
    theirs = run("virt.backup", "bkrun2")  # an operator's backup of a VM of no tenant
    tid = theirs.data["made"]["bkrun2"]["id"]
    other = run(*ALICE, "virt.restore", "bkrun2", tid, "host=bkhv1", "as=mine")
    assert other.data == {"error": f"no backup {tid} of a VM named bkrun2 in tenant acme", "retcode": 1}, other
