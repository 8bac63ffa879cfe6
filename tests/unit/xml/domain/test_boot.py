"""saltvirt.xml.domain.boot: <os> (firmware, kernel boot, boot order), <features>, <clock> and the lifecycle
actions as definition.build writes them, read back the way virt.update compares them and as Salt reports them,
each case a golden file (tests/golden/domain/<case>.xml, see tests/support/golden.py)."""

import pytest

from saltvirt.model import vmspec as spec
from saltvirt.xml.domain import boot, definition
from saltvirt.xml.etree import read
from tests.support.goldenvm import check_features, vm

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
    "clock-timers": vm(
        clock=spec.checks.clock(
            {
                "utc": False,
                "timers": {"rtc": {"track": "wall", "tickpolicy": "catchup"}, "hpet": {"present": False}},
            }
        )
    ),
    "clock-timezone": vm(clock=spec.checks.clock({"timezone": "Europe/Paris"})),
    "clock-adjustment": vm(clock=spec.checks.clock({"adjustment": 3600})),
    "hypervisor-features-kvm": vm(vtype="kvm", hypervisor_features={"kvm-hint-dedicated": True, "kvm-hidden": True}),
}


@pytest.mark.parametrize("case", sorted(FEATURE_CASES))
def test_golden_features(golden, case):
    """Each element is its golden file, valid for libvirt's schema and what libvirt reads back."""
    check_features(golden, case, FEATURE_CASES[case])


def test_what_goes_in_comes_back():
    """Built then read: the readers give back the spec's boot, firmware, clock, KVM hints and on_reboot."""
    kernel = {"kernel": "/srv/boot/vmlinuz", "initrd": "/srv/boot/initrd.img", "cmdline": "console=ttyS0"}
    clock = spec.checks.clock({"utc": False, "timers": {"rtc": {"track": "wall"}}})
    s = vm(
        vtype="kvm",
        boot=spec.Boot(**kernel, loader="/usr/share/OVMF/OVMF_CODE_4M.fd", nvram="/usr/share/OVMF/OVMF_VARS_4M.fd"),
        boot_dev=["network", "hd"],
        stop_on_reboot=True,
        clock=clock,
        hypervisor_features={"kvm-hidden": True, "kvm-hint-dedicated": False},
    )
    root = read(definition.build(s))
    assert boot.facts(root) == {"boot": kernel}
    assert boot.feature_facts(root) == {
        "firmware": {
            "efi": True,
            "loader": "/usr/share/OVMF/OVMF_CODE_4M.fd",
            "nvram": "/usr/share/OVMF/OVMF_VARS_4M.fd",
            "secure_boot": False,
        },
        "kernel_boot": kernel,
        "boot_dev": ["network", "hd"],
        "stop_on_reboot": True,
        "clock": clock,
        "hypervisor_features": {"kvm-hidden": True, "kvm-hint-dedicated": False},
    }
    assert boot.salt_facts(root) == {
        "loader": {"path": "/usr/share/OVMF/OVMF_CODE_4M.fd", "readonly": "yes", "type": "pflash"},
        "on_poweroff": "destroy",
        "on_reboot": "destroy",
        "on_crash": "destroy",
    }
    bios = read(definition.build(vm()))
    assert boot.facts(bios) == {"boot": {}} and boot.loader(bios) == {"path": "None"}
    assert boot.feature_facts(bios)["firmware"] == {"efi": False, "loader": None, "nvram": None, "secure_boot": False}


def test_secure_boot_needs_q35():
    """Replacing the firmware of an i440fx VM with secure boot (q35 only) is refused, not half done."""
    old = definition.build(vm())
    new = definition.build(vm(boot=spec.Boot(efi=True, secure_boot=True)))
    with pytest.raises(ValueError, match="secure boot needs machine type q35 and this VM is i440fx"):
        definition.replace_features(old, new, ["firmware"])
    assert definition.feature_facts(definition.replace_features(old, new, ["boot_dev", "clock"])) == (
        definition.feature_facts(old)
    )
