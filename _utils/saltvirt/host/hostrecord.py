"""The hypervisor side of host-failure recovery (``salt-run virt.recover``, :mod:`saltvirt.fleet.recovery`).

* :func:`record`: what the master keeps about this host while it is up: every domain's inactive XML
  (no passwords: read without ``VIR_DOMAIN_XML_SECURE``), state, size, group, owner, and for each disk which
  storage root (``virt:images`` or a ``virt:allowed_paths`` entry) holds it, with that root's
  *storage marker*: ``<root>/.salt-virt-storage``, a random token written once (``O_EXCL``) by the first
  host that records that root. Another host proves it sees the same storage when it reads the same
  token at the same path (the shared-storage probe of ``virt.migrate``, kept for when the source is
  gone);
* :func:`probe`: can this host open a libvirt connection to a peer's libvirtd? (the "down" check);
* :func:`restart`: define a VM from a down host's recorded XML here and start it, after checking its
  disks are inside this host's own ``virt:images``/``virt:allowed_paths`` and on storage it shares
  with the down host (the markers); on failure the definition it made is removed again.
"""

import contextlib
import errno
import os
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import define, domain_exists, libvirt
from saltvirt.host.query import state_name
from saltvirt.xml.domain import definition

MARKER = ".salt-virt-storage"


def _marker(root):
    """``{path, token}`` of the storage marker in ``root`` (written once), or ``{path, error}``."""
    path = os.path.join(root, MARKER)
    token = secrets.token_hex(16)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(token)
    except FileExistsError:
        pass
    except OSError as exc:
        return {"path": path, "error": f"cannot write the storage marker {path}: {exc.strerror}"}
    return {"path": path, "token": read_marker(path)}


def read_marker(path: str) -> str | None:
    return fsutil.read_text(path, None, "ascii") or None


def _disks(facts, roots, markers):
    out = []
    for d in facts["disks"]:
        entry = {"target": d["target"], "path": d["file"], "type": d["type"], "readonly": d["readonly"]}
        if d["readonly"] or d["device"] in ("cdrom", "floppy"):
            entry["readonly"] = True  # needed on the target, never written: not a sharing question
        elif d["type"] != "file" or not d["file"] or d.get("pool"):
            entry["why"] = f"disk {d['target']} is not a plain file ({d.get('pool') and 'pool volume' or d['type']})"
        else:
            root = validate.root_of(d["file"], roots)
            if root is None:
                entry["why"] = f"disk {d['target']} ({d['file']}) is outside virt:images and virt:allowed_paths"
            else:
                if root not in markers:
                    markers[root] = _marker(root)
                entry["root"] = root
        out.append(entry)
    return out


def record(conn: Conn, images_dir: str, allowed_paths: Iterable[str] = ()) -> Data:
    """This host's domains as :mod:`saltvirt.fleet.recovery` keeps them (see the module doc)."""
    roots = [r for r in (images_dir, *validate.allowed_paths(allowed_paths)) if r and os.path.isdir(r)]
    markers, vms = {}, {}  # type: dict[str, Any], dict[str, Any]
    for dom in conn.listAllDomains(0):
        try:
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            facts = definition.parse(xml)
            state = state_name(dom.state()[0])
            autostart = bool(dom.autostart())
        except libvirt.libvirtError as exc:  # vanished meanwhile, or unreadable: say so, keep the others
            vms[dom.name()] = {"error": exc.get_error_message()}
            continue
        vms[facts["name"]] = {
            "uuid": dom.UUIDString(),
            "state": state,
            "persistent": bool(dom.isPersistent()),
            "autostart": autostart,
            "cpu": facts["cpu"],
            "mem": facts["mem"],
            "group": facts["group"],
            "owner": facts["owner"],  # {tenant, creator} or None: automatic HA trusts a tenant's group only if allowed
            "ha": facts["ha"],  # the VM's ha=True: automatic HA reads it from this record when the host is dead
            "boot_files": [facts["boot"][k] for k in ("kernel", "initrd") if facts["boot"].get(k)],
            "disks": _disks(facts, roots, markers),
            "xml": xml,
        }
    return {"hostname": conn.getHostname(), "images_dir": images_dir, "storage": markers, "vms": vms}


