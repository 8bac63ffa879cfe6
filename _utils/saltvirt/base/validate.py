"""Input validation shared by the module, states and runner: names, sizes, paths."""

import os
import re
import urllib.parse
from collections.abc import Sequence
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base.config import virt_conf

# libvirt accepts almost anything as a domain name, but the name also becomes a directory, a file
# name and a minion id: keep it to what is safe everywhere.
# Always fullmatch: with re.match, "$" also matches before a trailing newline ("web1\n" would pass).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_HOST_RE = re.compile(r"[A-Za-z0-9_.:-]{1,253}")  # a host name, an IPv4 or an IPv6 address


def vm_name(name: Any, what: str = "VM name") -> str:
    """Return ``name`` if it is a safe VM/network/pool name, else raise SaltInvocationError."""
    if not isinstance(name, str) or not name:
        raise SaltInvocationError(f"{what} must be a non-empty string, got {name!r}")
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SaltInvocationError(
            f"invalid {what} {name!r}: use 1-63 characters from letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (no '/', spaces, quotes or '<>&')"
        )
    return name


def host_name(name: Any, what: str = "host name") -> str:
    """Return ``name`` if it is a plain host name or IP address (full match), else raise."""
    if not isinstance(name, str) or not _HOST_RE.fullmatch(name) or name.strip(".:") == "":
        raise SaltInvocationError(f"{what} must be a host name or an IP address, not {name!r}")
    return name


