"""saltvirt.fleet.recovery_guard, each guard on its own: three hypervisors on libvirt's test driver
(tests/support/testfleet.py, real hostrecord answers on private connections) and a real localfs store."""

import time

import pytest

from saltvirt.fleet import publish as fleet
from saltvirt.fleet import recovery_guard as guard
from tests.support.testfleet import TestFleet, domain_xml, local_store

UUID = "3f6ba1d4-1111-4c1b-9a40-0123456789ab"


@pytest.fixture
def store(tmp_path):
    return local_store(tmp_path)


@pytest.fixture
def hosts(tmp_path, store):
    f = TestFleet(tmp_path, opts=store.opts)
    yield f
    f.close()


def test_last_look_refuses_a_copy_anywhere_by_name_or_uuid(hosts):
    hosts.silent.add("hv1")  # the failed host, fenced: not asked (its silence would only be waited out)
    assert guard.last_look(hosts, "web1", UUID, "hv1") == {"hv2": "up", "hv3": "up"}
    assert sorted(h for h, fun, _args in hosts.calls if fun == "virt.recovery_where") == ["hv2", "hv3"]
    hosts.conns["hv3"].defineXML(domain_xml("renamed", f"{hosts.shared}/web1.qcow2", UUID))  # same UUID
    with pytest.raises(fleet.Failed, match=f"renamed \\(UUID {UUID}\\) is defined on hv3 \\(shutoff\\) now"):
        guard.last_look(hosts, "web1", UUID, "hv1")
    hosts.conns["hv3"].lookupByName("renamed").undefine()
    other = "3f6ba1d4-9999-4c1b-9a40-0123456789ab"
    hosts.conns["hv2"].defineXML(domain_xml("web1", f"{hosts.shared}/web1.qcow2", other)).create()  # same name
    with pytest.raises(fleet.Failed, match="web1 \\(UUID .*\\) is defined on hv2 \\(running\\)"):
        guard.last_look(hosts, "web1", UUID, "hv1")


def test_last_look_refuses_a_silent_hypervisor_unless_forced(hosts):
    hosts.silent.update({"hv1", "hv3"})
    with pytest.raises(fleet.Failed, match="hv3 \\(down: did not answer\\) did not answer, and may run it"):
        guard.last_look(hosts, "web1", UUID, "hv1")
    assert guard.last_look(hosts, "web1", UUID, "hv1", force=True)["hv3"] == "down"
    # force never covers a copy seen somewhere
    hosts.conns["hv2"].defineXML(domain_xml("web1", f"{hosts.shared}/web1.qcow2", UUID))
    with pytest.raises(fleet.Failed, match="defined on hv2"):
        guard.last_look(hosts, "web1", UUID, "hv1", force=True)


def rec(recorded):
    return {"recorded": recorded, "vms": {"web1": {"uuid": UUID}}}


def test_claim_lets_one_run_start_a_vm(store):
    old = rec(time.time() - 60)  # both runs act on the same record, taken a minute ago
    entry = guard.claim(store, old, "web1", "hv1", "hv2", store.opts)
    assert entry["state"] == "recovering" and entry["to"] == "hv2" and entry["uuid"] == UUID
    # a second run (another master, another operator) while the first is starting it
    with pytest.raises(fleet.Failed, match="a recovery of web1 from hv1 to hv2 started by m1 .* did not finish"):
        guard.claim(store, old, "web1", "hv1", "hv3", store.opts)
    guard.settle(store, "web1", "recovered")
    assert store.fetch(guard.VMS, "web1")["state"] == "recovered"
    for force in (False, True):  # done: refused, even forced, for a record that predates it
        with pytest.raises(fleet.Failed, match="web1 was already recovered from hv1 to hv2 by m1"):
            guard.claim(store, old, "web1", "hv1", "hv3", store.opts, force=force)
    assert store.fetch(guard.VMS, "web1")["to"] == "hv2"
    # a record of hv1 taken after it that shows web1 there again: the entry is history (hv1 ran it again)
    assert guard.claim(store, rec(time.time() + 1), "web1", "hv1", "hv3", store.opts)["to"] == "hv3"


def test_an_unfinished_claim_needs_force_and_a_failed_start_leaves_none(store):
    old = rec(time.time() - 60)
    guard.claim(store, old, "web1", "hv1", "hv2", store.opts)
    guard.settle(store, "web1", "unsure")  # the start got no answer: it may be starting on hv2
    assert store.fetch(guard.VMS, "web1")["state"] == "recovering"
    with pytest.raises(fleet.Failed, match="Check hv2 .* then retry with force=True"):
        guard.claim(store, old, "web1", "hv1", "hv3", store.opts)
    assert guard.claim(store, old, "web1", "hv1", "hv3", store.opts, force=True)["to"] == "hv3"
    guard.settle(store, "web1", "failed")  # refused there, its definition undone: nothing to remember
    assert store.fetch(guard.VMS, "web1") is None
    assert guard.claim(store, old, "web1", "hv1", "hv2", store.opts)["to"] == "hv2"
