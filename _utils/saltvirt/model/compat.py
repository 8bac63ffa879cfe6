"""Old spellings of Salt's virt module's arguments, honoured with a deprecation warning or refused with the
name of the replacement (``hypervisor=``, ``install=``, ``serial_type=``, ``console=``, ``images=`` …). The
configuration's old flat spellings (``virt.tunnel: True``) are read by :mod:`saltvirt.base.config`. Nothing
here talks to libvirt.
"""

import logging
import urllib.parse
from collections.abc import Collection, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.model import checks, vmspec

log = logging.getLogger(__name__)


# arguments ----------------------------------------------------------------------------------------
VTYPES = ("kvm", "qemu", "test")


# "trust me" switches: the operator's, in the hypervisor's minion config; a call passing one is refused
OPERATOR_SWITCHES = {
    "allow_http": "virt:insecure_http_images: True",
    "trusted_image": "virt:insecure_trusted_images: [<absolute image path>, ...]",
}
SWITCH_REFUSED = (
    "{arg}= is an operator switch, not a call argument: the hypervisor's operator sets {key} in its minion config"
)


def refuse_operator_switches(given: Mapping[str, Any]) -> None:
    """Refuse any of :data:`OPERATOR_SWITCHES` set in ``given`` (a call's arguments) to anything but off."""
    for arg, key in OPERATOR_SWITCHES.items():
        if given.get(arg) not in (None, False, "", 0, "False", "false", "no", "off"):
            raise SaltInvocationError(SWITCH_REFUSED.format(arg=arg, key=key))


def _vtype_arg(kwargs: dict[str, Any], key: str, where: str, warnings: list[str]) -> None:
    """Salt's ``hypervisor=`` / ``vm_type=`` -> ``vtype`` (kvm, qemu)."""
    if key not in kwargs:
        return
    hyper = kwargs.pop(key)
    if hyper in (None, ""):
        return
    kind = str(hyper).lower()
    if kind not in VTYPES:
        raise SaltInvocationError(
            f"{where}: {key}={hyper!r} is not supported: salt-virt manages libvirt/KVM; "
            "use vtype=kvm or vtype=qemu (or leave it out to detect what the host can run)"
        )
    if kwargs.get("vtype") not in (None, "", kind):
        raise SaltInvocationError(f"{where}: give vtype= or {key}= (Salt's name for it), not both")
    kwargs["vtype"] = kind
    if key == "hypervisor":
        warnings.append(f"hypervisor={hyper} is deprecated: use vtype={kind}")


def init_args(kwargs: dict[str, Any], where: str = "virt.init") -> list[str]:
    """Map Salt's / older spellings in ``kwargs`` (a dict, modified in place) to salt-virt's;
    returns the deprecation warnings to put in the return. Refuses what cannot be mapped."""
    warnings: list[str] = []
    for key in ("hypervisor", "vm_type"):  # Salt's names: virt.init's (deprecated) and the states'
        _vtype_arg(kwargs, key, where, warnings)
    if "install" in kwargs:
        install = kwargs.pop("install")
        warnings.append(
            f"install={install} is ignored: salt-virt installs salt-minion at first boot when the image has "
            "none and virt:minion_install is configured (see the minion section of virt.init's return)"
        )
    if "serial_type" in kwargs:
        stype = kwargs.pop("serial_type")
        if stype not in (None, "None", "", "pty"):
            raise SaltInvocationError(
                f"{where}: serial_type={stype!r} is not supported: every VM gets a pty serial console "
                "(logged to serial_log); leave serial_type out"
            )
        warnings.append("serial_type is deprecated: every VM has a pty serial console (see serial_log)")
    if "console" in kwargs:
        console = kwargs.pop("console")
        if console is not None and not validate.to_bool(console):
            raise SaltInvocationError(f"{where}: console=False is not supported: every VM has a serial console")
        warnings.append("console is deprecated: every VM has a serial console")
    if "username" in kwargs or "password" in kwargs:  # Salt's default (empty) only
        validate.no_credentials(kwargs.pop("username", None), kwargs.pop("password", None), where)
    return warnings


