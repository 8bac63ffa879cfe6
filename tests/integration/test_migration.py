"""Moving running guests between real hypervisors: ``salt hvN virt.migrate`` and ``salt-run
virt.migrate`` / ``virt.evacuate`` on a master of its own with three hypervisor minions, each
managing its own namespaced libvirtd (own host UUID, own bridge br0 on the shared fabric, own
``virt:images``). Minion ids are the hypervisors' host names, as on a real fleet.

    hv6   the source; shared storage is a directory every hypervisor sees at the same path
    hv7   the main target
    hv8   a target with little room: its virt:images is an 40 MiB tmpfs

Proof that a guest kept running across a move: the heartbeat (``HB <n>``, one per second) on its
serial console continues on the target's console log from where the source's stopped, with no new
boot; and it answers ping at the same address.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest

from saltvirt.pki import ca as pki
from tests.support import lab
from tests.support.paths import guest_boot
from tests.support.redis_server import RedisServer
from tests.support.saltd import hypervisor_minion_config, master_config, presync, started_minions

HVS = (6, 7, 8)
SMALL_MIB = 40
MASTER_VIRT = {
    # a minion job takes 20 s and more at load 20-30 on 2 cores: waits of 3 s + 3 s called live hosts down
    "hypervisors": {"tgt": "hv[678]", "tgt_type": "glob", "timeout": 5, "gather_job_timeout": 25},
    "placement": {"mem_reserve_mib": 256, "disk_reserve_mib": 0},
}


# the lab -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(lab_dir, guest):
    """Images every hypervisor sees at the same path: a golden qcow2, a raw disk full of random data."""
    root = pathlib.Path(lab_dir) / "mig-store"
    (root / "shared").mkdir(parents=True)
    shutil.copyfile(guest["qcow2"], root / "golden.qcow2")
    with open(root / "random.raw", "wb") as fh:
        fh.write(os.urandom(48 << 20))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def lab_hvs(lab_dir, fabric):
    """hv6..hv8, started by ``minions`` once their TLS files are in place (QEMU's too: its migration streams
    are encrypted, libvirt's VIR_MIGRATE_TLS)."""
    hvs = {
        f"hv{i}": lab.Hypervisor(lab_dir, i, fabric, tls_dir=os.path.join(lab_dir, f"hv{i}-pki"), qemu_tls=True)
        for i in HVS
    }
    small = pathlib.Path(lab_dir) / "hv8-images"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_MIB}m", "tmpfs", str(small)], check=True)
    try:
        yield hvs
    finally:
        for hv in hvs.values():
            if hv.pid:
                hv.stop()
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.fixture(scope="module")
def mmaster(salt_factories, state_tree):
    ext_pillar = [{"libvirt": {"key_size": 2048, "extra_sans": {f"hv{i}": [f"10.252.0.{10 + i}"] for i in HVS}}}]
    config = master_config(state_tree, virt=MASTER_VIRT, ext_pillar=ext_pillar)
    factory = presync(salt_factories.salt_master_daemon("mig-master", overrides=config))
    with factory.started():
        yield factory


def pkipath(hv):
    """libvirt's ``?pkipath=`` wants cacert.pem, clientcert.pem and clientkey.pem side by side; virt.keys
    writes the /etc/pki layout (libvirt's default paths on a real host): link a pkipath view of it."""
    view = os.path.join(hv.tls_dir, "client")
    os.makedirs(view, exist_ok=True)
    for name, rel in (
        ("cacert.pem", "CA/cacert.pem"),
        ("clientcert.pem", "libvirt/clientcert.pem"),
        ("clientkey.pem", "libvirt/private/clientkey.pem"),
    ):
        if not os.path.lexists(os.path.join(view, name)):
            os.symlink(os.path.join(hv.tls_dir, rel), os.path.join(view, name))
    return view


