"""saltvirt.base.metrics through Salt's real metrics layer (OpenTelemetry SDK, its Prometheus exporter):
instrumented code runs on libvirt's test driver, then the exporter's /metrics page is scraped over HTTP
and parsed with prometheus_client's own parser."""

import contextlib
import http.server
import json
import pathlib
import re
import socket
import subprocess
import threading
import urllib.request

import libvirt
import pytest
import salt.utils.metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from prometheus_client.parser import text_string_to_metric_families
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import metrics
from saltvirt.fleet import publish, recovery
from saltvirt.host import capacity
from saltvirt.model import vmargs
from saltvirt.vm import provision
from tests.support import signedfleet
from tests.support.saltloader import SOURCES, make_minion_mods
from tests.support.testfleet import TestFleet, domain_xml, local_store

DASHBOARD = pathlib.Path(__file__).parents[3] / "docs" / "_static" / "salt-virt-grafana.json"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def scrape():
    """Salt's metrics layer on, Prometheus exporter on a free port; ``scrape()``: {sample name: [(labels,
    value)]} of the saltvirt families. Off again afterwards (other tests in this process see it off)."""
    port = _free_port()
    salt.utils.metrics.configure(
        {"metrics": {"enabled": True, "exporter": "prometheus", "prometheus": {"host": "127.0.0.1", "port": port}}}
    )
    assert metrics.enabled()

    def read():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith("saltvirt_"):
                    labels = {k: v for k, v in sample.labels.items() if not k.startswith("otel_")}
                    out.setdefault(sample.name, []).append((labels, sample.value))
        return out

    yield read
    server = salt.utils.metrics._prometheus_server_thread  # Salt keeps the listener; stop it, free the port
    salt.utils.metrics.shutdown()
    if isinstance(server, tuple):
        server[0].shutdown()
    salt.utils.metrics.configure({})  # metrics off again for the rest of this process
    assert not metrics.enabled()


def value(samples, name, **labels):
    """The sample of ``name`` whose labels include ``labels`` (0 when there is none yet)."""
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) <= 1, (name, labels, samples.get(name))
    return found[0] if found else 0


@pytest.fixture
def mods(tmp_path):
    """virt.* on test:///default with a backup dir, a source image and a connection keeping the driver's state."""
    (tmp_path / SOURCES).mkdir()
    src = tmp_path / SOURCES / "src.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(src), "16M"], check=True)
    (tmp_path / "backups").mkdir()
    conn = libvirt.open("test:///default")
    mods = make_minion_mods(tmp_path, "test:///default", backup={"dir": str(tmp_path / "backups")})
    yield mods, str(src), conn
    for name in ("mx1", "mx2", "mx3", "mx5"):  # mx5: the racer's own definition
        with contextlib.suppress(CommandExecutionError, SaltInvocationError):  # not made by this test
            mods["virt.purge"](name)
    conn.close()


def test_every_instrument_is_exported_under_its_documented_name(scrape):
    for name, inst in metrics.INSTRUMENTS.items():
        labels = {label: "probe" for label in inst.labels}
        {"counter": metrics.add, "histogram": metrics.record, "gauge": metrics.set_gauge}[inst.kind](name, 2, **labels)
    got = scrape()
    for name, inst in metrics.INSTRUMENTS.items():
        family = metrics.prometheus_name(name)
        sample = {"counter": f"{family}_total", "histogram": f"{family}_count", "gauge": family}[inst.kind]
        assert sample in got, (name, sample, sorted(got))
        ((labels, _),) = [(lab, v) for lab, v in got[sample] if lab.get(inst.labels[0]) == "probe"]
        assert set(labels) == set(inst.labels)


def unseeded_init(mods, name, progress=None, **kwargs):
    """provision.init of ``name`` (1 vCPU, 64 MiB, the source image, nothing seeded) with ``kwargs``
    (``progress=``: a callback that makes a step fail), as virt.init calls it."""
    v, src, conn = mods
    images = v.opts["virt"]["images"]
    allowed = [str(pathlib.Path(src).parent)]
    host = provision.Host(images_dir=images, allowed_paths=allowed)
    return provision.init(conn, vmargs.InitRequest(name, 1, 64, src, nic=None, seed=False, **kwargs), host, progress)


def test_virt_init_is_timed_and_a_failure_counted_by_its_step(scrape, mods):
    v, src, conn = mods
    before = scrape()
    v["virt.init"]("mx1", 1, 64, image=src, nic=None, start=False, seed=False)
    with pytest.raises(SaltInvocationError):  # an image that is not there: nothing was made yet
        v["virt.init"]("mx2", 1, 64, image=src + ".missing", nic=None, start=False, seed=False)

    def stop_at_defined(step, **_data):  # the VM's definition made: fail as a start would
        if step == "defined":
            raise CommandExecutionError("start refused")

    with pytest.raises(CommandExecutionError, match="start refused"):
        unseeded_init(mods, "mx3", progress=stop_at_defined)
    assert "mx3" not in conn.listDefinedDomains()  # undone
    after = scrape()
    count = "saltvirt_vm_provision_duration_seconds_count"
    assert value(after, count, result="ok") - value(before, count, result="ok") == 1
    assert value(after, count, result="failed") - value(before, count, result="failed") == 2
    fails = "saltvirt_vm_provision_failures_total"
    assert value(after, fails, step="prepare") - value(before, fails, step="prepare") == 1
    assert value(after, fails, step="start") - value(before, fails, step="start") == 1
    assert value(after, fails, step="seed") == value(before, fails, step="seed")
    assert all("mx" not in json.dumps(labels) for samples in after.values() for labels, _ in samples)  # no VM names


