"""
Manage libvirt/KVM hypervisors: VM lifecycle, queries, host facts, update.

Migration, networks and storage live in ``virt_migrate.py``, ``virt_network.py`` and
``virt_storage.py``: Salt's loader merges every file whose ``__virtualname__`` is ``virt``.

The logic lives in the ``saltvirt`` library (``_utils/saltvirt``); this module is the Salt face of it.

Configuration: ``virt:`` in the minion config only (``connection``, ``connections``, ``type``,
``images``, ``allowed_paths``, ``max_image_mib``, ``nic``/``disk`` profiles, ...), read with
``saltvirt.host.conn.opts_config`` (``salt_config``'s answers); never grains or pillar. Every key with its
default and meaning: ``docs/configuration.md``; the user guide: ``docs/topics/queries.md``.
"""

import logging
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
    from saltvirt.base import install as _install
    from saltvirt.base import operators as _operators
    from saltvirt.base import switches, validate
    from saltvirt.base.validate import to_bool as _bool
    from saltvirt.guest import keypool
    from saltvirt.host import capacity, guestips, hosttype, lifecycle, query
    from saltvirt.host import conn as _c
    from saltvirt.model import compat, vmargs
    from saltvirt.storage import intake, saltcache
    from saltvirt.vm import progress, provision

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltGrains, SaltOpts

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __grains__: SaltGrains

log = logging.getLogger(__name__)
__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    _install.warn_saltext_virt(log)  # a file_roots install has no entry point to say it
    if _c.libvirt is None:
        return False, f"virt: the libvirt python bindings are not installed: {_install.HYPERVISOR_HINT}"
    try:  # libvirt clients opening the default connection in this minion reach virt:connection's libvirtd
        _c.export_default_uri(_c.salt_config(__salt__))
    except Exception as exc:  # noqa: BLE001 - loading the module must not depend on it; the log says why
        log.warning("virt: could not export virt:connection:uri as LIBVIRT_DEFAULT_URI: %s", exc)
    return __virtualname__


# helpers ------------------------------------------------------------------------------------------
def _config():
    """The operator's ``virt:`` settings, read from ``__opts__`` as ``config.get`` would (no loader call a key)."""
    return _c.opts_config(__opts__, __salt__)


def _cfg(key, default=None):
    return _config()(key, default)


def _conn(connection=None):
    return _c.configured_connect(_config(), connection)


def _images_dir():
    return _c.configured_images_dir(_config())


def _definitions_changed():
    """A definition changed in place (same UUID): ``virt.capacity``'s cached index is stale."""
    capacity.bump(capacity.cache_dir(__opts__))


def _allowed_paths():
    """``virt:allowed_paths`` from the minion config only: never from the call, pillar or grains."""
    return validate.configured_allowed_paths(__opts__)  # minion config only


def _operator():
    """The operator's ``virt:pools``, ``virt:host_devices``, ``virt:adopt_orphan_disks``: minion config only."""
    return switches.operator_settings(__opts__)


