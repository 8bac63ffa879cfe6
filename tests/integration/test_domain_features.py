"""UEFI (OVMF), secure boot, a swtpm vTPM and extra serial/console devices on a real libvirtd with a
TCG guest: the busybox guest (direct kernel boot) is booted under OVMF by libvirt's firmware
autoselection, with a TPM 2.0 emulated by swtpm, an extra TCP serial port, a virtio console, Salt's cpu
dict (model, topology, guest NUMA cells, vCPU pinning) and clock (local time)."""

import json
import os
import socket
import xml.etree.ElementTree as ET

from saltvirt.xml.domain import definition
from tests.support import lab

BOOT_WAIT = 300  # TCG + OVMF on a busy 2-core host


def console(hv, name):
    return hv.path("log", "qemu", f"{name}-serial.log")


def qemu_cmdline(hv, name):
    """The running QEMU's command line (its pid file is in the lab's libvirt run directory)."""
    with open(hv.path("run", "qemu", f"{name}.pid")) as fh:
        pid = int(fh.read().strip())
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().decode(errors="replace").split("\0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uefi_guest_boots_with_vtpm_extra_serial_and_console(virt_hv, hv1, boot_args, guest):
    v = virt_hv
    port = free_port()
    cpu = {"maximum": 2, "model": "qemu64", "topology": {"sockets": 1, "cores": 2, "threads": 1}}
    # Salt's guest NUMA cells and vCPU pinning on the same boot (the host has 2 CPUs: one vCPU on each)
    cpu.update(numa={0: {"cpus": "0", "memory": 128}, 1: {"cpus": "1", "memory": 128}})
    cpu.update(tuning={"vcpupin": {0: "0", 1: "1"}})
    shape = {
        "boot": dict(boot_args, kernel=guest["kernel_efi"], efi=True),
        "tpm": True,
        "serials": [{"type": "tcp", "port": port, "protocol": "raw"}],
        "consoles": [{"type": "pty"}],
        "clock": {"utc": False, "timers": {"rtc": {"tickpolicy": "catchup"}}},
    }
    ret = v["virt.init"]("uefi1", cpu, 256, disk=None, nic=None, seed=False, **shape)
    try:
        assert ret["state"] == "running"
        # OVMF ran the kernel's EFI stub: the guest's init prints its marker on ttyS0 (port 0, logged)
        lab.wait_for_text(console(hv1, "uefi1"), "GUEST-BOOT-OK", timeout=BOOT_WAIT)
        live = ET.fromstring(v["virt.get_xml"]("uefi1"))
        loader = live.find("os/loader")
        assert loader is not None and loader.get("type") == "pflash"
        assert loader.text.startswith("/usr/share/OVMF/")  # what libvirt autoselected: the distribution's OVMF
        nvram = live.find("os/nvram").text
        assert os.path.isfile(hv1.path("lib", os.path.relpath(nvram, "/var/lib/libvirt")))  # the VM's own vars
        args = qemu_cmdline(hv1, "uefi1")
        # QEMU runs with the TPM 2.0 CRB device backed by the swtpm emulator libvirt started for it
        tpmdev = args[args.index("-tpmdev") + 1]
        assert tpmdev.startswith("emulator,") and any('"driver":"tpm-crb"' in a for a in args)
        sock = tpmdev.split("chardev=")[1]
        assert any(a.startswith(f"socket,id={sock},path=") and "swtpm" in a for a in args)
        assert any('"driver":"virtconsole"' in a for a in args)  # the extra virtio console
        # Salt's cpu dict and clock reached QEMU: CPU model, topology, guest clock in host local time
        assert args[args.index("-cpu") + 1].startswith("qemu64")
        assert args[args.index("-smp") + 1] == "2,sockets=1,dies=1,cores=2,threads=1"
        assert args[args.index("-rtc") + 1].startswith("base=localtime")
        # TCG's translation cache capped at virt:tcg_tb_cache_mib's default (QEMU's own: up to 1 GiB per VM)
        tb_cache = live.find("features/tcg/tb-cache")  # libvirt keeps it in KiB
        assert (tb_cache.get("unit"), tb_cache.text) == ("KiB", "131072"), ET.tostring(tb_cache)
        assert any("tb-size=128" in a for a in args), args
        numa = [args[i + 1] for i, a in enumerate(args) if a == "-numa"]
        assert any(n.startswith("node,nodeid=0,cpus=0,") for n in numa), numa
        assert any(n.startswith("node,nodeid=1,cpus=1,") for n in numa), numa
        assert definition.feature_facts(v["virt.get_xml"]("uefi1"))["cputune"] == {"vcpupin": {0: "0", 1: "1"}}
        facts = definition.feature_facts(v["virt.get_xml"]("uefi1"))
        assert facts["tpm"] == {"model": "tpm-crb", "version": "2.0"} and facts["firmware"]["efi"] is True
        # the extra serial port listens (TCP) on 127.0.0.1 of the hypervisor only (the lab's network namespace)
        listening = lab.run(["ip", "netns", "exec", hv1.netns, "ss", "-Hltn"]).stdout
        assert f"127.0.0.1:{port} " in listening, listening
        # what libvirt filled in (the autoselected OVMF, its nvram) is no difference: nothing to update
        same = v["virt.update"]("uefi1", cpu=cpu, mem=256, disk=None, nic=None, **shape)
        assert same["changes"] == {} and same["pending_restart"] == [], same
    finally:
        v["virt.purge"]("uefi1")


def test_secure_boot_picks_enrolled_ovmf_and_direct_kernel_boot_falls_back(virt_hv, hv1, boot_args, guest):
    """secure_boot: libvirt autoselects the firmware whose descriptor offers secure-boot + enrolled-keys
    (Debian: 40-edk2-x86_64-secure-enrolled.json, OVMF_CODE_4M.ms.fd with Microsoft's keys in
    OVMF_VARS_4M.ms.fd), on q35 with SMM. The Debian kernel handed over by QEMU (direct kernel boot,
    fw_cfg) is signed by Debian's key, which only shim trusts, not a key in that db: OVMF's LoadImage
    fails authentication and OVMF's QEMU kernel loader then falls back, by design ("for compatibility"),
    to the legacy bzImage loader, which does not verify. So the guest boots (GUEST-BOOT-OK): secure boot
    protects what the firmware loads from disks, never a kernel the host passes directly."""
    with open("/usr/share/qemu/firmware/40-edk2-x86_64-secure-enrolled.json") as fh:
        enrolled = json.load(fh)
    assert {"secure-boot", "enrolled-keys", "requires-smm"} <= set(enrolled["features"])
    v = virt_hv
    ret = v["virt.init"](
        "sb1",
        1,
        256,
        disk=None,
        nic=None,
        seed=False,
        boot=dict(boot_args, kernel=guest["kernel_efi"], efi=True, secure_boot=True),
    )
    try:
        assert ret["state"] == "running"
        live = ET.fromstring(v["virt.get_xml"]("sb1"))
        loader = live.find("os/loader")
        assert loader.text == enrolled["mapping"]["executable"]["filename"] and loader.get("secure") == "yes"
        assert live.find("os/nvram").get("template") == enrolled["mapping"]["nvram-template"]["filename"]
        assert live.find("features/smm").get("state") == "on"
        assert live.find("os/type").get("machine").startswith("pc-q35")
        lab.wait_for_text(console(hv1, "sb1"), "GUEST-BOOT-OK", timeout=BOOT_WAIT)
    finally:
        v["virt.purge"]("sb1")