def foreign_tls(hv, tmp):
    """A TLS listener with a server certificate from another CA: what a TLS-refusing target looks like."""
    issued = pki.issue(os.path.join(tmp, "foreign-ca"), hv.hostname, "server", sans=[hv.hostname, hv.ip], key_size=2048)
    for rel, data in (
        ("CA/cacert.pem", pathlib.Path(os.path.join(tmp, "foreign-ca", "cacert.pem")).read_text()),
        ("libvirt/servercert.pem", issued["cert"]),
        ("libvirt/private/serverkey.pem", issued["key"]),
    ):
        os.makedirs(os.path.dirname(os.path.join(hv.tls_dir, rel)), exist_ok=True)
        with open(os.path.join(hv.tls_dir, rel), "w") as fh:
            fh.write(data)


@pytest.fixture(scope="module")
def minions(mmaster, lab_hvs, lab_dir, store):
    """One minion per hypervisor; each gets its libvirt and QEMU TLS files from the master's libvirt ext_pillar
    through the virt.keys state before its libvirtd starts (hv8's libvirtd then gets a server certificate from
    another CA). hv6 may migrate in clear (virt:migration:allow_cleartext: the tests that ask for plaintext by
    name start there); hv7 may not."""
    configs = {}
    for name, hv in lab_hvs.items():
        config = hypervisor_minion_config(hv, pathlib.Path(lab_dir) / f"{name}-images")
        config["virt"]["allowed_paths"].append(str(store))  # source images, and the shared-storage VM's disk
        config["virt"]["insecure_trusted_images"] = [str(store / "golden.qcow2")]  # overlays on it are attached
        config["virt"]["migration"] = {"qemu_tls_dir": os.path.join(hv.tls_dir, "qemu")}
        if name != "hv8":
            config["virt"]["migration"]["pkipath"] = pkipath(hv)
        if name == "hv6":
            config["virt"]["migration"]["allow_cleartext"] = True
        configs[name] = config
    with started_minions(mmaster, configs) as factories:
        cli = mmaster.salt_cli(timeout=180)
        ret = cli.run("test.ping", minion_tgt="hv*")
        assert ret.returncode == 0 and sorted(ret.data) == sorted(lab_hvs), ret
        assert cli.run("saltutil.refresh_pillar", "wait=True", minion_tgt="hv*").returncode == 0
        for name, hv in lab_hvs.items():
            ret = cli.run(
                "state.single", "virt.keys", "libvirt-keys", f"basepath={hv.tls_dir}", "qemu=True", minion_tgt=name
            )
            (state,) = ret.data.values()
            assert state["result"] is True and os.path.isfile(os.path.join(hv.tls_dir, "qemu", "server-key.pem")), ret
        foreign_tls(lab_hvs["hv8"], lab_dir)
        for hv in lab_hvs.values():
            hv.start().warm_up()
        yield factories


@pytest.fixture(scope="module")
def hvs(lab_hvs, minions):
    return lab_hvs


@pytest.fixture(scope="module")
def cli(mmaster, minions):
    """The ``salt`` command line, for what users type; ``local`` (in-process) for the test's own calls."""
    return mmaster.salt_cli(timeout=300)


@pytest.fixture(scope="module")
def local(mmaster, minions):
    import salt.client

    client = salt.client.get_local_client(os.path.join(mmaster.config_dir, "master"))
    yield client
    client.destroy()


def salt(cli, minion, fun, *args, **kwargs):
    return cli.run(fun, *args, *(f"{k}={json.dumps(v)}" for k, v in kwargs.items()), minion_tgt=minion)


def ok(local, minion, fun, *args, **kwargs):
    ret = local.cmd(minion, fun, list(args), kwarg=kwargs, timeout=300, full_return=True)
    assert minion in ret and ret[minion].get("retcode", 0) == 0, ret
    return ret[minion]["ret"]


def run(mmaster, *args, **kwargs):
    cmd = [*args, *(f"{k}={json.dumps(v)}" for k, v in kwargs.items())]
    return mmaster.salt_run_cli(timeout=600).run(*cmd)


# guests ------------------------------------------------------------------------------------------
# bound on waiting for a TCG guest's console: seconds when idle, minutes on a loaded shared machine
BOOT_WAIT = 300