def test_a_define_that_fails_without_seeding_is_counted_as_define_not_seed(scrape, mods):
    v, src, conn = mods
    other = "<domain type='test'><name>mx5</name><memory>65536</memory><os><type>hvm</type></os></domain>"

    def racer(step, **_data):  # someone else defines mx5 once our disks are made: libvirt refuses our define
        if step == "disks_ready":
            conn.defineXML(other)

    before = scrape()
    with pytest.raises(CommandExecutionError, match="define VM 'mx5'"):
        unseeded_init(mods, "mx5", start=False, progress=racer)
    after = scrape()
    fails = "saltvirt_vm_provision_failures_total"
    assert value(after, fails, step="define") - value(before, fails, step="define") == 1
    assert value(after, fails, step="seed") == value(before, fails, step="seed")  # nothing was to be seeded


def test_a_failed_migration_is_counted(scrape, tmp_path):
    # the test driver has no migration support: libvirt really refuses, the VM stays
    clear = make_minion_mods(tmp_path, "test:///default", migration={"allow_cleartext": True})
    before = scrape()
    with pytest.raises(CommandExecutionError, match="failed"):
        clear["virt.migrate"]("test", "hv2", transport="tcp")
    after = scrape()
    name = "saltvirt_vm_migrations_total"
    assert value(after, name, result="failed", mode="live") - value(before, name, result="failed", mode="live") == 1
    assert value(after, name, result="ok", mode="live") == value(before, name, result="ok", mode="live")


def test_a_backup_counts_its_bytes(scrape, mods):
    v, src, _conn = mods
    v["virt.init"]("mx1", 1, 64, image=src, nic=None, start=False, seed=False)
    before = scrape()
    made = v["virt.backup"]("mx1")
    after = scrape()
    assert made["size"] > 0
    assert (
        value(after, "saltvirt_vm_backups_total", result="ok", type="full")
        - value(before, "saltvirt_vm_backups_total", result="ok", type="full")
        == 1
    )
    b = "saltvirt_vm_backup_bytes_total"
    assert value(after, b, type="full") - value(before, b, type="full") == made["size"]


def test_capacity_gauges_when_the_master_reads_the_hypervisors(scrape, test_conn, tmp_path):
    # placement's read (publish.Fleet.capacities): hv-a answers (signed with its key) from the test driver, hv-b
    # is silent
    xml = "<domain type='test'><name>cap1</name><memory unit='MiB'>256</memory><vcpu>2</vcpu>"
    xml += "<os><type>hvm</type></os></domain>"
    test_conn.defineXML(xml).create()
    answer = capacity.capacity(test_conn)
    opts = signedfleet.fleet_opts(tmp_path, ["hv-a", "hv-b"])
    hosts = publish.Fleet(opts, client=signedfleet.SigningClient({"virt.capacity": {"hv-a": answer}})).capacities()
    assert hosts["hv-a"]["status"] == "up" and hosts["hv-b"]["status"] == "down"
    got, host = scrape(), answer["host"]
    assert value(got, "saltvirt_host_up", host="hv-a") == 1 and value(got, "saltvirt_host_up", host="hv-b") == 0
    mem = "saltvirt_host_memory_bytes"
    assert host["mem_used_by_vms"] >= 256 and host["vcpus_used_by_vms"] >= 2  # cap1 runs
    assert value(got, mem, host="hv-a", state="total") == host["mem_total"] << 20
    assert value(got, mem, host="hv-a", state="used") == host["mem_used_by_vms"] << 20
    assert value(got, mem, host="hv-a", state="free") == (host["mem_total"] - host["mem_used_by_vms"]) << 20
    assert value(got, "saltvirt_host_vcpus", host="hv-a", state="used") == host["vcpus_used_by_vms"]
    assert value(got, "saltvirt_host_vcpus", host="hv-a", state="total") == host["vcpus_total"]
    assert value(got, "saltvirt_host_vms", host="hv-a", state="defined") == host["vms_defined"]
    assert not any(lab.get("host") == "hv-b" for lab, _ in got.get(mem, []))  # a silent host's last value stays


WEB1 = "3f6ba1d4-1111-4c1b-9a40-0123456789ab"


