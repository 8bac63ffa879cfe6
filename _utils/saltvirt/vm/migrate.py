"""Moving a VM to another hypervisor: the hypervisor side of ``virt.migrate``.

On the source hypervisor:

* :func:`source_info`: the VM's disks as the target must prepare them (size, format, backing image),
  and probe files that tell the target whether it sees the same storage;
* :func:`migrate`: one peer-to-peer libvirt call (``migrateToURI3``). The source libvirtd itself
  connects to the target libvirtd (with its own client certificate for TLS), the VM stays defined on
  the target (``PERSIST_DEST``) and is undefined on the source (``UNDEFINE_SOURCE``).

On the target hypervisor:

* :func:`prepare`: for disks it does not share with the source, disk files of the right size and
  format (a qcow2 overlay onto the same backing image when the target has that image, else a full
  copy), after checking that there is room; it never touches an existing file;
* :func:`finish` / :func:`abort_cleanup`: keep / remove exactly what :func:`prepare` created.

The master-side sequence (source_info -> prepare -> migrate -> finish or abort_cleanup) is
:mod:`saltvirt.fleet.relocate`. Settings (minion config only)::

    virt:
      tunnel: False                 # tunnelled migration: memory over the libvirtd TLS connection (16514)
      migration:
        transport: tls              # libvirtd-to-libvirtd connection: tls (default) | tcp (plaintext: only
                                    # when named here or in the call and allowed by allow_cleartext, below)
        pkipath: /etc/pki/libvirt   # dir with cacert.pem, clientcert.pem, clientkey.pem (default: libvirt's)
        uri_template: 'qemu+{transport}://{target}/system'
        qemu_tls_dir: /etc/pki/qemu # QEMU's own TLS for the data stream: on when its files are there
        qemu_tls: True              # always (refused without them) / False: never; unset: when they are there
        allow_cleartext: False      # True: what cannot be encrypted may go in clear (saltvirt.vm.migrate_tls)
        hosts: {hyper2: hv2.example.com}   # names the target may be given as -> its address
        address: hv1.example.com    # this hypervisor's address as a migration target (default: its host name)
        stall_timeout / converge / converge_timeout / max_downtime: progress and convergence
                                    # (saltvirt.vm.migrate_watch)
"""

import contextlib
import json
import os
import secrets
import threading
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, metrics, tools, validate
from saltvirt.base.config import section
from saltvirt.base.salttypes import ConfigGet, Conn, Data
from saltvirt.host import query, snapshot
from saltvirt.host.conn import domain_exists, get_domain, libvirt
from saltvirt.host.query import state_name
from saltvirt.storage import images
from saltvirt.vm import migrate_tls, migrate_watch
from saltvirt.vm.migrate_tls import TRANSPORTS, choose_transport
from saltvirt.xml.domain import definition, edit

PROBE_PREFIX = ".salt-virt-probe-"
RECORD = ".salt-virt-migrate.json"  # <images>/<vm>/: what prepare created, for abort_cleanup
DEFAULT_URI_TEMPLATE = "qemu+{transport}://{target}/system"
SETTINGS = (
    *("transport", "pkipath", "uri_template", "qemu_tls", "qemu_tls_dir", "allow_cleartext"),
    *("hosts", "address", "stall_timeout", "converge", "converge_timeout", "max_downtime"),
)
STALL_TIMEOUT = migrate_watch.STALL_TIMEOUT
COPY_MODES = ("all", "inc")
ROOM_MARGIN_MIB = 16  # plus 1% of the virtual size: image metadata, blocks the guest writes meanwhile


# settings and the libvirt call ------------------------------------------------------------------
def settings(config_get: ConfigGet) -> Data:
    """``virt:tunnel`` and ``virt:migration`` from the minion's config, checked."""
    mig = section(config_get("virt:migration", {}), "virt:migration", SETTINGS)
    out = {k: mig.get(k) for k in SETTINGS}
    out["tunnel"] = validate.to_bool(config_get("virt:tunnel", False))
    out["qemu_tls"] = migrate_tls.setting(out["qemu_tls"])
    out["allow_cleartext"] = validate.to_bool(out["allow_cleartext"])
    out["stall_timeout"] = migrate_watch.stall_bound(out["stall_timeout"])
    out.update(migrate_watch.converge_settings(mig))
    out["hosts"] = out["hosts"] or {}
    if not isinstance(out["hosts"], dict):
        raise SaltInvocationError(f"virt:migration:hosts must map names to addresses, not {out['hosts']!r}")
    return out


