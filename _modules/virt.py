"""
Manage libvirt/KVM hypervisors: VM lifecycle, queries, host facts, networks, pools, migration.

The logic lives in the ``saltvirt`` library (``_utils/saltvirt``); this module is the Salt face of it.

Configuration (minion config, grains or pillar, read with ``config.get``)::

    virt:
      connection:
        uri: qemu:///system      # default: libvirt's default URI; every function takes connection=
      type: qemu                 # force the domain type; default: kvm if KVM really works, else qemu
      images: /srv/salt-images   # one directory per VM below it
      nic: {default: [...]}      # NIC profiles   (see saltvirt.spec)
      disk: {default: [...]}     # disk profiles
"""

import contextlib
import logging
import os
import sys

from salt.exceptions import SaltInvocationError

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
    from saltvirt import conn as _c
    from saltvirt import hosttype, lifecycle, provision, query
    from saltvirt.spec import DEFAULT_IMAGES_DIR

log = logging.getLogger(__name__)
__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, "virt: the saltvirt library is missing (run saltutil.sync_all, or pip install salt-virt)"
    if _c.libvirt is None:
        return False, "virt: the libvirt python bindings are not installed (pip install libvirt-python)"
    return __virtualname__


# helpers ------------------------------------------------------------------------------------------
def _cfg(key, default=None):
    return __salt__["config.get"](key, default)


@contextlib.contextmanager
def _conn(connection=None):
    with _c.connect(_c.resolve_uri(_cfg, connection)) as conn:
        yield conn


def _images_dir():
    return _cfg("virt:images", DEFAULT_IMAGES_DIR) or DEFAULT_IMAGES_DIR


def _progress(name):
    def send(step, **data):
        try:
            __salt__["event.send"](f"salt/virt/init/{name}/{step}", dict(data, vm=name, host=__grains__.get("id")))
        except Exception:  # noqa: BLE001 - progress events are best effort (e.g. masterless)
            log.debug("could not send progress event %s for %s", step, name)

    return send


# lifecycle ----------------------------------------------------------------------------------------
def init(
    name,
    cpu,
    mem,
    image=None,
    nic="default",
    disk="default",
    disks=None,
    interfaces=None,
    enable_qcow=False,
    enable_vnc=False,
    graphics=None,
    boot=None,
    start=True,
    seed=True,
    seed_cmd="seed.apply",
    seed_backend="auto",
    saltenv="base",
    pub_key=None,
    priv_key=None,
    master=None,
    minion_id=None,
    minion_config=None,
    vtype=None,
    serial_log=True,
    group=None,
    connection=None,
    **kwargs,
):
    """
    Create a VM from an image: clone it (full copy, or a qcow2 overlay with ``enable_qcow=True``) into
    ``virt:images/<name>/``, seed it before its first boot with a minion config (id, master) and keys,
    define it, and start it once seeding has finished and the image is flushed.

    name
        VM name (letters, digits, ``.``, ``_``, ``-``); also the new minion's id unless ``minion_id``.
    cpu / mem
        vCPUs and memory in MiB.
    image
        ``salt://...`` (cached with cp.cache_file), ``http(s)://...`` or an absolute path on the hypervisor.
    nic / disk
        profile names from ``virt:nic`` / ``virt:disk`` (``default``: one virtio NIC on bridge br0 and
        one system disk from the image); ``interfaces`` / ``disks`` add or override entries by name.
    enable_vnc / graphics
        a VNC console (listen 127.0.0.1, autoport) / ``{type, listen, port, password}``.
    boot
        ``{kernel, initrd, cmdline}`` for direct kernel boot.
    seed / seed_backend
        write minion config and keys into the image before boot (``auto``: libguestfs, qemu-nbd,
        qemu-storage-daemon FUSE export, loop mount; the one used is reported).
    pub_key / priv_key
        the new minion's key pair (the ``virt.init`` runner pre-accepts it on the master); without
        them a key pair is generated and left for ``salt-key -a``.
    start
        start the VM after seeding.
    group
        anti-affinity group (stored in the domain metadata; the runner never places two VMs of one
        group on the same host).
    vtype
        ``kvm`` or ``qemu``; default ``virt:type`` or what the host can really run.

    CLI Example:

    .. code-block:: bash

        salt 'hyper*' virt.init centos1 2 512 image=/var/lib/libvirt/images/centos.img
        salt 'hyper*' virt.init web1 2 1024 image=salt://images/web.qcow2 enable_qcow=True enable_vnc=True
    """
    if seed_cmd not in ("seed.apply", None, ""):
        log.warning("virt.init: seed_cmd=%s is ignored; salt-virt seeds with its own backends", seed_cmd)
    unknown = sorted(k for k in kwargs if not k.startswith("__"))
    if unknown:
        raise SaltInvocationError(f"virt.init: unknown argument(s) {', '.join(unknown)}")
    spec_args = {key: value for key, value in locals().items() if key in provision.SPEC_ARGS}
    with _conn(connection) as conn:
        return provision.init(
            conn,
            name,
            cpu,
            mem,
            image,
            images_dir=_images_dir(),
            profiles={"nic": _cfg("virt:nic", {}), "disk": _cfg("virt:disk", {})},
            cache_file=lambda url: __salt__["cp.cache_file"](url, saltenv),
            vtype=vtype or _cfg("virt:type", None),
            start=start,
            seed=seed,
            seed_backend=seed_backend,
            minion_id=minion_id,
            master=master or __opts__.get("master"),
            pub_key=pub_key,
            priv_key=priv_key,
            minion_config=minion_config,
            pki_dir=__opts__.get("pki_dir"),
            progress=_progress(name),
            **spec_args,
        )


