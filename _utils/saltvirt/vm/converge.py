"""Desired vs current for a VM: the spec ``virt.init`` would build, the diff against what libvirt has,
what applies live and what waits for a restart, and applying it. Used by ``virt.update`` and so by the
``virt.running`` / ``virt.defined`` states.

The desired shape is built by :func:`desired_spec`: :func:`saltvirt.model.vmspec.build` from the same request
``virt.init`` builds it from (:class:`saltvirt.model.vmargs.InitRequest`), so a state and ``virt.init`` never disagree.
Device XML comes from :mod:`saltvirt.xml.domain.devices`' builders as well (the ones ``virt.init`` uses).

Applying: vCPUs and memory through libvirt's setters, devices and graphics by one redefinition of the
persistent definition; then, if the VM runs, the same changes live where the hypervisor can (vCPUs up
to the boot maximum, memory up to the boot maximum, NIC/disk hotplug, NIC source change). Everything
else is reported as needing a restart. Disks are never removed: a disk the spec does not list is
reported under ``not_in_spec`` and left alone.
"""

import contextlib
import dataclasses
import os
from collections.abc import Collection, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, validate
from saltvirt.base.salttypes import Conn, Data, Domain
from saltvirt.host.conn import define, get_domain, libvirt, lv_errors
from saltvirt.model import vmargs, vmspec
from saltvirt.storage import images, volumes
from saltvirt.vm import resolve
from saltvirt.xml.domain import definition, devices, edit, metadata

FIELDS = ("cpu", "mem", "nics", "disks", "graphics", "ha") + definition.FEATURES
# which init arguments put which field under management (virt.update only manages what it is given)
MANAGED_BY: dict[str, tuple[str, ...]] = {
    "nics": ("nic", "interfaces"),
    "disks": ("disk", "disks"),
    "graphics": ("enable_vnc", "graphics"),
}
# firmware, boot order, on_reboot, extra serials/consoles, vTPM: in the definition, live at the next start
MANAGED_BY.update(
    {f: (f,) for f in definition.FEATURES}, firmware=("boot",), cpu_model=(), memtune=(), vcpu=(), cputune=()
)
MANAGED_BY.update(kernel_boot=("boot",))
# the keys of ``boot`` that put a part of it under management (``boot: {kernel: null}`` leaves the firmware alone)
BOOT_PARTS = {"kernel_boot": ("kernel", "initrd", "cmdline"), "firmware": ("efi", "loader", "nvram", "secure_boot")}
MANAGED_BY.update(max_mem=(), memory_backing=(), ha=("ha",))
DICT_FIELDS = {"cpu": ("cpu_model", "vcpu", "cputune"), "mem": ("memtune", "max_mem", "memory_backing")}


# desired ------------------------------------------------------------------------------------------
def desired_spec(
    req: vmargs.InitRequest,
    *,
    images_dir: str,
    profiles: Data | None,
    vtype: str = "qemu",
    image: str | None = None,
    image_format: str | None = None,
    allowed_paths: Sequence[str] = (),
) -> vmspec.VMSpec:
    """The :class:`VMSpec` ``virt.init`` builds from the same request: of ``req``, what shapes the domain
    (:func:`saltvirt.model.vmargs.shaping`; the rest at its defaults), on a host of domain type ``vtype``, with
    the disks cloned from ``image``. ``allowed_paths``: the operator's ``virt:allowed_paths`` (minion config
    only). ``cloud_init`` only shapes a new VM (its seed CD-ROM is gone from the definition once the VM started)."""
    return vmspec.build(
        dataclasses.replace(vmargs.shaping(req), vtype=vtype, image=image),
        image_format=image_format,
        images_dir=images_dir,
        profiles=profiles,
        allowed_paths=allowed_paths,
    )