def destination_uri(
    target: str,
    tunnel: bool = False,
    transport: str | None = None,
    pkipath: str | None = None,
    uri_template: str | None = None,
) -> str:
    """The URI the *source libvirtd* opens to the target (peer to peer), e.g. ``qemu+tls://hv2/system``."""
    validate.host_name(target, "target (the target hypervisor's host name or address)")
    transport = transport or ("tls" if tunnel else "tcp")
    if transport not in TRANSPORTS:
        raise SaltInvocationError(f"virt:migration:transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    host = f"[{target}]" if ":" in target else target
    try:
        uri = (uri_template or DEFAULT_URI_TEMPLATE).format(transport=transport, target=host)
    except (KeyError, IndexError, ValueError) as exc:
        raise SaltInvocationError(
            f"virt:migration:uri_template {uri_template!r}: {exc} (use {{transport}}, {{target}})"
        ) from None
    if pkipath and transport == "tls":
        uri += ("&" if "?" in uri else "?") + migrate_tls.pkipath_param(pkipath)
    return uri


def data_uri(dest_uri: str) -> str | None:
    """``tcp://<target>``: where QEMU sends the migration stream directly (not through libvirtd)."""
    host = urllib.parse.urlsplit(dest_uri).hostname
    if not host:
        return None
    return f"tcp://[{host}]" if ":" in host else f"tcp://{host}"


def migration_flags(
    active: bool,
    live: bool = True,
    tunnel: bool = False,
    copy_storage: str | None = None,
    unsafe: bool = False,
    qemu_tls: bool = False,
) -> int:
    """libvirt flags: always peer to peer, persistent on the target, undefined on the source."""
    flags = libvirt.VIR_MIGRATE_PEER2PEER | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
    if copy_storage not in (None, *COPY_MODES):
        raise SaltInvocationError(f"copy_storage must be 'all', 'inc' or None, not {copy_storage!r}")
    if active:
        flags |= libvirt.VIR_MIGRATE_LIVE if live else 0
    else:
        if copy_storage:
            raise SaltInvocationError(
                "the VM is not running: libvirt moves a stopped VM's definition only (offline), it cannot copy its "
                "disks. Start it first, or put its disks where the target sees them"
            )
        flags |= libvirt.VIR_MIGRATE_OFFLINE
    if tunnel:
        if copy_storage:
            raise SaltInvocationError(
                "libvirt cannot copy disks through a tunnelled migration: use tunnel=False (the libvirtd connection "
                "stays TLS with transport tls; add virt:migration:qemu_tls to encrypt the data stream too)"
            )
        flags |= libvirt.VIR_MIGRATE_TUNNELLED
    elif qemu_tls and active:
        flags |= libvirt.VIR_MIGRATE_TLS
    flags |= {"all": libvirt.VIR_MIGRATE_NON_SHARED_DISK, "inc": libvirt.VIR_MIGRATE_NON_SHARED_INC}.get(
        copy_storage or "", 0
    )
    if unsafe:
        flags |= libvirt.VIR_MIGRATE_UNSAFE
    return flags


# source side ------------------------------------------------------------------------------------
def _disks(xml):
    """The disks as :func:`saltvirt.xml.domain.definition.parse` reads them, in the shape the target prepares from."""
    return [
        {
            "target": d["target"],
            "type": d["type"],
            "device": d["device"],
            "path": d["file"],
            "format": d["format"],
            "cache": d["cache"],
            # libvirt copies writable disks only; these must already be on the target
            "readonly": d["readonly"] or d["shareable"] or d["device"] in ("cdrom", "floppy"),
        }
        for d in definition.parse(xml)["disks"]
    ]


def source_info(conn: Conn, name: str, images_dir: str, probe: bool = True) -> Data:
    """What the target needs to prepare for ``name``; with ``probe``, a file in each disk directory
    that only a target sharing that storage can see (remove them with :func:`abort_cleanup`)."""
    validate.vm_name(name)
    dom = get_domain(conn, name)
    snapshot.refuse_migration(dom)
    xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    facts = definition.parse(xml)
    disks = _disks(xml)
    for disk in disks:
        if disk["type"] != "file" or not disk["path"] or disk["readonly"]:
            continue
        known = disk["format"] if disk["format"] in images.DISK_FORMATS else None  # never let qemu guess
        info = images.image_info(disk["path"], known)
        disk.update(
            virtual_size=info["virtual_size"],
            format=disk["format"] or info["format"],
            allocation=info["actual_size"] or 0,
            chain_allocation=sum(os.stat(layer).st_blocks * 512 for layer in info["chain"]),
            backing=None,
        )
        if info["backing_file"]:
            base = info["backing_file"]
            disk["backing"] = {
                "path": base,
                "format": info["backing_format"] or images.image_info(base)["format"],
                "size": os.path.getsize(base),
            }
    probes = {}
    if probe:
        for folder in sorted({os.path.dirname(d["path"]) for d in disks if "virtual_size" in d}):
            token = secrets.token_hex(16)
            marker = os.path.join(folder, f"{PROBE_PREFIX}{name}-{token[:8]}")
            try:
                with open(marker, "x", encoding="ascii") as fh:
                    fh.write(token)
            except OSError:
                continue  # unwritable directory: the target will copy these disks
            probes[folder] = {"path": marker, "token": token}
    return {
        "name": name,
        "uuid": dom.UUIDString(),
        "host": conn.getHostname(),
        "state": state_name(dom.state()[0]),
        "active": bool(dom.isActive()),
        "cpu": facts["cpu"],
        "mem": facts["mem"],
        "group": facts["group"],
        "boot_files": [facts["boot"][k] for k in ("kernel", "initrd") if facts["boot"].get(k)],
        "images_dir": images_dir,
        "disks": disks,
        "probes": probes,
    }


def _where(conn, uuid, name):
    """Where the VM is, as the source sees it: for error messages that must tell the truth."""
    try:
        dom = conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError:
        return f"VM {name!r} is no longer defined on {conn.getHostname()}: check the target"
    return f"VM {name!r} is still {state_name(dom.state()[0])} on {conn.getHostname()}"


def _hint(exc, target):
    code, msg = exc.get_error_code(), exc.get_error_message()
    if code == libvirt.VIR_ERR_MIGRATE_UNSAFE:
        return (
            " (if the target sees the same disk files, pass unsafe=True; otherwise copy_storage=all, or use "
            "salt-run virt.migrate, which prepares the target)"
        )
    if "postcopy is not supported" in msg.lower():
        return (
            " (virt:migration:converge postcopy: QEMU cannot use userfaultfd on these hypervisors: an unprivileged "
            "QEMU needs the sysctl vm.unprivileged_userfaultfd = 1 on both; or use converge: auto)"
        )
    if "x509" in msg.lower() or "credentials" in msg.lower():  # QEMU's own TLS (VIR_MIGRATE_TLS)
        return (
            f" (QEMU's migration TLS: both hypervisors need QEMU's certificates, the virt.keys state with qemu: True, "
            f"and {target}'s qemu.conf default_tls_x509_cert_dir pointing at them)"
        )
    if code == libvirt.VIR_ERR_AUTH_FAILED or "certificate" in msg.lower():
        return (
            f" (TLS refused: the source libvirtd's client certificate (virt:migration:pkipath or "
            f"/etc/pki/libvirt) must be signed by the CA {target} trusts, and {target}'s server certificate "
            "by the CA in the source's cacert.pem: see the virt.keys state)"
        )
    if code in (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_RPC, libvirt.VIR_ERR_NO_CONNECT):
        return f" (is libvirtd running on {target} and listening on 16509 (tcp) / 16514 (tls)?)"
    if "socket is closed" in msg or "keepalive" in msg.lower():
        return f" (the connection between the two libvirtds broke: is libvirtd on {target} overloaded or restarting?)"
    if "storage" in msg.lower() or "No such file" in msg:
        return " (the target needs the disk files: salt-run virt.migrate prepares them)"
    return ""


def _target_view(uri, uuid, wait=10.0):
    """(hostname, state) of the VM as the target libvirtd reports it, or None if this minion cannot
    reach the target itself (it is the source libvirtd that migrated, not this process)."""
    found = {}

    def look():
        try:
            tconn = libvirt.openReadOnly(uri)
            try:
                found["view"] = (tconn.getHostname(), state_name(tconn.lookupByUUIDString(uuid).state()[0]))
            finally:
                tconn.close()
        except libvirt.libvirtError:
            pass

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    thread.join(wait)
    return found.get("view")


def migrate(
    conn: Conn,
    name: str,
    target: str,
    live: bool = True,
    tunnel: bool = False,
    copy_storage: str | None = None,
    offline: bool = False,
    max_downtime: Any = None,
    max_bandwidth: Any = None,
    target_uri: str | None = None,
    transport: str | None = None,
    pkipath: str | None = None,
    uri_template: str | None = None,
    qemu_tls: bool | None = None,
    unsafe: bool = False,
    disk_map: dict[str, str] | None = None,
    migrate_disks: Iterable[str] | None = None,
    verify_backing: dict[str, str] | None = None,
    stall_timeout: Any = STALL_TIMEOUT,
    qemu_tls_dir: str | None = None,
    allow_cleartext: bool = False,
    converge: str = "none",
    converge_timeout: float | None = None,
    max_downtime_cap: int | None = None,
) -> Data:
    """Move ``name`` from this libvirtd to ``target``; see ``virt.migrate`` for the arguments. A migration
    that moves no data for ``stall_timeout`` seconds is aborted, one whose memory does not converge within
    ``converge_timeout`` seconds is switched to post-copy (``converge`` postcopy) or aborted
    (:class:`saltvirt.vm.migrate_watch.Watchdog`); ``max_downtime`` stays within ``max_downtime_cap``
    (the operator's, also the default); what it would send in clear is refused unless ``allow_cleartext``
    (:func:`saltvirt.vm.migrate_tls.streams`)."""
    validate.vm_name(name)
    dom = get_domain(conn, name)
    snapshot.refuse_migration(dom)
    source, uuid = conn.getHostname(), dom.UUIDString()
    active = bool(dom.isActive())
    if offline and active:
        raise SaltInvocationError(f"VM {name!r} is running: offline=True moves stopped VMs only (or stop it first)")
    if target == source:
        raise SaltInvocationError(f"VM {name!r} is already on {target}")
    if target_uri:  # Salt's qemu+tls://hv2/system gets the operator's pkipath, as hv2 does
        target_uri = migrate_tls.operator_uri(target_uri, pkipath)  # bad input first, then the TLS files
    else:
        destination_uri(target, tunnel, "tcp", None, uri_template)  # bad input first, then the TLS files
    migration_flags(active, live, tunnel, copy_storage, unsafe)  # bad input first
    qemu_tls, clear = migrate_tls.streams(
        active, tunnel, transport, target_uri, qemu_tls, qemu_tls_dir, allow_cleartext
    )
    flags = migration_flags(active, live, tunnel, copy_storage, unsafe, qemu_tls)
    more, converge, converging = migrate_watch.converge_flags(converge, active, live, tunnel, copy_storage)
    flags |= more
    downtime, adapt = migrate_watch.downtime_plan(max_downtime, max_downtime_cap, active, live)
    for path, want in (verify_backing or {}).items():
        if fsutil.file_digest(path) != want:
            raise CommandExecutionError(
                f"the backing image {path} differs on the target: nothing was migrated, VM {name!r} is still on "
                f"{source}. Use copy_storage=all (full copy) or give the target the same image"
            )
    transport, warnings = choose_transport(transport, pkipath, target_uri)
    warnings += clear + converging
    dest = target_uri or destination_uri(target, tunnel, transport, pkipath, uri_template)
    params: dict[str, Any] = {}
    if not tunnel and data_uri(dest):
        params[libvirt.VIR_MIGRATE_PARAM_URI] = data_uri(dest)
    if disk_map:
        secure = libvirt.VIR_DOMAIN_XML_MIGRATABLE | libvirt.VIR_DOMAIN_XML_SECURE
        if active:
            params[libvirt.VIR_MIGRATE_PARAM_DEST_XML] = edit.move_disks(dom.XMLDesc(secure), disk_map)
        params[libvirt.VIR_MIGRATE_PARAM_PERSIST_XML] = edit.move_disks(
            dom.XMLDesc(secure | libvirt.VIR_DOMAIN_XML_INACTIVE), disk_map
        )
    if migrate_disks and copy_storage:
        params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = list(migrate_disks)
    if max_bandwidth:
        params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = validate.positive_int(max_bandwidth, "max_bandwidth (MiB/s)")
    started = time.monotonic()
    watchdog = migrate_watch.Watchdog(
        dom,
        migrate_watch.stall_bound(stall_timeout),
        converge=converge,
        converge_timeout=converge_timeout,
    )
    mode = "offline" if not active else "live" if live else "paused"
    try:  # the adaptive target only once libvirt took its start (a refused explicit one fails the migration)
        downtime, watchdog.adapt = migrate_watch.set_downtime(dom, downtime, adapt)
        with watchdog:
            dom.migrateToURI3(dest, params, flags)
    except libvirt.libvirtError as exc:
        _measure(mode, "failed", time.monotonic() - started, watchdog.moved)
        why = f"{watchdog.aborted} ({exc.get_error_message()})" if watchdog.aborted else exc.get_error_message()
        raise CommandExecutionError(
            f"migrating VM {name!r} from {source} to {target} failed: {why}{_hint(exc, target)}. "
            f"{_where(conn, uuid, name)}"
        ) from None
    seconds = round(time.monotonic() - started, 3)
    _measure(mode, "ok", seconds, watchdog.moved, dom)
    view = _target_view(dest, uuid)
    ret = {
        "name": name,
        "uuid": uuid,
        "source": source,
        "target": view[0] if view else target,
        "state": view[1] if view else None,
        "verified_on_target": bool(view),
        "target_uri": dest,
        "live": active and bool(live),
        "offline": not active,
        "tunnelled": bool(tunnel),
        "copy_storage": copy_storage,
        "disk_map": dict(disk_map or {}),
        "undefined_on_source": not domain_exists(conn, name),
        "seconds": seconds,
        "transport": transport or urllib.parse.urlsplit(dest).scheme.partition("+")[2] or None,
        "qemu_tls": bool(flags & libvirt.VIR_MIGRATE_TLS),
        "converge": {"mode": converge, "timeout": converge_timeout, "max_downtime_ms": downtime},
    }
    ret["converge"].update(watchdog.adapt.report() if watchdog.adapt else {})
    if watchdog.postcopy_after is not None:
        ret["converge"]["postcopy_after"] = watchdog.postcopy_after
        warnings.append(
            f"not converged within {converge_timeout:g} s: switched to post-copy (virt:migration:converge postcopy)"
        )
    if warnings:
        ret["warnings"] = warnings
    return ret


def _measure(mode, result, seconds, moved, dom=None):
    """A migration's metrics; its bytes: the watchdog's samples or the completed job's stats (if still there)."""
    with contextlib.suppress(libvirt.libvirtError, AttributeError):
        moved = max(moved, int(dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED).get("data_processed", 0)))
    metrics.add("saltvirt.vm.migrations", result=result, mode=mode)
    metrics.record("saltvirt.vm.migration.duration", seconds, result=result, mode=mode)
    if moved:
        metrics.add("saltvirt.vm.migration.bytes", moved, mode=mode)
        if result == "ok" and seconds > 0:
            metrics.record("saltvirt.vm.migration.throughput", moved / seconds, mode=mode)
    metrics.flush()


