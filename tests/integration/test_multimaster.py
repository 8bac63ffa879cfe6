"""Two real salt-masters (``mm1`` on 127.0.0.1, ``mm2`` on 127.0.0.2, same master key) sharing one real
redis-server as their ``cache:`` backend; the hypervisor minions are multi-master minions of both.

    mmhv1, mmhv2   libvirt test driver (test:///default, kept in the minion process: multiprocessing
                   False); 3072 MiB, of which the driver's own 'test' domain uses 2048: with
                   mem_reserve_mib 0, room for exactly five 200 MiB VMs each
    mmgone         a hypervisor whose minion is stopped: a query waits for it (timeout + job check: 30 s,
                   generous for a loaded machine: a live minion only has to answer Salt's job check),
                   so concurrent inits of one name really overlap while they hold their locks; steps
                   that need no such wait run with a fleet of the answering hosts (``answering_fleet``)

Every ``salt-run`` here is a real CLI process against one master's config directory.
"""

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from saltvirt.fleet import fleetstate
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer
from tests.support.saltd import master_config, started_minions

HOSTS = ["mmhv1", "mmhv2"]
VIRT = {
    "hypervisors": {"tgt": "mm*", "tgt_type": "glob", "timeout": 5, "gather_job_timeout": 25},
    "placement": {"mem_reserve_mib": 0, "disk_reserve_mib": 0},
    "shared": {"lock_ttl": 10},
}
VM = ["1", "200", "nic=None", "disk=None"]  # 1 vCPU, 200 MiB, no NIC, no disk: test-driver VMs
UP = "tgt=mmhv1,mmhv2"  # placement on the answering hosts only (answering_fleet: no wait for mmgone at all)


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def masters(salt_factories, state_tree, redis_server):
    # the runner straight from the repo (no saltutil.sync_all: that is test_runner's business, and slow)
    shared = dict(redis_server.master_opts(), virt=VIRT, runner_dirs=[str(ROOT / "_runners")], ext_pillar=[])
    m1 = salt_factories.salt_master_daemon("mm1", overrides=master_config(state_tree, interface="127.0.0.1", **shared))
    # the second master: another interface, the same ports, the same master key (multi-master minions)
    m2 = salt_factories.salt_master_daemon(
        "mm2",
        overrides=master_config(
            state_tree,
            interface="127.0.0.2",
            ret_port=m1.config["ret_port"],
            publish_port=m1.config["publish_port"],
            **shared,
        ),
    )
    with m1.started():  # it makes the master key pair, the second one uses the same
        for keyfile in ("master.pem", "master.pub"):
            shutil.copyfile(os.path.join(m1.config["pki_dir"], keyfile), os.path.join(m2.config["pki_dir"], keyfile))
        with m2.started():
            yield {"mm1": m1, "mm2": m2}


@pytest.fixture(scope="module")
def hypervisors(masters, tmp_path_factory):
    m1, m2 = masters["mm1"], masters["mm2"]
    both = [f"{m['interface']}:{m['ret_port']}" for m in (m1.config, m2.config)]
    configs = {
        mid: {
            "master": both,
            "multiprocessing": False,  # jobs in threads of one process: test:///default is per process
            # virt straight from the repo (it finds saltvirt in ../_utils); svtest.hold keeps test:/// open
            "module_dirs": [str(ROOT / "_modules"), str(ROOT / "tests" / "support" / "minion_mods")],
            "virt": {"connection": {"uri": "test:///default"}, "images": str(tmp_path_factory.mktemp(mid))},
            "grains": {"virt_hypervisor": True},
        }
        for mid in [*HOSTS, "mmgone"]
    }
    with started_minions(m1, configs) as factories:
        for master in (m1, m2):  # both masters accepted and reach every minion
            ret = master.salt_cli(timeout=120).run("test.ping", minion_tgt="mm*")
            assert ret.returncode == 0 and sorted(ret.data) == sorted(factories), ret
        ret = m1.salt_cli(timeout=60).run("svtest.hold", minion_tgt="mm*")
        assert ret.returncode == 0 and all(ret.data.values()), ret
        factories["mmgone"].terminate()
        yield factories


