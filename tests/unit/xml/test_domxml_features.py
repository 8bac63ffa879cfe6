"""saltvirt.xml.domxml_features: the feature elements (firmware, boot order, chardevs, vTPM, CPU/memory
tuning, NUMA, clock, host devices) as domxml builds them, read back the way virt.update compares them,
each case a golden file (tests/golden/domxml/<case>.xml, see tests/support/golden.py)."""

import xml.etree.ElementTree as ET

import pytest

from saltvirt.spec import cpumem, vmargs
from saltvirt.spec import vmspec as spec
from saltvirt.xml import domxml


def vm(**kw):
    """A VM with no devices but the ones a case adds (the serial console is always there)."""
    return spec.VMSpec(**dict({"name": "golden1", "cpu": 2, "mem": 256, "guest_agent": False}, **kw))


def cpu_dict(value):
    """VMSpec fields of Salt's cpu dict: <cpu> (with its NUMA cells), <vcpu> attributes, <cputune>."""
    model = cpumem.cpu_detail(value)[1]
    return {"vcpu": model.pop("vcpu", None), "cputune": model.pop("tuning", None), "cpu_model": model}


FEATURE_CASES = {
    "uefi-auto": vm(boot=spec.Boot(efi=True)),
    "uefi-secure-boot-auto": vm(boot=spec.Boot(efi=True, secure_boot=True)),
    "uefi-loader-nvram": vm(
        boot=spec.Boot(loader="/usr/share/OVMF/OVMF_CODE_4M.fd", nvram="/usr/share/OVMF/OVMF_VARS_4M.fd")
    ),
    "uefi-loader-secure-boot": vm(
        boot=spec.Boot(
            loader="/usr/share/OVMF/OVMF_CODE_4M.ms.fd", nvram="/usr/share/OVMF/OVMF_VARS_4M.ms.fd", secure_boot=True
        )
    ),
    "boot-dev-order": vm(boot_dev=["network", "cdrom", "hd"]),
    "stop-on-reboot": vm(stop_on_reboot=True),
    "serials-consoles": vm(
        serials=[
            {"type": "pty", "target_type": "serial"},
            {"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "telnet", "target_type": "serial"},
        ],
        consoles=[{"type": "pty", "target_type": "virtio"}],
    ),
    "tpm-crb": vm(tpm={"model": "tpm-crb", "version": "2.0"}),
    "clock-timers": vm(
        clock=spec.speckeys.clock(
            {
                "utc": False,
                "timers": {"rtc": {"track": "wall", "tickpolicy": "catchup"}, "hpet": {"present": False}},
            }
        )
    ),
    "clock-timezone": vm(clock=spec.speckeys.clock({"timezone": "Europe/Paris"})),
    "clock-adjustment": vm(clock=spec.speckeys.clock({"adjustment": 3600})),
    "cpu-custom-topology-features": vm(
        cpu=4,
        cpu_model=cpumem.cpu_detail(
            {
                "maximum": 4,
                "match": "exact",
                "model": {"name": "qemu64", "fallback": "forbid"},
                "topology": {"sockets": 1, "cores": 2, "threads": 2},
                "features": {"vmx": "disable", "pdpe1gb": "optional"},
            }
        )[1],
    ),
    "cpu-tuning-numa": vm(
        cpu=4,
        mem=256,
        **cpu_dict(
            {
                "maximum": 4,
                "current": 2,
                "placement": "static",
                "cpuset": "0-3",
                "tuning": {
                    "vcpupin": {0: "0-1", 1: "2,3", 2: "1-4,^2"},
                    "emulatorpin": "0",
                    "shares": 2048,
                    "period": 100000,
                    "quota": 50000,
                    "emulator_period": 100000,
                    "emulator_quota": -1,
                },
                "numa": {
                    0: {"cpus": "0-1", "memory": "128m", "memAccess": "shared"},
                    1: {"cpus": "2-3", "memory": 128, "discard": True},
                },
            }
        ),
    ),
    "mem-hotplug-hugepages": vm(
        mem=256,
        mem_current=128,
        max_mem={"size": 1024, "slots": 4},
        memory_backing=cpumem.memory_backing(
            {"hugepages": [{"size": "2m", "nodeset": "0"}, {"size": "1g"}], "nosharepages": True, "locked": True},
            numa_cells=1,
        ),
        **cpu_dict({"maximum": 2, "numa": {0: {"cpus": "0-1", "memory": 256}}}),
    ),
    "mem-backing-memfd": vm(
        memory_backing=cpumem.memory_backing(
            {"hugepages": True, "source": "memfd", "access": "shared", "allocation": "immediate", "discard": True}
        )
    ),
    "numatune-memnodes": vm(
        mem=256,
        numatune=cpumem.numatune(
            {
                "memory": {"mode": "interleave", "nodeset": "0"},
                "memnodes": {0: {"nodeset": 0}, 1: {"mode": "preferred", "nodeset": "0"}},
            },
            numa_cells=2,
        ),
        **cpu_dict({"maximum": 2, "numa": {0: {"cpus": "0", "memory": 128}, 1: {"cpus": "1", "memory": 128}}}),
    ),
    "hostdev-pci-usb": vm(
        hostdevs=[
            {"name": "pci_0000_00_1f_2", "type": "pci", "address": "0000:00:1f.2"},
            {"name": "usb_3_1", "type": "usb", "vendor": "0x1d6b", "product": "0x0002", "bus": 3, "device": 1},
        ]
    ),
    "cpu-host-passthrough": vm(cpu_model=cpumem.cpu_detail({"maximum": 2, "mode": "host-passthrough"})[1]),
    "memtune-limits": vm(memtune=cpumem.mem_detail({"boot": "256m", "hard_limit": "1g", "soft_limit": 512})[1]),
    "numatune-strict": vm(numatune=cpumem.numatune({"memory": {"mode": "strict", "nodeset": "0"}})),
    "hypervisor-features-kvm": vm(vtype="kvm", hypervisor_features={"kvm-hint-dedicated": True, "kvm-hidden": True}),
}


@pytest.mark.parametrize("case", sorted(FEATURE_CASES))
def test_golden_features(golden, case):
    """Each new element is its golden file, valid for libvirt's schema and what libvirt reads back."""
    xml = domxml.build(FEATURE_CASES[case])
    ours, libvirts = domxml.feature_facts(xml), domxml.feature_facts(golden(f"domxml/{case}", xml))
    assert libvirts == ours


def test_feature_facts_from_spec_build():
    """What virt.init's arguments become, read back the way virt.update compares them."""
    s = spec.build(
        vmargs.InitRequest(
            "f1",
            1,
            64,
            disk=None,
            nic=None,
            boot={"efi": "yes", "secure_boot": True},
            serials=[{"type": "tcp", "port": "4555", "protocol": "raw"}],
            consoles={"type": "pty"},
            tpm=True,
            stop_on_reboot="true",
        ),
        images_dir="/v",
    )
    facts = domxml.feature_facts(domxml.build(s))
    assert facts == {
        "firmware": {"efi": True, "loader": None, "nvram": None, "secure_boot": True},
        "kernel_boot": {"kernel": None, "initrd": None, "cmdline": None},
        "boot_dev": ["hd"],
        "stop_on_reboot": True,
        "serials": [{"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "raw"}],
        "consoles": [{"type": "pty"}],
        "tpm": {"model": "tpm-crb", "version": "2.0"},
        "clock": None,
        "hypervisor_features": {},
        "cpu_model": None,
        "memtune": None,
        "numatune": None,
        "vcpu": {"placement": "static", "cpuset": None},
        "cputune": None,
        "max_mem": None,
        "memory_backing": None,
        "host_devices": [],
    }
    root = ET.fromstring(domxml.build(s))
    assert root.find("os/type").get("machine") == "q35" and root.find("features/smm").get("state") == "on"
