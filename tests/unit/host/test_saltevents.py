"""saltvirt.host.saltevents: Salt's libvirt_events tags and data from the virt_events engine (option
``tags``), checked alone and live on libvirt's test driver through the engine's watcher."""

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import conn as vconn
from saltvirt.host import events, saltevents
from tests.unit.host.test_events import Bus, start, stop


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
