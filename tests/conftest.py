"""Fixtures only (helpers live in tests/support): libvirt test driver, real namespaced libvirtd
hypervisors, real Salt daemons.

Fixtures that need root, libvirtd or the test guest fail loudly (they do not skip): CI must run them.
Every test is marked ``unit`` or ``integration`` by its folder (see pytest_collection_modifyitems).
"""

import json
import os
import pathlib
import shutil
import tempfile

import pytest

from tests.support import clizygote, cpuacct, daemonports, lab, portscan, xdist_groups
from tests.support import golden as golden_files
from tests.support.markers import item_markers
from tests.support.paths import GUEST_DIR, ROOT, TEST_NODE_XML, guest_boot
from tests.support.saltd import compiled, hypervisor_minion_config, master_config, start_minion
from tests.support.saltloader import guess_machine_id_once, make_minion_mods
from tests.support.saltlogging import quiet_salt_logging

EVENTS_KEPT = 3600  # seconds: longer than any module's run on a loaded machine


def pytest_addoption(parser):
    parser.addoption(
        "--regen-golden",
        action="store_true",
        help="rewrite tests/golden/ XML files from the builders instead of comparing (then review git diff)",
    )


def pytest_configure(config):
    # before any test module imports salt: no deferred stderr handler dumping records at exit
    quiet_salt_logging()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get("RUN_TESTS_TIMELINE"):
        cpuacct.enter(worker)  # first: the CLI zygote below and its forks are charged to this worker too
    clizygote.install()  # salt-factories' CLI calls forked from one process that imported Salt once
    guess_machine_id_once()  # not at every salt.config.*_config(None) of a test
    portscan.install()  # a daemon's teardown survives a process exiting elsewhere during its port scan
    daemonports.install()  # the daemons' ports below the kernel's ephemeral range: no outgoing connection takes one


def pytest_collection_modifyitems(config, items):
    """Mark every test by its folder (tests/unit -> ``unit``, tests/integration -> ``integration``) and by
    the daemons its fixtures start (``libvirtd``, ``salt``: tests/support/markers.py)."""
    tests = ROOT / "tests"
    for item in items:
        for name in item_markers(item):
            item.add_marker(getattr(pytest.mark, name))
        try:
            folder = pathlib.Path(item.path).resolve().relative_to(tests).parts[0]
        except ValueError:
            continue
        if folder in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, folder))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With ``RUN_TESTS_TIMELINE``, a worker's report carries its CPU-seconds so far (tests/support/cpuacct.py)."""
    outcome = yield
    if os.environ.get("RUN_TESTS_TIMELINE") and os.environ.get("PYTEST_XDIST_WORKER"):
        outcome.get_result().user_properties.append(("cpuacct", cpuacct.readings()))


