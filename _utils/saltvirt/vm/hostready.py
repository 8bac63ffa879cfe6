"""Whether a hypervisor is ready for VMs again, as ``salt-run virt.roll`` asks it (``virt.host_ready``, a signed
answer) after the reboot it asked for: libvirtd answers; its TLS listener takes this host's own libvirt client
certificate, when migrations to it use TLS (``virt:migration:transport``, TLS by default); and the events engine
runs again since this boot, connected to libvirt, when the minion config starts one. Each part is
``{ok: True | False | None, why}``, None when this host does not use it."""

from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import ConfigGet, Data
from saltvirt.host import conn, readiness
from saltvirt.vm import migrate, migrate_tls

EVENT_ENGINES = ("virt_events", "libvirt_events")
TLS_WAIT = 10  # seconds the TLS connection may take to open


def _libvirtd(uri: str | None) -> tuple[Data, str | None]:
    try:
        with conn.connect(uri, readonly=True) as c:
            return {"ok": True, "why": f"libvirt {c.getLibVersion()} answers"}, c.getHostname()
    except CommandExecutionError as exc:
        return {"ok": False, "why": str(exc)}, None


def _tls(config_get: ConfigGet, hostname: str | None) -> Data:
    try:
        mig = migrate.settings(config_get)
        # as a migration chooses: TLS unless tcp is named, TLS refused without the client files
        transport, _warnings = migrate_tls.choose_transport(mig["transport"], mig["pkipath"])
        if transport != "tls":
            return {"ok": None, "why": f"migrations to this host use {transport} (virt:migration:transport)"}
        target = mig["address"] or hostname
        if not target:
            return {"ok": False, "why": "libvirtd did not answer: its TLS listener cannot be tried"}
        uri = migrate.destination_uri(target, transport="tls", pkipath=mig["pkipath"], uri_template=mig["uri_template"])
        with conn.connect(uri, readonly=True, open_timeout=TLS_WAIT):
            return {"ok": True, "why": f"{uri} opened with this host's libvirt client certificate"}
    except (CommandExecutionError, SaltInvocationError) as exc:
        return {"ok": False, "why": f"TLS: {exc}"}


def _engine(engines: Any, cachedir: str) -> Data:
    names = {next(iter(e)) if isinstance(e, dict) and e else e for e in engines or []}
    if not names & set(EVENT_ENGINES):
        return {"ok": None, "why": "the minion config starts no events engine (virt_events)"}
    return readiness.engine_state(cachedir)


def check(uri: str | None, config_get: ConfigGet, engines: Any, cachedir: str) -> Data:
    """``{ready, libvirtd, tls, engine}`` of this hypervisor (``uri``: its libvirt connection; ``engines``: the
    minion config's ``engines``; ``cachedir``: the minion's, where the engine beats). ``ready``: no part says no."""
    up, hostname = _libvirtd(uri)
    parts = {"libvirtd": up, "tls": _tls(config_get, hostname), "engine": _engine(engines, cachedir)}
    return {"ready": all(p["ok"] is not False for p in parts.values()), **parts}