class Console:
    """A guest's serial console across hypervisors: each keeps its own log of the same guest."""

    def __init__(self, hvs, name):
        self.hvs, self.name = hvs, name

    def path(self, host):
        return self.hvs[host].path("log", "qemu", f"{self.name}-serial.log")

    def text(self, host):
        try:
            with open(self.path(host), errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def beats(self, host):
        return [int(n) for n in re.findall(r"^HB (\d+)\r?$", self.text(host), re.M)]

    def mark(self, host):
        """Before a move: the console log's size on every host, and the last heartbeat on ``host``."""
        deadline = time.monotonic() + BOOT_WAIT
        while not self.beats(host):  # booted (or arrived) and beating
            assert time.monotonic() < deadline, f"no heartbeat of {self.name} on {host}:\n{self.text(host)[-500:]}"
            time.sleep(0.2)
        return {"sizes": {h: len(self.text(h)) for h in self.hvs}, "beat": self.beats(host)[-1], "from": host}

    def continued_on(self, host, mark):
        """The heartbeat goes on on ``host`` after a move, counting on from the source, with no new boot."""
        deadline = time.monotonic() + BOOT_WAIT
        while time.monotonic() < deadline:
            new = self.text(host)[mark["sizes"][host] :]
            beats = [int(n) for n in re.findall(r"^HB (\d+)\r?$", new, re.M)]
            if len(beats) >= 3:
                assert "GUEST-BOOT-OK" not in new, new
                assert beats[0] > mark["beat"] and beats == list(range(beats[0], beats[0] + len(beats))), new
                return beats
            time.sleep(0.2)
        raise AssertionError(f"no heartbeat of {self.name} on {host} after the move:\n{self.text(host)[-500:]}")


def boot(guest, ip=None):
    """virt.init boot= for the test guest (conftest's boot_args, for module-scoped fixtures), optionally with
    an address."""
    return guest_boot(guest, f"guest.ip={ip}/24" if ip else "")


def pings(fabric, ip):
    cmd = ["ip", "netns", "exec", fabric.netns, "busybox", "ping", "-c", "1", "-W", "2", ip]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def where(local, name, hosts=("hv6", "hv7", "hv8")):
    """``{host: state}`` of every hypervisor that has VM ``name`` defined (one publication)."""
    ret = local.cmd(list(hosts), "virt.vm_state", tgt_type="list", timeout=60)
    assert sorted(ret) == sorted(hosts), ret
    return {h: states[name] for h, states in ret.items() if name in states}


@pytest.fixture(scope="module")
def shared_vm(local, store, guest, hvs):
    """'vshared' on hv6, its disk a qcow2 overlay in the shared directory (onto the golden image)."""
    disk = store / "shared" / "vshared.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(store / "golden.qcow2"), str(disk)],
        check=True,
    )
    ok(
        local,
        "hv6",
        "virt.init",
        "vshared",
        1,
        128,
        boot=boot(guest, "10.252.0.61"),
        disks=[{"name": "system", "path": str(disk), "format": "qcow2"}],
    )
    return Console(hvs, "vshared")


# migrations --------------------------------------------------------------------------------------
def test_module_live_migration_with_shared_storage(cli, hvs, shared_vm, fabric, local):
    mark = shared_vm.mark("hv6")
    assert pings(fabric, "10.252.0.61")
    # libvirt only knows network/cluster filesystems as shared: a local one is refused, and said so
    ret = salt(cli, "hv6", "virt.migrate", "vshared", "hv7")
    assert ret.returncode != 0
    assert "Migration without shared storage is unsafe" in ret.stdout and "pass unsafe=True" in ret.stdout
    assert "VM 'vshared' is still running on hv6" in ret.stdout
    assert where(local, "vshared") == {"hv6": "running"}

    t0 = time.monotonic()
    # plaintext libvirtd connection, by name (hv6's operator allows it); QEMU's stream stays TLS (its certificates)
    ret = salt(cli, "hv6", "virt.migrate", "vshared", "hv7", unsafe=True, transport="tcp")
    assert ret.returncode == 0, ret
    print(f"module migration, shared storage, tcp: {time.monotonic() - t0:.1f} s")
    assert ret.data is True  # Salt's return (its tests assert isinstance(ret, bool)); report=True gives the report
    assert where(local, "vshared") == {"hv7": "running"}
    assert ok(local, "hv7", "virt.vm_info", "vshared")["vshared"]["persistent"] is True
    shared_vm.continued_on("hv7", mark)
    assert pings(fabric, "10.252.0.61")


