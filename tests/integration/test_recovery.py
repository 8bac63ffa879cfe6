"""Host-failure recovery on real daemons: ``salt-run virt.record``, ``virt.recover`` and ``virt.reconcile`` on a
master of its own with three hypervisor minions, each managing its own namespaced libvirtd (``virt.rebalance``
and an init abandoned mid-seed: test_rebalance_real.py, a lab of its own so that both run side by side). First,
while all three are healthy, ``salt-run virt.roll`` over them with a state that fails on hv11, in this lab (one
of its own would cost the suite minutes) and leaving no VM behind.

    hv10  the host that fails: its minion stops, then its libvirtd dies (its guests keep running
          until the fence script kills what is left in its namespaces)
    hv11, hv12  the survivors

Shared storage: one directory (``rec-store``) every hypervisor sees at the same path, in their
``virt:allowed_paths``; each hypervisor's ``virt:images`` is its own. Each libvirtd leases every disk in
``rec-store/.lockspace`` (virtlockd): QEMU never opens a disk another host holds. How the survivors check the
failed host's libvirtd: the minions' ``virt:recovery:probe_uri`` names its unix socket (the lab's libvirtds
listen in network namespaces the minions cannot reach; on a real fleet the default, the TLS migration URI).
Proof that a recovered guest runs: a fresh boot and heartbeats on its console on the new host.
"""

import json
import pathlib
import stat
import subprocess
import textwrap
import time

import pytest

from tests.support.fleetlab import (
    beating,
    beats_on,
    console,
    fleet_minions,
    hypervisors,
    local_client,
    minion_configs,
    ok,
    run,
    shared_store,
    shared_vm,
    where,
)
from tests.support.paths import guest_boot
from tests.support.saltd import master_config, presync

HVS = (10, 11, 12)


@pytest.fixture(scope="module")
def store(lab_dir, guest):
    with shared_store(lab_dir, guest, "rec-store") as root:
        yield root


@pytest.fixture(scope="module")
def lab_hvs(lab_dir, fabric, store):
    # libvirt's lock manager with its lockspace on the shared storage: the last guard (disk leases)
    (store / ".lockspace").mkdir()
    with hypervisors(lab_dir, fabric, HVS, lockspace=str(store / ".lockspace")) as hvs:
        yield hvs


def master_virt(lab_dir):
    return {
        # bounded waits, generous enough for a loaded shared machine: a slow minion must not look down here
        # (down_after: run G, at load ~20, hv10 answered a job check 20 s after it was published, and the
        # init that fell over to it was stopped as "stopped answering"; each call on the stopped hv10 waits it)
        "hypervisors": {
            "tgt": "hv1[012]",
            "tgt_type": "glob",
            "timeout": 5,
            "gather_job_timeout": 15,
            "down_after": 40,
        },
        "placement": {"mem_reserve_mib": 256, "disk_reserve_mib": 0},
        "recovery": {"probe_wait": 5},
    }


@pytest.fixture(scope="module")
def rmaster(salt_factories, state_tree, lab_dir):
    config = master_config(state_tree, virt=master_virt(lab_dir))
    factory = presync(salt_factories.salt_master_daemon("rec-master", overrides=config))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def minions(rmaster, lab_hvs, lab_dir, store):
    # the survivors check a host's libvirtd by its unix socket (minion_configs: virt:recovery:probe_uri); this
    # lab has no TLS: rebalance moves in clear (virt:migration:allow_cleartext)
    with fleet_minions(rmaster, lab_hvs, minion_configs(lab_hvs, lab_dir, store)) as factories:
        yield factories


@pytest.fixture(scope="module")
def local(rmaster, minions):
    with local_client(rmaster) as client:
        yield client


