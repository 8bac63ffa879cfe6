"""saltvirt.vm.converge and the VM states: the desired spec is virt.init's own, the diff, what goes live
vs at the next restart, applying it (libvirt's test driver and real qemu-img), and the virt.running /
defined / stopped / powered_off / rebooted / absent states through Salt's real state loader."""

import json
import os
import pathlib
import subprocess
import xml.etree.ElementTree as ET

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.base import switches
from saltvirt.host.conn import libvirt
from saltvirt.model import vmargs
from saltvirt.vm import converge
from saltvirt.xml.domain import definition
from tests.support.saltloader import load_states, make_minion_mods

NET = [{"name": "eth0", "type": "network", "source": "default"}]  # test driver: no host bridge needed
TWO_NICS = NET + [{"name": "eth1", "type": "network", "source": "default", "model": "e1000"}]


def spec_of(cpu=1, mem=128, **kw):
    kw.setdefault("nic", None)
    kw.setdefault("interfaces", NET)
    kw.setdefault("disk", None)
    host = {k: kw.pop(k) for k in ("image", "vtype", "image_format", "allowed_paths") if k in kw}
    return converge.desired_spec(vmargs.InitRequest("vm1", cpu, mem, **kw), images_dir="/srv/img", profiles={}, **host)


def facts_of(spec, live=False):
    """What converge.current() reads back for a domain defined from ``spec`` (MACs as libvirt adds)."""
    for i, nic in enumerate(spec.nics):
        nic.mac = nic.mac or f"52:54:00:00:00:{i:02x}"
    facts = definition.parse_for_compare(definition.build(spec))
    for nic in spec.nics:
        nic.mac = None
    return {"config": facts, "live": facts if live else None}


# desired spec ---------------------------------------------------------------------------------------
def test_desired_spec_is_what_init_builds(virt_test, guest, tmp_path):
    """One source of truth: a VM virt.init just created shows no difference to the same arguments."""
    args = {
        "nic": None,
        "interfaces": TWO_NICS,
        "disks": [{"data": {"size": 16}}],
        "enable_vnc": True,
        "enable_qcow": True,
    }
    made = virt_test["virt.init"]("conv1", 2, 96, image=guest["qcow2"], seed=False, start=False, **args)
    assert made["state"] == "shutoff"
    same = virt_test["virt.update"]("conv1", cpu=2, mem=96, image=guest["qcow2"], disk="default", **args)
    assert same["changes"] == {} and same["applied"] is None
    virt_test["virt.purge"]("conv1")


def test_update_rejects_creation_only_arguments(virt_test):
    virt_test["virt.init"]("conv2", 1, 64, nic=None, disk=None, start=False)
    with pytest.raises(SaltInvocationError, match="cannot update seed"):
        virt_test["virt.update"]("conv2", seed=False)


def test_preview_lists_what_init_will_create():
    got = converge.preview(
        vmargs.InitRequest("web1", 2, 512, image="salt://img/web.qcow2", nic=None, interfaces=NET),
        images_dir="/srv/img",
        profiles={},
        image_format=None,
    )
    assert got["disks"]["vda"] == {
        "name": "system",
        "path": "/srv/img/web1/system.<image format>",
        "format": "as the image",
        "size": None,
        "overlay": False,
        "image": "salt://img/web.qcow2",
    }
    overlay = converge.preview(
        vmargs.InitRequest("web1", 2, 512, image="salt://x", enable_qcow=True, enable_vnc=True),
        images_dir="/srv/img",
        profiles={},
    )
    assert (
        overlay["disks"]["vda"]["path"] == "/srv/img/web1/system.qcow2" and overlay["disks"]["vda"]["overlay"] is True
    )
    assert overlay["nics"] == [{"type": "bridge", "source": "br0", "model": "virtio"}]  # virt.init's default profile
    assert overlay["graphics"] == {"type": "vnc", "listen": "127.0.0.1", "port": -1, "password": False}
    assert (
        "ha" not in overlay
        and converge.preview(vmargs.InitRequest("w", 1, 64, ha=True), images_dir="/i", profiles={})["ha"] is True
    )
    with pytest.raises(SaltInvocationError, match="invalid VM name"):
        converge.preview(vmargs.InitRequest("bad/name", 1, 64), images_dir="/srv/img", profiles={})


# diff -------------------------------------------------------------------------------------------------
def test_no_difference_to_itself():
    spec = spec_of(
        2, 256, interfaces=TWO_NICS, disks=[{"data": {"size": 10}}], graphics={"type": "vnc", "password": "s3cret"}
    )
    assert converge.diff(spec, facts_of(spec)) == {}


def test_cpu_mem_graphics_differences():
    have = facts_of(spec_of(1, 128))
    changes = converge.diff(spec_of(2, 256, enable_vnc=True), have)
    assert changes["cpu"] == {"old": 1, "new": 2} and changes["mem"] == {"old": 128, "new": 256}
    assert changes["graphics"] == {
        "old": None,
        "new": {"type": "vnc", "listen": "127.0.0.1", "port": -1, "password": False},
    }
    have["config"]["vcpu_current"], have["config"]["current_mem"] = 1, 64  # max 2 vCPUs / 128 MiB, less in use
    have["config"]["cpu"] = 2
    changes = converge.diff(spec_of(2, 128), have)
    assert changes == {"cpu": {"old": "1 (maximum 2)", "new": 2}, "mem": {"old": "64 (maximum 128)", "new": 128}}


