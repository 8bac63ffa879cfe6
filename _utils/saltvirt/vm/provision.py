"""``virt.init`` and ``virt.purge``: create a VM from an image, seeded before its first boot, and
remove it again without ever touching a file the VM does not own.

init: validate -> refuse occupied names/paths -> fetch image -> clone (full copy or qcow2 overlay)
-> seed (minion config + keys) -> define -> start. Any failure undoes exactly what this call created.
"""

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, metrics, validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.base.undo import Undo
from saltvirt.guest import cloudinit, firstboot, keypool, seed
from saltvirt.host import hosttype, schemacache
from saltvirt.host.conn import domain_exists, get_domain, libvirt, lv_errors
from saltvirt.host.lifecycle import undefine
from saltvirt.host.query import add_uptimes, bulk_stats, describe
from saltvirt.model import vmargs, vmspec
from saltvirt.pki import envelope
from saltvirt.storage import foreign, images, intake, volumes
from saltvirt.vm import cleanup, resolve
from saltvirt.xml import etree
from saltvirt.xml.domain import definition

log = logging.getLogger(__name__)
BASES_DIR = intake.BASES_DIR  # <images_dir>/.bases: immutable copies of fetched images that overlays back onto


def _no_progress(step, **data):
    log.debug("init progress %s %s", step, data)


class _Steps:
    """``virt.init``'s progress, remembered: a failure is counted by the step that did not complete (the
    one after the last event sent; without an image, ``prepare`` covers the disks too)."""

    NEXT: ClassVar[dict[str | None, str]] = {
        None: "prepare",
        "image_cached": "disks",
        "disks_ready": "seed",
        "seeded": "define",
        "defined": "start",
        "started": "finish",
    }

    def __init__(self, progress):
        self.progress, self.last = progress or _no_progress, None

    def __call__(self, step, **data):
        self.last = step
        return self.progress(step, **data)

    def skip(self, step):
        """``step`` does not apply to this init (``seeded`` when nothing is seeded): what fails next is counted
        as the step after it, without an event for it."""
        self.last = step

    def failed(self):
        return self.NEXT.get(self.last, "finish")


