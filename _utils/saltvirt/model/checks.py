"""Key-by-key checks of the nested arguments of ``virt.init`` / ``virt.update`` / the states (graphics,
disks, interfaces, boot, chardevs, tpm, clock; Salt's cpu/mem dicts are in :mod:`saltvirt.model.cpumem`):
every key is honoured, or refused before anything is created with a
message naming the nearest supported key. :mod:`saltvirt.model.vmspec` calls these; nothing here touches libvirt.

Salt's own spellings are accepted where salt-virt honours them (``graphics:listen`` as a mapping,
``disks:overlay_image``, ``disks:source_file``, ``disks:model``); the keys of Salt's virt module that
salt-virt does not implement are refused with the reason rather than ignored.
"""

import difflib
import ipaddress
import platform
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data

GRAPHICS_KEYS = ("type", "port", "listen", "password")
LISTEN_KEYS = ("type", "address")
NIC_KEYS = ("name", "type", "source", "model", "mac")
NIC_SHORTHAND = ("bridge", "network", "direct", "eth")  # classic profile spellings, mapped to type/source/model
DISK_KEYS = ("name", "size", "format", "path", "image", "overlay", "bus", "device", "target", "pool")
DISK_ALIASES = {"model": "bus", "overlay_image": "overlay", "source_file": "path"}  # Salt's names -> ours
DISK_INTERNAL = ("default_size",)
BOOT_KEYS = ("kernel", "initrd", "cmdline", "loader", "nvram", "efi", "secure_boot")

NOT_YET = "is not supported by salt-virt yet"
GRAPHICS_REFUSED = {"tls_port": f"graphics:tls_port (SPICE over TLS) {NOT_YET}; leave it out"}
LISTEN_REFUSED = {
    "network": "graphics:listen:network is not supported: use listen: {type: address, address: <ip>}",
}
DISK_REFUSED = {
    "backing_store_path": f"disks:backing_store_path (volume backing stores) {NOT_YET}: use image + overlay",
    "backing_store_format": f"disks:backing_store_format {NOT_YET}: use image + overlay",
    "hostname_property": "disks:hostname_property is for ZFS volumes (bhyve), which salt-virt does not manage",
    "sparse_volume": "disks:sparse_volume is for ZFS volumes (bhyve), which salt-virt does not manage",
    "io": f"disks:io {NOT_YET}: leave it out (libvirt's default I/O mode is used)",
    "iothread_id": f"disks:iothread_id {NOT_YET}: leave it out",
}
BOOT_REFUSED: dict[str, str] = {}

HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")
_SOURCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$")
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
_TARGET_RE = re.compile(r"^(vd|sd|hd|xvd)[a-z]{1,3}$")
_DEVICES = ("disk", "cdrom")


def nearest(key: str, choices: Iterable[str]) -> str | None:
    """The supported key closest to ``key`` (difflib), or None."""
    hits = difflib.get_close_matches(str(key), [str(c) for c in choices], n=1, cutoff=0.5)
    return hits[0] if hits else None


def unknown_key_error(key: str, what: str, supported: Sequence[str]) -> SaltInvocationError:
    hint = nearest(key, supported)
    said = f"; did you mean {hint!r}?" if hint else ""
    return SaltInvocationError(f"{what}: unknown key {key!r}{said} (supported: {', '.join(supported)})")


def check_keys(
    entry: Any,
    what: str,
    supported: Collection[str],
    refused: Mapping[str, str] | None = None,
    extra: Collection[str] = (),
) -> None:
    """Raise for any key of ``entry`` that is neither ``supported`` (or ``extra``) nor silently allowed:
    a key of Salt's that salt-virt refuses gets its reason, anything else the nearest supported key."""
    if not isinstance(entry, dict):
        raise SaltInvocationError(f"{what} must be a mapping, got {entry!r}")
    refused = refused or {}
    for key in entry:
        if key in supported or key in extra:
            continue
        if key in refused:
            raise SaltInvocationError(f"{what}: {refused[key]}")
        raise unknown_key_error(key, what, tuple(supported) + tuple(k for k in extra if k not in DISK_INTERNAL))


def _plain_text(value, what, maximum=4096, secret=False):
    """``value`` if it is one line of text; ``secret``: the refusal never shows the value (a password)."""
    if not isinstance(value, str) or len(value) > maximum or any(ord(c) < 32 or ord(c) == 127 for c in value):
        shown = f"at most {maximum} characters" if secret else f"got {value!r}"
        raise SaltInvocationError(f"{what} must be text without control characters or newlines, {shown}")
    return value