def salt_run(master, *args):
    """``salt-run`` as a real process (a Popen): ``finish(proc)`` gives ``(returncode, data)``."""
    exe = pathlib.Path(sys.executable).parent / "salt-run"
    cmd = [str(exe), "-c", str(master.config_dir), "--out=json", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def answering_fleet(masters):
    """The fleet without mmgone (``virt:hypervisors:tgt`` in a master.d include, read by every new ``salt-run``) for
    steps that need no wait for it: ``tgt=`` narrows where a VM may go, but a VM's name is still looked for on
    every hypervisor of the fleet, and the stopped mmgone made each such call wait for it (~25 s each)."""
    virt = dict(VIRT, hypervisors=dict(VIRT["hypervisors"], tgt="mmhv*"))
    confs = [pathlib.Path(m.config_dir) / "master.d" / "fleet.conf" for m in masters.values()]
    for conf in confs:
        conf.parent.mkdir(exist_ok=True)
        conf.write_text(json.dumps({"virt": virt}))  # an include replaces top-level keys: the whole virt mapping
    try:
        yield
    finally:
        for conf in confs:
            conf.unlink()


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    try:
        return proc.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"salt-run said: {out!r} {err[-2000:]!r}") from None


def vms(masters, master="mm2"):
    """``{host: [new VM names]}`` from virt.list through ``master``."""
    code, data = finish(salt_run(masters[master], "virt.list", UP))
    assert code == 0, data
    return {h: sorted(n for n in data[h].get("vms") or {} if n != "test") for h in HOSTS}


def shared_locks(redis_server):
    import salt.config

    opts = dict(salt.config.master_config(None), id="observer", **redis_server.master_opts())
    return fleetstate.holders(opts)


def test_same_name_on_both_masters_creates_one_vm_and_names_the_holder(masters, hypervisors, redis_server):
    procs = {m: salt_run(masters[m], "virt.init", "web1", *VM) for m in ("mm1", "mm2")}
    results = {m: finish(p) for m, p in procs.items()}
    won = [m for m, (code, _d) in results.items() if code == 0]
    assert len(won) == 1, results
    winner, loser = won[0], ({"mm1", "mm2"} - set(won)).pop()
    assert results[winner][1]["host"] in HOSTS
    err = results[loser][1]["error"]
    assert err.startswith(f"'web1' is held: virt.init by master {winner} (host "), err
    assert ", job " in err and "lease until" in err  # who holds it: master, host, pid, job, until when
    placed = vms(masters)
    assert sum(placed.values(), []) == ["web1"], placed  # exactly one VM
    assert shared_locks(redis_server) == {}  # released
    code, data = finish(salt_run(masters[loser], "virt.purge", "web1", UP))  # the other master finds and removes it
    assert code == 0, data


def test_ten_inits_over_two_masters_never_overcommit(masters, hypervisors):
    with answering_fleet(masters):
        ten_inits_over_two_masters(masters)


def ten_inits_over_two_masters(masters):
    names = [f"b{i:02d}" for i in range(10)]
    up = UP
    procs = {n: salt_run(masters["mm1" if i % 2 else "mm2"], "virt.init", n, *VM, up) for i, n in enumerate(names)}
    results = {n: finish(p) for n, p in procs.items()}
    failed = {n: d for n, (code, d) in results.items() if code != 0}
    # room for exactly ten: every call finds a slot, unless a hypervisor too loaded to answer Salt's job
    # check was reported (its reservation is kept: the VM may still appear there); nothing else may fail
    assert all(d["error"].startswith("no hypervisor answered virt.init") for d in failed.values()), json.dumps(
        failed, indent=1
    )
    assert len(failed) <= 2, json.dumps(failed, indent=1)
    placed = vms(masters)
    burst = {h: [n for n in placed[h] if n.startswith("b")] for h in HOSTS}
    assert set(names) - set(failed) <= set(burst["mmhv1"] + burst["mmhv2"]) <= set(names), burst
    assert len(burst["mmhv1"]) <= 5 and len(burst["mmhv2"]) <= 5, burst  # never over its room
    code, info = finish(salt_run(masters["mm1"], "virt.host_info", up))
    for h in HOSTS:
        facts = info[h]["host"]
        assert facts["mem_used_by_vms"] <= facts["mem_total"], (h, facts)
    # full now: the next init is refused, not piled on
    code, data = finish(salt_run(masters["mm2"], "virt.init", "b10", *VM, up))
    assert code == 1 and data["error"].startswith("no host can take a VM with 1 vCPU(s), 200 MiB"), data
    code, data = finish(salt_run(masters["mm1"], "virt.purge", "b00", up))  # room for the next test
    assert code == 0, data


