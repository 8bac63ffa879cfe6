"""VMs as Salt Resources (``virt_vm``) following the VMs' lifecycle, on real daemons: a master of its own, two
namespaced lab hypervisors with shared storage (tests/support/fleetlab.py) whose minions run the ``virt_events``
engine, the master's pillar declaring ``resources: {virt_vm: {}}`` for both, and one small TCG guest (the test guest
with its guest agent, no minion inside). No minion is restarted: the VM shows up as a resource when it is created,
moves to its new hypervisor with a live migration, is forced off there through its resource (a start through it is
refused: no lock manager declared; the runner starts it) and drops out when it is purged, each through the engine's
``resource_refresh`` on the minion's own bus (docs/topics/resources.md, "Registration follows the VMs").

    hv20  creates the VM (the source of the migration)
    hv24  the target of the migration

tests/integration/test_resources.py covers Salt's side over the test driver (ids, compound targets, eauth).
"""

import pathlib
import time

import libvirt
import pytest

from tests.support.fleetlab import (
    fleet_minions,
    hypervisors,
    local_client,
    minion_configs,
    ok,
    run,
    shared_store,
    shared_vm,
)
from tests.support.saltd import master_config, presync

HVS = (20, 24)  # lab indexes no other module uses
SRC, DST = "hv20", "hv24"
NAME = "rsv1"
BOUND = 120  # seconds for a registration to follow a lifecycle change on a loaded 2-core machine (~3 s idle)


@pytest.fixture(scope="module")
def store(lab_dir, guest):
    with shared_store(lab_dir, guest, "rsr-store") as root:
        yield root


@pytest.fixture(scope="module")
def lab_hvs(lab_dir, fabric, store):
    with hypervisors(lab_dir, fabric, HVS) as hvs:
        yield hvs


@pytest.fixture(scope="module")
def rrmaster(salt_factories, state_tree, tmp_path_factory):
    pillar = tmp_path_factory.mktemp("rsr-pillar")
    (pillar / "top.sls").write_text("base:\n  'hv2[04]':\n    - resources\n")
    (pillar / "resources.sls").write_text("resources:\n  virt_vm: {}\n")  # the operator declares the type
    virt = {"hypervisors": {"tgt": "hv2[04]", "tgt_type": "glob", "timeout": 5, "gather_job_timeout": 15}}
    overrides = master_config(state_tree, virt=virt, pillar_roots={"base": [str(pillar)]}, ext_pillar=[])
    factory = presync(salt_factories.salt_master_daemon("rsr-master", overrides=overrides))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def minions(rrmaster, lab_hvs, lab_dir, store):
    configs = minion_configs(lab_hvs, lab_dir, store)
    for config in configs.values():  # the engine that makes the registration follow libvirt's events
        config["engines"] = [{"virt_events": {"backoff_min": 0.5, "backoff_max": 2}}]
    with fleet_minions(rrmaster, lab_hvs, configs) as factories:
        yield factories


@pytest.fixture(scope="module")
def local(rrmaster, minions):
    with local_client(rrmaster) as client:
        yield client


LAST = {}  # the last salt CLI answer, for a failure's message


def salt(master, tgt, fun, *args, timeout=60):
    LAST["ret"] = master.salt_cli(timeout=timeout).run("-C", fun, *args, minion_tgt=tgt)
    return LAST["ret"]


def until(what, probe):
    """Poll ``probe()`` (a value or None) until it gives a value, within BOUND seconds."""
    deadline, last = time.monotonic() + BOUND, None
    while time.monotonic() < deadline:
        last = probe()
        if last is not None:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {BOUND} s; last answer: {LAST.get('ret')}")


def answers_from(master, uuid, host):
    """The resource's grains when ``T@virt_vm:<uuid>`` reaches it on ``host`` (and only there), else None."""
    # a full T@type:id waits the CLI's whole timeout (60 s) for an id not registered yet (Salt 3008.5, below);
    # the type alone reaches only what is registered: asked first, a probe before registration costs seconds
    if uuid not in (salt(master, "T@virt_vm", "test.ping").data or {}):
        return None
    ping = salt(master, f"T@virt_vm:{uuid}", "test.ping")
    if ping.returncode != 0 or ping.data != {uuid: True}:
        return None
    ret = salt(master, f"T@virt_vm:{uuid}", "grains.items")
    if ret.returncode != 0 or list(ret.data or {}) != [uuid] or ret.data[uuid].get("hypervisor") != host:
        return None
    return ret.data[uuid]