def start(name, connection=None):
    """Start a defined VM.

    CLI Example:: salt '*' virt.start web1
    """
    with _conn(connection) as conn:
        return lifecycle.start(conn, name)


def stop(name, timeout=0, connection=None):
    """
    Gracefully shut a VM down (ACPI power button); ``timeout`` seconds to wait for it. For a hard
    power-off use ``virt.destroy`` (alias ``virt.force_off``).

    CLI Example:: salt '*' virt.stop web1 timeout=60
    """
    with _conn(connection) as conn:
        return lifecycle.shutdown(conn, name, timeout)


def shutdown(name, timeout=0, connection=None):
    """Same as ``virt.stop``: ask the guest to shut down.

    CLI Example:: salt '*' virt.shutdown web1
    """
    return stop(name, timeout, connection)


def destroy(name, connection=None):
    """Hard power-off (pull the plug). The VM stays defined and its disks stay.

    CLI Example:: salt '*' virt.destroy web1
    """
    with _conn(connection) as conn:
        return lifecycle.destroy(conn, name)


def force_off(name, connection=None):
    """Alias of ``virt.destroy``.

    CLI Example:: salt '*' virt.force_off web1
    """
    return destroy(name, connection)


def reboot(name, connection=None):
    """Ask the guest to reboot.

    CLI Example:: salt '*' virt.reboot web1
    """
    with _conn(connection) as conn:
        return lifecycle.reboot(conn, name)


def reset(name, connection=None):
    """Hard reset (press the reset button).

    CLI Example:: salt '*' virt.reset web1
    """
    with _conn(connection) as conn:
        return lifecycle.reset(conn, name)


def pause(name, connection=None):
    """Pause a running VM.

    CLI Example:: salt '*' virt.pause web1
    """
    with _conn(connection) as conn:
        return lifecycle.pause(conn, name)


def resume(name, connection=None):
    """Resume a paused VM.

    CLI Example:: salt '*' virt.resume web1
    """
    with _conn(connection) as conn:
        return lifecycle.resume(conn, name)


def undefine(name, connection=None):
    """Remove a VM's definition; its disks stay (see ``virt.purge``).

    CLI Example:: salt '*' virt.undefine web1
    """
    with _conn(connection) as conn:
        return lifecycle.undefine(conn, name)


def purge(name, connection=None, **kwargs):
    """
    Power off and undefine a VM, and delete the disk files salt-virt created for it (recorded in
    ``virt:images/<name>/.salt-virt.json`` with the VM's UUID). Anything else — backing images, shared
    directories, disks it did not create — is kept and listed under ``kept`` with the reason.

    CLI Example:: salt '*' virt.purge web1
    """
    with _conn(connection) as conn:
        return provision.purge(conn, name, images_dir=_images_dir())


def set_autostart(name, state="on", connection=None):
    """Start the VM when the host boots (``state=on``) or not (``off``).

    CLI Example:: salt '*' virt.set_autostart web1 on
    """
    with _conn(connection) as conn:
        return lifecycle.set_autostart(conn, name, state not in ("off", False, "false", "no", 0))


