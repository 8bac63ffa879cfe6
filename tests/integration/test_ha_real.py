"""Automatic HA on real daemons (issue 38): the master engine ``virt_ha`` alone, no operator command, on a master of
its own with three hypervisor minions, each managing its own namespaced libvirtd (lab indexes 25-27: used by no
other module, so that this lab runs beside test_recovery.py's), and TCG guests on shared storage that beat on their
serial console (tests/support/fleetlab.py).

    hv25  dies entirely (power loss: its minion, libvirtd and every process of its namespaces killed), HA restarts
          its HA VM ha1 on a survivor and leaves plain1 (not HA); then it comes back: nothing starts on it
    B     (a survivor not running ha1) is partitioned: its minion and libvirtd die but its guest ha2 runs on; HA
          fences it (the fence script kills what runs in its namespaces) before ha2 starts elsewhere
    C     (a host left) is partitioned the same way with ``virt:ha:fence: manual``: HA only alerts, ha3 runs on

Each hypervisor's minion connects to the master from an address of its own (its lab loopback address,
:func:`tests.support.lab.loopback`, and the grain ``ipv4`` saying so): the master's view of connected minions
(Salt's ``CkMinions.connected_ids``, HA's second signal) tells it from the others, all on this machine. Each
libvirtd leases every disk in the shared lockspace (virtlockd). "Never twice" is judged by what runs, not by what
HA says: every reachable libvirtd asked by UUID, and the QEMU processes of this machine holding the VM's disk open.
"""

import contextlib
import datetime
import json
import os
import pathlib
import re
import signal
import stat
import subprocess
import time

import libvirt
import psutil
import pytest
import salt.payload

from saltvirt.fleet import ha
from tests.support.fleetlab import (
    beating,
    beats_on,
    console,
    fleet_minions,
    hypervisors,
    local_client,
    minion_configs,
    run,
    shared_store,
    shared_vm,
)
from tests.support.saltd import master_config, presync

HVS = (25, 26, 27)  # lab indexes no other module uses
A = "hv25"
INTERVAL = 2  # the engine's seconds between two rounds
HA = {"enabled": True, "vms": ["ha*"], "fence": "command", "lost_after": 5, "down_after": 10}
WAIT = 600  # bound on HA acting on a loaded machine (a round, the recovery, a TCG boot): generous, never asserted
# what a round decides about a lost host once it acts (or once it is back): the end of a wait on the log
FINAL = ("recovered", "recover_failed", "refused", "alert", "no_ha_vms", "back")
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # a dead host's libvirtd refusing is what is checked


def master_virt(lab_dir, **ha):
    return {
        "hypervisors": {"tgt": "hv2[567]", "tgt_type": "glob", "timeout": 5, "gather_job_timeout": 5, "down_after": 30},
        "placement": {"mem_reserve_mib": 256, "disk_reserve_mib": 0},
        "ha": dict(HA, **ha),
        "recovery": {"probe_wait": 5},
        "fence": {"command": [str(pathlib.Path(lab_dir) / "ha-fence.sh"), "{host}"], "timeout": 30},
    }


@pytest.fixture(scope="module")
def store(lab_dir, guest):
    with shared_store(lab_dir, guest, "ha-store") as root:
        (root / ".lockspace").mkdir()
        yield root


@pytest.fixture(scope="module")
def lab_hvs(lab_dir, fabric, store):
    with hypervisors(lab_dir, fabric, HVS, lockspace=str(store / ".lockspace")) as hvs:
        yield hvs
        for hv in hvs.values():  # a host whose libvirtd is gone (fenced, partitioned): what it left runs no more
            if hv.pid and not reachable_host(hv):
                power_off(hv)


