"""Salt's ``libvirt_events`` engine scheme, offered by the ``virt_events`` engine beside its own tags so
reactors written for Salt keep working (engine option ``tags: libvirt_events`` or ``both``).

Tag: ``<tag_prefix>/<uri>/domain/<event type>`` as Salt's engine builds it: the prefix defaults to
``salt/engines/libvirt_events``, the URI ``qemu:///system`` becomes ``qemu/system``
(``qemu+tls://hv1/system``: ``qemu+tls/hv1/system``), the event type is ``lifecycle``, ``reboot``,
``io_error``, ``control_error`` or ``agent_lifecycle``. Data as Salt's: ``uri``, ``domain: {name, id,
uuid}``, ``event`` (lifecycle: ``started``, ``stopped``, ...; else the event type) and per type
``detail`` (lifecycle: ``booted``, ``destroyed``, ``from snapshot``, ...), ``srcPath``/``dev``/``action``/
``reason`` (io_error), ``state``/``reason`` (agent_lifecycle).

The other objects of Salt's engine, in its scheme only: ``<tag_prefix>/<uri>/<object>/<event type>`` for
``network/lifecycle``, ``pool/lifecycle``, ``pool/refresh``, ``nodedev/lifecycle``, ``nodedev/update``,
``secret/lifecycle`` and ``secret/value_changed``, with ``uri`` and the object (``network``/``pool``:
``{name, uuid}``, ``nodedev``: ``{name}``, ``secret``: ``{uuid}``, never its value or usage), ``event``
(lifecycle: ``defined``, ``undefined``, ``started``, ``stopped``, ``created``, ``deleted``; else the event
type) and, for lifecycle, ``detail: unknown`` (as Salt: libvirt sets none). ``filters``: Salt's list
(``all``, an object, ``<object>/<event type>``).
"""

import urllib.parse
from typing import Any

from salt.exceptions import SaltInvocationError

DEFAULT_PREFIX = "salt/engines/libvirt_events"
TYPES = ("lifecycle", "reboot", "io_error", "control_error", "agent_lifecycle")
SCHEMES = ("salt-virt", "libvirt_events", "both")
# Salt's engine's other objects: their event types, the bindings' lifecycle constants' prefix, the keys of
# the object in the data
OBJECT_TYPES = {
    "network": ("lifecycle",),
    "pool": ("lifecycle", "refresh"),
    "nodedev": ("lifecycle", "update"),
    "secret": ("lifecycle", "value_changed"),
}
SALT_OBJECTS = tuple(OBJECT_TYPES)
LIFECYCLE_PREFIX = {
    "network": "VIR_NETWORK_EVENT_",
    "pool": "VIR_STORAGE_POOL_EVENT_",
    "nodedev": "VIR_NODE_DEVICE_EVENT_",
    "secret": "VIR_SECRET_EVENT_",
}


def settings(tags: Any = "salt-virt", tag_prefix: Any = DEFAULT_PREFIX, filters: Any = None) -> dict[str, Any]:
    """The engine's ``tags``, ``tag_prefix`` and ``filters`` options, checked."""
    if tags not in SCHEMES:
        raise SaltInvocationError(f"virt_events: tags must be one of {', '.join(SCHEMES)}, not {tags!r}")
    if not isinstance(tag_prefix, str) or not tag_prefix.strip("/"):
        raise SaltInvocationError(f"virt_events: tag_prefix must be a non-empty string, not {tag_prefix!r}")
    filters = ["all"] if filters is None else [filters] if isinstance(filters, str) else list(filters)
    known = {"all", "domain", *(f"domain/{t}" for t in TYPES), *SALT_OBJECTS}
    known |= {f"{o}/{e}" for o, types in OBJECT_TYPES.items() for e in types}
    bad = sorted(str(f) for f in filters if f not in known)
    if bad:
        raise SaltInvocationError(
            f"virt_events: unknown filter(s) {', '.join(bad)} (Salt's: all, domain, domain/<{'|'.join(TYPES)}>, "
            f"{', '.join(SALT_OBJECTS)}, <object>/<event type>)"
        )
    return {"tags": tags, "tag_prefix": tag_prefix.rstrip("/"), "filters": set(filters)}


def wanted(options: dict[str, Any], event_type: str, obj: str = "domain") -> bool:
    """Whether Salt's ``filters`` relay this event type of a domain (or of ``obj``)."""
    filters = options["filters"]
    return bool({"all", obj, f"{obj}/{event_type}"} & filters)


def objects_wanted(options: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``(object, event type)`` pairs other than domains the engine registers: Salt's scheme only."""
    if options["tags"] == "salt-virt":
        return []
    return [(o, e) for o, types in OBJECT_TYPES.items() for e in types if wanted(options, e, o)]


def uri_part(uri: str) -> str:
    """``qemu+ssh://user@host:1234/system`` -> ``qemu+ssh/user@host:1234/system`` (Salt's engine)."""
    parsed = urllib.parse.urlparse(uri)
    parts = [parsed.scheme]
    if parsed.netloc:
        parts.append(parsed.netloc)
    if parsed.path.strip("/"):
        parts.append(parsed.path.strip("/"))
    return "/".join(parts)


def tag(prefix: str, uri: str, event_type: str, obj: str = "domain") -> str:
    return f"{prefix}/{uri_part(uri)}/{obj}/{event_type}"


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


def object_data(uri: str, obj: str, event_type: str, ident: dict[str, str], event: str | None = None) -> dict[str, Any]:
    """Salt's data of a network, pool, node device or secret event: ``ident`` is the object's
    (``{name, uuid}``, ``{name}`` or ``{uuid}``); ``event`` a lifecycle event's name (:func:`lifecycle_name`)."""
    if event_type == "lifecycle":
        return {"uri": uri, obj: dict(ident), "event": event or "unknown", "detail": "unknown"}
    return {"uri": uri, obj: dict(ident), "event": event_type}


def lifecycle_name(libvirt_module: Any, obj: str, code: int) -> str:
    """A network/pool/nodedev/secret lifecycle code as Salt words it (``VIR_STORAGE_POOL_EVENT_STARTED`` ->
    ``started``); the event-id constants sharing the prefix (``..._ID_LIFECYCLE``) are not names of events."""
    prefix = LIFECYCLE_PREFIX[obj]
    for attr in dir(libvirt_module):
        rest = attr[len(prefix) :]
        named = attr.startswith(prefix) and not rest.startswith("ID_") and rest != "LAST"
        if named and getattr(libvirt_module, attr) == code:
            return rest.lower().replace("_", " ")
    return "unknown"
