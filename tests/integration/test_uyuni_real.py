"""A real client's SLS files unchanged: Uyuni's (SUSE Manager's) ``salt/virt/*.sls`` and its ``virt_utils``
and ``mgrcompat`` loader modules, applied through the session master to hyper1 (real libvirtd) with the
pillar Uyuni's server sends (``SaltServerActionService``: Gson, so a null value is left out). A network
and a pool as its UI creates them, a VM installed the PXE/kickstart way (cobbler's kernel and initrd from
the file server, then redefined to boot from its disk), update, power state and delete; each action's
libvirt outcome and, applied again, no change. Besides: memory and vCPUs, the network and pool state
changes, deleting a volume, the network and the pool.

Uyuni is GPL-2.0 and this project Apache-2.0: its files are not part of this repository. The test reads
them from a checkout of ``susemanager-utils/susemanager-sls`` (``SALT_VIRT_UYUNI``, default
``/var/cache/salt-virt/uyuni/susemanager-sls``; ``scripts/uyuni-sls.sh`` puts the files it needs there)
and fetches nothing itself."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET

import pytest

from tests.support import lab
from tests.support.saltd import SOURCES, compiled

UYUNI = pathlib.Path(os.environ.get("SALT_VIRT_UYUNI", "/var/cache/salt-virt/uyuni/susemanager-sls"))
SLS = (
    *("create-vm", "update-vm", "deleted", "statechange", "setmem", "setvcpus"),
    *("network-create", "network-statechange", "pool-create", "pool-statechange", "pool-refreshed"),
    *("volume-deleted", "pool-deleted"),
)
MODULES = {"_modules": ["virt_utils.py"], "_states": ["virt_utils.py", "mgrcompat.py"]}
BOOT_WAIT = 300  # a TCG guest boots in seconds on an idle host, minutes on a loaded shared CI machine
# the VM that boots from a cached kernel: create-vm.sls caches it in the host-wide /tmp/virt/<name>, so the
# name is this run's own (two runs of the suite on one machine would otherwise share that directory)
VM, NET, POOL = f"uyvm1-{os.getpid()}", "uynet", "uypool"
# from a template image: with an install ISO and a given OVMF; with the firmware picked; with an ISO refused
TEMPLATED, EFI, REFUSED = "uyvm2", "uyvm3", "uyvm4"
OVMF = "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"  # the host's own (Debian's ovmf)


@pytest.fixture(scope="module")
def uyuni(state_tree, salt_cli, hyper1, guest):
    """Uyuni's files in the master's file_roots (salt://virt/*.sls, its _modules/_states synced to hyper1),
    the test guest's kernel and initrd where cobbler's sync puts a distribution (salt://bootloader/)."""
    missing = [f"salt/virt/{s}.sls" for s in SLS if not (UYUNI / "salt" / "virt" / f"{s}.sls").is_file()]
    missing += [
        f"src/{d[1:]}/{f}" for d, files in MODULES.items() for f in files if not (UYUNI / "src" / d[1:] / f).is_file()
    ]
    if missing:
        pytest.skip(f"Uyuni's files are not in {UYUNI} ({', '.join(missing)}): run scripts/uyuni-sls.sh")
    made = [state_tree / "virt", state_tree / "bootloader"]
    (state_tree / "virt").mkdir()
    for name in SLS:
        shutil.copyfile(UYUNI / "salt" / "virt" / f"{name}.sls", state_tree / "virt" / f"{name}.sls")
    for folder, files in MODULES.items():
        (state_tree / folder).mkdir(exist_ok=True)
        for name in files:
            shutil.copyfile(UYUNI / "src" / folder[1:] / name, state_tree / folder / name)
            made.append(state_tree / folder / name)
    distro = state_tree / "bootloader" / "1" / "busybox-x86_64"
    distro.mkdir(parents=True)
    shutil.copyfile(guest["kernel"], distro / "linux")
    shutil.copyfile(guest["initrd"], distro / "initrd")
    assert salt_cli.run("saltutil.sync_all", minion_tgt="hyper1").returncode == 0
    compiled(hyper1)
    yield
    for path in made:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    salt_cli.run("saltutil.sync_all", minion_tgt="hyper1")
    compiled(hyper1)


@pytest.fixture
def install_iso(lab_dir):
    """An install DVD image where the operator allows local files (hyper1's <lab_dir>/sources): the path
    Uyuni's UI takes as a CDROM disk's source file."""
    sources = pathlib.Path(lab_dir) / SOURCES
    sources.mkdir(mode=0o755, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="uyiso-", dir=sources)
    os.chmod(folder, 0o755)
    content = pathlib.Path(folder) / "content"
    content.mkdir()
    (content / "README").write_text("install media\n")
    iso = pathlib.Path(folder) / "install.iso"
    subprocess.run(["xorriso", "-as", "mkisofs", "-quiet", "-V", "INSTALL", "-o", str(iso), str(content)], check=True)
    iso.chmod(0o644)
    yield str(iso)
    shutil.rmtree(folder, ignore_errors=True)


def apply(salt_cli, sls, pillar):
    """``state.apply virt.<sls>`` with the action's pillar, as Uyuni's server calls it:
    {"<state module>:<id>": result} (statechange.sls gives one id two states)."""
    ret = salt_cli.run("state.apply", f"virt.{sls}", f"pillar={json.dumps(pillar)}", minion_tgt="hyper1", _timeout=300)
    assert isinstance(ret.data, dict), ret
    states = {f"{key.split('_|-')[0]}:{v['__id__']}": v for key, v in ret.data.items()}
    assert all(v["result"] is True for v in states.values()), {k: v["comment"] for k, v in states.items()}
    return states


def changed(states):
    return {k: v["changes"] for k, v in states.items() if v["changes"]}


def call(salt_cli, fun, *args):
    ret = salt_cli.run(fun, *args, minion_tgt="hyper1")
    assert ret.returncode == 0, ret
    return ret.data


def vm_pillar(target):
    """``virtDomainActionToPillar`` for a VM installed from a cobbler profile: one new 1 GiB disk in a
    pool, one NIC on a virtual network, VNC, no template image (so boot_dev "network hd")."""
    return {
        "name": VM,
        "vcpus": 1,
        "mem": 128,
        "vm_type": "qemu",  # what the UI offers on a host without KVM (the lab's TCG)
        "os_type": "hvm",
        "arch": "x86_64",
        "disks": [
            {"name": "system", "format": "qcow2", "pool": POOL, "size": 1024, "model": "virtio", "device": "disk"}
        ],
        "interfaces": [{"name": "eth0", "type": "network", "source": NET}],
        "graphics": {"type": "vnc"},
        "boot": {
            "kernel": "1/busybox-x86_64/linux",
            "initrd": "1/busybox-x86_64/initrd",
            "kopts": f"console=ttyS0 quiet autoyast=http://uyuni.example/cblr/svc/op/autoinstall/system/{VM}",
        },
        "boot_dev": "network hd",
    }


def test_uyuni_network_pool_vm_lifecycle(uyuni, salt_cli, hv1, qemu_tmp, guest, install_iso):
    # network-create / pool-create: what the UI's "create" sends; the SLS asks virt.*_info first ({} if absent)
    net = {"network_name": NET, "autostart": False, "action_type": "running"}
    net["ipv4_config"] = {"cidr": "10.81.0.1/24", "dhcp_ranges": [{"start": "10.81.0.10", "end": "10.81.0.50"}]}
    pool = {"pool_name": POOL, "pool_type": "dir", "autostart": True, "target": str(qemu_tmp / POOL)}
    pool.update(permissions={}, action_type="running")
    cached = pathlib.Path("/tmp/virt") / VM  # where create-vm.sls caches the kernel (the minion runs here)
    shutil.rmtree(cached, ignore_errors=True)
    try:
        made = apply(salt_cli, "network-create", net)
        assert set(made) == {"virt:network_running"} and made["virt:network_running"]["changes"], made
        info = call(salt_cli, "virt.network_info", NET)[NET]
        assert info["active"] and info["ip"] == "10.81.0.1/24" and info["dhcp"] == ["10.81.0.10", "10.81.0.50"]
        assert changed(apply(salt_cli, "network-create", net)) == {}
        made = apply(salt_cli, "pool-create", pool)
        assert set(made) == {"virt:pool_running"} and made["virt:pool_running"]["changes"], made
        assert call(salt_cli, "virt.pool_info", POOL)[POOL]["state"] == "running"
        assert changed(apply(salt_cli, "pool-create", pool)) == {}

        _create_update_and_power(salt_cli, hv1, qemu_tmp)
        t0 = time.monotonic()
        _template_cdrom_uefi(salt_cli, hv1, guest, install_iso, qemu_tmp)
        print(f"create-vm from a template, an install ISO, UEFI: {time.monotonic() - t0:.1f} s")

        # deleted.sls: powered off, then virt.purge (module.run): the VM and its volume go, pool and network stay
        gone = apply(salt_cli, "deleted", {"domain_name": VM})
        assert set(changed(gone)) == {"virt:vm_stopped", "mgrcompat:mgr_virt_destroy"}
        assert VM not in call(salt_cli, "virt.list_domains")
        assert call(salt_cli, "virt.pool_list_volumes", POOL) == []
        assert NET in call(salt_cli, "virt.list_networks") and POOL in call(salt_cli, "virt.list_pools")

        # the UI's volume delete (then a pool refresh), network delete (stop, undefine) and pool delete (purge)
        call(salt_cli, "virt.volume_define", POOL, "spare", 1)
        assert set(changed(apply(salt_cli, "volume-deleted", {"pool_name": POOL, "volume_name": "spare"}))) == {
            "mgrcompat:mgr_volume_deleted",
            "mgrcompat:mgr_pool_refreshed",
        }
        assert call(salt_cli, "virt.pool_list_volumes", POOL) == []
        apply(salt_cli, "network-statechange", {"network_name": NET, "network_state": "delete"})
        assert NET not in call(salt_cli, "virt.list_networks")
        assert changed(apply(salt_cli, "pool-deleted", {"pool_name": POOL, "pool_purge": True}))
        assert POOL not in call(salt_cli, "virt.list_pools")
    finally:
        shutil.rmtree(cached, ignore_errors=True)
        for name in set(call(salt_cli, "virt.list_domains")) & {VM, TEMPLATED, EFI, REFUSED}:
            call(salt_cli, "virt.purge", name)
        for fun in ("virt.network_stop", "virt.network_undefine", "virt.pool_stop", "virt.pool_undefine"):
            salt_cli.run(fun, NET if "network" in fun else POOL, minion_tgt="hyper1")


def _create_update_and_power(salt_cli, hv1, qemu_tmp):
    pillar = vm_pillar(qemu_tmp)
    # create-vm: the first boot from cobbler's kernel (stop_on_reboot), then the definition boots from disk
    made = apply(salt_cli, "create-vm", pillar)
    assert set(changed(made)) >= {"file:kernel_cached", "file:initrd_cached", "virt:domain_first_boot_define"}
    assert "virt:domain_define" in changed(made)
    lab.wait_for_text(hv1.path("log", "qemu", f"{VM}-serial.log"), "GUEST-BOOT-OK", timeout=BOOT_WAIT)
    live = ET.fromstring(call(salt_cli, "virt.get_xml", VM))
    config = ET.fromstring(call(salt_cli, "virt.get_xml", VM, "inactive=True"))
    assert live.findtext("os/kernel") == f"/tmp/virt/{VM}/kernel" and live.findtext("on_reboot") == "destroy"
    assert "autoyast=" in live.findtext("os/cmdline")
    assert config.find("os/kernel") is None and config.find("os/cmdline") is None
    assert [b.get("dev") for b in config.findall("os/boot")] == ["network", "hd"]
    assert config.findtext("on_reboot") == "restart" and config.get("type") == "qemu"
    info = call(salt_cli, "virt.vm_info", VM)[VM]
    assert info["graphics"]["type"] == "vnc" and info["cpu"] == 1 and info["mem"] == 128
    (nic,) = info["nics"].values()
    assert nic["type"] == "network" and nic["source"]["network"] == NET
    volumes = call(salt_cli, "virt.pool_list_volumes", POOL)
    assert volumes == [f"{VM}_system"] and info["disks"]["vda"]["file"] == f"{POOL}/{VM}_system"  # Salt's shape
    assert call(salt_cli, "virt_utils.vm_info", VM) == {VM: {"graphics_type": "vnc"}}
    # virt_utils.vm_definition (the UI's edit form) opens libvirt's default connection, not virt:connection
    found = call(salt_cli, "virt_utils.vm_definition", info["uuid"])
    assert found and found["info"]["uuid"] == info["uuid"], found
    assert ET.fromstring(found["definition"]).findtext("name") == VM

    # statechange: power off (hard off: the guest has no ACPI), again: nothing to do
    off = {"domain_name": VM, "domain_state": "powered_off"}
    assert changed(apply(salt_cli, "statechange", off)) and call(salt_cli, "virt.vm_state", VM) == {VM: "shutoff"}
    assert changed(apply(salt_cli, "statechange", off)) == {}

    # setmem (pillar in KiB) and setvcpus of the stopped VM, into its definition
    apply(salt_cli, "setmem", {"domain_name": VM, "domain_mem": 80 * 1024})
    apply(salt_cli, "setvcpus", {"domain_name": VM, "domain_vcpus": 2})
    assert [call(salt_cli, "virt.vm_info", VM)[VM][k] for k in ("mem", "cpu")] == [80, 2]

    # update-vm (the UI's edit of the stopped VM): everything as shown, memory lowered; the second time nothing
    pillar.update(vcpus=2, mem=96, uuid=info["uuid"])
    del pillar["boot"], pillar["boot_dev"], pillar["disks"][0]["size"]
    pillar["disks"][0]["source_file"] = volumes[0]  # an existing volume of the pool, as Salt's virt.update takes it
    first = apply(salt_cli, "update-vm", pillar)["mgrcompat:domain_update"]["changes"]["ret"]
    assert first["definition"] is True and first["mem"] is True, first
    again = apply(salt_cli, "update-vm", pillar)["mgrcompat:domain_update"]["changes"]["ret"]
    assert again["definition"] is False, again
    info = call(salt_cli, "virt.vm_info", VM)[VM]
    assert (info["mem"], info["graphics"]["type"], list(info["disks"]), len(info["nics"])) == (96, "vnc", ["vda"], 1)

    # statechange to running: virt_utils first starts the VM's network and pool (found from Salt's shapes of
    # vm_info: a NIC's source mapping, a volume's "<pool>/<volume>"), both stopped meanwhile, then virt.running
    apply(salt_cli, "network-statechange", {"network_name": NET, "network_state": "stop"})
    apply(salt_cli, "pool-statechange", {"pool_name": POOL, "pool_state": "stop"})
    start = {"domain_name": VM, "domain_state": "running"}
    started = apply(salt_cli, "statechange", start)
    assert started[f"virt_utils:{VM}"]["changes"] == {"networks": {NET: "started"}, "pools": {POOL: "started"}}
    assert started[f"virt:{VM}"]["changes"] and call(salt_cli, "virt.vm_state", VM) == {VM: "running"}
    assert call(salt_cli, "virt.network_info", NET)[NET]["active"]
    again = apply(salt_cli, "statechange", start)
    # virt_utils refreshes the pools each time (Uyuni's own state); virt.running has nothing to do
    assert again[f"virt_utils:{VM}"]["changes"] == {"networks": {}, "pools": {POOL: "refreshed"}}
    assert again[f"virt:{VM}"]["changes"] == {}


def _template_cdrom_uefi(salt_cli, hv1, guest, iso, elsewhere):
    """create-vm's other paths, with the pillar ``virtDomainActionToPillar`` builds: a system disk made
    from a template image (``image``), an install DVD (a CDROM disk with an ISO ``source_file``: boot_dev
    "cdrom hd", stop_on_reboot, then redefined to boot from its disk) and UEFI from the UI's firmware
    fields (``uefi: {loader, nvram}``), or UEFI left to libvirt (``uefi: {efi: true}``, no ISO: boot_dev "hd")."""
    system = {"name": "system", "format": "qcow2", "pool": POOL, "image": guest["qcow2"], "model": "virtio"}
    system["device"] = "disk"
    dvd = {"name": "disk-1", "source_file": iso, "model": "ide", "device": "cdrom"}  # Gson drops format/pool: null
    base = {"vcpus": 1, "mem": 128, "vm_type": "qemu", "os_type": "hvm", "arch": "x86_64"}
    base.update(interfaces=[{"name": "eth0", "type": "network", "source": NET}], graphics={"type": "vnc"})
    with_dvd = dict(base, name=TEMPLATED, disks=[system, dvd], boot_dev="cdrom hd")
    with_dvd["uefi"] = {"loader": OVMF[0], "nvram": OVMF[1]}

    # an ISO outside the operator's directories is refused (nothing is left of the VM: checked at the end)
    stray = str(shutil.copy(iso, elsewhere / "stray.iso"))
    refused = dict(with_dvd, name=REFUSED, disks=[system, dict(dvd, source_file=stray)])
    ret = salt_cli.run("state.apply", "virt.create-vm", f"pillar={json.dumps(refused)}", minion_tgt="hyper1")
    first = next(v for v in ret.data.values() if v["__id__"] == "domain_first_boot_define")
    assert first["result"] is False and "virt:allowed_paths" in first["comment"], first

    made = apply(salt_cli, "create-vm", with_dvd)
    assert {"virt:domain_first_boot_define", "virt:domain_define"} <= set(changed(made)), made
    live = ET.fromstring(call(salt_cli, "virt.get_xml", TEMPLATED))
    defined = call(salt_cli, "virt.get_xml", TEMPLATED, "inactive=True")
    config = ET.fromstring(defined)
    assert [b.get("dev") for b in live.findall("os/boot")] == ["cdrom", "hd"]
    assert live.findtext("on_reboot") == "destroy"
    assert [b.get("dev") for b in config.findall("os/boot")] == ["hd"] and config.findtext("on_reboot") == "restart"
    for root in (live, config):
        assert root.findtext("os/loader") == OVMF[0] and root.find("os/loader").get("type") == "pflash"
        assert root.find("os/nvram").get("template") == OVMF[1]
        (cdrom,) = root.findall("devices/disk[@device='cdrom']")
        assert cdrom.find("source").get("file") == iso and cdrom.find("target").get("bus") == "ide"
        assert cdrom.find("readonly") is not None
    # the VM's own UEFI variables (libvirt's copy of the template), in the lab's /var/lib/libvirt
    nvram = pathlib.Path(hv1.path("lib", os.path.relpath(live.findtext("os/nvram"), "/var/lib/libvirt")))
    assert nvram.is_file()
    info = call(salt_cli, "virt.vm_info", TEMPLATED)[TEMPLATED]
    assert info["disks"]["vda"]["file"] == f"{POOL}/{TEMPLATED}_system" and info["loader"]["path"] == OVMF[0]
    # again: the first state sets the install boot back, the second the disk boot (as with Salt's virt, the
    # SLS is written to run once); nothing else changes and the definition ends as it was
    again = changed(apply(salt_cli, "create-vm", with_dvd))
    assert set(again["virt:domain_first_boot_define"]) == {"boot_dev", "stop_on_reboot"}, again
    assert set(again["virt:domain_define"]) == {"boot_dev", "stop_on_reboot"}, again
    assert call(salt_cli, "virt.get_xml", TEMPLATED, "inactive=True") == defined

    firmware = dict(base, name=EFI, disks=[system], boot_dev="hd", uefi={"efi": True})
    made = apply(salt_cli, "create-vm", firmware)
    assert "virt:domain_first_boot_define" in changed(made) and "virt:domain_define" not in made, made
    config = ET.fromstring(call(salt_cli, "virt.get_xml", EFI, "inactive=True"))
    live = ET.fromstring(call(salt_cli, "virt.get_xml", EFI))
    assert config.find("os").get("firmware") == "efi"
    assert live.findtext("os/loader").startswith(("/usr/share/OVMF/", "/usr/share/qemu/")), "not the host's firmware"
    assert [b.get("dev") for b in config.findall("os/boot")] == ["hd"]
    # again: only virt_utils' pool refresh (Uyuni's own state refreshes each time)
    assert changed(apply(salt_cli, "create-vm", firmware)) == {f"virt_utils:pools-{EFI}": {POOL: "refreshed"}}

    # deleted.sls: each VM's volume goes, the install ISO (not the VM's) stays; nothing of the refused VM
    for name in (TEMPLATED, EFI):
        assert "mgrcompat:mgr_virt_destroy" in changed(apply(salt_cli, "deleted", {"domain_name": name}))
    assert not {TEMPLATED, EFI, REFUSED} & set(call(salt_cli, "virt.list_domains"))
    volumes = call(salt_cli, "virt.pool_list_volumes", POOL)
    assert not [v for v in volumes if v.startswith((TEMPLATED, EFI, REFUSED))], volumes
    assert os.path.isfile(iso) and not nvram.exists()
