"""The virt states through a real minion (hyper1) on a real libvirtd (hv1, TCG guests): create exactly
what test=True previewed, idempotence, live vs restart changes, NIC source change keeping the MAC,
power states, absent with and without disks, networks and pools, and a whole SLS with state.apply."""

import json
import os
import re
import shutil
import tempfile
import time

import pytest

from tests.support import lab
from tests.support.paths import guest_boot
from tests.support.saltd import SOURCES


def single(salt_cli, fun, name, *args, test=False):
    cmd = ["state.single", fun, f"name={name}", *args] + (["test=True"] if test else [])
    ret = salt_cli.run(*cmd, minion_tgt="hyper1", _timeout=300)
    assert ret.returncode in (0, 1) and isinstance(ret.data, dict), ret
    (state,) = ret.data.values()
    return state


def call(salt_cli, fun, *args):
    ret = salt_cli.run(fun, *args, minion_tgt="hyper1")
    assert ret.returncode == 0, ret
    return ret.data


# a TCG guest boots in seconds on an idle host, minutes on a loaded shared CI machine: a bound, not a speed check
BOOT_WAIT = 300


def console(hv, name):
    return hv.path("log", "qemu", f"{name}-serial.log")


def boots(hv, name):
    with open(console(hv, name), errors="replace") as fh:
        return fh.read().count("GUEST-BOOT-OK")


@pytest.fixture(scope="module")
def boot(guest):
    return "boot=" + json.dumps(guest_boot(guest))


@pytest.fixture(scope="module")
def image(guest, lab_dir):
    """A private copy of the guest image in hyper1's virt:allowed_paths (<lab_dir>/sources)."""
    sources = os.path.join(lab_dir, SOURCES)
    os.makedirs(sources, mode=0o755, exist_ok=True)
    path = tempfile.mkdtemp(prefix="svstate-", dir=sources)
    os.chmod(path, 0o755)
    dst = os.path.join(path, "base.qcow2")
    shutil.copyfile(guest["qcow2"], dst)
    yield dst
    shutil.rmtree(path, ignore_errors=True)