def preview(
    req: vmargs.InitRequest,
    *,
    images_dir: str,
    profiles: Data | None,
    image_format: str | None = None,
    allowed_paths: Sequence[str] = (),
) -> Data:
    """What ``virt.init`` will create from ``req`` (the state's ``created`` change). With an image whose
    format is not known yet (not fetched), disks cloned from it say "as the image"."""
    image = req.image
    spec = desired_spec(
        req,
        images_dir=images_dir,
        profiles=profiles,
        image=image,
        image_format=image_format or "qcow2",
        allowed_paths=allowed_paths,
    )
    unknown = set()
    if image and not image_format:
        other = desired_spec(
            req, images_dir=images_dir, profiles=profiles, image=image, image_format="raw", allowed_paths=allowed_paths
        )
        unknown = {a.name for a, b in zip(spec.disks, other.disks, strict=True) if a.format != b.format}
    disks = {}
    for d in spec.disks:
        entry = {"name": d.name, "path": d.path, "format": d.format, "size": d.size, "overlay": d.overlay}
        if d.pool:  # a pool volume: its format/partition name follow the pool (None here: as the pool decides)
            entry.update(pool=d.pool, volume=d.volume)
        if d.name in unknown:
            entry.update(path=os.path.join(spec.vm_dir or "", f"{d.name}.<image format>"), format="as the image")
        if d.image:
            entry["image"] = d.image
        if d.attach:
            entry["attach"] = True
        if d is vmspec.cidata_disk(spec):
            entry.update(device="cdrom", cloud_init="seed volume, detached from the definition once started")
        disks[d.target] = entry
    out = {
        "cpu": spec.cpu,
        "mem": spec.mem,
        "image": validate.shown_url(image),
        "disks": disks,
        "nics": [{k: v for k, v in _nic_summary(n).items() if v is not None} for n in spec.nics],
        "graphics": _gfx_summary(spec.graphics),
    }
    if spec.group:
        out["group"] = spec.group
    if spec.ha:
        out["ha"] = True
    return out


# current ------------------------------------------------------------------------------------------
def current(dom: Domain) -> Data:
    """{'config': facts of the persistent definition, 'live': facts of the running VM (or None)}."""
    secure = getattr(libvirt, "VIR_DOMAIN_XML_SECURE", 0)
    with lv_errors(f"read the definition of VM {dom.name()!r}"):
        config = definition.parse_for_compare(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | secure))
        live = definition.parse_for_compare(dom.XMLDesc(secure)) if dom.isActive() else None
    return {"config": config, "live": live}


# diff ---------------------------------------------------------------------------------------------
def _mac(nic):
    return (nic.get("mac") or "").lower()


def _nic_summary(nic):
    if isinstance(nic, vmspec.Nic):
        return {"type": nic.type, "source": nic.source, "model": nic.model, "mac": nic.mac.lower() if nic.mac else None}
    return {"type": nic["type"], "source": nic["source"], "model": nic["model"], "mac": _mac(nic) or None}


def _gfx_summary(g):
    """graphics without the password (only whether there is one); None when the VM has none."""
    if g is None:
        return None
    if isinstance(g, vmspec.Graphics):
        return {"type": g.type, "listen": g.listen, "port": g.port, "password": bool(g.password)}
    port = -1 if g.get("autoport") else g["port"]
    return {"type": g["type"], "listen": g["listen"], "port": port, "password": bool(g.get("passwd"))}


def _same_nic(want, have):
    return (want.type, want.source, want.model) == (have["type"], have["source"], have["model"]) and (
        not want.mac or want.mac.lower() == _mac(have)
    )


def _cpu_mem(facts):
    cpu = facts["cpu"] if facts["vcpu_current"] == facts["cpu"] else f"{facts['vcpu_current']} (maximum {facts['cpu']})"
    mem = facts["mem"] if facts["current_mem"] == facts["mem"] else f"{facts['current_mem']} (maximum {facts['mem']})"
    return cpu, mem


def _diff_nics(desired, have):
    have = list(have)
    unmatched = []
    for nic in desired.nics:
        hit = next((h for h in have if _same_nic(nic, h)), None)
        if hit is None:
            unmatched.append(nic)
        else:
            have.remove(hit)
    claimed = {n.mac.lower() for n in unmatched if n.mac}
    added, changed = [], []
    for nic in unmatched:  # same MAC, or the next NIC nobody claims: changed in place (the guest keeps its MAC)
        if nic.mac:
            old = next((h for h in have if _mac(h) == nic.mac.lower()), None)
        else:
            old = next((h for h in have if _mac(h) not in claimed), None)
        if old is None:
            added.append({k: v for k, v in _nic_summary(nic).items() if v is not None})
        else:
            have.remove(old)
            new = {k: v for k, v in _nic_summary(nic).items() if k != "mac"}
            changed.append({"mac": _mac(old), "old": {k: old[k] for k in new}, "new": new})
    out = {"added": added, "removed": [_nic_summary(h) for h in have], "changed": changed}
    return {k: v for k, v in out.items() if v}


