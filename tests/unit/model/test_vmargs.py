"""saltvirt.model.vmargs: virt.init's / virt.update's arguments declared once, and the coverage test (as
virtinst's test_checkprops.py): every declared argument is exercised through the real loaders on libvirt's
test driver: accepted by virt.init, forwarded or refused by salt-run virt.init, passed to virt.update or not
by virt.running/defined, exactly as its row says."""

import dataclasses
import hashlib
import platform

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import vmcreate
from saltvirt.model import compat, vmargs, vmspec
from tests.support.paths import ROOT
from tests.support.saltloader import load_states, make_minion_mods, make_runners

NET = [{"name": "eth0", "type": "network", "source": "default"}]  # test driver: no host bridge needed
BASE = {"nic": None, "disk": None, "start": False, "seed": False}  # the smallest VM the test driver defines
STATE_BASE = {k: v for k, v in BASE.items() if k != "start"}  # virt.defined does not start


@pytest.fixture(scope="module")
def virt(tmp_path_factory):
    """One loader for the whole module (loading it is most of a test's time); each test purges its VM.
    test:///default keeps its domains while a connection to it is open: this one."""
    import libvirt

    conn = libvirt.open("test:///default")
    yield make_minion_mods(tmp_path_factory.mktemp("vmargs"), "test:///default")
    conn.close()


def examples(guest):
    """A value for every argument, what else the call needs, and the error that proves the argument reached
    its own check when the test driver cannot have what it names (None: the call succeeds)."""
    with open(guest["qcow2"], "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    image = {"image": guest["qcow2"], "disk": "default"}
    return {
        "image": (guest["qcow2"], {"disk": "default"}, None),
        "nic": ("default", {}, "bridge 'br0' does not exist"),  # the default profile's host bridge
        "disk": ("default", {}, None),
        "disks": ([{"data": {"size": 16}}], {}, None),
        "interfaces": (NET, {}, None),
        "enable_qcow": (True, image, None),
        "enable_vnc": (True, {}, None),
        "graphics": ({"type": "vnc"}, {}, None),
        "boot": ({"kernel": guest["kernel"], "initrd": guest["initrd"]}, {}, None),
        "start": (True, {}, None),
        "seed": (False, {}, None),
        "seed_cmd": ("seed.apply", {}, None),
        "seed_backend": ("auto", {}, None),
        "saltenv": ("base", {}, None),
        "pub_key": ("-----BEGIN PUBLIC KEY-----", {}, None),
        "priv_key": ("-----BEGIN PRIVATE KEY-----", {}, None),
        "master": ("salt.example", {}, None),
        "minion_id": ("m1", {}, None),
        "minion_config": ({"log_level": "info"}, {}, None),
        "vtype": ("qemu", {}, None),
        "serial_log": (False, {}, None),
        "group": ("web", {}, None),
        "connection": ("test:///default", {}, None),
        "checksum": (f"sha256:{digest}", image, None),
        "allow_http": (True, {}, "allow_http= is an operator switch"),
        "trusted_image": (True, image, "trusted_image= is an operator switch"),
        "cloud_init": (True, {}, None),
        "guest_agent": (False, {}, None),
        "boot_dev": ("hd cdrom", {}, None),
        "os_type": ("hvm", {}, None),
        "arch": (platform.machine(), {}, None),
        "stop_on_reboot": (True, {}, None),
        "serials": ([{"type": "pty"}], {}, None),
        "consoles": ([{"type": "pty"}], {}, None),
        "tpm": (True, {}, None),
        "clock": ({"utc": False}, {}, None),
        "hypervisor_features": ({"kvm-hint-dedicated": True}, {}, None),
        "numatune": ({"memory": {"mode": "strict", "nodeset": "0"}}, {}, None),
        "host_devices": (["pci_0000_00_1f_2"], {}, "pci_0000_00_1f_2"),  # the test driver has no node devices
        "owner": ({"tenant": "acme", "creator": "alice"}, {}, None),
        "ha": (True, {}, None),
        "catalog_image": ("debian12", image, None),
        "watchdog": ({"model": "i6300esb", "action": "poweroff"}, {}, None),
        "rng": (True, {}, None),
    }


# the table itself ---------------------------------------------------------------------------------
def test_init_signature_is_the_table(virt):
    assert vmargs.signature_mismatches(virt["virt.init"]) == []


def test_the_signature_check_sees_a_drift():
    def init(name, cpu, mem, image="x", **kwargs):
        pass

    found = vmargs.signature_mismatches(init)
    assert found[0].startswith("names:") and "image: default 'x' in the signature, None in the table" in found


def test_rows_are_consistent():
    assert len(set(vmargs.NAMES)) == len(vmargs.NAMES)
    for arg in vmargs.ARGS:
        assert arg.runner in (vmargs.OWN, vmargs.FORWARD, vmargs.REFUSE), arg
        assert (arg.runner == vmargs.REFUSE) == bool(arg.refusal), arg
        assert not arg.spec or arg.update, f"{arg.name}: a domain-shaping argument is one virt.update compares"
        assert arg.doc and arg.takes, arg
    spec_fields = {f.name for f in dataclasses.fields(vmspec.VMSpec)}
    for arg in vmargs.ARGS:  # a checker fills a VMSpec field, or the row is an element of its own (VMSpec.elements,
        # each with its builder: tests/unit/xml/domain/test_definition.py), or it checks only
        assert arg.into is None or arg.into in spec_fields or arg.into == arg.name, arg
        assert arg.check is None or arg.name in (arg.into, "os_type"), arg


def test_the_loader_builds_the_request_from_every_argument():
    """virt.init hands every argument to the request by name (no locals() filter): the call in the loader
    names each row once, so a row without its keyword there is caught here."""
    import ast

    tree = ast.parse((ROOT / "_modules" / "virt.py").read_text())
    init = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "init")
    calls = [
        n
        for n in ast.walk(init)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "InitRequest"
    ]
    assert len(calls) == 1 and not calls[0].args
    assert [(k.arg, getattr(k.value, "id", None)) for k in calls[0].keywords] == [(n, n) for n in vmargs.NAMES]


