"""saltvirt.fleet.leftovers: hosts a virt.init abandoned are remembered in a real store and cleaned
(real virt.cleanup on libvirt's test driver) once they answer."""

import os
import uuid

import pytest

from saltvirt.fleet import leftovers
from saltvirt.storage import images
from saltvirt.vm import cleanup
from tests.support.testfleet import local_store


@pytest.fixture
def store(tmp_path):
    return local_store(tmp_path)


def half_init(images_dir, name, host="hv3"):
    """What a virt.init on ``host`` killed while seeding leaves: a disk in its manifest (bound to the VM's
    uuid and that host from the start), its init lock file."""
    vm_dir = os.path.join(images_dir, name)
    os.makedirs(vm_dir)
    images.record_owned(vm_dir, name, [], vm_uuid=str(uuid.uuid4()), host=host)
    disk = os.path.join(vm_dir, "system.qcow2")
    images.create_disk(disk, 16)
    images.record_owned(vm_dir, name, [disk])
    os.makedirs(os.path.join(images_dir, cleanup.LOCKS_DIR), exist_ok=True)
    with open(cleanup._lock_path(images_dir, name), "w") as fh:
        fh.write("virt.init pid 0\n")
    return disk


def test_an_abandoned_host_is_cleaned_once_it_answers(tmp_path, store, test_conn):
    images_dir = str(tmp_path / "hv3-images")
    disk = half_init(images_dir, "web1")
    leftovers.remember(store, "hv3", "web1", "2026", "down", "m1")
    leftovers.remember(store, "hv3", "web2", "2027", "timeout", "m1")
    silent = {"hv3"}

    def call(host, fun, args):  # the publication: hv3's real virt.cleanup on its own libvirt and disks
        if host in silent:
            return {"status": "down", "error": "did not answer"}
        assert fun == "virt.cleanup"
        try:
            return {"status": "up", "ret": cleanup.cleanup(test_conn, args[0], images_dir, host_id=host)}
        except Exception as exc:  # noqa: BLE001 - what Salt's job returns for a raised error
            return {"status": "error", "error": str(exc)}

    out = leftovers.heal(call, store)
    assert out == {"hv3": {"web1": {"error": "down: did not answer"}}}  # web2 waits without a second try
    assert os.path.exists(disk) and sorted(store.fetch(leftovers.ABANDONED, "hv3")) == ["web1", "web2"]
    silent.clear()
    out = leftovers.heal(call, store, name="web1")
    assert out["hv3"]["web1"]["removed"] == [disk] and out["hv3"]["web1"]["interrupted"] is True
    assert not os.path.exists(disk) and sorted(store.fetch(leftovers.ABANDONED, "hv3")) == ["web2"]
    # an init still running there: cleanup refuses (its lock is held), the entry stays
    with cleanup.InitLock(images_dir, "web2"):
        out = leftovers.heal(call, store)
    assert "a virt.init or virt.cleanup of 'web2' is running on this host" in out["hv3"]["web2"]["error"]
    assert store.fetch(leftovers.ABANDONED, "hv3") == {"web2": store.fetch(leftovers.ABANDONED, "hv3")["web2"]}
    assert leftovers.heal(call, store)["hv3"]["web2"]["removed"] == []
    assert store.fetch(leftovers.ABANDONED, "hv3") is None


def test_a_late_init_that_finished_is_reported_not_removed():
    ans = {"status": "up", "ret": {"domain": "kept: a complete VM (virt.purge removes it)", "errors": []}}
    report, finished = leftovers._cleaned(ans)
    assert finished and "finished there after all: that VM is complete and kept" in report["note"]
