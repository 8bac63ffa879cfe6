"""VMs as Salt Resources (``virt_vm``) with a real salt-master and two real hypervisor minions: the master's
pillar declares the type for ``rshv1`` and ``rshv2``, each discovers the VMs its libvirt has and registers them, and
``salt -C 'T@virt_vm:<uuid>' ...`` reaches a VM with no minion inside through its hypervisor. Beside it, a plain
minion called ``web1`` (what a guest's own minion is often called) keeps its id: a VM resource's id is its UUID.

Each hypervisor's libvirt is the test driver over a node file (rshv1: three VMs: two running, one of them tenant
acme's made from catalog image debian12, and a stopped one; rshv2: db2; every job opens it afresh): what is tested
here is Salt's side (pillar declaration, discovery at start, registration, ``T@`` and compound targeting, the per-
resource return, the job's target handed to the resource's functions), which is the same over any libvirt; the
libvirt facts themselves are checked in tests/unit/host/test_vmresources.py and
tests/unit/loaders/test_resources_virt_vm.py. Not on the session master: a minion with resources changes what ``salt
'*'`` waits for (Salt adds every registered resource id to a glob's wait list), which other tests there count on.

The master config makes alice (eauth) a member of tenant acme; its ``libvirt`` ext_pillar gives that membership
to rshv1 and rshv2 (its hypervisors), whose resources answer alice about acme's VMs only.
"""

import json
import time

import pytest

from saltvirt.xml.domain.metadata import METADATA_NS
from tests.support.saltd import master_config, presync, start_minion

WEB = "3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a001"  # acme's web1
DB = "3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a002"  # an operator's db1
OFF = "3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a003"  # off1, stopped
DB2 = "3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a004"  # db2, an operator's, on rshv2
NODE = f"""<node>
<cpu><mhz>2400</mhz><active>2</active><max>2</max><nodes>1</nodes><sockets>1</sockets><cores>2</cores>
<threads>1</threads></cpu><memory>4194304</memory>
<domain type='test'><name>web1</name><uuid>{WEB}</uuid><memory unit='MiB'>256</memory><vcpu>1</vcpu>
<metadata><sv:vm xmlns:sv='{METADATA_NS}'><sv:owner tenant='acme' creator='alice'/><sv:group>web</sv:group>
<sv:image>debian12</sv:image></sv:vm></metadata><os><type>hvm</type></os></domain>
<domain type='test'><name>db1</name><uuid>{DB}</uuid><memory unit='MiB'>512</memory><vcpu>2</vcpu>
<metadata><sv:vm xmlns:sv='{METADATA_NS}'><sv:group>db</sv:group></sv:vm></metadata><os><type>hvm</type></os></domain>
<domain type='test' xmlns:test='http://libvirt.org/schemas/domain/test/1.0'><name>off1</name><uuid>{OFF}</uuid>
<memory unit='MiB'>128</memory><vcpu>1</vcpu><os><type>hvm</type></os><test:runstate>5</test:runstate></domain>
</node>"""
NODE2 = f"""<node>
<cpu><mhz>2400</mhz><active>2</active><max>2</max><nodes>1</nodes><sockets>1</sockets><cores>2</cores>
<threads>1</threads></cpu><memory>4194304</memory>
<domain type='test'><name>db2</name><uuid>{DB2}</uuid><memory unit='MiB'>512</memory><vcpu>2</vcpu>
<metadata><sv:vm xmlns:sv='{METADATA_NS}'><sv:group>db</sv:group></sv:vm></metadata><os><type>hvm</type></os></domain>
</node>"""
VMS = [WEB, DB, OFF, DB2]
ALICE = ("--eauth", "file", "--username", "alice", "--password", "alice-secret")
DAVE = ("--eauth", "file", "--username", "dave", "--password", "dave-secret")
REFUSED = "is for operators, and user alice is not in this minion's virt:operators"
BOUND = 60  # seconds for the hypervisor's registration to reach the master


