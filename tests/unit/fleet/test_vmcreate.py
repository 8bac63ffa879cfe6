"""saltvirt.fleet.vmcreate: the master side of virt.init (the per-VM lock it shares with migrations, the
image size note, the seeded key checked)."""

import hashlib
import time

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.pki import envelope
from saltvirt.fleet import fleetstate, minionkeys, placement, relocate, vmcreate
from tests.support.keystore import master_key_store_opts


def master_opts(tmp_path):
    """Master opts with the default cache (localfs, one master), as salt-run has them."""
    import salt.config

    opts = dict(salt.config.master_config(None), id="master", cachedir=str(tmp_path))
    assert opts["cache"] == "localfs"
    return opts


def test_one_init_per_name_at_a_time(tmp_path):
    """The runner's lock with the default cache: one call per name on this master, as before."""
    opts = master_opts(tmp_path)
    with fleetstate.lock(opts, ["web1", "web1"], kind="virt.init"):
        with pytest.raises(SaltInvocationError, match="'web1' is held: virt.init by master master"):
            with fleetstate.lock(opts, ["web1"], kind="virt.init"):
                pass
        with fleetstate.lock(opts, ["web2"], kind="virt.init"):  # other names are not blocked
            pass
    with fleetstate.lock(opts, ["web1"], kind="virt.init"):  # released
        pass


def test_migrate_and_evacuate_take_the_init_lock(tmp_path):
    """Two migrations of one VM (or a migration and an init) never overlap: relocate.migrate takes the
    runner's per-VM lock before it asks any hypervisor anything (no client needed to be refused)."""
    opts = master_opts(tmp_path)
    remote = relocate.Remote(opts, cfg=None, client=None)
    with fleetstate.lock(opts, ["web1"], kind="virt.migrate"):
        with pytest.raises(SaltInvocationError, match=r"'web1' is held: virt.migrate by master master \(host "):
            relocate.migrate(remote, "web1", "hv2")
        with pytest.raises(SaltInvocationError, match="'web1' is held: virt.migrate by master"):
            vmcreate.create(opts, "web1", {}, None, {})


def test_image_note_never_shows_url_credentials():
    mib, note = vmcreate.image_mib({}, "https://alice:s3cret@images.example/web.qcow2")
    assert mib == 0 and note == "size of https://images.example/web.qcow2 unknown on the master: not counted"


def test_a_key_the_hypervisor_did_not_seed_is_taken_back(tmp_path):
    master_opts = master_key_store_opts(tmp_path)
    pub, _priv = envelope.new_keypair()
    fp = hashlib.sha256(pub.encode()).hexdigest()
    key = {"minion_id": "web1", "state": "accepted", "fingerprint": fp}
    minionkeys.preaccept(master_opts, "web1", pub)
    assert vmcreate._check_seeded_key(
        master_opts, key, pub, {"seed": {"backend": "loop"}, "key": {"fingerprint": fp}}
    ) == (key, [])
    cases = [
        ({"seed": None}, "did not seed"),
        ({"seed": {"backend": "loop"}, "key": {"fingerprint": "ab" * 32}}, "seeded another key"),
    ]
    for ret, why in cases:
        if not minionkeys.key_state(master_opts, "web1"):
            minionkeys.preaccept(master_opts, "web1", pub)
        new, warnings = vmcreate._check_seeded_key(master_opts, key, pub, ret)
        assert new["state"] == "removed" and why in warnings[0] and minionkeys.key_state(master_opts, "web1") is None


def test_a_host_that_did_not_answer_init_keeps_its_reservation(tmp_path):
    """Falling over from a hypervisor that did not answer virt.init (it may still create the VM there):
    its room stays reserved for init_timeout, the next host gets its own reservation."""
    opts = master_opts(tmp_path)
    answer = {"status": "up", "host": {"mem_total": 4096, "vcpus_total": 4, "disk_free": 99999}, "vm_info": {}}
    hosts = {"h1": answer, "h2": answer}
    req, pol, since, tried = placement.make_request(1, 512), placement.make_policy(), time.time(), []
    with fleetstate.lock(opts, ["web1"], kind="virt.init") as lease:
        assert vmcreate._reserve(lease, hosts, ["h1", "h2"], 0, "web1", req, pol, since, tried) == 0
        assert vmcreate._reserve(lease, hosts, ["h1", "h2"], 1, "web1", req, pol, since, tried, keep_previous=1800) == 1
        load = fleetstate.reserved(lease.store, hosts, since)
        assert load["h1"]["vms"] == ["web1"] and load["h2"]["vms"] == ["web1"]
        h1 = lease.store.fetch(fleetstate.RESERVATIONS, "h1")["entries"]["web1"]
        assert h1["expires"] > time.time() + 1700
        fleetstate.finish(lease.store, lease, "failed")  # the call fails: only h2's is dropped
    load = fleetstate.reserved(fleetstate.Store(opts), hosts, since)
    assert load["h1"]["vms"] == ["web1"] and load["h2"]["vms"] == [] and tried == []


def test_guest_master_seeds_where_new_minions_find_this_master():
    """virt:guest_master and this master's non-default ports reach the new minion's config; whatever the
    caller gave wins, and Salt's default ports are not written."""
    opts = {"ret_port": 14506, "publish_port": 14505}
    kwargs = vmcreate.guest_master(opts, {"guest_master": "10.0.0.2"}, {"image": "x"})
    assert kwargs == {
        "image": "x",
        "master": "10.0.0.2",
        "minion_config": {"master_port": 14506, "publish_port": 14505},
    }
    given = {"master": "m1", "minion_config": {"master_port": 1, "log_level": "info"}}
    kwargs = vmcreate.guest_master(opts, {"guest_master": "10.0.0.2"}, given)
    assert kwargs == {"master": "m1", "minion_config": {"master_port": 1, "publish_port": 14505, "log_level": "info"}}
    assert given == {"master": "m1", "minion_config": {"master_port": 1, "log_level": "info"}}  # not changed
    assert vmcreate.guest_master({"ret_port": 4506, "publish_port": 4505}, {}, {}) == {}


def test_the_runner_answer_takes_the_vm_info_from_virt_init(tmp_path):
    """virt.init returns the new VM's info: no second round trip to the hypervisor for it (no client
    here: asking would fail), and it is in the answer once."""
    host = {"status": "up", "host": {"mem_total": 4096, "vcpus_total": 4, "disk_free": 99999}, "vm_info": {}}
    plan = placement.rank({"h1": host}, placement.make_request(1, 512), placement.make_policy())
    vm = {"state": "running", "cpu": 1, "mem": 512}
    ans = {"status": "up", "ret": {"name": "web1", "state": "running", "started": True, "vm_info": vm}}
    steps = []
    res = vmcreate._created(
        {}, "web1", "h1", ans, "j1", plan, [], None, time.monotonic(), {}, None, lambda s, **d: steps.append(s)
    )
    assert res["vm_info"] == vm and res["init"] == {"name": "web1", "state": "running", "started": True}
    assert steps == ["done"]


def test_timeline_marks_go_only_to_a_callback_that_takes_them():
    marks = []

    def progress(step, **data):
        raise AssertionError("a timeline mark is not an event")

    progress.mark = lambda step, **data: marks.append((step, data))
    vmcreate._mark(progress, "published", host="h1")
    vmcreate._mark(lambda step, **data: None, "published", host="h1")  # a plain callback: nothing
    assert marks == [("published", {"host": "h1"})]