@pytest.fixture
def fence_script(rmaster, lab_hvs, lab_dir):
    """``virt:fence`` naming a script that records its argument and kills what runs in that host's
    namespaces (its guests' qemu, virtlogd): the lab's power switch."""
    ran = pathlib.Path(lab_dir) / "fence.ran"
    script = pathlib.Path(lab_dir) / "fence.sh"
    netns = {name: hv.netns for name, hv in lab_hvs.items()}
    script.write_text(
        "#!/bin/sh\nset -e\n"
        f'echo "$1" >> {ran}\n'
        'case "$1" in\n'
        + "".join(f"  {n}) ns={ns} ;;\n" for n, ns in netns.items())
        + '  *) echo "unknown host $1"; exit 2 ;;\nesac\n'
        'for pid in $(ip netns pids "$ns"); do kill -9 "$pid" || true; done\n'
        'echo "fenced $1"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    conf = pathlib.Path(rmaster.config_dir) / "master.d" / "fence.conf"
    conf.parent.mkdir(exist_ok=True)
    virt = dict(master_virt(lab_dir), fence={"command": [str(script), "{host}"], "timeout": 30})
    conf.write_text(json.dumps({"virt": virt}))  # an include replaces top-level keys: the whole virt mapping
    yield ran
    conf.unlink()


ROLL_HOSTS = ("hv10", "hv11", "hv12")
ROLL_VMS = {"roll10": "hv10", "roll11": "hv11", "roll12": "hv12"}  # name: the host it starts on
ROLL_SLS = textwrap.dedent(
    """\
    {%% if grains['id'] == '%s' %%}
    held-package:
      test.fail_without_changes:
        - comment: dpkg was interrupted
    {%% else %%}
    upgraded:
      test.succeed_with_changes: []
    {%% endif %%}
    """
)


def running_uuids(local):
    """``{uuid: [hosts where it runs]}`` by every hypervisor's libvirtd (``virt.vm_info``)."""
    ret = local.cmd(list(ROLL_HOSTS), "virt.vm_info", tgt_type="list", timeout=60)
    assert sorted(ret) == sorted(ROLL_HOSTS), ret
    out = {}
    for host, vms in sorted(ret.items()):
        for vm in vms.values():
            if vm["state"] == "running":
                out.setdefault(str(vm["uuid"]).lower(), []).append(host)
    return out


@pytest.fixture
def roll_lab(local, lab_hvs, store, guest, state_tree):
    """One beating guest on each host and ``roll_hv.sls`` failing on hv11; afterwards every roll VM purged
    wherever it is (the tests after this one start from hosts without VMs) and the SLS removed."""
    sls = state_tree / "roll_hv.sls"
    sls.write_text(ROLL_SLS % "hv11")
    try:
        for name, host in ROLL_VMS.items():  # one after the other: at most one TCG guest booting at once
            shared_vm(local, store, guest, host, name)
            beating(lab_hvs[host], name)
        yield sls
    finally:
        for name in ROLL_VMS:
            for host in where(local, name, ROLL_HOSTS):
                local.cmd(host, "virt.purge", [name], timeout=300)
            (store / f"{name}.qcow2").unlink(missing_ok=True)
        sls.unlink()
        assert all(where(local, name, ROLL_HOSTS) == {} for name in ROLL_VMS)


def test_a_roll_stops_at_the_host_whose_state_fails_with_the_vms_intact(rmaster, local, lab_hvs, roll_lab):
    """``salt-run virt.roll 'hv1[012]' state=roll_hv``: hv10 evacuated live, its states applied, out of
    maintenance; hv11 evacuated, its state fails: the roll stops there (hv11 left in maintenance), hv12 untouched;
    every guest runs exactly once and beats on without a new boot. Then the operator's way back: the cause fixed,
    the roll again over hv11 alone takes it through and out of maintenance."""
    uuids = running_uuids(local)
    assert sorted(h for hosts in uuids.values() for h in hosts) == list(ROLL_HOSTS), uuids
    offsets = {(h, n): len(console(lab_hvs[h], n)) for h in ROLL_HOSTS for n in ROLL_VMS}

    t0 = time.monotonic()
    ret = run(rmaster, "virt.roll", "hv1[012]", state="roll_hv", transport="tcp")  # this lab has no TLS
    print(f"virt.roll over 3 hosts (2 live migrations, 2 state runs, stopped at hv11): {time.monotonic() - t0:.1f} s")
    data = ret.data
    assert ret.returncode == 1 and data.get("retcode") == 1, ret
    assert data["test"] is False and data["done"] == ["hv10"], data
    assert data["stopped"]["host"] == "hv11" and data["stopped"]["step"] == "states", data
    assert data["stopped"]["failed"] == {"held-package": "dpkg was interrupted"}, data
    assert data["stopped"]["reason"] == "state(s) failed: held-package", data
    assert data["left_in_maintenance"] == ["hv11"] and data["untouched"] == ["hv12"], data
    assert sorted(data["hosts"]) == ["hv10", "hv11"], data  # hv12: not a step
    hv10, hv11 = data["hosts"]["hv10"], data["hosts"]["hv11"]
    assert hv10["status"] == "done" and hv11["status"] == "stopped (left in maintenance)", data
    assert [s["step"] for s in hv10["steps"]] == ["maintenance", "evacuate", "states", "maintenance_off"], data
    assert [s["step"] for s in hv11["steps"]] == ["maintenance", "evacuate"], data  # no state done, not back
    moved10, moved11 = hv10["steps"][1]["moved"], hv11["steps"][1]["moved"]
    assert list(moved10) == ["roll10"] and moved10["roll10"] in ("hv11", "hv12"), data
    assert hv10["steps"][2]["changed"] == ["upgraded"], data
    # hv11's own guest, and hv10's if placement took it there, left for hv10 (back) or hv12: never hv11 again
    assert "roll11" in moved11 and set(moved11.values()) <= {"hv10", "hv12"}, data
    assert data["vms"] == {"running_before": 3, "running_after": 3, "not_running": [], "twice": {}}, data

    # what the libvirtds say: each guest runs once, by UUID, none on hv11; hv12's never moved
    after = running_uuids(local)
    assert sorted(after) == sorted(uuids) and all(len(hosts) == 1 for hosts in after.values()), after
    placed = {}
    for name in ROLL_VMS:  # defined on one host only (a live move undefines it on the source), running there
        defined = where(local, name, ROLL_HOSTS)
        assert list(defined.values()) == ["running"], (name, defined)
        placed[name] = next(iter(defined))
    assert placed["roll12"] == "hv12" and "hv11" not in placed.values(), placed
    assert placed["roll11"] == moved11["roll11"] and placed["roll10"] == moved11.get("roll10", moved10["roll10"])
    for name, host in placed.items():  # went on running through the live migrations: no new boot anywhere
        beats_on(lab_hvs[host], name, offsets[(host, name)])

    # the operator's way back: the cause fixed, the roll again from where it stopped (its lock went with it)
    roll_lab.write_text(ROLL_SLS % "none")
    ret = run(rmaster, "virt.roll", "hv11", state="roll_hv", transport="tcp")
    data = ret.data
    assert ret.returncode == 0 and data["stopped"] is None and data["done"] == ["hv11"], ret
    assert data["left_in_maintenance"] == [] and data["hosts"]["hv11"]["steps"][-1]["step"] == "maintenance_off"
    assert data["hosts"]["hv11"]["steps"][1]["moved"] == {}, data  # still empty: nothing went there meanwhile
    assert data["hosts"]["hv11"]["steps"][2]["changed"] == ["upgraded"], data


def test_recover_a_failed_host(rmaster, local, lab_hvs, minions, store, guest, request):
    shared_vm(local, store, guest, "hv10", "rvm")
    boot = guest_boot(guest)
    ok(
        local,
        "hv10",
        "virt.init",
        "rlocal",
        1,
        128,
        image=str(store / "golden.qcow2"),
        seed=False,
        start=False,
        boot=boot,
    )
    beating(lab_hvs["hv10"], "rvm")
    ok(local, "hv10", "virt.set_autostart", "rvm", "on")  # hv10 would start it again when it boots

    ret = run(rmaster, "virt.record")
    assert ret.returncode == 0, ret
    assert ret.data["hv10"]["status"] == "recorded" and ret.data["hv10"]["vms"] == ["rlocal", "rvm"], ret.data

    ret = run(rmaster, "virt.recover", "hv10")  # everything up: refused
    assert ret.returncode != 0 and "refusing to recover hv10: its minion answers" in ret.data["error"], ret

    minions["hv10"].terminate()
    ret = run(rmaster, "virt.recover", "hv10")  # minion gone, libvirtd still answers: refused
    assert ret.returncode != 0, ret
    assert "its minion does not answer, but its libvirtd does (reached from hv11" in ret.data["error"], ret.data

    lab_hvs["hv10"].kill_daemon()  # libvirtd dies; the guest's qemu keeps running
    ret = run(rmaster, "virt.recover", "hv10")  # down both ways, but no fence command: refused
    assert ret.returncode != 0, ret
    data = ret.data
    assert "no fence command (virt:fence:command in the master config)" in data["error"], data
    assert data["restart"] == ["rvm"] and "rlocal" in data["not_recoverable"], data
    assert "no other hypervisor can run it: hv11: " in data["not_recoverable"]["rlocal"], data
    assert data["down"]["minion"] == "down" and all(p["reachable"] is False for p in data["down"]["libvirt"]), data
    assert where(local, "rvm", ("hv11", "hv12")) == {}  # nothing restarted

    ran = request.getfixturevalue("fence_script")
    t0 = time.monotonic()
    ret = run(rmaster, "virt.recover", "hv10")
    took = time.monotonic() - t0
    assert ret.returncode == 0, ret
    data = ret.data
    print(f"virt.recover hv10 (1 VM restarted, 1 not recoverable): {took:.1f} s")
    assert data["fenced"]["rc"] == 0 and data["fenced"]["command"][1] == "hv10", data
    assert ran.read_text().split() == ["hv10"]
    assert data["record"]["age_seconds"] > 0 and data["record"]["by_master"] == "rec-master"
    target = data["recovered"]["rvm"]["host"]
    assert target in ("hv11", "hv12") and data["recovered"]["rvm"]["state"] == "running", data
    assert "rlocal" in data["not_recoverable"] and data["failed"] == {}
    assert data["recorded"] == ["hv11", "hv12"]  # recorded again at once: the record follows rvm
    assert where(local, "rvm", ("hv11", "hv12")) == {target: "running"}  # one copy
    gone = subprocess.run(["ip", "netns", "pids", lab_hvs["hv10"].netns], capture_output=True, text=True, check=False)
    assert not gone.stdout.strip()  # fenced: nothing of hv10 runs any more, its copy of rvm included
    beating(lab_hvs[target], "rvm")

    ret = run(rmaster, "virt.recover", "hv10")  # again: the VM is elsewhere now, left alone
    assert ret.returncode == 0 and ret.data["recovered"] == {}, ret
    assert ret.data["elsewhere"]["rvm"].startswith(f"defined on {target} (running) now"), ret.data


def test_reconcile_when_the_failed_host_is_back(rmaster, local, lab_hvs, minions, store):
    hv10 = lab_hvs["hv10"]
    for marker in pathlib.Path(hv10.path("run")).rglob("autostarted"):  # a boot: libvirtd autostarts again
        marker.unlink()
    hv10.restart_daemon()  # the fenced host comes back with its old definitions (its guests are gone)
    minions["hv10"].start()
    all_hvs = ("hv10", "hv11", "hv12")
    deadline = time.monotonic() + 120
    while "hv10" not in local.cmd("hv10", "virt.vm_state", timeout=10):  # its minion and libvirtd answer
        assert time.monotonic() < deadline, "hv10's minion did not come back"
    recovered_on = where(local, "rvm", ("hv11", "hv12"))
    # defined twice, one stale: its autostart on boot was refused by the lock manager (the lease is held)
    assert where(local, "rvm", all_hvs) == dict(recovered_on, hv10="shutoff")
    log = pathlib.Path(hv10.path("log", "libvirtd.log")).read_text(errors="replace")
    print("hv10 at boot:", [line for line in log.splitlines() if "lock" in line.lower()][-3:])

    ret = run(rmaster, "virt.reconcile", "hv10")
    assert ret.returncode == 0, ret
    assert list(ret.data["undefined"]) == ["rvm"] and ret.data["conflicts"] == {}, ret.data
    assert ret.data["autostart_off"] == ["rvm"], ret.data  # first of all
    assert where(local, "rvm", all_hvs) == recovered_on  # one definition left: the running one
    assert (store / "rvm.qcow2").exists()  # its disk is shared and in use: kept
    ret = run(rmaster, "virt.reconcile", "hv10")  # nothing left to do
    assert ret.returncode == 0 and ret.data["undefined"] == {}, ret


def test_both_runner_files_make_one_virt_runner(rmaster):
    """_runners/virt.py and _runners/virt_recover.py share __virtualname__ "virt": Salt's loader merges them
    (virt.record/recover/reconcile ran above; virt.py's functions are still there)."""
    ret = run(rmaster, "virt.host_info")
    assert ret.returncode == 0 and ret.data["hv11"]["status"] == "up", ret