def _diff_cpu_mem(desired, cfg, manage):
    """vCPUs (maximum, and cpu:current online at start) and memory (boot, and mem:current) vs the definition."""
    changes = {}
    old_cpu, old_mem = _cpu_mem(cfg)
    want_cpu = (desired.vcpu or {}).get("current", desired.cpu)
    if "cpu" in manage and (cfg["cpu"], cfg["vcpu_current"]) != (desired.cpu, want_cpu):
        changes["cpu"] = {"old": old_cpu, "new": desired.cpu}
        if want_cpu != desired.cpu:
            changes["cpu"].update(new=f"{want_cpu} (maximum {desired.cpu})", current=want_cpu)
    want_mem = desired.mem_current or desired.mem
    if "mem" in manage and (cfg["mem"], cfg["current_mem"]) != (desired.mem, want_mem):
        changes["mem"] = {"old": old_mem, "new": desired.mem}
        if want_mem != desired.mem:
            changes["mem"].update(new=f"{want_mem} (maximum {desired.mem})", current=want_mem)
    return changes


def diff(desired: vmspec.VMSpec, current_facts: Data, manage: Sequence[str] = FIELDS) -> Data:
    """{field: change} for every managed field where the persistent definition differs from
    ``desired``. Raises SaltInvocationError for what cannot be done to an existing VM (a new disk that
    would be cloned from an image)."""
    cfg = current_facts["config"]
    changes = _diff_cpu_mem(desired, cfg, manage)
    if "graphics" in manage:
        have = cfg["graphics"][0] if cfg["graphics"] else None
        gfx = desired.graphics
        if gfx and not gfx.password and have and have.get("passwd"):
            gfx = dataclasses.replace(gfx, password=have["passwd"])  # no password given: the VM keeps its own
        want, was = _gfx_summary(gfx), _gfx_summary(have)
        if want != was:
            changes["graphics"] = {"old": was, "new": want}
        elif want and want["password"] and gfx and have and gfx.password != have.get("passwd"):
            changes["graphics"] = {"old": was, "new": want, "password": "changed"}
    if "nics" in manage:
        nics = _diff_nics(desired, cfg["nics"])
        if nics:
            changes["nics"] = nics
    if "disks" in manage:
        have = {d["target"] for d in cfg["disks"]}
        added = []
        for d in desired.disks:
            if d.target in have:
                continue
            if d.image:
                raise SaltInvocationError(
                    f"disk {d.name} ({d.target}) would be cloned from an image, which only happens when the VM is "
                    f"created: give it a size (a blank disk) or a path (an existing file) to add it to {desired.name}"
                )
            added.append(
                {
                    "name": d.name,
                    "target": d.target,
                    "path": d.path,
                    "format": d.format,
                    "size": d.size,
                    "bus": d.bus,
                    "device": d.device,
                    "attach": d.attach,
                    **({"pool": d.pool, "volume": d.volume} if d.pool else {}),
                }
            )
        unlisted = sorted(t for t in have if t not in {d.target for d in desired.disks})
        if added or unlisted:
            changes["disks"] = {k: v for k, v in (("added", added), ("not_in_spec", unlisted)) if v}
    if "ha" in manage and desired.ha != cfg["ha"]:
        changes["ha"] = {"old": cfg["ha"], "new": desired.ha}
    changes.update(_diff_features(desired, cfg, manage))
    return changes


def _diff_features(desired, cfg, manage):
    """Firmware, boot order, on_reboot, extra serials/consoles, vTPM: as virt.init writes them vs the definition."""
    want = definition.feature_facts(definition.build(desired))
    return {
        f: {"old": cfg["features"][f], "new": want[f]}
        for f in definition.FEATURES
        if f in manage and want[f] != cfg["features"][f]
    }


def actionable(changes: Data) -> Data:
    """The changes that make the VM different (``disks.not_in_spec`` alone is only a report)."""
    out = {k: v for k, v in changes.items() if k != "disks"}
    if changes.get("disks", {}).get("added"):
        out["disks"] = changes["disks"]
    return out


