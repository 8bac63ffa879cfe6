"""Test helpers for saltvirt.guest.seed: build small guest disks and read files back out of them with tools
that share no code with the seeding backends (qemu-img convert + debugfs, no mounts)."""

import errno
import hashlib
import json
import os
import re
import subprocess


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_disk(path, tree, partitioned=True, size_mb=32, fmt="raw"):
    """A disk whose (only) ext4 filesystem holds the directory ``tree``: in partition 1 of an MBR disk,
    or on the whole disk when not ``partitioned``. Built without mounting anything."""
    raw = path if fmt == "raw" else f"{path}.tmp.raw"
    if partitioned:
        part = f"{path}.part"
        run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(tree), part, f"{size_mb - 1}M"])
        run(["truncate", "-s", f"{size_mb}M", raw])
        run(["sfdisk", "-q", raw], input=b"label: dos\nstart=2048, type=83\n")
        run(["dd", f"if={part}", f"of={raw}", "bs=1M", "seek=1", "conv=notrunc", "status=none"])
        os.unlink(part)
    else:
        run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(tree), raw, f"{size_mb}M"])
    if fmt != "raw":
        run(["qemu-img", "convert", "-f", "raw", "-O", fmt, raw, path])
        os.unlink(raw)
    return str(path)


def _fs_spec(image, scratch):
    """A debugfs device spec for the ext4 root of ``image`` (any format): ``file?offset=N``."""
    raw = os.path.join(scratch, "readback.raw")
    if os.path.exists(raw):
        os.unlink(raw)
    run(["qemu-img", "convert", "-U", "-O", "raw", image, raw])
    table = subprocess.run(["sfdisk", "--json", raw], capture_output=True, text=True, check=False)
    offset = 0
    if table.returncode == 0 and table.stdout.strip():
        parts = json.loads(table.stdout)["partitiontable"].get("partitions", [])
        if parts:
            offset = parts[0]["start"] * 512
    return f"{raw}?offset={offset}"


def read_guest(image, paths, scratch):
    """{guest path: (content bytes, mode int, uid)} read with debugfs; missing files map to None."""
    spec = _fs_spec(image, scratch)
    out = {}
    for path in paths:
        st = subprocess.run(["debugfs", "-R", f"stat {path}", spec], capture_output=True, text=True, check=False)
        mode = re.search(r"Mode:\s+(\d+)", st.stdout)
        if not mode:
            out[path] = None
            continue
        uid = int(re.search(r"User:\s+(\d+)", st.stdout).group(1))
        content = run(["debugfs", "-R", f"cat {path}", spec]).stdout
        out[path] = (content, int(mode.group(1), 8), uid)
    return out


def fsck_clean(image, scratch):
    """e2fsck -fn on the root filesystem: True when the filesystem is consistent."""
    spec = _fs_spec(image, scratch)
    return subprocess.run(["e2fsck", "-fn", spec], capture_output=True, check=False).returncode == 0


SCRATCH = "salt-virt-seed-"  # saltvirt.guest.seed.SCRATCH_PREFIX (not imported: these helpers share no code)


def leftovers(*needles):
    """Mounts (in any mount namespace), loop devices and qemu-storage-daemon processes that mention any of
    ``needles``."""
    found, namespaces = [], set()
    for pid in ["self", *filter(str.isdigit, os.listdir("/proc"))]:  # every mount namespace, seen once
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns in namespaces:
                continue
            namespaces.add(ns)
            with open(f"/proc/{pid}/mountinfo") as fh:
                lines = fh.readlines()
        except OSError:  # gone meanwhile
            continue
        # the host's own mounts; elsewhere, what seeding mounted (in its scratch directory): a test's own
        # mount (a full tmpfs) is copied into whatever namespace another test makes meanwhile
        ours = [ln for ln in lines if any(n in ln for n in needles) and (pid == "self" or SCRATCH in ln)]
        found += [f"mount in {ns} (pid {pid}): {ln.split()[4]}" for ln in ours]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout.splitlines()
    found += [f"loop: {line}" for line in loops if any(n in line for n in needles)]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmdline.startswith("qemu-storage-daemon") and any(n in cmdline for n in needles):
            found.append(f"process {pid}: {cmdline[:200]}")
    return found


def fill(path):
    """Take every free block of the filesystem ``path`` is on (into the new file ``<path>/filler``)."""
    fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            os.write(fd, b"\1" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