# errno values that mean "nothing answers there" (the host or its libvirtd is down): refused, timed out,
# and no route (a powered-off host on the same link: ARP times out). Anything else (TLS, certificates,
# name resolution, authentication, protocol) is a problem on the checking side and proves nothing.
_DOWN_ERRNO = {errno.ECONNREFUSED: "refused", errno.ETIMEDOUT: "timeout", errno.EHOSTUNREACH: "timeout"}


def _down_reason(exc):
    """``refused``/``timeout`` when a libvirt error says nothing listens at the peer, else None."""
    if exc.get_error_code() != libvirt.VIR_ERR_SYSTEM_ERROR:
        return None
    num = exc.get_int1()
    if num in _DOWN_ERRNO:
        return _DOWN_ERRNO[num]
    # a unix socket (lab, local URIs) whose daemon is gone: connect() says ENOENT for the socket file
    if num == errno.ENOENT and (exc.get_error_message() or "").startswith("Failed to connect socket"):
        return "refused"
    return None


def probe(uri: str, wait: float = 10.0) -> Data:
    """``{uri, reachable, down, error}``: whether a libvirt connection to ``uri`` opens within ``wait`` s.
    ``reachable`` is True (it answered), False only when nothing answers (``down``: ``refused`` or
    ``timeout``), None for any other error (it says nothing about the peer: recovery stops on it)."""
    if not isinstance(uri, str) or "://" not in uri:
        raise SaltInvocationError(f"uri must be a libvirt URI (qemu+tls://host/system), not {uri!r}")
    box = {}

    def attempt():
        try:
            conn = libvirt.openReadOnly(uri)
            try:
                box["hostname"] = conn.getHostname()
            finally:
                conn.close()
        except libvirt.libvirtError as exc:
            box["error"], box["down"] = exc.get_error_message(), _down_reason(exc)

    worker = threading.Thread(target=attempt, name="salt-virt-probe", daemon=True)
    worker.start()
    worker.join(wait)
    if worker.is_alive():
        return {"uri": uri, "reachable": False, "down": "timeout", "error": f"no answer within {wait:g} s"}
    if "hostname" in box:
        return {"uri": uri, "reachable": True, "hostname": box["hostname"]}
    if box.get("down"):
        return {"uri": uri, "reachable": False, "down": box["down"], "error": box.get("error")}
    return {"uri": uri, "reachable": None, "error": box.get("error")}


def where(conn: Conn, name: str, uuid: str | None = None) -> list[Data]:
    """The domains here named ``name`` or with UUID ``uuid``: ``[{name, uuid, state, autostart}]``
    (recovery's last look, under the VM's lock, before it starts a copy anywhere)."""
    validate.vm_name(name)
    out = []
    for dom in conn.listAllDomains(0):
        try:
            if dom.name() != name and (not uuid or dom.UUIDString() != uuid):
                continue
            out.append(
                {
                    "name": dom.name(),
                    "uuid": dom.UUIDString(),
                    "state": state_name(dom.state()[0]),
                    "autostart": bool(dom.autostart()),
                }
            )
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:  # gone meanwhile: not here any more
                raise CommandExecutionError(f"cannot read domain {dom.name()}: {exc.get_error_message()}") from None
    return out


def disarm(conn: Conn, names: Iterable[str]) -> dict[str, bool]:
    """Turn autostart off for those of ``names`` defined here (a host back from fencing must not start
    again what runs elsewhere now): ``{name: was autostart on}``."""
    out: dict[str, bool] = {}
    for name in names:
        validate.vm_name(name)
        try:
            dom = conn.lookupByName(name)
            out[name] = bool(dom.autostart())
            if out[name]:
                dom.setAutostart(0)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                error = exc.get_error_message()
                raise CommandExecutionError(f"cannot turn autostart off for {name}: {error}") from None
    return out