def int_in(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` (an int or a numeric string, e.g. from the CLI; never a bool) as an int from ``low`` to
    ``high`` (either may be open), else SaltInvocationError in one wording."""
    try:
        number = None if isinstance(value, bool) else int(str(value).strip())
    except (TypeError, ValueError):
        number = None
    if number is None or (low is not None and number < low) or (high is not None and number > high):
        if low == 1 and high is None:
            wanted = "a positive integer"
        elif high is None:
            wanted = f"a whole number >= {low}"
        elif low is None:
            wanted = f"a whole number <= {high}"
        else:
            wanted = f"a whole number {low}-{high}"
        raise SaltInvocationError(f"{what} must be {wanted}, got {value!r}")
    return number


def positive_int(value: Any, what: str, maximum: int | None = None) -> int:
    """Coerce ``value`` (int or numeric string, e.g. from the CLI) to a positive int (at most ``maximum``)."""
    number = int_in(value, what, 1)
    return number if maximum is None else int_in(number, what, 1, maximum)


# Sizes as Salt's virt and libvirt spell them (any case: Salt lowercases the unit); a number alone is in the
# caller's default unit.
SIZE_UNITS = "B, K/KiB, M/MiB, G/GiB, T/TiB, P/PiB, E/EiB (powers of 1024) or KB, MB, GB, TB, PB, EB (powers of 1000)"
_SIZE_RE = re.compile(r"\s*(\d{1,15})\s*([A-Za-z]{0,5})\s*")


def unit_bytes(unit: str, what: str) -> int:
    """Bytes in one ``unit`` of :data:`SIZE_UNITS` (and libvirt's ``bytes``); any other is refused."""
    low = unit.lower()
    power = "kmgtpe".find(low[:1]) + 1 if low else 0
    if low in ("b", "bytes"):
        return 1
    if power and low[1:] in ("", "ib"):
        return 1024**power
    if power and low[1:] == "b":
        return 1000**power
    raise SaltInvocationError(f"{what}: unknown unit {unit!r}; the units are {SIZE_UNITS}")


def size_bytes(value: Any, what: str, default_unit: str, like: str) -> tuple[int, bool]:
    """A size: a whole number (in ``default_unit``) or one with a unit (``512m``, ``2 GiB``, ``4GB``) ->
    ``(bytes, whether the unit is decimal)``; ``like`` shows the caller's form in the refusal."""
    match = None if isinstance(value, bool) else _SIZE_RE.fullmatch(str(value))
    if not match:
        raise SaltInvocationError(f"{what} must be {like}, got {value!r}")
    unit = match.group(2) or default_unit
    per = unit_bytes(unit, f"{what} ({value!r})")
    return int(match.group(1)) * per, unit.lower()[1:] == "b"


def seconds(value: Any, what: str, maximum: float | None = None) -> float:
    """``value`` (a number or a numeric string; never a bool) as a duration above 0 seconds (at most
    ``maximum``), else SaltInvocationError in one wording."""
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not number > 0 or (maximum is not None and number > maximum):
        most = "" if maximum is None else f" (at most {maximum})"
        raise SaltInvocationError(f"{what} must be a number of seconds above 0{most}, not {value!r}")
    return number


def int_or_none(value: Any) -> int | None:
    """A number libvirt or a minion reported, as an int; None when it is missing or not a number (facts
    are read leniently: a missing one is not an error)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


CREDENTIALS_REFUSED = (
    "username/password connections are not supported: salt-virt connects with the TLS certificates virt.keys "
    "installs (qemu+tls://) or the local socket; drop username= and password="
)


def shown_url(url: Any) -> Any:
    """``url`` as messages, events, logs and returns show it: without user:password, query and fragment (a
    presigned URL's token is in its query). Anything that is not a URL (a path, None) is returned as it is; a
    URL urllib cannot split is shown as its scheme only (it may hold a secret)."""
    if not isinstance(url, str) or "://" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return url.split("://", 1)[0] + "://..."
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))


def no_credentials(username: Any = None, password: Any = None, where: str | None = None) -> None:
    """Salt's username/password connection keywords: accepted empty (Salt's default), else refused
    in one wording that never echoes the value."""
    if any(value not in (None, "", "None") for value in (username, password)):
        raise SaltInvocationError(f"{where}: {CREDENTIALS_REFUSED}" if where else CREDENTIALS_REFUSED)


def to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _within(real: str, base_real: str) -> bool:
    """Resolved ``real`` is ``base_real`` or below it (the one comparison every "inside" check makes)."""
    return real == base_real or real.startswith(base_real.rstrip(os.sep) + os.sep)


def is_inside(path: str, base: str) -> bool:
    """True if ``path`` resolves (every symlink followed) to somewhere below ``base`` (not ``base`` itself)."""
    real, base_real = os.path.realpath(path), os.path.realpath(base)
    return real != base_real and _within(real, base_real)


def root_of(path: str, roots: Sequence[str | None]) -> str | None:
    """The first of ``roots`` that ``path`` resolves (symlinks, '..') to or below, else None."""
    real = os.path.realpath(path)
    return next((root for root in roots if root and _within(real, os.path.realpath(root))), None)


def inside(base: str, *parts: str) -> str:
    """Join ``parts`` under ``base`` and make sure the result stays inside it (no ../ or symlink tricks)."""
    base_real = os.path.realpath(base)
    path = os.path.realpath(os.path.join(base_real, *parts))
    if not _within(path, base_real):
        raise SaltInvocationError(f"path {os.path.join(base, *parts)!r} escapes {base!r}")
    return path


def absolute_path(path: Any, what: str = "path") -> str:
    if not isinstance(path, str) or not path or "\0" in path:
        raise SaltInvocationError(f"{what} must be a non-empty string, got {path!r}")
    if not os.path.isabs(path) or ".." in path.split("/"):
        raise SaltInvocationError(f"{what} must be an absolute path without '..', got {path!r}")
    return path


def confined(path: Any, what: str, roots: Sequence[str | None], hint: str = "virt:images or virt:allowed_paths") -> str:
    """``path`` (absolute) if, after resolving symlinks and '..', it lies inside one of ``roots``;
    else SaltInvocationError naming the settings that would allow it."""
    absolute_path(path, what)
    if root_of(path, roots) is not None:
        return path
    real = os.path.realpath(path)
    shown = ", ".join(str(r) for r in roots if r) or "none"
    resolved = f" (resolves to {real})" if real != os.path.normpath(path) else ""
    raise SaltInvocationError(
        f"{what} {path}{resolved} is outside the directories salt-virt may use ({shown}): put it inside "
        f"{hint}; the operator lists extra directories in virt:allowed_paths in the minion config "
        "(never taken from the call or from pillar)"
    )


# libvirt's own image directory: allowed unless the minion config sets virt:allowed_paths (an operator
# default, as Salt's tutorial puts images there; ``allowed_paths: []`` takes it away)
DEFAULT_ALLOWED_PATHS = ("/var/lib/libvirt/images",)


def configured_allowed_paths(opts: Any) -> Any:
    """``virt:allowed_paths`` of the minion config ``opts`` (never the call, pillar or grains), or
    :data:`DEFAULT_ALLOWED_PATHS` when the operator has not set it."""
    conf = virt_conf(opts)
    return conf.get("allowed_paths", DEFAULT_ALLOWED_PATHS)


def allowed_paths(value: Any, key: str = "virt:allowed_paths") -> tuple[str, ...]:
    """``virt:allowed_paths`` (or another config list ``key`` of paths) from the minion config: a list of
    absolute paths."""
    if value in (None, "", []):
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise SaltInvocationError(f"{key} must be a list of absolute directories, got {value!r}")
    return tuple(absolute_path(v, f"{key} entry") for v in value)


def config_names(value: Any, key: str, where: str = "minion config") -> tuple[str, ...]:
    """A config list of names (``virt:operators``, ``virt:pools``, ...): a list of non-empty strings, one
    string for a list of one. Anything else is SaltInvocationError in one wording naming ``key`` and the
    config it is read from (``where``)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise SaltInvocationError(f"{key} in the {where} must be a list of names, got {value!r}: fix the {where}")
    return tuple(value)
