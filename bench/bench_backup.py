"""Backup throughput and the running guest's slowdown: ``virt.backup`` (libvirt push-mode backup, full and
incremental) vs a plain ``qemu-img convert -U`` of the same disk as the floor.

Setup: a lab hypervisor (namespaced libvirtd, index 14) runs the busybox TCG guest with a second SATA
disk of ``--size`` MiB holding data: 3 MiB of random bytes and a 1 MiB hole in every 4 MiB (as
bench_clone.py), so a full copy moves 3/4 of the virtual size.

Figures:
- throughput: data bytes moved / wall time, for ``qemu-img convert -U`` (a copy of a running disk, no
  consistency at all: the floor), ``virt.backup`` full (incl. sha256 of the result; the copy job alone
  in brackets), and an incremental after the guest rewrote 64 MiB;
- guest slowdown: the guest's own disk writes (HMP ``qemu-io`` through the guest's disk device: the
  path guest writes take, 8 MiB writes in a loop) per second while idle, while ``qemu-img convert``
  runs, and while a backup runs (copy-before-write: a guest write first copies the old block out).

    $VENV/bin/python bench/bench_backup.py [--size 1024] [--reps 3] [--quick]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common

sys.path.insert(0, str(common.ROOT))
sys.path.insert(0, str(common.ROOT / "_utils"))

MIB = 1 << 20


def make_data(path, size_mib):
    raw = path + ".raw"
    with open(raw, "wb") as fh:
        fh.truncate(size_mib * MIB)
        for mib in range(size_mib):
            if mib % 4 != 3:
                fh.seek(mib * MIB)
                fh.write(os.urandom(MIB))
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, path], check=True)
    os.unlink(raw)


class GuestWriter:
    """Writes 8 MiB through the guest's data disk in a loop (HMP qemu-io), counting MiB/s."""

    def __init__(self, hv, vm):
        from tests.integration.test_snapshot_real import hmp

        self.hmp, self.hv, self.vm = hmp, hv, vm
        import re

        info = hmp(hv, vm, "info block")
        self.device = re.findall(r"Attached to:\s+(\S+)", info)[1]  # the second SATA disk: data
        self.stop = threading.Event()
        self.mib, self.seconds = 0, 0.0

    def run(self):
        t0, n = time.perf_counter(), 0
        while not self.stop.is_set():
            self.hmp(self.hv, self.vm, f'qemu-io -d {self.device} "write -P 0x{n % 200 + 16:x} {(n % 32) * 8}M 8M"')
            n += 1
        self.mib, self.seconds = n * 8, time.perf_counter() - t0

    def rate(self):
        return self.mib / self.seconds if self.seconds else 0.0