def _progress(name):
    """Progress events of one ``virt.init`` (``saltvirt.vm.progress``): one connection, none without a bus."""
    base = {"vm": name, "host": __grains__.get("id")}
    return progress.Progress(__opts__, f"salt/virt/init/{name}", base=base, send=__salt__["event.send"])


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
    checksum=None,
    allow_http=False,
    trusted_image=False,
    cloud_init=None,
    guest_agent=True,
    boot_dev=None,
    os_type=None,
    arch=None,
    stop_on_reboot=False,
    serials=None,
    consoles=None,
    tpm=None,
    clock=None,
    hypervisor_features=None,
    numatune=None,
    host_devices=None,
    owner=None,
    ha=None,
    catalog_image=None,
    watchdog=None,
    rng=None,
    **kwargs,
):
    """
    Create a VM from an image: clone it (full copy, or a qcow2 overlay with ``enable_qcow=True``) into
    ``virt:images/<name>/``, seed it before its first boot with a minion config (id, master) and keys,
    define it, and start it once seeding has finished and the image is flushed.

    name
        VM name (letters, digits, ``.``, ``_``, ``-``); also the new minion's id unless ``minion_id``.
    cpu / mem
        vCPUs and memory in MiB; or Salt's dicts: ``cpu: {maximum, mode: custom|host-model|host-passthrough,
        match, check, model: {name, fallback, vendor_id}, vendor, topology: {sockets, cores, threads},
        features: {vmx: disable}, current: 2, placement: static|auto, cpuset: "0-3", tuning: {vcpupin:
        {0: "0-1"}, emulatorpin, shares, period, quota, ...}, numa: {0: {cpus: "0-1", memory: 1g, memAccess,
        discard}}}`` and ``mem: {boot: 1g, current, max, slots, hard_limit, soft_limit, swap_hard_limit,
        min_guarantee, hugepages: [{size: 2m, nodeset}], nosharepages, locked, source, access, allocation,
        discard}`` (sizes in MiB or 512m/2g); their other keys are refused with the reason.
    image
        ``salt://...`` (Salt's minion cache, by the master's hash), ``https://...`` or an absolute path on the
        hypervisor inside ``virt:images`` or a directory of ``virt:allowed_paths`` (minion config; also for
        ``disks: [{image: ...}]``; ``trusted_image`` does not lift this).
        Only raw and qcow2 images without a backing file or external data file are accepted (the
        format is read from the header and passed to qemu, never guessed); a download stops at
        ``virt:max_image_mib`` MiB (default 65536).
    checksum
        ``sha256:<hex>`` or ``sha512:<hex>``: verified before the image is used (any source).
    allow_http / trusted_image
        operator switches, refused as call arguments: the minion config's ``virt:insecure_http_images:
        True`` accepts plain ``http://`` image URLs (an https URL never follows a redirect to http);
        ``virt:insecure_trusted_images: [<absolute path>, ...]`` accepts those local images as they are
        (backing files, data files, other formats). Never for salt:// or URLs.
    nic / disk
        profile names from ``virt:nic`` / ``virt:disk`` (``default``: one virtio NIC on bridge br0 and
        one system disk from the image); ``interfaces`` / ``disks`` add or override entries by name.
    enable_vnc / graphics
        a VNC console (listen 127.0.0.1, autoport) / ``{type, listen, port, password}``.
    boot
        ``{kernel, initrd, cmdline}`` for direct kernel boot. Kernel, initrd, ``disks[].path`` and
        ``serial_log`` must be inside ``virt:images`` (serial logs also in libvirt's log directory)
        or a directory the operator lists in ``virt:allowed_paths`` in the minion config.
        UEFI: ``{efi: True}`` (libvirt picks the distribution's OVMF), ``{loader: <OVMF code>, nvram:
        <variables template>}`` (paths inside virt:images, virt:allowed_paths, /usr/share/OVMF or
        /usr/share/qemu), ``secure_boot: True`` (OVMF's secure-boot build with enrolled keys, q35, SMM).
    boot_dev
        boot order without a kernel, Salt's ``"hd cdrom network"`` (also ``fd``); default ``hd``.
    os_type / arch
        ``hvm`` / the host's architecture only (Salt's values; anything else is refused).
    stop_on_reboot
        the VM stops instead of rebooting (``<on_reboot>destroy``).
    serials / consoles
        extra serial ports (after the logged serial console on port 0) / virtio consoles: a list of
        ``{type: pty}`` or ``{type: tcp, port: 4555, protocol: telnet|raw, host: 127.0.0.1}`` (TCP ones
        listen on 127.0.0.1 unless ``host`` names an address).
    tpm
        ``True``: a TPM 2.0 (tpm-crb) emulated by swtpm; or ``{model: tpm-crb|tpm-tis, version: "2.0"|"1.2"}``.
    watchdog
        ``True``: an ``i6300esb`` that resets the VM when its guest stops feeding it; a model; or ``{model:
        i6300esb|ib700|diag288, action: reset|shutdown|poweroff|pause|none|dump|inject-nmi}``.
    rng
        ``True``: a virtio RNG the guest's kernel draws entropy from, fed by the host's ``/dev/urandom``.
    clock
        Salt's ``{utc: False}``, ``{timezone: Europe/Paris}``, ``{adjustment: 3600}`` and ``timers:
        {rtc: {track: wall, tickpolicy: catchup}, hpet: {present: False}, ...}``.
    hypervisor_features
        ``{kvm-hint-dedicated: True, kvm-hidden: True}``.
    numatune
        ``{memory: {mode: strict|interleave|preferred|restrictive, nodeset: "0-1"}, memnodes: {0: {mode,
        nodeset}}}`` (host NUMA nodes; ``memnodes`` per guest cell of ``cpu:numa``).
    host_devices
        Salt's list of node device names to pass through (``virt.node_devices``: ``pci_0000_00_1f_2``,
        ``usb_3_1``): PCI devices as managed ``<hostdev>`` (libvirt detaches them from their host driver
        while the VM runs; needs an IOMMU and KVM), USB devices by vendor, product and address. An unknown
        name is refused with the PCI/USB devices the hypervisor has.
    seed / seed_backend
        write minion config and keys into the image before boot (``auto``: libguestfs, qemu-nbd,
        qemu-storage-daemon FUSE export, loop mount; the one used is reported). ``cloud-init``: write
        them on the cloud-init volume instead (needs ``cloud_init``); with ``cloud_init`` that is also
        what happens when no backend can mount the image. While the image is mounted salt-virt looks
        for salt-minion in it; without one, ``virt:minion_install`` (minion config: ``{url,
        checksum, args}``) installs it at first boot (reported under ``minion``).
    cloud_init
        a cloud-init NoCloud ``cidata`` CD-ROM for the first boot: ``True`` or ``{user_data, meta_data,
        network_config}`` (text, byte for byte; meta/network also mappings) or the short forms
        ``{users, ssh_authorized_keys, hostname, ip, gateway, dns}``. Detached from the definition and
        deleted once the VM has started (it keeps it for that boot).
    pub_key / priv_key
        the new minion's key pair (the ``virt.init`` runner pre-accepts it on the master); without
        them a key pair is generated and left for ``salt-key -a``.
    start
        start the VM after seeding.
    group
        anti-affinity group (stored in the domain metadata; the runner never places two VMs of one
        group on the same host).
    owner
        ``{tenant, creator}`` stored in the domain metadata: ``salt-run virt.init`` sets it from the
        job's authenticated user (see docs/topics/tenants.md); the runner scopes tenants by it.
    ha
        ``True``: automatic HA restarts the VM on another hypervisor when this one is lost (recorded in the
        domain metadata; ``virt.update ha=False`` turns it off). A tenant's VM counts only with the master's
        ``virt:ha:tenant_flag`` (docs/topics/recovery.md, "Automatic HA").
    catalog_image
        the ``virt:catalog`` entry ``image`` came from (``salt-run virt.init`` sets it): recorded in the
        domain metadata as the VM's ``image`` (``virt.vm_info``, the ``virt_vm`` resource grain); without it
        ``image`` is recorded without ``user:password@``, query string and fragment.
    vtype
        ``kvm`` or ``qemu``; default ``virt:type`` or what the host can really run.
    guest_agent
        add the QEMU guest agent's channel (``org.qemu.guest_agent.0``), through which ``virt.vm_info``
        reads the guest's IP addresses when the guest runs the agent; ``False`` leaves it out.

    CLI Example:

    .. code-block:: bash

        salt 'hyper*' virt.init centos1 2 512 image=/var/lib/libvirt/images/centos.img
        salt 'hyper*' virt.init web1 2 1024 image=salt://images/web.qcow2 enable_qcow=True enable_vnc=True
        salt 'hyper*' virt.init web2 2 1024 image=salt://images/debian-cloud.qcow2 cloud_init=True
    """
    job = kwargs.get("__pub_jid")  # Salt's own job id: a sealed secret opens only in the job it was sealed for
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    warnings = compat.init_args(kwargs)
    vtype = kwargs.pop("vtype", None) or vtype  # Salt's hypervisor=/vm_type= (compat.init_args)
    images = kwargs.pop("images", None)
    images_dir = compat.images_dir(images, _images_dir(), _allowed_paths())
    compat.refuse_unknown(kwargs, _INIT_ARGS, "virt.init")
    profiles = {"nic": _cfg("virt:nic", {}), "disk": _cfg("virt:disk", {})}
    unused = compat.images_unused(images, name, profiles, disk, disks)
    if unused:
        warnings.append(unused)
    if seed_cmd not in ("seed.apply", None, ""):
        warnings.append(f"seed_cmd={seed_cmd} is ignored: salt-virt seeds with its own backends (seed_backend)")
    compat.refuse_operator_switches({"allow_http": allow_http, "trusted_image": trusted_image})
    host = provision.Host(
        images_dir=images_dir,
        host_id=__opts__.get("id"),  # the manifest's creating host
        profiles=profiles,
        cache_file=saltcache.salt_files(__opts__, saltenv),
        vtype=_cfg("virt:type", None),
        master=__opts__.get("master"),
        pki_dir=__opts__.get("pki_dir"),
        job=job,
        replay_cache=os.path.join(__opts__.get("cachedir") or "", "salt-virt", "opened-envelopes"),
        http_images=_bool(_cfg("virt:insecure_http_images", False)),
        image_trusted=isinstance(image, str) and image in (_cfg("virt:insecure_trusted_images", None) or ()),
        max_image_mib=_cfg("virt:max_image_mib", None),
        allowed_paths=_allowed_paths(),
        image_sources=_cfg("virt:image_sources", None),
        operator=_operator(),
        tb_cache_mib=_cfg("virt:tcg_tb_cache_mib", None),
        minion_install=_cfg("virt:minion_install", None),
        type_cache=capacity.cache_dir(__opts__),
        key_pool=keypool.location(capacity.cache_dir(__opts__)),
        key_pool_size=_cfg("virt:insecure_seed_key_pool", 0),  # off: the pairs wait in clear
    )
    with _conn(connection) as conn, _progress(name) as events:
        # every argument by name (tests/unit/model/test_vmargs.py checks the list is the table's), the request
        # built in the call so a reader follows each argument down to its element's builder
        # fmt: off
        ret = provision.init(conn, vmargs.InitRequest(
            name=name, cpu=cpu, mem=mem, image=image, nic=nic, disk=disk, disks=disks, interfaces=interfaces,
            enable_qcow=enable_qcow, enable_vnc=enable_vnc, graphics=graphics, boot=boot, start=start, seed=seed,
            seed_cmd=seed_cmd, seed_backend=seed_backend, saltenv=saltenv, pub_key=pub_key, priv_key=priv_key,
            master=master, minion_id=minion_id, minion_config=minion_config, vtype=vtype, serial_log=serial_log,
            group=group, connection=connection, checksum=checksum, allow_http=allow_http, trusted_image=trusted_image,
            cloud_init=cloud_init, guest_agent=guest_agent, boot_dev=boot_dev, os_type=os_type, arch=arch,
            stop_on_reboot=stop_on_reboot, serials=serials, consoles=consoles, tpm=tpm, clock=clock,
            hypervisor_features=hypervisor_features, numatune=numatune, host_devices=host_devices, owner=owner, ha=ha,
            catalog_image=catalog_image, watchdog=watchdog, rng=rng,
        ), host, progress=events)
        # fmt: on
    if warnings:
        ret["warnings"] = warnings
    return ret