def test_running_creates_the_preview_then_converges_live_and_at_restart(salt_cli, hyper1, hv1, boot, image):
    common = [f"image={image}", "enable_qcow=True", boot]
    args = ["cpu=1", "mem=128"] + common
    preview = single(salt_cli, "virt.running", "st1", *args, test=True)
    assert preview["result"] is None and preview["comment"] == "VM st1 would be created and started"
    created_preview = preview["changes"]["created"]
    assert (created_preview["cpu"], created_preview["mem"], created_preview["started"]) == (1, 128, True)
    assert created_preview["disks"]["vda"]["overlay"] is True and created_preview["nics"] == [
        {"type": "bridge", "source": "br0", "model": "virtio"}
    ]
    assert "st1" not in call(salt_cli, "virt.list_domains")
    created = single(salt_cli, "virt.running", "st1", *args)
    assert created["result"] is True, created
    assert {k: v for k, v in created["changes"]["created"].items() if k != "uuid"} == created_preview
    assert call(salt_cli, "virt.get_disks", "st1")["vda"]["file"] == created_preview["disks"]["vda"]["path"]
    lab.wait_for_text(console(hv1, "st1"), "SALT-MINION-ID: st1", timeout=BOOT_WAIT)
    same = single(salt_cli, "virt.running", "st1", *args)
    assert same["result"] is True and same["changes"] == {} and same["comment"] == "VM st1 is as declared"

    # bigger: cpu/mem above the boot maximum and graphics need a restart; a NIC and a blank disk go live
    nics = json.dumps([{"name": "eth0"}, {"name": "eth1", "type": "bridge", "source": "br0", "model": "e1000"}])
    bigger = ["cpu=2", "mem=192", "enable_vnc=True", f"interfaces={nics}", 'disks=[{"data": {"size": 16}}]'] + common
    want = single(salt_cli, "virt.running", "st1", *bigger, test=True)
    assert want["result"] is None and set(want["changes"]) == {"cpu", "mem", "graphics", "nics", "disks"}, want
    assert "would apply live: NIC on bridge br0 (e1000) added, disk vdb (16 MiB qcow2) added" in want["comment"]
    assert "would need restart: cpu 1 -> 2, mem 128 -> 192 MiB, graphics none -> vnc on 127.0.0.1" in want["comment"]
    info = call(salt_cli, "virt.vm_info", "st1")["st1"]
    # a headless VM's graphics is Salt's mapping of "None" strings (plus ours: no listener, no tunnel, no password)
    headless = dict.fromkeys(("autoport", "keymap", "listen", "port", "type"), "None")
    headless.update(address=None, tunnel=None, password=False)
    assert (info["cpu"], info["mem"], info["graphics"], len(info["nics"]), list(info["disks"])) == (
        1,
        128,
        headless,
        1,
        ["vda"],
    )
    data_disk = want["changes"]["disks"]["added"][0]["path"]
    assert not os.path.exists(data_disk)  # test=True touched nothing

    done = single(salt_cli, "virt.running", "st1", *bigger)
    assert done["result"] is True and done["changes"] == want["changes"], done
    assert "applied live: NIC on bridge br0 (e1000) added, disk vdb (16 MiB qcow2) added" in done["comment"]
    assert re.search(
        r"needs restart: cpu 1 -> 2 \(.*\), mem 128 -> 192 MiB \(.*\), graphics none -> vnc on 127.0.0.1",
        done["comment"],
    )
    live = call(salt_cli, "virt.get_xml", "st1")
    assert "<model type='e1000'/>" in live and "data.qcow2" in live and "<graphics" not in live  # hotplugged
    config = call(salt_cli, "virt.get_xml", "st1", "inactive=True")
    assert "<graphics type='vnc'" in config and "<vcpu placement='static'>2</vcpu>" in config
    again = single(salt_cli, "virt.running", "st1", *bigger)
    assert (
        again["changes"] == {}
        and again["comment"]
        == "VM st1 is as declared; pending restart (defined, not yet in the running VM): cpu, mem, graphics"
    )

    assert single(salt_cli, "virt.powered_off", "st1")["changes"] == {"state": {"old": "running", "new": "shutoff"}}
    restarted = single(salt_cli, "virt.running", "st1", *bigger)
    assert (
        restarted["changes"] == {"state": {"old": "shutoff", "new": "running"}}
        and restarted["comment"] == "VM st1 is as declared; started it"
    )
    info = call(salt_cli, "virt.vm_info", "st1")["st1"]
    assert (info["cpu"], info["mem"], info["graphics"]["type"], len(info["nics"]), sorted(info["disks"])) == (
        2,
        192,
        "vnc",
        2,
        ["vda", "vdb"],
    )
    assert single(salt_cli, "virt.running", "st1", *bigger)["comment"] == "VM st1 is as declared"

    # fewer: disks not named are left as they are (Salt's update), memory goes down live (balloon)
    fewer = ["cpu=2", "mem=160", "enable_vnc=True", f"interfaces={nics}"] + common
    less = single(salt_cli, "virt.running", "st1", *fewer)
    assert less["changes"] == {"mem": {"old": 192, "new": 160}}, less
    assert "applied live: mem 192 -> 160 MiB" in less["comment"] and "vdb" not in less["comment"], less
    assert "pending restart" not in less["comment"], less  # it went live: nothing waits for a restart
    assert os.path.exists(data_disk) and "vdb" in call(salt_cli, "virt.get_disks", "st1")
    gone = single(salt_cli, "virt.absent", "st1", "remove_disks=True")
    assert sorted(gone["changes"]["vm"]["removed"]) == sorted([created_preview["disks"]["vda"]["path"], data_disk])
    assert os.path.exists(image)


