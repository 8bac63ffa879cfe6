"""A fleet of namespaced lab hypervisors (tests/support/lab.py) with shared storage, minions of a test master and
TCG guests on the shared storage that print heartbeats on their serial console: what the recovery and balancing
integration tests (tests/integration/test_recovery.py, test_rebalance_real.py, test_balance_real.py) build and look at.

Shared storage: one directory every hypervisor sees at the same path (the lab's hypervisors run on this machine),
in their ``virt:allowed_paths``, with the guest image ``golden.qcow2`` every VM's disk is an overlay of. Proof that
a guest runs: a boot mark and heartbeats ("HB") on its console log on a host (:func:`beating`).
"""

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time

from tests.support import lab
from tests.support.paths import guest_boot
from tests.support.saltd import hypervisor_minion_config, started_minions

BOOT_WAIT = 300  # bound on a TCG guest's console: seconds when idle, minutes on a loaded machine


@contextlib.contextmanager
def shared_store(lab_dir, guest, name):
    """The shared storage directory ``<lab_dir>/<name>`` holding ``golden.qcow2`` (the test guest)."""
    root = pathlib.Path(lab_dir) / name
    root.mkdir()
    shutil.copyfile(guest["qcow2"], root / "golden.qcow2")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def hypervisors(lab_dir, fabric, indexes, lockspace=None):
    """``{"hv<i>": lab.Hypervisor}`` (not started: :func:`fleet_minions` starts them), stopped at the end."""
    hvs = {f"hv{i}": lab.Hypervisor(lab_dir, i, fabric, lockspace=lockspace) for i in indexes}
    try:
        yield hvs
    finally:
        for hv in hvs.values():
            if hv.pid:
                hv.stop()


def minion_configs(hvs, lab_dir, store, migration=None):
    """Minion overrides of each hypervisor: its own ``virt:images``, the shared ``store`` allowed (its golden image
    trusted: overlays on it are attached), the failed-host probe by unix socket (the lab's libvirtds listen in
    network namespaces the minions cannot reach) and ``virt:migration`` (default: plaintext allowed, this lab has
    no TLS)."""
    configs = {}
    for name, hv in hvs.items():
        config = hypervisor_minion_config(hv, pathlib.Path(lab_dir) / f"{name}-images")
        config["virt"]["allowed_paths"].append(str(store))
        config["virt"]["insecure_trusted_images"] = [str(store / "golden.qcow2")]
        config["virt"]["recovery"] = {"probe_uri": f"qemu+unix:///system?socket={lab_dir}/{{host}}/run/libvirt-sock"}
        config["virt"]["migration"] = migration or {"allow_cleartext": True}
        configs[name] = config
    return configs


@contextlib.contextmanager
def fleet_minions(master, hvs, configs):
    """The hypervisors' minions running (``{id: factory}``), answering ``master``, their libvirtds started."""
    with started_minions(master, configs) as factories:
        ret = master.salt_cli(timeout=180).run("test.ping", minion_tgt="hv*")
        assert ret.returncode == 0 and sorted(ret.data) == sorted(hvs), ret
        for hv in hvs.values():
            hv.start().warm_up()
        yield factories


@contextlib.contextmanager
def local_client(master):
    import salt.client

    client = salt.client.get_local_client(os.path.join(master.config_dir, "master"))
    try:
        yield client
    finally:
        client.destroy()


def ok(local, minion, fun, *args, **kwargs):
    ret = local.cmd(minion, fun, list(args), kwarg=kwargs, timeout=300, full_return=True)
    assert minion in ret and ret[minion].get("retcode", 0) == 0, ret
    return ret[minion]["ret"]


def run(master, *args, **kwargs):
    """``salt-run`` on ``master``: ``args`` as given, ``kwargs`` as ``key=<json>``."""
    return master.salt_run_cli(timeout=600).run(*args, *(f"{k}={json.dumps(v)}" for k, v in kwargs.items()))


def where(local, name, hosts):
    """``{host: state}`` of the hosts among ``hosts`` that define ``name``."""
    ret = local.cmd(list(hosts), "virt.vm_state", tgt_type="list", timeout=60)
    assert sorted(ret) == sorted(hosts), ret
    return {h: states[name] for h, states in ret.items() if name in states}


def console(hv, name):
    try:
        return pathlib.Path(hv.path("log", "qemu", f"{name}-serial.log")).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def beating(hv, name, after=0):
    """Wait for a boot and three heartbeats in ``name``'s console log on ``hv`` (from offset ``after``)."""
    deadline = time.monotonic() + BOOT_WAIT
    while time.monotonic() < deadline:
        text = console(hv, name)[after:]
        if "GUEST-BOOT-OK" in text and text.count("\nHB ") >= 3:
            return text
        time.sleep(0.3)
    raise AssertionError(f"{name} does not run on {hv.hostname}:\n{console(hv, name)[-500:]}")


def beats_on(hv, name, before):
    """Wait for three heartbeats of ``name`` on ``hv`` after console offset ``before``, and check it did not boot
    again there: a live migration's proof (the guest went on running)."""
    deadline = time.monotonic() + BOOT_WAIT
    while console(hv, name)[before:].count("\nHB ") < 3:
        assert time.monotonic() < deadline, console(hv, name)[-500:]
        time.sleep(0.3)
    assert "GUEST-BOOT-OK" not in console(hv, name)[before:]


def shared_vm(local, store, guest, host, name, mem=128, initrd="initrd"):
    """Define and start ``name`` on ``host``: its disk an overlay of the store's golden image, on the store
    (``initrd="initrd_qga"``: the test guest with its guest agent running)."""
    disk = store / f"{name}.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(store / "golden.qcow2"), str(disk)],
        check=True,
    )
    boot = guest_boot(guest, initrd=initrd)
    ok(
        local,
        host,
        "virt.init",
        name,
        1,
        mem,
        boot=boot,
        disks=[{"name": "system", "path": str(disk), "format": "qcow2"}],
    )