def setmem(name, mem, config=True, connection=None):
    """Set memory in MiB: live where possible and in the persistent config.

    CLI Example:: salt '*' virt.setmem web1 1024
    """
    with _conn(connection) as conn:
        return lifecycle.setmem(conn, name, mem, config=config)


def setvcpus(name, cpu, config=True, connection=None):
    """Set the number of vCPUs: live where possible and in the persistent config.

    CLI Example:: salt '*' virt.setvcpus web1 4
    """
    with _conn(connection) as conn:
        return lifecycle.setvcpus(conn, name, cpu, config=config)


def define_xml_str(xml, connection=None):
    """Define a VM from a libvirt domain XML string.

    CLI Example:: salt '*' virt.define_xml_str '<domain type="qemu">...</domain>'
    """
    with _conn(connection) as conn:
        return lifecycle.define_xml_str(conn, xml)


def define_xml_path(path, connection=None):
    """Define a VM from a domain XML file on the minion.

    CLI Example:: salt '*' virt.define_xml_path /tmp/web1.xml
    """
    with open(path, encoding="utf-8") as fh:
        return define_xml_str(fh.read(), connection)


# queries ------------------------------------------------------------------------------------------
def list_domains(connection=None):
    """Names of all defined VMs.

    CLI Example:: salt '*' virt.list_domains
    """
    with _conn(connection) as conn:
        return query.list_domains(conn)


def list_active_vms(connection=None):
    """Names of running (active) VMs.

    CLI Example:: salt '*' virt.list_active_vms
    """
    with _conn(connection) as conn:
        return query.list_domains(conn, "active")


def list_inactive_vms(connection=None):
    """Names of defined but inactive VMs.

    CLI Example:: salt '*' virt.list_inactive_vms
    """
    with _conn(connection) as conn:
        return query.list_domains(conn, "inactive")


def vm_info(vm_=None, connection=None):
    """
    State, cpu, memory, disks (file, format, size), NICs (MAC, source, model) and graphics of one VM,
    or of all.

    CLI Example:: salt '*' virt.vm_info web1
    """
    with _conn(connection) as conn:
        return query.vm_info(conn, vm_)


def vm_state(vm_=None, connection=None):
    """``{name: state}`` for one VM or all.

    CLI Example:: salt '*' virt.vm_state web1
    """
    with _conn(connection) as conn:
        return query.vm_state(conn, vm_)


def full_info(connection=None):
    """Host facts plus ``vm_info`` of every VM, in one connection and one bulk stats call.

    CLI Example:: salt '*' virt.full_info
    """
    with _conn(connection) as conn:
        return query.full_info(conn, _images_dir())


def get_xml(vm_, inactive=False, connection=None):
    """The VM's libvirt XML (``inactive=True``: the persistent definition).

    CLI Example:: salt '*' virt.get_xml web1
    """
    with _conn(connection) as conn:
        return lifecycle.get_xml(conn, vm_, inactive)


def get_nics(vm_, connection=None):
    """``{mac: {type, source, model, target}}`` of a VM.

    CLI Example:: salt '*' virt.get_nics web1
    """
    return vm_info(vm_, connection)[vm_]["nics"]


def get_macs(vm_, connection=None):
    """MAC addresses of a VM's NICs.

    CLI Example:: salt '*' virt.get_macs web1
    """
    return sorted(get_nics(vm_, connection))


def get_disks(vm_, connection=None):
    """``{target: {file, format, virtual_size, allocation, backing_file, ...}}`` of a VM.

    CLI Example:: salt '*' virt.get_disks web1
    """
    return vm_info(vm_, connection)[vm_]["disks"]


def get_graphics(vm_, connection=None):
    """The VM's console: ``{type, listen, port, autoport, address: 'host:port'}`` or None.

    CLI Example:: salt '*' virt.get_graphics web1
    """
    return vm_info(vm_, connection)[vm_]["graphics"]


# host ---------------------------------------------------------------------------------------------
def node_info(connection=None):
    """CPU model, count and speed, memory and NUMA layout of the hypervisor.

    CLI Example:: salt '*' virt.node_info
    """
    with _conn(connection) as conn:
        return query.node_info(conn)


