"""The virt states through a real minion (hyper1) on a real libvirtd: create, idempotence, exact
test=True previews, live vs restart changes, power states, absent, networks and pools."""
import json
import os
import tempfile

import pytest

import lab


def single(salt_cli, fun, name, *args, test=False):
    cmd = ["state.single", fun, f"name={name}", *args]
    if test:
        cmd.append("test=True")
    ret = salt_cli.run(*cmd, minion_tgt="hyper1")
    assert ret.returncode in (0, 1) and isinstance(ret.data, dict), ret
    (state,) = ret.data.values()
    return state


@pytest.fixture(scope="module")
def boot(guest):
    return "boot=" + json.dumps({"kernel": guest["kernel"], "initrd": guest["initrd"], "cmdline": "console=ttyS0 quiet"})


@pytest.fixture(scope="module")
def image(guest):
    path = tempfile.mkdtemp(prefix="svstate-", dir="/var/tmp")
    os.chmod(path, 0o755)
    dst = os.path.join(path, "base.qcow2")
    with open(guest["qcow2"], "rb") as src, open(dst, "wb") as out:
        out.write(src.read())
    return dst


def test_running_creates_then_is_idempotent_then_converges(salt_cli, hyper1, hv1, boot, image):
    args = ["cpu=1", "mem=128", f"image={image}", "enable_qcow=True", boot]
    preview = single(salt_cli, "virt.running", "st1", *args, test=True)
    assert preview["result"] is None and preview["changes"]["created"]["cpu"] == 1
    assert preview["changes"]["created"]["disks"]["vda"]["overlay"] is True
    assert "st1" not in salt_cli.run("virt.list_domains", minion_tgt="hyper1").data
    created = single(salt_cli, "virt.running", "st1", *args)
    assert created["result"] is True and "created" in created["changes"], created
    assert {k: v for k, v in created["changes"]["created"].items() if k != "uuid"} == preview["changes"]["created"]
    lab.wait_for_text(hv1.path("log", "qemu", "st1-serial.log"), "SALT-MINION-ID: st1")
    again = single(salt_cli, "virt.running", "st1", *args)
    assert again["result"] is True and again["changes"] == {}, again

    bigger = ["cpu=2", "mem=192", f"image={image}", "enable_qcow=True", "enable_vnc=True", boot]
    want = single(salt_cli, "virt.running", "st1", *bigger, test=True)
    assert want["result"] is None
    assert set(want["changes"]) == {"cpu", "mem", "graphics"}
    info = salt_cli.run("virt.vm_info", "st1", minion_tgt="hyper1").data["st1"]
    assert (info["cpu"], info["mem"], info["graphics"]) == (1, 128, None)  # test=True touched nothing
    done = single(salt_cli, "virt.running", "st1", *bigger)
    assert done["result"] is True and done["changes"] == want["changes"], done
    assert "needs a restart" in done["comment"] and "graphics" in done["comment"]
    xml = salt_cli.run("virt.get_xml", "st1", "inactive=True", minion_tgt="hyper1").data
    assert "<graphics type='vnc'" in xml and "<vcpu placement='static'>2</vcpu>" in xml
    assert single(salt_cli, "virt.running", "st1", *bigger)["changes"] == {}


def test_power_states_and_absent(salt_cli, hyper1, boot, image):
    single(salt_cli, "virt.running", "st2", "cpu=1", "mem=128", "disk=none", boot)
    off = single(salt_cli, "virt.powered_off", "st2")
    assert off["result"] is True and off["changes"] == {"state": {"old": "running", "new": "shutoff"}}
    assert single(salt_cli, "virt.powered_off", "st2")["changes"] == {}
    assert single(salt_cli, "virt.stopped", "st2")["changes"] == {}
    rb = single(salt_cli, "virt.rebooted", "st2")
    assert rb["result"] is False and "only a running VM can reboot" in rb["comment"]
    defined = single(salt_cli, "virt.defined", "st2", "cpu=1", "mem=128", "disk=none", boot)
    assert defined["result"] is True and defined["changes"] == {}  # defined never starts it
    gone_preview = single(salt_cli, "virt.absent", "st2", test=True)
    assert gone_preview["result"] is None
    gone = single(salt_cli, "virt.absent", "st2")
    assert gone["result"] is True and gone["changes"]["vm"]["disks"] == "kept"
    assert "st2" not in salt_cli.run("virt.list_domains", minion_tgt="hyper1").data
    assert single(salt_cli, "virt.absent", "st2")["changes"] == {}


def test_absent_with_remove_disks_only_removes_own_files(salt_cli, hyper1, image, boot):
    single(salt_cli, "virt.defined", "st3", "cpu=1", "mem=64", f"image={image}", "enable_qcow=True", "seed=False", boot)
    disk = salt_cli.run("virt.get_disks", "st3", minion_tgt="hyper1").data["vda"]["file"]
    gone = single(salt_cli, "virt.absent", "st3", "remove_disks=True")
    assert gone["changes"]["vm"]["removed"] == [disk]
    assert not os.path.exists(disk) and os.path.exists(image)


def test_bad_arguments_fail_cleanly(salt_cli, hyper1):
    bad = single(salt_cli, "virt.running", "bad/name", "cpu=1", "mem=64")
    assert bad["result"] is False and "invalid VM name" in bad["comment"]
    missing = single(salt_cli, "virt.running", "st4")
    assert missing["result"] is False and "cpu and mem are needed" in missing["comment"]


def test_network_and_pool_states(salt_cli, hyper1, qemu_tmp):
    net = ["forward=none", "ip=10.77.0.1/24", "dhcp_start=10.77.0.10", "dhcp_end=10.77.0.50"]
    preview = single(salt_cli, "virt.network_running", "stnet", *net, test=True)
    assert preview["result"] is None and set(preview["changes"]) == {"defined", "autostart", "started"}
    made = single(salt_cli, "virt.network_running", "stnet", *net)
    assert made["result"] is True and set(made["changes"]) == {"defined", "autostart", "started"}, made
    assert single(salt_cli, "virt.network_running", "stnet", *net)["changes"] == {}
    info = salt_cli.run("virt.network_info", "stnet", minion_tgt="hyper1").data["stnet"]
    assert info["active"] and info["ip"] == "10.77.0.1/24" and info["dhcp"] == ["10.77.0.10", "10.77.0.50"]
    changed = single(salt_cli, "virt.network_defined", "stnet", "forward=none", "ip=10.78.0.1/24")
    assert changed["changes"]["redefined"]["ip"] == {"old": "10.77.0.1/24", "new": "10.78.0.1/24"}
    assert "after a restart" in changed["comment"]
    salt_cli.run("virt.network_undefine", "stnet", minion_tgt="hyper1")

    target = str(qemu_tmp / "pool")
    pool = single(salt_cli, "virt.pool_running", "stpool", f"target={target}")
    assert pool["result"] is True and os.path.isdir(target), pool
    assert single(salt_cli, "virt.pool_running", "stpool", f"target={target}")["changes"] == {}
    assert salt_cli.run("virt.pool_list_volumes", "stpool", minion_tgt="hyper1").data == []
    salt_cli.run("virt.pool_undefine", "stpool", minion_tgt="hyper1")
