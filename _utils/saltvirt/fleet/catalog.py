"""The image catalog (``virt:catalog`` in the master config): named images the operator vouches for.

::

    virt:
      catalog:
        debian12:
          source: salt://images/debian12.qcow2     # or https://...
          checksum: sha256:0f3c...                  # verified by the hypervisor before every use
          format: qcow2                             # raw or qcow2 (the hypervisor reads the header too)
          min_size: 2048                            # MiB the VM's system disk takes (quota and placement)
          profile: default                          # nic/disk profile used unless the call names one

``salt-run virt.init web1 2 1024 image=debian12`` resolves the name: the source and checksum go to the
hypervisor's ``virt.init``, which verifies the checksum before it uses any cached copy. Refreshing an entry
(a new file at the source and its new checksum) makes hosts import it again on their next use: a
``salt://`` source is re-fetched by ``cp.cache_file`` when the master's file changed, an https source when
its length/ETag/Last-Modified changed, and the cached base key includes the file's size and mtime
(:func:`saltvirt.vm.provision.base_image`), so VMs created before keep their old base.

Any other ``http(s)://`` image a runner caller names must be within ``virt:image_sources`` (master config;
default: none): :func:`check_sources`.
"""

from collections.abc import Iterable
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.config import virt_conf
from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.model import vmspec
from saltvirt.storage import intake

ENTRY_KEYS = ("source", "checksum", "format", "min_size", "profile")
FORMATS = ("qcow2", "raw")


def config(opts: SaltOpts) -> dict[str, Data]:
    """``{name: {source, checksum, format, min_size, profile}}`` checked."""
    raw = virt_conf(opts).get("catalog") or {}
    if not isinstance(raw, dict):
        raise SaltInvocationError(f"virt:catalog must be a mapping of image names, not {raw!r}")
    out = {}
    for name, entry in raw.items():
        where = f"virt:catalog:{name}"
        validate.vm_name(name, "catalog image name")
        if not isinstance(entry, dict):
            raise SaltInvocationError(f"{where} must be a mapping of {', '.join(ENTRY_KEYS)}, not {entry!r}")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise SaltInvocationError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(ENTRY_KEYS)})")
        source = entry.get("source")
        if not isinstance(source, str) or not source.startswith(("salt://", "https://")):
            raise SaltInvocationError(f"{where}:source must be a salt:// or https:// URL, not {source!r}")
        if not entry.get("checksum"):
            raise SaltInvocationError(f"{where}:checksum is required (sha256:<hex> or sha512:<hex>)")
        intake.parse_checksum(entry["checksum"])
        fmt = entry.get("format", "qcow2")
        if fmt not in FORMATS:
            raise SaltInvocationError(f"{where}:format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        min_size = validate.positive_int(entry.get("min_size", 0) or 1, f"{where}:min_size (MiB)")
        out[name] = {
            "source": source,
            "checksum": entry["checksum"],
            "format": fmt,
            "min_size": min_size if entry.get("min_size") else 0,
            "profile": str(entry.get("profile") or "default"),
        }
    return out


def resolve(
    opts: SaltOpts, image: str | None, tenant: str | None = None, allowed: Iterable[str] | None = None
) -> tuple[Data | None, str | None]:
    """``(entry or None, image source)``: a catalog name becomes its entry and source. A tenant caller
    (``tenant`` set) may name only catalog images listed in its ``allowed`` images."""
    catalog = config(opts)
    if tenant is not None:
        if image is None:
            return None, None
        if image not in (allowed or []) or image not in catalog:
            listed = ", ".join(i for i in (allowed or []) if i in catalog) or "none"
            raise SaltInvocationError(
                f"tenant {tenant} may use catalog images only: {image!r} is not one of its images ({listed})"
            )
    if isinstance(image, str) and image in catalog:
        return catalog[image], catalog[image]["source"]
    return None, image


def check_sources(opts: SaltOpts, image: str | None, disks: Any = None) -> None:
    """Refuse the ``http(s)://`` images of a runner call (``image``, and each of ``disks``' ``image``) that are
    neither a catalog entry's source nor within ``virt:image_sources`` of the master config (default: none,
    so ``salt://`` images, the catalog and the hypervisors' own files only): a hypervisor fetches whatever URL
    it is given, from hosts inside its network too (metadata services, admin interfaces)."""
    sources = intake.image_sources(virt_conf(opts).get("image_sources"), "master config") or ()
    vouched = {entry["source"] for entry in config(opts).values()}
    for source in [image, *(d.get("image") for d in vmspec.named_entries(disks, "disks"))]:
        if source not in vouched:
            intake.check_source(
                source, sources, "master config", ", or puts the image in virt:catalog or on the master's fileserver"
            )