def images_dir(images: Any, configured: str, allowed: Any, where: str = "virt.init") -> str:
    """Old Salt's per-call ``images=`` (the directory the VM's disks go to): honoured when it is
    ``virt:images`` (``configured``) or inside a directory of ``virt:allowed_paths`` (``allowed``, the
    minion config's); None: ``configured``. Anything else is refused, naming those settings."""
    if images in (None, ""):
        return configured
    return validate.confined(
        images,
        f"{where}: images=",
        (configured, *validate.allowed_paths(allowed)),
        hint="virt:images (or leave images= out: the VM's disks go to virt:images)",
    )


def images_unused(images: Any, name: str, profiles: Any, disk: Any = "default", disks: Any = None) -> str | None:
    """The warning for ``images=`` when it places none of the new VM's disks, because every disk names a pool
    (``disk`` profile + ``disks``, as :func:`saltvirt.model.vmspec.disk_entries` reads them); else None."""
    if images in (None, ""):
        return None
    entries = vmspec.disk_entries(profiles, disk, disks)
    if not entries or not all(entry.get("pool") for entry in entries):
        return None
    return (
        f"images={images}: no disk of VM {name} is made there, every disk names a pool (its volume is made in "
        "the pool); only the VM's manifest and cloud-init seed go there. Leave images= out"
    )


def refuse_unknown(kwargs: Mapping[str, Any], known: Collection[str], where: str) -> None:
    """Raise for arguments not in ``known``, naming the nearest one."""
    unknown = sorted(k for k in kwargs if not str(k).startswith("__") and k not in known)
    if not unknown:
        return
    parts = []
    for key in unknown:
        hint = checks.nearest(key, known)
        parts.append(f"{key} (did you mean {hint}?)" if hint else key)
    raise SaltInvocationError(f"{where}: unknown argument(s) {', '.join(parts)}")


MIGRATION_SCHEMES = ("qemu+tls", "qemu+tcp", "qemu+ssh", "qemu+libssh2", "qemu+libssh")


def migration_target(target: str, target_uri: str | None = None) -> tuple[str | None, str | None]:
    """Salt >= 3002 accepts a libvirt URI as ``virt.migrate`` target (``qemu+tls://hv2/system``):
    ``(host, uri)``; a plain host name gives ``(target, target_uri)`` unchanged."""
    if not isinstance(target, str) or "://" not in target:
        return target, target_uri
    if target_uri and target_uri != target:
        raise SaltInvocationError("virt.migrate: the target is a URI already: leave target_uri out")
    if any(c.isspace() or ord(c) < 32 for c in target):
        raise SaltInvocationError(f"virt.migrate: invalid target URI {target!r}")
    parts = urllib.parse.urlsplit(target)
    if parts.scheme not in MIGRATION_SCHEMES:
        raise SaltInvocationError(
            f"virt.migrate: target URI scheme {parts.scheme!r} is not a remote QEMU libvirtd "
            f"({', '.join(MIGRATION_SCHEMES)})"
        )
    if parts.path not in ("/system", "/system/") or parts.fragment:
        raise SaltInvocationError(
            f"virt.migrate: the target URI must name the system daemon (…/system), got {target!r}"
        )
    host = parts.hostname
    validate.host_name(host or "", "virt.migrate target URI host")
    return host, target


def profiles(configured: Any) -> Data:
    """``virt.get_profiles``: every NIC/disk profile (``default`` built in) as lists of named entries."""
    out = {}
    # the built-in system disk with its size, as Salt lists it (Salt's own test reads 8192): the size of the
    # blank disk a VM without an image gets (with an image the disk is the image's size)
    default_disks = [dict(vmspec.DEFAULT_DISKS[0], size=vmspec.DEFAULT_BLANK_DISK_MIB)]
    for kind, default in (("nic", vmspec.DEFAULT_NICS), ("disk", default_disks)):
        table = configured.get(kind) or {}
        if not isinstance(table, dict):
            raise SaltInvocationError(f"virt:{kind} must map profile names to entries, not {table!r}")
        out[kind] = {
            name: vmspec.profile_entries(configured, kind, name, default) for name in sorted({"default", *table})
        }
    # Salt's profiles name the disk model: virtio, what a VM gets when the entry names no bus (copies:
    # the entries may be the configuration's own)
    out["disk"] = {
        name: [e if "bus" in e or "model" in e else dict(e, model="virtio") for e in entries]
        for name, entries in out["disk"].items()
    }
    return out
