"""saltvirt.fleet: the runner's pure helpers around placement (answers, locating a VM, settings, one
init per name at a time)."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt import fleet, relocate


@pytest.mark.parametrize(
    "ret, retcode, expected",
    [
        ({"host": {}}, 0, {"status": "up", "ret": {"host": {}}}),
        (
            "ERROR: start VM 'x' on hv1: no bridge",
            1,
            {"status": "error", "error": "start VM 'x' on hv1: no bridge", "retcode": 1},
        ),
        (
            "ERROR executing 'virt.init': nic profile 'n' is not defined",
            1,
            {"status": "error", "error": "nic profile 'n' is not defined", "retcode": 1},
        ),
        (
            "'virt.full_info' is not available.",
            1,
            {"status": "error", "error": "'virt.full_info' is not available.", "no_virt": True},
        ),
        (
            "'virt' __virtual__ returned False: libvirt python bindings missing",
            1,
            {
                "status": "error",
                "error": "'virt' __virtual__ returned False: libvirt python bindings missing",
                "no_virt": True,
            },
        ),
        (
            {"virt.full_info": "'virt.full_info' is not available."},
            1,
            {"status": "error", "error": "'virt.full_info' is not available.", "no_virt": True},
        ),
        (False, 0, {"status": "up", "ret": False}),
    ],
)
def test_minion_answers_are_classified(ret, retcode, expected):
    assert fleet.classify(ret, retcode) == expected


HOSTS = {
    "h1": {"status": "up", "vms": {"web1": "running", "twin": "running"}},
    "h2": {"status": "up", "vm_info": {"twin": {}, "db1": {}}},
    "h3": {"status": "down", "error": "did not answer"},
}


def test_locate_finds_the_one_host_and_refuses_ambiguity():
    assert fleet.locate(HOSTS, "web1") == "h1" and fleet.locate(HOSTS, "db1") == "h2"
    with pytest.raises(fleet.Failed, match="ambiguous: defined on h1, h2. Pass host=") as exc:
        fleet.locate(HOSTS, "twin")
    assert exc.value.details == {"hosts": ["h1", "h2"]}
    assert fleet.locate(HOSTS, "twin", host="h2") == "h2"
    with pytest.raises(fleet.Failed, match="not defined on any hypervisor that answered; .* may have it: h3"):
        fleet.locate(HOSTS, "nosuch")
    with pytest.raises(fleet.Failed, match=r"'web1' is not defined on h2 \(it is on h1\)"):
        fleet.locate(HOSTS, "web1", host="h2")
    with pytest.raises(fleet.Failed, match="hypervisor h3 is down: did not answer"):
        fleet.locate(HOSTS, "web1", host="h3")


def test_hypervisor_settings_from_master_config_and_call():
    cfg = fleet.config({})
    assert (cfg["tgt"], cfg["tgt_type"], cfg["timeout"], cfg["gather_job_timeout"]) == (None, "compound", 5.0, 5.0)
    opts = {"virt": {"hypervisors": {"tgt": "hyper*", "tgt_type": "glob", "timeout": 2, "max_wait": 1}}}
    cfg = fleet.config(opts)
    assert (cfg["tgt"], cfg["timeout"]) == ("hyper*", 2.0)
    assert cfg["max_wait"] == 2 + 5 + 2  # never shorter than Salt's own down detection
    assert fleet.config(opts, tgt="a,b")["tgt_type"] == "list"
    assert fleet.config(opts, tgt="kvm*")["tgt_type"] == "glob"
    assert fleet.config(opts, tgt="G@os:Debian", tgt_type="compound")["tgt_type"] == "compound"
    with pytest.raises(SaltInvocationError, match="unknown key"):
        fleet.config({"virt": {"hypervisors": {"tmeout": 3}}})
    with pytest.raises(SaltInvocationError, match="timeout must be a number"):
        fleet.config({}, timeout="soon")
    with pytest.raises(SaltInvocationError, match="must be above 0"):
        fleet.config({}, timeout=-1)


def master_opts(tmp_path):
    """Master opts with the default cache (localfs, one master), as salt-run has them."""
    import salt.config

    opts = dict(salt.config.master_config(None), id="master", cachedir=str(tmp_path))
    assert opts["cache"] == "localfs"
    return opts


def test_one_init_per_name_at_a_time(tmp_path):
    """The runner's lock with the default cache: one call per name on this master, as before."""
    opts = master_opts(tmp_path)
    with fleet._creating(opts, ["web1", "web1"]):
        with pytest.raises(SaltInvocationError, match="'web1' is held: virt.init by master master"):
            with fleet._creating(opts, ["web1"]):
                pass
        with fleet._creating(opts, ["web2"]):  # other names are not blocked
            pass
    with fleet._creating(opts, ["web1"]):  # released
        pass


def test_migrate_and_evacuate_take_the_init_lock(tmp_path):
    """Two migrations of one VM (or a migration and an init) never overlap: relocate.migrate takes the
    runner's per-VM lock before it asks any hypervisor anything (no client needed to be refused)."""
    opts = master_opts(tmp_path)
    remote = relocate.Remote(opts, cfg=None, client=None)
    with fleet._creating(opts, ["web1"], what="virt.migrate"):
        with pytest.raises(SaltInvocationError, match=r"'web1' is held: virt.migrate by master master \(host "):
            relocate.migrate(remote, "web1", "hv2")
        with pytest.raises(SaltInvocationError, match="'web1' is held: virt.migrate by master"):
            fleet.create(opts, "web1", {}, None, {})


def test_image_note_never_shows_url_credentials():
    mib, note = fleet.image_mib({}, "https://alice:s3cret@images.example/web.qcow2")
    assert mib == 0 and note == "size of https://images.example/web.qcow2 unknown on the master: not counted"


def test_a_host_that_did_not_answer_init_keeps_its_reservation(tmp_path):
    """Falling over from a hypervisor that did not answer virt.init (it may still create the VM there):
    its room stays reserved for init_timeout, the next host gets its own reservation."""
    import time

    from saltvirt import fleetstate, placement

    opts = master_opts(tmp_path)
    answer = {"status": "up", "host": {"mem_total": 4096, "vcpus_total": 4, "disk_free": 99999}, "vm_info": {}}
    hosts = {"h1": answer, "h2": answer}
    req, pol, since, tried = placement.make_request(1, 512), placement.make_policy(), time.time(), []
    with fleet._creating(opts, ["web1"]) as lease:
        assert fleet._reserve(lease, hosts, ["h1", "h2"], 0, "web1", req, pol, since, tried) == 0
        assert fleet._reserve(lease, hosts, ["h1", "h2"], 1, "web1", req, pol, since, tried, keep_previous=1800) == 1
        load = fleetstate.reserved(lease.store, hosts, since)
        assert load["h1"]["vms"] == ["web1"] and load["h2"]["vms"] == ["web1"]
        h1 = lease.store.fetch(fleetstate.RESERVATIONS, "h1")["entries"]["web1"]
        assert h1["expires"] > time.time() + 1700
        fleetstate.finish(lease.store, lease, "failed")  # the call fails: only h2's is dropped
    load = fleetstate.reserved(fleetstate.Store(opts), hosts, since)
    assert load["h1"]["vms"] == ["web1"] and load["h2"]["vms"] == [] and tried == []
