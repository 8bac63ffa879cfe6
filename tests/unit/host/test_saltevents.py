"""saltvirt.host.saltevents: Salt's libvirt_events tags and data from the virt_events engine (option
``tags``), checked alone and live on libvirt's test driver through the engine's watcher."""

import time

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import conn as vconn
from saltvirt.host import events, saltevents
from tests.unit.host.test_events import WAIT, Bus, start, stop


def test_uri_and_tag_as_salts_engine():
    assert saltevents.uri_part("qemu:///system") == "qemu/system"
    assert saltevents.uri_part("qemu+ssh://root@hv1:22/system") == "qemu+ssh/root@hv1:22/system"
    assert saltevents.uri_part("test:///default") == "test/default"
    assert saltevents.tag(saltevents.DEFAULT_PREFIX, "qemu:///system", "lifecycle") == (
        "salt/engines/libvirt_events/qemu/system/domain/lifecycle"
    )


def test_settings_are_salts_options():
    assert events.settings({})["tags"] == "salt-virt"  # ours only unless the operator asks
    opts = events.settings({"tags": "both", "filters": ["domain/lifecycle", "pool"], "tag_prefix": "libvirt/"})
    assert opts["filters"] == {"domain/lifecycle", "pool"} and opts["tag_prefix"] == "libvirt"
    assert saltevents.wanted(opts, "lifecycle") and not saltevents.wanted(opts, "reboot")
    assert saltevents.wanted(events.settings({"tags": "both"}), "reboot")  # default filters: all
    with pytest.raises(SaltInvocationError, match="tags must be one of"):
        events.settings({"tags": "salt"})
    with pytest.raises(SaltInvocationError, match="unknown filter.*domain/lifecyle"):
        events.settings({"tags": "both", "filters": ["domain/lifecyle"]})


def test_lifecycle_data_as_salts():
    who = ("web1", "uuid-1", 7)
    data = saltevents.lifecycle("qemu:///system", who, "STARTED", "FROM_SNAPSHOT")
    assert data == {
        "uri": "qemu:///system",
        "domain": {"name": "web1", "id": 7, "uuid": "uuid-1"},
        "event": "started",
        "detail": "from snapshot",
    }


@pytest.mark.parametrize("scheme", ["both", "libvirt_events"])
def test_live_events_in_salts_scheme(scheme):
    bus = Bus()
    opts = {"backoff_min": 0.1, "tags": scheme, "filters": ["domain/lifecycle"]}
    watcher = events.Watcher("hyper-test", lambda: vconn.connect("test:///default"), bus, opts)
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    salt_tag = "salt/engines/libvirt_events/test/default/domain/lifecycle"
    try:
        dom.suspend()
        dom.resume()
        bus.wait(lambda t, d: t == salt_tag and d["event"] == "resumed", "Salt's resumed event")
        ours = [t for t, _d in bus.sent if t.startswith("salt/virt/")]
        salts = [d for t, d in bus.sent if t == salt_tag]
        assert [(d["event"], d["detail"]) for d in salts] == [("suspended", "paused"), ("resumed", "unpaused")]
        assert salts[0]["domain"] == {"name": "test", "id": dom.ID(), "uuid": dom.UUIDString()}
        assert salts[0]["uri"] == "test:///default"
        if scheme == "both":
            bus.wait(lambda t, d: t == "salt/virt/hyper-test/domain/test/resumed", "our resumed event")
        else:
            assert ours == []
        assert watcher.known[dom.UUIDString()]["state"] == "running"  # tracked in either scheme
    finally:
        stop(watcher, thread)
        if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
            dom.resume()
        conn.close()


def test_object_lifecycle_names_as_salts_engine_means_them():
    names = {
        o: [saltevents.lifecycle_name(libvirt, o, c) for c in range(n)]
        for o, n in (("network", 4), ("pool", 6), ("nodedev", 4), ("secret", 2))
    }
    # the event-id constants (VIR_NETWORK_EVENT_ID_LIFECYCLE is 0 too) are never an event's name
    assert names == {
        "network": ["defined", "undefined", "started", "stopped"],
        "pool": ["defined", "undefined", "started", "stopped", "created", "deleted"],
        "nodedev": ["created", "deleted", "defined", "undefined"],
        "secret": ["defined", "undefined"],
    }
    assert saltevents.lifecycle_name(libvirt, "pool", 99) == "unknown"