# describing and predicting ------------------------------------------------------------------------
def _nic_text(nic):
    return f"{nic['type']} {nic['source']} ({nic['model']})"


def steps(changes: Data) -> list[tuple[str, Any, str]]:
    """[(kind, item, description)] for every actionable change, in the order :func:`apply` works."""
    out = []
    if "cpu" in changes:
        out.append(("cpu", changes["cpu"], f"cpu {changes['cpu']['old']} -> {changes['cpu']['new']}"))
    if "mem" in changes:
        out.append(("mem", changes["mem"], f"mem {changes['mem']['old']} -> {changes['mem']['new']} MiB"))
    if "graphics" in changes:
        g = changes["graphics"]
        text = lambda s: f"{s['type']} on {s['listen']}" if s else "none"  # noqa: E731
        desc = "graphics password" if g.get("password") else f"graphics {text(g['old'])} -> {text(g['new'])}"
        out.append(("graphics", g, desc))
    nics = changes.get("nics", {})
    for nic in nics.get("removed", []):
        out.append(("nic_removed", nic, f"NIC {nic['mac']} on {_nic_text(nic)} removed"))
    for nic in nics.get("changed", []):
        out.append(("nic_changed", nic, f"NIC {nic['mac']} {_nic_text(nic['old'])} -> {_nic_text(nic['new'])}"))
    for nic in nics.get("added", []):
        out.append(("nic_added", nic, f"NIC on {_nic_text(nic)} added"))
    for disk in changes.get("disks", {}).get("added", []):
        what = f"{disk['path']} attached" if disk["attach"] else f"{disk['size']} MiB {disk['format']}"
        if disk.get("pool"):
            vol = f"volume {disk['pool']}/{disk['volume']}"
            what = f"{vol} attached" if disk["attach"] else f"{disk['size']} MiB {vol}"
        out.append(("disk_added", disk, f"disk {disk['target']} ({what}) added"))
    for f in ("ha", *definition.FEATURES):
        if f in changes:
            out.append((f, changes[f], f"{f} {changes[f]['old']} -> {changes[f]['new']}"))
    return out


def _live_ok(kind, item, live):
    """Whether the running VM can take this change without a restart (what :func:`apply` will try)."""
    if kind == "cpu":
        return item.get("current", item["new"]) <= live["cpu"]
    if kind == "mem":
        return item.get("current", item["new"]) <= live["mem"]
    if kind == "nic_changed":
        old, new = item["old"], item["new"]
        return old["type"] == new["type"] and old["model"] == new["model"] and new["type"] in ("bridge", "network")
    return kind in ("nic_added", "nic_removed", "disk_added", "ha")


def plan(changes: Data, current_facts: Data, live_update: bool = True) -> dict[str, list[str]]:
    """Predicted outcome: {'live': [...], 'restart': [...], 'definition': [...]} (``definition``:
    the VM is not running, the change takes effect when it starts). ``live_update=False`` (Salt's
    ``live=False``): a running VM gets nothing live, every change waits for its restart."""
    out: dict[str, list[str]] = {"live": [], "restart": [], "definition": []}
    live = current_facts["live"]
    for kind, item, desc in steps(actionable(changes)):
        if live is None:
            out["definition"].append(desc)
        elif not live_update:
            out["restart"].append(f"{desc} (live=False)")
        else:
            out["live" if _live_ok(kind, item, live) else "restart"].append(desc)
    return out


def pending_restart(current_facts: Data) -> list[str]:
    """Fields where the running VM still differs from its definition (applied, waiting for a restart)."""
    cfg, live = current_facts["config"], current_facts["live"]
    if live is None:
        return []
    out = []
    # what the running VM has is its current vCPUs / memory; its maximum stays the one it started with, so
    # a lowered maximum whose current value went live is not pending (a raised one is: it needs the restart)
    if cfg["vcpu_current"] != live["vcpu_current"] or cfg["cpu"] > live["cpu"]:
        out.append("cpu")
    if cfg["current_mem"] != live["current_mem"] or cfg["mem"] > live["mem"]:
        out.append("mem")
    gfx = [[(g["type"], g["listen"]) for g in f["graphics"]] for f in (cfg, live)]
    if gfx[0] != gfx[1]:
        out.append("graphics")
    nics = [sorted((_mac(n), n["type"], n["source"], n["model"]) for n in f["nics"]) for f in (cfg, live)]
    if nics[0] != nics[1]:
        out.append("nics")
    if {d["target"] for d in cfg["disks"]} != {d["target"] for d in live["disks"]}:
        out.append("disks")
    if cfg["ha"] != live["ha"]:
        out.append("ha")
    # a running VM's firmware (the autoselected OVMF) and CPU (its expanded features) are filled in by
    # libvirt at start: only the definition tells what was asked for, so they are not compared here
    out.extend(
        f
        for f in definition.FEATURES
        if f not in ("firmware", "cpu_model") and cfg["features"][f] != live["features"][f]
    )
    return out


