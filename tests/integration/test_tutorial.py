"""The tutorial's last step, for real: ``salt-run virt.init`` creates a Debian VM whose own salt-minion
(installed in the image) joins the master with the key the master pre-accepted, and answers test.ping.

Shape (tests/support/lab.py): the master listens on all addresses; the lab fabric gets a DHCP server
and a link to the root namespace (``Fabric.master_link``), so a guest on hv1's br0 reaches the master
at ``fabric.master_ip``. The master does not auto-accept keys: a minion that presented a key the master
had not pre-accepted would stay pending and never answer.

The image is built by scripts/setup.sh (scripts/build-debian-image.sh, cached under
/var/cache/salt-virt/debian): Debian 12, systemd, salt-minion 3008.5 enabled at boot.
"""

import contextlib
import hashlib
import os
import pathlib
import re
import time

import pytest

from tests.support import lab
from tests.support.saltd import hypervisor_minion_config, master_config, presync, start_minion

DEBIAN = pathlib.Path(os.environ.get("SALT_VIRT_DEBIAN", "/var/cache/salt-virt/debian"))
PING_TIMEOUT = 420  # TCG boot of systemd + salt-minion start; generous for a loaded CI machine


@pytest.fixture(scope="module")
def debian_image():
    image = DEBIAN / "debian-minion.qcow2"
    if not image.is_file():
        pytest.fail(f"{image} is missing: run scripts/setup.sh (it builds the Debian guest images)")
    return image


@pytest.fixture(scope="module")
def tut_lab(lab_dir):
    fabric = lab.Fabric(lab.new_tag()).start()
    try:
        master_ip = fabric.master_link()
        fabric.dhcp()
        hv = lab.Hypervisor(lab_dir, 4, fabric).start()
        try:
            yield fabric, hv, master_ip
        finally:
            hv.stop()
    finally:
        fabric.stop()


@pytest.fixture(scope="module")
def tut_master(salt_factories, state_tree, debian_image, tut_lab):
    (state_tree / "images").mkdir(exist_ok=True)
    link = state_tree / "images" / "debian.qcow2"
    if not link.exists():
        link.symlink_to(debian_image)
    overrides = master_config(
        state_tree,
        interface="0.0.0.0",
        auto_accept=False,
        virt={
            "hypervisors": {"tgt": "tut-hv", "tgt_type": "glob", "timeout": 10, "gather_job_timeout": 10},
            "guest_master": tut_lab[2],  # where new VMs' minions find this master (its ports are seeded too)
        },
    )
    factory = presync(salt_factories.salt_master_daemon("tut-master", overrides=overrides))
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def tut_hv(tut_master, tut_lab, lab_dir):
    _, hv, _ = tut_lab
    factory = start_minion(tut_master, "tut-hv", hypervisor_minion_config(hv, pathlib.Path(lab_dir) / "tut-images"))
    with factory.started():
        yield factory


def _keys(master):
    pki = pathlib.Path(master.config["pki_dir"])
    return {
        state: sorted(p.name for p in (pki / sub).iterdir()) if (pki / sub).is_dir() else []
        for state, sub in (("accepted", "minions"), ("pending", "minions_pre"), ("rejected", "minions_rejected"))
    }


def _init(master, name, *extra):
    """salt-run virt.init as the tutorial writes it (virt:guest_master says where the new minion goes)."""
    return master.salt_run_cli(timeout=600).run(
        "virt.init", name, "1", "512", "salt://images/debian.qcow2", "enable_qcow=True", *extra, "--out=json"
    )


def _wait_ping(master, name, timeout=PING_TIMEOUT):
    """Poll ``salt NAME test.ping`` until True; meanwhile the master must never hold a pending key for
    NAME (it would mean the guest came up with a key other than the pre-accepted one)."""
    cli = master.salt_cli(timeout=30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert name not in _keys(master)["pending"], f"{name} presented a key the master had not accepted"
        ret = cli.run("test.ping", minion_tgt=name)
        if ret.returncode == 0 and ret.data is True:
            return time.monotonic()
        time.sleep(3)
    raise AssertionError(f"{name} did not answer test.ping within {timeout} s")


def _fingerprint(master, name):
    pub = pathlib.Path(master.config["pki_dir"]) / "minions" / name
    return hashlib.sha256(pub.read_bytes()).hexdigest()


def test_new_vm_minion_answers_with_the_preaccepted_key(tut_master, tut_hv, tut_lab):
    names = ["tut1", "tut2"]
    try:
        # two VMs from one base image: each its own id and its own key. tut2 boots and answers with its own;
        # tut1 is only created (a second Debian boot under TCG proves nothing more and costs minutes of CPU)
        for name, extra in (("tut1", ["start=False"]), ("tut2", [])):
            ret = _init(tut_master, name, *extra)
            assert ret.returncode == 0, ret
            assert name in _keys(tut_master)["accepted"]
        _wait_ping(tut_master, "tut2")
        assert _fingerprint(tut_master, "tut1") != _fingerprint(tut_master, "tut2")
        grains = tut_master.salt_cli(timeout=60).run("grains.item", "id", "os", "osrelease", "ipv4", minion_tgt="tut2")
        assert grains.returncode == 0, grains
        assert grains.data["id"] == "tut2" and grains.data["os"] == "Debian", grains.data
        assert str(grains.data["osrelease"]).startswith("12"), grains.data
        # the image marks its boot phases on the serial console (bench/bench_tutorial.py times them); its
        # minion starts once the DHCP lease is there, so its grains (computed once at start, then cached)
        # hold the leased address
        console = pathlib.Path(tut_lab[1].path("log", "qemu", "tut2-serial.log")).read_text(errors="replace")
        phases = {name: float(up) for name, up in reversed(re.findall(r"SV-PHASE (\S+) (\d+\.\d+)", console))}
        assert {"systemd", "dhcp", "minion-start"} <= set(phases), console[-2000:]
        assert phases["systemd"] < phases["dhcp"] and phases["systemd"] < phases["minion-start"], phases
        assert any(ip.startswith(f"{lab.FABRIC_NET}.") for ip in grains.data["ipv4"]), grains.data
        keys = _keys(tut_master)
        assert not set(names) & set(keys["pending"] + keys["rejected"]), keys
        # purge removes the VM and the key virt.init created for it, and nothing else
        ret = tut_master.salt_run_cli(timeout=300).run("virt.purge", "tut1", "--out=json")
        assert ret.returncode == 0, ret
        keys = _keys(tut_master)
        assert "tut1" not in keys["accepted"] and "tut2" in keys["accepted"], keys
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                tut_master.salt_run_cli(timeout=300).run("virt.purge", name)
