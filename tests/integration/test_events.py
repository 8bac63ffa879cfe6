"""Lifecycle events and the reactor example on real daemons: a salt-master of this module (its reactor
configured with salt-virt.reactor.sls), a hypervisor minion ``evhyper`` running the ``virt_events``
engine on a real namespaced libvirtd (hv3, this module's own: its daemon and a guest's QEMU are killed
here), and a tenant minion ``evtenant`` (a VM's root: it can send any event).

* a VM's lifecycle arrives on the master's bus: defined, started, suspended, resumed, rebooted, QEMU
  killed (crashed), stopped, started; never a secret (the console password);
* the remediation reactor (salt-virt.remediate.sls): the VM whose QEMU was killed is started again once
  evhyper confirmed the crash; a tenant's forged crash event for a VM its operator stopped starts nothing;
* libvirtd killed and restarted: the engine reconnects, fires what changed while it was away (a VM's
  definition removed meanwhile: ``undefined``, reconciled; a VM whose QEMU died meanwhile), and live
  events arrive again;
* the reactor: a tenant's "ready" event (with hostile data) creates nothing; the hypervisor's ready
  event creates the VM the master's pillar assigns to it, once;
* a live migration out to a second hypervisor (hv2, started for that test only): ``migrated``, ``out``;
* Salt's ``libvirt_events`` engine beside ours, configured as Uyuni does (``engines: [libvirt_events]``,
  reaching the libvirtd of ``virt:connection``): the VM's start, and a network, a storage pool and a
  secret defined, started, refreshed, given a value, stopped and removed arrive with Salt's tags and
  data (never the secret's value).
"""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import tempfile
import time

import pytest

from tests.support import lab
from tests.support.paths import ROOT, guest_boot
from tests.support.saltd import compiled, hypervisor_minion_config, master_config, start_minion

HOST, TENANT = "evhyper", "evtenant"
WAIT = 180  # seconds: a bound for an event on a loaded 2-core machine, not a speed check
PASSWORD = "Ev3ntPw9"  # VNC passwords are at most 8 characters


@pytest.fixture(scope="module")
def ehv(lab_dir, fabric):
    hv = lab.Hypervisor(lab_dir, 3, fabric).start()  # 3: used by no other module
    yield hv
    hv.stop()


@pytest.fixture(scope="module")
def pillar_roots(guest):
    """The master's pillar: evhyper is assigned evweb1; evtenant is assigned evbad1 (it is no hypervisor)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="svevpillar-", dir="/var/tmp"))
    boot = guest_boot(guest)
    web = {"cpu": 1, "mem": 128, "image": "salt://images/guest.qcow2", "enable_qcow": True, "seed": False, "boot": boot}
    (path / "top.sls").write_text(f"base:\n  {HOST}:\n    - assign\n  {TENANT}:\n    - tenant\n")
    (path / "assign.sls").write_text(json.dumps({"virt": {"assigned_vms": {"evweb1": web}}}))
    (path / "tenant.sls").write_text(json.dumps({"virt": {"assigned_vms": {"evbad1": web}}}))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def emaster(salt_factories, state_tree, pillar_roots):
    overrides = master_config(
        state_tree,
        # remediation of crashed VMs (salt-virt.remediate.sls): one restart after 1 s, then left stopped
        virt={"hypervisors": [HOST], "remediate": {"crashed": {"enabled": True, "backoff": 1, "max_restarts": 1}}},
        ext_pillar=[],  # no certificates needed here
        pillar_roots={"base": [str(pillar_roots)]},
        reactor=[
            {"salt/virt/hypervisor/ready": ["salt://salt-virt.reactor.sls"]},
            {"salt/virt/*/domain/*/crashed": ["salt://salt-virt.remediate.sls"]},
        ],
    )
    factory = salt_factories.salt_master_daemon("ev-master", overrides=overrides)
    with factory.started():
        ret = factory.salt_run_cli(timeout=120).run("saltutil.sync_all")
        assert ret.returncode == 0, ret
        yield compiled(factory)


@pytest.fixture(scope="module")
def minions(emaster, ehv, lab_dir):
    """evhyper with the engine (synced from file_roots, then the minion restarted so it starts), evtenant."""
    # and Salt's libvirt_events engine as Uyuni's engine-events.sls configures it (the name alone)
    engines = [{"virt_events": {"backoff_min": 0.5, "backoff_max": 2}}, "libvirt_events"]
    config = hypervisor_minion_config(ehv, pathlib.Path(lab_dir) / "ev-images", engines=engines)
    # synced from the master, not presync: the engine comes with a restart, as a user adds it
    hyper, tenant = start_minion(emaster, HOST, config, sync=True), start_minion(emaster, TENANT, {})
    with hyper.started(), tenant.started():
        ret = hyper.salt_call_cli(timeout=120).run("saltutil.sync_all")
        assert ret.returncode == 0 and {"engines.virt_events", "engines.libvirt_events"} <= set(ret.data["engines"]), (
            ret
        )
        compiled(hyper)
        hyper.terminate()
        t0 = time.time()
        hyper.start()
        yield {"hyper": hyper, "tenant": tenant, "engine_started": t0}


@pytest.fixture(scope="module")
def cli(emaster):
    return emaster.salt_cli(timeout=300)


def wait(listener, master, pattern, after, pred=lambda data: True, what=None):
    """The first event on the master's bus matching ``pattern`` (and ``pred`` on its data) after ``after``."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = sorted(listener.get_events([(master.id, pattern)], after_time=after), key=lambda e: e.stamp)
        match = [e for e in found if pred(e.data)]
        if match:
            return match[0]
        time.sleep(0.2)
    seen = [e.tag for e in listener.get_events([(master.id, "salt/virt/*")], after_time=after)]
    raise AssertionError(f"no {what or pattern} within {WAIT} s; salt/virt events seen: {seen}")


