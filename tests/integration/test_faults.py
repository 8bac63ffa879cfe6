"""Fault injection on a real libvirtd (hv9, a namespaced hypervisor of this module only: its daemon is killed,
stopped and restarted here). Every fault is injected at an observed point, never after a sleep:

* at a step of ``virt.init`` reported through its progress callback (the hook that sends the
  ``salt/virt/init/<vm>/<step>`` events), or
* when the effect of a step shows up on the host (the VM's qemu process, the seeding mount).

After each fault the VM is either fully created and reported, or fully absent (no domain, no disk, no
VM directory, no mount, loop device, qemu-storage-daemon, init lock), after ``virt.cleanup`` where the
fault left something; and a retry succeeds. The table of outcomes is in docs/topics/faults.md.
"""

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.base import procs
from tests.support import lab
from tests.support.paths import GUEST_DIR, ROOT
from tests.support.saltd import hypervisor_minion_config, master_config, presync, start_minion
from tests.support.saltloader import make_minion_mods
from tests.support.seed_helpers import fill, leftovers

BOUND = 120  # seconds: a call that takes longer than this is hanging, and the test fails instead


@pytest.fixture(scope="module")
def fhv(lab_dir, fabric):
    hv = lab.Hypervisor(lab_dir, 9, fabric).start()  # 9: not used by another module (migration: 6-8)
    yield hv
    with _suppress():
        os.kill(hv.pid, signal.SIGCONT)
    hv.stop()


