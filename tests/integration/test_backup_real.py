"""Backups of a running TCG guest on the real libvirtd hv1 (libvirt 9 + QEMU 7.2): a marker written into
the guest's disk, full backup, marker changed, incremental backup, VM purged, each restore boots and
shows its own marker; a restore on another hypervisor (hv13) from the shared backup directory;
retention on real chains; snapshots and checkpoints; an incremental after a live migration to hv13
(shared storage, and a disk copy);
libvirtd killed in the middle of a backup; a guest running the QEMU guest agent (the busybox guest's
qemu-ga variant) frozen and thawed around the backup start, and answering a virt_vm resource's test.ping.

The marker is written through the guest's own QEMU block layer (HMP ``qemu-io`` on the running disk
device, see tests/integration/test_snapshot_real.py): the busybox guest has no shell on its console."""

import base64
import json
import os
import shutil
import subprocess
import time

import libvirt
import libvirt_qemu
import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.host import conn as lvconn
from saltvirt.host import vmresources
from saltvirt.vm import backup as backup_lib
from saltvirt.vm import backupstore
from saltvirt.vm import migrate as migrate_lib
from saltvirt.xml.domain import definition
from tests.integration.test_snapshot_real import MARK, has_marker, heartbeats, qemu_io, wait_heartbeat
from tests.support import lab
from tests.support.paths import GUEST_DIR, guest_boot
from tests.support.saltloader import make_minion_mods

CHANGED = "write -P 0x33 48M 64k"  # the marker after the full backup


def has_changed_marker(hv, vm):
    out = qemu_io(hv, vm, "read -P 0x33 48M 64k")
    return "Pattern verification failed" not in out and "read 65536/65536" in out


@pytest.fixture(scope="module")
def hv13(lab_dir, fabric):
    """A second hypervisor (13: used by no other module) that mounts the same backup directory."""
    hv = lab.Hypervisor(lab_dir, 13, fabric).start()
    yield hv
    hv.stop()


@pytest.fixture
def backups(qemu_tmp):
    path = qemu_tmp / "backups"
    path.mkdir()
    path.chmod(0o755)
    return path


def mods_for(hv, tmp_path, qemu_tmp, backups, images="images"):
    allowed = [str(GUEST_DIR), str(qemu_tmp)]
    key = tmp_path / "backup.key"  # every hypervisor sharing the backup directory signs with it
    if not key.exists():
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
    return make_minion_mods(
        tmp_path / hv.hostname,
        hv.uri,
        images_dir=qemu_tmp / images,
        allowed_paths=allowed,
        backup={"dir": str(backups), "key_file": str(key)},
    )


@pytest.fixture
def v1(hv1, tmp_path, qemu_tmp, backups):
    mods = mods_for(hv1, tmp_path, qemu_tmp, backups)
    yield mods
    for name in mods["virt.list_domains"]():
        if name.startswith("bkr"):
            mods["virt.purge"](name)


def boot(v, hv, name, boot_args, guest):
    disks = [{"name": "system", "bus": "sata"}]  # a SATA disk: its qdev id lets qemu-io write as the guest does
    v["virt.init"](name, 1, 256, image=guest["qcow2"], boot=boot_args, seed=False, disks=disks)
    lab.wait_for_text(hv.path("log", "qemu", f"{name}-serial.log"), "HB 2", timeout=300)


def wait_booted(hv, name):
    lab.wait_for_text(hv.path("log", "qemu", f"{name}-serial.log"), "HB 2", timeout=300)


