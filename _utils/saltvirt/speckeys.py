"""Key-by-key checks of the nested arguments of ``virt.init`` / ``virt.update`` / the states (graphics,
disks, interfaces, boot, cpu, mem): every key is honoured, or refused before anything is created with a
message naming the nearest supported key. :mod:`saltvirt.spec` calls these; nothing here touches libvirt.

Salt's own spellings are accepted where salt-virt honours them (``graphics:listen`` as a mapping,
``disks:overlay_image``, ``disks:source_file``, ``disks:model``); the keys of Salt's virt module that
salt-virt does not implement are refused with the reason rather than ignored.
"""

import difflib
import ipaddress
import re

from salt.exceptions import SaltInvocationError

from saltvirt import validate

GRAPHICS_KEYS = ("type", "port", "listen", "password")
LISTEN_KEYS = ("type", "address")
NIC_KEYS = ("name", "type", "source", "model", "mac")
NIC_SHORTHAND = ("bridge", "network", "direct", "eth")  # classic profile spellings, mapped to type/source/model
DISK_KEYS = ("name", "size", "format", "path", "image", "overlay", "bus", "device", "target", "pool")
DISK_ALIASES = {"model": "bus", "overlay_image": "overlay", "source_file": "path"}  # Salt's names -> ours
DISK_INTERNAL = ("default_size",)
BOOT_KEYS = ("kernel", "initrd", "cmdline")

_NOT_YET = "is not supported by salt-virt yet"
GRAPHICS_REFUSED = {"tls_port": f"graphics:tls_port (SPICE over TLS) {_NOT_YET}; leave it out"}
LISTEN_REFUSED = {
    "network": "graphics:listen:network is not supported: use listen: {type: address, address: <ip>}",
}
DISK_REFUSED = {
    "backing_store_path": f"disks:backing_store_path (volume backing stores) {_NOT_YET}: use image + overlay",
    "backing_store_format": f"disks:backing_store_format {_NOT_YET}: use image + overlay",
    "hostname_property": "disks:hostname_property is for ZFS volumes (bhyve), which salt-virt does not manage",
    "sparse_volume": "disks:sparse_volume is for ZFS volumes (bhyve), which salt-virt does not manage",
    "io": f"disks:io {_NOT_YET}: leave it out (libvirt's default I/O mode is used)",
    "iothread_id": f"disks:iothread_id {_NOT_YET}: leave it out",
}
BOOT_REFUSED = {
    "loader": f"boot:loader (UEFI firmware) {_NOT_YET}: boot with the default BIOS or a kernel/initrd",
    "nvram": f"boot:nvram (UEFI variables) {_NOT_YET}",
    "efi": f"boot:efi (UEFI firmware) {_NOT_YET}",
    "secure_boot": f"boot:secure_boot {_NOT_YET}",
}

_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")
_SOURCE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}$")
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
_TARGET_RE = re.compile(r"^(vd|sd|hd|xvd)[a-z]{1,3}$")
_DEVICES = ("disk", "cdrom")


def nearest(key, choices):
    """The supported key closest to ``key`` (difflib), or None."""
    hits = difflib.get_close_matches(str(key), [str(c) for c in choices], n=1, cutoff=0.5)
    return hits[0] if hits else None


def unknown_key_error(key, what, supported):
    hint = nearest(key, supported)
    said = f"; did you mean {hint!r}?" if hint else ""
    return SaltInvocationError(f"{what}: unknown key {key!r}{said} (supported: {', '.join(supported)})")


def check_keys(entry, what, supported, refused=None, extra=()):
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


def _plain_text(value, what, maximum=4096):
    if not isinstance(value, str) or len(value) > maximum or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SaltInvocationError(f"{what} must be text without control characters or newlines, got {value!r}")
    return value


def listen_address(value, what="graphics:listen"):
    """An IP address or host name to listen on (never anything that could be markup)."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text:
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            if _HOSTNAME_RE.fullmatch(text):
                return text
    raise SaltInvocationError(f"{what} must be an IP address or a host name, got {value!r}")


def graphics(value, enable_vnc=False):
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
        out["password"] = _plain_text(value["password"], "graphics:password", maximum=256)
    return out


def nic(entry, what):
    """Check one NIC entry (after shorthand expansion) key by key and value by value."""
    check_keys(entry, what, NIC_KEYS)
    if entry.get("source") is not None and not _SOURCE_RE.fullmatch(str(entry["source"])):
        raise SaltInvocationError(f"{what}:source must be a bridge, network or device name, got {entry['source']!r}")
    if entry.get("model") is not None and not _MODEL_RE.fullmatch(str(entry["model"])):
        raise SaltInvocationError(f"{what}:model must be a NIC model name like virtio or e1000, got {entry['model']!r}")
    if entry.get("mac") is not None and not (isinstance(entry["mac"], str) and _MAC_RE.fullmatch(entry["mac"])):
        raise SaltInvocationError(f"{what}:mac must look like 52:54:00:12:34:56, got {entry['mac']!r}")


def disk(entry, what):
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


def boot(value):
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
    return value


def scalar(value, what, example):
    """``cpu`` / ``mem`` as a number; Salt's detailed dict form is refused with the reason."""
    if isinstance(value, (dict, list)):
        raise SaltInvocationError(
            f"{what} as a {type(value).__name__} (Salt's detailed form) {_NOT_YET}: give a number, e.g. {example}"
        )
    return value


# cloud-init (NoCloud) ------------------------------------------------------------------------------
CLOUD_INIT_KEYS = ("user_data", "meta_data", "network_config", "users", "ssh_authorized_keys", "hostname", "ip")
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


def cloud_init(value):
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
        isinstance(out["hostname"], str) and _HOSTNAME_RE.fullmatch(out["hostname"])
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