# applying -----------------------------------------------------------------------------------------
def _nic(summary, mac=None):
    return vmspec.Nic(
        name="nic",
        type=summary["type"],
        source=summary["source"],
        model=summary["model"],
        mac=mac or summary.get("mac"),
    )


def _redefine(conn, dom, desired, changes, created):
    """Write the device and graphics changes into the persistent definition (one define)."""
    secure = getattr(libvirt, "VIR_DOMAIN_XML_SECURE", 0)
    nics = changes.get("nics", {})
    added = {a["target"] for a in changes.get("disks", {}).get("added", [])}
    xml, kept = edit.edit_devices(
        dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | secure),
        graphics_spec=desired.graphics if "graphics" in changes else False,
        remove_macs=[nic["mac"] for nic in nics.get("removed", [])],
        change_nics=[_nic(nic["new"], mac=nic["mac"]) for nic in nics.get("changed", [])],
        add_nics=[_nic(nic) for nic in nics.get("added", [])],
        add_disks=[d for d in desired.disks if d.target in added],
    )
    with lv_errors(f"redefine VM {desired.name!r}"):
        dom = define(conn, "domain", xml)
    new_xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    created["nics"] = edit.new_interfaces(new_xml, kept)
    created["disks"] = edit.disks_by_target(new_xml)
    return dom


def _redefine_features(conn, dom, desired, fields):
    """Firmware, boot order, on_reboot, extra serials/consoles and the vTPM into the persistent
    definition, as :func:`saltvirt.xml.domain.definition.build` writes them for the desired spec."""
    secure = getattr(libvirt, "VIR_DOMAIN_XML_SECURE", 0)
    try:
        xml = definition.replace_features(
            dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | secure), definition.build(desired), fields
        )
    except ValueError as exc:
        raise SaltInvocationError(f"cannot update VM {desired.name!r}: {exc}; recreate it to change that") from None
    with lv_errors(f"redefine VM {desired.name!r}"):
        return define(conn, "domain", xml)


def _make_disks(desired, changes, uuid, conn=None, operator=None):
    """Create the blank disk files and pool volumes the changes add (all checked first); returns their
    paths (volumes: what volumes.create returned)."""
    added = changes.get("disks", {}).get("added", [])
    targets = {d["target"] for d in added}
    pool_disks = [d for d in desired.disks if d.pool and d.target in targets]  # resolved by resolve.pool_volumes
    for disk in added:
        if disk.get("pool") or disk["attach"]:  # attached ones passed attach.admit in update()
            continue
        if disk["device"] == "disk" and os.path.lexists(disk["path"]):
            raise SaltInvocationError(
                f"disk file {disk['path']} already exists and this VM does not use it: refusing to take it over. "
                f"Remove it yourself, or give the disk path: {disk['path']} without a size to attach it"
            )
    made = []
    try:
        for vol in pool_disks:
            if not vol.attach:
                os.makedirs(desired.vm_dir, mode=0o755, exist_ok=True)
                made.append(volumes.create(conn, vol))
                volumes.record(desired.vm_dir, desired.name, made[-1], uuid)
        for disk in added:
            if disk["attach"] or disk["device"] != "disk" or disk.get("pool"):
                continue
            os.makedirs(desired.vm_dir, mode=0o755, exist_ok=True)
            images.create_disk(disk["path"], disk["size"], fmt=disk["format"])
            made.append(disk["path"])
            images.record_owned(desired.vm_dir, desired.name, [disk["path"]], uuid)
    except BaseException:
        _remove(made, conn)
        raise
    return made


