"""The arguments of Salt's storage pool calls, declared once: ``virt.pool_define`` / ``pool_update``
(``_modules/virt_storage.py``) and the ``virt.pool_defined`` / ``pool_running`` states
(``_states/virt_storage.py``).

Each :class:`Arg` is one argument of the pool's definition: its name and default (the same in both functions
and in :func:`saltvirt.xml.poolxml.pool_spec`, which checks it), what it takes, and Salt's spelling in the
states, which give a pool's sources as one ``source`` mapping (``source: {devices: ...}`` for
``source_devices=``). Each function's own arguments are in :data:`CALLS` and :data:`STATE_CALLS`.
tests/unit/model/test_poolargs.py checks every signature against the table and takes each argument through
the real loaders into libvirt.

Adding an argument: a row here, its parameter in ``poolxml.pool_spec`` (same default) and in the two
functions, and its handling in ``poolxml``; a source one reaches the states through ``source``.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import Data


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    default: object
    takes: str  # what it takes, in words
    source: str | None = None  # its key in the states' ``source`` mapping (None: a state parameter of this name)


ARGS = (
    Arg("ptype", "dir", "dir, fs, netfs, logical, disk, iscsi, iscsi-direct, scsi, mpath, rbd, gluster or zfs"),
    Arg("target", None, "the absolute path of the pool's directory or devices"),
    Arg("permissions", None, "{mode, owner, group, label} of the target"),
    Arg("source_devices", None, "[{path, part_separator}]", "devices"),
    Arg("source_dir", None, "a directory of the source host (a share name for cifs)", "dir"),
    Arg("source_initiator", None, "an iSCSI IQN (iqn.YYYY-MM.domain:name)", "initiator"),
    Arg("source_adapter", None, "{type, name, parent, managed, parent_wwnn, parent_wwpn, parent_fabric_wwn, wwnn, "
        "wwpn, parent_address: {unique_id, address: {domain, bus, slot, function}}}", "adapter"),
    Arg("source_hosts", None, "['host[:port]']", "hosts"),
    Arg("source_auth", None, "{type, username, secret: {type: uuid|usage, value}}, or {username, password} (the "
        "password kept in a libvirt secret; the base64 ceph key for rbd)", "auth"),
    Arg("source_name", None, "the source's name (volume group, zpool, rbd pool, gluster volume)", "name"),
    Arg("source_format", None, "the source's format (a filesystem, cifs, a partition table, ...)", "format"),
)  # fmt: skip
BY_NAME = {a.name: a for a in ARGS}
NAMES = tuple(a.name for a in ARGS)  # the functions' parameters after name, in their order
SOURCE = {a.source: a.name for a in ARGS if a.source}  # the states' source key -> the argument
# each execution function's own arguments (and defaults) after the table's
CALLS: dict[str, dict[str, Any]] = {
    "virt.pool_define": {"transient": False, "start": True, "autostart": False, "connection": None},
    "virt.pool_update": {"test": False, "connection": None},
}
STATES = ("virt.pool_defined", "virt.pool_running")
# the states' parameters after name: the table's own ones, Salt's source mapping, then the states' own
STATE_PARAMS = (*(a.name for a in ARGS if not a.source), "source")
STATE_CALLS: dict[str, Any] = {
    "transient": False,
    "autostart": True,
    "connection": None,
    "username": None,
    "password": None,
}


def from_source(source: Mapping[str, Any] | None) -> Data:
    """The states' ``source`` mapping (Salt's ``{devices, dir, hosts, ...}``) as the functions'
    ``source_*`` arguments (every one, None when not given); an unknown key is refused."""
    source = source or {}
    unknown = sorted(set(source) - set(SOURCE))
    if unknown:
        raise SaltInvocationError(f"unknown source key(s) {', '.join(unknown)}: use {', '.join(SOURCE)}")
    return {name: source.get(key) for key, name in SOURCE.items()}