def domain_event(listener, master, vm, event, after, **want):
    ev = wait(
        listener,
        master,
        f"salt/virt/{HOST}/domain/{vm}/{event}",
        after,
        lambda d: all(d["data"].get(k) == v for k, v in want.items()),
        f"{vm}/{event} {want or ''}",
    )
    assert ev.data["id"] == HOST  # the sender the master authenticated
    return ev.data["data"]


def qemu_pid(name):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            if f"guest={name},".encode() in fh.read():
                return int(pid)
    return None


def kill_qemu(name):
    pid = qemu_pid(name)
    assert pid, f"no QEMU process for {name}"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT
    while qemu_pid(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not qemu_pid(name)


def call(cli, fun, *args):
    ret = cli.run(fun, *args, minion_tgt=HOST)
    assert ret.returncode == 0, ret
    return ret.data


def test_a_vms_lifecycle_reaches_the_master(minions, emaster, cli, event_listener, guest):
    t_all = time.monotonic()
    connected = wait(event_listener, emaster, f"salt/virt/{HOST}/engine/connected", minions["engine_started"])
    assert connected.data["data"]["session"] == 1 and connected.data["id"] == HOST
    t0 = time.time()
    boot = guest_boot(guest)
    gfx = {"type": "vnc", "password": PASSWORD}
    call(
        cli,
        "virt.init",
        "evvm1",
        "1",
        "128",
        "image=salt://images/guest.qcow2",
        "enable_qcow=True",
        "seed=False",
        f"boot={json.dumps(boot)}",
        f"graphics={json.dumps(gfx)}",
    )
    uuid = call(cli, "virt.vm_info", "evvm1")["evvm1"]["uuid"]
    assert domain_event(event_listener, emaster, "evvm1", "defined", t0)["uuid"] == uuid
    started = domain_event(event_listener, emaster, "evvm1", "started", t0, detail="booted")
    assert {k: started[k] for k in ("name", "uuid", "event", "host")} == {
        "name": "evvm1",
        "uuid": uuid,
        "event": "started",
        "host": HOST,
    }
    assert set(started) == {"name", "uuid", "event", "detail", "host", "time"}, started
    salts = wait(  # the same start from Salt's libvirt_events engine
        event_listener,
        emaster,
        "salt/engines/libvirt_events/qemu+unix/system/domain/lifecycle",
        t0,
        lambda d: d["data"]["domain"]["name"] == "evvm1" and d["data"]["event"] == "started",
    )
    assert (salts.data["id"], salts.data["data"]["detail"], salts.data["data"]["domain"]["uuid"]) == (
        HOST,
        "booted",
        uuid,
    )

    t1 = time.time()
    call(cli, "virt.pause", "evvm1")
    domain_event(event_listener, emaster, "evvm1", "suspended", t1, detail="paused")
    call(cli, "virt.resume", "evvm1")
    domain_event(event_listener, emaster, "evvm1", "resumed", t1, detail="unpaused")
    call(cli, "virt.reset", "evvm1")
    domain_event(event_listener, emaster, "evvm1", "rebooted", t1)

    t2 = time.time()
    kill_qemu("evvm1")
    crashed = domain_event(event_listener, emaster, "evvm1", "crashed", t2)
    assert crashed["detail"] == "failed" and crashed["uuid"] == uuid
    # the remediation reactor restarts it (virt:remediate:crashed), after evhyper confirmed the crash (signed)
    t_fix = time.monotonic()
    fixed = wait(event_listener, emaster, "salt/virt/remediate/crashed", t2, lambda d: d.get("name") == "evvm1").data
    assert (fixed["decision"], fixed["host"], fixed["uuid"], fixed["delay"]) == ("restarted", HOST, uuid, 1), fixed
    domain_event(event_listener, emaster, "evvm1", "started", t2, detail="booted")
    assert call(cli, "virt.vm_state", "evvm1") == {"evvm1": "running"}  # libvirt on evhyper
    print(f"crashed VM restarted by the reactor: {time.monotonic() - t_fix:.1f} s after the crash event")
    t3 = time.time()
    call(cli, "virt.stop", "evvm1")  # hard power-off (Salt's meaning)
    domain_event(event_listener, emaster, "evvm1", "stopped", t3, detail="destroyed")
    forged_crash_restarts_nothing(cli, emaster, event_listener, uuid)
    call(cli, "virt.start", "evvm1")
    domain_event(event_listener, emaster, "evvm1", "started", t3, detail="booted")

    # never a secret: the VM has a console password, no event carries it
    everything = event_listener.get_events([(emaster.id, "salt/virt/*")], after_time=t0)
    assert len(everything) >= 10 and PASSWORD not in json.dumps([e.full_data for e in everything], default=str)
    print(f"lifecycle events: {time.monotonic() - t_all:.1f} s")


def forged_crash_restarts_nothing(cli, emaster, event_listener, uuid):
    """The tenant forges evhyper's crash event for evvm1 (stopped by its operator): the reactor runs
    virt.remediate for evhyper, which asks evhyper (signed): shut off, destroyed, no crash: nothing started."""
    t_forge, t0 = time.monotonic(), time.time()
    forged = {"cmd": "_minion_event", "id": HOST, "data": {"name": "evvm1", "uuid": uuid, "event": "crashed"}}
    batch = {"tag": None, "data": None, "pretag": None, "events": [{"tag": f"salt/virt/{HOST}/domain/evvm1/crashed",
                                                                     "data": forged}]}  # fmt: skip
    ret = cli.run("event.fire", json.dumps(batch), "fire_master", minion_tgt=TENANT)
    assert ret.returncode == 0 and ret.data is True, ret
    answer = wait(
        event_listener,
        emaster,
        "salt/run/*/ret",
        t0,
        lambda d: d.get("fun") == "runner.virt.remediate" and (d.get("return") or {}).get("name") == "evvm1",
        "virt.remediate for the forged crash",
    ).data["return"]
    assert (answer["decision"], answer["acted"]) == ("nothing", False), answer
    assert "shutoff (destroyed), not crashed" in answer["reason"], answer
    assert call(cli, "virt.vm_state", "evvm1") == {"evvm1": "shutoff"}
    print(f"forged crash event refused: {time.monotonic() - t_forge:.1f} s")


def test_libvirtd_restart_reconnects_and_reconciles(minions, emaster, cli, event_listener, ehv, guest):
    t_all = time.monotonic()
    boot = guest_boot(guest)
    args = ["image=salt://images/guest.qcow2", "enable_qcow=True", "seed=False", "start=False"]
    call(cli, "virt.init", "evgone", "1", "64", *args, f"boot={json.dumps(boot)}")
    gone_uuid = call(cli, "virt.vm_info", "evgone")["evgone"]["uuid"]
    assert call(cli, "virt.vm_state", "evvm1") == {"evvm1": "running"}
    t0 = time.time()
    ehv.kill_daemon()
    gone = wait(event_listener, emaster, f"salt/virt/{HOST}/engine/disconnected", t0)
    assert gone.data["data"]["reason"] in ("eof", "error", "keepalive", "connection dead")
    # while libvirtd is away: evgone's definition goes (libvirtd will never see it again: no libvirt event),
    # evvm1's QEMU dies
    os.unlink(ehv.path("etc", "qemu", "evgone.xml"))
    kill_qemu("evvm1")
    ehv.restart_daemon()
    back = wait(event_listener, emaster, f"salt/virt/{HOST}/engine/connected", t0)
    assert back.data["data"]["reconnect"] is True and back.data["data"]["session"] >= 2
    # what happened meanwhile, from the states before and after (fired before 'connected')
    missed = domain_event(event_listener, emaster, "evgone", "undefined", t0, reconciled=True)
    assert (missed["detail"], missed["was"], missed["uuid"]) == ("reconciled", "shutoff", gone_uuid)
    # evvm1: libvirtd finds its QEMU gone as it restarts; if that happened before the engine's snapshot it is
    # reconciled (stopped, was running), otherwise libvirt reports it live (crashed, failed)
    ended = wait(
        event_listener,
        emaster,
        f"salt/virt/{HOST}/domain/evvm1/*",
        t0,
        lambda d: d["data"]["event"] in ("stopped", "crashed"),
        "evvm1 stopped or crashed",
    ).data["data"]
    assert (ended["event"], ended["detail"], ended.get("was")) in (
        ("stopped", "reconciled", "running"),
        ("crashed", "failed", None),
    ), ended
    print(f"evvm1 after the libvirtd restart: {ended['event']} ({ended['detail']})")
    # and live events flow again
    t1 = time.time()
    call(cli, "virt.start", "evvm1")
    started = domain_event(event_listener, emaster, "evvm1", "started", t1, detail="booted")
    assert "reconciled" not in started
    call(cli, "virt.purge", "evvm1")
    domain_event(event_listener, emaster, "evvm1", "undefined", t1)
    print(f"libvirtd restart, reconnect, reconcile: {time.monotonic() - t_all:.1f} s")


def runner_returns(listener, master, after):
    return [
        e
        for e in listener.get_events([(master.id, "salt/run/*/ret")], after_time=after)
        if e.data.get("fun") == "runner.virt.provision_assigned"
    ]


def wait_runner(listener, master, after, host):
    return wait(
        listener,
        master,
        "salt/run/*/ret",
        after,
        lambda d: d.get("fun") == "runner.virt.provision_assigned" and (d.get("return") or {}).get("host") == host,
        f"provision_assigned for {host}",
    ).data["return"]


def test_example_sls_fires_the_ready_event_last(minions, cli, state_tree):
    shutil.copyfile(ROOT / "salt-virt.example.sls", state_tree / "hypervisor.sls")
    pillar = json.dumps({"salt_virt": {"ready_event": True}})
    rendered = cli.run("state.show_sls", "hypervisor", f"pillar={pillar}", minion_tgt=HOST).data
    assert isinstance(rendered, dict), rendered
    ready = rendered["salt-virt-ready"]
    assert [a for a in ready["module"] if isinstance(a, dict) and "require" in a] == [
        {"require": [{"virt": "salt-virt-keys"}, {"cmd": "salt-virt-bridge"}, {"service": "salt-virt-libvirtd"}]}
    ]
    assert {"virt.ready": []} in ready["module"]  # the event with a nonce only this minion keeps
    assert "salt-virt-ready" not in cli.run("state.show_sls", "hypervisor", minion_tgt=HOST).data  # opt-in


def test_reactor_creates_the_assigned_vm_for_a_hypervisor_only(minions, emaster, cli, event_listener):
    t_all = time.monotonic()
    # the tenant (a VM's root) says it is a ready hypervisor, with hostile data: refused, nothing created
    t0 = time.time()
    hostile = json.dumps({"id": HOST, "host": HOST, "virt": {"assigned_vms": {"evbad2": {"cpu": 1, "mem": 64}}}})
    ret = cli.run("event.send", "salt/virt/hypervisor/ready", hostile, minion_tgt=TENANT)
    assert ret.returncode == 0 and ret.data is True, ret
    refused = wait_runner(event_listener, emaster, t0, TENANT)
    assert refused["retcode"] == 1 and refused["error"] == (
        f"{TENANT} is not one of the hypervisors (virt:hypervisors in the master config): refusing provisioning "
        "the VMs assigned to it"
    ), refused
    assert [r.data["return"].get("host") for r in runner_returns(event_listener, emaster, t0)] == [TENANT]
    vms = call(cli, "virt.vm_state")
    assert "evbad1" not in vms and "evbad2" not in vms

    # the tenant forges the hypervisor's own event: Salt's batch form lets it choose the tag and ALL the
    # data (cmd, id), so the reactor runs for HOST; the runner asks HOST, which sent no such nonce: refused
    t0 = time.time()
    forged = {"cmd": "_minion_event", "id": HOST, "data": {"nonce": "0" * 32}}
    batch = {
        "tag": None,
        "data": None,
        "pretag": None,
        "events": [{"tag": "salt/virt/hypervisor/ready", "data": forged}],
    }
    ret = cli.run("event.fire", json.dumps(batch), "fire_master", minion_tgt=TENANT)
    assert ret.returncode == 0 and ret.data is True, ret
    refused = wait_runner(event_listener, emaster, t0, HOST)
    assert refused["retcode"] == 1 and refused["error"].startswith(
        f"{HOST} did not confirm that it sent this ready event (it did not send it, or it was used already): "
        "nothing provisioned"
    ), refused
    # the hypervisor's plain event.send (no nonce) is no proof either
    t0 = time.time()
    assert cli.run("event.send", "salt/virt/hypervisor/ready", minion_tgt=HOST).returncode == 0
    refused = wait_runner(event_listener, emaster, t0, HOST)
    assert refused["error"].startswith(f"{HOST} did not confirm that it sent this ready event (no nonce in the event)")
    assert "evweb1" not in call(cli, "virt.vm_state")

    # the hypervisor's ready event (virt.ready, the example SLS's last state): the VM its pillar assigns is created
    t1 = time.time()
    ret = cli.run("state.single", "module.run", "name=salt-virt-ready", "virt.ready=[]", minion_tgt=HOST)
    assert ret.returncode == 0, ret
    done = wait_runner(event_listener, emaster, t1, HOST)
    assert sorted(done["created"]) == ["evweb1"] and done["failed"] == {} and done["existing"] == {}, done
    assert done["created"]["evweb1"]["host"] == HOST
    assert call(cli, "virt.vm_state", "evweb1") == {"evweb1": "running"}
    domain_event(event_listener, emaster, "evweb1", "started", t1, detail="booted")  # the engine saw it too

    # again: idempotent, nothing created twice
    t2 = time.time()
    assert cli.run("virt.ready", minion_tgt=HOST).returncode == 0
    again = wait_runner(event_listener, emaster, t2, HOST)
    assert again["created"] == {} and again["existing"] == {"evweb1": [HOST]}, again
    assert sorted(call(cli, "virt.vm_state")) == ["evweb1"]
    call(cli, "virt.purge", "evweb1")
    took = time.monotonic() - t_all
    print(f"reactor: forged events refused, assigned VM created, second event idempotent: {took:.1f} s")


def test_a_live_migration_out_is_an_event(minions, emaster, cli, event_listener, ehv, lab_dir, fabric, guest):
    """Migrated: evmig1 moves live from hv3 (the engine's) to a second hypervisor hv2 on the same fabric
    (peer to peer over libvirtd's TCP in the lab; the disk is a file both see at the same path)."""
    import libvirt

    t_all = time.monotonic()
    boot = guest_boot(guest)
    call(
        cli,
        "virt.init",
        "evmig1",
        "1",
        "128",
        "image=salt://images/guest.qcow2",
        "seed=False",
        f"boot={json.dumps(boot)}",
    )
    uuid = call(cli, "virt.vm_info", "evmig1")["evmig1"]["uuid"]
    target = lab.Hypervisor(lab_dir, 2, fabric).start()  # 2: used by no other module
    try:
        t0 = time.time()
        flags = (
            libvirt.VIR_MIGRATE_LIVE
            | libvirt.VIR_MIGRATE_PEER2PEER
            | libvirt.VIR_MIGRATE_PERSIST_DEST
            | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
            | libvirt.VIR_MIGRATE_UNSAFE  # the same file on both: this lab's "shared storage"
        )
        src = libvirt.open(ehv.uri)
        try:
            src.lookupByName("evmig1").migrateToURI3(f"qemu+tcp://{target.hostname}/system", {}, flags)
        finally:
            src.close()
        out = domain_event(event_listener, emaster, "evmig1", "migrated", t0)
        assert (out["detail"], out["direction"], out["uuid"]) == ("migrated", "out", uuid)
        assert "evmig1" not in call(cli, "virt.vm_state")
        dst = libvirt.open(target.uri)
        try:
            assert dst.lookupByName("evmig1").isActive()
        finally:
            dst.close()
    finally:
        target.stop()
    print(f"live migration out: {time.monotonic() - t_all:.1f} s")


def test_network_pool_and_secret_events_in_salts_scheme(minions, emaster, event_listener, ehv, lab_dir):
    import libvirt

    t_all = time.monotonic()
    wait(event_listener, emaster, f"salt/virt/{HOST}/engine/connected", minions["engine_started"])
    t0 = time.time()
    target = tempfile.mkdtemp(prefix="evpool-", dir=lab_dir)
    conn = libvirt.open(ehv.uri)
    secret_value = b"Ev3ntSecretValue"
    try:
        net = conn.networkDefineXML("<network><name>evnet1</name><bridge name='evbr1'/></network>")
        net.create()
        pool = conn.storagePoolDefineXML(
            f"<pool type='dir'><name>evpool1</name><target><path>{target}</path></target></pool>"
        )
        pool.create()
        pool.refresh()
        secret = conn.secretDefineXML(
            "<secret ephemeral='no' private='yes'><usage type='ceph'><name>evsecret</name></usage></secret>"
        )
        secret.setValue(secret_value)
        ids = {"network": net.UUIDString(), "pool": pool.UUIDString(), "secret": secret.UUIDString()}
        uri = conn.getURI()
        for thing in (net, pool):
            thing.destroy()
            thing.undefine()
        secret.undefine()
    finally:
        conn.close()
    prefix = "salt/engines/libvirt_events/qemu+unix/system"  # Salt's: the URI's scheme, host and path

    def salts(obj, event_type, event):
        ev = wait(
            event_listener,
            emaster,
            f"{prefix}/{obj}/{event_type}",
            t0,
            lambda d: d["data"].get("event") == event and d["data"].get(obj, {}).get("uuid") == ids[obj],
            f"{obj}/{event_type} {event}",
        )
        assert ev.data["id"] == HOST
        return {k: v for k, v in ev.data["data"].items() if not k.startswith("_")}

    for event in ("defined", "started", "stopped", "undefined"):
        data = salts("network", "lifecycle", event)
        assert data == {
            "uri": uri,
            "network": {"name": "evnet1", "uuid": ids["network"]},
            "event": event,
            "detail": "unknown",
        }
    for event in ("defined", "started", "stopped", "undefined"):
        assert salts("pool", "lifecycle", event)["pool"] == {"name": "evpool1", "uuid": ids["pool"]}
    assert salts("pool", "refresh", "refresh") == {
        "uri": uri,
        "pool": {"name": "evpool1", "uuid": ids["pool"]},
        "event": "refresh",
    }
    assert salts("secret", "lifecycle", "defined") == {
        "uri": uri,
        "secret": {"uuid": ids["secret"]},
        "event": "defined",
        "detail": "unknown",
    }
    assert salts("secret", "value_changed", "value_changed") == {
        "uri": uri,
        "secret": {"uuid": ids["secret"]},
        "event": "value_changed",
    }
    salts("secret", "lifecycle", "undefined")
    everything = event_listener.get_events([(emaster.id, "salt/engines/libvirt_events/*")], after_time=t0)
    assert secret_value.decode() not in json.dumps([e.full_data for e in everything], default=str)
    print(f"network, pool and secret events in Salt's scheme: {time.monotonic() - t_all:.1f} s")