def test_module_tunnelled_tls_migration(cli, local, hvs, shared_vm):
    # memory through the TLS libvirtd connection (16514); hv7's libvirtd authenticates with the client
    # certificate virt.keys wrote from the master's libvirt ext_pillar, and checks hv6's server certificate
    mark = shared_vm.mark("hv7")
    # hv7's operator did not allow cleartext: plaintext asked for by name is refused before anything moves
    ret = salt(cli, "hv7", "virt.migrate", "vshared", "hv6", unsafe=True, transport="tcp")
    assert ret.returncode != 0 and "would send the libvirtd connection (qemu+tcp) in clear: refused" in ret.stdout
    assert "virt:migration:allow_cleartext: True" in ret.stdout and where(local, "vshared") == {"hv7": "running"}
    ret = ok(local, "hv7", "virt.migrate", "vshared", "hv6", tunnel=True, unsafe=True, report=True)
    print(f"module migration, shared storage, tunnelled TLS: libvirt {ret['seconds']} s, converge {ret['converge']}")
    # no max_downtime anywhere: the adaptive target, set on the real QEMU before the copy (raised or not)
    adaptive = ret["converge"]["adaptive_downtime"]
    assert adaptive["start_ms"] == 50 and adaptive["raised_at_pass"] in (None, 2, 3)
    assert ret["converge"]["max_downtime_ms"] == (50 if adaptive["raised_at_pass"] is None else 300)
    assert (
        ret["tunnelled"] is True and ret["target_uri"] == f"qemu+tls://hv6/system?pkipath={hvs['hv7'].tls_dir}/client"
    )
    assert where(local, "vshared") == {"hv6": "running"}
    shared_vm.continued_on("hv6", mark)


def test_module_migration_to_salts_uri_form(cli, local, hvs, shared_vm):
    """Issue #36: Salt's form ``virt.migrate NAME qemu+tls://HOST/system`` (as Salt's own integration test calls
    it) migrates with the source's ``virt:migration:pkipath``, as the host name does (it read libvirt's default
    /etc/pki/CA/cacert.pem and failed); a caller's own ``?pkipath=`` is refused before anything moves."""
    mark = shared_vm.mark("hv6")
    ret = salt(cli, "hv6", "virt.migrate", "vshared", "qemu+tls://hv7/system?pkipath=/etc/pki", unsafe=True)
    assert ret.returncode != 0 and "virt.migrate target URI must be qemu+tls://<host>/system or" in ret.stdout, ret
    assert where(local, "vshared") == {"hv6": "running"}
    ret = salt(cli, "hv6", "virt.migrate", "vshared", "qemu+tls://hv7/system", unsafe=True)
    assert ret.returncode == 0 and ret.data is True, ret
    assert where(local, "vshared") == {"hv7": "running"}
    shared_vm.continued_on("hv7", mark)
    mark = shared_vm.mark("hv7")  # and back (later tests expect it on hv6), tunnelled, with the report
    ret = ok(local, "hv7", "virt.migrate", "vshared", "qemu+tls://hv6/system", tunnel=True, unsafe=True, report=True)
    assert ret["target_uri"] == f"qemu+tls://hv6/system?pkipath={hvs['hv7'].tls_dir}/client", ret
    assert ret["transport"] == "tls" and ret["tunnelled"] is True and "warnings" not in ret
    assert where(local, "vshared") == {"hv6": "running"}
    shared_vm.continued_on("hv6", mark)


def test_runner_proves_shared_storage_and_migrates_in_place(mmaster, local, hvs, shared_vm, store):
    mark = shared_vm.mark("hv6")
    ret = run(mmaster, "virt.migrate", "vshared", "hv7")
    assert ret.returncode == 0, ret
    data = ret.data
    print(f"runner migration, shared storage, direct: {data['seconds']} s (libvirt {data['migration_seconds']} s)")
    assert (data["source"], data["target"], data["state"], data["persistent"]) == ("hv6", "hv7", "running", True)
    # the default: TLS (16514) with the client certificate virt.keys wrote, no warning
    assert data["copy_storage"] is None and data["tunnelled"] is False and data["transport"] == "tls"
    assert data["qemu_tls"] is True  # the memory stream over QEMU's own TLS (VIR_MIGRATE_TLS)
    assert data["target_uri"] == f"qemu+tls://hv7/system?pkipath={hvs['hv6'].tls_dir}/client"
    assert "warnings" not in data
    assert data["disks"] == [str(store / "shared" / "vshared.qcow2")] and "source_files_left" not in data
    assert where(local, "vshared") == {"hv7": "running"}
    shared_vm.continued_on("hv7", mark)
    assert not list((store / "shared").glob(".salt-virt-probe-*"))  # the probe files are gone


