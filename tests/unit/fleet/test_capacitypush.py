"""saltvirt.fleet.capacitypush: salt-run virt.init places on the capacity the hypervisors pushed (issue 40), only
when it is a hypervisor's own, signed, fresh record; every other host is asked as before, and the host refuses
what no longer fits (the runner then tries its next candidate)."""

import time

import pytest
import salt.cache
import salt.exceptions
import salt.utils.mine

from saltvirt.fleet import capacitypush, placement, publish, vmcreate
from saltvirt.pki import answers
from tests.support.signedfleet import SigningClient, accept, fleet_opts, minion_key

ROOMY = {"mem_total": 16384, "mem_used_by_vms": 0, "vcpus_total": 8, "vcpus_used_by_vms": 0, "vms_defined": 0}
ROOMY.update(disk_free=102400, images_dir="/srv/salt-images", groups={})
OK = {"name": "web1", "started": True, "vm_info": {"state": "running"}}


def cap(**host):
    return {"host": dict(ROOMY, **host), "vm_info": {}}


def push(opts, host, capacity, at=None, signer=None, record=None):
    """``host``'s mine entry as the master's ``_mine`` stores what ``virt.push_capacity`` sends (its real path, from
    the hypervisor's mine.send to the master's cache: tests/unit/pki/test_answers.py); ``signer``: whose key signed
    it (a forgery: another minion's); ``record``: a ready record instead."""
    signer = signer or host
    record = record or answers.sign_record(minion_key(signer)[1], signer, capacity, time.time() if at is None else at)
    entry = salt.utils.mine.wrap_acl_structure(record, allow_tgt=host, allow_tgt_type="list")
    salt.cache.Cache(opts).store(capacitypush.BANK, host, {answers.MINE_KEY: entry})


def create(opts, client, name="web1", **kwargs):
    return vmcreate.create(
        opts,
        name,
        placement.make_request(1, 512),
        None,
        {},
        policy=placement.make_policy(mem_reserve_mib=0),
        fleet=publish.Fleet(opts, publish.config(opts), client),
        seed=False,
        **kwargs,
    )


def test_fresh_pushed_capacity_places_the_vm_and_only_the_create_is_published(tmp_path):
    """No capacity question at all: the runner reads every hypervisor's record and publishes virt.init only, with
    the room it takes for the host's own check."""
    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    push(opts, "hv1", cap(mem_used_by_vms=8192))
    push(opts, "hv2", cap())
    client = SigningClient({"virt.init": {"hv2": OK}})
    res = create(opts, client)
    assert res["host"] == "hv2" and client.published == [("virt.init", ["hv2"])]
    assert res["placement"]["ranking"][1]["host"] == "hv1"  # hv1's pushed figures were ranked too


def test_stale_absent_and_forged_records_are_not_believed_and_those_hosts_are_asked(tmp_path):
    opts = fleet_opts(tmp_path, ["hv1", "hv2", "hv3", "hv4", "hv5", "hv6"])
    accept(opts, tmp_path, ["web1"])  # a tenant VM's minion, accepted on the same master: not a hypervisor
    opts["virt"]["hypervisors"]["tgt"] = ["hv1", "hv2", "hv3", "hv4", "hv5", "hv6"]
    push(opts, "hv1", cap())  # fresh: believed
    push(opts, "hv2", cap(), at=time.time() - 91)  # older than max_age (90 s)
    # hv3 pushed nothing
    push(opts, "hv4", cap(), signer="web1")  # signed by another minion's key
    push(opts, "hv5", None, record=answers.sign_record(minion_key("hv1")[1], "hv1", cap(), time.time()))  # hv1's
    nonce = answers.new_nonce()  # an answer to a request is no record
    push(opts, "hv6", None, record=answers.sign(minion_key("hv6")[1], "hv6", "virt.capacity", nonce, cap()))
    push(opts, "web1", cap(mem_total=10**9))  # the tenant VM's own mine entry: never read
    got, refused = capacitypush.read(opts, ["hv1", "hv2", "hv3", "hv4", "hv5", "hv6"], 90)
    assert sorted(got) == ["hv1"] and got["hv1"]["host"]["mem_total"] == 16384
    assert refused["hv2"].startswith("91 s old") and refused["hv3"] == "no pushed capacity"
    for host in ("hv4", "hv5", "hv6"):
        assert refused[host].startswith("not believed"), host
    live = {h: cap() for h in ("hv2", "hv3", "hv4", "hv5", "hv6")}
    client = SigningClient({"virt.capacity": live, "virt.init": {"hv1": OK, "hv2": OK}})
    res = create(opts, client)
    assert client.published[0] == ("virt.capacity", ["hv2", "hv3", "hv4", "hv5", "hv6"])
    assert client.published[1][0] == "virt.init" and "web1" not in res["placement"]["excluded"]
    assert "web1" not in [r["host"] for r in res["placement"]["ranking"]]