# target side ------------------------------------------------------------------------------------
def _qemu_img(*args):
    return tools.run(["qemu-img", *args], f"qemu-img {' '.join(args)}", install="qemu-utils").stdout


def map_path(path: str, source_images: str | None, images_dir: str) -> str:
    """Where a source file goes on the target: the same place below the target's ``virt:images``, or
    the same absolute path if it is not below the source's ``virt:images``."""
    if source_images and path.startswith(source_images.rstrip("/") + "/"):
        return validate.inside(images_dir, os.path.relpath(path, source_images))
    return path


def _probe_seen(probe):
    try:
        with open(probe["path"], encoding="ascii") as fh:
            return fh.read() == probe["token"]
    except OSError:
        return False


def _find_backing(backing, source_images, images_dir, roots=()):
    """The target's copy of an overlay's backing image, by size (content is checked by sha256 before
    the migration starts): the same place below this host's virt:images (or the same path, for an image
    outside the source's virt:images), or a base image of the same name this host cached itself
    (``<images>/.bases/<key>-<name>``). Never a file in the source's image store."""
    candidates = [map_path(backing["path"], source_images, images_dir)]
    if "/.bases/" in backing["path"] and "-" in os.path.basename(backing["path"]):
        suffix = "-" + os.path.basename(backing["path"]).split("-", 1)[1]
        bases = os.path.join(images_dir, ".bases")
        with contextlib.suppress(OSError):
            candidates += sorted(e.path for e in os.scandir(bases) if e.name.endswith(suffix) and e.is_file())
    for candidate in dict.fromkeys(candidates):
        if not _within(candidate, roots or (images_dir,)):
            continue  # an overlay here never backs onto a file outside virt:images / virt:allowed_paths
        if os.path.isfile(candidate) and os.path.getsize(candidate) == backing["size"]:
            return candidate
    return None


