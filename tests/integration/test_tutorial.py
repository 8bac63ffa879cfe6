"""The walk-through's first VM (docs/walkthrough.md), its commands run as the page writes them: ``salt-run
virt.init ... wait=minion`` creates a Debian VM whose own salt-minion (installed in the image) joins the
master with the key the master pre-accepted, and answers test.ping.

Shape (tests/support/lab.py): the master listens on all addresses; the lab fabric gets a DHCP server
and a link to the root namespace (``Fabric.master_link``), so a guest on hv1's br0 reaches the master
at ``fabric.master_ip``. The master does not auto-accept keys: a minion that presented a key the master
had not pre-accepted would stay pending and never answer.

The image is built by scripts/setup.sh (scripts/build-debian-image.sh, cached under
/var/cache/salt-virt/debian): Debian 12, systemd, salt-minion 3008.5 enabled at boot.
"""

import contextlib
import hashlib
import json
import os
import pathlib
import re
import shlex

import pytest

from tests.support import lab
from tests.support.paths import ROOT
from tests.support.saltd import hypervisor_minion_config, master_config, presync, start_minion

DEBIAN = pathlib.Path(os.environ.get("SALT_VIRT_DEBIAN", "/var/cache/salt-virt/debian"))


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


def _fingerprint(master, name):
    pub = pathlib.Path(master.config["pki_dir"]) / "minions" / name
    return hashlib.sha256(pub.read_bytes()).hexdigest()


def walkthrough_commands():
    """The ``$ `` lines of docs/walkthrough.md (its "first VM" part), as argv lists, in the page's order."""
    text = (ROOT / "docs" / "walkthrough.md").read_text()
    return [shlex.split(line[2:]) for line in text.splitlines() if line.startswith("$ ")]


def run_page_command(master, argv):
    """One command of the page, on this lab's master, as the page writes it (JSON out to read it back)."""
    if argv[0] == "salt-run":
        return master.salt_run_cli(timeout=900).run(*argv[1:], "--out=json")
    assert argv[0] == "salt", argv  # the page's commands are salt and salt-run only
    return master.salt_cli(timeout=120).run(*argv[2:], minion_tgt=argv[1])


def test_new_vm_minion_answers_with_the_preaccepted_key(tut_master, tut_hv, tut_lab):
    """docs/walkthrough.md's first VM, command by command: init with wait=minion, ping, grains, query, purge;
    then a second VM from the same image has a key of its own."""
    commands = walkthrough_commands()
    assert [argv[:2] for argv in commands] == [
        ["salt-run", "virt.init"],
        ["salt", "demo1"],
        ["salt", "demo1"],
        ["salt-run", "virt.query"],
        ["salt-run", "virt.purge"],
    ], commands
    name = commands[0][2]
    names = [name, "tut1"]
    try:
        init, ping, grains, query, purge = commands
        ret = run_page_command(tut_master, init)
        assert ret.returncode == 0, ret
        assert ret.data["wait"]["result"] == "ok" and ret.data["wait"]["minion"] == name, ret.data
        keys = _keys(tut_master)
        assert name in keys["accepted"] and name not in keys["pending"] + keys["rejected"], keys
        ret = run_page_command(tut_master, ping)
        assert ret.returncode == 0 and ret.data is True, ret  # at once: no key to accept, nothing pending
        ret = run_page_command(tut_master, grains)
        assert ret.returncode == 0 and ret.data["os"] == "Debian", ret
        assert str(ret.data["osrelease"]).startswith("12"), ret.data
        ret = run_page_command(tut_master, query)
        assert ret.returncode == 0 and name in json.dumps(ret.data), ret
        # the image marks its boot phases on the serial console (bench/bench_tutorial.py times them); its
        # minion starts once the DHCP lease is there, so its grains (computed once at start, then cached)
        # hold the leased address
        console = pathlib.Path(tut_lab[1].path("log", "qemu", f"{name}-serial.log")).read_text(errors="replace")
        phases = {n: float(up) for n, up in reversed(re.findall(r"SV-PHASE (\S+) (\d+\.\d+)", console))}
        assert {"systemd", "dhcp", "minion-start"} <= set(phases), console[-2000:]
        assert phases["systemd"] < phases["dhcp"] and phases["systemd"] < phases["minion-start"], phases
        ips = tut_master.salt_cli(timeout=60).run("grains.item", "ipv4", minion_tgt=name)
        assert any(ip.startswith(f"{lab.FABRIC_NET}.") for ip in ips.data["ipv4"]), ips.data
        # a second VM from the same base image: its own id and its own key (only created: a second Debian
        # boot under TCG proves nothing more and costs minutes of CPU)
        ret = _init(tut_master, "tut1", "start=False")
        assert ret.returncode == 0 and "tut1" in _keys(tut_master)["accepted"], ret
        assert _fingerprint(tut_master, "tut1") != _fingerprint(tut_master, name)
        # purge (the page's last command) removes the VM and the key virt.init created for it, nothing else
        ret = run_page_command(tut_master, purge)
        assert ret.returncode == 0, ret
        keys = _keys(tut_master)
        assert name not in keys["accepted"] and "tut1" in keys["accepted"], keys
    finally:
        for vm in names:
            with contextlib.suppress(Exception):
                tut_master.salt_run_cli(timeout=300).run("virt.purge", vm)