@pytest.fixture
def failed_hv1(tmp_path):
    """Three hypervisors on the test driver (tests/support/testfleet.py), a real store: hv1 ran web1 on the
    shared directory and was recorded; then it failed (its guest died with it, its minion went silent)."""
    store = local_store(tmp_path)
    hosts = TestFleet(tmp_path, opts=store.opts)
    disk = f"{hosts.shared}/web1.qcow2"
    open(disk, "wb").close()
    dom = hosts.conns["hv1"].defineXML(domain_xml("web1", disk, WEB1))
    dom.create()
    assert recovery.refresh(hosts, store)["hv1"]["vms"] == ["web1"]
    dom.destroy()
    hosts.silent.add("hv1")
    yield hosts, store
    hosts.close()


def test_recovery_counts_a_refused_run_the_fencing_and_the_vm_recovered(scrape, failed_hv1):
    hosts, store = failed_hv1
    fence = {"fence": {"command": ["true"], "timeout": 10}}
    name = "saltvirt_fleet_recovery_actions_total"
    actions = ("refused", "fenced", "fence_failed", "recovered", "failed", "not_recoverable")
    before = scrape()
    hosts.silent.add("hv3")
    with pytest.raises(publish.Failed, match="refusing to recover hv1: hv3 did not answer"):
        recovery.recover(hosts, "hv1", fence, store=store)
    out = recovery.recover(hosts, "hv1", fence, store=store, force=True)
    assert out["recovered"]["web1"]["host"] == "hv2"
    after = scrape()
    delta = {a: value(after, name, action=a) - value(before, name, action=a) for a in actions}
    assert delta == {"refused": 1, "fenced": 1, "fence_failed": 0, "recovered": 1, "failed": 0, "not_recoverable": 0}
    # the rest of the table, from an answer as a failed fence leaves it
    recovery.count_actions({"fenced": {"rc": 1}, "failed": {"a": {}}, "not_recoverable": {"b": "x", "c": "y"}}, True)
    again = scrape()
    delta = {a: value(again, name, action=a) - value(after, name, action=a) for a in actions}
    assert delta == {"refused": 1, "fenced": 0, "fence_failed": 1, "recovered": 0, "failed": 1, "not_recoverable": 2}


@pytest.fixture
def collector():
    """A stand-in OTLP/HTTP collector: the bodies POSTed to it, decoded with OpenTelemetry's own protobuf."""
    got = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append(ExportMetricsServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    # shutdown() waits for serve_forever's next poll: the default 0.5 s was most of each test's time
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", got
    server.shutdown()
    server.server_close()


def pushed(requests):
    """{(metric name, attributes): value} of the sums the collector received."""
    out = {}
    for req in requests:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.sum.data_points:
                        attrs = tuple(sorted((a.key, a.value.string_value) for a in point.attributes))
                        out[metric.name, attrs] = point.as_int or point.as_double
    return out


def test_a_push_exporter_in_a_process_salt_did_not_configure(collector):
    # salt-run's case: ensure() switches Salt's layer on from the master config, and flush() pushes at once
    # (a job process exits without the exit handlers that would; the periodic export is an hour away here)
    endpoint, got = collector
    assert not metrics.enabled()
    conf = {
        "metrics": {"enabled": True, "exporter": "otlp-http", "endpoint": endpoint, "export_interval_seconds": 3600}
    }
    try:
        assert metrics.ensure(conf) is True
        metrics.add("saltvirt.fleet.recovery.actions", 3, action="fenced")
        assert not got
        metrics.flush()
        assert pushed(got) == {("saltvirt.fleet.recovery.actions", (("action", "fenced"),)): 3}
    finally:
        salt.utils.metrics.shutdown()
        salt.utils.metrics.configure({})


def test_metrics_off_records_nothing_and_breaks_nothing(mods):
    v, src, _conn = mods
    assert not metrics.enabled()  # Salt's default
    v["virt.init"]("mx1", 1, 64, image=src, nic=None, start=False, seed=False)
    assert salt.utils.metrics._provider is None  # nothing was built: no exporter, thread or listener
    metrics.flush()
    with pytest.raises(ValueError, match="takes labels"):  # a wrong label is a coding error, on or off
        metrics.add("saltvirt.vm.migrations", result="ok")
    assert metrics.ensure({"metrics": {"enabled": False}}) is False
    # a short-lived process never takes the daemon's Prometheus port
    assert metrics.ensure({"metrics": {"enabled": True, "exporter": "prometheus"}}) is False
    assert salt.utils.metrics._provider is None


def test_the_dashboard_uses_only_metrics_of_the_table():
    dashboard = json.loads(DASHBOARD.read_text())
    known = {metrics.prometheus_name(n) for n in metrics.INSTRUMENTS}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = set()
    for expr in exprs:
        for word in re.findall(r"\bsaltvirt_[a-z_]+", expr):
            family = next(
                (k for k in known if word in (k, f"{k}_total", f"{k}_bucket", f"{k}_sum", f"{k}_count")), None
            )
            assert family, f"panel metric {word} is not in saltvirt.base.metrics.INSTRUMENTS"
            used.add(family)
    assert used == known, f"metrics without a panel: {sorted(known - used)}"