def test_graphics_password_change_never_shows_the_password():
    have = facts_of(spec_of(graphics={"type": "vnc", "password": "old-secret"}))
    changes = converge.diff(spec_of(graphics={"type": "vnc", "password": "new-secret"}), have)
    assert changes["graphics"]["password"] == "changed"
    assert "secret" not in json.dumps(changes) and "secret" not in json.dumps(converge.steps(changes))


def test_nic_added_removed_changed():
    have = facts_of(spec_of(interfaces=TWO_NICS))
    changed = converge.diff(spec_of(interfaces=[NET[0], dict(TWO_NICS[1], model="virtio")]), have)
    assert changed == {
        "nics": {
            "changed": [
                {
                    "mac": "52:54:00:00:00:01",
                    "old": {"type": "network", "source": "default", "model": "e1000"},
                    "new": {"type": "network", "source": "default", "model": "virtio"},
                }
            ]
        }
    }
    fewer = converge.diff(spec_of(interfaces=NET), have)
    assert fewer == {
        "nics": {"removed": [{"type": "network", "source": "default", "model": "e1000", "mac": "52:54:00:00:00:01"}]}
    }
    more = converge.diff(spec_of(interfaces=TWO_NICS + [{"name": "eth2", "type": "direct", "source": "eno1"}]), have)
    assert more == {"nics": {"added": [{"type": "direct", "source": "eno1", "model": "virtio"}]}}
    pinned = converge.diff(spec_of(interfaces=[dict(NET[0], mac="52:54:00:AA:00:01"), TWO_NICS[1]]), have)
    assert pinned["nics"]["added"] == [
        {"type": "network", "source": "default", "model": "virtio", "mac": "52:54:00:aa:00:01"}
    ]
    assert pinned["nics"]["removed"][0]["mac"] == "52:54:00:00:00:00"


def test_disks_are_added_blank_and_never_removed():
    have = facts_of(spec_of(disks=[{"system": {"size": 100}}, {"data": {"size": 10}}]))
    changes = converge.diff(spec_of(disks=[{"system": {"size": 100}}, {"logs": {"size": 5, "target": "vdc"}}]), have)
    assert changes["disks"]["not_in_spec"] == ["vdb"]
    assert [(d["name"], d["target"], d["size"]) for d in changes["disks"]["added"]] == [("logs", "vdc", 5)]
    only_report = converge.diff(spec_of(disks=[{"system": {"size": 100}}]), have)
    assert only_report == {"disks": {"not_in_spec": ["vdb"]}} and converge.actionable(only_report) == {}
    with pytest.raises(SaltInvocationError, match="only happens when the VM is created"):
        converge.diff(spec_of(image="/srv/base.qcow2", disk="default"), facts_of(spec_of()))


def test_fields_not_managed_are_not_compared():
    have = facts_of(spec_of(2, 256, interfaces=TWO_NICS, enable_vnc=True))
    assert set(converge.diff(spec_of(1, 64, interfaces=[]), have, manage=("graphics",))) == {"graphics"}
    assert converge.diff(spec_of(1, 64, interfaces=[]), have, manage=()) == {}


# plan: live or restart ----------------------------------------------------------------------------
def test_plan_says_what_goes_live_and_what_needs_a_restart():
    running = facts_of(spec_of(2, 256, interfaces=TWO_NICS), live=True)
    changes = converge.diff(
        spec_of(
            4,
            128,
            enable_vnc=True,
            interfaces=[dict(NET[0], source="other"), dict(TWO_NICS[1], model="rtl8139")],
            disks=[{"data": {"size": 1}}],
        ),
        running,
    )
    plan = converge.plan(changes, running)
    assert plan["definition"] == []
    assert any(p.startswith("mem 256 -> 128") for p in plan["live"])  # down: balloon
    assert any(p.startswith("cpu 2 -> 4") for p in plan["restart"])  # above the boot maximum
    assert any("graphics" in p for p in plan["restart"])
    assert any("network default (virtio) -> network other (virtio)" in p for p in plan["live"])  # source: live
    assert any("(e1000) -> network default (rtl8139)" in p for p in plan["restart"])  # model: restart
    assert any(p.startswith("disk vda") for p in plan["live"])  # hotplug
    stopped = facts_of(spec_of(2, 256, interfaces=TWO_NICS))
    assert converge.plan(changes, stopped)["live"] == [] and len(converge.plan(changes, stopped)["definition"]) == 6


def test_pending_restart_compares_definition_and_running_vm():
    cfg, live = facts_of(spec_of(2, 256, enable_vnc=True))["config"], facts_of(spec_of(1, 128))["config"]
    assert converge.pending_restart({"config": cfg, "live": live}) == ["cpu", "mem", "graphics"]
    assert converge.pending_restart({"config": cfg, "live": cfg}) == []
    assert converge.pending_restart({"config": cfg, "live": None}) == []