_INIT_ARGS = vmargs.NAMES  # the signature above matches the table (tests/unit/model/test_vmargs.py)


def _salt_kwargs(kwargs, fun, extra=()):
    """Salt's connection keywords: ``username``/``password`` are accepted empty (salt-virt never logs in to
    libvirt with a password); anything else is refused."""
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    validate.no_credentials(kwargs.pop("username", None), kwargs.pop("password", None), fun)
    compat.refuse_unknown(kwargs, ("connection", "username", "password", *extra), fun)


def start(name, connection=None, **kwargs):
    """Start a defined VM. Returns True (as Salt's ``virt.start``); a VM already running is left as is.

    CLI Example:: salt '*' virt.start web1
    """
    _salt_kwargs(kwargs, "virt.start")
    with _conn(connection) as conn:
        return bool(lifecycle.start(conn, name))


def stop(name, connection=None, **kwargs):
    """
    Hard power-off (as Salt's ``virt.stop``: pull the plug; the guest is not asked). Returns True.
    ``virt.shutdown`` asks the guest to shut down (ACPI).

    CLI Example:: salt '*' virt.stop web1
    """
    if "timeout" in kwargs:
        raise SaltInvocationError(
            "virt.stop is a hard power-off (as in Salt) and takes no timeout: for a graceful shutdown that "
            "waits use virt.shutdown <name> timeout=<seconds>"
        )
    _salt_kwargs(kwargs, "virt.stop")
    with _conn(connection) as conn:
        return bool(lifecycle.destroy(conn, name))