@pytest.fixture(scope="module")
def fenced(lab_dir, lab_hvs):
    """The fence script ``virt:fence:command`` names, the lab's power switch: it kills every process of that host's
    namespaces (its guests' qemu, virtlogd, virtlockd, libvirtd), then records ``<host> <epoch time>`` in the file
    this fixture returns."""
    ran = pathlib.Path(lab_dir) / "ha-fence.ran"
    script = pathlib.Path(lab_dir) / "ha-fence.sh"
    script.write_text(
        "#!/bin/sh\nset -e\n"
        'case "$1" in\n'
        + "".join(f"  {n}) ns={hv.netns} ;;\n" for n, hv in lab_hvs.items())
        + '  *) echo "unknown host $1"; exit 2 ;;\nesac\n'
        'for pid in $(ip netns pids "$ns"); do kill -9 "$pid" || true; done\n'
        f'echo "$1 $(date +%s.%N)" >> {ran}\n'
        'echo "fenced $1"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    ran.touch()
    return ran


@pytest.fixture(scope="module")
def hamaster(salt_factories, state_tree, lab_dir, fenced):
    config = master_config(state_tree, virt=master_virt(lab_dir))
    config["engines"] = [{"virt_ha": {"interval": INTERVAL}}]
    # Salt 3008 drops a publish connection whose peer misses ZMTP heartbeats for 30 s (zmq_heartbeat_timeout, ms): a
    # frozen minion then counts as gone. Longer here, so that the frozen one stays connected while it is watched
    # (test_a_silent_host_still_connected_is_not_lost); a killed minion's connection closes at once either way
    config["zmq_heartbeat_timeout"] = 180000
    factory = presync(salt_factories.salt_master_daemon("ha-master", overrides=config))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def minions(hamaster, lab_hvs, lab_dir, store):
    configs = minion_configs(lab_hvs, lab_dir, store)
    for name, hv in lab_hvs.items():  # its own source address, and its grains say so (see the module doc)
        configs[name].update(source_address=hv.loopback, grains=dict(configs[name]["grains"], ipv4=[hv.loopback]))
    with fleet_minions(hamaster, lab_hvs, configs) as factories:
        yield factories


@pytest.fixture(scope="module")
def local(hamaster, minions):
    with local_client(hamaster) as client:
        yield client


@pytest.fixture(scope="module")
def seen():
    """What a test leaves for the next ones: VM UUIDs, where HA put them."""
    return {}


# what runs -----------------------------------------------------------------------------------------------------
def reachable(hv):
    """A libvirt connection to ``hv``'s libvirtd, or None when it does not answer (killed, fenced)."""
    try:
        return libvirt.open(hv.uri)
    except libvirt.libvirtError:
        return None


def reachable_host(hv):
    conn = reachable(hv)
    if conn is None:
        return False
    conn.close()
    return True


def running_copies(hvs, uuid):
    """``(hosts running a domain of this UUID, hosts whose libvirtd answered)``."""
    running, reached = [], []
    for name, hv in sorted(hvs.items()):
        conn = reachable(hv)
        if conn is None:
            continue
        reached.append(name)
        try:
            with contextlib.suppress(libvirt.libvirtError):
                if conn.lookupByUUIDString(uuid).isActive():
                    running.append(name)
        finally:
            conn.close()
    return running, reached


def defined(hv, name):
    """``name``'s state on ``hv``'s libvirtd (``running``, ``shut off``...), None when it is not defined there."""
    conn = reachable(hv)
    assert conn is not None, f"{hv.hostname}'s libvirtd does not answer"
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        return None
    finally:
        conn.close()
    return "running" if dom.isActive() else "shut off"


def qemu_holding(disk):
    """The pids of this machine's QEMU processes that hold ``disk`` open (a guest's disk: one per running copy)."""
    disk, pids = str(disk), []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # a process gone meanwhile, or a kernel thread
            if (proc / "comm").read_text().startswith("qemu") and any(
                os.readlink(fd) == disk for fd in (proc / "fd").iterdir()
            ):
                pids.append(int(proc.name))
    return pids


def domain_started(hv, name):
    """Epoch time of ``name``'s last start on ``hv``: libvirt's "starting up" line in the domain's log (written by
    libvirtd before it runs QEMU, with milliseconds)."""
    log = pathlib.Path(hv.path("log", "qemu", f"{name}.log")).read_text(errors="replace")
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\+0000: starting up", log, re.MULTILINE)
    assert stamps, log[-2000:]
    return datetime.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=datetime.UTC).timestamp()


def in_netns(pid, hv):
    return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{hv.netns}").st_ino


def netns_pids(hv):
    out = subprocess.run(["ip", "netns", "pids", hv.netns], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def power_off(hv):
    """Every process of ``hv``'s namespaces killed at once (its libvirtd, virtlogd, virtlockd, guests' qemu)."""
    for _ in range(10):
        pids = netns_pids(hv)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    raise AssertionError(f"{hv.hostname}: processes left in its namespaces: {netns_pids(hv)}")


def minion_processes(factory):
    main = psutil.Process(factory.pid)
    return [main, *main.children(recursive=True)]


def kill_minion(factory):
    """SIGKILL the minion and its children: no goodbye to the master, its connection drops with it."""
    procs = minion_processes(factory)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=30)
    factory.terminate()  # salt-factories' bookkeeping: it may start it again


def uuid_of(hv, name):
    conn = reachable(hv)
    try:
        return conn.lookupByName(name).UUIDString()
    finally:
        conn.close()