def during(hv, vm, work):
    """Guest write rate (MiB/s) while ``work()`` runs (or for 10 s with ``work=None``); ``(rate, work's result)``."""
    w = GuestWriter(hv, vm)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        result = work() if work else time.sleep(10)
    finally:
        w.stop.set()
        t.join()
    return w.rate(), result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=1024, help="data disk MiB (default 1024)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="64 MiB, 1 rep")
    args = ap.parse_args(argv)
    size, reps = (64, 1) if args.quick else (args.size, args.reps)
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731

    from saltvirt.host import conn as lvconn
    from saltvirt.vm import backup as backup_lib
    from saltvirt.vm import backupstore
    from tests.support import lab
    from tests.support.paths import GUEST_DIR
    from tests.support.saltloader import make_minion_mods

    load0 = common.loadavg()
    base = tempfile.mkdtemp(prefix="svbench-b", dir="/var/tmp")
    os.chmod(base, 0o755)
    fab = lab.Fabric(lab.new_tag()).start()
    hv = lab.Hypervisor(base, 14, fab).start()
    rows, notes = [], []
    try:
        backups = os.path.join(base, "backups")
        os.makedirs(backups)
        os.chmod(backups, 0o755)
        v = make_minion_mods(
            __import__("pathlib").Path(base) / "mods",
            hv.uri,
            images_dir=os.path.join(base, "images"),
            allowed_paths=[str(GUEST_DIR), base],
            backup={"dir": backups},
        )
        key = backupstore.manifest_key(None, v.opts["pki_dir"])  # the manifests' key, as the module's
        boot = {
            "kernel": str(GUEST_DIR / "vmlinuz"),
            "initrd": str(GUEST_DIR / "initrd.img"),
            "cmdline": "console=ttyS0 quiet",
        }
        disks = [{"name": "system", "bus": "sata"}, {"name": "data", "bus": "sata", "size": size}]
        v["virt.init"](
            "bench1", 1, 256, image=str(GUEST_DIR / "disk.qcow2"), boot=boot, seed=False, disks=disks, start=False
        )
        data = v["virt.get_disks"]("bench1")["sdb"]["file"]
        log(f"writing {size} MiB of data into {data}")
        os.unlink(data)
        make_data(data, size)
        v["virt.start"]("bench1")
        lab.wait_for_text(hv.path("log", "qemu", "bench1-serial.log"), "HB 2", timeout=300)
        moved = size * 3 / 4  # MiB of data in the disk

        idle, _ = during(hv, "bench1", None)
        rows.append(["guest writes, idle", "—", "—", f"{idle:.1f}", "1.00"])

        def convert():
            out = os.path.join(base, "floor.qcow2")
            t0 = time.perf_counter()
            subprocess.run(["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "qcow2", data, out], check=True)
            secs = time.perf_counter() - t0
            os.unlink(out)
            return secs

        def full():
            with lvconn.connect(hv.uri) as conn:
                t0 = time.perf_counter()
                made = backup_lib.backup(conn, backups, "bench1", disks="sdb", key=key)
                return time.perf_counter() - t0, made

        for r in range(reps):
            log(f"floor: qemu-img convert -U {r + 1}/{reps}")
            rate, secs = during(hv, "bench1", convert)
            rows.append(
                [
                    "qemu-img convert -U (floor)",
                    f"{secs:.2f}",
                    f"{moved / secs:.0f}",
                    f"{rate:.1f}",
                    f"{rate / idle:.2f}",
                ]
            )
        for r in range(reps):
            log(f"virt.backup full {r + 1}/{reps}")
            rate, (secs, made) = during(hv, "bench1", full)
            job = made["copy_seconds"]
            rows.append(
                [
                    "virt.backup full (copy job + sha256 + manifest)",
                    f"{secs:.2f} (copy {job:.2f})",
                    f"{moved / secs:.0f}",
                    f"{rate:.1f}",
                    f"{rate / idle:.2f}",
                ]
            )
        with lvconn.connect(hv.uri) as conn:
            dom = conn.lookupByName("bench1")
            from tests.integration.test_snapshot_real import hmp

            for n in range(8):  # 64 MiB rewritten by the guest
                hmp(hv, "bench1", f'qemu-io -d {GuestWriter(hv, "bench1").device} "write -P 0x77 {n * 8}M 8M"')
            t0 = time.perf_counter()
            inc = backup_lib.backup(conn, backups, "bench1", disks="sdb", incremental=True, key=key)
            secs = time.perf_counter() - t0
            assert inc["type"] == "incremental", inc
            rows.append(
                [
                    "virt.backup incremental (64 MiB changed)",
                    f"{secs:.2f} (copy {inc['copy_seconds']:.2f})",
                    f"{64 / secs:.0f}",
                    "—",
                    "—",
                ]
            )
            dom.destroy()
    finally:
        hv.stop()
        fab.stop()
        shutil.rmtree(base, ignore_errors=True)
    notes.append(
        f"data disk {size} MiB qcow2, {size * 3 // 4} MiB of data; {reps} rep(s); TCG guest; loadavg at start {load0}"
    )
    notes.append("MiB/s = data MiB / wall seconds; guest writes = MiB/s the guest's own 8 MiB writes reached meanwhile")
    table = common.table(["case", "seconds", "MiB/s", "guest writes MiB/s", "vs idle"], rows)
    common.emit("backup", {"title": "Backups: throughput and guest slowdown", "tables": [table], "notes": notes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