@pytest.fixture(scope="module")
def fdir(guest):
    """virt:images for this module, plus private copies of the guest images (qemu can read them)."""
    path = tempfile.mkdtemp(prefix="svfault-", dir="/var/tmp")
    os.chmod(path, 0o755)
    for fmt in ("raw", "qcow2"):
        shutil.copyfile(guest[fmt], os.path.join(path, f"base.{fmt}"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def fmods(tmp_path_factory, fhv, fdir):
    conn = {"uri": fhv.uri, "open_timeout": 5, "keepalive": {"interval": 1, "count": 2}}
    return make_minion_mods(
        tmp_path_factory.mktemp("fmods"),
        fhv.uri,
        images_dir=os.path.join(fdir, "images"),
        connection=conn,
        allowed_paths=[str(GUEST_DIR), fdir],  # base.raw/base.qcow2 live in fdir, outside virt:images
    )


def _suppress():
    return contextlib.suppress(OSError)


def bounded(func, *args, **kwargs):
    """Run ``func`` with a hard bound: a hang fails the test instead of blocking the suite."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(func, *args, **kwargs).result(timeout=BOUND)
    finally:
        pool.shutdown(wait=False)


def images_dir(fdir):
    return os.path.join(fdir, "images")


def init_direct(fhv, fdir, name, progress, image=None, **kwargs):
    """virt.init through the library, with ``progress`` as the fault hook (``fdir``: where virt:images is)."""
    from saltvirt.host import conn as vconn
    from saltvirt.model import vmargs
    from saltvirt.vm import provision

    with vconn.connect(fhv.uri, keepalive={"interval": 1, "count": 2}) as conn:
        req = vmargs.InitRequest(
            name,
            1,
            128,
            image or os.path.join(fdir, "base.raw"),
            nic=None,
            seed_backend="loop",
            master="salt.example",
            **kwargs,
        )
        host = provision.Host(
            images_dir=images_dir(fdir),
            allowed_paths=[str(GUEST_DIR), fdir, os.path.dirname(image or fdir)],  # kernel for boot=; the image
        )
        return provision.init(conn, req, host, progress)


def assert_absent(fmods, fdir, name):
    assert name not in fmods["virt.list_domains"](), f"domain {name} is still defined"
    assert not os.path.exists(os.path.join(images_dir(fdir), name)), os.listdir(os.path.join(images_dir(fdir), name))
    assert not os.path.exists(os.path.join(images_dir(fdir), ".locks", f"init-{name}"))
    assert seeding_of(os.path.join(images_dir(fdir), name)) == []
    assert not qemu_pids(name, fdir)


def seeding_of(vm_dir):
    """Seeding state attached to the disks of ``vm_dir`` (other tests may be seeding other VMs meanwhile):
    qemu-storage-daemons serving them, loop devices on them or on those daemons' FUSE exports, the mounts
    of those loop devices, the daemons' scratch directories."""
    from saltvirt.vm import cleanup

    disks = {os.path.join(vm_dir, f) for f in ("system.raw", "system.qcow2")}
    exports = cleanup._qsd_exports(disks)
    loops = cleanup._loops(disks | set(exports.values()))
    nums = set().union(*(cleanup._devnums(n) for n in loops)) if loops else set()
    mounts = []
    for pid in ["self", *map(str, exports)]:  # seeding mounts in its own namespace, held by its qsd
        with contextlib.suppress(OSError):  # gone meanwhile
            with open(f"/proc/{pid}/mountinfo") as fh:
                mounts += [ln.split()[4] for ln in fh if ln.split()[2] in nums and ln.split()[4] not in mounts]
    return [f"qsd {pid}: {exp}" for pid, exp in exports.items()] + [f"loop {n}" for n in loops] + mounts


def qemu_pids(name, fdir=None):
    """Pids of the QEMUs running ``name`` (with ``fdir``: whose disks are in it, i.e. this module's: the
    whole suite may run beside it, with VMs of the same names)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read()
                if f"guest={name},".encode() in args and (fdir is None or fdir.encode() in args):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def retry_succeeds(fmods, fdir, name, start=False, boot=None):
    ret = fmods["virt.init"](name, 1, 128, image=os.path.join(fdir, "base.raw"), nic=None, start=start, boot=boot)
    assert ret["seed"]["backend"] and fmods["virt.vm_state"](name) == {name: ret["state"]}
    fmods["virt.purge"](name)
    assert_absent(fmods, fdir, name)


def revive(fhv):
    """Start libvirtd again if the fault killed it (a test that failed early may not have)."""
    try:
        with open(f"/proc/{fhv.pid}/stat") as fh:
            if fh.read().split()[2] != "Z":
                return
    except OSError:
        pass
    fhv.restart_daemon()


def kill_libvirtd(fhv):
    os.kill(fhv.pid, signal.SIGKILL)
    with _suppress():
        os.waitpid(fhv.pid, 0)
    for _ in range(200):  # bounded: the kernel reaps a SIGKILLed daemon at once
        try:
            with open(f"/proc/{fhv.pid}/stat") as fh:
                if fh.read().split()[2] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.01)


# a hung libvirtd -----------------------------------------------------------------------------------
def test_hung_libvirtd_fails_the_call_instead_of_hanging(fhv, fmods):
    from saltvirt.host import conn as vconn
    from saltvirt.host import query

    assert fmods["virt.list_domains"]() == []
    with pytest.raises(CommandExecutionError, match="lost the connection to libvirt.*keepalive: 1 s x 2"):
        with vconn.connect(fhv.uri, keepalive={"interval": 1, "count": 2}) as conn:
            os.kill(fhv.pid, signal.SIGSTOP)
            try:
                bounded(query.full_info, conn)  # the connect block turns libvirt's error into this one
            finally:
                os.kill(fhv.pid, signal.SIGCONT)
    os.kill(fhv.pid, signal.SIGSTOP)
    try:
        with pytest.raises(CommandExecutionError, match="did not answer within 5 s.*open_timeout"):
            bounded(fmods["virt.full_info"])
    finally:
        os.kill(fhv.pid, signal.SIGCONT)
    assert fmods["virt.list_domains"]() == []  # the daemon is fine again, and so are new calls


# libvirtd killed during init -------------------------------------------------------------------------
def test_libvirtd_killed_during_seeding(fhv, fdir, fmods):
    """libvirtd dies while the disk is being seeded: define fails, the init undoes its disks."""

    def progress(step, **_):
        if step == "disks_ready":
            fhv.kill_daemon()

    try:
        with pytest.raises(CommandExecutionError, match="define VM 'kseed'"):
            bounded(init_direct, fhv, fdir, "kseed", progress)
    finally:
        revive(fhv)
    assert_absent(fmods, fdir, "kseed")
    retry_succeeds(fmods, fdir, "kseed")


def test_libvirtd_killed_right_after_define(fhv, fdir, fmods):
    """The domain is defined, then libvirtd dies: the undo cannot undefine it, the error says what is
    left; after libvirtd is back, virt.cleanup removes the domain and its disks."""

    def progress(step, **_):
        if step == "defined":
            kill_libvirtd(fhv)

    try:
        with pytest.raises(CommandExecutionError) as err:
            bounded(init_direct, fhv, fdir, "kdef", progress)
    finally:
        revive(fhv)
    msg = str(err.value)
    assert "cleanup incomplete" in msg and "virt.cleanup kdef" in msg and "its state is unknown" in msg, msg
    assert fmods["virt.vm_state"]("kdef") == {"kdef": "shutoff"}  # what the message warned about
    out = fmods["virt.cleanup"]("kdef")
    assert out["interrupted"] and out["domain"].startswith("undefined") and len(out["removed"]) == 1, out
    assert_absent(fmods, fdir, "kdef")
    retry_succeeds(fmods, fdir, "kdef")


def test_libvirtd_killed_during_start(fhv, fdir, fmods, boot_args):
    """libvirtd dies as soon as the VM's qemu process exists: the guest may keep running without its
    daemon. After libvirtd is back, virt.cleanup stops and removes it."""
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def watch():
        deadline = time.monotonic() + BOUND
        while not qemu_pids("kstart", fdir) and time.monotonic() < deadline:
            time.sleep(0.01)
        kill_libvirtd(fhv)

    def progress(step, **_):
        if step == "defined":
            pool.submit(watch)

    ret = None
    try:
        ret = bounded(init_direct, fhv, fdir, "kstart", progress, boot=boot_args)
    except CommandExecutionError as exc:
        assert "virt.cleanup kstart" in str(exc), exc
    finally:
        pool.shutdown(wait=True)
        revive(fhv)
    if ret is not None:  # init finished before the daemon died: fully created and reported
        assert ret["state"] == "running" and fmods["virt.vm_state"]("kstart") == {"kstart": "running"}
        fmods["virt.purge"]("kstart")
    else:
        out = fmods["virt.cleanup"]("kstart")
        assert out["interrupted"] and out["domain"].startswith("undefined"), out
    assert_absent(fmods, fdir, "kstart")
    retry_succeeds(fmods, fdir, "kstart")


# the minion's job killed during seeding --------------------------------------------------------------
# The child holds still once it has written into the mounted guest filesystem, so the SIGKILL lands
# during seeding on a loaded machine too (the mount lasts ~0.2 s otherwise, and polling can miss it).
CHILD = """
import sys, time
sys.path.insert(0, {utils!r})
from saltvirt.guest import guestroot
from saltvirt.host import conn
from saltvirt.model import vmargs
from saltvirt.vm import provision
_write_files = guestroot.write_files
def _write_and_hold(root, files):
    _write_files(root, files)
    time.sleep(600)
guestroot.write_files = _write_and_hold
with conn.connect({uri!r}) as c:
    req = vmargs.InitRequest({name!r}, 1, 128, {image!r}, nic=None, seed_backend="qsd-fuse", master="salt.example",
                             start=False)
    provision.init(c, req, provision.Host(images_dir={images!r}, allowed_paths=[{fdir!r}]))
"""


def seeding_child(fhv, fdir, name, tmpdir=None):
    """A process running virt.init of ``name`` that holds still while the guest's filesystem is mounted
    (through a qemu-storage-daemon FUSE export); returns it and its seeding's scratch directory (in
    ``tmpdir``, default the system's)."""
    vm_dir = os.path.join(images_dir(fdir), name)
    code = CHILD.format(
        utils=str(ROOT / "_utils"),
        uri=fhv.uri,
        name=name,
        image=os.path.join(fdir, "base.qcow2"),
        images=images_dir(fdir),
        fdir=fdir,
    )
    env = dict(os.environ, **({"TMPDIR": tmpdir} if tmpdir else {}))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + BOUND
    while not any(m.endswith("/root") for m in seeding_of(vm_dir)) and child.poll() is None:
        assert time.monotonic() < deadline, "seeding never mounted the guest filesystem"
        time.sleep(0.01)
    assert child.poll() is None, child.stdout.read().decode()  # still seeding, not finished or failed
    return child, os.path.dirname(next(m for m in seeding_of(vm_dir) if m.endswith("/root")))


def test_job_sigkilled_during_seeding(fhv, fdir, fmods):
    """SIGKILL of the process running virt.init while the guest's filesystem is mounted through a
    qemu-storage-daemon FUSE export: everything it attached stays behind until virt.cleanup."""
    name, vm_dir = "kjob", os.path.join(images_dir(fdir), "kjob")
    child, scratch = seeding_child(fhv, fdir, name)
    child.kill()
    child.wait()
    assert child.returncode == -signal.SIGKILL, child.stdout.read().decode()
    left = seeding_of(vm_dir)
    assert any(x.startswith("qsd") for x in left) and any(x.startswith("loop") for x in left), left
    assert os.path.exists(os.path.join(images_dir(fdir), ".locks", f"init-{name}"))
    out = fmods["virt.cleanup"](name)
    assert out["interrupted"] and out["errors"] == [] and len(out["removed"]) == 1, out
    assert any(r.startswith("detached /dev/loop") for r in out["released"]), out
    assert any(r.startswith("stopped qemu-storage-daemon") for r in out["released"]), out
    assert not os.path.exists(scratch) and not leftovers(scratch), leftovers(scratch)
    assert_absent(fmods, fdir, name)
    retry_succeeds(fmods, fdir, name)


# the master stopped while salt-run virt.init waits ----------------------------------------------------
@pytest.fixture(scope="module")
def fmaster(salt_factories, state_tree):
    virt = {"hypervisors": {"tgt": "fhyper", "tgt_type": "glob", "timeout": 10, "gather_job_timeout": 10}}
    factory = presync(salt_factories.salt_master_daemon("fault-master", overrides=master_config(state_tree, virt=virt)))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def ftmp():
    """fhyper's TMPDIR: its seedings' scratch directories, where its engine's reaper looks (a private one:
    the reaper never meets what another module's test leaves in the system's on purpose)."""
    path = tempfile.mkdtemp(prefix="svfaulttmp-", dir="/var/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def fhyper(fmaster, fhv, fdir, ftmp):
    engine = {"virt_events": {"backoff_min": 0.5, "backoff_max": 2}}  # runs from the minion's next start (synced)
    factory = start_minion(fmaster, "fhyper", hypervisor_minion_config(fhv, images_dir(fdir), engines=[engine]))
    factory.environ["TMPDIR"] = ftmp
    with factory.started():
        yield factory


def key_state(master, minion_id):
    pki = master.config["pki_dir"]
    return [
        d for d in ("minions", "minions_pre", "minions_rejected") if os.path.exists(os.path.join(pki, d, minion_id))
    ]


def test_master_stopped_while_salt_run_init_waits(fmaster, fhyper, fhv, fdir, fmods):
    name = "fmst"
    cmd = [os.path.join(os.path.dirname(sys.executable), "salt-run"), "-c", fmaster.config_dir, "--out=json"]
    runner = subprocess.Popen(
        [*cmd, "virt.init", name, "1", "128", "salt://images/guest.raw", "nic=None", "start=False"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lock = os.path.join(images_dir(fdir), ".locks", f"init-{name}")
    vm_dir = os.path.join(images_dir(fdir), name)
    deadline = time.monotonic() + 3 * BOUND  # salt-run start, a query, the image from the master: slow on CI
    while not os.path.exists(vm_dir):  # the job has the image and makes the disk: the runner waits for it
        assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read()
        time.sleep(0.01)
    assert key_state(fmaster, name) == ["minions"]  # pre-accepted by the runner
    fmaster.terminate()
    try:
        out, _ = runner.communicate(timeout=BOUND)
    finally:
        fmaster.start()
    assert runner.returncode != 0 and "the salt-master stopped while virt.init of fmst ran on fhyper" in out, out
    assert key_state(fmaster, name) == ["minions"]  # kept for the VM the job may still create
    deadline = time.monotonic() + BOUND
    while os.path.exists(lock):  # the job on the hypervisor goes on without the master
        assert time.monotonic() < deadline, "virt.init on the hypervisor did not finish"
        time.sleep(0.05)
    fhyper_ready(fmaster)
    query = run_data(fmaster, "virt.query")
    if name in query["fhyper"]["vm_info"]:  # created: reported, with its key accepted
        assert key_state(fmaster, name) == ["minions"] and fmods["virt.vm_state"](name) == {name: "shutoff"}
    purged = run_data(fmaster, "virt.purge", name)  # the VM, or what its init left, and the key
    assert purged.get("key_deleted") == "accepted" and key_state(fmaster, name) == [], purged
    assert_absent(fmods, fdir, name)
    retry = run_data(fmaster, "virt.init", name, "1", "128", "salt://images/guest.raw", "nic=None", "start=False")
    assert retry["host"] == "fhyper" and key_state(fmaster, name) == ["minions"], retry
    run_data(fmaster, "virt.purge", name)
    assert_absent(fmods, fdir, name) and key_state(fmaster, name) == []


def run_data(master, *args):
    return master.salt_run_cli(timeout=BOUND).run(*args).data


def fhyper_ready(master):
    """The minion reconnected to the restarted master (bounded)."""
    deadline = time.monotonic() + 3 * BOUND
    while True:
        try:
            ret = master.salt_cli(timeout=30).run("test.ping", minion_tgt="fhyper")
        except Exception as exc:  # noqa: BLE001 - the CLI itself times out while the minion reconnects
            ret = exc
        if getattr(ret, "returncode", 1) == 0 and ret.data is True:
            return
        assert time.monotonic() < deadline, ret


# the fabric link cut during a migration -----------------------------------------------------------
@pytest.fixture(scope="module")
def fhv5(lab_dir, fabric):
    hv = lab.Hypervisor(lab_dir, 5, fabric).start()  # the migration target (5: used by no other module)
    yield hv
    hv.stop()


def link(fabric, hv, state):
    """Up or down the hypervisor's uplink on the fabric bridge (its veth end in the fabric namespace)."""
    lab.run(["ip", "-n", fabric.netns, "link", "set", f"sv{fabric.tag}d{hv.index}", state])


def test_fabric_link_cut_during_migration(fhv, fhv5, fabric, fdir, fmods, boot_args):
    """The target's link goes down once the migration moves data: the migration fails (libvirt's keepalive
    between the daemons), the VM keeps running on the source, nothing is left on the target, and the
    migration succeeds once the link is back."""
    import libvirt

    from saltvirt.host import conn as vconn
    from saltvirt.vm import migrate

    name = "kmig"
    fmods["virt.init"](name, 1, 128, image=os.path.join(fdir, "base.raw"), nic=None, boot=boot_args)
    # this lab has no TLS: in clear, as the operator's virt:migration:allow_cleartext allows
    args = {"unsafe": True, "transport": "tcp", "target_uri": "qemu+tcp://hv5/system", "allow_cleartext": True}
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def cut_when_moving():
        with vconn.connect(fhv.uri) as conn:
            dom = conn.lookupByName(name)
            deadline = time.monotonic() + BOUND
            while dom.jobInfo()[0] == libvirt.VIR_DOMAIN_JOB_NONE or not dom.jobInfo()[3]:
                assert time.monotonic() < deadline, "the migration never started moving data"
                time.sleep(0.01)
            link(fabric, fhv5, "down")

    try:
        cutter = pool.submit(cut_when_moving)
        with vconn.connect(fhv.uri) as conn:
            with pytest.raises(CommandExecutionError, match=f"migrating VM '{name}' from hv9 to hv5 failed"):
                bounded(migrate.migrate, conn, name, "hv5", max_bandwidth=1, **args)
        cutter.result(timeout=BOUND)
    finally:
        pool.shutdown(wait=True)
        link(fabric, fhv5, "up")
    assert fmods["virt.vm_state"](name) == {name: "running"}
    with vconn.connect(fhv5.uri) as target:
        assert [d.name() for d in target.listAllDomains(0)] == []
    with vconn.connect(fhv.uri) as conn:
        assert bounded(migrate.migrate, conn, name, "hv5", **args)["undefined_on_source"] is True
    with vconn.connect(fhv5.uri) as target:
        dom = target.lookupByName(name)
        assert dom.isActive()
        dom.destroy()
        dom.undefine()
    assert len(fmods["virt.cleanup"](name)["removed"]) == 1  # its disk: manifest, no domain here any more
    assert_absent(fmods, fdir, name)


def test_link_cut_during_disk_copy_is_aborted_within_the_stall_bound(fhv, fhv5, fabric, fdir, fmods, boot_args):
    """A live migration copying its disk (copy_storage=all, NBD over TCP) whose target's link goes down
    and stays down: the watchdog (virt:migration:stall_timeout) aborts it while the link is still down,
    the call reports it, the VM keeps running on the source and nothing runs on the target."""
    from saltvirt.host import conn as vconn
    from saltvirt.vm import migrate

    name = "kcopy"
    fmods["virt.init"](name, 1, 128, image=os.path.join(fdir, "base.raw"), nic=None, boot=boot_args)
    src = fmods["virt.get_disks"](name)["vda"]["file"]
    dst = os.path.join(fdir, "kcopy-on-hv5.raw")  # a path of its own: both labs see one filesystem
    size = json.loads(subprocess.check_output(["qemu-img", "info", "-U", "--output=json", src]))["virtual-size"]
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", dst, str(size)], check=True)
    args = {
        "transport": "tcp",
        "target_uri": "qemu+tcp://hv5/system",
        "copy_storage": "all",
        "disk_map": {src: dst},
        "max_bandwidth": 1,
        "stall_timeout": 15,
        "allow_cleartext": True,  # this lab has no TLS: in clear, by the operator's opt-in
    }
    pool = concurrent.futures.ThreadPoolExecutor(1)
    cut_at = {}

    def cut_when_moving():
        with vconn.connect(fhv.uri) as conn:
            dom = conn.lookupByName(name)
            deadline = time.monotonic() + BOUND
            while dom.jobInfo()[0] == 0 or not dom.jobInfo()[4]:  # VIR_DOMAIN_JOB_NONE / no data yet
                assert time.monotonic() < deadline, "the migration never started moving data"
                time.sleep(0.01)
            link(fabric, fhv5, "down")
            cut_at["t"] = time.monotonic()

    try:
        cutter = pool.submit(cut_when_moving)
        with vconn.connect(fhv.uri) as conn:
            with pytest.raises(CommandExecutionError, match="no progress for 15 s .*stall_timeout.*: aborted"):
                bounded(migrate.migrate, conn, name, "hv5", **args)
        returned = time.monotonic()
        cutter.result(timeout=BOUND)
        # the call returned while the link was still down (it is restored only below)
        print(f"migration aborted {returned - cut_at['t']:.1f} s after the link was cut")
        assert fmods["virt.vm_state"](name) == {name: "running"}
    finally:
        pool.shutdown(wait=True)
        link(fabric, fhv5, "up")
    deadline = time.monotonic() + BOUND
    with vconn.connect(fhv5.uri) as target:  # the target drops its half-received domain (bounded)
        while [d.name() for d in target.listAllDomains(0)]:
            assert time.monotonic() < deadline, [d.name() for d in target.listAllDomains(0)]
            time.sleep(0.2)
    assert fmods["virt.vm_state"](name) == {name: "running"}
    fmods["virt.purge"](name)
    os.unlink(dst)
    assert_absent(fmods, fdir, name)


# the target's libvirtd killed during a migration ---------------------------------------------------
def qemu_on(hv, name=None):
    """Pids of the QEMUs running ``name`` (None: any VM) inside ``hv``'s namespaces (every lab's QEMUs are
    processes of this one machine: told apart by their network namespace)."""
    netns = os.stat(f"/run/netns/{hv.netns}").st_ino  # named by ``ip netns``: outlives a killed libvirtd
    found = []
    for pid in qemu_pids(name) if name else [p for p, args in procs.cmdlines() if "guest=" in " ".join(args)]:
        with _suppress():
            if os.stat(f"/proc/{pid}/ns/net").st_ino == netns:
                found.append(pid)
    return found


def wait_until(cond, what):
    deadline = time.monotonic() + BOUND
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_target_libvirtd_killed_during_migration(fhv, fhv5, fdir, fmods, boot_args):
    """The target's libvirtd dies once a live migration moves data: the call fails at once (the source's
    libvirtd loses its peer connection), the VM keeps running on the source and only there, the target
    keeps nothing (neither its half-received QEMU nor a definition, also once its libvirtd is back), and
    the migration succeeds after the restart."""
    import libvirt

    from saltvirt.host import conn as vconn
    from saltvirt.vm import migrate

    name = "ktgt"
    fmods["virt.init"](name, 1, 128, image=os.path.join(fdir, "base.raw"), nic=None, boot=boot_args)
    # this lab has no TLS: in clear, as the operator's virt:migration:allow_cleartext allows
    args = {"unsafe": True, "transport": "tcp", "target_uri": "qemu+tcp://hv5/system", "allow_cleartext": True}
    pool = concurrent.futures.ThreadPoolExecutor(1)
    killed = {}

    def kill_when_moving():
        with vconn.connect(fhv.uri) as conn:
            dom = conn.lookupByName(name)
            wait_until(lambda: dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE and dom.jobInfo()[3], "no data moved")
            assert qemu_on(fhv5, name), "no incoming QEMU on the target while data moves"
            fhv5.kill_daemon()
            killed["t"] = time.monotonic()

    try:
        killer = pool.submit(kill_when_moving)
        with vconn.connect(fhv.uri) as conn:
            with pytest.raises(CommandExecutionError, match=f"migrating VM '{name}' from hv9 to hv5 failed") as err:
                bounded(migrate.migrate, conn, name, "hv5", max_bandwidth=1, **args)
        print(f"migration failed {time.monotonic() - killed['t']:.1f} s after the kill: {err.value}")
        killer.result(timeout=BOUND)
        assert f"VM '{name}' is still running on hv9" in str(err.value), err.value
        assert fmods["virt.vm_state"](name) == {name: "running"}
        wait_until(lambda: not qemu_on(fhv5, name), "the target's incoming QEMU outlived the failed migration")
        print(f"the target's incoming QEMU gone {time.monotonic() - killed['t']:.1f} s after the kill")
    finally:
        pool.shutdown(wait=True)
        revive(fhv5)
    restarted = time.monotonic()
    with vconn.connect(fhv5.uri) as target:  # the killed daemon's status of the incoming VM: dropped once
        seen = []  # it finds that QEMU gone (bounded), and may drop the VM between the listing and its state
        for dom in target.listAllDomains(0):
            try:
                seen.append((dom.name(), dom.state()))
            except libvirt.libvirtError as exc:
                seen.append((dom.name(), exc.get_error_message()))
        wait_until(lambda: not target.listAllDomains(0), "the restarted target keeps the failed migration's VM")
        print(f"after the restart the target listed {seen}, nothing {time.monotonic() - restarted:.1f} s later")
    assert len(qemu_on(fhv, name)) == 1 and not qemu_on(fhv5, name)  # running once, on the source
    with vconn.connect(fhv.uri) as conn:
        assert bounded(migrate.migrate, conn, name, "hv5", **args)["undefined_on_source"] is True
    assert len(qemu_on(fhv5, name)) == 1 and not qemu_on(fhv, name)
    with vconn.connect(fhv5.uri) as target:
        dom = target.lookupByName(name)
        dom.destroy()
        dom.undefine()
    assert len(fmods["virt.cleanup"](name)["removed"]) == 1  # its disk: manifest, no domain here any more
    assert_absent(fmods, fdir, name)


# the filesystem of virt:images full ------------------------------------------------------------------
@pytest.fixture
def small_fs():
    """virt:images on a filesystem of its own (16 MiB tmpfs): a test fills it at the step it means to fail."""
    path = tempfile.mkdtemp(prefix="svfull-", dir="/var/tmp")
    lab.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "svfull", path])
    yield path
    lab.run(["umount", path], check=False)
    os.rmdir(path)


def purge_direct(fhv, fdir, name):
    from saltvirt.host import conn as vconn
    from saltvirt.vm import provision

    with vconn.connect(fhv.uri) as conn:
        return provision.purge(conn, name, images_dir=images_dir(fdir))


@pytest.mark.parametrize("step", ["image_cached", "disks_ready"], ids=["clone", "seeding"])
def test_disk_full(fhv, fdir, fmods, small_fs, step, tmp_path, monkeypatch):
    """virt:images' filesystem full when the VM's disk is copied from its image (clone) or when the guest's
    files are written into that disk (seeding, loop backend: the guest filesystem's blocks are allocated in
    the sparse copy then): init fails saying the filesystem is full and what to do, nothing is left (disk,
    manifest, VM directory, lock, mount, loop device, scratch directory), and with space a retry succeeds."""
    name = f"kfull{step[0]}"
    # this init's scratch directories in a temp dir of its own: in the shared /tmp another worker's seeding made
    # one at the same time (run K5), which is not this init's leftover
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def progress(at, **_):
        if at == step:
            fill(small_fs)

    with pytest.raises(CommandExecutionError) as err:
        bounded(init_direct, fhv, small_fs, name, progress, image=os.path.join(fdir, "base.raw"), start=False)
    msg = str(err.value)
    print(msg)
    assert "No space left on device" in msg and "virt:images" in msg, msg
    assert_absent(fmods, small_fs, name)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("salt-virt-seed-")]
    os.unlink(os.path.join(small_fs, "filler"))
    ret = bounded(init_direct, fhv, small_fs, name, None, image=os.path.join(fdir, "base.raw"), start=False)
    assert ret["seed"]["backend"] == "loop" and ret["state"] == "shutoff", ret
    purge_direct(fhv, small_fs, name)
    assert_absent(fmods, small_fs, name)


# the hypervisor rebooted ---------------------------------------------------------------------------
def power_loss(hv):
    """``hv`` loses power: its libvirtd, virtlogd and every QEMU in its namespaces die at once, and its
    /run (a tmpfs on a real host: libvirt's state of the running VMs, its mark that autostart ran) is gone."""
    for daemon in ("libvirtd", "virtlogd"):
        with _suppress(), open(hv.path(f"{daemon}.pid")) as fh:
            os.kill(int(fh.read().strip()), signal.SIGKILL)
    for pid in qemu_on(hv):
        with _suppress():
            os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not qemu_on(hv), "a QEMU survived SIGKILL")
    for entry in os.scandir(hv.path("run")):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def test_hypervisor_rebooted(fhv, fhv5, fdir, fmods, fmaster, fhyper, ftmp, boot_args, event_listener):
    """hv9 loses power with two VMs running (kauto with autostart, kman without), one migrated to hv5
    before (kbmig, autostart on while it was on hv9) and a virt.init seeding (its job dies too), then boots:
    kauto runs again, on hv9 only; kman stays off; kbmig runs on hv5 only (its definition left hv9 with the
    migration); the salt-minion's restart reaps what the dead seeding left and reports it to the master."""
    from saltvirt.host import conn as vconn
    from saltvirt.vm import migrate

    for name in ("kauto", "kman", "kbmig"):
        fmods["virt.init"](name, 1, 128, image=os.path.join(fdir, "base.raw"), nic=None, boot=boot_args)
    assert fmods["virt.set_autostart"]("kauto", "on") and fmods["virt.set_autostart"]("kbmig", "on")
    with vconn.connect(fhv.uri) as conn:
        # this lab has no TLS: in clear, as the operator's virt:migration:allow_cleartext allows
        args = {"unsafe": True, "transport": "tcp", "target_uri": "qemu+tcp://hv5/system", "allow_cleartext": True}
        assert bounded(migrate.migrate, conn, "kbmig", "hv5", **args)["undefined_on_source"] is True
    child, scratch = seeding_child(fhv, fdir, "kbseed", tmpdir=ftmp)
    child.kill()
    child.wait()
    power_loss(fhv)
    booted = time.monotonic()
    fhv.restart_daemon()
    wait_until(lambda: fmods["virt.vm_state"]("kauto") == {"kauto": "running"}, "autostart not honoured")
    print(f"kauto running {time.monotonic() - booted:.1f} s after libvirtd started again")
    assert fmods["virt.vm_state"]("kman") == {"kman": "shutoff"}
    assert "kbmig" not in fmods["virt.list_domains"]()
    with vconn.connect(fhv5.uri) as target:
        assert [d.name() for d in target.listAllDomains(0)] == ["kbmig"]
    running = {name: (len(qemu_on(fhv, name)), len(qemu_on(fhv5, name))) for name in ("kauto", "kman", "kbmig")}
    assert running == {"kauto": (1, 0), "kman": (0, 0), "kbmig": (0, 1)}  # each VM runs once, where it should

    assert os.path.isdir(scratch) and seeding_of(os.path.join(images_dir(fdir), "kbseed"))  # left by the dead job
    t0 = time.time()
    fhyper.terminate()
    fhyper.start()
    event = wait_for_event(event_listener, fmaster, "salt/virt/fhyper/reaped", t0)
    assert event["id"] == "fhyper", event  # the sender the master authenticated
    reaped = event["data"]
    print(f"reaped (minion restarted {time.time() - t0:.1f} s ago): {reaped}")
    assert reaped["errors"] == [] and reaped["removed"][0].startswith(f"{scratch}: its seeding process"), reaped
    assert any(r.startswith("stopped qemu-storage-daemon") for r in reaped["removed"]), reaped
    assert not os.path.exists(scratch) and seeding_of(os.path.join(images_dir(fdir), "kbseed")) == []
    out = fmods["virt.cleanup"]("kbseed")  # the disk the dead job made
    assert out["interrupted"] and len(out["removed"]) == 1, out

    for name in ("kauto", "kman"):
        fmods["virt.purge"](name)
    with vconn.connect(fhv5.uri) as target:
        dom = target.lookupByName("kbmig")
        dom.destroy()
        dom.undefine()
    fmods["virt.cleanup"]("kbmig")
    for name in ("kauto", "kman", "kbmig", "kbseed"):
        assert_absent(fmods, fdir, name)


def wait_for_event(listener, master, tag, after):
    """The data of the first event ``tag`` on ``master``'s bus after ``after`` (bounded)."""
    deadline = time.monotonic() + BOUND
    while True:
        found = sorted(listener.get_events([(master.id, tag)], after_time=after), key=lambda e: e.stamp)
        if found:
            return found[0].data
        assert time.monotonic() < deadline, f"no {tag} within {BOUND} s"
        time.sleep(0.2)
