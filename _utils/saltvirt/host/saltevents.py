"""Salt's ``libvirt_events`` engine scheme, offered by the ``virt_events`` engine beside its own tags so
reactors written for Salt keep working (engine option ``tags: libvirt_events`` or ``both``).

Tag: ``<tag_prefix>/<uri>/domain/<event type>`` as Salt's engine builds it: the prefix defaults to
``salt/engines/libvirt_events``, the URI ``qemu:///system`` becomes ``qemu/system``
(``qemu+tls://hv1/system``: ``qemu+tls/hv1/system``), the event type is ``lifecycle``, ``reboot``,
``io_error``, ``control_error``, ``agent_lifecycle`` or, in Salt's scheme only, one of :data:`DOMAIN_EXTRA`
(``rtc_change``, ``watchdog``, ``graphics``, ``block_job``, ``metadata_change``, ...). Data as Salt's:
``uri``, ``domain: {name, id, uuid}``, ``event`` (lifecycle: ``started``, ``stopped``, ...; else the event type)
and per type ``detail`` (lifecycle: ``booted``, ``destroyed``, ``from snapshot``, ...), ``srcPath``/``dev``/``action``/
``reason`` (io_error), ``state``/``reason`` (agent_lifecycle), the rest as :data:`DOMAIN_EXTRA` builds them.
What a guest or a tenant controls (agent state, balloon size, clock offset, metadata namespace, device
aliases) is relayed as data and never acted upon.

The other objects of Salt's engine, in its scheme only: ``<tag_prefix>/<uri>/<object>/<event type>`` for
``network/lifecycle``, ``pool/lifecycle``, ``pool/refresh``, ``nodedev/lifecycle``, ``nodedev/update``,
``secret/lifecycle`` and ``secret/value_changed``, with ``uri`` and the object (``network``/``pool``:
``{name, uuid}``, ``nodedev``: ``{name}``, ``secret``: ``{uuid}``, never its value or usage), ``event``
(lifecycle: ``defined``, ``undefined``, ``started``, ``stopped``, ``created``, ``deleted``; else the event
type) and, for lifecycle, ``detail: unknown`` (as Salt: libvirt sets none). ``filters``: Salt's list
(``all``, an object, ``<object>/<event type>``).
"""

import urllib.parse
from collections.abc import Callable
from typing import Any

from salt.exceptions import SaltInvocationError

try:
    import libvirt
except ImportError:  # the engines' __virtual__ report this
    libvirt = None

DEFAULT_PREFIX = "salt/engines/libvirt_events"


def enum_name(prefix: str, code: Any, skip: tuple[str, ...] = ()) -> str:
    """The bindings' constant ``<prefix><NAME>`` whose value is ``code``, as Salt words it (``TYPE_ACTIVE_COMMIT``
    -> ``active commit``); ``LAST`` and names under ``skip`` (another enum sharing the prefix) are not
    candidates. ``unknown`` when none matches."""
    for attr in sorted(dir(libvirt)) if libvirt is not None else ():
        rest = attr[len(prefix) :]
        if attr.startswith(prefix) and rest != "LAST" and not rest.startswith(skip) and getattr(libvirt, attr) == code:
            return rest.lower().replace("_", " ")
    return "unknown"


def _address(addr: Any) -> dict[str, Any]:
    """A graphics event's local or remote address (libvirt: a dict of family, node, service)."""
    family = enum_name("VIR_DOMAIN_EVENT_GRAPHICS_ADDRESS_", addr.get("family"))
    return {"family": family, "node": addr.get("node"), "service": addr.get("service")}


def _graphics(phase: int, local: Any, remote: Any, auth: str, subject: Any) -> dict[str, Any]:
    return {
        "phase": enum_name("VIR_DOMAIN_EVENT_GRAPHICS_", phase, skip=("ADDRESS_",)),
        "local": _address(local),
        "remote": _address(remote),
        "authScheme": auth,
        "subject": [{"type": kind, "name": name} for kind, name in subject or ()],
    }


def _unused_reason(_reason: int) -> dict[str, str]:
    return {"reason": "unknown"}  # libvirt defines no reason yet (Salt sends "unknown" too)


def _dev(dev: str) -> dict[str, str]:
    return {"dev": dev}