@pytest.fixture(scope="module")
def rsmaster(salt_factories, state_tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("rs")
    pillar = root / "pillar"
    pillar.mkdir()
    (pillar / "top.sls").write_text("base:\n  'rshv[12]':\n    - resources\n")
    (pillar / "resources.sls").write_text("resources:\n  virt_vm: {}\n")  # the operator declares the type
    users = root / "users"
    users.write_text("alice:alice-secret\ndave:dave-secret\n")
    users.chmod(0o600)
    # Salt's own ACL lets alice publish anything: the hypervisor's gates are what refuse her; dave (acme too) has
    # the ACL docs/topics/resources.md suggests for a tenant: the resource functions, on virt_vm resources only
    acl = {"alice": [".*"], "dave": [{"T@virt_vm": ["test.ping", "grains.*", "virt.*"]}]}
    eauth = {"file": {"^filename": str(users), "^filetype": "text", "^hashtype": "plaintext", **acl}}
    # the tenants, and the libvirt ext_pillar that tells the hypervisors who belongs to which (quick EC keys)
    virt = {"hypervisors": ["rshv1", "rshv2"], "tenants": {"acme": {"members": ["alice", "dave"]}}}
    overrides = master_config(
        state_tree,
        pillar_roots={"base": [str(pillar)]},
        ext_pillar=[{"libvirt": {"key_type": "ec", "key_size": 256}}],
        external_auth=eauth,
        virt=virt,
    )
    factory = presync(salt_factories.salt_master_daemon("rs-master", overrides=overrides))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def minions(rsmaster, tmp_path_factory):
    hypers = {}
    for mid, xml in (("rshv1", NODE), ("rshv2", NODE2)):
        node = tmp_path_factory.mktemp("rsnode") / "node.xml"
        node.write_text(xml)
        hypers[mid] = {"virt": {"connection": {"uri": f"test://{node}"}}, "grains": {"virt_hypervisor": True}}
    with start_minion(rsmaster, "rshv1", hypers["rshv1"]).started():
        with start_minion(rsmaster, "rshv2", hypers["rshv2"]).started(), start_minion(rsmaster, "web1", {}).started():
            yield


def salt(rsmaster, tgt, *args):
    return rsmaster.salt_cli(timeout=60).run(*args, minion_tgt=tgt)


def registered(rsmaster):
    """Wait until the master knows the VMs as resources (the minion registers them after it connects)."""
    deadline = time.monotonic() + BOUND
    while True:
        ret = salt(rsmaster, "T@virt_vm", "-C", "test.ping")
        if ret.returncode == 0 and sorted(ret.data) == sorted(VMS):
            return ret
        assert time.monotonic() < deadline, f"virt_vm resources not registered after {BOUND} s: {ret}"


def test_a_vm_is_targeted_through_its_hypervisor(rsmaster, minions):
    ret = salt(rsmaster, f"T@virt_vm:{WEB}", "-C", "grains.items")
    assert ret.returncode == 0, ret
    assert list(ret.data) == [WEB]
    grains = ret.data[WEB]
    assert (grains["name"], grains["hypervisor"], grains["tenant"], grains["group"]) == ("web1", "rshv1", "acme", "web")
    assert (grains["state"], grains["vcpus"], grains["mem_mib"], grains["image"]) == ("running", 1, 256, "debian12")

    assert registered(rsmaster).data == {WEB: True, DB: True, OFF: False, DB2: True}
    # a selection by what the hypervisor knows, mixed with the type (the grain is the VM's, not a minion's)
    ret = salt(rsmaster, "T@virt_vm and G@tenant:acme", "-C", "grains.get", "name")
    assert ret.returncode == 0 and ret.data == {WEB: "web1"}, ret


def test_a_guest_minion_and_its_vm_resource_keep_their_own_ids(rsmaster, minions):
    registered(rsmaster)
    ret = salt(rsmaster, "web1", "test.ping")  # the minion called web1, not the VM of that name
    assert ret.returncode == 0 and json.loads(ret.stdout) == {"web1": True}, ret
    ret = salt(rsmaster, "*", "test.ping")  # Salt adds the registered resources to a glob
    assert ret.returncode == 0 and ret.data == {
        "rshv1": True,
        "rshv2": True,
        "web1": True,
        WEB: True,
        DB: True,
        OFF: False,
        DB2: True,
    }, ret
    # ... to every glob with a wildcard: a function the type does not have fails on each VM (documented)
    ret = salt(rsmaster, "rshv*", "test.version")
    assert ret.returncode != 0 and sorted(ret.data) == sorted(["rshv1", "rshv2", *VMS]), ret
    assert "is not supported for resource type 'virt_vm'" in str(ret.data[WEB]), ret


def test_a_tenants_eauth_user_gets_answers_about_its_own_tenants_vms_only(rsmaster, minions):
    """alice (acme) asks every VM resource: acme's web1 answers, the operator's db1 and off1 refuse her in the operator
    gate's one wording; cmd.run is refused on her own VM too (operators only, and off here)."""
    registered(rsmaster)
    ret = salt(rsmaster, "T@virt_vm", "-C", *ALICE, "grains.get", "tenant")
    assert ret.returncode != 0 and sorted(ret.data) == sorted(VMS), ret
    assert ret.data[WEB] == "acme", ret
    for vm in (DB, OFF, DB2):  # the operator's
        assert REFUSED in str(ret.data[vm]) and "acme" not in str(ret.data[vm]), ret
    ret = salt(rsmaster, f"T@virt_vm:{WEB}", "-C", *ALICE, "test.ping")
    assert ret.returncode == 0 and ret.data == {WEB: True}, ret
    ret = salt(rsmaster, f"T@virt_vm:{WEB}", "-C", *ALICE, "cmd.run", "id")
    assert ret.returncode != 0 and "cmd.run on a hypervisor is for operators" in str(ret.data[WEB]), ret


def test_a_resource_scoped_acl_keeps_a_tenants_user_off_the_minions(rsmaster, minions):
    """dave's Salt ACL names the virt_vm resources only: Salt lets him reach them (and the hypervisor's tenant
    gate his tenant's), and refuses him the hypervisor and the other minions before anything is published."""
    registered(rsmaster)
    ret = salt(rsmaster, f"T@virt_vm:{WEB}", "-C", *DAVE, "grains.get", "name")
    assert ret.returncode == 0 and ret.data == {WEB: "web1"}, ret
    for tgt in ("rshv1", "web1"):
        ret = salt(rsmaster, tgt, *DAVE, "test.ping")
        assert ret.stdout.strip() == "Authorization error occurred." and ret.data is None, ret  # Salt exits 0


def test_a_fleet_operation_acts_on_the_vms_the_same_selection_targets(rsmaster, minions):
    """``salt-run virt.stop select=`` picks from the hypervisors' signed answers the VMs ``salt -C`` reaches with the
    same expression, and stops exactly those, on one hypervisor or across both (the node file is read afresh by
    every job: what it stopped is not kept)."""
    registered(rsmaster)
    expr = "T@virt_vm and G@group:web and G@tenant:acme"
    assert sorted(salt(rsmaster, expr, "-C", "test.ping").data) == [WEB]
    run = rsmaster.salt_run_cli(timeout=120).run
    listed = run("virt.stop", f"select={expr}", "test=True")
    assert listed.returncode == 0, listed
    assert listed.data["selected"] == [{"uuid": WEB, "name": "web1", "host": "rshv1"}] and "results" not in listed.data
    ret = run("virt.stop", f"select={expr}")
    assert ret.returncode == 0 and ret.data["results"] == {WEB: {"name": "web1", "host": "rshv1", "result": True}}, ret
    by_image = "T@virt_vm and G@image:debian12"  # the image virt.init recorded: the same VM both ways
    assert sorted(salt(rsmaster, by_image, "-C", "test.ping").data) == [WEB]
    listed = run("virt.stop", f"select={by_image}", "test=True")
    assert listed.returncode == 0 and [v["uuid"] for v in listed.data["selected"]] == [WEB], listed
    # across both hypervisors: the operator's db VMs, one on each, and nothing else
    both = "T@virt_vm and G@group:db"
    assert sorted(salt(rsmaster, both, "-C", "test.ping").data) == sorted([DB, DB2])
    ret = run("virt.stop", f"select={both}")
    assert ret.returncode == 0, ret
    assert ret.data["results"] == {
        DB: {"name": "db1", "host": "rshv1", "result": True},
        DB2: {"name": "db2", "host": "rshv2", "result": True},
    }, ret
    ret = run("virt.stop", "select=E@web.*")
    assert ret.returncode != 0 and "E@ matches minions, not VMs" in ret.data["error"], ret


def test_power_through_a_vm_resource_and_never_through_a_job_aimed_at_hypervisors(rsmaster, minions):
    """The resource's virt.* with real daemons: ``T@virt_vm:<uuid> virt.force_off`` answers libvirt's state after
    the call (shutoff; the node file's test driver starts afresh in every job, so a later job sees db1 running
    again: what persists is tested on test:///default in tests/unit/loaders/test_resources_virt_vm.py). A job aimed
    at the hypervisor (``rshv*``) reaches every VM resource too: Salt hands them the job's target (``__pub_tgt``),
    and they refuse to act. rshv1 declares no ``virt:lock_manager``: a stopped VM is not started through its
    resource, and the answer names the runner."""
    registered(rsmaster)
    ret = salt(rsmaster, f"T@virt_vm:{DB}", "-C", "virt.force_off")
    assert ret.returncode == 0, ret
    assert ret.data == {DB: {"name": "db1", "action": "force off", "state": "shutoff", "previous": "running"}}, ret
    ret = salt(rsmaster, "T@virt_vm and G@name:db1", "-C", "virt.stop")
    assert ret.returncode == 0 and ret.data == {DB: True}, ret
    ret = salt(rsmaster, "rshv*", "virt.stop")  # the hypervisor's virt.stop, with its name forgotten
    assert ret.returncode != 0 and sorted(ret.data) == sorted(["rshv1", "rshv2", *VMS]), ret
    for vm in VMS:
        assert "virt.stop acts on a VM resource only in a job whose target names VM resources" in str(ret.data[vm])
    ret = salt(rsmaster, f"T@virt_vm:{OFF}", "-C", "virt.start")
    assert ret.returncode != 0, ret
    assert "Start it with salt-run virt.start off1, which asks every hypervisor first" in str(ret.data[OFF]), ret