def _remove(paths, conn=None):
    for path in paths:
        if isinstance(path, dict):  # a volume made by volumes.create
            with contextlib.suppress(CommandExecutionError):
                volumes.delete(conn, path)
    fsutil.remove_paths([p for p in paths if not isinstance(p, dict)])


class _NotLive(Exception):  # noqa: N818 - a signal to fall back to the definition, not an error
    """The running VM cannot take this change: it applies at the next start."""


def _set_ha(dom, on, flag):
    """The HA flag into salt-virt's <metadata> of the definition (``flag`` AFFECT_CONFIG) or the running VM
    (AFFECT_LIVE): libvirt replaces our element as :func:`saltvirt.xml.domain.metadata.with_ha` makes it."""
    inactive = libvirt.VIR_DOMAIN_XML_INACTIVE if flag == libvirt.VIR_DOMAIN_AFFECT_CONFIG else 0
    meta = metadata.with_ha(dom.XMLDesc(inactive), on)
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, meta, "saltvirt", metadata.METADATA_NS, flag)


def _live(dom, kind, item, created):
    """Apply one change to the running VM; raises libvirt.libvirtError when the hypervisor refuses."""
    live_flag = libvirt.VIR_DOMAIN_AFFECT_LIVE
    if kind == "ha":
        _set_ha(dom, item["new"], live_flag)
    elif kind == "cpu":
        dom.setVcpusFlags(item.get("current", item["new"]), live_flag)
    elif kind == "mem":
        size = item.get("current", item["new"]) * 1024
        if size > dom.maxMemory():
            raise _NotLive("above the running VM's maximum memory")
        dom.setMemoryFlags(size, live_flag)
    elif kind == "graphics":
        raise _NotLive("graphics change at the next start")
    elif kind in definition.FEATURES:
        raise _NotLive("needs restart")
    elif kind in ("nic_removed", "nic_changed"):
        el = edit.interface_by_mac(dom.XMLDesc(0), item["mac"])
        if el is None:
            return
        if kind == "nic_removed":
            dom.detachDeviceFlags(edit.device_xml(el), live_flag)
            if edit.interface_by_mac(dom.XMLDesc(0), item["mac"]) is not None:
                raise _NotLive("the guest has not released it yet")
        else:
            if not _live_ok(kind, item, None):
                raise _NotLive("type or model change")
            new = devices.interface(_nic(item["new"], mac=item["mac"]))
            dom.updateDeviceFlags(edit.device_xml(new), live_flag)
    elif kind == "nic_added":
        dom.attachDeviceFlags(edit.device_xml(created["nics"].pop(0), strip_address=True), live_flag)
    elif kind == "disk_added":
        dom.attachDeviceFlags(edit.device_xml(created["disks"][item["target"]], strip_address=True), live_flag)


def apply(
    conn: Conn,
    dom: Domain,
    desired: vmspec.VMSpec,
    changes: Data,
    live_update: bool = True,
    operator: Data | None = None,
) -> dict[str, list[str]]:
    """Apply actionable ``changes`` (from :func:`diff`) to the definition and, if the VM runs (and
    ``live_update``), live. ``operator``: as for :func:`update`. Returns what happened: {'live': [...],
    'restart': [...], 'definition': [...]}."""
    changes = actionable(changes)
    report: dict[str, list[str]] = {"live": [], "restart": [], "definition": []}
    running = bool(dom.isActive())
    cfg = libvirt.VIR_DOMAIN_AFFECT_CONFIG
    with lv_errors(f"update VM {desired.name!r}"):
        if "cpu" in changes:
            dom.setVcpusFlags(desired.cpu, cfg | libvirt.VIR_DOMAIN_VCPU_MAXIMUM)
            dom.setVcpusFlags(changes["cpu"].get("current", desired.cpu), cfg)
        if "mem" in changes:
            dom.setMemoryFlags(desired.mem * 1024, cfg | libvirt.VIR_DOMAIN_MEM_MAXIMUM)
            dom.setMemoryFlags(changes["mem"].get("current", desired.mem) * 1024, cfg)
        if "ha" in changes:
            _set_ha(dom, desired.ha, cfg)
    feats = [f for f in definition.FEATURES if f in changes]
    if feats:
        dom = _redefine_features(conn, dom, desired, feats)
    created: Data = {"nics": [], "disks": {}}
    if set(changes) & {"graphics", "nics", "disks"}:
        targets = {d["target"] for d in changes.get("disks", {}).get("added", [])}
        desired = resolve.pool_volumes(conn, desired, targets, operator)  # pool allowed and running, none taken over
        made = _make_disks(desired, changes, dom.UUIDString(), conn, operator)
        try:
            dom = _redefine(conn, dom, desired, changes, created)
        except CommandExecutionError:
            _remove(made, conn)
            raise
    for kind, item, desc in steps(changes):
        if not running:
            report["definition"].append(desc)
            continue
        if not live_update:
            report["restart"].append(f"{desc} (live=False)")
            continue
        try:
            _live(dom, kind, item, created)
            report["live"].append(desc)
        except _NotLive as exc:
            report["restart"].append(desc if kind == "graphics" else f"{desc} ({exc})")
        except libvirt.libvirtError as exc:
            report["restart"].append(f"{desc} ({exc.get_error_message()})")
    return report