def test_full_incremental_purge_restore_each_boots_with_its_marker(
    v1, hv1, hv13, tmp_path, qemu_tmp, backups, boot_args, guest
):
    v = v1
    boot(v, hv1, "bkr1", boot_args, guest)
    assert "wrote 65536/65536" in qemu_io(hv1, "bkr1", MARK)
    full = v["virt.backup"]("bkr1")
    assert (full["type"], full["live"], full["parent"]) == ("full", True, None)
    assert full["consistency"] == backup_lib.CRASH  # the busybox guest runs no agent: said so
    assert full["checkpoint"] == f"salt-backup-{full['id']}"
    assert full["mode"] == "pull"  # the default: read over NBD, fleecing into a scratch file that then goes
    assert not [f for f in os.listdir(full["dir"]) if f.endswith(".scratch.qcow2")]
    assert "wrote 65536/65536" in qemu_io(hv1, "bkr1", CHANGED)
    with lvconn.connect(hv1.uri) as conn:  # the incremental in push mode: a chain may mix both modes
        key = backupstore.manifest_key(v.opts["virt"]["backup"]["key_file"], v.opts["pki_dir"])  # the module's
        inc = backup_lib.backup(conn, str(backups), "bkr1", incremental=True, key=key, mode="push")
    assert inc["mode"] == "push"
    assert (inc["type"], inc["parent"], inc["chain"]) == ("incremental", full["id"], [full["id"], inc["id"]])
    assert inc["note"] is None and inc["checkpoints_dropped"] == [full["checkpoint"]]
    assert inc["size"] < full["size"]  # only what changed since the full one
    assert [b["id"] for b in v["virt.backup_list"]("bkr1")["backups"]] == [full["id"], inc["id"]]

    v["virt.purge"]("bkr1")
    assert "bkr1" not in v["virt.list_domains"]()
    old = v["virt.restore"]("bkr1", full["id"], as_name="bkr1-full", start=True)
    assert old["chain"] == [full["id"]]
    new = v["virt.restore"]("bkr1", inc["id"], start=True)
    assert new["name"] == "bkr1" and new["chain"] == [full["id"], inc["id"]]
    wait_booted(hv1, "bkr1-full")
    wait_booted(hv1, "bkr1")
    assert has_marker(hv1, "bkr1-full") and not has_changed_marker(hv1, "bkr1-full")
    assert has_changed_marker(hv1, "bkr1")

    # another hypervisor mounting the same backup directory restores the chain there
    v13 = mods_for(hv13, tmp_path, qemu_tmp, backups, images="images13")
    try:
        there = v13["virt.restore"]("bkr1", inc["id"], start=True)
        assert there["disks"]["sda"].startswith(str(qemu_tmp / "images13" / "bkr1"))
        wait_booted(hv13, "bkr1")
        assert has_changed_marker(hv13, "bkr1")
    finally:
        if "bkr1" in v13["virt.list_domains"]():
            v13["virt.purge"]("bkr1")

    # a restored VM has no checkpoint: its next incremental is full, and says why
    again = v["virt.backup"]("bkr1", incremental=True)
    assert again["type"] == "full" and "checkpoint of backup" in again["note"]


def test_retention_on_real_chains_prunes_files_and_keeps_what_is_needed(v1, hv1, backups, boot_args, guest):
    v = v1
    boot(v, hv1, "bkr2", boot_args, guest)
    made = [v["virt.backup"]("bkr2")]
    for step in range(2):
        qemu_io(hv1, "bkr2", f"write -P 0x4{step} 40M 64k")
        made.append(v["virt.backup"]("bkr2", incremental=True))
    made.append(v["virt.backup"]("bkr2"))  # a second full chain
    qemu_io(hv1, "bkr2", "write -P 0x50 40M 64k")
    made.append(v["virt.backup"]("bkr2", incremental=True))
    ids = [m["id"] for m in made]
    assert [m["type"] for m in made] == ["full", "incremental", "incremental", "full", "incremental"]
    # keep=1: the newest incremental and the full it builds on stay; the first chain goes, newest first
    preview = v["virt.backup_prune"]("bkr2", keep=1, test=True)
    assert preview["kept"] == ids[3:] and preview["pruned"] == ids[2::-1]
    directory = made[0]["dir"]  # <backups>/bkr2/<uuid>
    assert len(os.listdir(directory)) == 2 + 2 * len(ids)  # nothing gone on test=True
    done = v["virt.backup_prune"]("bkr2", keep=1)
    assert done["pruned"] == ids[2::-1] and done["refused"] == {}
    left = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    assert left == sorted([f"{i}.json" for i in ids[3:]] + [f"{i}.sda.qcow2" for i in ids[3:]])
    with pytest.raises(CommandExecutionError, match="is needed by"):
        v["virt.backup_delete"]("bkr2", ids[3])
    restored = v["virt.restore"]("bkr2", ids[4], as_name="bkr2-copy")  # the kept chain still verifies
    assert restored["chain"] == ids[3:]