def check(facts: Data, storage: Mapping[str, Any], roots: Sequence[str]) -> list[str]:
    """Why this host cannot run a VM with these disks (parsed XML facts), or [] (pure, file reads only).
    ``storage``: the down host's markers ``{root: {path, token}}``; ``roots``: this host's own."""
    reasons = []
    for d in facts["disks"]:
        path = d["file"]
        if not path:
            continue
        if d["type"] != "file" or d.get("pool"):
            reasons.append(f"disk {d['target']}: not a plain file")
            continue
        try:
            validate.confined(path, f"disk {d['target']}", roots)
        except SaltInvocationError as exc:
            reasons.append(str(exc))
            continue
        if d["readonly"] or d["device"] in ("cdrom", "floppy"):
            if not os.path.exists(path):
                reasons.append(f"disk {d['target']} ({path}) is not on this host")
            continue
        root = validate.root_of(path, list(storage))
        mark = storage.get(root) if root else None
        if not mark or not mark.get("token"):
            reasons.append(f"disk {d['target']} ({path}): no storage marker recorded for its directory")
        elif read_marker(mark["path"]) != mark["token"]:
            reasons.append(
                f"disk {d['target']} ({path}): this host does not see the down host's storage there "
                f"({mark['path']} missing or different): not shared"
            )
        elif not os.path.exists(path):
            reasons.append(f"disk {d['target']} ({path}) is missing")
    for path in (facts["boot"].get(k) for k in ("kernel", "initrd")):
        if not path:
            continue
        try:
            validate.confined(path, "kernel/initrd", roots)
        except SaltInvocationError as exc:
            reasons.append(str(exc))
            continue
        if not os.path.isfile(path):
            reasons.append(f"{path} (kernel/initrd) is not on this host")
    return reasons


def check_all(
    vms: Mapping[str, str], storage: Mapping[str, Any], images_dir: str, allowed_paths: Iterable[str] = ()
) -> dict[str, list[str]]:
    """``{name: [reasons]}`` for ``vms`` (``{name: recorded xml}``): why this host cannot run each one
    (empty list: it can)."""
    if not isinstance(vms, dict) or not isinstance(storage or {}, dict):
        raise SaltInvocationError("vms must map VM names to their recorded XML, storage the recorded markers")
    roots = [images_dir, *validate.allowed_paths(allowed_paths)]
    out = {}
    for name, xml in sorted(vms.items()):
        try:
            out[name] = check(definition.parse(xml), storage or {}, roots)
        except Exception as exc:  # noqa: BLE001 - a definition that does not parse cannot run here either
            out[name] = [f"the recorded definition does not parse: {exc}"]
    return out


def restart(
    conn: Conn,
    name: str,
    xml: str,
    storage: Mapping[str, Any],
    images_dir: str,
    allowed_paths: Iterable[str] = (),
    start: bool = True,
) -> Data:
    """Define ``name`` from ``xml`` (a down host's recorded definition) here and start it (see the module
    doc). Refused when a VM of that name or UUID is defined here or a disk cannot be proven shared."""
    validate.vm_name(name)
    try:
        facts = definition.parse(xml)
    except Exception as exc:  # noqa: BLE001 - ParseError and friends: bad input
        raise SaltInvocationError(f"xml: the recorded definition of {name!r} does not parse: {exc}") from None
    if facts["name"] != name:
        raise SaltInvocationError(f"xml defines {facts['name']!r}, not {name!r}")
    host = conn.getHostname()
    if domain_exists(conn, name):
        raise CommandExecutionError(f"a VM named {name!r} is already defined on {host}: not restarting it here")
    if facts["uuid"]:
        with contextlib.suppress(libvirt.libvirtError):
            other = conn.lookupByUUIDString(facts["uuid"])
            raise CommandExecutionError(f"VM {other.name()!r} on {host} has the UUID of {name!r}: not restarting it")
    roots = [images_dir, *validate.allowed_paths(allowed_paths)]
    reasons = check(facts, storage or {}, roots)
    if reasons:
        raise CommandExecutionError(f"cannot restart {name!r} on {host}: " + "; ".join(reasons))
    try:
        dom = define(conn, "domain", xml)
    except libvirt.libvirtError as exc:
        raise CommandExecutionError(f"defining {name!r} on {host} failed: {exc.get_error_message()}") from None
    if start:
        try:
            dom.create()
        except libvirt.libvirtError as exc:
            error = exc.get_error_message()
            with contextlib.suppress(libvirt.libvirtError):
                dom.undefine()  # we defined it a moment ago: nothing else is lost
            raise CommandExecutionError(
                f"starting {name!r} on {host} failed: {error}. Its definition here was removed again"
            ) from None
    return {"name": name, "host": host, "uuid": dom.UUIDString(), "state": state_name(dom.state()[0])}