def host_info(connection=None):
    """Capacity and usage (memory, vCPUs, VMs, free space in ``virt:images``) — what placement uses.

    CLI Example:: salt '*' virt.host_info
    """
    with _conn(connection) as conn:
        return query.host_info(conn, _images_dir())


def freemem(connection=None):
    """MiB of memory not given to running VMs.

    CLI Example:: salt '*' virt.freemem
    """
    with _conn(connection) as conn:
        return query.freemem(conn)


def freecpu(connection=None):
    """Host CPUs minus vCPUs of running VMs.

    CLI Example:: salt '*' virt.freecpu
    """
    with _conn(connection) as conn:
        return query.freecpu(conn)


def get_hypervisor(connection=None):
    """The domain type new VMs get here (``kvm`` or ``qemu``) and why.

    CLI Example:: salt '*' virt.get_hypervisor
    """
    with _conn(connection) as conn:
        return hosttype.detect(conn, _cfg("virt:type", None))


def virt_type(connection=None):
    """``kvm`` or ``qemu``: see ``virt.get_hypervisor``.

    CLI Example:: salt '*' virt.virt_type
    """
    return get_hypervisor(connection)["type"]


def capabilities(connection=None):
    """libvirt's host capabilities XML.

    CLI Example:: salt '*' virt.capabilities
    """
    with _conn(connection) as conn:
        return conn.getCapabilities()


# migrate ------------------------------------------------------------------------------------------
# Moving VMs between hypervisors (saltvirt.migrate). ``salt-run virt.migrate`` / ``virt.evacuate``
# (saltvirt.relocate) drive the helpers below on the source and the target hypervisor.
if saltvirt is not None:
    from saltvirt import migrate as _migrate
    from saltvirt.validate import to_bool as _bool


def migrate(
    name,
    target,
    live=True,
    tunnel=None,
    copy_storage=None,
    offline=False,
    max_downtime=None,
    max_bandwidth=None,
    target_uri=None,
    transport=None,
    unsafe=False,
    disk_map=None,
    migrate_disks=None,
    verify_backing=None,
    connection=None,
):
    """
    Move a VM from this hypervisor to ``target``: live while it runs (its guest keeps running), offline
    (definition only) when it is stopped. Peer to peer: this hypervisor's libvirtd connects to the
    target's itself (for TLS with its own client certificate). Afterwards the VM is defined on the
    target and undefined here. On failure the error says where the VM is (still here).

    target
        the target hypervisor's host name or address (or a name from ``virt:migration:hosts``).
        The libvirtd connection is ``qemu+tls://<target>/system`` (tunnel / ``transport: tls``) or
        ``qemu+tcp://<target>/system``; ``transport`` (tls/tcp) overrides the configured one,
        ``target_uri`` gives the whole URI verbatim.
    tunnel
        memory through the TLS libvirtd connection (port 16514) instead of a direct QEMU stream to
        ``tcp://<target>``; default ``virt:tunnel``. libvirt cannot tunnel a disk copy: with
        ``copy_storage`` a configured tunnel gives way to a direct stream (reported).
    copy_storage
        ``all`` / ``inc``: also copy the disks (storage not shared). The target needs disk files of
        the right size and format (``inc``: overlays onto the same backing image) at the paths
        ``disk_map`` names: ``salt-run virt.migrate`` prepares them.
    unsafe
        the target sees the same disk files although libvirt does not recognise the filesystem as
        shared (the runner proves it with a probe file first).
    max_downtime / max_bandwidth
        milliseconds the guest may pause at the switch-over / MiB/s for the migration stream.

    Settings (minion config or pillar): ``virt:tunnel``, ``virt:migration: {transport, pkipath,
    uri_template, qemu_tls, hosts}`` (see ``saltvirt.migrate``).

    CLI Example:

    .. code-block:: bash

        salt 'hyper1' virt.migrate web1 hv2
        salt 'hyper1' virt.migrate web1 hv2 tunnel=True max_downtime=500
        salt 'hyper1' virt.migrate db1 hv2.example.com copy_storage=all
    """
    opts = _migrate.settings(_cfg)
    note = None
    if tunnel is None:
        tunnel = opts["tunnel"]
        if tunnel and copy_storage:
            tunnel = False
            note = "virt:tunnel ignored: libvirt cannot tunnel a disk copy, the data went over a direct stream"
    with _conn(connection) as conn:
        ret = _migrate.migrate(
            conn,
            name,
            opts["hosts"].get(target, target),
            live=_bool(live),
            tunnel=_bool(tunnel),
            copy_storage=copy_storage or None,
            offline=_bool(offline),
            max_downtime=max_downtime,
            max_bandwidth=max_bandwidth,
            target_uri=target_uri,
            transport=transport or opts["transport"],
            pkipath=opts["pkipath"],
            uri_template=opts["uri_template"],
            qemu_tls=opts["qemu_tls"],
            unsafe=_bool(unsafe),
            disk_map=disk_map,
            migrate_disks=migrate_disks,
            verify_backing=verify_backing,
        )
    if note:
        ret["note"] = note
    return ret