def listen_address(value: Any, what: str = "graphics:listen") -> str:
    """An IP address or host name to listen on (never anything that could be markup)."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text:
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            if HOSTNAME_RE.fullmatch(text):
                return text
    raise SaltInvocationError(f"{what} must be an IP address or a host name, got {value!r}")


def graphics(value: Any, enable_vnc: Any = False) -> Data | None:
    """``graphics`` (a type string, or Salt's mapping) -> ``{type, listen, port, password}`` or None."""
    if value in (None, "", False):
        return {"type": "vnc"} if validate.to_bool(enable_vnc) else None
    if isinstance(value, str):
        value = {"type": value}
    check_keys(value, "graphics", GRAPHICS_KEYS, GRAPHICS_REFUSED)
    gtype = value.get("type", "vnc")
    if gtype in (None, "none"):  # Salt's way of saying "no graphics"
        return None
    if gtype not in ("vnc", "spice"):
        raise SaltInvocationError(f"graphics type must be vnc or spice (or none), got {gtype!r}")
    out = {"type": gtype}
    listen = value.get("listen")
    if isinstance(listen, dict):  # Salt: {type: address, address: 0.0.0.0} / {type: none}
        check_keys(listen, "graphics:listen", LISTEN_KEYS, LISTEN_REFUSED)
        ltype = listen.get("type", "address")
        if ltype == "network":
            raise SaltInvocationError(f"graphics:listen: {LISTEN_REFUSED['network']}")
        if ltype not in ("address", "none", None):
            raise SaltInvocationError(f"graphics:listen:type must be address or none, got {ltype!r}")
        if ltype == "address":
            # Salt: no address means all addresses; salt-virt keeps consoles local unless one is named
            out["listen"] = listen_address(listen.get("address", "127.0.0.1"), "graphics:listen:address")
        else:
            out["listen"] = "127.0.0.1"
    elif listen is not None:
        out["listen"] = listen_address(listen)
    if value.get("port") is not None:
        port = value["port"]
        try:
            port = int(str(port).strip())
        except (TypeError, ValueError):
            port = None
        if port is None or isinstance(value["port"], bool) or not (port == -1 or 1 <= port <= 65535):
            raise SaltInvocationError(f"graphics:port must be -1 (automatic) or 1-65535, got {value['port']!r}")
        out["port"] = port
    if value.get("password") is not None:
        out["password"] = _plain_text(value["password"], "graphics:password", maximum=256, secret=True)
    return out


def nic(entry: Data, what: str) -> None:
    """Check one NIC entry (after shorthand expansion) key by key and value by value."""
    check_keys(entry, what, NIC_KEYS)
    if entry.get("source") is not None and not _SOURCE_RE.fullmatch(str(entry["source"])):
        raise SaltInvocationError(f"{what}:source must be a bridge, network or device name, got {entry['source']!r}")
    if entry.get("model") is not None and not _MODEL_RE.fullmatch(str(entry["model"])):
        raise SaltInvocationError(f"{what}:model must be a NIC model name like virtio or e1000, got {entry['model']!r}")
    if entry.get("mac") is not None and not (isinstance(entry["mac"], str) and MAC_RE.fullmatch(entry["mac"])):
        raise SaltInvocationError(f"{what}:mac must look like 52:54:00:12:34:56, got {entry['mac']!r}")


def disk(entry: Data, what: str) -> Data:
    """Check one disk entry key by key; Salt's spellings are mapped to ours. Returns the mapped entry."""
    check_keys(entry, what, DISK_KEYS, DISK_REFUSED, extra=tuple(DISK_ALIASES) + DISK_INTERNAL)
    entry = dict(entry)
    for old, new in DISK_ALIASES.items():
        if old in entry:
            value = entry.pop(old)
            if new in entry and entry[new] != value:
                raise SaltInvocationError(f"{what}: give either {old!r} (Salt's name) or {new!r}, not both")
            entry[new] = value
    if entry.get("device", "disk") not in _DEVICES:
        raise SaltInvocationError(f"{what}:device must be one of {_DEVICES}, got {entry['device']!r}")
    if entry.get("target") is not None and not (
        isinstance(entry["target"], str) and _TARGET_RE.fullmatch(entry["target"])
    ):
        raise SaltInvocationError(f"{what}:target must be a device name like vdb or sda, got {entry['target']!r}")
    if entry.get("image") is not None:
        _plain_text(entry["image"], f"{what}:image")
    if entry.get("overlay") is not None and not isinstance(entry["overlay"], (bool, str, int)):
        raise SaltInvocationError(f"{what}:overlay must be true or false, got {entry['overlay']!r}")
    return entry


def boot(value: Any) -> Data | None:
    """Check ``boot`` key by key; returns it (or None)."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise SaltInvocationError(f"boot must be a mapping with kernel, initrd and/or cmdline, got {value!r}")
    check_keys(value, "boot", BOOT_KEYS, BOOT_REFUSED)
    for key in ("kernel", "initrd"):
        if value.get(key):
            validate.absolute_path(value[key], f"boot:{key}")
    if value.get("cmdline") is not None:
        _plain_text(value["cmdline"], "boot:cmdline")
    for key in ("loader", "nvram"):
        if value.get(key):
            validate.absolute_path(value[key], f"boot:{key}")
    for key in ("efi", "secure_boot"):
        if value.get(key) is not None:
            flag(value[key], f"boot:{key}")
    return value


def scalar(value: Any, what: str, example: str) -> Any:
    """``cpu`` / ``mem`` as a number; Salt's detailed dict form is refused with the reason."""
    if isinstance(value, (dict, list)):
        raise SaltInvocationError(
            f"{what} as a {type(value).__name__} (Salt's detailed form) {NOT_YET}: give a number, e.g. {example}"
        )
    return value


# cloud-init (NoCloud) ------------------------------------------------------------------------------
CLOUD_INIT_KEYS: tuple[str, ...] = (
    "user_data",
    "meta_data",
    "network_config",
    "users",
    "ssh_authorized_keys",
    "hostname",
    "ip",
)
CLOUD_INIT_KEYS += ("gateway", "dns")
CLOUD_INIT_MAX_BYTES = 65536  # per document (user-data, meta-data, network-config): EC2's is 16 KiB
_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_USER_KEYS = ("name", "gecos", "groups", "shell", "sudo", "lock_passwd", "ssh_authorized_keys", "primary_group")


def _document(value, what):
    """user_data / meta_data / network_config: text (kept byte for byte) or, except user_data, a mapping."""
    if isinstance(value, dict):
        try:
            import yaml  # noqa: PLC0415 - only when a mapping is given

            text = yaml.safe_dump(value, default_flow_style=False, sort_keys=False)
        except Exception as exc:  # noqa: BLE001 - any non-representable value is bad input
            raise SaltInvocationError(f"{what} cannot be written as YAML: {exc}") from None
    elif isinstance(value, str):
        text = value
    else:
        raise SaltInvocationError(f"{what} must be text{'' if what.endswith('user_data') else ' or a mapping'}, got "
                                  f"{type(value).__name__}")  # fmt: skip
    if "\x00" in text:
        raise SaltInvocationError(f"{what} must not contain NUL characters")
    if len(text.encode("utf-8", "surrogatepass")) > CLOUD_INIT_MAX_BYTES:
        raise SaltInvocationError(
            f"{what} is larger than {CLOUD_INIT_MAX_BYTES} bytes: fetch big payloads from the guest "
            "(cloud-init #include or runcmd) instead"
        )
    return value


def _line_list(value, what, pattern=None, maximum=16384):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise SaltInvocationError(f"{what} must be a non-empty list of strings, got {value!r}")
    for item in value:
        _plain_text(item, what, maximum=maximum)
        if pattern is not None and not pattern.fullmatch(item):
            raise SaltInvocationError(f"{what}: {item!r} is not valid")
    return list(value)


def _cloud_users(value):
    if not isinstance(value, list) or not value:
        raise SaltInvocationError(f"cloud_init:users must be a list of user names or mappings, got {value!r}")
    out = []
    for item in value:
        user = {"name": item} if isinstance(item, str) else item
        check_keys(user, "cloud_init:users entry", _USER_KEYS)
        if not isinstance(user.get("name"), str) or not _USER_RE.fullmatch(user["name"]):
            raise SaltInvocationError(
                f"cloud_init:users: name must be a user name like admin, got {user.get('name')!r}"
            )
        for key, val in user.items():
            if key == "ssh_authorized_keys":
                _line_list(val, "cloud_init:users:ssh_authorized_keys")
            elif key == "groups" and isinstance(val, list):
                _line_list(val, "cloud_init:users:groups", _USER_RE)
            elif key in ("lock_passwd",):
                if not isinstance(val, bool):
                    raise SaltInvocationError(f"cloud_init:users:{key} must be true or false, got {val!r}")
            else:
                _plain_text(val, f"cloud_init:users:{key}", maximum=256)
        out.append(dict(user))
    return out


def cloud_init(value: Any) -> Data | None:
    """``cloud_init``: ``True`` (generated documents), a mapping of :data:`CLOUD_INIT_KEYS`, or
    None/False (no cidata volume). Returns the checked mapping ({} for True) or None.

    ``user_data`` is text (cloud-config, a script, MIME: passed byte for byte); ``meta_data`` and
    ``network_config`` are text or mappings. The short forms (``users``, ``ssh_authorized_keys``,
    ``hostname``, static ``ip``/``gateway``/``dns``) build the documents instead and cannot be mixed with
    the document they would write."""
    if value in (None, False, "", "false", "False"):
        return None
    if value is True or value in ("true", "True"):
        return {}
    check_keys(value, "cloud_init", CLOUD_INIT_KEYS)
    out = dict(value)
    for key in ("user_data", "meta_data", "network_config"):
        if out.get(key) is not None:
            if key == "user_data" and not isinstance(out[key], str):
                raise SaltInvocationError(f"cloud_init:user_data must be text (e.g. '#cloud-config ...'), got "
                                          f"{type(out[key]).__name__}")  # fmt: skip
            _document(out[key], f"cloud_init:{key}")
    if out.get("user_data") is not None and (out.get("users") or out.get("ssh_authorized_keys")):
        raise SaltInvocationError(
            "cloud_init: give either user_data or users/ssh_authorized_keys (they would write the same document)"
        )
    if out.get("meta_data") is not None and out.get("hostname"):
        raise SaltInvocationError("cloud_init: give either meta_data (with local-hostname) or hostname, not both")
    if out.get("network_config") is not None and any(out.get(k) for k in ("ip", "gateway", "dns")):
        raise SaltInvocationError("cloud_init: give either network_config or ip/gateway/dns, not both")
    if out.get("users") is not None:
        out["users"] = _cloud_users(out["users"])
    if out.get("ssh_authorized_keys") is not None:
        out["ssh_authorized_keys"] = _line_list(out["ssh_authorized_keys"], "cloud_init:ssh_authorized_keys")
    if out.get("hostname") is not None and not (
        isinstance(out["hostname"], str) and HOSTNAME_RE.fullmatch(out["hostname"])
    ):
        raise SaltInvocationError(f"cloud_init:hostname must be a host name, got {out['hostname']!r}")
    return _cloud_network(out)


def _cloud_network(out):
    """The static network short form: ip (with prefix), gateway, dns."""
    if out.get("ip") is not None:
        try:
            iface = ipaddress.ip_interface(str(out["ip"]))
        except ValueError:
            iface = None
        if iface is None or "/" not in str(out["ip"]) or not isinstance(out["ip"], str):
            raise SaltInvocationError(f"cloud_init:ip must be an address with its prefix like 10.0.0.5/24, got "
                                      f"{out['ip']!r}")  # fmt: skip
        out["ip"] = str(iface)
    elif out.get("gateway") or out.get("dns"):
        raise SaltInvocationError("cloud_init: gateway/dns need a static ip (ip: 10.0.0.5/24)")
    if out.get("gateway") is not None:
        out["gateway"] = _ip(out["gateway"], "cloud_init:gateway")
    if out.get("dns") is not None:
        dns = [out["dns"]] if isinstance(out["dns"], str) else out["dns"]
        if not isinstance(dns, list) or not dns:
            raise SaltInvocationError(f"cloud_init:dns must be a list of addresses, got {out['dns']!r}")
        out["dns"] = [_ip(d, "cloud_init:dns") for d in dns]
    return out


def _ip(value, what):
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        raise SaltInvocationError(f"{what} must be an IP address, got {value!r}") from None


# the domain's firmware, boot order, serial ports, consoles, TPM (saltvirt.model.vmspec builds them) ----------
BOOT_DEVS = ("hd", "cdrom", "network", "fd")
CHARDEV_KEYS = ("type", "host", "port", "protocol", "target_type")
CHARDEV_REFUSED = {
    "path": "a file, device, pipe or socket source is not supported by salt-virt: use type pty or tcp",
    "tls": f"chardev tls (TLS for TCP serial ports) {NOT_YET}: leave it out",
    "target_port": "target_port is chosen by salt-virt (the serial console is port 0, extra ones follow): leave it out",
}
CHARDEV_TYPES = ("pty", "tcp")
TPM_KEYS = ("model", "version")
TPM_MODELS = ("tpm-crb", "tpm-tis")
WATCHDOG_KEYS = ("model", "action")
WATCHDOG_MODELS = ("i6300esb", "ib700", "diag288")  # libvirt's: PCI (any x86 machine), ISA (i440fx), s390x
WATCHDOG_ACTIONS = ("reset", "shutdown", "poweroff", "pause", "none", "dump", "inject-nmi")


def flag(value: Any, what: str) -> bool:
    """A strict boolean: True/False, or yes/no/true/false/on/off/1/0 as text (anything else is refused)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        return validate.to_bool(value)
    raise SaltInvocationError(f"{what} must be true or false, got {value!r}")


def boot_dev(value: Any) -> list[str] | None:
    """Salt's ``boot_dev`` ("hd cdrom network", or a list) -> a list of boot devices, or None."""
    if value in (None, ""):
        return None
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise SaltInvocationError(f"boot_dev must be a space separated list like 'hd cdrom network', got {value!r}")
    out = []
    for item in items:
        if item not in BOOT_DEVS:
            raise SaltInvocationError(f"boot_dev: {item!r} is not a boot device (one of {', '.join(BOOT_DEVS)})")
        if item in out:
            raise SaltInvocationError(f"boot_dev: {item!r} is given twice")
        out.append(item)
    return out


def os_type(value: Any) -> str:
    if value in (None, "", "hvm"):
        return "hvm"
    raise SaltInvocationError(
        f"os_type={value!r} is not supported: salt-virt runs full virtualization (hvm) guests only; leave os_type out"
    )


def chardevs(value: Any, what: str) -> list[Data]:
    """Salt's ``serials`` / ``consoles``: a list of {type: pty|tcp, host, port, protocol, target_type}."""
    if value in (None, "", []):
        return []
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise SaltInvocationError(f"{what} must be a list of mappings like {{type: pty}}, got {value!r}")
    out = []
    for i, entry in enumerate(value):
        where = f"{what}[{i}]"
        check_keys(entry, where, CHARDEV_KEYS, CHARDEV_REFUSED)
        ctype = entry.get("type", "pty")
        if ctype not in CHARDEV_TYPES:
            raise SaltInvocationError(f"{where}:type must be one of {', '.join(CHARDEV_TYPES)}, got {ctype!r}")
        item = {"type": ctype}
        if ctype == "tcp":
            port = entry.get("port")
            try:
                port = int(str(port).strip()) if not isinstance(port, bool) else None
            except (TypeError, ValueError):
                port = None
            if port is None or not 1 <= port <= 65535:
                raise SaltInvocationError(f"{where}:port must be a TCP port 1-65535, got {entry.get('port')!r}")
            protocol = entry.get("protocol", "telnet")
            if protocol not in ("telnet", "raw"):
                raise SaltInvocationError(f"{where}:protocol must be telnet or raw, got {protocol!r}")
            # a serial port is a root shell for whoever connects: local unless a host is named
            item.update(
                port=port, protocol=protocol, host=listen_address(entry.get("host", "127.0.0.1"), f"{where}:host")
            )
        else:
            for key in ("host", "port", "protocol"):
                if entry.get(key) is not None:
                    raise SaltInvocationError(f"{where}:{key} is for type tcp only (a pty has no {key})")
        target = entry.get("target_type")
        allowed = ("serial",) if what == "serials" else ("virtio",)  # the serial console (port 0) is always there
        if target is not None and target not in allowed:
            raise SaltInvocationError(f"{where}:target_type must be one of {', '.join(allowed)}, got {target!r}")
        item["target_type"] = target or ("serial" if what == "serials" else "virtio")
        out.append(item)
    return out


_NODEDEV_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def host_devices(value: Any) -> list[str]:
    """Salt's ``host_devices``: a list of node device names (``virt.node_devices``: pci_0000_00_1f_2,
    usb_3_1, ...); they are looked up on the hypervisor by :func:`saltvirt.host.caps.host_devices`."""
    if value in (None, "", []):
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise SaltInvocationError(
            f"host_devices must be a list of node device names (virt.node_devices), got {value!r}"
        )
    out = []
    for name in value:
        if not isinstance(name, str) or not _NODEDEV_RE.fullmatch(name):
            raise SaltInvocationError(f"host_devices: {name!r} is not a node device name like pci_0000_00_1f_2")
        if name in out:
            raise SaltInvocationError(f"host_devices: {name!r} is given twice")
        out.append(name)
    return out


def tpm(value: Any) -> dict[str, str] | None:
    """``tpm``: True (a TPM 2.0 tpm-crb emulated by swtpm) or {model, version}; None/False: no TPM."""
    if value in (None, "", False):
        return None
    if isinstance(value, (bool, str)):
        if not flag(value, "tpm"):
            return None
        value = {}
    check_keys(value, "tpm", TPM_KEYS)
    model = value.get("model", "tpm-crb")
    if model not in TPM_MODELS:
        raise SaltInvocationError(f"tpm:model must be one of {', '.join(TPM_MODELS)}, got {model!r}")
    version = str(value.get("version", "2.0"))
    if version not in ("2.0", "1.2"):
        raise SaltInvocationError(f"tpm:version must be 2.0 or 1.2, got {value.get('version')!r}")
    if version == "1.2" and model == "tpm-crb":
        raise SaltInvocationError("tpm: the tpm-crb model needs version 2.0 (use model tpm-tis for 1.2)")
    return {"model": model, "version": version}


def watchdog(value: Any) -> dict[str, str] | None:
    """``watchdog``: True (an i6300esb that resets a guest that stops feeding it), a model, or {model, action};
    None/False: none."""
    if value in (None, "", False):
        return None
    if isinstance(value, str) and value in WATCHDOG_MODELS:
        value = {"model": value}
    elif isinstance(value, (bool, str)):
        if not flag(value, "watchdog"):
            return None
        value = {}
    check_keys(value, "watchdog", WATCHDOG_KEYS)
    model, action = value.get("model", "i6300esb"), value.get("action", "reset")
    if model not in WATCHDOG_MODELS:
        raise SaltInvocationError(f"watchdog:model must be one of {', '.join(WATCHDOG_MODELS)}, got {model!r}")
    if action not in WATCHDOG_ACTIONS:
        raise SaltInvocationError(f"watchdog:action must be one of {', '.join(WATCHDOG_ACTIONS)}, got {action!r}")
    return {"model": model, "action": action}


CLOCK_KEYS = ("utc", "timezone", "adjustment", "timers")
TIMER_NAMES = ("platform", "hpet", "kvmclock", "pit", "rtc", "tsc", "hypervclock")
TIMER_KEYS = ("track", "tickpolicy", "frequency", "mode", "present")
TIMER_REFUSED = {
    k: f"clock:timers:<name>:{k} (catchup tuning) {NOT_YET}: leave it out"
    for k in ("catchup", "slew", "threshold", "limit")
}
_TIMER_VALUES = {
    "track": ("boot", "guest", "wall", "realtime"),
    "tickpolicy": ("delay", "catchup", "merge", "discard"),
    "mode": ("auto", "native", "emulate", "paravirt", "smpsafe"),
}
_TIMEZONE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]{0,31}(/[A-Za-z0-9_+-]{1,32}){0,2}$")
HYPERVISOR_FEATURES = ("kvm-hint-dedicated", "kvm-hidden")


