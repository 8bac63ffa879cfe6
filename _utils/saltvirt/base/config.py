"""The operator's ``virt:`` configuration, read one way on both sides (docs/configuration.md lists every key):

* the minion side reads ``virt:a:b`` through a ``config.get``-like ``(key, default)`` function
  (:func:`getter`; ``saltvirt.host.conn.salt_config`` builds it from the minion config only);
* the master side reads the ``virt`` mapping of its opts (:func:`master_virt`, :func:`master_opts`);
* a mapping under one key (``virt:recovery``, ``virt:placement``, ...) is checked by :func:`section`.

Salt's old flat spellings (``virt.tunnel: True`` next to ``virt: {tunnel: True}``) are honoured here, with a
deprecation warning in the log: they are where configuration is read, not an argument spelling.
"""

import logging
from collections.abc import Collection, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import ConfigGet, Data, SaltOpts

log = logging.getLogger(__name__)
_MISSING = object()


def _flat_lookup(get, key):
    """``virt:a:b`` under its old flat spellings: ``virt.a.b``, or ``virt.a`` holding ``{b: ...}``."""
    parts = key.split(":")
    if parts[0] != "virt" or len(parts) < 2:
        return _MISSING, None
    for split in range(len(parts), 1, -1):
        flat = ".".join(parts[:split])
        value = get(flat, _MISSING)
        if value is _MISSING or value is None:
            continue
        for sub in parts[split:]:
            if not isinstance(value, dict) or sub not in value:
                value = _MISSING
                break
            value = value[sub]
        if value is not _MISSING:
            return value, flat
    return _MISSING, None


def getter(get: ConfigGet) -> ConfigGet:
    """Wrap a ``config.get``-like ``get(key, default)``: ``virt:x`` falls back to the old flat ``virt.x``
    spelling, with a deprecation warning in the log."""

    def lookup(key, default=None):
        value = get(key, _MISSING)
        if value is not _MISSING and value is not None:
            return value
        old, flat = _flat_lookup(get, key)
        if old is _MISSING:
            return default if value is _MISSING else (value if value is not None else default)
        log.warning("config %r is deprecated: write it as %r (virt: {%s: ...})", flat, key, key.split(":", 1)[1])
        return old

    return lookup


def virt_conf(opts: Mapping[str, Any] | None, where: str = "config") -> Data:
    """The ``virt`` mapping of the config ``opts`` (``where``: which one, for the message) as it is written
    (``{}`` when unset; see :func:`master_virt` for the master's, with its old flat keys)."""
    # not `opts or {}`: the truth of Salt's OptsDict is its len(), a walk over its ~1,300 keys (~0.5 ms)
    conf = ({} if opts is None else opts).get("virt") or {}
    if not isinstance(conf, dict):
        raise SaltInvocationError(f"{where} 'virt' must be a mapping, not {conf!r}")
    return conf


def master_virt(opts: SaltOpts) -> tuple[Data, list[str]]:
    """The master's ``virt`` mapping with old flat keys (``virt.tunnel: True``) merged in (the mapping
    wins on a conflict); ``(conf, warnings)``."""
    conf = opts.get("virt") or {}
    if not isinstance(conf, dict):
        raise SaltInvocationError(f"master config 'virt' must be a mapping, not {conf!r}")
    conf = dict(conf)
    warnings = []
    for key, value in opts.items():
        if isinstance(key, str) and key.startswith("virt.") and len(key) > 5:
            sub = key[5:]
            path = sub.split(".")
            target: Any = conf
            for part in path[:-1]:
                target = target.setdefault(part, {}) if isinstance(target.get(part, {}), dict) else None
                if target is None:
                    break
            if target is None or path[-1] in target:
                continue
            target[path[-1]] = value
            nested = "..."
            for part in reversed(path):
                nested = f"{{{part}: {nested}}}"
            warnings.append(f"master config {key!r} is deprecated: write it as virt: {nested}")
    for warning in warnings:
        log.warning(warning)
    return conf, warnings


def master_opts(opts: SaltOpts) -> SaltOpts:
    """A copy of ``opts`` whose ``virt`` mapping includes the old flat keys."""
    conf, _ = master_virt(opts)
    return dict(opts, virt=conf)


def section(raw: Any, where: str, known: Collection[str] | None = None, shape: str = "") -> Data:
    """``raw``, the mapping of one key of the config (``where``: ``virt:recovery``; unset or empty: ``{}``),
    refused unless it is a mapping (``shape``: how one looks, for the message) whose keys are all ``known``
    (in the order given; None: any key)."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise SaltInvocationError(f"{where} must be a mapping{shape}, not {raw!r}")
    unknown = sorted(set(raw) - set(known)) if known is not None else []
    if unknown:
        raise SaltInvocationError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known or ())})")
    return dict(raw)
