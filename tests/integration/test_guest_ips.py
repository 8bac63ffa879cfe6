"""Guest addresses on a real hypervisor, through the session's salt-master and minion ``hyper1`` (hv1):
two busybox guests that take an address by DHCP (``guest.ip=dhcp`` on their kernel command line).

- ``lease``: a guest on a libvirt network with a DHCP range (``virt.network_define`` on hv1); created
  with ``salt-run virt.init ... wait=ip``, which returns with the address libvirt's dnsmasq leased;
  ``virt.vm_info``, ``salt-run virt.query`` and its text output show it labelled ``lease``.
- ``arp``: a guest on hv1's bridge br0 getting its address from the lab fabric's dnsmasq, created with
  ``wait=minion`` (it has no minion: the wait times out, the VM is kept); once hv1 has exchanged a packet
  with it, its address shows from hv1's ARP table, labelled ``arp``. libvirt 9.0's ARP source fails on
  this machine's kernel ("internal error: wrong nlmsg len", libvirt's netlink neighbour parsing, while
  ``ip neigh`` lists the entry): then the VM's ``ips_note`` must name that failure instead.

The busybox guest runs no guest agent: its channel is there (``virt.init`` adds it) and libvirt reports
it ``disconnected``, so the agent is never asked; the agent source is covered by tests/unit/test_guestips.py.
"""

import contextlib
import json
import pathlib
import subprocess
import sys
import time

import pytest

from tests.support import lab

MINION = "hyper1"  # one of the session master's virt:hypervisors (hyper*): every call narrows to it
TAG = lab.new_tag()
NET = f"ips{TAG}"
SUBNET = f"10.254.{int(TAG, 16) % 250 + 1}"  # hv1's own namespace: the fabric is 10.252.0, the master link 10.253


@pytest.fixture(scope="module")
def ipnet(hyper1, salt_cli):
    """An isolated libvirt network with DHCP on hv1 (libvirt's dnsmasq keeps the leases)."""
    ret = salt_cli.run(
        "virt.network_define",
        NET,
        f"bridge=vb{TAG}",
        "forward=none",
        f"ip={SUBNET}.1/24",
        f"dhcp_start={SUBNET}.50",
        f"dhcp_end={SUBNET}.99",
        "autostart=False",
        minion_tgt=MINION,
    )
    assert ret.returncode == 0 and ret.data is True, ret
    yield NET
    salt_cli.run("virt.network_undefine", NET, minion_tgt=MINION)


@pytest.fixture(scope="module")
def vms(salt_cli):
    names = []
    yield names
    for name in names:
        with contextlib.suppress(Exception):
            salt_cli.run("virt.purge", name, minion_tgt=MINION)


def _init(salt_run_cli, name, boot_args, *extra):
    boot = dict(boot_args, cmdline=boot_args["cmdline"] + " guest.ip=dhcp")
    return salt_run_cli.run(
        "virt.init",
        name,
        "1",
        "128",
        f"boot={json.dumps(boot)}",
        f"host={MINION}",
        f"tgt={MINION}",
        "fallback=False",
        *extra,
    )


def _nic(info):
    (mac, nic), *_ = info["nics"].items()
    return mac, nic


