"""saltvirt.fleet.leftovers: hosts a virt.init abandoned are remembered in a real store and cleaned
(real virt.cleanup on libvirt's test driver) once they answer."""

import os
import uuid

import pytest

from saltvirt.fleet import leftovers, publish
from saltvirt.host import query
from saltvirt.model import vmargs
from saltvirt.storage import images
from saltvirt.vm import cleanup
from tests.support.signedfleet import QUICK_WAITS, SigningClient, minion_key
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

    def call(host, fun, args, kwargs):  # the publication: hv3's real virt.cleanup on its own libvirt and disks
        if host in silent:
            return {"status": "down", "error": "did not answer"}
        assert fun == "virt.cleanup" and kwargs == {"fleet_uuids": {}}
        try:
            return {"status": "up", "ret": cleanup.cleanup(test_conn, args[0], images_dir, host_id=host, **kwargs)}
        except Exception as exc:  # noqa: BLE001 - what Salt's job returns for a raised error
            return {"status": "error", "error": str(exc)}

    def defined():  # every hypervisor's virt.defined_uuids: nothing defined anywhere
        return {}, {}

    out = leftovers.heal(call, defined, store)
    assert out == {"hv3": {"web1": {"error": "down: did not answer"}}}  # web2 waits without a second try
    assert os.path.exists(disk) and sorted(store.fetch(leftovers.ABANDONED, "hv3")) == ["web1", "web2"]
    silent.clear()
    out = leftovers.heal(call, defined, store, name="web1")
    assert out["hv3"]["web1"]["removed"] == [disk] and out["hv3"]["web1"]["interrupted"] is True
    assert not os.path.exists(disk) and sorted(store.fetch(leftovers.ABANDONED, "hv3")) == ["web2"]
    # an init still running there: cleanup refuses (its lock is held), the entry stays
    with cleanup.InitLock(images_dir, "web2"):
        out = leftovers.heal(call, defined, store)
    assert "a virt.init or virt.cleanup of 'web2' is running on this host" in out["hv3"]["web2"]["error"]
    assert store.fetch(leftovers.ABANDONED, "hv3") == {"web2": store.fetch(leftovers.ABANDONED, "hv3")["web2"]}
    assert leftovers.heal(call, defined, store)["hv3"]["web2"]["removed"] == []
    assert store.fetch(leftovers.ABANDONED, "hv3") is None
    assert leftovers.heal(call, None, store) == {}  # nothing to heal: no hypervisor is asked anything


def test_a_late_init_that_finished_is_reported_not_removed():
    ans = {"status": "up", "ret": {"domain": "kept: a complete VM (virt.purge removes it)", "errors": []}}
    report, finished = leftovers._cleaned(ans)
    assert finished and "finished there after all: that VM is complete and kept" in report["note"]


# judged by UUID across the fleet (issue 34 #3) ---------------------------------------------------------
class _Fleet(SigningClient):
    """Each publication answered, signed with each hypervisor's own key (tests/support/signedfleet.py), by
    what the hypervisors' execution modules run (``_modules/virt_cleanup.py``: the library functions, with
    the minion's id) on each host's own libvirt (a private test:/// driver) and the shared images directory;
    a minion in ``silent`` never answers. A stand-in for the transport only: the real one needs a salt-master
    and minions (tests/integration/test_recovery.py heals through them), and Salt's loader cannot be several
    minions in one process (a loaded module's ``__opts__`` is the last loader's: every host would be the same)."""

    def __init__(self, conns, images_dir):
        super().__init__({})
        self.conns, self.images_dir, self.silent = conns, images_dir, set()

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        inner, args, kwargs = kwarg["fun"], kwarg["args"], kwarg["kwargs"]
        self.published.append((inner, sorted(tgt), *args))
        jid = jid or str(len(self.published))
        for mid in tgt:
            if mid not in self.silent:
                try:
                    self.reply(jid, mid, kwarg, self._answer(mid, inner, args, kwargs))
                except Exception as exc:  # noqa: BLE001 - what Salt returns for a function that raised
                    self.reply(jid, mid, kwarg, f"ERROR: {exc}", 1)
        return {"jid": jid, "minions": list(tgt)}

    def _answer(self, mid, fun, arg, kwarg):
        if fun == "virt.defined_uuids":
            return query.defined_uuids(self.conns[mid])
        assert fun == "virt.cleanup", fun
        return cleanup.cleanup(self.conns[mid], arg[0], self.images_dir, host_id=mid, **kwarg)