def clock(value: Any) -> Data | None:
    """Salt's ``clock``: {utc, timezone, adjustment (seconds or reset), timers: {name: {...}}} -> the
    attributes of ``<clock>`` and its ``<timer>`` elements, or None (libvirt's default, UTC)."""
    if value in (None, ""):
        return None
    check_keys(value, "clock", CLOCK_KEYS)
    utc = flag(value.get("utc", True), "clock:utc")
    out: Data = {"offset": "utc" if utc else "localtime", "timers": []}
    if value.get("timezone") is not None:
        tz = value["timezone"]
        if not isinstance(tz, str) or not _TIMEZONE_RE.fullmatch(tz):
            raise SaltInvocationError(f"clock:timezone must be a time zone name like Europe/Paris, got {tz!r}")
        if value.get("adjustment") is not None or "utc" in value:
            raise SaltInvocationError("clock:timezone goes alone (no utc or adjustment with it)")
        out = {"offset": "timezone", "timezone": tz, "timers": []}
    adj = value.get("adjustment")
    if adj == "reset":
        out["adjustment"] = "reset"
    elif adj is not None:
        if isinstance(adj, bool) or not re.fullmatch(r"-?\d{1,10}", str(adj).strip()):
            raise SaltInvocationError(f"clock:adjustment must be a number of seconds or reset, got {adj!r}")
        out.update(offset="variable", adjustment=int(str(adj).strip()), basis="utc" if utc else "localtime")
    timers = value.get("timers") or {}
    if not isinstance(timers, dict):
        raise SaltInvocationError(f"clock:timers must map timer names to settings, got {timers!r}")
    out["timers"] = [_timer(name, conf or {}) for name, conf in timers.items()]
    return out


