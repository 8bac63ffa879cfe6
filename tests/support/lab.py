"""Test lab: real libvirtd "hypervisors" on this one machine, no systemd needed.

Each Hypervisor runs its own libvirtd + virtlogd inside its own network + mount + UTS namespace, with
private /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt (bind
mounts of directories under ``base``), its own host UUID and hostname, and a bridge ``br0`` uplinked to
a shared "fabric" bridge living in a namespace of its own. Several labs (two test sessions, a developer
and CI) can run side by side because every namespace and interface name carries a per-lab tag.

Used by the tests, the demo and the benchmarks; not part of the product.
"""

import contextlib
import filecmp
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

FABRIC_NET = "10.252.0"
READY_TIMEOUT = 300  # seconds: libvirtd's start on a loaded 2-core machine, far above what it needs
# libvirt's QEMU capabilities, shared by every lab libvirtd of this machine: a libvirtd with an empty cache probes
# QEMU by starting it (3.5 s on a quiet machine, ~0.4 CPU-s; some 200 libvirtd starts a test run). libvirt checks
# each cached file against its own and QEMU's binaries, the kernel, the CPU and /dev/kvm, and probes again when one
# changed: a stale file costs one probe, whose result replaces it here.
CAPS_CACHE = pathlib.Path(os.environ.get("SALT_VIRT_QEMU_CAPS_CACHE", "/var/cache/salt-virt/libvirt-qemu-caps"))


def run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