def shutdown(vm_, timeout=0, connection=None, **kwargs):
    """Ask the guest to shut down (ACPI power button); ``timeout`` seconds to wait for it to be off.
    Returns True once the request is delivered (as Salt's ``virt.shutdown``).

    CLI Example:: salt '*' virt.shutdown web1 timeout=60
    """
    _salt_kwargs(kwargs, "virt.shutdown")
    with _conn(connection) as conn:
        return bool(lifecycle.shutdown(conn, vm_, timeout))


def destroy(name, connection=None):
    """Hard power-off (pull the plug). The VM stays defined and its disks stay. Returns the resulting
    state (``virt.stop`` is the same with Salt's True as the return).

    CLI Example:: salt '*' virt.destroy web1
    """
    with _conn(connection) as conn:
        return lifecycle.destroy(conn, name)


def force_off(name, connection=None):
    """Alias of ``virt.destroy``.

    CLI Example:: salt '*' virt.force_off web1
    """
    return destroy(name, connection)


def reboot(name, connection=None, **kwargs):
    """Ask the guest to reboot. Returns True.

    CLI Example:: salt '*' virt.reboot web1
    """
    _salt_kwargs(kwargs, "virt.reboot")
    with _conn(connection) as conn:
        return bool(lifecycle.reboot(conn, name))


