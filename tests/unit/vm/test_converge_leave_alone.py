"""virt.defined / virt.running / virt.update on an existing VM converge only what the call names (Salt's
update leaves the rest alone): proven for every converged key on a VM with non-default NICs, disks,
graphics, boot order and devices (libvirt's test driver, Salt's real state loader)."""

import pytest

from saltvirt.xml.domain import definition
from tests.support.saltloader import load_states, make_minion_mods

NAME = "keep1"
# a VM nothing like virt.init's defaults (nic/disk profile "default", no graphics, boot from hd)
SHAPE = {
    "nic": None,
    "interfaces": [
        {"name": "eth0", "type": "network", "source": "default", "model": "e1000"},
        {"name": "eth1", "type": "network", "source": "default", "model": "rtl8139", "mac": "52:54:00:aa:bb:01"},
    ],
    "disk": None,
    "disks": [{"name": "data", "size": 8, "model": "ide"}],
    "graphics": {"type": "vnc", "listen": {"type": "address", "address": "127.0.0.1"}},
    "boot_dev": "network hd",
    "stop_on_reboot": True,
    "serials": [{"type": "tcp", "port": 4555, "protocol": "raw"}],
    "consoles": [{"type": "pty"}],
    "tpm": True,
    "clock": {"utc": False},
    "hypervisor_features": {"kvm-hidden": True},
    "numatune": {"memory": {"mode": "interleave", "nodeset": "0"}},
}
# one new value per converged key, and the field of converge.FIELDS it changes
CHANGE = [
    ({"cpu": 2}, "cpu"),
    ({"mem": 96}, "mem"),
    ({"nic": "default"}, "nics"),
    ({"interfaces": [{"name": "eth0", "type": "network", "source": "default"}]}, "nics"),
    ({"disks": [{"name": "data", "size": 8, "model": "ide"}, {"name": "more", "size": 4}]}, "disks"),
    ({"enable_vnc": False}, "graphics"),
    ({"graphics": {"type": "spice"}}, "graphics"),
    ({"boot_dev": "hd"}, "boot_dev"),
    ({"boot": {"efi": True}}, "firmware"),
    ({"boot": {"kernel": "{images}/k", "initrd": "{images}/i"}}, "kernel_boot"),
    ({"stop_on_reboot": False}, "stop_on_reboot"),
    ({"serials": []}, "serials"),
    ({"consoles": []}, "consoles"),
    ({"tpm": False}, "tpm"),
    ({"clock": {"utc": True, "adjustment": 3600}}, "clock"),
    ({"hypervisor_features": {"kvm-hidden": False}}, "hypervisor_features"),
    ({"numatune": {"memory": {"mode": "strict", "nodeset": "0"}}}, "numatune"),
]


@pytest.fixture
def virt_test(virt_test, tmp_path):
    """The test driver's virt.* (cleaned up by the outer fixture) with the shape's TCP serial port allowed."""
    return make_minion_mods(tmp_path / "tcp", "test:///default", serial_tcp_ports="4555")


@pytest.fixture
def vm(virt_test):
    virt_test["virt.init"](NAME, 1, 64, start=False, seed=False, **SHAPE)
    return virt_test


def _facts(v):
    facts = definition.parse_for_compare(v["virt.get_xml"](NAME))
    facts.update(facts.pop("features"))
    return facts


def _images(v):
    """virt:images of the fixture (a kernel must be inside the allowed image roots)."""
    return v["config.get"]("virt:images")


# the facts a field's change touches (converge.FIELDS -> definition.parse_for_compare keys)
TOUCHES = {"cpu": ("cpu", "vcpu_current"), "mem": ("mem", "current_mem"), "kernel_boot": ("kernel_boot", "boot")}


@pytest.mark.parametrize("state", ["virt.defined", "virt.running"])
def test_a_state_given_only_the_name_leaves_the_vm_alone(vm, state):
    before = vm["virt.get_xml"](NAME)
    for test in (True, False):
        ret = load_states(vm, test)[state](NAME)
        assert ret["result"] in (True, None) and not {k: v for k, v in ret["changes"].items() if k != "state"}, ret
    assert vm["virt.get_xml"](NAME, inactive=True) == before
    assert vm["virt.vm_state"](NAME) == {NAME: "running" if state == "virt.running" else "shutoff"}