def beating_on(hvs, name, before):
    """The host among ``hvs`` where ``name`` booted and beat three times after console offsets ``before``, or None."""
    for host, hv in sorted(hvs.items()):
        text = console(hv, name)[before.get(host, 0) :]
        if "GUEST-BOOT-OK" in text and text.count("\nHB ") >= 3:
            return host
    return None


def offsets(hvs, name):
    return {host: len(console(hv, name)) for host, hv in hvs.items()}


# HA's log and config ---------------------------------------------------------------------------------------------
def ha_log(master):
    ret = run(master, "virt.ha_log", last=200)
    assert ret.returncode == 0, ret
    return ret.data["entries"]


def decisions(entries, host):
    """``host``'s decisions, without ``one_signal`` (a round already gathering when the host failed may have seen
    only one of the two signals)."""
    return [e for e in entries if e["host"] == host and e["decision"] != "one_signal"]


def wait_log(master, after, host):
    """Wait until ``host`` has a final decision (:data:`FINAL`) among the log entries after the first ``after``;
    return its decisions there."""
    deadline = time.monotonic() + WAIT
    while True:
        entries = decisions(ha_log(master)[after:], host)
        if any(e["decision"] in FINAL for e in entries):
            return entries
        assert time.monotonic() < deadline, entries
        time.sleep(2)


def wait_beating(master, hvs, name, before, host, after, sample=None):
    """Wait until ``name`` beats on one of ``hvs`` (:func:`beating_on`; ``before``: console offsets) and return that
    host, calling ``sample()`` at each look. Stops at once when HA logged a final decision for ``host`` (the lost
    one, log entries after the first ``after``) that is no recovery: nothing will start."""
    t0 = looked = time.monotonic()
    while not (target := beating_on(hvs, name, before)):
        if sample:
            sample()
        if time.monotonic() - looked > 10:  # a salt-run costs a CPU-second: the log every 10 s only
            looked, entries = time.monotonic(), decisions(ha_log(master)[after:], host)
            assert not [e for e in entries if e["decision"] in FINAL and e["decision"] != "recovered"], entries
        assert time.monotonic() - t0 < WAIT, ha_log(master)[after:]
        time.sleep(0.3)
    return target


def wait_first(master, after, host):
    """The first log entry of ``host`` after the first ``after`` (``one_signal`` included), once there is one."""
    deadline = time.monotonic() + WAIT
    while not (entries := [e for e in ha_log(master)[after:] if e["host"] == host]):
        assert time.monotonic() < deadline, f"no HA decision about {host}"
        time.sleep(2)
    return entries[0]


def state_entry(master):
    """HA's per-host state (bank :data:`ha.BANK`, in this master's localfs cache), written at the end of every
    round."""
    return pathlib.Path(master.config["cachedir"]) / ha.BANK / f"{ha.STATE}.p"


def ha_state(master):
    """``{host: {lost_since, last, handled...}}`` as the last round left it."""
    entry = state_entry(master)
    return (salt.payload.loads(entry.read_bytes()) or {}).get("hosts") or {} if entry.exists() else {}


def wait_round(master, start):
    """Wait until a round that started after epoch ``start`` has ended: the second write of its state entry after
    ``start`` is such a round's (one engine: its rounds run one after the other)."""
    entry = state_entry(master)
    deadline = time.monotonic() + WAIT

    def written_after(when):
        while not (entry.exists() and entry.stat().st_mtime > when):
            assert time.monotonic() < deadline, f"no HA round wrote {entry} after {when}"
            time.sleep(0.5)
        return entry.stat().st_mtime

    written_after(written_after(start))


def log_mark(master):
    """Where the log ends now: what a later round logs comes after (the journal keeps 200, this module makes few)."""
    n = len(ha_log(master))
    assert n < 150, "the HA log nears its cap: entries after a mark would shift"
    return n


def record(master, hosts):
    ret = run(master, "virt.record")
    assert ret.returncode == 0, ret
    for host in hosts:
        assert ret.data[host]["status"] == "recorded", ret.data
    return ret.data


def fence_records(ran):
    """``[(host, epoch)]`` the fence script recorded."""
    return [(h, float(t)) for h, t in (line.split() for line in ran.read_text().splitlines() if line.strip())]