def reset(vm_, connection=None, **kwargs):
    """Hard reset (press the reset button). Returns True.

    CLI Example:: salt '*' virt.reset web1
    """
    _salt_kwargs(kwargs, "virt.reset")
    with _conn(connection) as conn:
        return bool(lifecycle.reset(conn, vm_))


def pause(vm_, connection=None, **kwargs):
    """Pause a running VM. Returns True.

    CLI Example:: salt '*' virt.pause web1
    """
    _salt_kwargs(kwargs, "virt.pause")
    with _conn(connection) as conn:
        return bool(lifecycle.pause(conn, vm_))


def resume(vm_, connection=None, **kwargs):
    """Resume a paused VM. Returns True.

    CLI Example:: salt '*' virt.resume web1
    """
    _salt_kwargs(kwargs, "virt.resume")
    with _conn(connection) as conn:
        return bool(lifecycle.resume(conn, vm_))


def undefine(vm_, connection=None, **kwargs):
    """Remove a VM's definition; its disks stay (see ``virt.purge``). Returns True.

    CLI Example:: salt '*' virt.undefine web1
    """
    _salt_kwargs(kwargs, "virt.undefine")
    with _conn(connection) as conn:
        return bool(lifecycle.undefine(conn, vm_))


def purge(vm_, connection=None, **kwargs):
    """
    Power off and undefine a VM, and delete the disk files salt-virt created for it (recorded in
    ``virt:images/<name>/.salt-virt.json`` with the VM's UUID). Anything else — backing images, shared
    directories, disks it did not create — is kept and listed under ``kept`` with the reason. A VM
    salt-virt did not create (``virt.define_xml_*``, virt-install, an older Salt: no ``virt:images/<name>``
    manifest) loses its disk files as with Salt's purge, except files outside ``virt:images``,
    ``virt:allowed_paths`` and this host's directory pools, files another domain uses (directly or
    in a backing chain), files another image backs onto and files in another salt-virt VM's directory.
    Cached base images (``virt:images/.bases``) no image backs onto any more are removed afterwards
    (``bases_removed``). Pool volumes the VM created (``disks: [{pool: ...}]``) are deleted, others kept
    (``volumes``); its internal snapshots are discarded with it (``snapshots_discarded``: their data was
    inside the deleted disks; a kept disk keeps the data of its snapshots).

    Salt's ``dirs`` / ``removables`` are accepted: the VM directory goes when salt-virt created
    everything in it; removable media (cdrom images) are never deleted unless salt-virt created them.

    CLI Example:: salt '*' virt.purge web1
    """
    kwargs.pop("dirs", None), kwargs.pop("removables", None)
    _salt_kwargs(kwargs, "virt.purge", extra=("dirs", "removables"))
    with _conn(connection) as conn:
        return provision.purge(conn, vm_, images_dir=_images_dir(), allowed_paths=_allowed_paths())