def test_a_master_killed_mid_init_leaves_a_lock_that_expires(masters, hypervisors, redis_server):
    # host=mmgone: the init waits for a hypervisor that does not answer, holding its lock meanwhile
    proc = salt_run(masters["mm1"], "virt.init", "web9", *VM, "host=mmgone")
    deadline = time.monotonic() + 120
    while "web9" not in shared_locks(redis_server):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    lock = shared_locks(redis_server)["web9"]
    assert lock["owner"]["master"] == "mm1" and lock["owner"]["pid"] == proc.pid, lock
    proc.kill()  # the runner process dies mid-call, and its master with it
    proc.wait()
    masters["mm1"].terminate()
    with answering_fleet(masters):
        code, data = finish(salt_run(masters["mm2"], "virt.init", "web9", *VM, UP))
        assert code == 1 and data["error"].startswith("'web9' is held: virt.init by master mm1 "), data
        assert f"pid {proc.pid}, job " in data["error"]
        while shared_locks(redis_server)["web9"]["expires"] > time.time() - 1:  # nobody renews it: it expires
            time.sleep(0.5)
        code, data = finish(salt_run(masters["mm2"], "virt.init", "web9", *VM, UP))
    assert code == 0 and data["host"] in HOSTS, data
    (over,) = [t for t in data["taken_over"] if t["name"] == "web9"]
    assert over["why"] == "expired" and over["was"].startswith("virt.init by master mm1 "), over
    assert shared_locks(redis_server) == {}


def test_redis_killed_mid_init_fails_cleanly_and_heals(masters, hypervisors, redis_server):
    """redis dies (connection refused) while a virt.init on one of two masters holds its shared lock: the
    runner stops with an error naming redis and what to do, creates nothing, and once redis is back (from
    its last snapshot, the lock in it) an init of that name works."""
    proc = salt_run(masters["mm2"], "virt.init", "web8", *VM, "host=mmgone")  # its query waits ~30 s for mmgone
    deadline = time.monotonic() + 120
    while "web8" not in shared_locks(redis_server):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    redis_server.client().save()  # a redis with persistence: the lock comes back with it
    redis_server.crash()
    killed = time.monotonic()
    try:
        code, data = finish(proc, timeout=120)  # a hang fails here (TimeoutExpired)
    finally:
        print(f"salt-run returned {time.monotonic() - killed:.1f} s after redis died")
        redis_server.start()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(json.dumps(data, indent=1))
    # which comes first depends on timing: the lock's renewal failing for lock_ttl while the query waits, or
    # the query ending before that and the next store read failing; either way nothing was placed
    stopped = "virt.init of web8 stopped before placing it, nothing was created: "
    assert code == 1 and data["error"].startswith(stopped), data
    assert f"redis (127.0.0.1:{redis_server.port})) cannot be " in data["error"], data
    assert "Check the master's cache: setting and that the store is reachable" in data["error"], data
    with answering_fleet(masters):
        placed = sum(vms(masters).values(), [])
        assert "web8" not in placed, placed  # nothing was created
        assert shared_locks(redis_server)["web8"]["owner"]["pid"] == proc.pid  # the lock it could not release
        if len(placed) >= 10:  # room for web8 (this module's earlier tests may have filled both hosts)
            code, data = finish(salt_run(masters["mm2"], "virt.purge", placed[0], UP))
            assert code == 0, data
        code, data = finish(salt_run(masters["mm2"], "virt.init", "web8", *VM, UP))
        assert code == 0 and data["host"] in HOSTS, data
        (over,) = [t for t in data["taken_over"] if t["name"] == "web8"]
        assert over["why"] == "its process is gone", over
        code, data = finish(salt_run(masters["mm2"], "virt.purge", "web8", UP))
        assert code == 0, data
    assert shared_locks(redis_server) == {}