def test_snapshots_and_checkpoints(v1, hv1, boot_args, guest):
    """QEMU takes an internal snapshot of a VM with a checkpoint; libvirt makes no checkpoint while a
    snapshot exists (the backup says so); a revert discards the checkpoints (the next is full)."""
    v = v1
    boot(v, hv1, "bkr3", boot_args, guest)
    full = v["virt.backup"]("bkr3")
    v["virt.snapshot"]("bkr3", name="s1")
    inc = v["virt.backup"]("bkr3", incremental=True)
    assert inc["type"] == "incremental" and "snapshots" in inc["note"]
    assert inc["checkpoint"] == full["checkpoint"]  # the parent's checkpoint covers everything since
    reverted = v["virt.revert_snapshot"]("bkr3", vm_snapshot="s1")
    assert reverted["checkpoints_discarded"] == [full["checkpoint"]]
    v["virt.delete_snapshots"]("bkr3", "s1")
    after = v["virt.backup"]("bkr3", incremental=True)
    assert after["type"] == "full" and "is gone from the VM" in after["note"]


def migrate_live(src, dst, name):
    """A plain libvirt live migration of VM ``name`` from ``src`` to ``dst`` (both lab hypervisors see the
    same disk paths: QEMU's shared-storage migration; UNSAFE: libvirt only trusts cluster filesystems)."""
    flags = (
        libvirt.VIR_MIGRATE_LIVE
        | libvirt.VIR_MIGRATE_PERSIST_DEST
        | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
        | libvirt.VIR_MIGRATE_UNSAFE
    )
    with lvconn.connect(src.uri) as sconn, lvconn.connect(dst.uri) as dconn:
        sconn.lookupByName(name).migrate(dconn, flags, None, f"tcp://{dst.ip}", 0)


def migrate_copying(src, dst, name, disk, qemu_tmp):
    """A live migration of VM ``name`` that copies its disk (copy_storage=all: QEMU mirrors it over NBD
    into a blank qcow2 at another path on ``dst``, as ``salt-run virt.migrate`` does between hosts
    without shared storage); returns the new path."""
    new = str(qemu_tmp / f"{name}-on-{dst.hostname}.qcow2")  # a path of its own: both labs see one filesystem
    size = json.loads(subprocess.check_output(["qemu-img", "info", "-U", "--output=json", disk]))["virtual-size"]
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", new, str(size)], check=True)
    uri = f"qemu+tcp://{dst.hostname}/system"
    with lvconn.connect(src.uri) as conn:
        moved = migrate_lib.migrate(  # these labs have no TLS: in clear, by the operator's opt-in
            conn,
            name,
            dst.hostname,
            transport="tcp",
            target_uri=uri,
            copy_storage="all",
            disk_map={disk: new},
            allow_cleartext=True,
        )
    assert moved["copy_storage"] == "all" and moved["undefined_on_source"] is True
    return new