def image_gc(cache=False, connection=None):
    """
    Remove cached base images (``virt:images/.bases``) that nothing on this host uses any more: no
    domain libvirt knows here (defined or running, wherever its disks live), no ownership manifest and
    no image under ``virt:images`` has it anywhere in its backing chain. With ``cache=True`` also the
    download cache (``virt:images/.cache``). ``virt.purge`` does the first part itself after every VM
    it removes.

    CLI Example:: salt 'hyper*' virt.image_gc cache=True
    """
    with _conn(connection) as conn:
        return intake.gc_bases(_images_dir(), cache=_bool(cache), conn=conn)


def set_autostart(vm_, state="on", connection=None, **kwargs):
    """Start the VM when the host boots (``state=on``) or not (``off``). Returns True.

    CLI Example:: salt '*' virt.set_autostart web1 on
    """
    _salt_kwargs(kwargs, "virt.set_autostart")
    if str(state).lower() not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise SaltInvocationError(f"virt.set_autostart: state must be on or off, got {state!r}")
    with _conn(connection) as conn:
        ret = lifecycle.set_autostart(conn, vm_, _bool(state) or str(state).lower() == "on")
    return ret["autostart"] == (_bool(state) or str(state).lower() == "on")


def setmem(vm_, memory, config=True, connection=None, **kwargs):
    """Set memory in MiB: live where possible and in the persistent config (Salt's ``virt.setmem``).
    Returns True; ``virt.update mem=`` reports what went live and what needs a restart.

    CLI Example:: salt '*' virt.setmem web1 1024
    """
    _salt_kwargs(kwargs, "virt.setmem")
    with _conn(connection) as conn:
        done = bool(lifecycle.setmem(conn, vm_, memory, config=_bool(config)))
    _definitions_changed()
    return done


def setvcpus(vm_, vcpus, config=True, connection=None, **kwargs):
    """Set the number of vCPUs: live where possible and in the persistent config (Salt's
    ``virt.setvcpus``). Returns True.

    CLI Example:: salt '*' virt.setvcpus web1 4
    """
    _salt_kwargs(kwargs, "virt.setvcpus")
    with _conn(connection) as conn:
        done = bool(lifecycle.setvcpus(conn, vm_, vcpus, config=_bool(config)))
    _definitions_changed()
    return done


def define_xml_str(xml, connection=None, **kwargs):
    """Define a VM from a libvirt domain XML string. Returns True.

    CLI Example:: salt '*' virt.define_xml_str '<domain type="qemu">...</domain>'
    """
    _salt_kwargs(kwargs, "virt.define_xml_str")
    with _conn(connection) as conn:
        done = bool(lifecycle.define_xml_str(conn, xml))
    _definitions_changed()  # it may redefine an existing VM (its group, size)
    return done


def define_xml_path(path, connection=None, **kwargs):
    """Define a VM from a domain XML file on the minion. Returns True.

    CLI Example:: salt '*' virt.define_xml_path /tmp/web1.xml
    """
    with open(path, encoding="utf-8") as fh:
        return define_xml_str(fh.read(), connection, **kwargs)


# queries ------------------------------------------------------------------------------------------
def list_domains(connection=None, **kwargs):
    """Names of all defined VMs.

    CLI Example:: salt '*' virt.list_domains
    """
    _salt_kwargs(kwargs, "virt.list_domains")
    with _conn(connection) as conn:
        return query.list_domains(conn)


def list_active_vms(connection=None, **kwargs):
    """Names of running (active) VMs.

    CLI Example:: salt '*' virt.list_active_vms
    """
    _salt_kwargs(kwargs, "virt.list_active_vms")
    with _conn(connection) as conn:
        return query.list_domains(conn, "active")


