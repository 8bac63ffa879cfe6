"""
Execution module ``virt`` (continued): storage pools and volumes (``saltvirt.storage.poolcalls``), and
``image_warm`` (an image fetched and imported before the first ``virt.init`` needs it).
"""

import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltInvocationError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{modules,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    from saltvirt.base import config as _config
    from saltvirt.base import install as _install
    from saltvirt.base import operators as _operators
    from saltvirt.base import switches
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.host import conn as _c
    from saltvirt.host import netpool as _np
    from saltvirt.model import compat
    from saltvirt.model import poolargs as _pa
    from saltvirt.storage import poolcalls as _pc
    from saltvirt.storage import pools as _st
    from saltvirt.storage import saltcache as _saltcache
    from saltvirt.vm import provision as _provision
    from saltvirt.xml import poolxml as _px

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    if _c.libvirt is None:
        return False, f"virt: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    return __virtualname__


def _conn(connection=None, kwargs=None):
    return _c.salt_connect_compat(__salt__, connection, kwargs)


def _limits():
    """The operator's limits on what a call may define (minion config only): ``saltvirt.storage.poollimits``."""
    return {"settings": switches.operator_settings(__opts__), "images_dir": _c.salt_images_dir(__salt__)}


def image_warm(image, saltenv="base", checksum=None, allow_http=False, trusted_image=False, connection=None, **kwargs):
    """
    Fetch ``image`` (``salt://``, ``https://`` or a local path, through the same checks as ``virt.init``:
    ``checksum``, format, ``virt:max_image_mib``, ``virt:allowed_paths``) and import it as the base
    overlays back onto, so that every later ``virt.init`` of it is the cached case (no fetch, no check,
    no copy on the VM's path). Also asks libvirt what ``virt.init`` asks it first (the domain type: a
    libvirtd's first capabilities probe takes seconds). Idempotent: a warm image costs a stat. Returns
    ``path`` (the cached file), ``base`` (the imported base, None for a local path, used in place),
    ``format``, ``checksum``, ``type`` (the domain type ``virt.init`` will use), ``seconds``.

    CLI Example:: salt 'hyper*' virt.image_warm salt://images/debian-12-minion.qcow2
    """
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    if kwargs:
        raise SaltInvocationError(f"virt.image_warm: unknown argument(s) {', '.join(sorted(kwargs))}")
    compat.refuse_operator_switches({"allow_http": allow_http, "trusted_image": trusted_image})
    get = _c.salt_config(__salt__)
    with _conn(connection) as conn:
        return _provision.warm(
            image,
            images_dir=_c.salt_images_dir(__salt__),
            cache_file=_saltcache.salt_files(__opts__, saltenv),
            conn=conn,
            vtype=get("virt:type", None),
            allowed_paths=_config.virt_conf(__opts__).get("allowed_paths") or (),
            checksum=checksum,
            allow_http=_bool(get("virt:insecure_http_images", False)),
            max_image_mib=get("virt:max_image_mib", None),
            trusted=isinstance(image, str) and image in (get("virt:insecure_trusted_images", None) or ()),
            image_sources=get("virt:image_sources", None),
        )


def _spec(name, values, require=True):
    """The one pool spec (saltvirt.xml.poolxml) from this module's arguments: ``values`` those of
    ``saltvirt.model.poolargs.NAMES`` in the signature's order."""
    return _px.pool_spec(name, **dict(zip(_pa.NAMES, values, strict=True)), require=require)


# the arguments' reference, from saltvirt.model.poolargs' table
_SOURCE_DOC = "Arguments: " + "; ".join(
    f"``{a.name}``: {a.takes}" for a in (_pa.ARGS if saltvirt is not None else ()) if a.name != "ptype"
)


def pool_define(
    name,
    ptype="dir",
    target=None,
    permissions=None,
    source_devices=None,
    source_dir=None,
    source_initiator=None,
    source_adapter=None,
    source_hosts=None,
    source_auth=None,
    source_name=None,
    source_format=None,
    transient=False,
    start=True,
    autostart=False,
    connection=None,
    **kwargs,
):
    """
    Define a storage pool of type ``ptype``: dir, fs, netfs, logical, disk, iscsi, iscsi-direct, scsi,
    mpath, rbd, gluster or zfs. Sources as in Salt's virt.pool_define (see pool_update). ``transient``: a
    running pool that disappears once stopped. ``start`` (default True): build what the pool needs on
    empty devices only (directory, volume group, partition table) and start it. Returns True.
    Only where the operator allows (minion config): a target directory inside ``virt:pool_paths``,
    devices, volume groups, servers and adapters listed in ``virt:pool_sources``.

    CLI Example::

        salt 'hyper1' virt.pool_define images dir target=/srv/salt-images autostart=True
        salt 'hyper1' virt.pool_define vg0 logical source_devices="[{path: /dev/sdb}]"
        salt 'hyper1' virt.pool_define myshare netfs source_format=cifs source_dir=samba_share \\
            source_hosts="['example.com']" target=/mnt/cifs
    """
    spec = _spec(
        name,
        (ptype, target, permissions, source_devices, source_dir, source_initiator, source_adapter, source_hosts)
        + (source_auth, source_name, source_format),
    )
    with _conn(connection, kwargs) as conn:
        _pc.define_pool(conn, spec, transient=_bool(transient), start=_bool(start), **_limits())
        if _bool(autostart) and not _bool(transient):
            _np.set_autostart(conn, "pool", name, True)
        return True


def pool_update(
    name,
    ptype="dir",
    target=None,
    permissions=None,
    source_devices=None,
    source_dir=None,
    source_initiator=None,
    source_adapter=None,
    source_hosts=None,
    source_auth=None,
    source_name=None,
    source_format=None,
    test=False,
    connection=None,
    **kwargs,
):
    """
    Redefine a pool when what is given differs from its definition (uuid and what is not given are
    kept; a running pool uses the new definition after a restart). Returns whether it (would have)
    changed. Sources and what the operator allows: see pool_define (only what changes is checked).

    CLI Example:: salt 'hyper1' virt.pool_update images dir target=/srv/images2 test=True
    """
    spec = _spec(
        name,
        (ptype, target, permissions, source_devices, source_dir, source_initiator, source_adapter, source_hosts)
        + (source_auth, source_name, source_format),
        require=False,
    )
    with _conn(connection, kwargs) as conn:
        return _pc.update_pool(conn, spec, test=_bool(test), **_limits())


for _fun in (pool_define, pool_update):
    if _fun.__doc__:  # None under python -OO
        _fun.__doc__ += _SOURCE_DOC


def pool_capabilities(connection=None, **kwargs):
    """
    The storage pool types this host supports and their formats: {computed, pool_types: [{name,
    supported, options}]} (``computed``: the driver cannot tell, every known type is listed).

    CLI Example:: salt 'hyper1' virt.pool_capabilities
    """
    with _conn(connection, kwargs) as conn:
        return _st.capabilities(conn)


def pool_start(name, build=True, connection=None, **kwargs):
    """Start a defined pool (``build``: first make what it needs on empty devices: directory, volume
    group, partition table; only for a pool within the operator's limits, see pool_build: another one
    starts as it is, and a start that fails says why it was not built).

    CLI Example:: salt 'hyper1' virt.pool_start images
    """
    with _conn(connection, kwargs) as conn:
        return {"name": name, "started": _pc.start_pool(conn, name, build=_bool(build), **_limits())}


def pool_build(name, connection=None, **kwargs):
    """Build a defined pool: its target directory, volume group or partition table (libvirt refuses
    devices holding data). Only a pool within the operator's limits (minion config): its target
    directory inside ``virt:pool_paths``, its devices, volume group, servers, adapters listed in
    ``virt:pool_sources``. Returns True.

    CLI Example:: salt 'hyper1' virt.pool_build vg0
    """
    with _conn(connection, kwargs) as conn:
        return _pc.build_pool(conn, name, **_limits())


def pool_stop(name, connection=None, **kwargs):
    """Stop a running pool (its volumes stay). A transient pool is gone once stopped: only one within
    the operator's limits (see pool_build).

    CLI Example:: salt 'hyper1' virt.pool_stop images
    """
    with _conn(connection, kwargs) as conn:
        return {"name": name, "stopped": _pc.stop_pool(conn, name, **_limits())}


def pool_undefine(name, connection=None, **kwargs):
    """Stop and remove a pool definition (its volumes stay; the libvirt secret virt.pool_define made for
    its source_auth goes). Only a pool within the operator's limits (see pool_build): a call removes only
    what a call could define again.

    CLI Example:: salt 'hyper1' virt.pool_undefine images
    """
    with _conn(connection, kwargs) as conn:
        return {"name": name, "undefined": _pc.undefine_pool(conn, name, **_limits())}


def pool_delete(name, fast=True, connection=None, **kwargs):
    """Delete what building a stopped pool made: its (empty) target directory, its volume group or zpool
    with every volume in it. ``fast=False`` (Salt's): libvirt zeroes the data first, where the pool type
    can. Only a pool within the operator's limits (see pool_build), and none of whose volumes a domain
    uses (defined or running), an image or volume outside it backs onto, or a VM owns. Returns True.

    CLI Example:: salt 'hyper1' virt.pool_delete images
    """
    with _conn(connection, kwargs) as conn:
        return _pc.delete_pool(conn, name, fast=_bool(fast), **_limits())


def pool_refresh(name, connection=None, **kwargs):
    """Rescan a running pool's volumes. Returns True.

    CLI Example:: salt 'hyper1' virt.pool_refresh images
    """
    with _conn(connection, kwargs) as conn:
        return _st.refresh_pool(conn, name)


def pool_set_autostart(name, state="on", connection=None, **kwargs):
    """Start the pool with the host (``state``: on, anything else off). Returns True.

    CLI Example:: salt 'hyper1' virt.pool_set_autostart images on
    """
    with _conn(connection, kwargs) as conn:
        _np.set_autostart(conn, "pool", name, state == "on" or state is True)
        return True


def pool_info(name=None, connection=None, **kwargs):
    """{name: {uuid, state, type, target_path, capacity, allocation, free, autostart, persistent, ...}} of
    one pool or all (Salt's keys, plus target, active, available, source, permissions); ``{}`` for a pool
    that is not defined, as Salt.

    CLI Example:: salt 'hyper1' virt.pool_info
    """
    with _conn(connection, kwargs) as conn:
        return _st.pool_info(conn, name)


def pool_get_xml(name, connection=None, **kwargs):
    """The pool's XML definition.

    CLI Example:: salt 'hyper1' virt.pool_get_xml images
    """
    with _conn(connection, kwargs) as conn:
        return _np.get(conn, "pool", name).XMLDesc(0)


def list_pools(connection=None, **kwargs):
    """Names of all storage pools.

    CLI Example:: salt 'hyper1' virt.list_pools
    """
    with _conn(connection, kwargs) as conn:
        return sorted(p.name() for p in conn.listAllStoragePools(0))


def pool_list_volumes(name, connection=None, **kwargs):
    """Volume names in a running pool.

    CLI Example:: salt 'hyper1' virt.pool_list_volumes images
    """
    with _conn(connection, kwargs) as conn:
        return _np.list_volumes(conn, name)


# volumes ------------------------------------------------------------------------------------------
def volume_infos(pool=None, volume=None, connection=None, **kwargs):
    """{pool: {volume: {type, key, path, capacity, allocation, used_by, backing_store, format}}} of the
    running pools (one pool, one volume, or all).

    CLI Example:: salt 'hyper1' virt.volume_infos images web1-data
    """
    with _conn(connection, kwargs) as conn:
        return _st.volume_infos(conn, pool, volume)


def volume_define(
    pool,
    name,
    size,
    allocation=0,
    format=None,  # pylint: disable=redefined-builtin
    type=None,  # pylint: disable=redefined-builtin
    permissions=None,
    backing_store=None,
    nocow=False,
    connection=None,
    **kwargs,
):
    """
    Create a volume of ``size`` MiB (``allocation`` MiB allocated now) in a running pool; ``format``
    (qcow2, raw, ...; see pool_capabilities), ``backing_store``: {path, format} (the format is
    mandatory: never guessed, and must be what is on it: raw, or qcow2 with nothing outside itself). The
    backing store lies in ``virt:images``, ``virt:allowed_paths`` or a pool of ``virt:pools`` and is no
    VM's disk, unless the operator lists it in ``virt:insecure_trusted_images``. An existing volume of that
    name is an error. Returns True.

    CLI Example:: salt 'hyper1' virt.volume_define default myvm.qcow2 8192 format=qcow2 \\
        backing_store="{path: /srv/base.img, format: raw}"
    """
    spec = _px.volume_spec(name, size, allocation, format, type, permissions, backing_store, nocow)
    with _conn(connection, kwargs) as conn:
        return _pc.define_volume(conn, pool, spec, **_limits())


def volume_delete(pool, volume, connection=None, **kwargs):
    """Delete a volume of a running pool. Only from a pool VMs may attach from (minion config
    ``virt:pools``), and not a volume a domain uses (defined or running, as a disk or in a backing chain),
    another image or volume backs onto, or a VM owns. Returns True.

    CLI Example:: salt 'hyper1' virt.volume_delete images web1-data
    """
    with _conn(connection, kwargs) as conn:
        return _pc.delete_volume(conn, pool, volume, **_limits())


def volume_upload(pool, volume, file, offset=0, length=0, sparse=False, connection=None, **kwargs):
    """Write the local ``file`` into a volume at byte ``offset`` (``length`` bytes, 0: all of it).
    The file lies in ``virt:allowed_paths`` (or ``virt:images``) and is no VM's disk; the volume is in a
    pool VMs may attach from (``virt:pools``) and no VM's disk. Returns True.

    CLI Example:: salt 'hyper1' virt.volume_upload images web1-data /srv/data.img
    """
    with _conn(connection, kwargs) as conn:
        return _pc.upload_volume(conn, pool, volume, file, offset=offset, length=length, sparse=sparse, **_limits())


def define_vol_xml_str(xml, pool=None, connection=None, **kwargs):
    """Create a volume from its XML in ``pool`` (default: config ``virt:storagepool``, else ``default``).
    Returns True.

    CLI Example:: salt 'hyper1' virt.define_vol_xml_str "<volume>...</volume>" pool=images
    """
    pool = pool or _c.salt_config(__salt__)("virt:storagepool", "default")
    with _conn(connection, kwargs) as conn:
        _st.create_volume_xml(conn, pool, xml)
        return True


def define_vol_xml_path(path, pool=None, connection=None, **kwargs):
    """Like define_vol_xml_str, the XML read from the file ``path`` on the minion.

    CLI Example:: salt 'hyper1' virt.define_vol_xml_path /srv/vol.xml pool=images
    """
    try:
        with open(path, encoding="utf-8") as fh:
            xml = fh.read()
    except OSError as exc:
        raise SaltInvocationError(f"cannot read {path}: {exc.strerror}") from None
    return define_vol_xml_str(xml, pool=pool, connection=connection, **kwargs)


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