def pytest_runtest_logreport(report):
    """``RUN_TESTS_TIMELINE=FILE``: one JSON line per test phase (worker, test, phase, start, stop, and the
    worker's CPU-seconds so far where cgroups allow), written by the xdist controller: which worker ran what,
    when, and at what CPU cost, so a run's tail and idle workers can be read back."""
    path = os.environ.get("RUN_TESTS_TIMELINE")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    node = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
    line = {"worker": node, "test": report.nodeid, "phase": report.when, "outcome": report.outcome}
    line.update(start=getattr(report, "start", None), stop=getattr(report, "stop", None))
    line.update(dict(report.user_properties).get("cpuacct") or {})
    with open(path, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (./run-tests): one worker per integration module, one for the modules on the
    session master, unit tests one by one (tests/support/xdist_groups.py)."""
    if config.getvalue("dist") == "loadgroup":
        return xdist_groups.make_scheduler(config, log)
    return None


@pytest.fixture
def golden(request):
    """``golden("<module>/<case>", xml)``: compare ``xml`` with tests/golden/<module>/<case>.xml (rewrite it
    with --regen-golden), validate it with virt-xml-validate, define it on test:///default; returns
    libvirt's read-back XML. See tests/support/golden.py."""
    regen = request.config.getoption("--regen-golden")
    return lambda case, xml: golden_files.check(case, xml, regen=regen)


@pytest.fixture
def test_conn():
    """A private libvirt test driver (fresh state per test: a file-based test:/// URI)."""
    import libvirt

    conn = libvirt.open(f"test://{TEST_NODE_XML}")
    yield conn
    conn.close()


@pytest.fixture
def default_pools_conn():
    """test:///default, the driver the loader modules in this process see too; the storage pools a test
    defines or starts are removed afterwards (a transient one vanishes with its destroy: asked first)."""
    import libvirt

    c = libvirt.open("test:///default")
    before = {p.name() for p in c.listAllStoragePools(0)}
    yield c
    for obj in c.listAllStoragePools(0):
        if obj.name() not in before:
            persistent = obj.isPersistent()
            if obj.isActive():
                obj.destroy()
            if persistent:
                obj.undefine()
    c.close()


@pytest.fixture(scope="session")
def guest():
    """The tiny bootable test guest built by scripts/setup.sh."""
    needed = ["vmlinux", "vmlinuz", "initrd.img", "initrd-qga.img", "disk.raw", "disk.qcow2", "boot.qcow2"]
    missing = [n for n in needed if not (GUEST_DIR / n).is_file()]
    if missing:
        pytest.fail(f"test guest incomplete in {GUEST_DIR} (missing {missing}): run scripts/setup.sh")
    return {
        "dir": str(GUEST_DIR),
        # the uncompressed kernel through its PVH entry: half a TCG boot's CPU (scripts/build-guest.sh)
        "kernel": str(GUEST_DIR / "vmlinux"),
        "kernel_efi": str(GUEST_DIR / "vmlinuz"),  # OVMF starts a kernel by its EFI stub: the bzImage
        "initrd": str(GUEST_DIR / "initrd.img"),
        "initrd_qga": str(GUEST_DIR / "initrd-qga.img"),  # the same with qemu-ga (scripts/build-guest.sh)
        "raw": str(GUEST_DIR / "disk.raw"),
        "qcow2": str(GUEST_DIR / "disk.qcow2"),
        "boot": str(GUEST_DIR / "boot.qcow2"),  # boots by itself (extlinux), text on its screen too, DHCP
    }


@pytest.fixture(scope="session")
def lab_dir():
    path = tempfile.mkdtemp(prefix="svlab-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def fabric():
    fab = lab.Fabric(lab.new_tag()).start()
    yield fab
    fab.stop()


@pytest.fixture(scope="session")
def hv1(lab_dir, fabric):
    """A real libvirtd in its own namespaces (bridge br0, TCG guests)."""
    hv = lab.Hypervisor(lab_dir, 1, fabric).start()
    yield hv
    hv.stop()


@pytest.fixture
def boot_args(guest):
    """virt.init boot= for the test guest; the guest prints markers on its serial console."""
    return guest_boot(guest)


@pytest.fixture
def qemu_tmp():
    """A temp dir QEMU (user libvirt-qemu) can reach: pytest's tmp_path is 0700 under /tmp."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="svt-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def virt_test(tmp_path):
    """``__salt__`` with virt.* bound to libvirt's test:///default driver (state shared in-process).

    Every domain a test defines is removed afterwards; the driver's own 'test' domain is left as found.
    """
    import libvirt

    mods = make_minion_mods(tmp_path, "test:///default")
    conn = libvirt.open("test:///default")
    before = {d.name() for d in conn.listAllDomains(0)}
    yield mods
    for dom in conn.listAllDomains(0):
        if dom.name() not in before:
            if dom.isActive():
                dom.destroy()
            if dom.isPersistent():
                dom.undefine()
    test = conn.lookupByName("test")
    if not test.isActive():
        test.create()
    conn.close()


@pytest.fixture
def virt_hv(tmp_path, hv1, qemu_tmp):
    """``__salt__`` with virt.* bound to the real namespaced libvirtd ``hv1``; virt:images is
    ``qemu_tmp / 'images'``; virt:allowed_paths adds ``qemu_tmp`` itself (disks tests attach from there)
    and the test guest's directory; pools may be made in ``qemu_tmp`` on loop devices."""
    allowed = [str(GUEST_DIR), str(qemu_tmp)]
    # what the storage and serial tests use: pools in qemu_tmp on loop devices, any TCP serial port
    sources = {"devices": ["/dev/loop*"], "names": ["stvg*", "othervg"], "hosts": ["192.0.2.10"]}
    return make_minion_mods(
        tmp_path,
        hv1.uri,
        images_dir=qemu_tmp / "images",
        allowed_paths=allowed,
        pool_paths=[str(qemu_tmp)],
        pool_sources=sources,
        serial_tcp_ports="1024-65535",
    )


# real Salt daemons (pytest-salt-factories) --------------------------------------------------------
@pytest.fixture(scope="session")
def event_listener():
    """salt-factories' listener, keeping events for the whole run: its default drops an event 120 s after it
    arrived, so on a loaded machine a module that runs longer lost the events of its own start (issue 33:
    ``engine/connected`` not found 180 s later, "events seen: []")."""
    from saltfactories.plugins.event_listener import EventListener

    with EventListener(timeout=EVENTS_KEPT) as listener:
        yield listener


@pytest.fixture(scope="session")
def salt_factories_config():
    # short root_dir: unix socket paths must stay < 107 bytes; slow_stop=False saves ~5 s per daemon
    root = tempfile.mkdtemp(prefix="sf", dir="/tmp")
    yield {"root_dir": root, "start_timeout": 120, "slow_stop": False}
    # the daemons' trees (their caches hold the images they were served): ~0.5 GB a worker, left behind by every
    # run until a machine's disk was full
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def state_tree(guest):
    """Extra file_roots entry: salt://images/guest.{qcow2,raw} for runner/demo tests."""
    tree = pathlib.Path(tempfile.mkdtemp(prefix="svtree", dir="/var/tmp"))
    (tree / "images").mkdir()
    for fmt in ("qcow2", "raw"):
        shutil.copyfile(guest[fmt], tree / "images" / f"guest.{fmt}")
    yield tree
    shutil.rmtree(tree, ignore_errors=True)


@pytest.fixture(scope="session")
def salt_master(salt_factories, state_tree):
    factory = salt_factories.salt_master_daemon("master", overrides=master_config(state_tree))
    with factory.started():
        ret = factory.salt_run_cli(timeout=120).run("saltutil.sync_all")
        assert ret.returncode == 0, ret
        yield compiled(factory)


@pytest.fixture(scope="session")
def hyper1(salt_master, hv1, lab_dir):
    """Minion 'hyper1' managing the real libvirtd hv1, bundle pulled with saltutil.sync_all."""
    config = hypervisor_minion_config(hv1, pathlib.Path(lab_dir) / "hyper1-images")
    # Uyuni's create-vm.sls caches a kickstart kernel and initrd in /tmp/virt/<vm>/ (test_uyuni_real.py)
    config["virt"]["allowed_paths"].append("/tmp/virt")
    factory = start_minion(salt_master, "hyper1", config, sync=True)
    with factory.started():
        ret = factory.salt_call_cli(timeout=120).run("saltutil.sync_all")
        assert ret.returncode == 0, ret
        yield compiled(factory)


@pytest.fixture(scope="session")
def salt_cli(salt_master):
    return salt_master.salt_cli(timeout=120)


@pytest.fixture(scope="session")
def salt_run_cli(salt_master):
    return salt_master.salt_run_cli(timeout=180)
