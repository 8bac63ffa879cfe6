"""saltvirt.fleet.assign: the VMs a master's pillar assigns to a hypervisor (salt.pillar.Pillar compiled
in-process from real pillar_roots: targets by id match, targets on grains and ext_pillars do not run),
the checks on each entry, and what is left to create."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import assign

WEB = {"cpu": 1, "mem": 256, "image": "salt://images/guest.qcow2"}
EXT = "echo '{virt: {assigned_vms: {fromext: {cpu: 1, mem: 64}}}}'"


@pytest.fixture
def master_opts(tmp_path):
    import salt.config

    opts = salt.config.master_config(None)
    roots = tmp_path / "pillar"
    roots.mkdir()
    (roots / "top.sls").write_text(
        "base:\n  hyper1:\n    - assign\n  'G@virt_hypervisor:True':\n    - match: compound\n    - by_grain\n"
    )
    (roots / "assign.sls").write_text(
        "virt:\n  assigned_vms:\n"
        "    web1: {cpu: 1, mem: 256, image: salt://images/guest.qcow2}\n"
        "    db1: {cpu: 2, mem: 512, enable_qcow: True}\n"
    )
    (roots / "by_grain.sls").write_text("virt:\n  assigned_vms:\n    stolen: {cpu: 1, mem: 64}\n")
    opts.update(
        cachedir=str(tmp_path / "cache"),
        pki_dir=str(tmp_path / "pki"),
        pillar_roots={"base": [str(roots)]},
        file_roots={"base": [str(tmp_path / "files")]},
        # an ext_pillar adding an assignment if it ran: assignments come from pillar_roots only
        ext_pillar=[{"cmd_yaml": EXT}],
        extension_modules=str(tmp_path / "ext"),
    )
    return opts


def test_host_pillar_is_the_masters_by_id_without_grains_or_ext_pillar(master_opts):
    pillar = assign.host_pillar(master_opts, "hyper1")
    assert "_errors" not in pillar, pillar.get("_errors")
    assigned, bad = assign.entries(pillar)
    assert bad == {} and sorted(assigned) == ["db1", "web1"]  # not 'stolen' (a grain target)
    assert assigned["db1"] == {"cpu": 2, "mem": 512, "enable_qcow": True}
    assert assign.entries(assign.host_pillar(master_opts, "tenant-vm1")) == ({}, {})
    # the ext_pillar does work when Salt runs it: the caller's opts are untouched
    import salt.pillar

    full = salt.pillar.Pillar(master_opts, {"virt_hypervisor": True}, "hyper1", "base").compile_pillar()
    assert sorted(full["virt"]["assigned_vms"]) == ["db1", "fromext", "stolen", "web1"]


def test_bad_entries_are_reported_and_the_others_kept():
    pillar = {
        "virt": {
            "assigned_vms": {
                "web1": WEB,
                "../etc": WEB,
                "nocpu": {"mem": 1},
                "elsewhere": dict(WEB, host="hyper2"),
                "tgt": dict(WEB, tgt="*"),
                "flat": "cpu=1",
            }
        }
    }
    good, bad = assign.entries(pillar)
    assert good == {"web1": WEB}
    assert "invalid VM name '../etc'" in bad["../etc"]
    assert bad["nocpu"] == "virt:assigned_vms:nocpu: cpu missing"
    assert "host not allowed: an assigned VM goes to the host it is assigned to" in bad["elsewhere"]
    assert "tgt not allowed" in bad["tgt"]
    assert "must be a mapping" in bad["flat"]
    with pytest.raises(SaltInvocationError, match="must be a mapping of VM name"):
        assign.entries({"virt": {"assigned_vms": ["web1"]}})
    assert assign.entries({}) == ({}, {})


def test_plan_skips_vms_defined_anywhere():
    hosts = {
        "hyper1": {"status": "up", "vms": {"web1": "running"}},
        "hyper2": {"status": "up", "vms": {"db1": "shutoff", "web1": "running"}},
        "hyper3": {"status": "down", "error": "did not answer"},
    }
    to_create, existing = assign.plan({"web1": WEB, "db1": WEB, "new1": WEB, "new0": WEB}, hosts)
    assert to_create == ["new0", "new1"]
    assert existing == {"db1": ["hyper2"], "web1": ["hyper1", "hyper2"]}