# Salt's domain event types beyond the five relayed in both schemes (sent in Salt's scheme only):
# event type -> (libvirt's event-id constants, the first the bindings have is registered; the data from the
# callback's arguments between the domain and libvirt's opaque, as Salt's engine builds it). block_job
# prefers BLOCK_JOB_2 (disk named by its target, vda) as Salt does; its tag stays block_job.
DOMAIN_EXTRA: dict[str, tuple[tuple[str, ...], Callable[..., dict[str, Any]]]] = {
    "rtc_change": (("VIR_DOMAIN_EVENT_ID_RTC_CHANGE",), lambda utcoffset: {"utcoffset": utcoffset}),
    "watchdog": (
        ("VIR_DOMAIN_EVENT_ID_WATCHDOG",),
        lambda action: {"action": enum_name("VIR_DOMAIN_EVENT_WATCHDOG_", action)},
    ),
    "graphics": (("VIR_DOMAIN_EVENT_ID_GRAPHICS",), _graphics),
    "disk_change": (
        ("VIR_DOMAIN_EVENT_ID_DISK_CHANGE",),
        lambda old, new, dev, reason: {
            "oldSrcPath": old,
            "newSrcPath": new,
            "dev": dev,
            "reason": enum_name("VIR_DOMAIN_EVENT_DISK_", reason),
        },
    ),
    "tray_change": (
        ("VIR_DOMAIN_EVENT_ID_TRAY_CHANGE",),
        lambda dev, reason: {"dev": dev, "reason": enum_name("VIR_DOMAIN_EVENT_TRAY_CHANGE_", reason)},
    ),
    "pmwakeup": (("VIR_DOMAIN_EVENT_ID_PMWAKEUP",), _unused_reason),
    "pmsuspend": (("VIR_DOMAIN_EVENT_ID_PMSUSPEND",), _unused_reason),
    "balloon_change": (("VIR_DOMAIN_EVENT_ID_BALLOON_CHANGE",), lambda actual: {"actual": actual}),
    "pmsuspend_disk": (("VIR_DOMAIN_EVENT_ID_PMSUSPEND_DISK",), _unused_reason),
    "device_removed": (("VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED",), _dev),
    "block_job": (
        ("VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2", "VIR_DOMAIN_EVENT_ID_BLOCK_JOB"),
        lambda disk, job_type, status: {
            "disk": disk,
            "type": enum_name("VIR_DOMAIN_BLOCK_JOB_TYPE_", job_type),
            # the status enum shares its prefix with four others (Salt's engine can pick theirs)
            "status": enum_name("VIR_DOMAIN_BLOCK_JOB_", status, skip=("TYPE_", "ABORT_", "INFO_", "SPEED_")),
        },
    ),
    "tunable": (("VIR_DOMAIN_EVENT_ID_TUNABLE",), lambda params: {"params": dict(params or {})}),
    "device_added": (("VIR_DOMAIN_EVENT_ID_DEVICE_ADDED",), _dev),
    "migration_iteration": (("VIR_DOMAIN_EVENT_ID_MIGRATION_ITERATION",), lambda iteration: {"iteration": iteration}),
    "job_completed": (("VIR_DOMAIN_EVENT_ID_JOB_COMPLETED",), lambda params: {"params": dict(params or {})}),
    "device_removal_failed": (("VIR_DOMAIN_EVENT_ID_DEVICE_REMOVAL_FAILED",), _dev),
    "metadata_change": (  # the namespace only: the metadata itself is not read
        ("VIR_DOMAIN_EVENT_ID_METADATA_CHANGE",),
        lambda mtype, nsuri: {"type": enum_name("VIR_DOMAIN_METADATA_", mtype), "nsuri": nsuri},
    ),
    "block_threshold": (
        ("VIR_DOMAIN_EVENT_ID_BLOCK_THRESHOLD",),
        lambda dev, path, threshold, excess: {"dev": dev, "path": path, "threshold": threshold, "excess": excess},
    ),
}
TYPES = ("lifecycle", "reboot", "io_error", "control_error", "agent_lifecycle", *DOMAIN_EXTRA)
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


def domain_extra_wanted(options: dict[str, Any]) -> list[str]:
    """The :data:`DOMAIN_EXTRA` event types the engine registers: Salt's scheme only, as ``filters`` say."""
    if options["tags"] == "salt-virt":
        return []
    return [t for t in DOMAIN_EXTRA if wanted(options, t)]


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


def extra_data(uri: str, who: tuple[str, str, int], event_type: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """Salt's data of a :data:`DOMAIN_EXTRA` event from libvirt's callback arguments (after the domain)."""
    out = data(uri, who, event_type)
    out.update(DOMAIN_EXTRA[event_type][1](*args))
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
