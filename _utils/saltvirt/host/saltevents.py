"""Salt's ``libvirt_events`` engine scheme, offered by the ``virt_events`` engine beside its own tags so
reactors written for Salt keep working (engine option ``tags: libvirt_events`` or ``both``).

Tag: ``<tag_prefix>/<uri>/domain/<event type>`` as Salt's engine builds it: the prefix defaults to
``salt/engines/libvirt_events``, the URI ``qemu:///system`` becomes ``qemu/system``
(``qemu+tls://hv1/system``: ``qemu+tls/hv1/system``), the event type is ``lifecycle``, ``reboot``,
``io_error``, ``control_error`` or ``agent_lifecycle``. Data as Salt's: ``uri``, ``domain: {name, id,
uuid}``, ``event`` (lifecycle: ``started``, ``stopped``, ...; else the event type) and per type
``detail`` (lifecycle: ``booted``, ``destroyed``, ``from snapshot``, ...), ``srcPath``/``dev``/``action``/
``reason`` (io_error), ``state``/``reason`` (agent_lifecycle). ``filters``: Salt's list (``all``,
``domain``, ``domain/<type>``); the other object types of Salt's engine (network, pool, nodedev,
secret) are not relayed.
"""

import urllib.parse
from typing import Any

from salt.exceptions import SaltInvocationError

DEFAULT_PREFIX = "salt/engines/libvirt_events"
TYPES = ("lifecycle", "reboot", "io_error", "control_error", "agent_lifecycle")
SCHEMES = ("salt-virt", "libvirt_events", "both")
SALT_OBJECTS = ("network", "pool", "nodedev", "secret")  # Salt's engine has them; not relayed here


def settings(tags: Any = "salt-virt", tag_prefix: Any = DEFAULT_PREFIX, filters: Any = None) -> dict[str, Any]:
    """The engine's ``tags``, ``tag_prefix`` and ``filters`` options, checked."""
    if tags not in SCHEMES:
        raise SaltInvocationError(f"virt_events: tags must be one of {', '.join(SCHEMES)}, not {tags!r}")
    if not isinstance(tag_prefix, str) or not tag_prefix.strip("/"):
        raise SaltInvocationError(f"virt_events: tag_prefix must be a non-empty string, not {tag_prefix!r}")
    filters = ["all"] if filters is None else [filters] if isinstance(filters, str) else list(filters)
    known = {"all", "domain", *(f"domain/{t}" for t in TYPES), *SALT_OBJECTS}
    known |= {f"{o}/{e}" for o in SALT_OBJECTS for e in ("lifecycle", "refresh", "update", "value_changed")}
    bad = sorted(str(f) for f in filters if f not in known)
    if bad:
        raise SaltInvocationError(
            f"virt_events: unknown filter(s) {', '.join(bad)} (Salt's: all, domain, domain/<{'|'.join(TYPES)}>)"
        )
    return {"tags": tags, "tag_prefix": tag_prefix.rstrip("/"), "filters": set(filters)}


def wanted(options: dict[str, Any], event_type: str) -> bool:
    """Whether Salt's ``filters`` relay this domain event type."""
    filters = options["filters"]
    return bool({"all", "domain", f"domain/{event_type}"} & filters)


def uri_part(uri: str) -> str:
    """``qemu+ssh://user@host:1234/system`` -> ``qemu+ssh/user@host:1234/system`` (Salt's engine)."""
    parsed = urllib.parse.urlparse(uri)
    parts = [parsed.scheme]
    if parsed.netloc:
        parts.append(parsed.netloc)
    if parsed.path.strip("/"):
        parts.append(parsed.path.strip("/"))
    return "/".join(parts)


def tag(prefix: str, uri: str, event_type: str) -> str:
    return f"{prefix}/{uri_part(uri)}/domain/{event_type}"


def _words(name: str | None) -> str:
    return name.lower().replace("_", " ") if name else "unknown"


def data(uri: str, who: tuple[str, str, int], event_type: str, **extra: Any) -> dict[str, Any]:
    """Salt's event data for the domain ``who`` (name, uuid, id)."""
    name, uuid, dom_id = who
    out = {"uri": uri, "domain": {"name": name, "id": dom_id, "uuid": uuid}, "event": event_type}
    out.update(extra)
    return out


def lifecycle(uri: str, who: tuple[str, str, int], typ: str | None, det: str | None) -> dict[str, Any]:
    """A lifecycle event from libvirt's constant names (``STARTED``, ``FROM_SNAPSHOT``) as Salt words them."""
    return data(uri, who, "lifecycle", event=_words(typ), detail=_words(det))