def test_the_docs_page_is_the_table():
    page = ROOT / "docs" / "topics" / "vm-arguments.md"
    assert page.read_text() == vmargs.markdown(), (
        "regenerate docs/topics/vm-arguments.md: PYTHONPATH=_utils python3 -c "
        "'from saltvirt.model import vmargs; print(vmargs.markdown(), end=\"\")' > docs/topics/vm-arguments.md"
    )


def test_markdown_lists_every_argument_once():
    page = vmargs.markdown()
    assert page.startswith("# virt.init and virt.update arguments\n")
    for arg in vmargs.ARGS:
        assert page.count(f"| `{arg.name}` |") == 1, arg.name
    for name in [*vmargs.UPDATE_ONLY, *vmargs.SALT_RETIRED, *vmargs.SALT_TAKEN]:
        assert f"- `{name}`: " in page


# virt.init ----------------------------------------------------------------------------------------
def test_every_argument_has_an_example(guest):
    assert set(examples(guest)) == set(vmargs.NAMES) - {"name", "cpu", "mem"}


@pytest.mark.parametrize("arg", [a for a in vmargs.NAMES if a not in ("name", "cpu", "mem")])
def test_virt_init_takes_every_declared_argument(virt, guest, arg):
    value, extra, error = examples(guest)[arg]
    args = dict(BASE, **extra)
    args[arg] = value
    name = f"va-{arg.replace('_', '-')}"
    if error:
        with pytest.raises((SaltInvocationError, CommandExecutionError), match=error) as exc:
            virt["virt.init"](name, 1, 64, **args)
        assert "unknown argument" not in str(exc.value)
        return
    ret = virt["virt.init"](name, 1, 64, **args)
    assert ret["name"] == name
    virt["virt.purge"](name)


def test_virt_init_refuses_an_undeclared_argument(virt):
    with pytest.raises(SaltInvocationError, match=r"unknown argument\(s\) enable_qcwo \(did you mean enable_qcow\?\)"):
        virt["virt.init"]("va-typo", 1, 64, enable_qcwo=True, **BASE)


def test_salts_retired_arguments_are_mapped_or_refused():
    for name in vmargs.SALT_RETIRED:
        kwargs = {name: "something"}
        try:
            compat.init_args(kwargs)
        except SaltInvocationError as exc:
            assert name in str(exc)
        else:
            assert name not in kwargs  # taken out with a warning, never passed on
    for arg in vmargs.ARGS:
        for old in arg.salt:
            kwargs = {old: "qemu"}
            compat.init_args(kwargs)
            assert kwargs == {arg.name: "qemu"}


# salt-run virt.init -------------------------------------------------------------------------------
@pytest.fixture
def runner(tmp_path):
    return make_runners(tmp_path)


@pytest.mark.parametrize("arg", [a.name for a in vmargs.ARGS if a.runner == vmargs.FORWARD])
def test_runner_forwards_what_the_table_says(arg):
    assert vmcreate.forward({arg: "x", "__pub_user": "root"}) == {arg: "x"}


@pytest.mark.parametrize("arg", [a.name for a in vmargs.ARGS if a.runner == vmargs.REFUSE])
def test_runner_refuses_what_it_sets_itself(runner, tmp_path, arg):
    ret = runner["virt.init"]("web1", 1, 128, **{arg: "x"})
    assert ret["data"] == {
        "error": f"salt-run virt.init: {arg}= is not forwarded to the hypervisors: {vmargs.BY_NAME[arg].refusal}; "
        f"drop {arg}=",
        "retcode": 1,
    }
    assert not (tmp_path / "pki").exists()  # refused before a key was generated or anything published