def test_objects_only_in_salts_scheme_and_as_filtered():
    assert saltevents.objects_wanted(events.settings({})) == []  # salt-virt's own tags: domains only
    assert len(saltevents.objects_wanted(events.settings({"tags": "both"}))) == 7
    opts = events.settings({"tags": "libvirt_events", "filters": ["pool/refresh", "network", "domain"]})
    assert saltevents.objects_wanted(opts) == [("network", "lifecycle"), ("pool", "refresh")]
    with pytest.raises(SaltInvocationError, match="unknown filter.*network/refresh"):
        events.settings({"tags": "both", "filters": ["network/refresh"]})


class Recorder(list):
    def __call__(self, tag, data):
        self.append((tag, data))

    def wait(self, tag, pred=lambda d: True):
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            found = [d for t, d in list(self) if t == tag and pred(d)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {tag} within {WAIT} s; sent: {list(self)}")


def test_live_network_pool_and_nodedev_events_in_salts_scheme():
    """On the test driver (it has no secrets: tests/integration/test_events.py has them on a real libvirtd)."""
    sent = Recorder()
    watcher = events.Watcher("hyper-test", lambda: vconn.connect("test:///default"), sent, {"tags": "libvirt_events"})
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    prefix = "salt/engines/libvirt_events/test/default"
    try:
        net, pool = conn.networkLookupByName("default"), conn.storagePoolLookupByName("default-pool")
        net.destroy()
        net.create()
        pool.refresh(0)
        hba = "<capability type='fc_host'><wwnn>2000000012341234</wwnn><wwpn>1000000012341234</wwpn></capability>"
        dev = conn.nodeDeviceCreateXML(
            f"<device><parent>scsi_host1</parent><capability type='scsi_host'>{hba}</capability></device>", 0
        )
        dev_name = dev.name()
        dev.destroy()
        started = sent.wait(f"{prefix}/network/lifecycle", lambda d: d["event"] == "started")
        assert started == {
            "uri": "test:///default",
            "network": {"name": "default", "uuid": net.UUIDString()},
            "event": "started",
            "detail": "unknown",
        }
        network_events = [d["event"] for t, d in sent if t == f"{prefix}/network/lifecycle"]
        assert network_events[:2] == ["stopped", "started"]
        refresh = sent.wait(f"{prefix}/pool/refresh")
        assert refresh == {
            "uri": "test:///default",
            "pool": {"name": "default-pool", "uuid": pool.UUIDString()},
            "event": "refresh",
        }
        deleted = sent.wait(f"{prefix}/nodedev/lifecycle", lambda d: d["event"] == "deleted")
        assert deleted["nodedev"] == {"name": dev_name} and deleted["detail"] == "unknown"
        assert not [t for t, _d in sent if t.startswith("salt/virt/") and "/engine/" not in t]  # Salt's only
    finally:
        stop(watcher, thread)
        if not conn.networkLookupByName("default").isActive():
            conn.networkLookupByName("default").create()
        conn.close()


def test_a_definition_marks_the_capacity_index_stale_in_salts_scheme_too():
    bumps = []
    opts = {"tags": "libvirt_events", "filters": ["pool"]}  # no domain event relayed; the bump is ours
    watcher = events.Watcher("hyper-test", lambda: vconn.connect("test:///default"), Recorder(), opts)
    watcher.on_defined = lambda: bumps.append(1)
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    try:
        conn.defineXML(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))  # the same definition again: "updated"
        deadline = time.monotonic() + WAIT
        while not bumps and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bumps
        assert not [t for t, _d in watcher.fire if "/domain/" in t]
    finally:
        stop(watcher, thread)
        conn.close()