def base_image(fetched: str, images_dir: str, source: str) -> str:
    """An immutable copy of a fetched image for overlays to back onto (a cache refresh must never
    rewrite an overlay's backing file). Hard link when on the same filesystem: O(1) whatever the size.
    Call it under :func:`saltvirt.storage.intake.bases_lock` (the image gc must not collect it meanwhile)."""
    st = os.stat(fetched)
    key = hashlib.sha256(f"{source}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    bases = os.path.join(images_dir, BASES_DIR)
    os.makedirs(bases, mode=0o755, exist_ok=True)
    dest = os.path.join(bases, f"{key}-{os.path.basename(fetched)}")
    if os.path.exists(dest):
        return dest
    tmp = f"{dest}.tmp{os.getpid()}"
    try:
        os.link(fetched, tmp)
    except OSError:
        shutil.copyfile(fetched, tmp)
    os.chmod(tmp, 0o444)
    os.replace(tmp, dest)
    return dest


def accept_image(
    source: str,
    images_dir: str,
    cache_file: Callable[[str], Any] | None = None,
    *,
    allowed_paths: Sequence[str] = (),
    checksum: Any = None,
    allow_http: Any = False,
    max_image_mib: Any = None,
    trusted: bool = False,
    image_sources: Any = None,
) -> Data:
    """``source`` through :func:`saltvirt.storage.intake.accept` with this host's settings: downloads into
    ``<images>/.cache`` (only from ``virt:image_sources`` when the minion config has it), local paths only
    from ``virt:images`` and ``virt:allowed_paths``."""
    return intake.accept(
        source,
        os.path.join(images_dir, intake.CACHE_DIR),
        cache_file,
        checksum=checksum,
        allow_http=validate.to_bool(allow_http),
        max_image_mib=max_image_mib,
        trusted=validate.to_bool(trusted),
        roots=(images_dir, *validate.allowed_paths(allowed_paths)),
        sources=intake.image_sources(image_sources, intake.HV_CONFIG),
    )


def warm(
    image: str,
    *,
    images_dir: str = vmspec.DEFAULT_IMAGES_DIR,
    cache_file: Callable[[str], Any] | None = None,
    conn: Conn = None,
    vtype: str | None = None,
    **accept_args: Any,
) -> dict:
    """Fetch ``image`` and check it as ``virt.init`` does (:func:`accept_image`), then import it as the
    base overlays back onto (``<images>/.bases``), so that the next ``virt.init`` of it is the cached
    case: nothing left to fetch, check or copy. With ``conn``, also asks libvirt what ``virt.init`` asks
    it first (:func:`saltvirt.host.hosttype.detect`): a libvirtd's first ``getCapabilities`` probes every
    QEMU binary (seconds, once per libvirtd start), which would otherwise fall on the first ``virt.init``.
    Returns what is cached where, the domain type (``type``, None without ``conn``) and how long it took."""
    started = time.monotonic()
    validate.absolute_path(images_dir, "virt:images")
    kind = hosttype.detect(conn, vtype) if conn is not None else None
    info = accept_image(image, images_dir, cache_file, **accept_args)
    base = None
    if isinstance(image, str) and "://" in image:  # a local image is used in place: no base of its own
        with intake.bases_lock(images_dir):
            base = base_image(info["path"], images_dir, image)
    return {
        "image": info["source"],
        "path": info["path"],
        "format": info["format"],
        "checksum": info["checksum"],
        "base": base,
        "type": kind["type"] if kind else None,
        "seconds": round(time.monotonic() - started, 2),
    }


def _local_bridge_missing(uri, nics):
    """Bridges we can check from here (plain local URI: same host, same network namespace)."""
    if not hosttype.is_local_uri(uri) or (uri and "socket=" in uri):
        return []
    return [n.source for n in nics if n.type == "bridge" and not os.path.isdir(f"/sys/class/net/{n.source}/bridge")]


def _bridge_hint(bridge, host):
    return (
        f"bridge {bridge!r} does not exist on {host}. Create it (the br0 part of salt-virt.example.sls does), "
        "or choose another NIC profile (nic=...) or interfaces=[{name: eth0, type: network, source: default}]"
    )


@dataclasses.dataclass
class Host:
    """What this hypervisor brings to a ``virt.init``, beside the call's request: its settings (the minion
    config: never a call's) and its hooks. ``host_id``: its minion id, recorded in the VM's ownership
    manifest as its creator; ``cache_file``: Salt's ``cp.cache_file`` for salt:// images; ``pki_dir``,
    ``job``, ``replay_cache``: where and in which job a sealed secret opens (:mod:`saltvirt.pki.envelope`);
    ``http_images``/``image_trusted``: the operator's ``virt:insecure_http_images`` and whether the image
    is one of ``virt:insecure_trusted_images``; ``operator``: :func:`saltvirt.base.switches.operator_settings`."""

    images_dir: str = vmspec.DEFAULT_IMAGES_DIR
    host_id: str | None = None
    profiles: Data | None = None
    cache_file: Callable[[str], Any] | None = None
    vtype: str | None = None  # virt:type: the domain type when the call names none
    master: str | list | None = None  # the master(s) the new minion connects to when the call names none
    pki_dir: str | None = None
    job: str | None = None
    replay_cache: str | None = None
    http_images: bool = False
    image_trusted: bool = False
    max_image_mib: Any = None
    allowed_paths: Sequence[str] = ()
    image_sources: Any = None
    operator: Data | None = None
    tb_cache_mib: Any = None  # virt:tcg_tb_cache_mib
    minion_install: Any = None
    # where what libvirt answered is kept: the detected domain type (saltvirt.host.hosttype), the definition
    # shapes its schema check passed (saltvirt.host.schemacache)
    type_cache: str | None = None
    key_pool: str | None = None  # where new minions' key pairs are kept ready (saltvirt.guest.keypool)
    key_pool_size: Any = 0  # virt:insecure_seed_key_pool


def init(conn: Conn, req: vmargs.InitRequest, host: Host | None = None, progress: Any = None) -> Data:
    """Create, seed, define and (optionally) start the VM ``req`` asks for on ``host``. Returns what was
    done; see module docs.

    Holds this host's init lock for the VM's name (``saltvirt.vm.cleanup``); if an earlier init of it
    was interrupted (its lock file is left), what it left is cleaned up first (``cleaned_up``).
    Its duration and a failure's step go to salt-virt's metrics (:mod:`saltvirt.base.metrics`)."""
    steps = _Steps(progress)
    clock = time.monotonic()
    host = host or Host()
    pool_size = keypool.pool_size(host.key_pool_size)  # the operator's: a bad value stops before anything is made
    try:
        result = _locked_init(conn, req, host, steps)
    except BaseException:
        metrics.add("saltvirt.vm.provision.failures", step=steps.failed())
        metrics.record("saltvirt.vm.provision.duration", time.monotonic() - clock, result="failed")
        metrics.flush()
        raise
    finally:  # the pairs used are made again after this init, not during it
        keypool.refill(host.key_pool, pool_size)
    metrics.record("saltvirt.vm.provision.duration", time.monotonic() - clock, result="ok")
    metrics.flush()
    return result


def _locked_init(conn, req, host, progress):
    name, images_dir = validate.vm_name(req.name), host.images_dir
    validate.absolute_path(images_dir, "virt:images")
    with cleanup.InitLock(images_dir, name) as lock:
        earlier = cleanup.clean(conn, name, images_dir, lock, host_id=host.host_id) if lock.existed else None
        if earlier and earlier["errors"]:
            raise CommandExecutionError(
                f"an earlier virt.init of {name!r} was interrupted and its leftovers could not be removed: "
                f"{'; '.join(earlier['errors'])}"
            )
        if earlier and earlier.get("refused"):
            raise CommandExecutionError(
                f"an earlier virt.init of {name!r} was interrupted; the files in its directory were kept: "
                f"{earlier['refused']}"
            )
        try:
            result = _init(conn, req, host, lock=lock, progress=progress)
        except (CommandExecutionError, OSError) as exc:  # OSError: the manifest, written before anything else
            if not fsutil.out_of_space(exc, images_dir):
                raise
            raise CommandExecutionError(f"{exc}. {_full_hint(images_dir)}") from None
        if earlier:
            result["cleaned_up"] = earlier
        return result


def _init(conn, req, host, *, lock, progress):  # noqa: C901, PLR0912, PLR0915 - the init steps in order, each with its undo
    started_at = time.monotonic()
    name, images_dir = validate.vm_name(req.name), host.images_dir
    origin = vmspec.image_origin(req.image, req.catalog_image)  # before anything is fetched: a bad name stops here
    hostname = conn.getHostname()
    if domain_exists(conn, name):
        raise SaltInvocationError(
            f"a VM named {name!r} is already defined on {hostname}: pick another name or purge it"
        )
    kind = hosttype.detect(conn, req.vtype or host.vtype, cache_dir=host.type_cache)
    # the operator's: a bad value stops before any fetch
    tb_cache = vmspec.tb_cache_mib(host.tb_cache_mib, kind["type"])
    seed_request = seed.Request.of(
        dataclasses.replace(req, master=req.master or host.master), host.pki_dir, host.job, host.replay_cache
    )
    seed_disk = req.seed  # Salt's seed=: seed the first disk at all
    keypair = None
    if req.image and validate.to_bool(seed_disk) and not (seed_request.pub_key or seed_request.priv_key):
        # the minion's new key pair: one made ahead, else made now while the image is checked and copied
        made = keypool.take(host.key_pool, host.key_pool_size)
        keypair = functools.partial(tuple, made) if made else envelope.keypair_maker()

    def accept(source, checksum=None):  # every image, the VM's and a disk entry's own, through one door
        return accept_image(
            source,
            images_dir,
            host.cache_file,
            allowed_paths=host.allowed_paths,
            checksum=checksum,
            allow_http=host.http_images,
            max_image_mib=host.max_image_mib,
            trusted=host.image_trusted,
            image_sources=host.image_sources,
        )

    fetched = info = None
    if req.image:
        info = accept(req.image, req.checksum)
        fetched = info["path"]
        progress("image_cached", image=info["source"], path=fetched, checksum=info["checksum"])
    gfx = req.graphics
    if isinstance(gfx, dict) and envelope.is_envelope(gfx.get("password")):
        # sealed by the runner for this hypervisor only: a console password never travels in clear
        gfx = dict(gfx, password=_unseal(seed_request, gfx["password"], f"{name}/graphics"))
    spec = vmspec.build(
        dataclasses.replace(req, vtype=kind["type"], image=fetched, graphics=gfx),
        image_format=info["format"] if info else None,
        images_dir=images_dir,
        profiles=host.profiles,
        allowed_paths=host.allowed_paths,
    )
    vm_dir = spec.vm_dir  # <images_dir>/<name>: build names it (None only in a spec made for its XML alone)
    if vm_dir is None:
        raise CommandExecutionError(f"the spec of {name!r} names no VM directory")
    resolved = resolve.for_init(
        conn,
        spec,
        images_dir=images_dir,
        operator=host.operator,
        tb_cache_mib=tb_cache,
        image_origin=origin,
        image=req.image,
        fetched=info,
        accept=accept,
    )
    spec, src_formats, sources = resolved.spec, resolved.src_formats, resolved.sources
    attached = resolved.attached
    missing = _local_bridge_missing(conn.getURI(), spec.nics)
    if missing:
        raise CommandExecutionError(_bridge_hint(missing[0], hostname))
    plan = firstboot.Plan(spec.cloud_init, host.minion_install, host.cache_file)

    undo = Undo(stop_at_failure=True)
    result = {"name": name, "host": hostname, "type": kind["type"], "type_reason": kind["reason"], "disks": []}
    if attached:
        result["attached"] = attached  # existing disks (storage.attach): their format as found on them
    try:
        if not os.path.isdir(vm_dir):
            os.makedirs(vm_dir, mode=0o755)
            undo.add(f"remove {vm_dir}", lambda: os.rmdir(vm_dir) if not os.listdir(vm_dir) else None)
        # the manifest before anything it covers, naming the VM by its UUID and this host: whatever this init
        # leaves behind is then judged by UUID (saltvirt.vm.cleanup), never by name; its undo runs last
        fresh = not os.path.lexists(os.path.join(vm_dir, images.MANIFEST))
        # A new manifest lists at once the disk files this init is about to make in the VM's directory (one
        # fsynced write less than recording each once made), only paths nothing holds now: each is then made
        # exclusively (O_EXCL) by this init, under its lock on the name. A crash at any point leaves either no
        # manifest (nothing made yet) or one listing this init's files, some perhaps not made yet: the cleanup
        # removes those that are there and counts the others as gone. An older manifest (not ours alone):
        # each file is recorded once made, as before. A failure's undo removes the new manifest with the rest.
        planned = _planned_files(spec) if fresh else []
        images.record_owned(vm_dir, name, planned, vm_uuid=spec.uuid, host=host.host_id, complete=False)
        if fresh:
            undo.add("remove ownership manifest", lambda: _remove_manifest(vm_dir))
        seeds_first = validate.to_bool(seed_disk)
        for disk in spec.disks:
            made = _make_disk(conn, spec, disk, seeds_first, src_formats, sources, images_dir, undo, planned)
            if made:
                result["disks"].append(made)
        # a volume's path is known once it is made (a block volume is seeded in a staging file first)
        made_at = {d["name"]: d.get("staged") or d["path"] for d in result["disks"] if d.get("pool")}
        spec = resolve.with_disk_paths(spec, made_at)
        progress("disks_ready", disks=[d["path"] for d in result["disks"]])

        result["seed"] = None
        if validate.to_bool(seed_disk) and spec.disks and spec.disks[0].image:
            result["seed"], result["key"] = _seed(spec, seed_request, plan, keypair)
            result["minion"] = plan.report()
            progress("seeded", backend=result["seed"]["backend"])
            key = {"minion_id": result["key"]["minion_id"], "fingerprint": result["key"]["fingerprint"]}
            spec = dataclasses.replace(spec, minion_key=key)
        else:
            progress.skip("seeded")
        if spec.cloud_init is not None:
            result["cloud_init"] = _cidata(spec, plan, undo)
        for made in result["disks"]:
            if made.get("staged"):  # a block volume: seeded as a file, now written into the volume
                volumes.finish_staged(made, spec.disks[0].format)
                spec = resolve.with_disk_paths(spec, {made["name"]: made["path"]})

        with lv_errors(f"define VM {name!r} on {hostname}"):
            dom = schemacache.define_domain(conn, definition.build(spec), host.type_cache)
        undo.add(f"undefine {name}", dom.undefine)
        result["uuid"] = dom.UUIDString()  # spec.uuid, the manifest's since the start
        progress("defined", uuid=result["uuid"])

        result["started"] = bool(validate.to_bool(req.start)) and _start(dom, spec, hostname, undo, progress)
        if result["started"] and spec.cloud_init is not None:  # the seed is single-use: see saltvirt.guest.cloudinit
            result["cloud_init"].update(cloudinit.retire(dom, spec))
        result["vm_info"] = _read_back(dom, name, hostname)
        result["state"] = result["vm_info"]["state"]
        # the last step: from now on no cleanup takes this VM for the half-made one of an interrupted init
        images.record_owned(vm_dir, name, [], vm_uuid=spec.uuid, complete=True)
    except BaseException as exc:
        errors = undo.run()
        if errors:
            lock.keep_mark()  # virt.cleanup (or the next init of this name) finishes the job
            log.error("init %s: cleanup after failure was incomplete: %s", name, errors)
            if isinstance(exc, (CommandExecutionError, SaltInvocationError)):
                left = _left_behind(conn, name, result)
                raise type(exc)(
                    f"{exc} (cleanup incomplete: {'; '.join(errors)}; {left}; "
                    f"once {hostname} is reachable again run: salt <hypervisor> virt.cleanup {name})"
                ) from None
        raise
    result["seconds"] = round(time.monotonic() - started_at, 3)
    return result


def _full_hint(images_dir):
    """What to do when a disk of the new VM did not fit (its clone, or the guest's blocks while seeding)."""
    try:
        st = os.statvfs(images_dir)
        free = f"{st.f_bavail * st.f_frsize // 1048576} MiB free now"
    except OSError as exc:
        free = f"its free space unknown: {exc.strerror}"
    return (
        f"A filesystem this VM's disks go on is full (virt:images {images_dir}: {free}; a pool disk: its pool's): "
        "free space there, or set virt:images (or the disk's pool) to one with room, then retry"
    )


def _file_disk(disk):
    """Whether :func:`_make_disk` makes ``disk`` as a file of its own (a clone or a blank disk)."""
    return not disk.pool and not disk.attach and disk.device == "disk" and bool(disk.path)


def _planned_files(spec):
    """The disk files this init will make inside the VM's directory that nothing holds yet."""
    return [
        d.path
        for d in spec.disks
        if _file_disk(d) and validate.is_inside(d.path, spec.vm_dir) and not os.path.lexists(d.path)
    ]


def _make_disk(conn, spec, disk, seeds_first, src_formats, sources, images_dir, undo, recorded=()):
    """Create one disk (a pool volume, a clone of its image or a blank file), recorded as this VM's (unless
    ``recorded`` lists it already) and with its undo step; what was made (None for a disk there is nothing to
    make for)."""
    name = spec.name
    if disk.pool and not disk.attach:
        seeds = seeds_first and disk is spec.disks[0] and disk.image
        made = volumes.create(
            conn,
            disk,
            image=disk.image,
            src_fmt=src_formats.get(disk.name),
            stage_dir=spec.vm_dir if seeds else None,
        )
        undo.add(f"delete volume {disk.pool}/{disk.volume}", lambda m=made: volumes.delete(conn, m))
        volumes.record(spec.vm_dir, name, made)
        return dict(made, target=disk.target)
    if not _file_disk(disk):
        return None
    if disk.image:
        made = _clone(disk, sources[disk.name], images_dir, src_formats[disk.name])
        undo.add(f"remove {disk.path}", lambda p=disk.path: _remove_file(p))
        if disk.size and disk.size * 1048576 > images.image_info(disk.path, disk.format)["virtual_size"]:
            images.resize(disk.path, disk.size, disk.format)
    else:
        made = images.create_disk(disk.path, disk.size, fmt=disk.format)
        undo.add(f"remove {disk.path}", lambda p=disk.path: _remove_file(p))
    if disk.path not in recorded:
        images.record_owned(spec.vm_dir, name, [disk.path], vm_uuid=spec.uuid)
    return dict(made, name=disk.name, target=disk.target)


def _start(dom, spec, host, undo, progress):
    """Start the new VM (a missing host bridge gets the same hint as before defining it); True."""
    try:
        dom.create()
    except libvirt.libvirtError as exc:
        msg = exc.get_error_message()
        bridge = next((n.source for n in spec.nics if n.type == "bridge" and f"'{n.source}'" in msg), None)
        if bridge and "No such device" in msg:
            raise CommandExecutionError(_bridge_hint(bridge, host)) from None
        raise CommandExecutionError(f"start VM {spec.name!r} on {host}: {msg}") from None
    undo.add(f"stop {spec.name}", lambda: dom.isActive() and dom.destroy())
    progress("started")
    return True


def _read_back(dom, name, host):
    """The new VM's info as ``virt.vm_info`` reports it (so the runner needs no second round trip for
    it), after checking that libvirt's description of it reads back: libvirt echoes some values
    unescaped, and a VM whose XML does not parse would break every later query."""
    with lv_errors(f"reading back VM {name!r} on {host}"):
        xml = dom.XMLDesc(0)
        try:
            root = etree.read(xml)  # parsed once: describe reads the same tree
            definition.parse(root)
        except Exception as exc:  # noqa: BLE001 - ParseError or a malformed device: all mean unreadable
            raise CommandExecutionError(
                f"libvirt's description of the new VM {name!r} does not parse ({exc}): removed it again"
            ) from None
        # what this init did, not asked again: it defined the VM (persistent) and set no autostart
        listed = {"autostart": set(), "persistent": {dom.UUIDString()}}
        info = describe(dom, host, stats=bulk_stats(dom.connect(), [dom]).get(name), xml=root, listed=listed)
        add_uptimes(dom.connect(), {name: info})  # as virt.vm_info reports it
        return info


def _left_behind(conn, name, result):
    """What is left of a VM whose undo did not finish, as far as we can still tell."""
    if "uuid" not in result:
        return f"VM {name!r} was not defined; its disks may be left: {[d['path'] for d in result['disks']]}"
    try:
        state = describe(conn.lookupByName(name), result["host"])["state"]
        return f"VM {name!r} is still defined, state {state}"
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return f"VM {name!r} is no longer defined"
        return f"VM {name!r} was defined (uuid {result['uuid']}), its state is unknown: {exc.get_error_message()}"
    except Exception as exc:  # noqa: BLE001 - best effort while reporting another failure
        return f"VM {name!r} was defined (uuid {result['uuid']}), its state is unknown: {exc}"


def _clone(disk, image, images_dir, src_fmt):  # image: the source as given (path, salt://, URL)
    """Full copy of the accepted image, or an overlay on it (on an immutable base for fetched images)."""
    if not (disk.overlay and image and "://" in image):
        return images.clone(disk.image, disk.path, overlay=disk.overlay, fmt=disk.format, src_fmt=src_fmt)
    with intake.bases_lock(images_dir):  # the image gc must not take the base before the overlay exists
        src = base_image(disk.image, images_dir, image)
        return images.clone(src, disk.path, overlay=True, fmt=disk.format, src_fmt=src_fmt)


def _remove_file(path: str) -> None:
    """An undo step: remove a file this init made (nothing to do if it is not there)."""
    if os.path.exists(path):
        os.unlink(path)


def _remove_manifest(vm_dir):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(vm_dir, images.MANIFEST))