def test_lease_address_wait_ip_vm_info_and_query(salt_master, salt_run_cli, salt_cli, ipnet, vms, boot_args):
    name = f"ipsa{TAG}"
    vms.append(name)
    nic = json.dumps([{"name": "eth0", "type": "network", "source": ipnet}])
    t0 = time.monotonic()
    ret = _init(salt_run_cli, name, boot_args, f"interfaces={nic}", "wait=ip", "wait_timeout=180")
    print(f"salt-run virt.init ... wait=ip: {time.monotonic() - t0:.1f} s")
    assert ret.returncode == 0, ret
    wait = ret.data["wait"]
    assert wait["for"] == "ip" and wait["result"] == "ok", wait
    (mac, ips), *_ = wait["ips"].items()
    assert len(ips) == 1 and ips[0]["source"] == "lease" and ips[0]["type"] == "ipv4", ips
    address = ips[0]["address"]
    assert address.startswith(f"{SUBNET}.") and 50 <= int(address.rsplit(".", 1)[1]) <= 99
    assert ips[0]["prefix"] == 24

    # the module on the hypervisor: the same address, by MAC, labelled; the agent channel is there, unused
    info = salt_cli.run("virt.vm_info", name, minion_tgt=MINION).data[name]
    assert info["guest_agent"] == "disconnected"
    assert info["nics"][mac]["ips"] == ips and "ips_note" not in info

    # the runner's fleet query and vm_info, and the text a user reads
    # timeout=30: on a loaded CI machine hyper1 may take more than Salt's 5 s to answer (it is then "down")
    data = salt_run_cli.run("virt.query", f"tgt={MINION}", "timeout=30").data
    assert data[MINION]["vm_info"][name]["nics"][mac]["ips"] == ips
    data = salt_run_cli.run("virt.vm_info", name, f"tgt={MINION}").data
    assert data[MINION]["vm_info"][name]["nics"][mac]["ips"] == ips
    salt_run = str(pathlib.Path(sys.executable).parent / "salt-run")
    text = subprocess.run(
        [salt_run, "-c", str(salt_master.config_dir), "virt.query", f"tgt={MINION}", "timeout=30"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    # a running VM's network NIC names the network's bridge as its source (libvirt's live XML)
    assert f"    NIC - {mac}:\n      Source: vb{TAG}\n      Type: network\n      Model: virtio\n" in text
    assert f"      IP: {address}/24 (lease)\n" in text


def _fabric_lease(fabric, mac, timeout=90):
    """The address the fabric's dnsmasq leased to ``mac`` (its lease file: expiry mac ip host id)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), open(fabric.leases) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[1].lower() == mac:
                    return parts[2]
        time.sleep(0.5)
    raise AssertionError(f"no DHCP lease for {mac} on the fabric within {timeout} s")


def test_wait_minion_times_out_keeps_the_vm_and_arp_shows_its_address(
    salt_run_cli, salt_cli, hyper1, hv1, fabric, vms, boot_args
):
    fabric.dhcp()  # the guest on br0 asks the fabric for its address
    name = f"ipsb{TAG}"
    vms.append(name)
    t0 = time.monotonic()
    ret = _init(salt_run_cli, name, boot_args, "wait=minion", "wait_timeout=8")
    print(f"salt-run virt.init ... wait=minion wait_timeout=8: {time.monotonic() - t0:.1f} s")
    assert ret.returncode == 1, ret  # the wait failed: non-zero exit ...
    wait = ret.data["wait"]
    assert wait["for"] == "minion" and wait["result"] == "timeout" and wait["minion"] == name, wait
    assert wait["message"].startswith(f"minion {name} did not answer test.ping within 8 s (no minion key was seeded")
    assert f"The VM {name} was created on {MINION} and is kept" in wait["message"]
    assert wait["seen"]["state"] == "running"
    # ... and the VM is there, running: a timed-out wait undoes nothing
    assert ret.data["host"] == MINION and "error" not in ret.data
    assert salt_cli.run("virt.vm_state", name, minion_tgt=MINION).data == {name: "running"}

    mac, nic = _nic(salt_cli.run("virt.vm_info", name, minion_tgt=MINION).data[name])
    assert nic["type"] == "bridge"
    address = _fabric_lease(fabric, mac)
    # hv1 has not talked to the guest yet; one datagram makes it resolve (and keep) the guest's MAC
    send = f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ({address!r}, 9))"
    deadline = time.monotonic() + 30
    while mac not in hv1.ns_run(["ip", "neigh", "show", address]).stdout.lower():
        assert time.monotonic() < deadline, hv1.ns_run(["ip", "neigh"]).stdout
        hv1.ns_run(["python3", "-c", send], check=False)
        time.sleep(0.5)
    info = salt_cli.run("virt.vm_info", name, minion_tgt=MINION).data[name]
    ips = [(ip["address"], ip["source"]) for ip in info["nics"][mac]["ips"]]
    if ips:
        assert ips == [(address, "arp")], info
    else:  # libvirt's ARP source itself failed: said, not hidden
        assert info["ips_note"].startswith("arp: "), info
        print(f"libvirt's ARP source: {info['ips_note']}")