def _timer(name, conf):
    """One ``clock:timers`` entry, key by key."""
    if name not in TIMER_NAMES:
        raise unknown_key_error(name, "clock:timers", TIMER_NAMES)
    where = f"clock:timers:{name}"
    check_keys(conf, where, TIMER_KEYS, TIMER_REFUSED)
    timer = {"name": name}
    for key, allowed in _TIMER_VALUES.items():
        if conf.get(key) is not None:
            if conf[key] not in allowed:
                raise SaltInvocationError(f"{where}:{key} must be one of {', '.join(allowed)}, got {conf[key]!r}")
            timer[key] = conf[key]
    if conf.get("frequency") is not None:
        timer["frequency"] = validate.positive_int(conf["frequency"], f"{where}:frequency (Hz)")
    if conf.get("present") is not None:
        timer["present"] = "yes" if flag(conf["present"], f"{where}:present") else "no"
    return timer


def hypervisor_features(value: Any) -> dict[str, bool]:
    """Salt's ``hypervisor_features`` ({kvm-hint-dedicated: True, kvm-hidden: True}) -> {name: bool}."""
    if value in (None, "", {}):
        return {}
    check_keys(value, "hypervisor_features", HYPERVISOR_FEATURES)
    return {k: flag(v, f"hypervisor_features:{k}") for k, v in value.items()}