def _managed(req, given):
    """The fields a call names: an argument ``given`` and not None (Salt's "not given"); of ``boot``, only
    the parts whose keys it has (``boot: {}``: all of them, back to the default)."""
    given = {k for k in given if getattr(req, k) is not None}
    boot = req.boot if "boot" in given else None
    return [
        f
        for f in FIELDS
        if {"cpu": req.cpu, "mem": req.mem}.get(f) is not None
        or (
            any(k in given for k in MANAGED_BY.get(f, ()))
            and not (f in BOOT_PARTS and isinstance(boot, dict) and boot and not set(boot) & set(BOOT_PARTS[f]))
        )
    ]


def update(
    conn: Conn,
    req: vmargs.InitRequest,
    given: Collection[str],
    *,
    images_dir: str,
    profiles: Data | None,
    test: bool = False,
    allowed_paths: Sequence[str] = (),
    live: bool = True,
    operator: Data | None = None,
) -> Data:
    """``virt.update``: diff the VM against the spec ``virt.init`` would build from the same arguments
    and, unless ``test``, apply it. Only what is given is managed: cpu, mem, NICs (nic/interfaces),
    disks (disk/disks), graphics (enable_vnc/graphics), the HA flag (ha: its <metadata>, live too).
    ``live=False`` (Salt's): only the definition changes, a running VM takes it at its next start.
    ``req``/``given``: :func:`saltvirt.model.vmargs.update_request` (cpu/mem None: not given).
    ``operator``: the operator's switches (:func:`saltvirt.base.switches.operator_settings`): a disk added
    passes :func:`saltvirt.storage.attach.admit`, a pool and a host device must be ones the operator made available."""
    name = req.name
    dom = get_domain(conn, name)
    facts = current(dom)
    cfg = facts["config"]
    manage = _managed(req, given)
    manage += [f for k, v in (("cpu", req.cpu), ("mem", req.mem)) if isinstance(v, dict) for f in DICT_FIELDS[k]]
    args = dataclasses.replace(
        req,
        cpu=req.cpu if req.cpu is not None else cfg["vcpu_current"],
        mem=req.mem if req.mem is not None else cfg["mem"],
    )
    if "nics" not in manage:
        args = dataclasses.replace(args, nic=None, interfaces=None)
    if "disks" not in manage:
        args = dataclasses.replace(args, disk=None, disks=None)
    desired = desired_spec(
        args, vtype=cfg["type"], images_dir=images_dir, profiles=profiles, allowed_paths=allowed_paths
    )
    desired = resolve.for_update(
        conn, desired, cfg, manage, uuid=dom.UUIDString(), images_dir=images_dir, operator=operator
    )
    changes = diff(desired, facts, manage)
    ret: Data = {"name": name, "changes": changes, "plan": plan(changes, facts, live), "applied": None}
    went_live: set[str] = set()
    if actionable(changes) and not test:
        ret["applied"] = apply(conn, dom, desired, changes, live, operator)
        facts = current(conn.lookupByName(name))
        went_live = {kind for kind, _item, desc in steps(actionable(changes)) if desc in ret["applied"]["live"]}
    # a balloon target libvirt took is the running VM's memory even before the guest has given the memory
    # back (its XML follows when it has): what went live now is not pending
    ret["pending_restart"] = [f for f in pending_restart(facts) if f not in went_live & {"cpu", "mem"}]
    return ret