def _unseal(req, sealed, context):
    """A secret the runner sealed for this hypervisor, opened only as ``context`` in this job."""
    return envelope.unseal(sealed, req.pki_dir, context, req.job, replay_cache=req.replay_cache)


def _seed(spec, req, plan, keypair=None):
    """Seed ``req`` (a :class:`saltvirt.guest.seed.Request`) into the first disk: the minion's id, master, key
    pair (opened here when the runner sealed it for this hypervisor; a new one when given none) and config;
    ``plan`` (a :class:`saltvirt.guest.firstboot.Plan`) looks into the image meanwhile. A new pair is made
    by ``keypair`` (:func:`saltvirt.pki.envelope.keypair_maker`, started before the disk was made) and is
    waited for only once the image is mounted. With ``cloud_init``, when no backend can mount the image
    (or ``seed_backend='cloud-init'``), the files go on the cidata volume instead."""
    key = {"minion_id": req.minion_id}
    pub_key, priv_key = req.pub_key, req.priv_key
    if isinstance(priv_key, dict):  # sealed by the runner for this hypervisor only (see saltvirt.pki.envelope)
        priv_key = _unseal(req, priv_key, f"{req.minion_id}/priv_key")
    new_pair = None
    if not pub_key or not priv_key:
        if pub_key or priv_key:
            raise SaltInvocationError("pass both pub_key and priv_key, or neither (a new key pair is generated)")
        new_pair = keypair or envelope.keypair_maker()
        key.update(generated=True, accepted=False, hint=f"accept it on the master: salt-key -a {req.minion_id}")

    def minion_files(pub, priv):
        return seed.salt_minion_files(req.minion_id, master=req.master, pub=pub, priv=priv, config=req.minion_config)

    files = minion_files(pub_key, priv_key)  # id, master, config (and given keys) checked before anything is made
    inspect = plan.inspect
    if new_pair is not None:

        def inspect(exists):  # the new keys join the files once the image is mounted
            return {**plan.inspect(exists), **{p: f for p, f in minion_files(*new_pair()).items() if p not in files}}

    def every_file():
        return files if new_pair is None else minion_files(*new_pair())

    disk = spec.disks[0]
    if req.backend == firstboot.CLOUD_INIT_BACKEND:
        if spec.cloud_init is None:
            raise SaltInvocationError("seed_backend=cloud-init needs cloud_init (True or its documents)")
        files = every_file()
        plan.via_cloud_init(files)
        done = firstboot.seeded_by_cloud_init(files, [])
    else:
        try:
            # fresh: the disk was made by this init a moment ago (exclusively): nobody else can have it open
            done = seed.seed(disk.path, files, backend=req.backend, fmt=disk.format, inspect=inspect, fresh=True)
        except seed.SeedError as exc:
            if spec.cloud_init is None or not exc.clean:
                raise CommandExecutionError(f"seeding {disk.path} failed, VM not created: {exc}") from None
            files = every_file()
            plan.via_cloud_init(files)
            done = firstboot.seeded_by_cloud_init(files, exc.attempts)
        except CommandExecutionError as exc:
            raise CommandExecutionError(f"seeding {disk.path} failed, VM not created: {exc}") from None
    key["fingerprint"] = fsutil.sha256(new_pair()[0] if new_pair is not None else pub_key)
    return done, key