def migrate_source_info(name, probe=True, connection=None):
    """
    For ``salt-run virt.migrate``, on the source: the VM's disks (size, format, backing image) and,
    with ``probe``, probe files in its disk directories that only a target sharing that storage sees
    (``virt.migrate_abort_cleanup`` removes them).

    CLI Example:: salt 'hyper1' virt.migrate_source_info web1
    """
    with _conn(connection) as conn:
        return _migrate.source_info(conn, name, _images_dir(), probe=_bool(probe))


def migrate_prepare(name, source, copy_storage=None, connection=None):
    """
    For ``salt-run virt.migrate``, on the target: create disk files for the VM described by ``source``
    (``virt.migrate_source_info`` on the source) where it does not share the source's storage, below
    this hypervisor's ``virt:images``: blank images of the same size and format, or qcow2 overlays onto
    this host's copy of the same backing image. Checks room first and never overwrites a file.

    CLI Example:: salt 'hyper2' virt.migrate_prepare web1 '{...}'
    """
    if not isinstance(source, dict) or source.get("name") != name:
        raise SaltInvocationError(f"source must be virt.migrate_source_info's answer for {name!r}")
    with _conn(connection) as conn:
        ret = _migrate.prepare(conn, source, _images_dir(), copy_storage=copy_storage or None)
    ret["address"] = _migrate.settings(_cfg)["address"] or ret["host"]  # what the source's libvirtd dials
    return ret


def migrate_finish(name, connection=None):
    """
    For ``salt-run virt.migrate``, on the target after the move: the VM as defined here (state,
    disks); the files ``virt.migrate_prepare`` created now belong to it.

    CLI Example:: salt 'hyper2' virt.migrate_finish web1
    """
    with _conn(connection) as conn:
        return _migrate.finish(conn, name, _images_dir())


def migrate_abort_cleanup(name, paths, connection=None):
    """
    After a failed migration: remove the files ``virt.migrate_prepare`` created for ``name`` on this
    host (as its record here lists them) or the probe files ``virt.migrate_source_info`` left. Files
    it did not create, or that a VM here uses, are kept and listed with the reason.

    CLI Example:: salt 'hyper2' virt.migrate_abort_cleanup web1 '[/srv/salt-images/web1/system.qcow2]'
    """
    with _conn(connection) as conn:
        return _migrate.abort_cleanup(conn, name, paths, _images_dir())


# ==================================================================================================
# update, networks and storage pools (saltvirt.converge, saltvirt.netpool): what the virt states use
# ==================================================================================================
def update(name, cpu=None, mem=None, test=False, connection=None, **kwargs):
    """
    Bring an existing VM to the spec ``virt.init`` builds from the same arguments. Only what is given
    is managed: ``cpu``, ``mem``, NICs (``nic``/``interfaces``), disks (``disk``/``disks``: new ones
    blank or an existing ``path``; disks are never removed) and graphics (``enable_vnc``/``graphics``).
    Live where the hypervisor can, always in the definition: ``applied`` says what went live, what
    needs a restart; ``test=True`` returns the changes and the ``plan`` without making them.

    CLI Example:: salt 'hyper1' virt.update web1 cpu=4 mem=2048 enable_vnc=True
    """
    from saltvirt import converge

    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    with _conn(connection) as conn:
        return converge.update(
            conn,
            name,
            images_dir=_images_dir(),
            profiles={"nic": _cfg("virt:nic", {}), "disk": _cfg("virt:disk", {})},
            test=_bool(test),
            cpu=cpu,
            mem=mem,
            **kwargs,
        )


def _netpool():
    from saltvirt import netpool

    return netpool


