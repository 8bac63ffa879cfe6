"""UEFI firmware a VM is given by path (``boot: {loader, nvram}``): QEMU maps the loader into the guest
and libvirt copies the nvram template into the VM's own variables file, so both are host files the guest
reads. A caller may name only:

* firmware this host ships: a file a QEMU firmware descriptor names (:data:`DESCRIPTOR_DIRS`, QEMU's
  ``docs/interop/firmware.json``: the flash ``executable`` / ``nvram-template``, a ``memory`` image), or a
  file of the distribution's firmware directories (:data:`saltvirt.model.vmspec.FIRMWARE_DIRS`);
* a file the operator lists in ``virt:firmware`` (minion config only);
* for ``nvram`` also a file of the VM itself (in its directory of ``virt:images``), raw like every
  variables store.

``boot: {efi: True}`` and ``secure_boot`` need none of this: libvirt picks the firmware from the same
descriptors.
"""

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn
from saltvirt.model import vmspec
from saltvirt.storage import attach, intake

# where QEMU (and libvirt) look for firmware descriptors: the distribution's, then the operator's, which
# replace a descriptor of the same file name (an empty one hides it)
DESCRIPTOR_DIRS = ("/usr/share/qemu/firmware", "/etc/qemu/firmware")


def shipped(dirs: Iterable[str] = DESCRIPTOR_DIRS) -> dict[str, set[str]]:
    """``{"loader": {paths}, "nvram": {paths}}`` the firmware descriptors in ``dirs`` name (resolved).
    A descriptor that does not parse names nothing."""
    found: dict[str, str] = {}
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.endswith(".json"):
                found[name] = os.path.join(folder, name)  # a later directory replaces the same name
    out: dict[str, set[str]] = {"loader": set(), "nvram": set()}
    for path in found.values():
        try:
            with open(path, encoding="utf-8") as fh:
                mapping = json.load(fh).get("mapping") or {}
        except (OSError, ValueError, AttributeError):
            continue
        files: dict[str, list[Any]] = {
            "loader": [(mapping.get("executable") or {}).get("filename"), mapping.get("filename")],
            "nvram": [(mapping.get("nvram-template") or {}).get("filename")],
        }
        for kind, paths in files.items():
            out[kind] |= {os.path.realpath(f) for f in paths if isinstance(f, str) and os.path.isabs(f)}
    return out


def _ships(real, kind, descriptors):
    if real in descriptors[kind]:
        return True
    return validate.root_of(real, vmspec.FIRMWARE_DIRS) is not None and os.path.isfile(real)


def check(
    conn: Conn,
    boot: Any,
    *,
    vm: str,
    uuid: str | None,
    images_dir: str,
    settings: Mapping[str, Any] | None = None,
    dirs: Iterable[str] = DESCRIPTOR_DIRS,
) -> None:
    """Refuse a ``boot:loader`` / ``boot:nvram`` (``boot``: a :class:`saltvirt.model.vmspec.Boot` or None) that
    is neither firmware this host ships, nor listed in ``virt:firmware``, nor (nvram) a file of VM ``vm``."""
    given = [(kind, str(getattr(boot, kind))) for kind in ("loader", "nvram") if getattr(boot, kind, None)]
    if not given:
        return
    descriptors = shipped(dirs)
    listed = {os.path.realpath(p) for p in (settings or {}).get("firmware") or ()}
    for kind, path in given:
        real = os.path.realpath(path)
        if real in listed or _ships(real, kind, descriptors):
            continue
        if kind == "nvram" and _own_raw_file(conn, path, vm, uuid, images_dir):
            continue
        own = ", nor a file of this VM" if kind == "nvram" else ""
        raise SaltInvocationError(
            f"boot:{kind}: {path} is not firmware this host ships (its QEMU firmware descriptors in "
            f"{', '.join(dirs)}, or {', '.join(vmspec.FIRMWARE_DIRS)}){own}, nor one the operator lists in "
            "virt:firmware in the minion config: name one of those, or use boot: {efi: True} (libvirt picks the "
            "host's firmware)"
        )


def _own_raw_file(conn, path, vm, uuid, images_dir):
    """True when ``path`` is a raw file in VM ``vm``'s own directory of ``virt:images`` that no other VM uses."""
    vm_dir = os.path.join(images_dir, vm)
    if not os.path.isfile(path) or not validate.is_inside(path, vm_dir):
        return False
    attach.host_files(conn, [("boot:nvram", path)], vm=vm, uuid=uuid, images_dir=images_dir)
    try:
        return intake.sniff(path) == "raw"
    except OSError:
        return False
