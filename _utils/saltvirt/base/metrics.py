"""salt-virt's metrics, recorded through Salt's own metrics layer (``salt.utils.metrics``, OpenTelemetry).

Every instrument is named once in :data:`INSTRUMENTS` (name, kind, unit, description, labels); code records
with :func:`add` (counter), :func:`record` (histogram) and :func:`set_gauge` (gauge), passing exactly the
labels the table names. Salt's ``metrics:`` config (master or minion) switches them on; with it off
(Salt's default) each call is one check of a cached flag. A metric never breaks what it measures: an
error inside the metrics SDK is logged at debug level and dropped.

Labels are bounded and carry no tenant data: results, modes, steps and the hypervisors' own minion ids
(the operator's machines). Never VM names, tenants, users, URIs or anything secret. See
``docs/topics/metrics.md``.
"""

import logging
from typing import Any, NamedTuple

import salt.utils.metrics

from saltvirt.base.salttypes import SaltOpts

log = logging.getLogger(__name__)


class Instrument(NamedTuple):
    kind: str  # counter | histogram | gauge
    unit: str  # UCUM as OpenTelemetry takes it: s, By, By/s, or "" (a count)
    description: str
    labels: tuple[str, ...]


INSTRUMENTS: dict[str, Instrument] = {
    "saltvirt.vm.provision.duration": Instrument(
        "histogram", "s", "virt.init on a hypervisor, from the call to the VM defined (and started)", ("result",)
    ),
    "saltvirt.vm.provision.failures": Instrument(
        "counter", "", "virt.init calls that failed, by the step that did not complete", ("step",)
    ),
    "saltvirt.vm.migrations": Instrument(
        "counter", "", "migrations this hypervisor sent to libvirt, by result and mode", ("result", "mode")
    ),
    "saltvirt.vm.migration.duration": Instrument(
        "histogram", "s", "time libvirt took to migrate a VM away (or to fail)", ("result", "mode")
    ),
    "saltvirt.vm.migration.bytes": Instrument(
        "counter", "By", "bytes libvirt reported moved by migrations (its job counters)", ("mode",)
    ),
    "saltvirt.vm.migration.throughput": Instrument(
        "histogram", "By/s", "average rate of a completed migration (bytes moved / seconds)", ("mode",)
    ),
    "saltvirt.vm.backups": Instrument("counter", "", "backups made (virt.backup), by result", ("result", "type")),
    "saltvirt.vm.backup.duration": Instrument(
        "histogram", "s", "time a backup took: copy, checksums and manifest", ("result", "type")
    ),
    "saltvirt.vm.backup.bytes": Instrument("counter", "By", "bytes written into backup files", ("type",)),
    "saltvirt.host.memory": Instrument(
        "gauge", "By", "a hypervisor's memory: total, used by running VMs, free", ("host", "state")
    ),
    "saltvirt.host.vcpus": Instrument(
        "gauge", "", "a hypervisor's vCPUs: total (host CPUs), used by running VMs, free", ("host", "state")
    ),
    "saltvirt.host.vms": Instrument("gauge", "", "VMs defined and active on a hypervisor", ("host", "state")),
    "saltvirt.host.up": Instrument("gauge", "", "1 when the hypervisor answered the master, else 0", ("host",)),
    "saltvirt.fleet.recovery.actions": Instrument(
        "counter", "", "host-failure recovery (virt.recover): runs refused, hosts fenced, VMs recovered", ("action",)
    ),
}

_UNIT_SUFFIX = {"s": "_seconds", "By": "_bytes", "By/s": "_bytes_per_second", "": ""}


def prometheus_name(name: str) -> str:
    """The family name Salt's Prometheus exporter gives instrument ``name`` (dots become underscores,
    the unit a suffix; a counter's samples add ``_total``, a histogram's ``_bucket``/``_sum``/``_count``)."""
    base, suffix = name.replace(".", "_"), _UNIT_SUFFIX[INSTRUMENTS[name].unit]
    return base if base.endswith(suffix) else base + suffix  # the exporter does not repeat a unit the name says


def enabled() -> bool:
    """Salt's metrics layer records in this process."""
    return bool(salt.utils.metrics.is_enabled())


def ensure(opts: SaltOpts, role: str = "master") -> bool:
    """Switch Salt's metrics layer on in a process Salt did not (``salt-run``: only the daemons configure it),
    from this process's ``metrics:`` config. Not for the Prometheus exporter: a short-lived process cannot be
    scraped and would take the daemon's port. Returns :func:`enabled`."""
    if enabled():
        return True
    conf = opts.get("metrics") or {}
    if not conf.get("enabled") or str(conf.get("exporter") or "otlp-http").lower() == "prometheus":
        return False
    salt.utils.metrics.configure({**opts, "__role": role})
    return enabled()


def _attributes(name, labels):
    inst = INSTRUMENTS[name]
    if set(labels) != set(inst.labels):  # a coding error: caught by the tests, whether metrics are on or off
        raise ValueError(f"metric {name} takes labels {inst.labels}, got {tuple(labels)}")
    return {k: str(v) for k, v in labels.items()}


def _emit(name, kind, value, labels):
    attrs, inst = _attributes(name, labels), INSTRUMENTS[name]
    if inst.kind != kind:  # a coding error too
        raise ValueError(f"metric {name} is a {inst.kind}, not a {kind}")
    if not enabled():
        return
    try:
        if kind == "counter":
            salt.utils.metrics.counter(name, description=inst.description, unit=inst.unit).add(value, attrs)
        elif kind == "histogram":
            hist = salt.utils.metrics.histogram(name, description=inst.description, unit=inst.unit)
            hist.record(value, attrs)
        else:  # Salt has no helper for a synchronous gauge: its documented escape hatch, the meter
            meter = salt.utils.metrics.get_meter()
            if meter is not None:
                meter.create_gauge(name, description=inst.description, unit=inst.unit).set(value, attrs)
    except Exception:  # a metric must never fail the operation it measures
        log.debug("metric %s not recorded", name, exc_info=True)


def add(name: str, amount: float = 1, **labels: Any) -> None:
    """Add ``amount`` to counter ``name``."""
    _emit(name, "counter", amount, labels)


def record(name: str, value: float, **labels: Any) -> None:
    """Record ``value`` in histogram ``name``."""
    _emit(name, "histogram", value, labels)


def set_gauge(name: str, value: float, **labels: Any) -> None:
    """Set gauge ``name`` (for these labels) to ``value``."""
    _emit(name, "gauge", value, labels)


def flush(timeout_ms: int = 3000) -> None:
    """Push what this process recorded now, for a push exporter (OTLP, console). A minion's job process
    ends with ``os._exit`` (multiprocessing), which skips the exit handlers that would export it; Salt
    3008.5 has no public flush, so its provider is read here. A pull exporter (Prometheus) is left alone."""
    if not enabled() or (salt.utils.metrics._cached_opts or {}).get("exporter") == "prometheus":
        return
    provider = getattr(salt.utils.metrics, "_provider", None)
    if provider is None:
        return
    try:
        provider.force_flush(timeout_millis=timeout_ms)
    except Exception:  # an unreachable collector must not fail the operation
        log.debug("metrics flush failed", exc_info=True)