# the tests -------------------------------------------------------------------------------------------------------
def test_a_dead_hosts_ha_vm_runs_again_once_elsewhere(hamaster, local, lab_hvs, minions, store, guest, fenced, seen):
    survivors = {h: hv for h, hv in lab_hvs.items() if h != A}
    for name in ("ha1", "plain1"):
        shared_vm(local, store, guest, A, name)
    for name in ("ha1", "plain1"):
        beating(lab_hvs[A], name)
        seen[name] = uuid_of(lab_hvs[A], name)
    recorded = record(hamaster, lab_hvs)
    assert recorded[A]["vms"] == ["ha1", "plain1"], recorded
    mark, before = log_mark(hamaster), offsets(survivors, "ha1")

    t0 = time.monotonic()
    kill_minion(minions[A])  # power loss: everything of the host at once
    lab_hvs[A].kill_daemon()
    power_off(lab_hvs[A])
    target = wait_beating(hamaster, survivors, "ha1", before, A, mark)
    print(f"virt_ha: {A} lost (power) -> ha1 beating on {target}: {time.monotonic() - t0:.1f} s")
    seen["ha1_on"] = target

    assert running_copies(lab_hvs, seen["ha1"]) == ([target], sorted(survivors))  # A's libvirtd is gone
    holders = qemu_holding(store / "ha1.qcow2")
    assert len(holders) == 1 and in_netns(holders[0], lab_hvs[target]), holders
    assert running_copies(lab_hvs, seen["plain1"])[0] == [] and qemu_holding(store / "plain1.qcow2") == []
    assert [h for h, _ in fence_records(fenced)] == [A]
    # the round logs its decision once virt.recover ended (it records the hosts again, waiting on the silent A)
    entries = wait_log(hamaster, mark, A)
    assert [e["decision"] for e in entries] == ["lost", "recovered"], entries
    assert entries[1]["recovered"] == {"ha1": target} and entries[1]["not_ha"] == ["plain1"], entries
    assert [h for h, _ in fence_records(fenced)] == [A]  # once


def test_the_host_back_starts_nothing_and_is_reconciled(hamaster, local, lab_hvs, minions, store, fenced, seen):
    hv, target = lab_hvs[A], seen["ha1_on"]
    for marker in pathlib.Path(hv.path("run")).rglob("autostarted"):  # a boot: libvirtd autostarts again
        marker.unlink()
    mark = log_mark(hamaster)
    hv.restart_daemon()  # it comes back with its old definitions (its guests died with it)
    minions[A].start()
    entries = wait_log(hamaster, mark, A)
    assert [e["decision"] for e in entries] == ["back"], entries

    conn = reachable(hv)
    try:
        assert conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE) == []  # nothing started on A
    finally:
        conn.close()
    assert defined(hv, "ha1") == "shut off" and defined(hv, "plain1") == "shut off"
    assert running_copies(lab_hvs, seen["ha1"]) == ([target], sorted(lab_hvs))
    assert len(qemu_holding(store / "ha1.qcow2")) == 1

    ret = run(hamaster, "virt.reconcile", A)
    assert ret.returncode == 0, ret
    assert list(ret.data["undefined"]) == ["ha1"] and ret.data["conflicts"] == {}, ret.data
    assert defined(hv, "ha1") is None and defined(lab_hvs[target], "ha1") == "running"
    assert [h for h, _ in fence_records(fenced)] == [A]  # HA fenced nothing more


def test_a_partitioned_host_is_fenced_before_its_vm_starts_elsewhere(
    hamaster, local, lab_hvs, minions, store, guest, fenced, seen
):
    b = next(h for h in sorted(lab_hvs) if h not in (A, seen["ha1_on"]))  # it runs no HA VM but the new one
    others = {h: hv for h, hv in lab_hvs.items() if h != b}
    shared_vm(local, store, guest, b, "ha2")
    beating(lab_hvs[b], "ha2")
    seen["ha2"] = uuid_of(lab_hvs[b], "ha2")
    record(hamaster, lab_hvs)
    disk = store / "ha2.qcow2"
    first = qemu_holding(disk)
    assert len(first) == 1 and in_netns(first[0], lab_hvs[b]), first  # the scan sees B's copy
    mark, before = log_mark(hamaster), offsets(others, "ha2")

    t0, killed = time.monotonic(), time.time()
    kill_minion(minions[b])  # B cut off: no minion, no libvirtd, but its guest runs on (a partition)
    lab_hvs[b].kill_daemon()
    samples = []

    def sample():  # QEMU processes with ha2's disk open, at each look
        samples.append(qemu_holding(disk))
        assert len(samples[-1]) <= 1, f"two copies of ha2 run at once: {samples[-1]}"

    target = wait_beating(hamaster, others, "ha2", before, b, mark, sample)
    # B's copy ran on after the partition: the scan saw it
    assert samples[0] == first, (samples[:3], first, killed, fence_records(fenced), ha_log(hamaster)[mark:])
    print(f"virt_ha: {b} partitioned -> ha2 beating on {target}: {time.monotonic() - t0:.1f} s")
    seen["ha2_on"] = target

    holders = qemu_holding(disk)
    assert len(holders) == 1 and in_netns(holders[0], lab_hvs[target]), holders
    fences = [t for h, t in fence_records(fenced) if h == b]
    assert len(fences) == 1, fence_records(fenced)
    # fenced (B's copy killed) before libvirt started the new copy. Not the QEMU process's start time: psutil counts
    # it from /proc/stat's btime, whole seconds, up to 1 s early (the start follows the fence by less than that)
    started = domain_started(lab_hvs[target], "ha2")
    assert fences[0] < started, (fences, started)
    assert netns_pids(lab_hvs[b]) == []  # nothing of B runs any more, its copy of ha2 included
    assert running_copies(lab_hvs, seen["ha2"]) == ([target], sorted(others))
    assert running_copies(lab_hvs, seen["ha1"])[0] == [seen["ha1_on"]]  # untouched
    entries = wait_log(hamaster, mark, b)
    assert [e["decision"] for e in entries] == ["lost", "recovered"], entries
    assert entries[1]["recovered"] == {"ha2": target}, entries