@pytest.mark.parametrize("copy", [False, True], ids=["shared-storage", "disk-copy"])
def test_incremental_after_live_migration_redefines_the_checkpoint(
    v1, hv1, hv13, tmp_path, qemu_tmp, backups, boot_args, guest, copy
):
    """libvirt leaves the checkpoint metadata behind on a migration; the qcow2 bitmap travels with the
    disk (shared storage: in the file; a disk copy: libvirt has QEMU migrate the checkpoints' bitmaps
    with the copy). The incremental on the target redefines the checkpoint (libvirt validates the
    bitmap) and holds the write made on the source after the full backup. No guest boot is needed: the
    writes go through QEMU's block layer, and the backups copy what QEMU has."""
    v, name = v1, f"bkr5{'c' if copy else ''}"
    disks = [{"name": "system", "bus": "sata"}]
    v["virt.init"](name, 1, 256, image=guest["qcow2"], boot=boot_args, seed=False, disks=disks)
    full = v["virt.backup"](name)
    assert "wrote 65536/65536" in qemu_io(hv1, name, CHANGED)  # on hv1, after the full backup
    disk = v["virt.get_disks"](name)["sda"]["file"]
    if copy:
        disk = migrate_copying(hv1, hv13, name, disk, qemu_tmp)
    else:
        migrate_live(hv1, hv13, name)
    v13 = mods_for(hv13, tmp_path, qemu_tmp, backups, images="images13")
    try:
        with lvconn.connect(hv13.uri) as conn:
            dom = conn.lookupByName(name)
            assert definition.parse(dom.XMLDesc(0))["disks"][0]["file"] == disk  # the copy, when copied
            assert dom.listAllCheckpoints(0) == []  # libvirt did not carry it
        inc = v13["virt.backup"](name, incremental=True)
        assert (inc["type"], inc["parent"], inc["note"]) == ("incremental", full["id"], None), inc
        assert inc["checkpoint_redefined"] == full["checkpoint"]
        assert inc["checkpoints_dropped"] == [full["checkpoint"]] and inc["size"] < full["size"]
        back = v13["virt.restore"](name, inc["id"], as_name=f"{name}-back")  # defined, not started
        read = ["qemu-io", "-r", "-f", "qcow2", "-c", "read -P 0x33 48M 64k", back["disks"]["sda"]]
        out = subprocess.run(read, check=True, capture_output=True, text=True).stdout
        assert "read 65536/65536" in out and "Pattern verification failed" not in out
    finally:
        for vm in (name, f"{name}-back"):
            if vm in v13["virt.list_domains"]():
                v13["virt.purge"](vm)


