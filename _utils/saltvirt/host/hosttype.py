"""Which libvirt domain type a host can really run: ``kvm`` only when KVM actually works, else ``qemu``.

libvirt's capabilities list ``kvm`` whenever /dev/kvm exists, but a nested or restricted KVM may still be
unable to boot a guest (seen here: a nested KVM that hides SSE3 and newer from its guests; Linux then
stops in its decompressor). So on top of the capabilities we probe KVM itself, in a subprocess with a
timeout: create a VM, run a real-mode program to HLT, and check that KVM offers guests the baseline
CPU features the host CPU has. Override with config ``virt:type`` or the ``vtype`` argument.

A minion runs each job in a process of its own, so an in-process memo would ask libvirt and probe KVM
again on every ``virt.init`` (the probe: a Python child, ~80 ms). With a ``cache_dir`` the answer for a
local libvirtd is kept on disk (root-only) beside a fingerprint of everything it depends on: libvirt's
and QEMU's versions (two small RPCs instead of ``getCapabilities``), the emulator binaries, KVM's device
node and modules, the kernel and its boot; any change, or an hour, and it is worked out afresh. A remote
libvirtd is asked every time (nothing of it can be checked from here).
"""

import ctypes
import fcntl
import functools
import json
import logging
import mmap
import os
import stat
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import fsutil
from saltvirt.base.salttypes import Conn

log = logging.getLogger(__name__)

VALID_TYPES = ("kvm", "qemu")

_KVM_GET_API_VERSION = 0xAE00
_KVM_CREATE_VM = 0xAE01
_KVM_CREATE_VCPU = 0xAE41
_KVM_GET_VCPU_MMAP_SIZE = 0xAE04
_KVM_RUN = 0xAE80
_KVM_SET_USER_MEMORY_REGION = 0x4020AE46
_KVM_GET_SREGS = 0x8138AE83
_KVM_SET_SREGS = 0x4138AE84
_KVM_SET_REGS = 0x4090AE82
_KVM_GET_SUPPORTED_CPUID = 0xC008AE05
_EXIT_IO, _EXIT_HLT = 2, 5
# CPUID leaf 1 ECX bits every x86-64 guest kernel of the last decade may use, by /proc/cpuinfo name.
_LEAF1_ECX = {"pni": 0, "ssse3": 9, "cx16": 13, "sse4_1": 19, "sse4_2": 20, "popcnt": 23}