def test_a_silent_host_still_connected_is_not_lost(hamaster, local, lab_hvs, minions, store, guest, fenced, seen):
    """HA needs both signals: a minion that answers nothing but holds its connection (frozen: SIGSTOP) is logged
    ``one_signal``, and nothing is done even by a round that starts ``lost_after`` seconds later."""
    alive = [h for h in sorted(lab_hvs) if reachable_host(lab_hvs[h])]  # B is fenced
    c = seen["c"] = next(h for h in alive if h != seen["ha2_on"])
    shared_vm(local, store, guest, c, "ha3")
    beating(lab_hvs[c], "ha3")
    seen["ha3"] = uuid_of(lab_hvs[c], "ha3")
    record(hamaster, alive)
    mark, offset = log_mark(hamaster), len(console(lab_hvs[c], "ha3"))
    frozen = minion_processes(minions[c])
    for proc in frozen:
        proc.suspend()
    try:
        first = wait_first(hamaster, mark, c)
        assert first["decision"] == "one_signal" and "connection to the master is still up" in first["reason"], first
        wait_round(hamaster, first["at"] + HA["lost_after"])  # one that would act on a lost host: none is
        state = ha_state(hamaster)[c]
        assert state["last"] == "one_signal" and not state.get("lost_since") and not state.get("handled"), state
        assert [e["decision"] for e in ha_log(hamaster)[mark:] if e["host"] == c] == ["one_signal"]
        assert c not in [h for h, _ in fence_records(fenced)]
        holders = qemu_holding(store / "ha3.qcow2")
        assert len(holders) == 1 and in_netns(holders[0], lab_hvs[c]), holders
        assert running_copies(lab_hvs, seen["ha3"])[0] == [c]
        beats_on(lab_hvs[c], "ha3", offset)
    finally:
        for proc in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.resume()
    deadline = time.monotonic() + WAIT
    while c in ha_state(hamaster):  # a round saw it answer, connected: nothing of this test is left in HA's state
        assert time.monotonic() < deadline, ha_state(hamaster)
        time.sleep(1)


def test_manual_fencing_only_alerts(hamaster, local, lab_hvs, lab_dir, minions, store, fenced, seen):
    c = seen["c"]
    conf = pathlib.Path(hamaster.config_dir) / "master.d" / "ha.conf"
    conf.parent.mkdir(exist_ok=True)
    # an include replaces top-level keys: the whole virt mapping; HA rounds read the file again each round
    conf.write_text(json.dumps({"virt": master_virt(lab_dir, fence="manual")}))
    try:
        mark, offset = log_mark(hamaster), len(console(lab_hvs[c], "ha3"))
        kill_minion(minions[c])  # C partitioned, as B was
        lab_hvs[c].kill_daemon()
        entries = wait_log(hamaster, mark, c)
        assert [e["decision"] for e in entries] == ["lost", "alert"], entries
        assert "ha3" in entries[1]["vms"], entries

        assert c not in [h for h, _ in fence_records(fenced)]  # nothing fenced
        assert running_copies(lab_hvs, seen["ha3"])[0] == []  # started on no other host (C's libvirtd is gone)
        holders = qemu_holding(store / "ha3.qcow2")
        assert len(holders) == 1 and in_netns(holders[0], lab_hvs[c]), holders
        beats_on(lab_hvs[c], "ha3", offset)  # its qemu untouched: it beats on, never booted again
    finally:
        conf.unlink()
        power_off(lab_hvs[c])  # the operator's part once alerted: the host off (HA handled it: nothing more)