def matches_nothing(master, tgt):
    ret = salt(master, tgt, "test.ping")
    return ret if ret.returncode != 0 and not ret.data else None


def libvirt_active(uri, name):
    conn = libvirt.open(uri)
    try:
        return bool(conn.lookupByName(name).isActive())
    finally:
        conn.close()


def state_is(master, uuid, state):
    """True once the grains the master holds for the resource (registration) say ``state``, else None."""
    ret = salt(master, f"T@virt_vm and G@state:{state}", "test.ping")
    return True if ret.returncode in (0, 1) and uuid in (ret.data or {}) else None


def test_a_vm_resource_follows_creation_migration_power_and_purge(rrmaster, local, lab_hvs, minions, store, guest):
    pids = {mid: factory.pid for mid, factory in minions.items()}
    assert matches_nothing(rrmaster, "T@virt_vm"), "no VM yet, no resource"

    shared_vm(local, store, guest, SRC, NAME, initrd="initrd_qga")  # test.ping: running, its agent answers
    t0 = time.monotonic()
    conn = libvirt.open(lab_hvs[SRC].uri)
    try:
        uuid = conn.lookupByName(NAME).UUIDString()
    finally:
        conn.close()
    grains = until(f"{NAME} registered by {SRC}", lambda: answers_from(rrmaster, uuid, SRC))
    print(f"created -> registered: {time.monotonic() - t0:.1f} s")
    assert (grains["name"], grains["state"], grains["uuid"]) == (NAME, "running", uuid), grains

    t0 = time.monotonic()
    ok(local, SRC, "virt.migrate", NAME, DST, unsafe=True, transport="tcp")
    grains = until(f"{NAME} registered by {DST} after its migration", lambda: answers_from(rrmaster, uuid, DST))
    print(f"migrated -> registered on {DST}: {time.monotonic() - t0:.1f} s")
    assert (grains["name"], grains["state"]) == (NAME, "running"), grains
    # the UUID is the destination's only: once, in the selection of the whole type
    every = salt(rrmaster, "T@virt_vm", "test.ping")
    assert every.returncode == 0 and every.data == {uuid: True}, every

    # power through the resource, no minion in the guest: off on its new host, its state grain follows; a start
    # through it is refused (hv24's minion config declares no lock manager: a second copy could start), the
    # runner's start (which asks every hypervisor first) starts it, and the resource answers again
    ret = salt(rrmaster, f"T@virt_vm:{uuid}", "virt.force_off")
    assert ret.returncode == 0 and ret.data[uuid]["state"] == "shutoff", ret
    assert not libvirt_active(lab_hvs[DST].uri, NAME)
    until(f"{NAME}'s state grain after force_off", lambda: state_is(rrmaster, uuid, "shutoff"))
    ret = salt(rrmaster, f"T@virt_vm:{uuid}", "virt.start")
    assert ret.returncode != 0 and f"salt-run virt.start {NAME}" in str(ret.data[uuid]), ret
    assert not libvirt_active(lab_hvs[DST].uri, NAME)
    ret = run(rrmaster, "virt.start", NAME)
    assert ret.returncode == 0, ret
    until(f"{NAME} running again on {DST}", lambda: answers_from(rrmaster, uuid, DST))

    t0 = time.monotonic()
    ret = run(rrmaster, "virt.purge", NAME)
    assert ret.returncode == 0, ret
    until(f"{NAME} unregistered after its purge", lambda: matches_nothing(rrmaster, "T@virt_vm"))
    print(f"purged -> unregistered: {time.monotonic() - t0:.1f} s")
    # Salt 3008.5 waits for the id of a full T@type:id whether it is registered or not (CkMinions.
    # _check_resource_minions): no hypervisor answers for it any more
    ret = salt(rrmaster, f"T@virt_vm:{uuid}", "test.ping", timeout=10)
    assert ret.returncode != 0 and "Minion did not return" in str((ret.data or {}).get(uuid)), ret
    assert {mid: factory.pid for mid, factory in minions.items()} == pids, "a minion was restarted"
    for mid, factory in minions.items():  # each engine read its minion's pillar: the type declared
        log = pathlib.Path(factory.config["log_file"]).read_text(errors="replace")
        assert "virt_vm: registration follows lifecycle events: on" in log, mid
        assert "could not tell whether this minion manages virt_vm" not in log, mid