@pytest.mark.parametrize("arg", [a.name for a in vmargs.ARGS if a.runner == vmargs.REFUSE])
def test_forward_refuses_in_the_runners_words(arg):
    with pytest.raises(SaltInvocationError, match=f"^salt-run virt.init: {arg}= is not forwarded") as exc:
        vmcreate.forward({arg: "secret-value"})
    assert "secret-value" not in str(exc.value)


def test_runner_refuses_an_undeclared_argument_before_anything_happens(runner, tmp_path):
    ret = runner["virt.init"]("web1", 1, 128, serial_lgo=False)
    assert "unknown argument(s) serial_lgo (did you mean serial_log?)" in ret["data"]["error"], ret
    assert not (tmp_path / "pki").exists()


def test_runners_own_parameters_are_the_rows_marked_own(runner):
    import inspect

    own = set(inspect.signature(runner["virt.init"]).parameters) & set(vmargs.NAMES)
    assert own == {a.name for a in vmargs.ARGS if a.runner == vmargs.OWN}


# virt.running / virt.defined on an existing VM ----------------------------------------------------
# a value that differs from the VM made with BASE, for each argument the states pass to virt.update
CHANGED = {
    "nic": "default",
    "interfaces": NET,
    "disks": [{"data": {"size": 16}}],
    "enable_vnc": True,
    "graphics": {"type": "vnc"},
    "tpm": True,
    "clock": {"utc": False},
    "stop_on_reboot": True,
    "serials": [{"type": "pty"}],
    "consoles": [{"type": "pty"}],
    "boot_dev": "hd cdrom",
    "hypervisor_features": {"kvm-hint-dedicated": True},
    "numatune": {"memory": {"mode": "strict", "nodeset": "0"}},
    "boot": {"efi": True},  # the firmware is what an existing VM's boot is compared by
    "ha": True,  # salt-virt's <metadata>: automatic HA's flag
    "watchdog": True,
    "rng": True,
}


@pytest.mark.parametrize("arg", [a.name for a in vmargs.ARGS if a.state == vmargs.GIVEN])
def test_states_pass_what_the_table_says_to_virt_update(virt, guest, arg):
    """An argument the states converge changes the plan of an existing VM (test=True: nothing applied)."""
    if arg in ("cpu", "mem", "image", "disk", "enable_qcow", "host_devices"):
        # cpu/mem: tests/unit/vm/test_converge.py; image/disk/enable_qcow: only shape the system disk, which
        # the VM has already; host_devices: the test driver has none
        pytest.skip("covered elsewhere")
    assert arg in CHANGED, f"give {arg} a value that differs from the VM BASE makes"
    value = CHANGED[arg]
    name = f"vs-{arg.replace('_', '-')}"
    virt["virt.init"](name, 1, 64, **BASE)
    ret = load_states(virt, test=True)["virt.defined"](name, cpu=1, mem=64, **dict(STATE_BASE, **{arg: value}))
    virt["virt.purge"](name)
    assert ret["result"] is None and ret["changes"], ret


@pytest.mark.parametrize("arg", [a.name for a in vmargs.ARGS if a.state == vmargs.CREATE])
def test_states_leave_creation_only_arguments_alone(virt, guest, arg):
    value, extra, error = examples(guest)[arg]
    if error or extra:
        pytest.skip("needs what the test driver cannot have, or an image (creation covered above)")
    name = f"vc-{arg.replace('_', '-')}"
    virt["virt.init"](name, 1, 64, **BASE)
    ret = load_states(virt, test=True)["virt.defined"](name, cpu=1, mem=64, **dict(STATE_BASE, **{arg: value}))
    virt["virt.purge"](name)
    assert ret["result"] is True and ret["changes"] == {}, ret


def test_arguments_left_out_are_left_alone(virt):
    """Salt's update: what the state does not give (a console here) stays as the VM has it."""
    virt["virt.init"]("vh", 1, 64, enable_vnc=True, **BASE)
    ret = load_states(virt, test=True)["virt.defined"]("vh", cpu=1, mem=64, **STATE_BASE)
    virt["virt.purge"]("vh")
    assert ret["result"] is True and ret["changes"] == {}, ret


def test_states_refuse_what_the_table_says(virt):
    for arg, why in vmargs.STATE_REFUSALS.items():
        ret = load_states(virt)["virt.running"]("vr", cpu=1, mem=64, **dict(STATE_BASE, **{arg: True}))
        assert ret["result"] is False and ret["comment"] == why, ret
    ret = load_states(virt)["virt.running"]("vr", cpu=1, mem=64, graphcis=None)
    assert "unknown argument(s) graphcis (did you mean graphics?)" in ret["comment"], ret