def test_nic_source_change_is_live_and_keeps_the_mac(salt_cli, hyper1, boot):
    for net, ip in (("stneta", "10.81.0.1/24"), ("stnetb", "10.82.0.1/24")):
        assert (
            single(salt_cli, "virt.network_running", net, "forward=none", f"ip={ip}", "autostart=False")["result"]
            is True
        )

    def on(net):
        return [
            "cpu=1",
            "mem=96",
            "disk=none",
            "nic=none",
            f'interfaces=[{{"name": "eth0", "type": "network", "source": "{net}"}}]',
            boot,
        ]

    assert single(salt_cli, "virt.running", "st5", *on("stneta"))["result"] is True
    (mac,) = call(salt_cli, "virt.get_macs", "st5")
    moved = single(salt_cli, "virt.running", "st5", *on("stnetb"))
    assert moved["changes"] == {
        "nics": {
            "changed": [
                {
                    "mac": mac,
                    "old": {"type": "network", "source": "stneta", "model": "virtio"},
                    "new": {"type": "network", "source": "stnetb", "model": "virtio"},
                }
            ]
        }
    }
    assert f"applied live: NIC {mac} network stneta (virtio) -> network stnetb (virtio)" in moved["comment"], moved
    assert re.search(
        rf"<mac address='{mac}'/>\s*<source network='stnetb'", call(salt_cli, "virt.get_xml", "st5")
    )  # live, same MAC
    assert single(salt_cli, "virt.running", "st5", *on("stnetb"))["comment"] == "VM st5 is as declared"
    assert single(salt_cli, "virt.absent", "st5")["result"] is True
    for net in ("stneta", "stnetb"):
        call(salt_cli, "virt.network_undefine", net)