@pytest.fixture
def shared_fleet(tmp_path, store):
    """Three hypervisors sharing one virt:images: hv-b runs 'web1' with its disk there, made by a real
    virt.init; a virt.init of 'web1' on hv-a was abandoned earlier (the runner fell over to hv-b) and is
    remembered; hv-a and hv-c define nothing. Returns (master opts, client, web1's disk, web1's uuid)."""
    import libvirt

    from saltvirt.vm import provision
    from tests.support.paths import TEST_NODE_XML

    shared = str(tmp_path / "images")
    conns = {mid: libvirt.open(f"test://{TEST_NODE_XML}") for mid in ("hv-a", "hv-b", "hv-c")}
    ret = provision.init(
        conns["hv-b"], vmargs.InitRequest("web1", 1, 64, nic=None), provision.Host(images_dir=shared, host_id="hv-b")
    )
    assert ret["state"] == "running"
    leftovers.remember(store, "hv-a", "web1", "2026", "down", "m1")
    # the master: its key store (each hypervisor's accepted key), its config
    hypervisors = {"tgt": sorted(conns), "tgt_type": "list", **QUICK_WAITS}
    opts = dict(store.opts, pki_dir=str(tmp_path / "pki"), virt={"hypervisors": hypervisors})
    (tmp_path / "pki" / "minions").mkdir(parents=True)
    for mid in conns:
        (tmp_path / "pki" / "minions" / mid).write_text(minion_key(mid)[0])
    client = _Fleet(conns, shared)
    client.cfg = publish.config(opts)
    yield opts, client, ret["disks"][0]["path"], ret["uuid"]
    for conn in conns.values():
        conn.close()


def test_heal_keeps_the_disks_of_a_vm_running_from_shared_images_on_another_host(shared_fleet, store):
    """The attack: salt-run virt.record heals hv-a, whose virt.init of 'web1' was abandoned; 'web1' runs on
    hv-b from the shared directory. Today's heal deleted its disks. Now every hypervisor is asked which
    uuids it defines first, and hv-a's cleanup keeps what hv-b defines."""
    opts, client, disk, uuid = shared_fleet
    call = leftovers.publish_call(publish.Fleet(opts, client.cfg, client))
    defined = leftovers.publish_defined(publish.Fleet(opts, client.cfg, client))
    out = leftovers.heal(call, defined, store)
    assert os.path.exists(disk), out
    assert out["hv-a"]["web1"]["refused"] == f"VM uuid {uuid} is defined on hv-b: these are its disks, in use"
    assert out["hv-a"]["web1"]["removed"] == [] and out["hv-a"]["web1"]["errors"] == []
    assert client.published == [
        ("virt.defined_uuids", ["hv-a", "hv-b", "hv-c"]),
        ("virt.cleanup", ["hv-a"], "web1"),
    ]
    assert store.fetch(leftovers.ABANDONED, "hv-a") is None  # nothing of hv-a's init left to clean: done


def test_a_silent_hypervisor_means_nothing_is_cleaned(shared_fleet, store):
    """hv-c does not answer: it may run a VM from the shared directory, so nothing is proven unused. The
    abandoned entry waits; virt.purge's and salt-run virt.cleanup's cleanup runs nowhere, and says why."""
    from saltvirt.vm import provision

    opts, client, disk, uuid = shared_fleet
    client.silent.add("hv-c")
    call = leftovers.publish_call(publish.Fleet(opts, client.cfg, client))
    out = leftovers.heal(call, leftovers.publish_defined(publish.Fleet(opts, client.cfg, client)), store)
    why = out["hv-a"]["web1"]["error"]
    assert why.startswith("nothing cleaned: hv-c (down: did not answer") and "Tried again at the next" in why, out
    assert list(store.fetch(leftovers.ABANDONED, "hv-a")) == ["web1"]
    provision.purge(client.conns["hv-b"], "web1", client.images_dir)  # purged where it was; the rest waits
    out = leftovers.cleanup_everywhere(publish.Fleet(opts, client.cfg, client), "web1", store)
    assert list(out) == ["hv-c"], out
    assert "Run salt-run virt.cleanup web1 once every hypervisor answers" in out["hv-c"]["error"]
    assert leftovers.purge_leftovers(publish.Fleet(opts, client.cfg, client), "web1", store) is None
    assert [p[0] for p in client.published].count("virt.cleanup") == 0


def test_cleanup_everywhere_removes_leftovers_no_hypervisor_uses(shared_fleet, store):
    """Once 'web1' is defined nowhere (undefined on hv-b, its disk left behind), the uuid its manifest
    records is proven unused and hv-a deletes the files; a narrowed tgt narrows where cleanup runs, never
    which hypervisors are asked."""
    opts, client, disk, uuid = shared_fleet
    dom = client.conns["hv-b"].lookupByName("web1")
    dom.destroy()
    dom.undefine()  # its disk stays: a leftover now
    narrowed = dict(client.cfg, tgt="hv-a", tgt_type="glob")
    out = leftovers.purge_leftovers(publish.Fleet(opts, narrowed, client), "web1", store)
    assert out["cleanup"]["hv-a"]["removed"] == [disk] and not os.path.exists(disk), out
    assert "error" not in out and store.fetch(leftovers.ABANDONED, "hv-a") is None
    assert client.published == [
        ("virt.defined_uuids", ["hv-a", "hv-b", "hv-c"]),
        ("virt.cleanup", ["hv-a"], "web1"),
    ]
