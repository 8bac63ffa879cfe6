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


# Salt's engine's domain event types, in the order of its CALLBACK_DEFS (salt/engines/libvirt_events.py)
SALTS_DOMAIN_TYPES = [
    "lifecycle",
    "reboot",
    "rtc_change",
    "watchdog",
    "graphics",
    "io_error",
    "control_error",
    "disk_change",
    "tray_change",
    "pmwakeup",
    "pmsuspend",
    "balloon_change",
    "pmsuspend_disk",
    "device_removed",
    "block_job",
    "tunable",
    "agent_lifecycle",
    "device_added",
    "migration_iteration",
    "job_completed",
    "device_removal_failed",
    "metadata_change",
    "block_threshold",
]


def test_every_domain_type_of_salts_engine_is_declared_and_filterable():
    assert sorted(saltevents.TYPES) == sorted(SALTS_DOMAIN_TYPES)
    for event_type, (ids, _build) in saltevents.DOMAIN_EXTRA.items():
        assert any(hasattr(libvirt, c) for c in ids), event_type  # these bindings register every one
    assert saltevents.DOMAIN_EXTRA["block_job"][0][0] == "VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2"  # preferred, as Salt
    opts = events.settings({"tags": "both", "filters": ["domain/rtc_change", "domain/block_job", "pool"]})
    assert saltevents.domain_extra_wanted(opts) == ["rtc_change", "block_job"]
    assert saltevents.domain_extra_wanted(events.settings({"tags": "both"})) == list(saltevents.DOMAIN_EXTRA)
    assert saltevents.domain_extra_wanted(events.settings({"filters": ["all"]})) == []  # ours: not relayed
    with pytest.raises(SaltInvocationError, match="unknown filter.*domain/block_job_2"):
        events.settings({"tags": "both", "filters": ["domain/block_job_2"]})  # Salt's tag is block_job


def test_registration_follows_filters_on_the_test_driver():
    vconn.event_loop()  # libvirt registers domain callbacks only with an event loop
    conn = libvirt.open("test:///default")
    try:
        for filters, extra in ((["all"], len(saltevents.DOMAIN_EXTRA)), (["domain/watchdog", "pool/refresh"], 1)):
            watcher = events.Watcher("hyper-test", None, Recorder(), {"tags": "libvirt_events", "filters": filters})
            ids = watcher._register(conn)
            try:
                domain_ids = [i for m, i in ids if m == "domainEventDeregisterAny"]
                assert len(domain_ids) == 5 + extra  # the five of both schemes, and Salt's others as filtered
            finally:
                for method, cb_id in ids:
                    getattr(conn, method)(cb_id)
                conn.unregisterCloseCallback()
    finally:
        conn.close()


def test_live_metadata_change_is_relayed_and_filtered():
    """The test driver emits metadata_change (setMetadata); its other Salt types need a real guest."""
    sent, bumps = Recorder(), []
    opts = {"tags": "libvirt_events", "filters": ["domain/metadata_change", "domain/lifecycle"]}
    watcher = events.Watcher("hyper-test", lambda: vconn.connect("test:///default"), sent, opts)
    watcher.on_defined = lambda: bumps.append(1)
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    tag = "salt/engines/libvirt_events/test/default/domain/metadata_change"
    try:
        known = dict(watcher.known[dom.UUIDString()])
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, "<x/>", "x", "https://tenant.example/ns", 0)
        data = sent.wait(tag)
        assert data == {
            "uri": "test:///default",
            "domain": {"name": "test", "id": dom.ID(), "uuid": dom.UUIDString()},
            "event": "metadata_change",
            "type": "element",
            "nsuri": "https://tenant.example/ns",  # the namespace only, never the metadata
        }
        assert watcher.known[dom.UUIDString()] == known and bumps == []  # data only: nothing acted upon
    finally:
        stop(watcher, thread)
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, "https://tenant.example/ns", 0)
        conn.close()
    # not in the filters: not registered, so not sent (a later lifecycle event shows the earlier one is past)
    sent = Recorder()
    opts = {"tags": "libvirt_events", "filters": ["domain/lifecycle"]}
    watcher = events.Watcher("hyper-test", lambda: vconn.connect("test:///default"), sent, opts)
    thread = start(watcher)
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    try:
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, "tenant text", None, None, 0)
        dom.suspend()
        dom.resume()
        sent.wait("salt/engines/libvirt_events/test/default/domain/lifecycle", lambda d: d["event"] == "resumed")
        assert [t for t, _d in sent if t == tag] == []
    finally:
        stop(watcher, thread)
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_DESCRIPTION, None, None, None, 0)
        conn.close()