def _probe_kvm(device="/dev/kvm"):
    """Return (ok, reason). Runs in a child process (see probe_kvm)."""
    if not os.path.exists(device):
        return False, f"{device} does not exist"
    try:
        kvm = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return False, f"cannot open {device}: {exc.strerror}"
    try:
        if fcntl.ioctl(kvm, _KVM_GET_API_VERSION) != 12:
            return False, "unexpected KVM API version"
        vm = fcntl.ioctl(kvm, _KVM_CREATE_VM, 0)
        mem = mmap.mmap(-1, 0x1000, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        mem.write(bytes([0xB0, 0x2A, 0xE6, 0x10, 0xF4]))  # mov al,42; out 0x10,al; hlt
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
        fcntl.ioctl(vm, _KVM_SET_USER_MEMORY_REGION, struct.pack("IIQQQ", 0, 0, 0x1000, 0x1000, addr))
        vcpu = fcntl.ioctl(vm, _KVM_CREATE_VCPU, 0)
        run = mmap.mmap(vcpu, fcntl.ioctl(kvm, _KVM_GET_VCPU_MMAP_SIZE), flags=mmap.MAP_SHARED)
        sregs = bytearray(312)
        fcntl.ioctl(vcpu, _KVM_GET_SREGS, sregs)
        struct.pack_into("QIH", sregs, 0, 0, 0xFFFF, 0)  # cs.base=0, cs.limit, cs.selector=0
        fcntl.ioctl(vcpu, _KVM_SET_SREGS, bytes(sregs))
        regs = bytearray(144)
        struct.pack_into("Q", regs, 16 * 8, 0x1000)  # rip
        struct.pack_into("Q", regs, 17 * 8, 0x2)  # rflags
        fcntl.ioctl(vcpu, _KVM_SET_REGS, bytes(regs))
        exits = []
        for _ in range(4):
            fcntl.ioctl(vcpu, _KVM_RUN, 0)
            exits.append(struct.unpack_from("I", run, 8)[0])
            if exits[-1] == _EXIT_HLT:
                break
        if exits[:2] != [_EXIT_IO, _EXIT_HLT]:
            return False, f"a test vCPU did not run to HLT (exit reasons {exits})"
        nent = 256
        buf = bytearray(8 + 40 * nent)
        struct.pack_into("I", buf, 0, nent)
        fcntl.ioctl(kvm, _KVM_GET_SUPPORTED_CPUID, buf)
        ecx = None
        for i in range(struct.unpack_from("I", buf, 0)[0]):
            function, index, _flags, _a, _b, c, _d = struct.unpack_from("7I", buf, 8 + 40 * i)
            if function == 1 and index == 0:
                ecx = c
        host_flags = _host_cpu_flags()
        missing = [f for f, bit in _LEAF1_ECX.items() if f in host_flags and not (ecx or 0) >> bit & 1]
        if missing:
            return False, (
                "KVM hides CPU features the host has from its guests (missing: "
                + ", ".join(missing)
                + "): a nested or restricted KVM that cannot boot a normal guest"
            )
        return True, "KVM runs guest code and exposes the host's CPU features"
    except OSError as exc:
        return False, f"KVM ioctl failed: {exc.strerror or exc}"
    finally:
        os.close(kvm)


def _host_cpu_flags():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def probe_kvm(timeout: float = 10) -> tuple[bool, str]:
    """(ok, reason) for this machine's KVM, probed once per process in a child with a timeout."""
    # the child runs this file as a script: it imports saltvirt from where this copy lives (a minion's
    # synced extension modules, a checkout), which is not on the child's path by default
    here = os.path.abspath(__file__)
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    try:
        out = subprocess.run(
            [sys.executable, here], capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        ok, reason = json.loads(out.stdout.strip().splitlines()[-1])
        return bool(ok), reason
    except subprocess.TimeoutExpired:
        return False, f"the KVM probe did not finish in {timeout}s"
    except (ValueError, IndexError):
        return False, f"the KVM probe failed: {out.stderr.strip()[-300:]}"


def capability_types(caps_xml: str, arch: str = "x86_64") -> list[str | None]:
    """Domain types libvirt offers for ``arch`` (from ``conn.getCapabilities()``)."""
    root = ET.fromstring(caps_xml)
    types = []
    for guest in root.findall("guest"):
        arch_el = guest.find("arch")
        if arch_el is not None and arch_el.get("name") == arch:
            types += [d.get("type") for d in arch_el.findall("domain") if d.get("type") not in types]
    return types


def is_local_uri(uri: str | None) -> bool:
    if not uri:
        return True
    scheme, _, rest = uri.partition("://")
    return ("+" not in scheme or scheme.endswith("+unix")) and (rest.startswith("/") or not rest.split("/")[0])


# the on-disk answer (see the module docs) ---------------------------------------------------------
CACHE_FILE = "hosttype.json"  # in the cache_dir given to detect (a minion's: <cachedir>/saltvirt)
CACHE_MAX_AGE = 3600.0  # seconds: a bound on whatever the fingerprint could miss
# what KVM's verdict rests on besides the boot: its device node and modules (a reload makes new ones)
KVM_PATHS = ("/dev/kvm", "/sys/module/kvm", "/sys/module/kvm_intel", "/sys/module/kvm_amd")
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _file_key(path: str) -> list[int | str | None] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    ids: list[int | str | None] = [st.st_mode, st.st_uid, st.st_gid, st.st_dev, st.st_ino, st.st_rdev]
    if stat.S_ISCHR(st.st_mode):
        # a device node by who may open it (mode, owner, ACL), not by its ctime: a no-op chmod (a setup
        # script's, each run) must not cost every init a probe again; a module reload makes a new node
        try:
            acl: str | None = os.getxattr(path, "system.posix_acl_access").hex()
        except OSError:
            acl = None
        return [*ids, acl]
    return [*ids, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _emulators(caps_xml: str, arch: str) -> list[str]:
    root = ET.fromstring(caps_xml)
    found = set()
    for arch_el in root.findall("guest/arch"):
        if arch_el.get("name") == arch:
            found |= {e.text for e in arch_el.iter("emulator") if e.text}
    return sorted(found)


def fingerprint(conn: Conn, uri: str, emulators: list[str]) -> dict[str, Any]:
    """What a local libvirtd's answer depends on; equal fingerprints, equal answers."""
    try:
        with open(BOOT_ID) as fh:
            boot = fh.read().strip()
    except OSError:
        boot = None
    return {
        "uri": uri,
        "driver": conn.getType(),
        "libvirt": conn.getLibVersion(),
        "hypervisor": conn.getVersion(),  # QEMU's version (libvirt re-checks its binary)
        "kernel": os.uname().release,
        "boot": boot,
        "files": {p: _file_key(p) for p in (*KVM_PATHS, *emulators)},
    }


def _fingerprint(conn: Conn, uri: str, emulators: list[str]) -> dict[str, Any] | None:
    try:
        return fingerprint(conn, uri, emulators)
    except Exception as exc:  # noqa: BLE001 - a driver without getVersion, a dropped connection: no cache
        log.debug("hosttype: no fingerprint of %s (%s): not cached", uri, exc)
        return None


def _load(cache_dir: str) -> dict[str, Any]:
    return fsutil.load_own_json(cache_dir, CACHE_FILE, 0o077)


def _cached(cache_dir: str, conn: Conn, uri: str, arch: str) -> dict[str, str] | None:
    entry = _load(cache_dir).get(f"{uri}\0{arch}")
    if not isinstance(entry, dict) or not isinstance(entry.get("answer"), dict):
        return None
    if not 0 <= time.time() - entry.get("at", 0) <= CACHE_MAX_AGE:
        return None
    key = _fingerprint(conn, uri, list(entry.get("emulators") or ()))
    if key is None or entry.get("key") != key:
        return None
    answer = entry["answer"]
    return {"type": answer["type"], "reason": answer["reason"]} if answer.get("type") in VALID_TYPES else None


def _store(cache_dir: str, uri: str, arch: str, key: dict[str, Any], emulators: list[str], answer: dict) -> None:
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        if not fsutil.ours_alone(cache_dir):
            log.warning("hosttype: not caching the domain type in %s (not this user's alone)", cache_dir)
            return
        data = _load(cache_dir)
        data[f"{uri}\0{arch}"] = {"key": key, "emulators": emulators, "answer": answer, "at": time.time()}
        fsutil.atomic_write(os.path.join(cache_dir, CACHE_FILE), json.dumps(data).encode(), 0o600)
    except OSError as exc:  # a cache: the next init works it out again
        log.warning("hosttype: cannot cache the domain type in %s: %s", cache_dir, exc)


def detect(
    conn: Conn, override: str | None = None, arch: str = "x86_64", cache_dir: str | None = None
) -> dict[str, str]:
    """Return {'type': 'kvm'|'qemu'|'test', 'reason': str} for new domains on ``conn``; with ``cache_dir``
    a local libvirtd's answer is kept there while its fingerprint holds (see the module docs)."""
    if override in VALID_TYPES:  # no need to ask libvirt (a getCapabilities RPC + parse per init)
        return {"type": override, "reason": "set by configuration (virt:type) or argument"}
    if override:
        if override not in capability_types(conn.getCapabilities(), arch):
            raise SaltInvocationError(f"virt type {override!r} is not one of {VALID_TYPES}")
        return {"type": override, "reason": "set by configuration (virt:type) or argument"}
    if conn.getType().lower() == "test":
        return {"type": "test", "reason": "libvirt test driver"}
    uri = conn.getURI()
    local = is_local_uri(uri)
    if local and cache_dir:
        answer = _cached(cache_dir, conn, uri, arch)
        if answer:
            return answer
    caps = conn.getCapabilities()
    emulators = _emulators(caps, arch)
    key = _fingerprint(conn, uri, emulators) if local and cache_dir else None  # before the probe: what it saw
    if "kvm" not in capability_types(caps, arch):
        answer = {"type": "qemu", "reason": "libvirt offers no kvm domain type on this host (no /dev/kvm?)"}
    elif not local:
        return {"type": "kvm", "reason": "remote host offers kvm (not probed from here)"}
    else:
        ok, reason = probe_kvm()
        answer = {"type": "kvm" if ok else "qemu", "reason": reason}
    if key is not None and cache_dir:
        _store(cache_dir, uri, arch, key, emulators, answer)
    return answer


if __name__ == "__main__":
    print(json.dumps(_probe_kvm()))