@pytest.fixture
def redis_store(mmaster):
    """The runner's shared store (locks) on a real redis-server: master.d/redis.conf, which salt-run reads
    per call (the master daemon keeps its own cache)."""
    server = RedisServer().start()
    path = pathlib.Path(mmaster.config_dir) / "master.d" / "redis.conf"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(server.master_opts()))
    yield server
    path.unlink()
    server.stop()


def test_redis_lost_mid_migration_moves_the_vm_once_and_says_so(mmaster, local, hvs, shared_vm, redis_store):
    """redis dies (connection refused) while salt-run virt.migrate moves vshared: libvirt finishes the move,
    the VM runs once, on the target, and the answer says what the runner could not do without its store;
    with redis back (its snapshot holds the lock) the VM migrates again."""
    import libvirt
    import salt.config

    from saltvirt.fleet import fleetstate

    mark = shared_vm.mark("hv7")
    exe = pathlib.Path(sys.executable).parent / "salt-run"
    cmd = [str(exe), "-c", str(mmaster.config_dir), "--out=json", "virt.migrate", "vshared", "hv6", "max_bandwidth=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        conn = libvirt.open(hvs["hv7"].uri)
        dom = conn.lookupByName("vshared")
        deadline = time.monotonic() + BOOT_WAIT
        while dom.jobInfo()[0] == libvirt.VIR_DOMAIN_JOB_NONE or not dom.jobInfo()[3]:  # moving memory
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        redis_store.client().save()  # a redis with persistence: what it held comes back with it
        redis_store.crash()
        dom.migrateSetMaxSpeed(100000)  # 1 MiB/s kept it moving until redis was gone; now let it finish
        conn.close()
        out, err = proc.communicate(timeout=BOOT_WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        redis_store.start()
    assert proc.returncode == 0, (out, err[-2000:])
    data = json.loads(out)
    print(json.dumps(data, indent=1))
    assert (data["source"], data["target"], data["undefined_on_source"]) == ("hv7", "hv6", True), data
    assert where(local, "vshared") == {"hv6": "running"}  # once, on the target
    shared_vm.continued_on("hv6", mark)
    unconfirmed, unreleased = data["warnings"]
    assert "hv6 could not be asked how the VM runs there: the shared runner state (redis" in unconfirmed, data
    assert unreleased.startswith("the lock of 'vshared' could not be given back: the shared runner state (redis")
    observer = dict(salt.config.master_config(None), id="observer", **redis_store.master_opts())
    assert fleetstate.holders(observer)["vshared"]["owner"]["pid"] == proc.pid
    # redis is back: the lock of the finished runner (its process is gone) is taken over, the VM moves again
    ret = run(mmaster, "virt.migrate", "vshared", "hv7")
    assert ret.returncode == 0 and "warnings" not in ret.data, ret
    assert where(local, "vshared") == {"hv7": "running"} and fleetstate.holders(observer) == {}


@pytest.fixture
def tunnel_in_master_config(mmaster):
    """``virt: {tunnel: true}`` in the master config, as the tutorial has it (salt-run reads it per call)."""
    path = pathlib.Path(mmaster.config_dir) / "master.d" / "tunnel.conf"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"virt": dict(MASTER_VIRT, tunnel=True)}))  # an include replaces top-level keys
    yield
    path.unlink()


