"""Backup throughput and the running guest's slowdown: ``virt.backup`` (pull mode, the default, and push
mode) vs a plain ``qemu-img convert -U`` of the same disk as the floor, measured interleaved (floor, pull,
pull depth 8, push, floor, ...) so that the shared machine's load hits each alike.

Setup: a lab hypervisor (namespaced libvirtd, index 14) runs the busybox TCG guest with a second SATA
disk of ``--size`` MiB holding data: 3 MiB of random bytes and a 1 MiB hole in every 4 MiB (as
bench_clone.py), so a full copy moves 3/4 of the virtual size.

Figures (medians with min-max and n):
- throughput: data MiB moved / wall seconds, for ``qemu-img convert -U`` (a copy of a running disk, no
  consistency at all: the floor) and ``virt.backup`` full (everything: job, copy, sha256, manifest), pull
  mode with the default one NBD read in flight and with ``virt:backup:pull_depth: 8``;
- guest writes: the guest's own disk writes (HMP ``qemu-io`` through the guest's disk device: the path
  guest writes take, 8 MiB writes in a loop) while each copy runs, over the rate in an idle window just
  before it (copy-before-write: a guest write to a block not yet copied first copies the old block out);
- incremental: ``virt.backup incremental=True`` with nothing changed (its fixed cost) and after the guest
  rewrote 64 MiB, pull and push interleaved.

    $VENV/bin/python bench/bench_backup.py [--size 1024] [--reps 5] [--quick]
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


def idle_rate(hv, vm, seconds):
    """Guest write rate (MiB/s) over ``seconds`` with nothing else running."""
    return during(hv, vm, lambda: time.sleep(seconds))[0]


def med(values):
    st = common.summary(values)
    return "—" if not st else f"{st['median']:.2f} ({st['min']:.2f}–{st['max']:.2f}, n={st['n']})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=1024, help="data disk MiB (default 1024)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="64 MiB, 1 rep")
    args = ap.parse_args(argv)
    size, reps = (64, 1) if args.quick else (args.size, args.reps)
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731

    from saltvirt.host import conn as lvconn
    from saltvirt.vm import backup as backup_lib
    from saltvirt.vm import backupstore
    from tests.integration.test_snapshot_real import hmp
    from tests.support import lab
    from tests.support.paths import GUEST_DIR
    from tests.support.saltloader import make_minion_mods

    load0 = common.loadavg()
    base = tempfile.mkdtemp(prefix="svbench-b", dir="/var/tmp")
    os.chmod(base, 0o755)
    fab = lab.Fabric(lab.new_tag()).start()
    hv = lab.Hypervisor(base, 14, fab).start()
    cases = ("floor", "pull", "pull8", "push")
    t = {k: [] for k in cases}  # seconds
    g = {k: [] for k in cases}  # guest writes / idle
    inc = {k: [] for k in ("pull0", "push0", "pull64", "push64")}
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
        device = GuestWriter(hv, "bench1").device

        def convert():
            out = os.path.join(base, "floor.qcow2")
            t0 = time.perf_counter()
            subprocess.run(["qemu-img", "convert", "-U", "-f", "qcow2", "-O", "qcow2", data, out], check=True)
            secs = time.perf_counter() - t0
            os.unlink(out)
            return secs

        def full(mode, depth=1):
            def run():
                with lvconn.connect(hv.uri) as conn:
                    t0 = time.perf_counter()
                    made = backup_lib.backup(conn, backups, "bench1", disks="sdb", key=key, mode=mode, depth=depth)
                    secs = time.perf_counter() - t0
                backup_lib.delete(backups, "bench1", made["id"], key=key)  # keeps the disk from filling
                return secs

            return run

        for r in range(reps):
            for case, work in (
                ("floor", convert),
                ("pull", full("pull")),
                ("pull8", full("pull", 8)),
                ("push", full("push")),
            ):
                log(f"round {r + 1}/{reps}: {case}")
                idle = idle_rate(hv, "bench1", 3)
                rate, secs = during(hv, "bench1", work)
                t[case].append(secs)
                g[case].append(rate / idle if idle else None)
        with lvconn.connect(hv.uri) as conn:
            first = backup_lib.backup(conn, backups, "bench1", disks="sdb", key=key)  # the chain's start
            for r in range(reps):
                for mode in ("pull", "push"):
                    log(f"incremental round {r + 1}/{reps}: {mode}")
                    t0 = time.perf_counter()
                    made = backup_lib.backup(conn, backups, "bench1", disks="sdb", incremental=True, key=key, mode=mode)
                    inc[f"{mode}0"].append(time.perf_counter() - t0)
                    assert made["type"] == "incremental", made
                    for n in range(8):  # 64 MiB rewritten by the guest
                        hmp(hv, "bench1", f'qemu-io -d {device} "write -P 0x{r + 0x70:x} {(n + 8 * r) * 8}M 8M"')
                    t0 = time.perf_counter()
                    made = backup_lib.backup(conn, backups, "bench1", disks="sdb", incremental=True, key=key, mode=mode)
                    inc[f"{mode}64"].append(time.perf_counter() - t0)
                    assert made["type"] == "incremental" and made["size"] >= 64 << 20, made
            assert first["type"] == "full"
            conn.lookupByName("bench1").destroy()
    finally:
        hv.stop()
        fab.stop()
        shutil.rmtree(base, ignore_errors=True)
    load1 = common.loadavg()
    floor = common.summary(t["floor"])["median"]
    rows = []
    for case, label in (
        ("floor", "qemu-img convert -U (floor)"),
        ("pull", "virt.backup full, pull mode (default: 1 read in flight)"),
        ("pull8", "virt.backup full, pull mode, pull_depth 8"),
        ("push", "virt.backup full, push mode"),
    ):
        st = common.summary(t[case])
        rows.append(
            [
                label,
                med(t[case]),
                f"{moved / st['median']:.0f}",
                f"{floor / st['median']:.2f}",
                med(g[case]),
            ]
        )
    table = common.table(["case", "seconds", "MiB/s (median)", "vs floor", "guest writes vs idle"], rows)
    inc_rows = [[f"incremental, {m} mode", med(inc[f"{m}0"]), med(inc[f"{m}64"])] for m in ("pull", "push")]
    inc_table = common.table(["case", "nothing changed (s)", "64 MiB changed (s)"], inc_rows)
    notes = [
        f"data disk {size} MiB qcow2, {size * 3 // 4} MiB of data; {reps} interleaved round(s); TCG guest",
        f"loadavg (1, 5, 15 min) at start {load0}, at end {load1}",
        "medians (min–max, n); MiB/s = data MiB / median wall seconds; vs floor = floor seconds / case seconds",
        "guest writes vs idle: the guest's 8 MiB writes (MiB/s) during the copy over an idle window just before it",
    ]
    common.emit(
        "backup", {"title": "Backups: throughput and guest slowdown", "tables": [table, inc_table], "notes": notes}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