L = libvirt
# libvirt's callback arguments after the domain (libvirt-python's examples/event-test.py documents them) and
# the data Salt's engine builds from them
CALLS = {
    "rtc_change": ((3600,), {"utcoffset": 3600}),
    "watchdog": ((L.VIR_DOMAIN_EVENT_WATCHDOG_RESET,), {"action": "reset"}),
    "graphics": (
        (
            L.VIR_DOMAIN_EVENT_GRAPHICS_CONNECT,
            {"family": L.VIR_DOMAIN_EVENT_GRAPHICS_ADDRESS_IPV4, "node": "127.0.0.1", "service": "5900"},
            {"family": L.VIR_DOMAIN_EVENT_GRAPHICS_ADDRESS_IPV6, "node": "::1", "service": "41000"},
            "vnc",
            [("x509dname", "CN=ops")],
        ),
        {
            "phase": "connect",
            "local": {"family": "ipv4", "node": "127.0.0.1", "service": "5900"},
            "remote": {"family": "ipv6", "node": "::1", "service": "41000"},
            "authScheme": "vnc",
            "subject": [{"type": "x509dname", "name": "CN=ops"}],
        },
    ),
    "disk_change": (
        ("/isos/a.iso", None, "ide0-0-0", L.VIR_DOMAIN_EVENT_DISK_CHANGE_MISSING_ON_START),
        {"oldSrcPath": "/isos/a.iso", "newSrcPath": None, "dev": "ide0-0-0", "reason": "change missing on start"},
    ),
    "tray_change": (("ide0-0-0", L.VIR_DOMAIN_EVENT_TRAY_CHANGE_OPEN), {"dev": "ide0-0-0", "reason": "open"}),
    "pmwakeup": ((0,), {"reason": "unknown"}),
    "pmsuspend": ((0,), {"reason": "unknown"}),
    "balloon_change": ((524288,), {"actual": 524288}),
    "pmsuspend_disk": ((0,), {"reason": "unknown"}),
    "device_removed": (("virtio-disk1",), {"dev": "virtio-disk1"}),
    "block_job": (
        ("vda", L.VIR_DOMAIN_BLOCK_JOB_TYPE_ACTIVE_COMMIT, L.VIR_DOMAIN_BLOCK_JOB_FAILED),
        {"disk": "vda", "type": "active commit", "status": "failed"},  # FAILED shares 1 with INFO_/SPEED_/ABORT_
    ),
    "tunable": (({"cputune.vcpu_period": 100000},), {"params": {"cputune.vcpu_period": 100000}}),
    "device_added": (("net1",), {"dev": "net1"}),
    "migration_iteration": ((3,), {"iteration": 3}),
    "job_completed": (({"time_elapsed": 1200},), {"params": {"time_elapsed": 1200}}),
    "device_removal_failed": (("net1",), {"dev": "net1"}),
    "metadata_change": ((L.VIR_DOMAIN_METADATA_TITLE, None), {"type": "title", "nsuri": None}),
    "block_threshold": (
        ("vda[1]", "/images/a.qcow2", 1024, 512),
        {"dev": "vda[1]", "path": "/images/a.qcow2", "threshold": 1024, "excess": 512},
    ),
}


@pytest.mark.parametrize("event_type", list(saltevents.DOMAIN_EXTRA))
def test_salts_other_domain_events_from_libvirts_callback_arguments(event_type):
    """The test driver cannot emit these (no guest, no QEMU, no block jobs): the callback the watcher
    registers is called as libvirt calls it, on a domain of the test driver, then handled as queued."""
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName("test")
    sent, bumps = Recorder(), []
    watcher = events.Watcher("hyper-test", None, sent, {"tags": "both"})
    watcher.uri, watcher.known, watcher.on_defined = "test:///default", {}, lambda: bumps.append(1)
    args, expected = CALLS[event_type]
    try:
        watcher._extra_callback(event_type)(conn, dom, *args, None)
        assert watcher.handle(*watcher.inbox.get_nowait())
        assert sent == [
            (
                f"salt/engines/libvirt_events/test/default/domain/{event_type}",
                {
                    "uri": "test:///default",
                    "domain": {"name": "test", "id": dom.ID(), "uuid": dom.UUIDString()},
                    "event": event_type,
                    **expected,
                },
            )
        ]
        assert watcher.known == {} and bumps == []  # relayed as data, never acted upon; no salt/virt/ tag
    finally:
        conn.close()


def test_callback_arguments_of_another_libvirt_are_skipped_not_fatal():
    conn = libvirt.open("test:///default")
    sent = Recorder()
    watcher = events.Watcher("hyper-test", None, sent, {"tags": "libvirt_events"})
    watcher.uri = "test:///default"
    try:
        watcher._extra_callback("block_job")(conn, conn.lookupByName("test"), "vda", None)  # one argument short
        assert watcher.handle(*watcher.inbox.get_nowait()) and sent == []
    finally:
        conn.close()
