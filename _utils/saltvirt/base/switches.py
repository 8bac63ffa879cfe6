"""The operator's switches: the ``virt:`` keys of the minion config that bound what a call may give a VM
(pools, host devices, serial TCP ports, firmware, adoption of a gone VM's disks, where Salt's raw pool calls
may put a pool). Read from the minion config only (``opts``), never from a call, pillar or grains; the
doors that enforce them take the mapping :func:`operator_settings` returns (``saltvirt.storage.attach``,
``saltvirt.storage.firmware``, ``saltvirt.storage.poollimits``)."""

from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import config, validate
from saltvirt.base.salttypes import Data

POOL_SOURCE_KINDS = ("devices", "names", "hosts", "adapters")  # virt:pool_sources (see storage.poollimits)
DEFAULT_SERIAL_LISTEN = ("127.0.0.1", "::1", "localhost")  # a TCP serial port is a root console of its guest


def operator_settings(opts: Any) -> Data:
    """The operator's disk and device switches from the minion config ``opts`` (never a call, pillar or
    grains): ``adopt_orphan_disks`` (bool), ``pools`` (tuple of pool names, or None when not set),
    ``host_devices`` (tuple of node device names a VM may be given; none by default),
    ``trusted_images`` (``virt:insecure_trusted_images``: bases an attached overlay may back onto),
    ``allowed_paths`` (``virt:allowed_paths``), ``pool_paths`` and ``pool_sources`` (where Salt's
    ``pool_define`` may put a pool: :mod:`saltvirt.storage.poollimits`), ``serial_tcp_ports`` ((low, high)
    or None: none) and ``serial_tcp_listen`` (addresses; :func:`saltvirt.storage.attach.check_serials`),
    ``firmware`` (UEFI files beside the host's own: :mod:`saltvirt.storage.firmware`)."""
    conf = config.virt_conf(opts, "the minion config")
    names = validate.config_names
    pool_names = conf.get("pools")
    allowed = validate.allowed_paths(validate.configured_allowed_paths(opts))
    pool_paths = conf.get("pool_paths")
    sources = conf.get("pool_sources") or {}
    if not isinstance(sources, dict) or set(sources) - set(POOL_SOURCE_KINDS):
        raise SaltInvocationError(
            f"virt:pool_sources in the minion config must be a mapping of {', '.join(POOL_SOURCE_KINDS)} "
            f"(lists of names), got {sources!r}: fix the minion config"
        )
    return {
        "adopt_orphan_disks": validate.to_bool(conf.get("adopt_orphan_disks", False)),
        "pools": None if pool_names is None else names(pool_names, "virt:pools"),
        "host_devices": names(conf.get("host_devices") or [], "virt:host_devices"),
        "trusted_images": names(conf.get("insecure_trusted_images") or [], "virt:insecure_trusted_images"),
        "allowed_paths": allowed,
        "pool_paths": allowed if pool_paths is None else validate.allowed_paths(pool_paths, "virt:pool_paths"),
        "pool_sources": {
            kind: names(sources.get(kind) or [], f"virt:pool_sources:{kind}") for kind in POOL_SOURCE_KINDS
        },
        "serial_tcp_ports": _port_range(conf.get("serial_tcp_ports")),
        "serial_tcp_listen": names(conf.get("serial_tcp_listen", DEFAULT_SERIAL_LISTEN), "virt:serial_tcp_listen"),
        "firmware": validate.allowed_paths(conf.get("firmware") or [], "virt:firmware"),
    }


def _port_range(value):
    """``virt:serial_tcp_ports``: ``"low-high"``, ``[low, high]`` or one port; None (unset): no TCP serials."""
    if value in (None, "", [], False):
        return None
    parts = value.split("-", 1) if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    try:
        low, high = (int(str(parts[0]).strip()), int(str(parts[-1]).strip())) if len(parts) in (1, 2) else (0, 0)
    except ValueError:
        low = high = 0
    if isinstance(value, bool) or not 1024 <= low <= high <= 65535:
        raise SaltInvocationError(
            f"virt:serial_tcp_ports in the minion config must be a port range like '4600-4699' (ports 1024-65535), "
            f"got {value!r}: fix the minion config"
        )
    return low, high