def test_a_host_found_down_after_it_pushed_is_asked_and_max_age_0_turns_pushing_off(tmp_path):
    from saltvirt.fleet import silence

    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    push(opts, "hv1", cap(), at=time.time() - 30)
    push(opts, "hv2", cap())
    silence.remember(opts, "hv1")  # the runner found it down since
    got, refused = capacitypush.read(opts, ["hv1", "hv2"], 90, silence.recent(opts, ["hv1", "hv2"], 300))
    assert sorted(got) == ["hv2"] and refused["hv1"].startswith("found down")
    opts["virt"]["capacity_push"] = {"max_age": 0}
    client = SigningClient({"virt.capacity": {"hv1": cap(), "hv2": cap()}})
    hosts, _since = capacitypush.capacities(publish.Fleet(opts, publish.config(opts), client))
    assert client.published == [("virt.capacity", ["hv1", "hv2"])] and sorted(hosts) == ["hv1", "hv2"]


def test_a_master_cache_that_cannot_be_read_means_every_host_is_asked(tmp_path):
    """Salt's cache (a file, redis in a multi-master setup) that cannot be read: nothing pushed counts and placement
    asks every hypervisor, as before (a run: a Redis killed while virt.init read the mine ended it with the
    cache's raw error; here the cache file itself is unreadable)."""
    import os

    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    push(opts, "hv1", cap())
    push(opts, "hv2", cap())
    bank = os.path.join(opts["cachedir"], capacitypush.BANK)
    with open(os.path.join(bank, "hv1.p"), "wb") as f:
        f.write(b"\xc1 not msgpack")  # 0xc1: a byte msgpack never uses
    with pytest.raises(salt.exceptions.SaltException):
        salt.cache.Cache(opts).fetch(capacitypush.BANK, "hv1")  # the fault is real
    client = SigningClient({"virt.capacity": {"hv1": cap(), "hv2": cap()}, "virt.init": {"hv1": OK, "hv2": OK}})
    res = create(opts, client)
    assert client.published[0] == ("virt.capacity", ["hv1", "hv2"]) and res["host"] in ("hv1", "hv2")


def test_a_stale_record_never_over_commits_the_host_refuses_and_the_next_one_takes_it(tmp_path, test_conn):
    """hv1's record says it is empty, but a VM started there since: its own check (the real host-layer one on a
    test-driver node that is full) refuses before virt.init runs, and the runner falls over to hv2."""
    from saltvirt.host import capacity

    test_conn.defineXML(
        "<domain type='test'><name>hog</name><memory unit='MiB'>8000</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type></os></domain>"
    ).create()
    full = {"hv1": lambda need: capacity.overcommit(test_conn, need)}
    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    push(opts, "hv1", cap())
    push(opts, "hv2", cap(mem_used_by_vms=4096))
    client = SigningClient({"virt.init": {"hv1": OK, "hv2": OK}}, room=full)
    res = create(opts, client)
    assert res["host"] == "hv2" and client.published == [("virt.init", ["hv1"]), ("virt.init", ["hv2"])]
    assert res["tried"][0]["host"] == "hv1" and answers.NO_ROOM in res["tried"][0]["error"]
    client = SigningClient({"virt.init": {"hv1": OK, "hv2": OK}}, room=full)
    with pytest.raises(publish.Failed, match=answers.NO_ROOM):
        create(opts, client, name="web2", host="hv1", fallback=False)
    assert client.published == [("virt.init", ["hv1"])]


def test_the_snapshot_time_is_the_oldest_record_so_inits_settled_since_still_count(tmp_path):
    """A VM another virt.init settled on hv1 after hv1 pushed is not in hv1's record: its reservation counts."""
    from saltvirt.fleet import fleetstate

    opts = fleet_opts(tmp_path, ["hv1"])
    pushed_at = time.time() - 60
    push(opts, "hv1", cap(mem_total=4096), at=pushed_at)
    fleet = publish.Fleet(opts, publish.config(opts), SigningClient({}))
    hosts, since = capacitypush.capacities(fleet)
    assert since == pytest.approx(pushed_at) and hosts["hv1"]["pushed_at"] == pytest.approx(pushed_at)
    req = placement.make_request(1, 3800)
    with fleetstate.lock(opts, ["other"]) as lease:
        fleetstate.reserve(lease.store, lease, "hv1", "other", req, hosts["hv1"], since)
        fleetstate.finish(lease.store, lease, "settled")

        def settled_after_the_push(old):  # 30 s after hv1 pushed, 30 s ago: long before this call
            entry = dict(old["entries"]["other"], settled_at=pushed_at + 30)
            return {"entries": {"other": entry}}

        lease.store.transact(fleetstate.RESERVATIONS, "hv1", settled_after_the_push)
    client = SigningClient({"virt.init": {"hv1": OK}})
    with pytest.raises(publish.Failed, match="no host can take") as refused:
        create(opts, client, name="web3")
    assert refused.value.details["placement"]["excluded"]["hv1"][0].startswith("memory: needs 512 MiB, 296 MiB free")
    assert client.published == []


def test_max_age_is_checked():
    from salt.exceptions import SaltInvocationError

    assert capacitypush.max_age({}) == 90.0
    assert capacitypush.max_age({"virt": {"capacity_push": {"max_age": "0"}}}) == 0.0
    with pytest.raises(SaltInvocationError, match="virt:capacity_push:max_age must be a number of seconds"):
        capacitypush.max_age({"virt": {"capacity_push": {"max_age": "soon"}}})
    with pytest.raises(SaltInvocationError, match="maxage"):
        capacitypush.max_age({"virt": {"capacity_push": {"maxage": 5}}})