def after_reconnect(call, timeout=900):
    """A restarted libvirtd reconnects to each running QEMU in a job of its own ('init'): calls that need
    the VM's job lock time out until it has finished. Retry those (only those) for a bounded time (on a
    machine at load 30 the reconnect once took longer than 300 s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except CommandExecutionError as exc:
            if "cannot acquire state change lock" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)


def test_libvirtd_killed_during_a_backup_leaves_no_valid_half_backup(v1, hv1, backups, boot_args, guest):
    v = v1
    boot(v, hv1, "bkr4", boot_args, guest)
    qemu_io(hv1, "bkr4", MARK)
    full = v["virt.backup"]("bkr4")
    qemu_io(hv1, "bkr4", CHANGED)
    with lvconn.connect(hv1.uri) as conn, pytest.raises(CommandExecutionError):
        key = backupstore.manifest_key(v.opts["virt"]["backup"]["key_file"], v.opts["pki_dir"])  # the module's
        backup_lib.backup(conn, str(backups), "bkr4", incremental=True, on_started=hv1.kill_daemon, key=key)
    hv1.restart_daemon()
    listed = v["virt.backup_list"]("bkr4")
    assert [b["id"] for b in listed["backups"]] == [full["id"]]  # the interrupted one never counts
    nxt = after_reconnect(lambda: v["virt.backup"]("bkr4", incremental=True))
    print(f"after the interrupted backup: {nxt['mode']} mode, stale job ended: {nxt['stale_job_ended']}")
    assert nxt["type"] == "incremental" and nxt["parent"] == full["id"]
    assert [b["id"] for b in v["virt.backup_list"]("bkr4")["backups"]] == [full["id"], nxt["id"]]
    assert v["virt.backup_list"]("bkr4")["incomplete"] == []
    v["virt.restore"]("bkr4", nxt["id"], as_name="bkr4-back", start=True)
    wait_booted(hv1, "bkr4-back")
    assert has_changed_marker(hv1, "bkr4-back")


def agent(hv, name, command, **arguments):
    """A guest agent command through libvirt (``virsh qemu-agent-command``): its ``return``."""
    cmd = json.dumps({"execute": command, **({"arguments": arguments} if arguments else {})})
    with lvconn.connect(hv.uri) as conn:
        out = libvirt_qemu.qemuAgentCommand(conn.lookupByName(name), cmd, 30, 0)
    return json.loads(out)["return"]


def guest_run(hv, name, *argv, timeout=60):
    """Run a program in the guest through its agent (guest-exec): ``(exit code, output)``."""
    pid = agent(hv, name, "guest-exec", path=argv[0], arg=list(argv[1:]), **{"capture-output": True})["pid"]
    deadline = time.monotonic() + timeout
    while not (status := agent(hv, name, "guest-exec-status", pid=pid))["exited"]:
        assert time.monotonic() < deadline, f"{argv} still running in the guest after {timeout} s"
        time.sleep(0.2)
    out = "".join(base64.b64decode(status.get(k, "")).decode() for k in ("out-data", "err-data"))
    return status.get("exitcode"), out


def wait_agent_connected(hv, name, timeout=120):
    """libvirt marks the agent's channel connected once qemu-ga in the guest opens its port."""
    deadline = time.monotonic() + timeout
    while True:
        with lvconn.connect(hv.uri) as conn:
            state = definition.parse(conn.lookupByName(name).XMLDesc(0))["guest_agent"]
        if state == "connected" or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def ext4_facts(disk, tmp_path, running=False):
    """What partition 1 (the guest's ext4) of qcow2 ``disk`` holds: ``(needs_recovery, heartbeat,
    e2fsck -fn rc)``. ``needs_recovery`` is the superblock's journal flag: set while a journalled ext4 is
    mounted read-write, cleared on disk by a freeze (FIFREEZE flushes the journal first) and set again
    by the thaw; so a backup made while the guest's filesystem was frozen has it clear, and a
    crash-consistent copy of the mounted filesystem has it set. ``running``: read a running VM's disk."""
    raw, part = tmp_path / "disk.raw", tmp_path / "part.img"
    share = ["-U"] if running else []
    subprocess.run(["qemu-img", "convert", *share, "-f", "qcow2", "-O", "raw", disk, raw], check=True)
    with open(raw, "rb") as src, open(part, "wb") as dst:
        src.seek(1 << 20)  # partition 1 starts at sector 2048 (scripts/build-guest.sh)
        shutil.copyfileobj(src, dst)
    superblock = part.read_bytes()[1024:2048]
    needs_recovery = bool(int.from_bytes(superblock[0x60:0x64], "little") & 0x4)  # s_feature_incompat RECOVER
    cat = subprocess.run(["debugfs", "-R", "cat /heartbeat", str(part)], check=False, capture_output=True, text=True)
    fsck = subprocess.run(["e2fsck", "-fn", str(part)], check=False, capture_output=True, text=True)
    return needs_recovery, cat.stdout.strip(), fsck.returncode