def list_inactive_vms(connection=None, **kwargs):
    """Names of defined but inactive VMs.

    CLI Example:: salt '*' virt.list_inactive_vms
    """
    _salt_kwargs(kwargs, "virt.list_inactive_vms")
    with _conn(connection) as conn:
        return query.list_domains(conn, "inactive")


def _agent_timeout():
    """``virt:guest_agent_timeout``: seconds the guest agent calls of one query may take together."""
    return guestips.agent_timeout(_cfg)


def vm_info(vm_=None, connection=None, **kwargs):
    """
    State, cpu, memory, disks (file, format, size), NICs (MAC, source, model, and for a running VM its
    ``ips``: ``[{address, prefix, type, source}]``, source ``agent``, ``lease`` or ``arp``) and graphics
    of one VM, or of all. Addresses from the guest agent or ARP are what the guest claims: never trust them.

    CLI Example:: salt '*' virt.vm_info web1
    """
    _salt_kwargs(kwargs, "virt.vm_info")
    timeout = _agent_timeout()
    with _conn(connection) as conn:
        return query.vm_info(conn, vm_, agent_timeout=timeout)


def vm_state(vm_=None, connection=None, **kwargs):
    """``{name: state}`` for one VM or all.

    CLI Example:: salt '*' virt.vm_state web1
    """
    _salt_kwargs(kwargs, "virt.vm_state")
    with _conn(connection) as conn:
        return query.vm_state(conn, vm_)


def full_info(connection=None, **kwargs):
    """Host facts plus ``vm_info`` of every VM, in one connection and one bulk stats call: Salt's
    ``freecpu``, ``freemem``, ``node_info`` and ``vm_info``, plus ``host`` (capacity and usage).

    CLI Example:: salt '*' virt.full_info
    """
    _salt_kwargs(kwargs, "virt.full_info")
    timeout = _agent_timeout()
    with _conn(connection) as conn:
        ret = query.full_info(conn, _images_dir(), agent_timeout=timeout)
        ret.update(freecpu=query.freecpu(conn), freemem=query.freemem(conn), node_info=query.node_info(conn))
        return ret


def get_xml(vm_, inactive=False, connection=None, **kwargs):
    """The VM's libvirt XML (``inactive=True``: the persistent definition).

    CLI Example:: salt '*' virt.get_xml web1
    """
    _salt_kwargs(kwargs, "virt.get_xml")
    with _conn(connection) as conn:
        return lifecycle.get_xml(conn, vm_, inactive)


def get_nics(vm_, connection=None, **kwargs):
    """``{mac: {type, source, model, target, ips}}`` of a VM (``ips`` as in ``virt.vm_info``).

    CLI Example:: salt '*' virt.get_nics web1
    """
    _salt_kwargs(kwargs, "virt.get_nics")
    return vm_info(vm_, connection)[vm_]["nics"]


def get_macs(vm_, connection=None, **kwargs):
    """MAC addresses of a VM's NICs.

    CLI Example:: salt '*' virt.get_macs web1
    """
    _salt_kwargs(kwargs, "virt.get_macs")
    return sorted(get_nics(vm_, connection))


def get_disks(vm_, connection=None, **kwargs):
    """``{target: {file, format, virtual_size, allocation, backing_file, ...}}`` of a VM.

    CLI Example:: salt '*' virt.get_disks web1
    """
    _salt_kwargs(kwargs, "virt.get_disks")
    return vm_info(vm_, connection)[vm_]["disks"]


def get_graphics(vm_, connection=None, **kwargs):
    """The VM's console: ``{type, listen, port, autoport, address: 'host:port'}`` or None.

    CLI Example:: salt '*' virt.get_graphics web1
    """
    _salt_kwargs(kwargs, "virt.get_graphics")
    return vm_info(vm_, connection)[vm_]["graphics"]


# host ---------------------------------------------------------------------------------------------
def node_info(connection=None, **kwargs):
    """CPU model, count and speed, memory and NUMA layout of the hypervisor.

    CLI Example:: salt '*' virt.node_info
    """
    _salt_kwargs(kwargs, "virt.node_info")
    with _conn(connection) as conn:
        return query.node_info(conn)