def test_runner_tunnel_from_master_config(mmaster, local, hvs, shared_vm, tunnel_in_master_config):
    mark = shared_vm.mark("hv7")
    ret = run(mmaster, "virt.migrate", "vshared", "hv6")
    assert ret.returncode == 0, ret
    data = ret.data
    print(
        f"runner migration, shared storage, tunnelled TLS: {data['seconds']} s (libvirt {data['migration_seconds']} s)"
    )
    assert (
        data["tunnelled"] is True and data["target_uri"] == f"qemu+tls://hv6/system?pkipath={hvs['hv7'].tls_dir}/client"
    )
    assert where(local, "vshared") == {"hv6": "running"}
    shared_vm.continued_on("hv6", mark)


@pytest.fixture
def flat_tunnel_in_master_config(mmaster):
    """The older tutorial's flat spelling ``virt.tunnel: True`` in the master config (honoured, warned)."""
    path = pathlib.Path(mmaster.config_dir) / "master.d" / "flat-tunnel.conf"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"virt.tunnel": True}))
    yield
    path.unlink()


def test_runner_tunnel_from_the_tutorials_flat_master_setting(
    mmaster, local, hvs, shared_vm, flat_tunnel_in_master_config
):
    for source, target in (("hv6", "hv7"), ("hv7", "hv6")):  # and back: later tests expect it on hv6
        assert where(local, "vshared") == {source: "running"}
        mark = shared_vm.mark(source)
        ret = run(mmaster, "virt.migrate", "vshared", target)
        assert ret.returncode == 0, ret
        data = ret.data
        assert data["tunnelled"] is True and data["target_uri"].startswith(f"qemu+tls://{target}/system?pkipath=")
        assert where(local, "vshared") == {target: "running"}
        shared_vm.continued_on(target, mark)


def test_runner_shared_nothing_overlay_copies_the_top_layer(
    mmaster, local, hvs, store, guest, lab_dir, tunnel_in_master_config
):
    ok(
        local,
        "hv6",
        "virt.init",
        "vlocal",
        1,
        128,
        image=str(store / "golden.qcow2"),
        enable_qcow=True,
        seed=False,
        boot=boot(guest, "10.252.0.62"),
    )
    console = Console(hvs, "vlocal")
    mark = console.mark("hv6")
    src = pathlib.Path(lab_dir) / "hv6-images" / "vlocal" / "system.qcow2"
    dst = pathlib.Path(lab_dir) / "hv7-images" / "vlocal" / "system.qcow2"
    ret = run(mmaster, "virt.migrate", "vlocal", "hv7")
    assert ret.returncode == 0, ret
    data = ret.data
    print(
        f"runner migration, shared nothing, overlay (copy inc), TLS: {data['seconds']} s"
        f" (libvirt {data['migration_seconds']} s)"
    )
    assert data["copy_storage"] == "inc" and data["disks"] == [str(dst)] and data["source_files_left"] == [str(src)]
    assert data["qemu_tls"] is True and "warnings" not in data  # memory and the disk copy (NBD) over QEMU's TLS
    # virt:tunnel is set, but libvirt cannot tunnel a disk copy: TLS libvirtd connection, direct data stream
    assert data["tunnelled"] is False and data["target_uri"].startswith("qemu+tls://hv7/system?pkipath=")
    assert "cannot tunnel a disk copy" in data["note"]
    info = json.loads(
        subprocess.run(
            ["qemu-img", "info", "-U", "--output=json", str(dst)], check=True, capture_output=True, text=True
        ).stdout
    )
    assert info["format"] == "qcow2" and info["backing-filename"] == str(store / "golden.qcow2")
    assert info["virtual-size"] == 64 << 20
    assert where(local, "vlocal") == {"hv7": "running"}
    console.continued_on("hv7", mark)
    same = subprocess.run(
        ["qemu-img", "compare", "-U", str(src), str(dst)], capture_output=True, text=True, check=False
    )
    assert same.returncode == 0, same.stdout + same.stderr  # the guest's disk arrived whole


@pytest.fixture
def purge_vbig(local):
    """The test's VM 'vbig' purged wherever it is when the test fails half way, so the evacuation test's placement
    (VM counts) does not inherit it."""
    yield
    for host, _state in where(local, "vbig").items():
        local.cmd(host, "virt.purge", ["vbig"], timeout=300)


