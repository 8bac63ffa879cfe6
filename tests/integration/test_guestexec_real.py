"""``cmd.run`` on a ``virt_vm`` resource through a real QEMU guest agent: the busybox test guest's qemu-ga
variant (scripts/build-guest.sh, ``initrd-qga.img``) booted under TCG on the real libvirtd hv1, and the resource
functions called through Salt's real resource loaders with the job's user as a publication gives it (no salt
daemons: Salt's own path from a published ``T@virt_vm`` job to the resource function is
tests/integration/test_resources.py). The request building, caps and refusals are unit-tested with a fake agent
in tests/unit/host/test_guestexec.py; this checks what libvirt and a real agent make of them."""

import time

import pytest
import salt.loader.context
from salt.exceptions import CommandExecutionError

from saltvirt.host import conn as lvconn
from saltvirt.host import vmresources
from saltvirt.model import tenancy
from saltvirt.xml.domain import definition
from tests.support import lab
from tests.support.paths import GUEST_DIR, guest_boot
from tests.support.saltloader import make_minion_mods, make_resource_loaders

NAME = "gx1"


def wait_agent_connected(hv, name, timeout=120):
    """libvirt marks the agent's channel connected once qemu-ga in the guest opens its port."""
    deadline = time.monotonic() + timeout
    while True:
        with lvconn.connect(hv.uri) as conn:
            state = definition.parse(conn.lookupByName(name).XMLDesc(0))["guest_agent"]
        if state == "connected" or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


@pytest.fixture
def vm(hv1, tmp_path, qemu_tmp, guest):
    """The qemu-ga guest, running with its agent connected, recorded as tenant acme's; its UUID."""
    mods = make_minion_mods(
        tmp_path / "hv", hv1.uri, images_dir=qemu_tmp / "images", allowed_paths=[str(GUEST_DIR), str(qemu_tmp)]
    )
    boot = guest_boot(guest, initrd="initrd_qga")
    mods["virt.init"](NAME, 1, 256, image=guest["qcow2"], boot=boot, seed=False)  # guest_agent=True: default
    try:
        serial = lab.wait_for_text(hv1.path("log", "qemu", f"{NAME}-serial.log"), "HB 1", timeout=300)
        assert "QGA-UP" in serial, serial[-2000:]
        assert wait_agent_connected(hv1, NAME) == "connected"
        with lvconn.connect(hv1.uri) as conn:
            yield conn.lookupByName(NAME).UUIDString()
    finally:
        mods["virt.purge"](NAME)


def on(uuid, func, *args, user="root", **kwargs):
    """``func`` as Salt's job thread runs a resource job published by ``user``."""
    token = salt.loader.context.resource_ctxvar.set({"id": uuid, "type": vmresources.TYPE})
    try:
        return func(*args, __pub_user=user, __pub_jid="1", **kwargs)
    finally:
        salt.loader.context.resource_ctxvar.reset(token)


def test_cmd_run_through_a_real_guest_agent(hv1, vm, tmp_path):
    members = {tenancy.MEMBERS_PILLAR: {"alice": "acme"}}
    _, modules = make_resource_loaders(tmp_path / "rs", hv1.uri, pillar=members, resources={"guest_exec": True})
    run = modules["cmd.run"]
    assert on(vm, run, "echo hello; id -u") == "hello\n0"  # /bin/sh -c in the guest, as root there
    assert on(vm, run, ["/bin/echo", "a;b", "$HOME"]) == "a;b $HOME"  # an argv: no shell
    with pytest.raises(CommandExecutionError, match=r"failed in the guest \(exit code 3\): oops"):
        on(vm, run, "echo oops >&2; exit 3")
    started = time.monotonic()
    with pytest.raises(CommandExecutionError, match=r"still runs in the guest after 2 s \(process \d+ there"):
        on(vm, run, "sleep 30", timeout=2)
    assert time.monotonic() - started < 2 + 15  # bounded: the polls' own agent timeouts at most
    big = on(vm, run, "i=0; while [ $i -lt 1100 ]; do printf '%1023d\\n' $i; i=$((i+1)); done")
    assert big.endswith("\n[salt-virt: out cut at 1048576 bytes]") and len(big) < (1 << 20) + 100
    # a tenant's user: refused, on its own tenant's VM too, before anything reaches the guest
    with pytest.raises(CommandExecutionError, match="cmd.run on a hypervisor is for operators, and user alice is not"):
        on(vm, run, "touch /data/tenant-was-here", user="alice")
    assert on(vm, run, "ls /data/tenant-was-here 2>&1 || true").endswith("No such file or directory")
    with pytest.raises(CommandExecutionError, match="grains.get on a hypervisor is for operators"):
        on(vm, modules["grains.get"], "tenant", user="alice")  # an operator's VM (no owner): not acme's
    assert on(vm, modules["grains.get"], "tenant") == ""  # no tenant: grains.get's default
