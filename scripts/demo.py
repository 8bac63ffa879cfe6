"""The demo behind ./setup-and-demo: real salt-master + hypervisor minion + libvirtd, a real guest.

By default it ends like the tutorial: ``salt-run virt.init demo1 ...`` with a Debian 12 image that
carries salt-minion (built by scripts/setup.sh), then ``salt demo1 test.ping`` answers True with the key
the master pre-accepted, and the time from the runner call to that first True is printed.
``--quick`` uses the tiny busybox guest instead (no minion in it: it prints what seeding wrote).
It ends with the web console (docs/topics/console.md): salt-api serves it, a generated password for the
user ``demo`` is in a 0600 file whose path is printed (never the password), and the console's URL.
``--keep`` keeps the directory and leaves everything running (the VM too) until Ctrl-C.

Every step is the real command a user would type (shown as `$ ...`); nothing is simulated. The
hypervisor is a libvirtd in its own network/mount namespaces (tests/support/lab.py) so the demo never
touches this machine's own libvirt or network configuration. Everything is removed at the end.
"""

import argparse
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))
import lab  # noqa: E402

VENV_BIN = pathlib.Path(sys.executable).parent
GUEST = pathlib.Path(os.environ.get("SALT_VIRT_GUEST", "/var/cache/salt-virt/guest"))
DEBIAN = pathlib.Path(os.environ.get("SALT_VIRT_DEBIAN", "/var/cache/salt-virt/debian"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(msg):
    print(f"\n== {msg}", flush=True)


class Demo:
    def __init__(self, keep=False, quick=False):
        self.keep = keep
        self.quick = quick
        self.master_ip = None
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="svdemo", dir="/tmp"))
        self.base.chmod(0o755)  # QEMU (libvirt-qemu) must reach the VM disks below it
        self.conf = self.base / "etc"
        self.fabric = self.hv = None
        self.pids = []
        self.api_port = free_port()
        self.password_file = self.base / "console-password"

    def salt(self, tool, *args, check=True, quiet=False, timeout=300):
        cmd = [str(VENV_BIN / tool), "-c", str(self.conf), *args]
        if not quiet:
            print("$ " + " ".join([tool, *args]), flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)  # judged below
        if not quiet:
            sys.stdout.write(out.stdout)
        failed = (
            out.returncode != 0 or "is not available" in out.stdout or out.stdout.startswith(("ERROR", "Exception"))
        )
        if check and failed:
            sys.stdout.write(out.stderr)
            raise SystemExit(f"demo: `{tool} {' '.join(args)}` failed (exit {out.returncode})")
        return out

    def configure(self):
        tree = self.base / "srv"
        (tree / "images").mkdir(parents=True)
        if self.quick:
            shutil.copyfile(GUEST / "disk.qcow2", tree / "images" / "guest.qcow2")
        else:
            (tree / "images" / "debian.qcow2").symlink_to(DEBIAN / "debian-minion.qcow2")
        publish, ret = free_port(), free_port()
        common = {"root_dir": str(self.base), "user": "root", "log_level_logfile": "info"}
        master = dict(
            common,
            # the Debian guest's own minion reaches the master through the lab's master link
            interface="127.0.0.1" if self.quick else "0.0.0.0",
            publish_port=publish,
            ret_port=ret,
            file_roots={"base": [str(ROOT), str(tree)]},
            pki_dir=str(self.base / "pki" / "master"),
            log_file=str(self.base / "log" / "master"),
            on_demand_ext_pillar=[],
            # who the hypervisors are (minion ids, never grains); where new VMs' minions find this master
            virt={"hypervisors": ["hyper1"], "guest_master": self.master_ip or "127.0.0.1"},
            **self.console_config(),
        )
        if (ROOT / "_pillar" / "libvirt.py").exists():
            master["ext_pillar"] = [{"libvirt": {}}]
        minion = dict(
            common,
            id="hyper1",
            master="127.0.0.1",
            master_port=ret,
            publish_port=publish,
            pki_dir=str(self.base / "pki" / "minion"),
            log_file=str(self.base / "log" / "minion"),
            # virt:allowed_paths: the demo guest's kernel/initrd live outside virt:images
            virt={
                "connection": {"uri": self.hv.uri},
                "images": str(self.base / "images"),
                "allowed_paths": [str(GUEST)],
            },
        )
        self.conf.mkdir()
        (self.conf / "master").write_text(json.dumps(master, indent=1))
        (self.conf / "minion").write_text(json.dumps(minion, indent=1))

    def console_config(self):
        """salt-api with the web console as docs/topics/console.md sets it up (plain http on loopback: a demo),
        and ``file`` eauth for the user ``demo`` with a generated password in 0600 files (no virt:tenants here:
        every caller is an operator)."""
        password = secrets.token_urlsafe(18)
        users = self.base / "eauth-users"
        for path, text in ((users, f"demo:{password}\n"), (self.password_file, password + "\n")):
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
                fh.write(text)
        return {
            "rest_cherrypy": {
                "port": self.api_port,
                "host": "127.0.0.1",
                "disable_ssl": True,
                "app": str(ROOT / "console" / "index.html"),
                "app_path": "/console",
                "static": str(ROOT / "console"),
                "static_path": "/console-static",
            },
            "netapi_enable_clients": ["runner", "runner_async"],
            "external_auth": {
                "file": {"^filename": str(users), "^filetype": "text", "demo": [{"@runner": ["virt.*"]}]}
            },
        }

    def console(self):
        """The console answers (HTTP 200) and the demo user logs in with its password and calls the runner."""
        url = f"http://127.0.0.1:{self.api_port}"

        def request(path, body=None, token=None):
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            if token:
                headers["X-Auth-Token"] = token
            data = None if body is None else json.dumps(body).encode()
            with urllib.request.urlopen(urllib.request.Request(url + path, data, headers), timeout=60) as resp:
                return resp.status, resp.read()

        def answers():
            try:
                return request("/console")[0] == 200
            except OSError:
                return False

        self.wait("salt-api", answers, timeout=60)
        creds = {"username": "demo", "password": self.password_file.read_text().strip(), "eauth": "file"}
        token = json.loads(request("/login", creds)[1])["return"][0]["token"]
        who = json.loads(request("/", [{"client": "runner", "fun": "virt.whoami"}], token)[1])["return"][0]
        print(f"GET /console: 200; POST /login as demo: a token; virt.whoami through salt-api: {who['user']}")
        say(f"the web console: {url}/console")
        print(f"user demo, its password in {self.password_file} (mode 0600)")
        if not self.keep:
            print("(removed at the end of the demo: ./setup-and-demo --keep leaves it running to open it)")

    def start_daemon(self, tool):
        proc = subprocess.Popen(
            [str(VENV_BIN / tool), "-c", str(self.conf), "-l", "quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pids.append(proc)
        return proc

    def wait(self, what, func, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if func():
                return
            time.sleep(0.5)
        raise SystemExit(f"demo: timed out waiting for {what}")

    def run(self):
        t0 = time.monotonic()
        say("a hypervisor: libvirtd in its own namespaces, bridge br0 (TCG guests, this host's KVM cannot boot one)")
        self.fabric = lab.Fabric(lab.new_tag()).start()
        if not self.quick:
            self.master_ip = self.fabric.master_link()  # guests on br0 reach the master here
            self.fabric.dhcp()  # and get their address from DHCP on the fabric
        self.hv = lab.Hypervisor(str(self.base / "hv"), 1, self.fabric).start()
        print(f"libvirtd pid {self.hv.pid}, {self.hv.uri}")
        self.configure()

        say("salt-master and the hypervisor minion 'hyper1'")
        self.start_daemon("salt-master")
        self.start_daemon("salt-minion")
        self.start_daemon("salt-api")  # the web console; ready by the end of the demo
        self.wait(
            "the minion's key", lambda: "hyper1" in self.salt("salt-key", "-l", "un", quiet=True, check=False).stdout
        )
        self.salt("salt-key", "-y", "-a", "hyper1")
        self.wait(
            "the minion",
            lambda: self.salt("salt", "hyper1", "test.ping", "--timeout=5", quiet=True, check=False).returncode == 0,
        )

        say("deploy the bundle the file_roots way")
        self.salt("salt-run", "saltutil.sync_all")
        self.salt("salt", "hyper1", "saltutil.sync_all")

        if self.quick:
            self.busybox_vm()
        else:
            self.debian_vm()

        say("query the fleet")
        self.salt("salt-run", "virt.query")
        if not self.keep:
            self.salt("salt-run", "virt.purge", "demo1")
        self.console()
        print(f"\ndemo finished in {time.monotonic() - t0:.1f}s")
        if self.keep:
            print("--keep: the master, the hypervisor, demo1 and the console run on; Ctrl-C stops them", flush=True)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                time.sleep(3600)

    def busybox_vm(self):
        say("create a VM: placed, image cached, overlay-cloned, seeded with a pre-accepted key, started")
        boot = json.dumps(
            {"kernel": str(GUEST / "vmlinux"), "initrd": str(GUEST / "initrd.img"), "cmdline": "console=ttyS0 quiet"}
        )
        self.salt(
            "salt-run",
            "virt.init",
            "demo1",
            "1",
            "256",
            "salt://images/guest.qcow2",
            "enable_qcow=True",
            "enable_vnc=True",
            f"boot={boot}",
        )

        say("the guest boots and prints what seeding wrote into its disk (serial console)")
        log = self.hv.path("log", "qemu", "demo1-serial.log")
        content = lab.wait_for_text(log, "HB 1", timeout=120)
        for line in content.splitlines():
            if line.startswith(("GUEST-BOOT-OK", "SALT-", "HB 1")):
                print("  console: " + line.strip())
        self.salt("salt-key", "-L")

    def debian_vm(self):
        say("warm the image on the hypervisor (fetched, checked and imported once: every virt.init is then cached)")
        self.salt("salt", "hyper1", "virt.image_warm", "salt://images/debian.qcow2", "--timeout=600")
        say("create a Debian VM: placed, overlay-cloned, seeded with a pre-accepted key, started")
        t0 = time.monotonic()
        self.salt("salt-run", "virt.init", "demo1", "2", "512", "salt://images/debian.qcow2", "enable_qcow=True")
        t_init = time.monotonic() - t0
        say("the tutorial's last step: the new VM's own minion answers (key pre-accepted, never pending)")
        print("$ salt demo1 test.ping   (repeated until it answers)", flush=True)
        self.wait(
            "demo1's minion",
            lambda: (
                '"demo1": true'
                in self.salt("salt", "demo1", "test.ping", "--timeout=5", "--out=json", quiet=True, check=False).stdout
            ),
            timeout=600,
        )
        t_ping = time.monotonic() - t0
        self.salt("salt", "demo1", "test.ping")
        self.salt("salt", "demo1", "grains.item", "os", "osrelease")
        self.salt("salt-key", "-L")
        print(f"\nsalt-run virt.init returned after {t_init:.1f}s; first test.ping True after {t_ping:.1f}s")

    def cleanup(self):
        for proc in self.pids:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.pids:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if self.hv:
            self.hv.stop()
        if self.fabric:
            self.fabric.stop()
        if self.keep:
            print(f"kept {self.base}")
        else:
            shutil.rmtree(self.base, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--keep", action="store_true", help="keep the demo directory, leave it running (the console too) until Ctrl-C"
    )
    parser.add_argument("--quick", action="store_true", help="the tiny busybox guest instead of Debian + salt-minion")
    args = parser.parse_args()
    demo = Demo(keep=args.keep, quick=args.quick)
    try:
        demo.run()
    except KeyboardInterrupt:
        print()
    finally:
        demo.cleanup()


if __name__ == "__main__":
    main()