def test_room_refused_then_full_copy(mmaster, local, hvs, store, guest, lab_dir, purge_vbig):
    ok(local, "hv6", "virt.init", "vbig", 1, 128, image=str(store / "random.raw"), seed=False, boot=boot(guest))
    console = Console(hvs, "vbig")
    console.mark("hv6")
    small = pathlib.Path(lab_dir) / "hv8-images"
    ret = run(mmaster, "virt.migrate", "vbig", "hv8")
    assert ret.returncode != 0
    assert re.search(
        r"not enough room on hv8 for VM 'vbig': its disks need about \d+ MiB in .*hv8-images, \d+ MiB are free",
        ret.stdout,
    ), ret.stdout
    assert "Nothing was migrated, the VM stays on hv6" in ret.stdout
    assert where(local, "vbig") == {"hv6": "running"} and os.listdir(small) == []

    mark = console.mark("hv6")
    ret = run(mmaster, "virt.migrate", "vbig", "hv7")
    assert ret.returncode == 0, ret
    print(
        f"runner migration, shared nothing, 48 MiB raw (copy all): {ret.data['seconds']} s"
        f" (libvirt {ret.data['migration_seconds']} s)"
    )
    dst = pathlib.Path(lab_dir) / "hv7-images" / "vbig" / "system.raw"
    assert ret.data["copy_storage"] == "all" and ret.data["disks"] == [str(dst)]
    console.continued_on("hv7", mark)
    src = pathlib.Path(lab_dir) / "hv6-images" / "vbig" / "system.raw"
    digest = [
        subprocess.run(["sha256sum", str(p)], capture_output=True, text=True, check=False).stdout.split()[0]
        for p in (src, dst)
    ]
    assert digest[0] == digest[1]
    # the target owns the disks it prepared: virt.purge there removes them
    purged = ok(local, "hv7", "virt.purge", "vbig")
    assert purged["removed"] == [str(dst)] and not dst.parent.exists()


def test_failures_leave_the_vm_running_on_the_source(mmaster, cli, local, hvs, shared_vm, lab_dir):
    ret = salt(cli, "hv6", "virt.migrate", "vshared", "hv9", unsafe=True)  # no hypervisor at that address
    assert ret.returncode != 0
    assert "unable to connect to server at 'hv9:16514'" in ret.stdout and "is libvirtd running on hv9" in ret.stdout
    assert "VM 'vshared' is still running on hv6" in ret.stdout
    ret = salt(
        cli, "hv6", "virt.migrate", "vshared", "hv8", tunnel=True, unsafe=True
    )  # hv8: a certificate from another CA
    assert ret.returncode != 0
    assert "TLS refused" in ret.stdout and "VM 'vshared' is still running on hv6" in ret.stdout
    ret = run(mmaster, "virt.migrate", "vshared", "hv5")
    assert ret.returncode != 0 and "hv5 is not a known hypervisor (known: hv6, hv7, hv8)" in ret.stdout
    ret = run(mmaster, "virt.migrate", "nosuchvm", "hv6")
    assert ret.returncode != 0 and "VM 'nosuchvm' is not defined on any hypervisor that answered" in ret.stdout
    assert where(local, "vshared") == {"hv6": "running"}

    # after the target prepared disks: the migration is refused by TLS, the prepared files go again
    ret = run(mmaster, "virt.migrate", "vlocal", "hv8", tunnel=True)
    assert ret.returncode != 0
    assert "migrating VM 'vlocal' from hv7 to hv8 failed: " in ret.stdout and "TLS refused" in ret.stdout
    assert "VM 'vlocal' is still running on hv7" in ret.stdout
    removed = ret.data["target_cleanup"]["removed"]
    assert str(pathlib.Path(lab_dir) / "hv8-images" / "vlocal" / "system.qcow2") in removed
    assert os.listdir(pathlib.Path(lab_dir) / "hv8-images") == [] and ret.data["source_state"] == "running"
    assert where(local, "vlocal") == {"hv7": "running"}


