"""saltvirt.host.capacity: what placement needs, the same figures as host_info, the group index cached
per host and invalidated by new/renamed/removed domains, a generation bump and age (test driver)."""

import os

from saltvirt.host import capacity, query
from saltvirt.xml.domain.metadata import METADATA_NS

XML = (
    "<domain type='test'><name>{name}</name>{uuid}<memory unit='MiB'>{mem}</memory><vcpu>{cpu}</vcpu>"
    "<metadata>{meta}</metadata><os><type>hvm</type></os></domain>"
)


def _define(conn, name, group=None, mem=128, cpu=1, uuid=None):
    meta = f"<saltvirt:vm xmlns:saltvirt='{METADATA_NS}'><saltvirt:group>{group}</saltvirt:group></saltvirt:vm>"
    xml = XML.format(
        name=name, uuid=f"<uuid>{uuid}</uuid>" if uuid else "", mem=mem, cpu=cpu, meta=meta if group else ""
    )
    return conn.defineXML(xml)


def test_the_same_usage_as_host_info_and_each_vms_group(test_conn, tmp_path):
    _define(test_conn, "web1", "web", mem=256, cpu=2).create()
    _define(test_conn, "db1", "db", mem=512, cpu=4)
    _define(test_conn, "plain1")
    cap = capacity.capacity(test_conn, str(tmp_path / "images"), cache_dir=str(tmp_path / "cache"))
    info = query.host_info(test_conn, str(tmp_path / "images"))
    for key in ("mem_total", "mem_used_by_vms", "vcpus_total", "vcpus_used_by_vms", "vms_active", "vms_defined"):
        assert cap["host"][key] == info[key], key
    assert cap["host"]["disk_free"] == info["disk_free"] and cap["host"]["images_dir"] == str(tmp_path / "images")
    vms = cap["vm_info"]
    assert vms["web1"] == {"group": "web", "state": "running", "cpu": 2, "mem": 256}
    assert vms["db1"] == {"group": "db", "state": "shutoff", "cpu": 4, "mem": 512}
    assert vms["plain1"]["group"] is None
    assert cap["host"]["groups"] == {"db": ["db1"], "web": ["web1"]}
    assert cap["host"]["mem_defined"] == sum(v["mem"] for v in vms.values())
    # the group is what full_info reads from the XML
    full = query.full_info(test_conn)
    assert {n: v["group"] for n, v in full["vm_info"].items()} == {n: v["group"] for n, v in vms.items()}


def test_the_index_is_cached_and_new_renamed_removed_domains_are_current(test_conn, tmp_path):
    cache = str(tmp_path / "cache")
    _define(test_conn, "web1", "web")
    assert capacity.capacity(test_conn, cache_dir=cache)["host"]["cache"] == "cold"
    assert capacity.capacity(test_conn, cache_dir=cache)["host"]["cache"] == "hit"
    assert [f for f in os.listdir(cache) if f.startswith("capacity-")]
    _define(test_conn, "web2", "web")  # new: read at once, the rest from the cache
    cap = capacity.capacity(test_conn, cache_dir=cache)
    assert cap["host"]["cache"] == "partial" and cap["vm_info"]["web2"]["group"] == "web"
    test_conn.lookupByName("web2").rename("web3", 0)
    cap = capacity.capacity(test_conn, cache_dir=cache)
    assert "web2" not in cap["vm_info"] and cap["vm_info"]["web3"]["group"] == "web"
    test_conn.lookupByName("web3").undefine()
    assert "web3" not in capacity.capacity(test_conn, cache_dir=cache)["vm_info"]


def test_a_redefinition_in_place_is_seen_after_a_bump_or_max_age(test_conn, tmp_path):
    """Same UUID, new group: the cache cannot know until something says so (salt-virt's redefinitions
    and the virt_events engine bump the generation) or the entry is older than max_age."""
    cache = str(tmp_path / "cache")
    uuid = _define(test_conn, "web1", "web").UUIDString()
    assert capacity.capacity(test_conn, cache_dir=cache)["vm_info"]["web1"]["group"] == "web"
    _define(test_conn, "web1", "db", mem=512, uuid=uuid)
    stale = capacity.capacity(test_conn, cache_dir=cache)
    assert stale["vm_info"]["web1"]["group"] == "web"  # the cache is allowed to be this stale ...
    assert capacity.capacity(test_conn, cache_dir=cache, max_age=0)["vm_info"]["web1"]["group"] == "db"  # ... this long
    _define(test_conn, "web1", "web", uuid=uuid)
    capacity.capacity(test_conn, cache_dir=cache)
    _define(test_conn, "web1", "db", mem=512, uuid=uuid)
    capacity.bump(cache)
    cap = capacity.capacity(test_conn, cache_dir=cache)
    assert cap["host"]["cache"] == "cold" and cap["vm_info"]["web1"] == {
        "group": "db",
        "state": "shutoff",
        "cpu": 1,
        "mem": 512,
    }