class Fabric:
    """A namespace holding bridge fab0 that every hypervisor's br0 is uplinked to."""

    def __init__(self, tag):
        self.tag = tag
        self.netns = f"sv{tag}f"
        self.up = False
        self.dnsmasq_pid = None
        self.master_ip = None
        self.leases = None

    def start(self):
        run(["ip", "netns", "add", self.netns], check=False)
        run(["ip", "-n", self.netns, "link", "add", "fab0", "type", "bridge"], check=False)
        run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        run(["ip", "-n", self.netns, "link", "set", "fab0", "up"])
        run(["ip", "-n", self.netns, "addr", "replace", f"{FABRIC_NET}.1/24", "dev", "fab0"])
        self.up = True
        return self

    def stop(self):
        if self.dnsmasq_pid:
            with contextlib.suppress(OSError):
                os.kill(self.dnsmasq_pid, signal.SIGTERM)
            self.dnsmasq_pid = None
        if self.leases:
            shutil.rmtree(os.path.dirname(self.leases), ignore_errors=True)
            self.leases = None
        run(["ip", "link", "del", f"sv{self.tag}m"], check=False)
        run(["ip", "netns", "del", self.netns], check=False)
        self.up = False

    def master_link(self):
        """Let guests on the fabric reach services of the root namespace (the tests' salt-master).

        Shape: guest (10.252.0.x, DHCP) -> br0 of its hypervisor -> fab0 (10.252.0.1, the guests'
        router) -> veth ``sv<tag>n`` in the fabric namespace (10.253.A.B+2/30) -> ``sv<tag>m`` in the
        root namespace (10.253.A.B+1/30). The fabric masquerades what it forwards, so the root
        namespace never needs a route back to 10.252.0.0/24 (every lab uses that subnet) and labs
        running side by side do not collide. Returns the address guests use for the master (a salt
        master must listen on it or on 0.0.0.0)."""
        n = int(self.tag, 16)
        a, b = (n >> 8) & 0xFF, (n & 0x3F) * 4
        root_ip, fab_ip = f"10.253.{a}.{b + 1}", f"10.253.{a}.{b + 2}"
        up, down = f"sv{self.tag}m", f"sv{self.tag}n"
        run(["ip", "link", "add", up, "type", "veth", "peer", "name", down], check=False)
        run(["ip", "link", "set", down, "netns", self.netns], check=False)
        run(["ip", "addr", "replace", f"{root_ip}/30", "dev", up])
        run(["ip", "link", "set", up, "up"])
        run(["ip", "-n", self.netns, "addr", "replace", f"{fab_ip}/30", "dev", down])
        run(["ip", "-n", self.netns, "link", "set", down, "up"])
        run(["ip", "netns", "exec", self.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        nat = ["ip", "netns", "exec", self.netns, "iptables", "-t", "nat"]
        rule = ["POSTROUTING", "-o", down, "-j", "MASQUERADE"]
        if run(nat + ["-C"] + rule, check=False).returncode:
            run(nat + ["-A"] + rule)
        self.master_ip = root_ip
        return root_ip

    def dhcp(self, first=100, last=199):
        """A DHCP server on fab0 (dnsmasq, no DNS): leases 10.252.0.<first..last>, router 10.252.0.1."""
        if self.dnsmasq_pid:
            return self
        base = tempfile.mkdtemp(prefix=f"sv{self.tag}dhcp-", dir="/var/tmp")
        pidfile = os.path.join(base, "dnsmasq.pid")
        run(
            ["ip", "netns", "exec", self.netns, "dnsmasq", "--port=0", "--interface=fab0", "--bind-interfaces",
             "--except-interface=lo", f"--dhcp-range={FABRIC_NET}.{first},{FABRIC_NET}.{last},1h",
             f"--dhcp-option=3,{FABRIC_NET}.1", f"--dhcp-leasefile={base}/leases", f"--pid-file={pidfile}",
             "--dhcp-authoritative", "--conf-file=/dev/null"]
        )  # fmt: skip
        with open(pidfile) as fh:
            self.dnsmasq_pid = int(fh.read().strip())
        self.leases = os.path.join(base, "leases")
        return self


# addresses of the root namespace Hypervisor.forward listens on now: {(loopback, port): the hypervisor's netns}
_FORWARDED = {}


def loopback(index):
    """Lab hypervisor ``index``'s own loopback address in the root namespace (127.0.0.0/8 is all loopback): where
    :meth:`Hypervisor.forward` listens, so that two hypervisors' VMs on the same websocket port (QEMU starts at
    5700 in each namespace), in one test module or in two xdist workers, never ask for the same address."""
    return f"127.0.0.{10 + index}"


class Hypervisor:
    """One libvirtd in its own namespaces. ``uri`` reaches it from the root namespace."""

    def __init__(
        self,
        base,
        index,
        fabric,
        tls_dir=None,
        extra_libvirtd_conf="",
        hostname=None,
        lockspace=None,
        qemu_tls=False,
        etc_pki=None,
        extra_qemu_conf="",
    ):
        self.index = index
        # a directory shown as /etc/pki inside the namespaces (libvirtd's default TLS paths, which a formula's
        # libvirtd.conf names: crl_file "/etc/pki/CA/cacrl.pem"); the host's /etc is not touched
        self.etc_pki = etc_pki
        self.qemu_tls = qemu_tls  # QEMU's own TLS (migration streams) from <tls_dir>/qemu: virt.keys qemu: True
        self.extra_qemu_conf = extra_qemu_conf  # more qemu.conf lines (vnc_tls, ...)
        self.lockspace = lockspace  # a directory: libvirt's lock manager (virtlockd) keeps disk leases there
        self.fabric = fabric
        self.hostname = hostname or f"hv{index}"
        self.dir = os.path.join(base, self.hostname)
        self.netns = f"sv{fabric.tag}h{index}"
        self.ip = f"{FABRIC_NET}.{10 + index}"
        self.loopback = loopback(index)  # where forward() listens in the root namespace
        self.tls_dir = tls_dir
        self.extra_conf = extra_libvirtd_conf
        self.host_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{fabric.tag}-{index}"))
        self.pid = None

    # paths -------------------------------------------------------------------------------
    @property
    def socket(self):
        return os.path.join(self.dir, "run", "libvirt-sock")

    @property
    def uri(self):
        return f"qemu+unix:///system?socket={self.socket}"

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    # lifecycle ---------------------------------------------------------------------------
    def _write_config(self):
        d = self.dir
        shutil.rmtree(self.path("etc"), ignore_errors=True)
        shutil.rmtree(self.path("run"), ignore_errors=True)
        for sub in ("run", "lib", "cache", "log", "log/qemu", "lib/images", "etc-overlay"):
            os.makedirs(self.path(sub), exist_ok=True)
        self._seed_caps()
        shutil.copytree("/etc/libvirt", self.path("etc"), symlinks=True)
        autostart = self.path("etc", "qemu", "networks", "autostart", "default.xml")
        if os.path.lexists(autostart):
            os.unlink(autostart)
        conf = [
            f'host_uuid = "{self.host_uuid}"',
            "listen_tcp = 1",
            'auth_tcp = "none"',
            'listen_addr = "0.0.0.0"',
            f'log_outputs = "3:file:{d}/log/libvirtd.log"',
        ]
        if self.tls_dir:
            conf += [
                "listen_tls = 1",
                'auth_tls = "none"',
                f'ca_file = "{self.tls_dir}/CA/cacert.pem"',
                f'cert_file = "{self.tls_dir}/libvirt/servercert.pem"',
                f'key_file = "{self.tls_dir}/libvirt/private/serverkey.pem"',
            ]
        else:
            conf.append("listen_tls = 0")
        with open(self.path("etc", "libvirtd.conf"), "a") as fh:
            fh.write("\n".join(conf) + "\n" + self.extra_conf + "\n")
        with open(self.path("etc", "qemu.conf"), "a") as fh:
            fh.write('cgroup_controllers = [ ]\nremember_owner = 0\nmigration_address = "0.0.0.0"\n')
            if self.qemu_tls:  # libvirtd refuses to start when this directory does not exist
                fh.write(f'default_tls_x509_cert_dir = "{self.tls_dir}/qemu"\n')
            if self.lockspace:  # every disk leased in the shared lockspace: QEMU never opens one held elsewhere
                fh.write('lock_manager = "lockd"\n')
            fh.write(self.extra_qemu_conf)
        if self.lockspace:
            with open(self.path("etc", "qemu-lockd.conf"), "w") as fh:
                fh.write("auto_disk_leases = 1\nrequire_lease_for_disks = 1\n")
                fh.write(f'file_lockspace_dir = "{self.lockspace}"\n')
        with open(self.path("hosts"), "w") as fh:
            fh.write("127.0.0.1 localhost\n")
            for i in range(1, 28):  # hv1..hv27: every lab index the tests use
                fh.write(f"{FABRIC_NET}.{10 + i} hv{i}\n")

    def _seed_caps(self):
        """This libvirtd's QEMU capabilities cache from :data:`CAPS_CACHE` (a file it has is kept)."""
        mine = pathlib.Path(self.path("cache", "qemu", "capabilities"))
        mine.mkdir(parents=True, exist_ok=True)
        for shared in CAPS_CACHE.glob("*.xml"):
            if not (mine / shared.name).exists():
                shutil.copy2(shared, mine / shared.name)

    def _share_caps(self):
        """This libvirtd's probed QEMU capabilities into :data:`CAPS_CACHE`, where they differ (replaced whole): once
        it answers after a start, when libvirtd has written them (it probes while starting)."""
        for probed in pathlib.Path(self.path("cache", "qemu", "capabilities")).glob("*.xml"):
            shared = CAPS_CACHE / probed.name
            if shared.exists() and filecmp.cmp(probed, shared, shallow=False):
                continue
            with contextlib.suppress(OSError):  # a cache, never a reason to fail
                CAPS_CACHE.mkdir(parents=True, exist_ok=True)
                part = CAPS_CACHE / f".{probed.name}.{os.getpid()}"
                shutil.copy2(probed, part)
                os.replace(part, shared)

    @property
    def mac(self):
        return f"02:5e:{self.fabric.tag[:2]}:{self.fabric.tag[2:4]}:00:{self.index:02x}"

    def _network(self):
        ns, fab = self.netns, self.fabric.netns
        up, down = f"sv{self.fabric.tag}u{self.index}", f"sv{self.fabric.tag}d{self.index}"
        run(["ip", "netns", "add", ns], check=False)
        run(["ip", "link", "add", up, "type", "veth", "peer", "name", down], check=False)
        run(["ip", "link", "set", down, "netns", fab], check=False)
        run(["ip", "-n", fab, "link", "set", down, "master", "fab0", "up"])
        run(["ip", "link", "set", up, "netns", ns], check=False)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        run(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"], check=False)
        # the same address for the same lab index every time: a peer's ARP entry for this IP, left from an
        # earlier hypervisor of that index, stays right (a new random MAC made it "No route to host")
        run(["ip", "-n", ns, "link", "set", "br0", "address", self.mac])
        run(["ip", "-n", ns, "link", "set", up, "master", "br0", "up"])
        run(["ip", "-n", ns, "link", "set", "br0", "up"])
        run(["ip", "-n", ns, "addr", "replace", f"{self.ip}/24", "dev", "br0"])

    def _mounts(self):
        """Shell lines run first in the daemons' new mount namespace (``ip netns exec`` makes one, its mounts
        stay in it): the hostname and the private libvirt directories; with ``etc_pki``, /etc as an overlay
        (its upper layer a tmpfs, gone with the namespace) where /etc/pki shows that directory."""
        d = self.dir
        pki = ""
        if self.etc_pki:
            pki = f"""
            mount -t tmpfs -o mode=0700 svlab {d}/etc-overlay
            mkdir {d}/etc-overlay/upper {d}/etc-overlay/work
            mount -t overlay svlab -o lowerdir=/etc,upperdir={d}/etc-overlay/upper,workdir={d}/etc-overlay/work /etc
            mkdir -p /etc/pki
            mount --bind {self.etc_pki} /etc/pki"""
        return f"""hostname {self.hostname}{pki}
            mount --bind {d}/etc   /etc/libvirt
            mount --bind {d}/run   /run/libvirt
            mount --bind {d}/lib   /var/lib/libvirt
            mount --bind {d}/cache /var/cache/libvirt
            mount --bind {d}/log   /var/log/libvirt
            mount --bind {d}/hosts /etc/hosts"""

    def start(self, timeout=READY_TIMEOUT):
        self._write_config()
        self._network()
        d = self.dir
        script = f"""
            {self._mounts()}
            virtlogd -d -p {d}/virtlogd.pid
            {f"virtlockd -d -p {d}/virtlockd.pid" if self.lockspace else ""}
            libvirtd -d -l -p {d}/libvirtd.pid
        """
        os.makedirs("/run/libvirt", exist_ok=True)
        os.makedirs("/var/cache/libvirt", exist_ok=True)
        run(["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-ec", script])
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline:
                raise RuntimeError(f"libvirtd for {self.hostname} did not start; see {d}/log/libvirtd.log")
            time.sleep(0.05)
        with open(self.path("libvirtd.pid")) as fh:
            self.pid = int(fh.read().strip())
        self.wait_ready()
        self._share_caps()
        return self

    def wait_ready(self, timeout=READY_TIMEOUT):
        """Wait until libvirtd answers on its socket and its TCP port answers from the fabric (routes and
        ARP up: what a migration peer needs), saying what it saw when it gives up."""
        deadline = time.monotonic() + timeout
        seen = "nothing tried"
        port = 16514 if "listen_tcp = 0" in self.extra_conf else 16509
        probe = f"exec 3<>/dev/tcp/{self.ip}/{port}"
        while time.monotonic() < deadline:
            answer = run(["virsh", "-c", self.uri, "version"], check=False)
            if answer.returncode:
                seen = f"virsh version: {answer.stderr.strip()[-300:]}"
            else:
                peer = run(["ip", "netns", "exec", self.fabric.netns, "timeout", "5", "bash", "-c", probe], check=False)
                if not peer.returncode:
                    return self
                seen = f"{self.ip}:{port} from the fabric: {peer.stderr.strip()[-300:] or 'no answer'}"
            time.sleep(0.2)
        raise RuntimeError(f"libvirtd {self.hostname} not ready within {timeout} s: {seen}; see {self.dir}/log")

    def warm_up(self):
        """Make libvirtd probe QEMU now: a fresh libvirtd does it at its first use (seconds; much longer
        on a loaded machine), which must not happen while a migration's peer connection waits on it."""
        import libvirt

        conn = libvirt.open(self.uri)
        try:
            conn.getDomainCapabilities(None, "x86_64", None, "qemu")
        finally:
            conn.close()

    def ns_run(self, cmd, check=True):
        """Run a command inside this hypervisor's namespaces (network + mounts)."""
        return run(["nsenter", "-t", str(self.pid), "-n", "-m", "-u", "--"] + list(cmd), check=check)

    @contextlib.contextmanager
    def forward(self, port):
        """``<its loopback>:port`` of the root namespace (:func:`loopback`) forwarded to ``127.0.0.1:port`` in this
        hypervisor's network namespace, while the context lasts: how a browser on this machine reaches a VM's
        VNC websocket (it listens on the hypervisor's 127.0.0.1, as on a real host before ``graphics:listen``
        opens it). A port this process forwards to this hypervisor already is reused (QEMU gives a port free
        again to the next VM started): the first context owns it."""
        import ctypes
        import socket
        import threading

        where = (self.loopback, port)
        owner = _FORWARDED.get(where)
        if owner is not None:
            assert owner == self.netns, f"{self.loopback}:{port} is forwarded into {owner} already"
            yield f"{self.loopback}:{port}"
            return
        libc = ctypes.CDLL(None, use_errno=True)
        ns_fd = os.open(f"/var/run/netns/{self.netns}", os.O_RDONLY)

        def pump(src, dst):
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    dst.sendall(data)
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        def serve(client):
            if libc.setns(ns_fd, 0x40000000):  # CLONE_NEWNET, this thread only
                client.close()
                return
            try:
                inner = socket.create_connection(("127.0.0.1", port), timeout=30)
            except OSError:
                client.close()
                return
            inner.settimeout(None)
            threading.Thread(target=pump, args=(inner, client), daemon=True).start()
            pump(client, inner)

        listener = socket.create_server(where)
        listener.settimeout(0.5)
        done = threading.Event()

        def accept():
            while not done.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                client.settimeout(None)
                threading.Thread(target=serve, args=(client,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        _FORWARDED[where] = self.netns
        try:
            yield f"{self.loopback}:{port}"
        finally:
            del _FORWARDED[where]
            done.set()
            listener.close()
            os.close(ns_fd)

    def stop(self):
        try:
            import libvirt

            conn = libvirt.open(self.uri)
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                with contextlib.suppress(libvirt.libvirtError):
                    dom.destroy()
            for net in conn.listAllNetworks(libvirt.VIR_CONNECT_LIST_NETWORKS_ACTIVE):
                with contextlib.suppress(libvirt.libvirtError):
                    net.destroy()
            conn.close()
        except Exception:  # noqa: BLE001 - best-effort teardown of a test daemon
            pass
        for name in ("libvirtd", "virtlogd", "virtlockd"):
            pidfile = self.path(f"{name}.pid")
            try:
                with open(pidfile) as fh:
                    pid = int(fh.read().strip())
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
        run(["ip", "netns", "del", self.netns], check=False)
        self.pid = None

    def restart_daemon(self, timeout=READY_TIMEOUT):
        """Start libvirtd again after :meth:`kill_daemon` (or a SIGKILL), keeping its configuration,
        its defined domains and its running guests (libvirtd reconnects to their qemu)."""
        d = self.dir
        script = f"""
            {self._mounts()}
            virtlogd -d -p {d}/virtlogd.pid || true
            {f"virtlockd -d -p {d}/virtlockd.pid || true" if self.lockspace else ""}
            libvirtd -d -l -p {d}/libvirtd.pid
        """
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        run(["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-ec", script])
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline:
                raise RuntimeError(f"libvirtd for {self.hostname} did not restart; see {d}/log/libvirtd.log")
            time.sleep(0.05)
        with open(self.path("libvirtd.pid")) as fh:
            self.pid = int(fh.read().strip())
        self.wait_ready(timeout)
        self._share_caps()
        return self

    def kill_daemon(self):
        """Simulate a hypervisor whose libvirtd died (guests keep running, API unreachable)."""
        with open(self.path("libvirtd.pid")) as fh:
            os.kill(int(fh.read().strip()), signal.SIGKILL)
        if os.path.exists(self.socket):
            os.unlink(self.socket)


def new_tag():
    return uuid.uuid4().hex[:4]


def wait_for_text(path, text, timeout=180):
    """Wait until ``text`` appears in file ``path`` (a guest's serial log); return the file content. The
    bound is generous: TCG guests on a shared 2-core host at load 20-40 took >60 s to print their seed."""
    deadline = time.monotonic() + timeout
    content = ""
    while time.monotonic() < deadline:
        try:
            with open(path, errors="replace") as fh:
                content = fh.read()
        except FileNotFoundError:
            content = ""
        if text in content:
            return content
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not seen in {path} within {timeout}s; last content:\n{content[-2000:]}")