def host_info(connection=None, **kwargs):
    """Capacity and usage (memory, vCPUs, VMs, free space in ``virt:images``) — what placement uses.

    CLI Example:: salt '*' virt.host_info
    """
    _salt_kwargs(kwargs, "virt.host_info")
    with _conn(connection) as conn:
        return query.host_info(conn, _images_dir())


def freemem(connection=None, **kwargs):
    """MiB of memory not given to running VMs.

    CLI Example:: salt '*' virt.freemem
    """
    _salt_kwargs(kwargs, "virt.freemem")
    with _conn(connection) as conn:
        return query.freemem(conn)


def freecpu(connection=None, **kwargs):
    """Host CPUs minus vCPUs of running VMs.

    CLI Example:: salt '*' virt.freecpu
    """
    _salt_kwargs(kwargs, "virt.freecpu")
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


# update (saltvirt.vm.converge): what the virt states use ---------------------------------------------
def update(name, cpu=None, mem=None, test=False, connection=None, **kwargs):
    """
    Bring an existing VM to the spec ``virt.init`` builds from the same arguments. Only what is given
    is managed: ``cpu``, ``mem``, NICs (``nic``/``interfaces``), disks (``disk``/``disks``: new ones
    blank or an existing ``path``; disks are never removed), graphics (``enable_vnc``/``graphics``) and the
    automatic HA flag (``ha``).
    Live where the hypervisor can, always in the definition: ``applied`` says what went live, what
    needs a restart; ``test=True`` returns the changes and the ``plan`` without making them.

    Salt's spellings are taken: ``disk_profile``/``nic_profile`` (for ``disk``/``nic``), ``live``
    (``False``: only the definition changes, a running VM takes it at its next start), ``autostart``;
    the return has Salt's keys ``definition``, ``cpu``, ``mem``, ``disk``
    (attached/detached/updated) and ``interface`` (attached/detached) besides ``changes``/``plan``.

    CLI Example:: salt 'hyper1' virt.update web1 cpu=4 mem=2048 enable_vnc=True
    """
    from saltvirt.vm import converge

    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    if "allowed_paths" in kwargs:
        raise SaltInvocationError("allowed_paths is read from the minion config (virt:allowed_paths) only")
    if "operator" in kwargs:
        raise SaltInvocationError("operator= is not a call argument: the operator's switches are minion config only")
    for old, new in vmargs.update_renames().items():
        if old in kwargs:
            if new in kwargs:
                raise SaltInvocationError(f"virt.update: give {new}= or {old}= (Salt's name), not both")
            kwargs[new] = kwargs.pop(old)
    live = _bool(kwargs.pop("live", True))
    autostart = kwargs.pop("autostart", None)
    warnings = compat.init_args(kwargs, "virt.update")
    if cpu in (0, "0"):  # Salt's "not given"
        cpu = None
    if mem in (0, "0"):
        mem = None
    req, given = vmargs.update_request(name, cpu, mem, kwargs)
    with _conn(connection) as conn:
        ret = converge.update(
            conn,
            req,
            given,
            allowed_paths=_allowed_paths(),
            operator=_operator(),
            images_dir=_images_dir(),
            profiles={"nic": _cfg("virt:nic", {}), "disk": _cfg("virt:disk", {})},
            test=_bool(test),
            live=live,
        )
        if autostart is not None and not _bool(test):
            lifecycle.set_autostart(conn, name, _bool(autostart))
    if not _bool(test):
        _definitions_changed()
    changes = ret["changes"]
    ret.update(
        definition=bool(converge.actionable(changes)),
        cpu=("cpu" in changes),
        mem=("mem" in changes),
        disk={"attached": list(changes.get("disks", {}).get("added", [])), "detached": [], "updated": []},
        interface={
            "attached": list(changes.get("nics", {}).get("added", [])),
            "detached": list(changes.get("nics", {}).get("removed", [])),
        },
    )
    if warnings:
        ret["warnings"] = warnings
    return ret


if saltvirt is not None:  # last: every public function above refuses non-operators
    _operators.guard_module(globals())