def _cidata(spec, plan, undo):
    """Write the cloud-init seed ISO into the VM's directory (recorded as the VM's, undone on failure)."""
    iso = cloudinit.iso_path(spec.vm_dir)  # the cidata disk's path (vmspec.cidata_disk)
    made = cloudinit.write_seed(spec, plan.additions())
    undo.add(f"remove {iso}", lambda: _remove_file(iso))
    images.record_owned(spec.vm_dir, spec.name, [iso], vm_uuid=spec.uuid)
    return made


def purge(
    conn: Conn, name: str, images_dir: str = vmspec.DEFAULT_IMAGES_DIR, allowed_paths: Sequence[str] = ()
) -> Data:
    """Stop and undefine ``name``; delete the disk files salt-virt created for this very VM. A VM salt-virt
    did not create (no ownership manifest in its directory) loses its disk files and pool volumes as with
    Salt's purge, except what :mod:`saltvirt.storage.foreign` keeps (outside ``images_dir``/``allowed_paths``/
    pool directories, used by another domain or image)."""
    validate.vm_name(name)
    dom = get_domain(conn, name)
    facts = definition.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    uuid = dom.UUIDString()
    snaps = [snap.getName() for snap in dom.listAllSnapshots(0)]  # their data lives in the disks below
    if dom.isActive():
        with lv_errors(f"stop VM {name!r}"):
            dom.destroy()
    undefine(conn, name)
    files = [d["file"] for d in facts["disks"] if d["file"] and d["type"] == "file" and d["device"] == "disk"]
    vm_dir = validate.inside(images_dir, name)
    files += cloudinit.leftover(vm_dir)  # the seed ISO of a VM that was never started
    refs = volumes.disk_refs(facts)
    if os.path.isdir(vm_dir) and images.load_manifest(vm_dir) is not None:
        vols = volumes.remove_owned(conn, vm_dir, name, uuid, refs)
        outcome = images.remove_owned(vm_dir, name, uuid, files)
    else:  # not made by salt-virt: Salt's purge deletes its disks and volumes, foreign keeps what others use
        vols = foreign.remove_volumes(conn, name, refs, images_dir, allowed_paths)
        outcome = foreign.remove(conn, name, files, images_dir, allowed_paths)
    gc = intake.gc_bases(images_dir, conn=conn)  # cached bases nothing on this host uses any more
    return {
        "name": name,
        "undefined": True,
        "removed": outcome["removed"],
        "kept": outcome["kept"],
        "bases_removed": gc["removed"],
        "volumes": vols,  # {'removed': ['pool/volume'], 'kept': {'pool/volume': why}}
        # internal snapshots: their list goes with the definition, their data with the disks removed above
        # (a kept disk keeps the data of its snapshots: qemu-img snapshot -l <disk>)
        "snapshots_discarded": snaps,
    }