def _within(path, roots):
    try:
        validate.confined(path, "file", roots)
        return True
    except SaltInvocationError:
        return False


def plan(source: Data, images_dir: str, copy_storage: str | None = None, allowed_paths: Sequence[str] = ()) -> Data:
    """Decide, without touching anything, what :func:`prepare` does with each disk of ``source``:

    * ``shared``: the target uses the source's file in place. Only for a disk that stays at the same path
      (outside ``virt:images``, or both hosts use the same ``virt:images``) and whose probe file the target
      sees: same storage, proven;
    * ``overlay``: a qcow2 onto the target's copy of the backing image; QEMU copies the top layer only
      (copy_storage inc);
    * ``copy``: a blank image of the same size and format that QEMU fills (copy_storage all).

    A disk below the source's ``virt:images`` goes to the same place below the target's ``virt:images``:
    each hypervisor keeps the VMs it runs in its own image store. A file this host would create must
    lie inside its own ``virt:images`` or ``allowed_paths`` (its minion config's ``virt:allowed_paths``):
    what the source lists is not trusted to name paths here."""
    roots = (images_dir, *validate.allowed_paths(allowed_paths))
    if copy_storage not in (None, *COPY_MODES):
        raise SaltInvocationError(f"copy_storage must be 'all', 'inc' or None, not {copy_storage!r}")
    name = validate.vm_name(source["name"])
    for path in source.get("boot_files") or []:
        if not os.path.isfile(path):
            raise CommandExecutionError(
                f"{path} (kernel/initrd of VM {name!r}) is not on the target: put it there first"
            )
    probes = source.get("probes") or {}
    disks = []
    for disk in source["disks"]:
        entry = {"target": disk["target"], "source": disk["path"], "dest": disk["path"], "mode": "shared"}
        disks.append(entry)
        if "virtual_size" not in disk:  # not copied by libvirt: read-only, empty, or not a file
            if disk["path"] and disk["type"] in ("file", "block") and not os.path.exists(disk["path"]):
                kind = "read-only" if disk["readonly"] else disk["type"]
                raise CommandExecutionError(
                    f"disk {disk['target']} ({disk['path']}, {kind}) is not on the target and is not copied: "
                    "put it there first"
                )
            continue
        dest = map_path(disk["path"], source.get("images_dir"), images_dir)
        probe = probes.get(os.path.dirname(disk["path"]))
        if dest == disk["path"] and probe and _probe_seen(probe):
            entry.update(proven=True, cache=disk.get("cache"))
            continue
        validate.confined(dest, f"disk {disk['target']} of VM {name!r} on the target", roots)
        if os.path.lexists(dest):
            raise CommandExecutionError(
                f"{dest} already exists on the target: refusing to overwrite it (remove it if it is a leftover, or "
                "choose another target)"
            )
        entry.update(dest=dest, mode="copy", format=disk["format"], virtual_size=disk["virtual_size"])
        backing = disk.get("backing")
        if backing:
            entry["backing"] = _find_backing(backing, source.get("images_dir"), images_dir, roots)
            entry.update(backing_format=backing["format"], source_backing=backing["path"])
        entry["_sizes"] = (disk["allocation"], min(disk["chain_allocation"], disk["virtual_size"]))
    copies = [d for d in disks if d["mode"] == "copy"]
    backed = [d for d in copies if "source_backing" in d]
    missing = [d["source_backing"] for d in backed if not d["backing"]]
    if copy_storage == "inc" and missing:
        raise CommandExecutionError(
            f"copy_storage=inc needs the backing image(s) {', '.join(missing)} on the target: not found there "
            "(copy_storage=all makes full copies)"
        )
    # one mode for all disks (a libvirt flag): inc only if every overlay's backing image is on the target
    mode = copy_storage or ("inc" if backed and not missing else "all")
    needed = sum(d["virtual_size"] for d in copies) // 100
    for disk in copies:
        top, whole = disk.pop("_sizes")
        if mode == "inc" and disk.get("backing"):
            disk["mode"] = "overlay"
            needed += top
        else:
            if "source_backing" in disk:
                disk["note"] = "full copy: " + (
                    "requested" if copy_storage == "all" else "backing image not on the target"
                )
            needed += whole
    shared = [d for d in disks if d.get("proven")]
    return {
        "name": name,
        "uuid": source["uuid"],
        "disks": disks,
        "copy_storage": mode if copies else None,
        "disk_map": {d["source"]: d["dest"] for d in copies if d["dest"] != d["source"]},
        "migrate_disks": [d["target"] for d in copies],
        "verify_backing": {},
        # storage the probe proved shared that libvirt may not recognise (it only knows network and cluster
        # filesystems): safe to migrate when QEMU bypasses the host page cache
        "unsafe": bool(shared) and all(d["cache"] in ("none", "directsync") for d in shared),
        "needed_mib": (needed // 1048576 + ROOM_MARGIN_MIB) if copies else 0,
    }


def prepare(
    conn: Conn, source: Data, images_dir: str, copy_storage: str | None = None, allowed_paths: Sequence[str] = ()
) -> Data:
    """Create the target's disk files for ``source`` (what :func:`source_info` returned on the source):
    only inside ``images_dir`` / ``allowed_paths``, each created exclusively (O_EXCL, no symlink
    followed) before qemu-img writes it, so a file that appeared after the plan is never overwritten."""
    if not isinstance(source, dict) or not {"name", "uuid", "disks"} <= set(source):
        raise SaltInvocationError("source must be what virt.migrate_source_info returned on the source hypervisor")
    host, name = conn.getHostname(), validate.vm_name(source["name"])
    if domain_exists(conn, name):
        raise CommandExecutionError(f"a VM named {name!r} is already defined on {host}: cannot migrate {name!r} here")
    result = plan(source, images_dir, copy_storage, allowed_paths)
    result.update(host=host, images_dir=images_dir, created=[], free_mib=None)
    if result["needed_mib"]:
        result["free_mib"] = query.host_info(conn, images_dir)["disk_free"]
    if result["needed_mib"] > (result["free_mib"] or 0):
        raise CommandExecutionError(
            f"not enough room on {host} for VM {name!r}: its disks need about {result['needed_mib']} MiB in "
            f"{images_dir}, {result['free_mib']} MiB are free. Nothing was created: free space or choose another target"
        )
    created = result["created"]
    try:
        for disk in result["disks"]:
            if disk["mode"] == "shared":
                continue
            folder = os.path.dirname(disk["dest"])
            if not os.path.isdir(folder):
                if not validate.is_inside(folder, images_dir):
                    raise CommandExecutionError(
                        f"directory {folder} for disk {disk['target']} does not exist on {host}"
                    )
                _makedirs(folder, created)
            args = ["create", "-q", "-f", disk["format"]]
            if disk["mode"] == "overlay":
                args += ["-F", disk["backing_format"], "-b", disk["backing"]]
                result["verify_backing"][disk["source_backing"]] = fsutil.file_digest(disk["backing"])
            images.new_file(disk["dest"], f"disk {disk['target']} of VM {name!r}")  # O_EXCL | O_NOFOLLOW
            created.append(disk["dest"])
            _qemu_img(*args, disk["dest"], str(disk["virtual_size"]))
        if created:
            vm_dir = validate.inside(images_dir, name)
            _makedirs(vm_dir, created)
            disks = [d["dest"] for d in result["disks"] if d["mode"] != "shared"]
            if not os.path.exists(os.path.join(vm_dir, images.MANIFEST)):
                created.append(os.path.join(vm_dir, images.MANIFEST))
            images.record_owned(vm_dir, name, disks, vm_uuid=source["uuid"])  # virt.purge on the target
            with open(os.path.join(vm_dir, RECORD), "x", encoding="utf-8") as fh:
                json.dump({"name": name, "uuid": source["uuid"], "created": created}, fh)
            created.append(os.path.join(vm_dir, RECORD))
    except BaseException:
        fsutil.remove_paths(created)
        raise
    return result


def _makedirs(folder, created):
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        created.append(path)


def _in_use(conn):
    paths: set[str] = set()
    for dom in conn.listAllDomains(0):
        for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
            try:
                paths.update(d["path"] for d in _disks(dom.XMLDesc(flags)) if d["path"])
            except libvirt.libvirtError:
                continue
    return paths


def _record(images_dir, name):
    path = os.path.join(validate.inside(images_dir, name), RECORD)
    try:
        with open(path, encoding="utf-8") as fh:
            return path, json.load(fh)
    except FileNotFoundError:
        return path, None


def abort_cleanup(conn: Conn, name: str, paths: Iterable[str], images_dir: str) -> Data:
    """After a failed migration: remove what :func:`prepare` created on this host (as its record here
    says) and the probe files :func:`source_info` left. Anything else, or a disk a VM here uses, stays."""
    validate.vm_name(name)
    record_path, record = _record(images_dir, name)
    allowed = set((record or {}).get("created") or []) | ({record_path} if record else set())
    busy = _in_use(conn)
    ours, kept = [], []
    for path in paths or []:
        if path in busy:
            kept.append({"path": path, "reason": f"used by a VM on {conn.getHostname()}"})
        elif path in allowed or os.path.basename(path).startswith(f"{PROBE_PREFIX}{name}-"):
            ours.append(path)
        else:
            kept.append({"path": path, "reason": "not created by virt.migrate_prepare for this VM"})
    removed, failed = fsutil.remove_paths(ours)
    return {"name": name, "host": conn.getHostname(), "removed": removed, "kept": kept + failed}


def finish(conn: Conn, name: str, images_dir: str) -> Data:
    """After a successful migration, on the target: the VM as defined here; drop prepare's record."""
    validate.vm_name(name)
    dom = get_domain(conn, name)
    record_path, record = _record(images_dir, name)
    if record is not None:
        os.unlink(record_path)
    return {
        "name": name,
        "host": conn.getHostname(),
        "state": state_name(dom.state()[0]),
        "persistent": bool(dom.isPersistent()),
        "disks": [d["path"] for d in _disks(dom.XMLDesc(0)) if d["path"]],
        "created": [p for p in (record or {}).get("created", []) if p != record_path],
    }