def test_guest_agent_freezes_and_thaws_the_filesystems_around_the_backup_start(v1, hv1, tmp_path, backups, guest):
    """The busybox guest's qemu-ga variant mounts its disk's ext4 read-write on /data, runs Debian's
    qemu-ga on the agent channel ``virt.init`` adds, and writes a heartbeat number into /data/heartbeat
    before printing each ``HB <n>``. The backup reports the agent's own counts; the backup's filesystem
    is the frozen one (journal flushed, clean for e2fsck, the latest heartbeat on disk although nothing
    in the guest synced it); the guest is thawed after (the agent says so, and its writes go on). With
    /data unmounted (through the agent's guest-exec) the agent freezes nothing, and the backup says so."""
    if not os.path.isfile(guest["initrd_qga"]):
        pytest.fail(f"no {guest['initrd_qga']} (the test guest's guest-agent variant): run scripts/setup.sh")
    v = v1
    boot_args = guest_boot(guest, initrd="initrd_qga")
    v["virt.init"]("bkr6", 1, 256, image=guest["qcow2"], boot=boot_args, seed=False)  # guest_agent=True: default
    serial = lab.wait_for_text(hv1.path("log", "qemu", "bkr6-serial.log"), "HB 2", timeout=300)
    assert "QGA-UP /dev/vda1 on /data" in serial, serial[-2000:]
    assert wait_agent_connected(hv1, "bkr6") == "connected"
    assert agent(hv1, "bkr6", "guest-fsfreeze-status") == "thawed"
    with lvconn.connect(hv1.uri) as conn:
        disk = definition.parse(conn.lookupByName("bkr6").XMLDesc(0))["disks"][0]["file"]
    assert ext4_facts(disk, tmp_path, running=True)[0] is True  # mounted read-write: the flag the freeze clears

    beat = heartbeats(hv1, "bkr6")[-1]  # written to /data/heartbeat (page cache only) before it was printed
    made = v["virt.backup"]("bkr6")
    assert (made["live"], made["consistency"]) == (True, backup_lib.CONSISTENT)
    assert made["fs_freeze"] == {"frozen": 1, "thawed": 1}  # /data; the initramfs' own filesystems are virtual
    assert v["virt.backup_list"]("bkr6")["backups"][0]["fs_freeze"] == made["fs_freeze"]  # in the manifest too

    assert agent(hv1, "bkr6", "guest-fsfreeze-status") == "thawed"
    wait_heartbeat(hv1, "bkr6", heartbeats(hv1, "bkr6")[-1] + 1, timeout=120)  # writes to /data go on

    back = v["virt.restore"]("bkr6", made["id"], as_name="bkr6-back")  # checksums verified; not started
    needs_recovery, heartbeat, fsck_rc = ext4_facts(back["disks"]["vda"], tmp_path)
    assert needs_recovery is False  # the frozen filesystem: journal flushed at the start of the backup
    assert fsck_rc == 0  # and clean
    assert heartbeat.isdigit() and int(heartbeat) >= beat, heartbeat

    # an agent that finds nothing it can freeze (only virtual filesystems left): not called consistent
    # the guest's heartbeat writes /data/heartbeat every second: the umount is busy while a write (slow under
    # TCG on a loaded machine) holds the file open, and succeeds between two (a full run at load 9 met it)
    deadline = time.monotonic() + 120
    while (umount := guest_run(hv1, "bkr6", "/bin/umount", "/data")) != (0, ""):
        assert "busy" in umount[1] and time.monotonic() < deadline, umount
        time.sleep(0.1)
    again = v["virt.backup"]("bkr6")
    assert (again["consistency"], again["fs_freeze"]) == (backup_lib.NONE_FROZEN, {"frozen": 0, "thawed": 0})
    assert agent(hv1, "bkr6", "guest-fsfreeze-status") == "thawed"

    # a virt_vm resource's test.ping (saltvirt.host.vmresources.ping): the real agent answers guest-ping; once it
    # is stopped (SIGSTOP: its channel stays connected, nothing answers) the running VM's ping is False
    with lvconn.connect(hv1.uri) as conn:
        uuid = conn.lookupByName("bkr6").UUIDString()
        assert vmresources.ping(conn, uuid) is True
        agent(hv1, "bkr6", "guest-exec", path="/bin/sh", arg=["-c", "sleep 1; kill -STOP $(pidof qemu-ga)"])
        time.sleep(3)
        assert vmresources.ping(conn, uuid, agent_timeout=1) is False
        assert conn.lookupByUUIDString(uuid).isActive()