def test_a_broken_cache_file_is_rebuilt(test_conn, tmp_path):
    cache = tmp_path / "cache"
    _define(test_conn, "web1", "web")
    capacity.capacity(test_conn, cache_dir=str(cache))
    for path in cache.glob("capacity-*.json"):
        path.write_text("{not json")
    cap = capacity.capacity(test_conn, cache_dir=str(cache))
    assert cap["host"]["cache"] == "cold" and cap["vm_info"]["web1"]["group"] == "web"


def test_without_a_cache_dir_it_still_answers(test_conn):
    _define(test_conn, "web1", "web")
    assert capacity.capacity(test_conn)["vm_info"]["web1"]["group"] == "web"


def test_the_module_and_its_invalidation(virt_test, tmp_path):
    """virt.capacity through Salt's loader; virt.setmem (a definition changed in place) bumps the generation."""
    import libvirt

    conn = libvirt.open("test:///default")
    _define(conn, "capmod1", "web")
    conn.close()
    cap = virt_test["virt.capacity"]()
    assert cap["vm_info"]["capmod1"]["group"] == "web" and cap["host"]["vms_defined"] >= 2
    cache = capacity.cache_dir({"cachedir": str(tmp_path / "cache")})  # the loader's minion cachedir
    assert cap["host"]["cache"] == "cold" and os.listdir(cache)
    before = capacity.generation(cache)
    virt_test["virt.setmem"]("capmod1", 256)
    assert capacity.generation(cache) > before
    assert virt_test["virt.capacity"]()["vm_info"]["capmod1"]["mem"] == 256


POLICY = {"mem_reserve_mib": 0, "cpu_overcommit": 1.0, "disk_reserve_mib": 0}


def test_the_host_refuses_what_no_longer_fits_whatever_the_master_believed(test_conn, tmp_path):
    """virt.init's own check (issue 40): a pushed record may be stale, so the host counts what its running VMs
    hold now with the master's policy; what fits passes, what does not is refused with the reason."""
    node = query.node_info(test_conn)
    free_mem = node["phymemory"] - capacity.capacity(test_conn)["host"]["mem_used_by_vms"]
    assert capacity.overcommit(test_conn, dict(POLICY, cpu=1, mem=64)) == []
    _define(test_conn, "hog", mem=free_mem - 32, cpu=1).create()  # started since the master's record
    reasons = capacity.overcommit(test_conn, dict(POLICY, cpu=1, mem=64))
    assert len(reasons) == 1 and reasons[0].startswith("memory: needs 64 MiB, 32 MiB free now")
    cpus = node["cpus"] * 2  # overcommit 2: twice the host's CPUs, minus what runs
    used = capacity.capacity(test_conn)["host"]["vcpus_used_by_vms"]
    assert capacity.overcommit(test_conn, dict(POLICY, cpu_overcommit=2.0, cpu=cpus - used, mem=1)) == []
    assert capacity.overcommit(test_conn, dict(POLICY, cpu_overcommit=2.0, cpu=cpus - used + 1, mem=1))[0].startswith(
        "vcpus:"
    )
    (tmp_path / "images").mkdir()
    huge = query.free_mib(str(tmp_path / "images")) + 1
    assert capacity.overcommit(test_conn, dict(POLICY, cpu=1, mem=1, disk_mib=huge), str(tmp_path / "images"))[
        0
    ].startswith("disk:")


def test_a_bad_need_is_refused():
    import pytest
    from salt.exceptions import SaltInvocationError

    with pytest.raises(SaltInvocationError, match="mem must be a number >= 0"):
        capacity.overcommit(None, dict(POLICY, cpu=1, mem="lots"))


def test_the_pusher_pushes_at_once_on_a_change_and_on_its_heartbeat():
    """A burst of changes is one push (at most one per gap), and without a change it still beats."""
    import threading
    import time

    pushed = []
    done = threading.Event()

    def push():
        pushed.append(time.monotonic())
        done.set()

    pusher = capacity.Pusher(push, every=3600, gap=0.05).start()
    try:
        assert done.wait(10)  # the first push: at start
        done.clear()
        for _ in range(20):
            pusher.changed("started", {})
        assert done.wait(10)
        deadline = time.monotonic() + 10
        while pusher.pushes < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 2 <= pusher.pushes <= 3  # the burst: one push (two when it straddled the first one's gap)
    finally:
        pusher.stop.set()
        pusher.wake.set()
    beat = capacity.Pusher(push, every=0.05, gap=0.01).start()
    try:
        deadline = time.monotonic() + 10
        while beat.pushes < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert beat.pushes >= 3  # no change at all: the heartbeat pushes
    finally:
        beat.stop.set()
        beat.wake.set()