# the checkers of the table's plain rows (saltvirt.model.vmargs: the VMSpec field is check(value)) ---------
def group(value: Any) -> str | None:
    """``group``: an anti-affinity group name, kept in the domain's <metadata>; None without one."""
    return validate.vm_name(value, "group") if value else None


def owner(value: Any) -> Data | None:
    """``owner``: ``{tenant, creator}`` for the domain's <metadata>, names only (what ``salt-run virt.init``
    wrote); None without one."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"tenant", "creator"}:
        raise SaltInvocationError(f"owner must be {{tenant, creator}}, not {value!r}")
    out = {}
    for key in ("tenant", "creator"):
        name = value.get(key)
        if name is not None:
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.@%+=-]{1,128}", name):
                raise SaltInvocationError(f"owner:{key} must be a name (letters, digits, _.@%+=-), not {name!r}")
            out[key] = name
    return out or None


def ha(value: Any) -> bool:
    """``ha``: automatic HA restarts the VM elsewhere when its host is lost (None: off)."""
    return flag(value, "ha") if value is not None else False


def stop_on_reboot(value: Any) -> bool:
    """``stop_on_reboot``: ``<on_reboot>destroy`` (None: off)."""
    return flag(value, "stop_on_reboot") if value is not None else False


def serials(value: Any) -> list[Data]:
    """Salt's ``serials``: extra serial ports after the console (port 0), :func:`chardevs`."""
    return chardevs(value, "serials")


def consoles(value: Any) -> list[Data]:
    """Salt's ``consoles``: extra consoles (virtio), :func:`chardevs`."""
    return chardevs(value, "consoles")


def arch(value: Any) -> str:
    """The guest architecture: the host's own (TCG emulation of another one is not offered)."""
    host = platform.machine()
    if value in (None, "", host):
        return host
    raise SaltInvocationError(
        f"arch={value!r} is not supported: salt-virt runs guests of the host's architecture ({host}) only; "
        "leave arch out"
    )