def test_evacuate_moves_every_vm_off_the_host(mmaster, local, hvs, guest, store, shared_vm):
    """hv6 holds: ew1 + ew2 (anti-affinity group web), ebig (48 MiB of local data: no room on hv8),
    vshared (shared storage) and estop (stopped: moved offline). Placement weighs VM count only, so
    every VM is offered the emptier hv8 first: deterministic choices to check."""
    for name in ("ew1", "ew2"):
        ok(local, "hv6", "virt.init", name, 1, 128, disk=None, group="web", boot=boot(guest))
    ok(local, "hv6", "virt.init", "ebig", 1, 128, image=str(store / "random.raw"), seed=False, boot=boot(guest))
    ok(local, "hv6", "virt.init", "estop", 1, 128, disk=None, start=False, boot=boot(guest))
    consoles = {n: Console(hvs, n) for n in ("ebig", "ew1", "ew2", "vshared")}
    marks = {n: c.mark("hv6") for n, c in consoles.items()}
    # hv8's libvirtd has a certificate from another CA: plaintext asked for by name (reported) reaches it
    policy = {"weights": {"mem": 0, "cpu": 0, "disk": 0, "vms": 1}, "transport": "tcp"}
    ret = run(mmaster, "virt.evacuate", "hv6", dry_run=True, **policy)
    assert ret.returncode == 0, ret
    plan = {n: p["target"] for n, p in ret.data["plan"].items()}
    # a plan books each VM where it would go (ties go to the lower id); it cannot know hv8 lacks room for ebig
    assert plan == {"ebig": "hv8", "ew1": "hv7", "ew2": "hv8", "vshared": "hv7", "estop": "hv8"}, ret.data
    assert where(local, "ew1") == {"hv6": "running"}  # a dry run moves nothing

    ret = run(mmaster, "virt.evacuate", "hv6", **policy)
    assert ret.returncode == 0, ret
    data = ret.data
    print(f"evacuate hv6 (5 VMs, one stopped): {sum(m['seconds'] for m in data['moved'].values()):.1f} s")
    assert data["evacuated"] is True and data["failed"] == {} and ok(local, "hv6", "virt.list_domains") == []
    targets = {n: m["target"] for n, m in data["moved"].items()}
    # ebig: hv8 refused it for room before anything was created, so it went to the next best host
    assert targets == {"ebig": "hv7", "ew1": "hv8", "ew2": "hv7", "vshared": "hv8", "estop": "hv8"}, data
    assert "not enough room on hv8 for VM 'ebig'" in data["moved"]["ebig"]["failed_first"][0]
    assert data["moved"]["ebig"]["copy_storage"] == "all" and data["moved"]["vshared"]["copy_storage"] is None
    assert data["moved"]["estop"]["live"] is False and where(local, "estop") == {"hv8": "shutoff"}
    assert all("plaintext migration" in m["warnings"][0] for m in data["moved"].values())
    # the libvirtd connection in clear (asked for, allowed on hv6); the VMs' memory and disks over QEMU's TLS
    assert all(m["qemu_tls"] is (m["live"] is True) and len(m["warnings"]) == 1 for m in data["moved"].values())
    for name, console in consoles.items():
        assert where(local, name) == {targets[name]: "running"}
        console.continued_on(targets[name], marks[name])
    for name in ("ew1", "ew2", "ebig", "estop"):
        ok(local, targets[name], "virt.purge", name)


def test_target_down(mmaster, local, hvs, minions):
    for name in ok(local, "hv8", "virt.list_domains"):  # a killed libvirtd leaves its guests running
        ok(local, "hv8", "virt.purge", name)
    hvs["hv8"].kill_daemon()  # the minion answers, its libvirtd does not
    ret = run(mmaster, "virt.migrate", "vlocal", "hv8")
    assert ret.returncode != 0
    assert "target hypervisor hv8 answered with an error: cannot connect to libvirt at " in ret.stdout
    assert (
        "Check that libvirtd is running and that virt:connection:uri is right. VM 'vlocal' stays on hv7" in ret.stdout
    )
    minions["hv8"].terminate()
    ret = run(mmaster, "virt.migrate", "vlocal", "hv8")
    assert (
        ret.returncode != 0
        and "target hypervisor hv8 is down" in ret.stdout
        and "VM 'vlocal' stays on hv7" in ret.stdout
    )
    assert where(local, "vlocal", ("hv6", "hv7")) == {"hv7": "running"}