def network_define(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    autostart=False,
    start=False,
    connection=None,
):
    """
    Define a virtual network (``forward``: nat, route, open, bridge (onto an existing ``bridge``) or
    none; ``ip`` as ADDRESS/PREFIX or ADDRESS with ``netmask``, with an optional DHCP range).

    CLI Example:: salt 'hyper1' virt.network_define isolated forward=none ip=10.50.0.1/24 dhcp_start=10.50.0.10 dhcp_end=10.50.0.99
    """
    np = _netpool()
    spec = np.network_spec(name, bridge, forward, ip, dhcp_start, dhcp_end, netmask=netmask)
    with _conn(connection) as conn:
        np.define(conn, "network", spec)
        if _bool(autostart):
            np.set_autostart(conn, "network", name, True)
        if _bool(start):
            np.start(conn, "network", name)
        return np.info(conn, "network", name)[name]


def network_start(name, connection=None):
    """Start a defined network.

    CLI Example:: salt 'hyper1' virt.network_start isolated
    """
    with _conn(connection) as conn:
        return {"name": name, "started": _netpool().start(conn, "network", name)}


def network_stop(name, connection=None):
    """Stop a running network.

    CLI Example:: salt 'hyper1' virt.network_stop isolated
    """
    with _conn(connection) as conn:
        return {"name": name, "stopped": _netpool().stop(conn, "network", name)}


def network_undefine(name, connection=None):
    """Stop and remove a network definition.

    CLI Example:: salt 'hyper1' virt.network_undefine isolated
    """
    with _conn(connection) as conn:
        return {"name": name, "undefined": _netpool().undefine(conn, "network", name)}


def network_info(name=None, connection=None):
    """``{name: {bridge, forward, ip, dhcp, active, autostart}}`` of one network or all.

    CLI Example:: salt 'hyper1' virt.network_info
    """
    with _conn(connection) as conn:
        return _netpool().info(conn, "network", name)


def list_networks(connection=None):
    """Names of all virtual networks.

    CLI Example:: salt 'hyper1' virt.list_networks
    """
    return sorted(network_info(connection=connection))


def pool_define(name, ptype="dir", target=None, autostart=False, start=False, build=True, connection=None):
    """Define a storage pool (``ptype=dir`` with ``target`` directory; ``build`` creates it on start).

    CLI Example:: salt 'hyper1' virt.pool_define images target=/srv/salt-images start=True autostart=True
    """
    np = _netpool()
    spec = np.pool_spec(name, ptype, target)
    with _conn(connection) as conn:
        np.define(conn, "pool", spec)
        if _bool(autostart):
            np.set_autostart(conn, "pool", name, True)
        if _bool(start):
            np.start(conn, "pool", name, build=_bool(build))
        return np.info(conn, "pool", name)[name]


def pool_start(name, build=True, connection=None):
    """Start a defined pool (``build``: create its directory first).

    CLI Example:: salt 'hyper1' virt.pool_start images
    """
    with _conn(connection) as conn:
        return {"name": name, "started": _netpool().start(conn, "pool", name, build=_bool(build))}


def pool_stop(name, connection=None):
    """Stop a running pool (its files stay).

    CLI Example:: salt 'hyper1' virt.pool_stop images
    """
    with _conn(connection) as conn:
        return {"name": name, "stopped": _netpool().stop(conn, "pool", name)}


def pool_undefine(name, connection=None):
    """Stop and remove a pool definition (its directory and files stay).

    CLI Example:: salt 'hyper1' virt.pool_undefine images
    """
    with _conn(connection) as conn:
        return {"name": name, "undefined": _netpool().undefine(conn, "pool", name)}


def pool_info(name=None, connection=None):
    """``{name: {type, target, active, autostart, capacity, allocation, available}}``.

    CLI Example:: salt 'hyper1' virt.pool_info
    """
    with _conn(connection) as conn:
        return _netpool().info(conn, "pool", name)


def list_pools(connection=None):
    """Names of all storage pools.

    CLI Example:: salt 'hyper1' virt.list_pools
    """
    return sorted(pool_info(connection=connection))


def pool_list_volumes(name, connection=None):
    """Volume names in a running pool.

    CLI Example:: salt 'hyper1' virt.pool_list_volumes images
    """
    with _conn(connection) as conn:
        return _netpool().list_volumes(conn, name)