def test_every_converged_key_given_as_none_is_not_given(vm):
    before = vm["virt.get_xml"](NAME)
    none = {k: None for k in SHAPE} | {"boot": None}
    assert load_states(vm, False)["virt.defined"](NAME, cpu=1, mem=64, **none)["changes"] == {}
    assert vm["virt.update"](NAME, **none)["changes"] == {}
    assert vm["virt.get_xml"](NAME) == before


@pytest.mark.parametrize("args, field", CHANGE, ids=[f"{f}-{'-'.join(a)}" for a, f in CHANGE])
def test_a_state_changes_only_the_key_it_names(vm, args, field):
    before = _facts(vm)
    if field == "kernel_boot":
        args = {"boot": {k: v.format(images=_images(vm)) for k, v in args["boot"].items()}}
    ret = load_states(vm, False)["virt.defined"](NAME, **args)
    assert ret["result"] is True, ret
    assert set(ret["changes"]) == {field}, ret["changes"]
    after = _facts(vm)
    touched = set(TOUCHES.get(field, (field,)))
    assert {k: v for k, v in after.items() if k not in touched} == {
        k: v for k, v in before.items() if k not in touched
    }, f"{args} changed more than {field}"
    assert any(after[k] != before[k] for k in touched)
    assert load_states(vm, False)["virt.defined"](NAME, **args)["changes"] == {}  # idempotent


def test_boot_kernel_removed_keeps_the_boot_order_and_firmware(vm):
    """Uyuni's PXE/kickstart install: first boot from a kernel with a boot order, then
    ``boot: {kernel: null, initrd: null, cmdline: null}`` takes the kernel away and nothing else."""
    st = load_states(vm, False)
    kernel = {"kernel": f"{_images(vm)}/k", "initrd": f"{_images(vm)}/i", "cmdline": "ks=x"}
    assert st["virt.defined"](NAME, boot=kernel, boot_dev="network hd")["result"] is True
    facts = _facts(vm)
    assert facts["kernel_boot"] == kernel and facts["boot_dev"] == ["network", "hd"]
    gone = st["virt.defined"](NAME, boot={"kernel": None, "initrd": None, "cmdline": None})
    assert set(gone["changes"]) == {"kernel_boot"}, gone
    after = _facts(vm)
    assert after["kernel_boot"] == {"kernel": None, "initrd": None, "cmdline": None}
    assert after["boot_dev"] == ["network", "hd"] and after["firmware"] == facts["firmware"]


def test_states_take_vm_type_and_boot_dev_with_a_kernel(virt_test):
    """Uyuni's create-vm.sls: virt.running with vm_type, boot_dev and a direct kernel boot together."""
    images = _images(virt_test)
    kernel = {"kernel": f"{images}/k", "initrd": f"{images}/i", "cmdline": "autoyast=x"}
    st = load_states(virt_test, False)
    args = {"cpu": 1, "mem": 64, "vm_type": "qemu", "nic": None, "disk": None, "seed": False}
    ret = st["virt.defined"]("kern1", boot=kernel, boot_dev="network hd", **args)
    assert ret["result"] is True, ret
    facts = definition.feature_facts(virt_test["virt.get_xml"]("kern1"))
    assert facts["kernel_boot"] == kernel and facts["boot_dev"] == ["network", "hd"]
    assert st["virt.defined"]("kern1", boot=kernel, boot_dev="network hd", **args)["changes"] == {}


def test_live_false_changes_only_the_definition_of_a_running_vm(virt_test):
    """Salt's ``live: False`` (Uyuni's create-vm.sls redefines the VM it just started that way)."""
    st = load_states(virt_test, False)
    args = {"nic": None, "disk": None, "seed": False}
    assert st["virt.running"]("live1", cpu=1, mem=64, **args)["result"] is True
    ret = st["virt.defined"]("live1", cpu=1, mem=48, live=False, **args)
    assert ret["result"] is True and set(ret["changes"]) == {"mem"}, ret
    assert "needs restart: mem 64 -> 48 MiB (live=False)" in ret["comment"], ret["comment"]
    assert "<currentMemory unit='KiB'>65536</currentMemory>" in virt_test["virt.get_xml"]("live1")  # running: as it was
    assert "<memory unit='KiB'>49152</memory>" in virt_test["virt.get_xml"]("live1", inactive=True)