def _wait(check, timeout=BOOT_WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def test_power_states_and_absent(salt_cli, hyper1, hv1, boot):
    args = ["cpu=1", "mem=128", "disk=none", boot]
    assert single(salt_cli, "virt.running", "st2", *args)["result"] is True
    lab.wait_for_text(console(hv1, "st2"), "GUEST-BOOT-OK", timeout=BOOT_WAIT)
    # the test guest has no ACPI handler: a graceful shutdown is ignored, and the state says what to do
    ignored = single(salt_cli, "virt.stopped", "st2", "timeout=2")
    assert ignored["result"] is False and ignored["changes"] == {}
    assert "did not shut down within 2s (use virt.powered_off to force it)" in ignored["comment"]
    would = single(salt_cli, "virt.rebooted", "st2", test=True)
    assert would["result"] is None and would["changes"] == {"rebooted": True}
    asked = single(salt_cli, "virt.rebooted", "st2")
    assert (
        asked["result"] is True
        and "asked to reboot (ACPI; a guest that ignores it needs hard: True)" in asked["comment"]
    )
    before = boots(hv1, "st2")
    reset = single(salt_cli, "virt.rebooted", "st2", "hard=True")
    assert reset["result"] is True and reset["changes"] == {"rebooted": True} and reset["comment"] == "VM st2 reset"
    assert _wait(lambda: boots(hv1, "st2") > before)  # it really booted again
    assert single(salt_cli, "virt.powered_off", "st2", test=True)["result"] is None
    assert call(salt_cli, "virt.vm_state", "st2") == {"st2": "running"}
    off = single(salt_cli, "virt.powered_off", "st2")
    assert off["result"] is True and off["changes"] == {"state": {"old": "running", "new": "shutoff"}}
    assert single(salt_cli, "virt.powered_off", "st2")["changes"] == {}
    assert single(salt_cli, "virt.stopped", "st2")["comment"] == "VM st2 is already shutoff"
    rb = single(salt_cli, "virt.rebooted", "st2")
    assert rb["result"] is False and "only a running VM can reboot" in rb["comment"]
    defined = single(salt_cli, "virt.defined", "st2", *args)
    assert defined["result"] is True and defined["changes"] == {}  # defined never starts it
    gone_preview = single(salt_cli, "virt.absent", "st2", test=True)
    assert gone_preview["result"] is None and gone_preview["changes"]["vm"]["disks"] == "kept"
    gone = single(salt_cli, "virt.absent", "st2")
    assert gone["result"] is True and gone["changes"]["vm"] == {"old": "shutoff", "new": "absent", "disks": "kept"}
    assert "st2" not in call(salt_cli, "virt.list_domains")
    assert single(salt_cli, "virt.absent", "st2")["changes"] == {}


def test_absent_keeps_disks_unless_asked_and_then_only_its_own(salt_cli, hyper1, image, boot):
    args = ["cpu=1", "mem=64", f"image={image}", "enable_qcow=True", "seed=False", boot]
    for vm in ("st3", "st3b"):
        assert single(salt_cli, "virt.defined", vm, *args)["result"] is True
    kept_disk = call(salt_cli, "virt.get_disks", "st3")["vda"]["file"]
    kept = single(salt_cli, "virt.absent", "st3")
    assert kept["changes"]["vm"]["disks"] == "kept" and os.path.exists(kept_disk)
    disk = call(salt_cli, "virt.get_disks", "st3b")["vda"]["file"]
    gone = single(salt_cli, "virt.absent", "st3b", "remove_disks=True")
    assert gone["changes"]["vm"]["removed"] == [disk] and not gone["changes"]["vm"]["kept"]
    assert not os.path.exists(disk) and os.path.exists(image) and os.path.exists(kept_disk)
    shutil.rmtree(os.path.dirname(kept_disk))  # the test's own cleanup of what absent kept


def test_bad_arguments_fail_cleanly(salt_cli, hyper1):
    bad = single(salt_cli, "virt.running", "bad_name!", "cpu=1", "mem=64")
    assert bad["result"] is False and "invalid VM name" in bad["comment"]
    missing = single(salt_cli, "virt.running", "st4")
    assert missing["result"] is False and "cpu and mem are needed" in missing["comment"]
    typo = single(salt_cli, "virt.defined", "st4", "cpu=1", "mem=64", "enable_vcn=True")
    assert typo["result"] is False and "unknown argument(s) enable_vcn" in typo["comment"]
    assert "st4" not in call(salt_cli, "virt.list_domains")


def test_network_and_pool_states(salt_cli, hyper1, qemu_tmp):
    net = ["forward=none", "ip=10.77.0.1/24", "dhcp_start=10.77.0.10", "dhcp_end=10.77.0.50"]
    preview = single(salt_cli, "virt.network_running", "stnet", *net, test=True)
    assert preview["result"] is None and set(preview["changes"]) == {"defined", "autostart", "started"}
    assert "stnet" not in call(salt_cli, "virt.list_networks")
    made = single(salt_cli, "virt.network_running", "stnet", *net)
    assert made["result"] is True and made["changes"] == preview["changes"], made
    assert single(salt_cli, "virt.network_running", "stnet", *net)["changes"] == {}
    info = call(salt_cli, "virt.network_info", "stnet")["stnet"]
    assert (
        info["active"]
        and info["autostart"]
        and info["ip"] == "10.77.0.1/24"
        and info["dhcp"] == ["10.77.0.10", "10.77.0.50"]
    )
    moved = ["forward=nat", "ip=10.78.0.1", "netmask=255.255.255.0"]
    changed = single(salt_cli, "virt.network_running", "stnet", *moved)
    assert changed["changes"]["redefined"]["ip"] == {"old": "10.77.0.1/24", "new": "10.78.0.1/24"}
    assert "uses the new definition after a restart" in changed["comment"]
    assert single(salt_cli, "virt.network_running", "stnet", *moved)["changes"] == {}  # the definition is compared
    assert call(salt_cli, "virt.network_info", "stnet")["stnet"]["ip"] == "10.77.0.1/24"  # running: until restarted
    call(salt_cli, "virt.network_stop", "stnet")
    assert single(salt_cli, "virt.network_running", "stnet", *moved)["changes"] == {"started": True}
    assert call(salt_cli, "virt.network_info", "stnet")["stnet"]["ip"] == "10.78.0.1/24"
    call(salt_cli, "virt.network_undefine", "stnet")

    target = str(qemu_tmp / "pool")
    pool = single(salt_cli, "virt.pool_running", "stpool", f"target={target}", "autostart=False")
    assert pool["result"] is True and set(pool["changes"]) == {"defined", "started"}
    defined = pool["changes"]["defined"]
    assert (defined["name"], defined["type"], defined["target"]) == ("stpool", "dir", target)
    assert os.path.isdir(target)
    assert single(salt_cli, "virt.pool_running", "stpool", f"target={target}", "autostart=False")["changes"] == {}
    with open(os.path.join(target, "vol1.qcow2"), "w") as fh:
        fh.write("x")
    assert call(salt_cli, "virt.pool_list_volumes", "stpool") == ["vol1.qcow2"]
    call(salt_cli, "virt.pool_undefine", "stpool")
    assert os.path.exists(os.path.join(target, "vol1.qcow2"))  # undefining a pool never deletes its files


def test_state_apply_of_a_whole_sls(salt_cli, hyper1, state_tree, guest, qemu_tmp):
    boot = guest_boot(guest)
    sls = {
        "svlan": {"virt.network_running": [{"forward": "none"}, {"ip": "10.79.0.1/24"}, {"autostart": False}]},
        "svpool": {"virt.pool_running": [{"target": str(qemu_tmp / "svpool")}, {"autostart": False}]},
        "sv6": {
            "virt.running": [
                {"cpu": 1},
                {"mem": 96},
                {"disk": "none"},
                {"nic": "none"},
                {"interfaces": [{"name": "eth0", "type": "network", "source": "svlan"}]},
                {"boot": boot},
                {"require": [{"virt": "svlan"}]},
            ]
        },
        "sv7": {
            "virt.defined": [
                {"cpu": 1},
                {"mem": 64},
                {"disk": "none"},
                {"nic": "none"},
                {"disks": [{"data": {"size": 8}}]},
            ]
        },
    }
    (state_tree / "svstates.sls").write_text(json.dumps(sls))  # JSON is YAML

    def apply(test=False):
        ret = salt_cli.run(
            "state.apply", "svstates", *(["test=True"] if test else []), minion_tgt="hyper1", _timeout=300
        )
        assert isinstance(ret.data, dict), ret
        return {v["__id__"]: v for v in ret.data.values()}

    preview = apply(test=True)
    assert {k: v["result"] for k, v in preview.items()} == {"svlan": None, "svpool": None, "sv6": None, "sv7": None}
    assert not {"sv6", "sv7"} & set(call(salt_cli, "virt.list_domains")) and "svlan" not in call(
        salt_cli, "virt.list_networks"
    )
    done = apply()
    assert all(v["result"] is True for v in done.values()), {k: v["comment"] for k, v in done.items()}
    assert {k: v["changes"] for k, v in done.items() if k not in {"sv6", "sv7"}} == {
        k: preview[k]["changes"] for k in ("svlan", "svpool")
    }
    assert call(salt_cli, "virt.vm_state", "sv6") == {"sv6": "running"} and call(salt_cli, "virt.vm_state", "sv7") == {
        "sv7": "shutoff"
    }
    again = apply()
    assert {k: v["changes"] for k, v in again.items()} == {"svlan": {}, "svpool": {}, "sv6": {}, "sv7": {}}
    assert {k: v["result"] for k, v in apply(test=True).items()} == {
        "svlan": True,
        "svpool": True,
        "sv6": True,
        "sv7": True,
    }
    for vm in ("sv6", "sv7"):
        assert single(salt_cli, "virt.absent", vm, "remove_disks=True")["result"] is True
    call(salt_cli, "virt.network_undefine", "svlan")
    call(salt_cli, "virt.pool_undefine", "svpool")