# applying on libvirt's test driver -----------------------------------------------------------------
def test_update_applies_to_the_definition_then_has_nothing_left(virt_test, tmp_path):
    v = virt_test
    v["virt.init"]("conv3", 1, 64, nic=None, interfaces=NET, disk=None, start=False)
    want = {"nic": None, "interfaces": TWO_NICS, "disk": None, "disks": [{"data": {"size": 8}}], "enable_vnc": True}
    preview = v["virt.update"]("conv3", cpu=2, mem=128, test=True, **want)
    assert set(preview["changes"]) == {"cpu", "mem", "nics", "disks", "graphics"}
    assert v["virt.vm_info"]("conv3")["conv3"]["cpu"] == 1 and preview["applied"] is None  # test: nothing done
    data = preview["changes"]["disks"]["added"][0]["path"]
    assert not os.path.exists(data)
    done = v["virt.update"]("conv3", cpu=2, mem=128, **want)
    assert done["changes"] == preview["changes"] and done["applied"]["definition"] == preview["plan"]["definition"]
    info = v["virt.vm_info"]("conv3")["conv3"]
    assert (info["cpu"], info["mem"], info["graphics"]["type"], len(info["nics"])) == (2, 128, "vnc", 2)
    assert info["disks"]["vda"]["file"] == data
    out = subprocess.run(["qemu-img", "info", "--output=json", data], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["virtual-size"] == 8 * 1048576
    manifest = json.loads(pathlib.Path(os.path.join(os.path.dirname(data), ".salt-virt.json")).read_text())
    assert data in manifest["files"] and manifest["uuid"] == info["uuid"]  # purge may remove it later
    assert v["virt.update"]("conv3", cpu=2, mem=128, **want)["changes"] == {}
    fewer = v["virt.update"]("conv3", disks=[], disk=None, interfaces=NET, nic=None)
    assert fewer["changes"]["disks"] == {"not_in_spec": ["vda"]}
    assert [(n["source"], n["model"]) for n in fewer["changes"]["nics"]["removed"]] == [("default", "e1000")]
    assert os.path.exists(data) and "vda" in v["virt.get_disks"]("conv3")  # never removed
    assert len(v["virt.get_nics"]("conv3")) == 1
    assert v["virt.purge"]("conv3")["removed"] == [data]


def test_a_file_the_vm_does_not_own_is_never_taken_over(virt_test):
    v = virt_test
    v["virt.init"]("conv4", 1, 64, nic=None, disk=None, start=False)
    vm_dir = os.path.join(v.opts["virt"]["images"], "conv4")
    os.makedirs(vm_dir, exist_ok=True)
    foreign = os.path.join(vm_dir, "data.qcow2")
    with open(foreign, "w") as fh:
        fh.write("not yours")
    with pytest.raises(SaltInvocationError, match="refusing to take it over"):
        v["virt.update"]("conv4", disk=None, disks=[{"data": {"size": 8}}])
    assert pathlib.Path(foreign).read_text() == "not yours" and v["virt.get_disks"]("conv4") == {}
    attached = v["virt.update"]("conv4", disk=None, disks=[{"data": {"path": foreign}}])  # explicitly attached: fine
    assert attached["changes"]["disks"]["added"][0]["attach"] is True
    assert v["virt.get_disks"]("conv4")["vda"]["file"] == foreign
    assert v["virt.purge"]("conv4")["removed"] == [] and pathlib.Path(foreign).read_text() == "not yours"


def test_running_vm_reports_what_needs_a_restart(virt_test):
    v = virt_test
    v["virt.init"]("conv5", 1, 64, nic=None, interfaces=NET, disk=None, start=True)
    done = v["virt.update"]("conv5", cpu=2, mem=32, nic=None, interfaces=TWO_NICS)
    assert [x.split(" (")[0] for x in done["applied"]["live"]] == ["mem 64 -> 32 MiB"]
    restart = " | ".join(done["applied"]["restart"])
    assert "cpu 1 -> 2 (" in restart and "NIC on network default (e1000) added (" in restart  # libvirt's reason
    # mem went live: the running VM has 32 MiB (its maximum stays 64 until a restart), nothing pending
    assert done["pending_restart"] == ["cpu", "nics"]
    again = v["virt.update"]("conv5", cpu=2, mem=32, nic=None, interfaces=TWO_NICS)
    assert again["changes"] == {} and again["pending_restart"] == ["cpu", "nics"]
    raised = v["virt.update"]("conv5", mem=96)  # above the running VM's maximum: at the restart
    assert raised["applied"]["restart"] and raised["pending_restart"] == ["cpu", "mem", "nics"]


def test_pending_restart_is_what_the_running_vm_lacks():
    """Lowered live (current = the new value, the boot maximum still the old one): not pending; a current
    value that did not go live (the guest ignored the balloon) or a raised maximum: pending."""
    cfg = facts_of(spec_of(1, 64))["config"]
    lowered = dict(cfg, cpu=2, vcpu_current=1, mem=128, current_mem=64)  # started with 2 / 128, lowered live
    assert converge.pending_restart({"config": cfg, "live": lowered}) == []
    assert converge.pending_restart({"config": cfg, "live": dict(lowered, current_mem=128)}) == ["mem"]
    assert converge.pending_restart({"config": cfg, "live": dict(lowered, vcpu_current=2)}) == ["cpu"]
    assert converge.pending_restart({"config": lowered, "live": cfg}) == ["cpu", "mem"]


# the states through Salt's state loader (test driver) ----------------------------------------------
@pytest.fixture
def states(virt_test):
    return lambda test=False: load_states(virt_test, test)


def test_running_creates_exactly_the_preview_then_is_idempotent(states, virt_test, guest):
    args = {
        "cpu": 1,
        "mem": 64,
        "image": guest["qcow2"],
        "enable_qcow": True,
        "seed": False,
        "nic": None,
        "interfaces": NET,
    }
    preview = states(test=True)["virt.running"]("conv6", **args)
    assert preview["result"] is None and preview["comment"] == "VM conv6 would be created and started"
    assert "conv6" not in virt_test["virt.list_domains"]()
    st = states()
    made = st["virt.running"]("conv6", **args)
    assert made["result"] is True, made
    assert {k: v for k, v in made["changes"]["created"].items() if k != "uuid"} == preview["changes"]["created"]
    disk = made["changes"]["created"]["disks"]["vda"]
    assert virt_test["virt.get_disks"]("conv6")["vda"]["file"] == disk["path"] and disk["format"] == "qcow2"
    assert st["virt.running"]("conv6", **args) == {
        "name": "conv6",
        "result": True,
        "changes": {},
        "comment": "VM conv6 is as declared",
    }
    bigger = dict(args, mem=32, interfaces=TWO_NICS)
    would = states(test=True)["virt.running"]("conv6", **bigger)
    assert would["result"] is None and set(would["changes"]) == {"mem", "nics"}
    assert "would apply live: mem 64 -> 32 MiB" in would["comment"]
    assert virt_test["virt.vm_info"]("conv6")["conv6"]["mem"] == 64
    done = st["virt.running"]("conv6", **bigger)
    assert done["changes"] == would["changes"] and "applied live: mem 64 -> 32 MiB" in done["comment"]
    assert "needs restart: NIC on network default (e1000) added" in done["comment"]
    again = st["virt.running"]("conv6", **bigger)
    assert again["changes"] == {} and "pending restart (defined, not yet in the running VM): nics" in again["comment"]
    assert st["virt.absent"]("conv6", remove_disks=True)["changes"]["vm"]["removed"] == [disk["path"]]


def test_defined_converges_declared_features_of_an_existing_vm(states, virt_test):
    """The states pass the domain features they declare to virt.update (a vTPM and a clock here):
    applied to the definition, then idempotent; features they do not declare are left alone."""
    base = {"cpu": 1, "mem": 64, "seed": False, "nic": None, "disk": None}
    st = states()
    assert st["virt.defined"]("conv8", **base)["result"] is True
    declared = dict(base, tpm=True, clock={"utc": False})
    would = states(test=True)["virt.defined"]("conv8", **declared)
    assert would["result"] is None and set(would["changes"]) == {"tpm", "clock"}, would
    done = st["virt.defined"]("conv8", **declared)
    assert done["result"] is True and done["changes"] == would["changes"], done
    xml = virt_test["virt.get_xml"]("conv8")
    assert "<tpm model='tpm-crb'>" in xml and "<clock offset='localtime'" in xml
    assert st["virt.defined"]("conv8", **declared)["changes"] == {}
    assert st["virt.defined"]("conv8", **base)["changes"] == {}  # not declared: the vTPM stays
    assert "<tpm model='tpm-crb'>" in virt_test["virt.get_xml"]("conv8")
    assert st["virt.absent"]("conv8")["result"] is True


def test_defined_does_not_start_and_running_starts(states, virt_test):
    st = states()
    args = {"cpu": 1, "mem": 64, "nic": None, "disk": None}
    made = st["virt.defined"]("conv7", **args)
    assert made["changes"]["created"]["started"] is False and virt_test["virt.vm_state"]("conv7") == {
        "conv7": "shutoff"
    }
    assert st["virt.defined"]("conv7", **args)["changes"] == {}
    changed = st["virt.defined"]("conv7", **dict(args, cpu=2))
    assert "applied to the definition (takes effect when the VM starts): cpu 1 -> 2" in changed["comment"]
    would = states(test=True)["virt.running"]("conv7", **dict(args, cpu=2))
    assert would["changes"] == {"state": {"old": "shutoff", "new": "running"}} and would["result"] is None
    started = st["virt.running"]("conv7", **dict(args, cpu=2))
    assert started["changes"] == {"state": {"old": "shutoff", "new": "running"}} and "started it" in started["comment"]
    virt_test["virt.pause"]("conv7")
    resumed = st["virt.running"]("conv7", **dict(args, cpu=2))
    assert resumed["changes"] == {"state": {"old": "paused", "new": "running"}}


def test_power_states_and_absent(states, virt_test):
    st, preview = states(), states(test=True)
    virt_test["virt.init"]("conv8", 1, 64, nic=None, disk=None, start=True)
    assert preview["virt.stopped"]("conv8")["changes"] == {"state": {"old": "running", "new": "shutoff"}}
    assert virt_test["virt.vm_state"]("conv8") == {"conv8": "running"}
    assert st["virt.stopped"]("conv8")["changes"] == {
        "state": {"old": "running", "new": "shutoff"}
    }  # test driver: ACPI obeyed
    assert st["virt.stopped"]("conv8") == {
        "name": "conv8",
        "result": True,
        "changes": {},
        "comment": "VM conv8 is already shutoff",
    }
    assert st["virt.rebooted"]("conv8")["result"] is False
    virt_test["virt.start"]("conv8")
    assert preview["virt.rebooted"]("conv8")["result"] is None
    assert st["virt.rebooted"]("conv8")["changes"] == {"rebooted": True}
    assert st["virt.powered_off"]("conv8")["changes"] == {"state": {"old": "running", "new": "shutoff"}}
    assert st["virt.powered_off"]("conv8")["changes"] == {}
    assert preview["virt.absent"]("conv8")["result"] is None and "conv8" in virt_test["virt.list_domains"]()
    assert st["virt.absent"]("conv8")["changes"]["vm"] == {"old": "shutoff", "new": "absent", "disks": "kept"}
    assert st["virt.absent"]("conv8") == {
        "name": "conv8",
        "result": True,
        "changes": {},
        "comment": "VM conv8 is not defined",
    }
    assert st["virt.powered_off"]("conv8")["result"] is False


def test_bad_input_fails_the_state_with_a_reason(states):
    st = states()
    assert "cpu and mem are needed" in st["virt.running"]("conv9")["comment"]
    assert "unknown argument(s) imgae" in st["virt.running"]("conv9", cpu=1, mem=64, imgae="/x")["comment"]
    assert "invalid VM name" in st["virt.running"]("bad name", cpu=1, mem=64)["comment"]
    assert "virt.defined does not" in st["virt.running"]("conv9", cpu=1, mem=64, start=False)["comment"]
    missing = states(test=True)["virt.running"]("conv9", cpu=1, mem=64, image="/nonexistent/base.qcow2")
    assert missing["result"] is False and "/nonexistent/base.qcow2" in missing["comment"]


def test_no_password_given_keeps_the_vms_own():
    """virt.init generates a console password; a state that names none must not remove it."""
    have = facts_of(spec_of(graphics={"type": "vnc", "password": "genpass1"}))
    assert converge.diff(spec_of(enable_vnc=True), have) == {}
    moved = converge.diff(spec_of(graphics={"type": "vnc", "listen": "127.0.0.2"}), have)
    assert moved["graphics"]["new"]["password"] is True  # listen changes, the password stays


# firmware, boot order, on_reboot, extra serials/consoles, vTPM (issue #15) ----------------------------
FEATURES = {
    "boot": {"efi": True},
    "boot_dev": "network hd",
    "stop_on_reboot": True,
    "serials": [{"type": "tcp", "port": 4555, "protocol": "raw"}],
    "consoles": [{"type": "pty"}],
    "tpm": True,
    "watchdog": "i6300esb",
    "rng": True,
    "clock": {"utc": False, "timers": {"rtc": {"track": "wall"}}},
    "hypervisor_features": {"kvm-hidden": True},
    "numatune": {"memory": {"mode": "interleave", "nodeset": "0"}},
}


def test_update_applies_firmware_chardevs_tpm_to_the_definition(virt_test, tmp_path):
    v = make_minion_mods(tmp_path / "tcp", "test:///default", serial_tcp_ports="4555")  # the TCP serial port
    v["virt.init"]("conv5", 1, 64, nic=None, disk=None, start=False)
    preview = v["virt.update"]("conv5", test=True, **FEATURES)
    assert set(preview["changes"]) == set(definition.FEATURES) - {
        "kernel_boot",  # boot names no kernel/initrd/cmdline: that part is left alone
        "cpu_model",
        "memtune",
        "vcpu",
        "cputune",
        "max_mem",
        "memory_backing",
        "host_devices",  # test:///default has no PCI/USB devices: test_host_devices_are_looked_up_...
    }
    assert preview["changes"]["tpm"] == {"old": None, "new": {"model": "tpm-crb", "version": "2.0"}}
    assert definition.feature_facts(v["virt.get_xml"]("conv5"))["tpm"] is None  # test=True: nothing done
    done = v["virt.update"]("conv5", **FEATURES)
    assert done["changes"] == preview["changes"] and len(done["applied"]["definition"]) == 11
    facts = definition.feature_facts(v["virt.get_xml"]("conv5"))
    assert facts["firmware"] == {"efi": True, "loader": None, "nvram": None, "secure_boot": False}
    assert facts["boot_dev"] == ["network", "hd"] and facts["stop_on_reboot"] is True
    assert facts["serials"] == [{"type": "tcp", "host": "127.0.0.1", "port": 4555, "protocol": "raw"}]
    assert facts["consoles"] == [{"type": "pty"}] and facts["tpm"] == {"model": "tpm-crb", "version": "2.0"}
    assert facts["watchdog"] == {"model": "i6300esb", "action": "reset"} and facts["rng"] is True
    assert v["virt.update"]("conv5", **FEATURES)["changes"] == {}  # converged
    # only what is given is managed: the serial console (port 0) and its log stay
    assert definition.parse(v["virt.get_xml"]("conv5"))["serial_log"].endswith("conv5-serial.log")
    assert facts["clock"] == {"offset": "localtime", "timers": [{"name": "rtc", "track": "wall"}]}
    assert facts["hypervisor_features"] == {"kvm-hidden": True}
    back = v["virt.update"](
        "conv5",
        boot={},
        boot_dev="hd",
        tpm=False,
        watchdog=False,
        rng=False,
        serials=[],
        consoles=[],
        stop_on_reboot=False,
        clock={},
        hypervisor_features={"kvm-hidden": False},
        numatune={"memory": {"mode": "strict", "nodeset": "0"}},
    )
    assert set(back["changes"]) == set(preview["changes"])
    facts = definition.feature_facts(v["virt.get_xml"]("conv5"))
    assert facts["tpm"] is None and facts["serials"] == [] and facts["firmware"]["efi"] is False
    assert facts["watchdog"] is None and facts["rng"] is None
    v["virt.undefine"]("conv5")


def test_update_applies_salts_cpu_and_mem_dicts(virt_test):
    v = virt_test
    v["virt.init"]("conv8", 1, 64, nic=None, disk=None, start=False)
    cpu = {"maximum": 2, "model": "qemu64", "topology": {"sockets": 1, "cores": 2, "threads": 1}}
    mem = {"boot": "128m", "hard_limit": "1g"}
    done = v["virt.update"]("conv8", cpu=cpu, mem=mem)
    assert {"cpu", "mem", "cpu_model", "memtune"} <= set(done["changes"])
    facts = definition.feature_facts(v["virt.get_xml"]("conv8"))
    assert facts["cpu_model"]["topology"] == {"sockets": 1, "cores": 2, "threads": 1}
    assert facts["cpu_model"]["model"] == {"name": "qemu64"} and facts["memtune"] == {"hard_limit": 1024}
    info = v["virt.vm_info"]("conv8")["conv8"]
    assert (info["cpu"], info["mem"]) == (2, 128)
    assert v["virt.update"]("conv8", cpu=cpu, mem=mem)["changes"] == {}
    assert v["virt.update"]("conv8", cpu=2, mem=128)["changes"] == {}  # plain numbers leave the details alone
    v["virt.undefine"]("conv8")


def test_update_applies_cpu_tuning_numa_current_and_cpuset(virt_test):
    v = virt_test
    v["virt.init"]("conv9", 1, 64, nic=None, disk=None, start=False)
    cpu = {
        "maximum": 4,
        "current": 2,
        "cpuset": "0-3",
        "tuning": {"vcpupin": {0: "0", 1: "1-2,^2"}, "emulatorpin": "0-1", "shares": 512},
        "numa": {0: {"cpus": "0-1", "memory": "64m"}, 1: {"cpus": "2-3", "memory": 64}},
    }
    preview = v["virt.update"]("conv9", cpu=cpu, mem=128, test=True)
    assert preview["changes"]["cpu"] == {"old": 1, "new": "2 (maximum 4)", "current": 2}
    done = v["virt.update"]("conv9", cpu=cpu, mem=128)
    assert set(done["changes"]) == set(preview["changes"]) == {"cpu", "mem", "cpu_model", "vcpu", "cputune"}
    xml = v["virt.get_xml"]("conv9")
    facts = definition.feature_facts(xml)
    assert facts["vcpu"] == {"placement": "static", "cpuset": "0-3"}
    assert facts["cputune"] == {"shares": 512, "vcpupin": {0: "0", 1: "1"}, "emulatorpin": "0-1"}
    assert [c["cpus"] for c in facts["cpu_model"]["numa"]] == ["0-1", "2-3"]
    root = ET.fromstring(xml)
    assert (root.find("vcpu").text, root.find("vcpu").get("current")) == ("4", "2")
    assert v["virt.update"]("conv9", cpu=cpu, mem=128)["changes"] == {}  # idempotent
    assert v["virt.update"]("conv9", cpu=dict(cpu, current=4), mem=128)["changes"]["cpu"] == {
        "old": "2 (maximum 4)",
        "new": 4,
    }
    v["virt.undefine"]("conv9")


def test_update_applies_mem_current_max_slots_hugepages(virt_test):
    v = virt_test
    v["virt.init"]("conv11", 1, 64, nic=None, disk=None, start=False)
    cpu = {"maximum": 1, "numa": {0: {"cpus": "0", "memory": "128m"}}}
    mem = {"boot": "128m", "current": 96, "max": "512m", "slots": 2, "hugepages": [{"size": "2m", "nodeset": 0}]}
    preview = v["virt.update"]("conv11", cpu=cpu, mem=mem, test=True)
    assert preview["changes"]["mem"] == {"old": 64, "new": "96 (maximum 128)", "current": 96}
    done = v["virt.update"]("conv11", cpu=cpu, mem=mem)
    assert set(done["changes"]) == set(preview["changes"]) == {"mem", "cpu_model", "max_mem", "memory_backing"}
    facts = definition.feature_facts(v["virt.get_xml"]("conv11"))
    assert facts["max_mem"] == {"size": 512, "slots": 2}
    assert facts["memory_backing"] == {"hugepages": [{"size": 2048, "nodeset": "0"}]}
    info = v["virt.vm_info"]("conv11")["conv11"]
    assert (info["mem"], info["current_mem"]) == (128, 96)
    assert v["virt.update"]("conv11", cpu=cpu, mem=mem)["changes"] == {}  # idempotent
    assert v["virt.update"]("conv11", cpu=cpu, mem=dict(mem, hugepages=False))["changes"]["memory_backing"] == {
        "old": {"hugepages": [{"size": 2048, "nodeset": "0"}]},
        "new": None,
    }
    assert definition.feature_facts(v["virt.get_xml"]("conv11"))["memory_backing"] is None
    v["virt.undefine"]("conv11")


def test_update_applies_numatune_memnodes(virt_test):
    v = virt_test
    cpu = {"maximum": 2, "numa": {0: {"cpus": "0", "memory": 32}, 1: {"cpus": "1", "memory": 32}}}
    v["virt.init"]("conv12", cpu, 64, nic=None, disk=None, start=False)
    tune = {"memnodes": {0: {"mode": "strict", "nodeset": "0"}, 1: {"mode": "preferred", "nodeset": "0"}}}
    done = v["virt.update"]("conv12", cpu=cpu, numatune=tune)
    assert set(done["changes"]) == {"numatune"} and done["changes"]["numatune"]["old"] is None
    facts = definition.feature_facts(v["virt.get_xml"]("conv12"))
    assert [n["mode"] for n in facts["numatune"]["memnodes"]] == ["strict", "preferred"]
    assert v["virt.update"]("conv12", cpu=cpu, numatune=tune)["changes"] == {}  # idempotent
    v["virt.undefine"]("conv12")


def test_cpu_tuning_change_to_a_running_vm_needs_a_restart(virt_test):
    v = virt_test
    cpu = {"maximum": 2, "tuning": {"vcpupin": {0: "0"}}}
    v["virt.init"]("conv10", cpu, 64, nic=None, disk=None, start=True)
    done = v["virt.update"]("conv10", cpu=dict(cpu, tuning={"vcpupin": {0: "1"}}))
    assert set(done["changes"]) == {"cputune"} and done["applied"]["restart"]
    assert done["pending_restart"] == ["cputune"]
    v["virt.destroy"]("conv10")
    v["virt.undefine"]("conv10")


def test_secure_boot_on_an_i440fx_vm_is_refused_and_nothing_changes(virt_test):
    v = virt_test
    v["virt.init"]("conv6", 1, 64, nic=None, disk=None, start=False)
    before = v["virt.get_xml"]("conv6")
    with pytest.raises(SaltInvocationError, match="secure boot needs machine type q35.*recreate it"):
        v["virt.update"]("conv6", boot={"efi": True, "secure_boot": True}, tpm=True)
    assert v["virt.get_xml"]("conv6") == before
    v["virt.undefine"]("conv6")


def test_feature_changes_to_a_running_vm_need_a_restart(virt_test):
    v = virt_test
    v["virt.init"]("conv7", 1, 64, nic=None, disk=None, start=True)
    plan = v["virt.update"]("conv7", tpm=True, stop_on_reboot=True, test=True)["plan"]
    assert plan["live"] == [] and len(plan["restart"]) == 2
    done = v["virt.update"]("conv7", tpm=True, stop_on_reboot=True)
    assert (
        all(r.endswith("(needs restart)") for r in done["applied"]["restart"]) and len(done["applied"]["restart"]) == 2
    )
    assert set(done["pending_restart"]) == {"tpm", "stop_on_reboot"}
    v["virt.destroy"]("conv7")
    v["virt.undefine"]("conv7")


# host devices: libvirt's test driver with node devices of our own (a PCI SATA controller, a USB hub, a NIC);
# no real passthrough is possible on this machine (no IOMMU, guests run under TCG), so only the definition
# is checked here
NODE_DEVICES = """<node>
  <cpu><mhz>2000</mhz><model>i686</model><nodes>1</nodes><sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>
  <memory>2097152</memory>
  <device><name>pci_0000_00_1f_2</name><parent>computer</parent><capability type='pci'>
    <domain>0</domain><bus>0</bus><slot>31</slot><function>2</function>
    <product id='0x2922'>SATA Controller</product><vendor id='0x8086'>Intel Corporation</vendor></capability></device>
  <device><name>usb_3_1</name><parent>computer</parent><capability type='usb_device'>
    <bus>3</bus><device>1</device><product id='0x0002'>2.0 root hub</product><vendor id='0x1d6b'>Linux</vendor>
  </capability></device>
  <device><name>net_eth9_52_54_00_00_00_09</name><parent>computer</parent><capability type='net'>
    <interface>eth9</interface><address>52:54:00:00:00:09</address></capability></device>
</node>"""


def test_host_devices_are_looked_up_and_passed_through(tmp_path):
    node = tmp_path / "node.xml"
    node.write_text(NODE_DEVICES)
    conn = libvirt.open(f"test://{node}")
    args = {"images_dir": str(tmp_path), "profiles": {}}
    conn.defineXML(
        definition.build(converge.desired_spec(vmargs.InitRequest("hd1", 1, 64, nic=None, disk=None), **args))
    )
    with pytest.raises(SaltInvocationError, match="'usb_3_1' is not one the operator made available to VMs"):
        converge.update(
            conn, *vmargs.update_request("hd1", None, None, {"host_devices": ["usb_3_1"]}), **args
        )  # none unless virt:host_devices lists it
    listed = ["pci_0000_00_1f_2", "usb_3_1", "pci_0000_00_1f_3", "net_eth9_52_54_00_00_00_09"]
    args["operator"] = switches.operator_settings({"virt": {"host_devices": listed}})
    done = converge.update(
        conn, *vmargs.update_request("hd1", None, None, {"host_devices": ["pci_0000_00_1f_2", "usb_3_1"]}), **args
    )
    assert done["changes"]["host_devices"] == {
        "old": [],
        "new": [
            {"type": "pci", "address": "0000:00:1f.2"},
            {"type": "usb", "vendor": "0x1d6b", "product": "0x0002"},
        ],
    }
    root = ET.fromstring(conn.lookupByName("hd1").XMLDesc(0))
    src = root.find("devices/hostdev[@type='pci']/source/address")
    assert (src.get("bus"), src.get("slot"), src.get("function")) == ("0x00", "0x1f", "0x2")
    assert root.find("devices/hostdev[@type='pci']").get("managed") == "yes"
    again = converge.update(
        conn, *vmargs.update_request("hd1", None, None, {"host_devices": ["pci_0000_00_1f_2", "usb_3_1"]}), **args
    )
    assert again["changes"] == {}  # idempotent
    with pytest.raises(SaltInvocationError, match=r"no device 'pci_0000_00_1f_3'.*here: pci_0000_00_1f_2, usb_3_1"):
        converge.update(conn, *vmargs.update_request("hd1", None, None, {"host_devices": ["pci_0000_00_1f_3"]}), **args)
    with pytest.raises(SaltInvocationError, match="net_eth9_52_54_00_00_00_09 is a net device; only PCI and USB"):
        converge.update(
            conn, *vmargs.update_request("hd1", None, None, {"host_devices": ["net_eth9_52_54_00_00_00_09"]}), **args
        )
    assert (
        converge.update(conn, *vmargs.update_request("hd1", None, None, {"host_devices": []}), **args)["changes"][
            "host_devices"
        ]["new"]
        == []
    )
    assert ET.fromstring(conn.lookupByName("hd1").XMLDesc(0)).find("devices/hostdev") is None
    conn.close()


def test_virt_init_refuses_an_unknown_host_device_before_anything_is_made(tmp_path, virt_test):
    images = virt_test["config.get"]("virt:images")
    with pytest.raises(SaltInvocationError, match="'pci_0000_00_1f_2' is not one the operator made available"):
        virt_test["virt.init"]("hd2", 1, 64, nic=None, disk=None, start=False, host_devices=["pci_0000_00_1f_2"])
    v = make_minion_mods(tmp_path, "test:///default", host_devices=["pci_0000_00_1f_2"])  # listed, not there
    with pytest.raises(SaltInvocationError, match="no device 'pci_0000_00_1f_2' on this hypervisor"):
        v["virt.init"]("hd2", 1, 64, nic=None, disk=None, start=False, host_devices=["pci_0000_00_1f_2"])
    assert "hd2" not in virt_test["virt.list_domains"]()
    assert not os.path.exists(os.path.join(images, "hd2"))


def test_states_refuse_the_operator_switches_also_with_test(virt_test, guest):
    """trusted_image= / allow_http= given to virt.running are refused as by virt.init, also for test=True
    (whose preview would otherwise read the image as trusted)."""
    for test in (True, False):
        st = load_states(virt_test, test=test)
        for arg in ("trusted_image", "allow_http"):
            ret = st["virt.running"]("sw1", cpu=1, mem=64, image=guest["qcow2"], nic=None, **{arg: True})
            assert ret["result"] is False and f"{arg}= is an operator switch, not a call argument" in ret["comment"]
    assert "sw1" not in virt_test["virt.list_domains"]()


OWNER = {"tenant": "acme", "creator": "alice"}


def test_update_turns_the_ha_flag_on_and_off_live_and_in_the_definition(virt_test):
    """virt.update ha=: salt-virt's <metadata> through libvirt's setMetadata (the definition automatic HA's host
    record reads, and the running VM every signed virt.vm_info reads), the rest of the metadata kept."""

    conn = libvirt.open("test:///default")  # the fixture's driver: its domains live while a connection is open

    def ha(which=libvirt.VIR_DOMAIN_XML_INACTIVE):  # the definition, or (0) the running VM
        facts = definition.parse(conn.lookupByName("conv-ha").XMLDesc(which))
        return facts["ha"], facts["group"], facts["owner"]

    virt_test["virt.init"]("conv-ha", 1, 64, nic=None, disk=None, start=False, group="web", ha=True, owner=OWNER)
    assert virt_test["virt.vm_info"]("conv-ha")["conv-ha"]["ha"] is True
    assert virt_test["virt.update"]("conv-ha", ha=True)["changes"] == {}  # as it is: nothing to do
    dry = virt_test["virt.update"]("conv-ha", ha=False, test=True)
    assert dry["changes"] == {"ha": {"old": True, "new": False}} and dry["plan"]["definition"] == ["ha True -> False"]
    assert ha() == (True, "web", OWNER)
    off = virt_test["virt.update"]("conv-ha", ha=False)
    assert off["applied"]["definition"] == ["ha True -> False"] and off["definition"] is True
    assert ha() == (False, "web", OWNER)
    assert virt_test["virt.update"]("conv-ha", cpu=1)["changes"] == {}  # not given: left as it is
    virt_test["virt.start"]("conv-ha")
    on = virt_test["virt.update"]("conv-ha", ha="yes")
    assert on["applied"]["live"] == ["ha False -> True"] and on["pending_restart"] == []
    assert ha() == ha(0) == (True, "web", OWNER)
    assert virt_test["virt.vm_info"]("conv-ha")["conv-ha"]["ha"] is True
    later = virt_test["virt.update"]("conv-ha", ha=False, live=False)  # Salt's live=False: the definition only
    assert later["applied"]["restart"] == ["ha True -> False (live=False)"] and later["pending_restart"] == ["ha"]
    assert ha()[0] is False and ha(0)[0] is True
    with pytest.raises(SaltInvocationError, match="ha must be true or false"):
        virt_test["virt.update"]("conv-ha", ha="maybe")
    virt_test["virt.purge"]("conv-ha")
    conn.close()
