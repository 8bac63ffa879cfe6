"""saltvirt.fleet.vmcreate: the master side of virt.init (the per-VM lock it shares with migrations, the
image size note, the seeded key checked)."""

import hashlib
import time

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import fleetstate, minionkeys, placement, publish, relocate, vmcreate
from saltvirt.pki import answers, envelope
from tests.support.keystore import master_key_store_opts
from tests.support.signedfleet import Bus, SigningClient, fleet_opts, master_opts


def test_one_init_per_name_at_a_time(tmp_path):
    """The runner's lock with the default cache: one call per name on this master, as before."""
    opts = master_opts(tmp_path)
    with fleetstate.lock(opts, ["web1", "web1"], kind="virt.init"):
        with pytest.raises(SaltInvocationError, match="'web1' is held: virt.init by master master"):
            with fleetstate.lock(opts, ["web1"], kind="virt.init"):
                pass
        with fleetstate.lock(opts, ["web2"], kind="virt.init"):  # other names are not blocked
            pass
    with fleetstate.lock(opts, ["web1"], kind="virt.init"):  # released
        pass


def test_migrate_and_evacuate_take_the_init_lock(tmp_path):
    """Two migrations of one VM (or a migration and an init) never overlap: relocate.migrate takes the
    runner's per-VM lock before it asks any hypervisor anything (no client needed to be refused)."""
    opts = master_opts(tmp_path)
    remote = publish.Fleet(opts)
    with fleetstate.lock(opts, ["web1"], kind="virt.migrate"):
        with pytest.raises(SaltInvocationError, match=r"'web1' is held: virt.migrate by master master \(host "):
            relocate.migrate(remote, "web1", "hv2")
        with pytest.raises(SaltInvocationError, match="'web1' is held: virt.migrate by master"):
            vmcreate.create(opts, "web1", {}, None, {}, fleet=remote)


def test_image_note_never_shows_url_credentials():
    mib, note = vmcreate.image_mib({}, "https://alice:s3cret@images.example/web.qcow2")
    assert mib == 0 and note == "size of https://images.example/web.qcow2 unknown on the master: not counted"


def test_a_key_the_hypervisor_did_not_seed_is_taken_back(tmp_path):
    master_opts = master_key_store_opts(tmp_path)
    pub, _priv = envelope.new_keypair()
    fp = hashlib.sha256(pub.encode()).hexdigest()
    key = {"minion_id": "web1", "state": "accepted", "fingerprint": fp}
    minionkeys.preaccept(master_opts, "web1", pub)
    assert vmcreate._check_seeded_key(
        master_opts, key, pub, {"seed": {"backend": "loop"}, "key": {"fingerprint": fp}}
    ) == (key, [])
    cases = [
        ({"seed": None}, "did not seed"),
        ({"seed": {"backend": "loop"}, "key": {"fingerprint": "ab" * 32}}, "seeded another key"),
    ]
    for ret, why in cases:
        if not minionkeys.key_state(master_opts, "web1"):
            minionkeys.preaccept(master_opts, "web1", pub)
        new, warnings = vmcreate._check_seeded_key(master_opts, key, pub, ret)
        assert new["state"] == "removed" and why in warnings[0] and minionkeys.key_state(master_opts, "web1") is None


def test_a_host_that_did_not_answer_init_keeps_its_reservation(tmp_path):
    """Falling over from a hypervisor that did not answer virt.init (it may still create the VM there):
    its room stays reserved for init_timeout, the next host gets its own reservation."""
    opts = master_opts(tmp_path)
    answer = {"status": "up", "host": {"mem_total": 4096, "vcpus_total": 4, "disk_free": 99999}, "vm_info": {}}
    hosts = {"h1": answer, "h2": answer}
    req, pol, since, tried = placement.make_request(1, 512), placement.make_policy(), time.time(), []
    with fleetstate.lock(opts, ["web1"], kind="virt.init") as lease:
        assert vmcreate._reserve(lease, hosts, ["h1", "h2"], 0, "web1", req, pol, since, tried) == 0
        assert vmcreate._reserve(lease, hosts, ["h1", "h2"], 1, "web1", req, pol, since, tried, keep_previous=1800) == 1
        load = fleetstate.reserved(lease.store, hosts, since)
        assert load["h1"]["vms"] == ["web1"] and load["h2"]["vms"] == ["web1"]
        h1 = lease.store.fetch(fleetstate.RESERVATIONS, "h1")["entries"]["web1"]
        assert h1["expires"] > time.time() + 1700
        fleetstate.finish(lease.store, lease, "failed")  # the call fails: only h2's is dropped
    load = fleetstate.reserved(fleetstate.Store(opts), hosts, since)
    assert load["h1"]["vms"] == ["web1"] and load["h2"]["vms"] == [] and tried == []


def test_guest_master_seeds_where_new_minions_find_this_master():
    """virt:guest_master and this master's non-default ports reach the new minion's config; whatever the
    caller gave wins, and Salt's default ports are not written."""
    opts = {"ret_port": 14506, "publish_port": 14505}
    kwargs = vmcreate.guest_master(opts, {"guest_master": "10.0.0.2"}, {"image": "x"})
    assert kwargs == {
        "image": "x",
        "master": "10.0.0.2",
        "minion_config": {"master_port": 14506, "publish_port": 14505},
    }
    given = {"master": "m1", "minion_config": {"master_port": 1, "log_level": "info"}}
    kwargs = vmcreate.guest_master(opts, {"guest_master": "10.0.0.2"}, given)
    assert kwargs == {"master": "m1", "minion_config": {"master_port": 1, "publish_port": 14505, "log_level": "info"}}
    assert given == {"master": "m1", "minion_config": {"master_port": 1, "log_level": "info"}}  # not changed
    assert vmcreate.guest_master({"ret_port": 4506, "publish_port": 4505}, {}, {}) == {}


def test_the_runner_answer_takes_the_vm_info_from_virt_init(tmp_path):
    """virt.init returns the new VM's info: no second round trip to the hypervisor for it (no client
    here: asking would fail), and it is in the answer once."""
    host = {"status": "up", "host": {"mem_total": 4096, "vcpus_total": 4, "disk_free": 99999}, "vm_info": {}}
    plan = placement.rank({"h1": host}, placement.make_request(1, 512), placement.make_policy())
    vm = {"state": "running", "cpu": 1, "mem": 512}
    ans = {"status": "up", "ret": {"name": "web1", "state": "running", "started": True, "vm_info": vm}}
    steps = []
    fleet = publish.Fleet({}, {})
    res = vmcreate._created(
        fleet, "web1", "h1", ans, "j1", plan, [], None, time.monotonic(), lambda s, **d: steps.append(s)
    )
    assert res["vm_info"] == vm and res["init"] == {"name": "web1", "state": "running", "started": True}
    assert steps == ["done"]


def test_timeline_marks_go_only_to_a_callback_that_takes_them():
    marks = []

    def progress(step, **data):
        raise AssertionError("a timeline mark is not an event")

    progress.mark = lambda step, **data: marks.append((step, data))
    vmcreate._mark(progress, "published", host="h1")
    vmcreate._mark(lambda step, **data: None, "published", host="h1")  # a plain callback: nothing
    assert marks == [("published", {"host": "h1"})]


def test_placement_asks_each_hypervisor_its_capacity_only(tmp_path, test_conn):
    """salt-run virt.init places with virt.capacity (node totals, usage, the group index), never
    virt.full_info (every VM's facts); the group index still keeps the group's members apart."""
    from saltvirt.fleet import publish
    from saltvirt.host import capacity

    test_conn.defineXML(
        "<domain type='test'><name>web1</name><memory unit='MiB'>64</memory><metadata>"
        f"<sv:vm xmlns:sv='{capacity.METADATA_NS}'><sv:group>web</sv:group></sv:vm></metadata>"
        "<os><type>hvm</type></os></domain>"
    )
    with_web = capacity.capacity(test_conn, str(tmp_path / "images"))
    test_conn.lookupByName("web1").undefine()
    without = capacity.capacity(test_conn, str(tmp_path / "images"))
    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    ok = {"name": "web2", "started": True, "vm_info": {"state": "running"}}
    client = SigningClient({"virt.capacity": {"hv1": with_web, "hv2": without}, "virt.init": {"hv2": ok}})
    res = vmcreate.create(
        opts,
        "web2",
        placement.make_request(1, 64, group="web"),
        None,
        {},
        policy=placement.make_policy(mem_reserve_mib=0),
        fleet=publish.Fleet(opts, publish.config(opts), client),
        seed=False,
    )
    assert res["host"] == "hv2" and "anti-affinity" in res["placement"]["excluded"]["hv1"][0]
    assert client.published == [("virt.capacity", ["hv1", "hv2"]), ("virt.init", ["hv2"])]


def test_a_hypervisor_without_virt_capacity_is_asked_full_info(tmp_path, test_conn):
    """An older salt-virt on one hypervisor (no virt.capacity): asked virt.full_info, still placed."""
    from saltvirt.fleet import publish
    from saltvirt.host import capacity, query

    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    client = SigningClient(
        {
            "virt.capacity": {"hv1": capacity.capacity(test_conn), "hv2": "'virt.capacity' is not available."},
            "virt.full_info": {"hv2": query.full_info(test_conn)},
        }
    )
    hosts = publish.Fleet(opts, publish.config(opts), client).capacities()
    assert client.published == [("virt.capacity", ["hv1", "hv2"]), ("virt.full_info", ["hv2"])]
    assert {h: a["status"] for h, a in hosts.items()} == {"hv1": "up", "hv2": "up"}
    assert "no_virt" not in hosts["hv2"] and hosts["hv2"]["host"]["mem_total"] == hosts["hv1"]["host"]["mem_total"]


def test_a_host_whose_hypervisor_group_is_full_for_the_tenant_is_passed_over(tmp_path):
    """virt.init's host choice: the tenant's quota of gpu1's hypervisor group (1 VM, taken by g1 there) refuses
    gpu1, the next candidate is reserved; when every candidate is refused so, the refusal is the quota's."""
    from saltvirt.fleet import quota

    opts = master_opts(tmp_path)
    groups = {"gpu": {"hypervisors": ["gpu*"], "quota": {"vms": 1}}}
    facts = {"mem_total": 16384, "mem_used_by_vms": 64, "vcpus_total": 8, "vcpus_used_by_vms": 1}
    facts.update(disk_free=102400, images_dir="/srv/salt-images", vms_defined=1)
    g1 = {"cpu": 1, "mem": 64, "state": "running", "owner": {"tenant": "acme", "creator": "alice"}}
    fleet_vms = {
        "gpu1": {"status": "up", "host": facts, "vm_info": {"g1": g1}},
        "hv2": {"status": "up", "host": facts, "vm_info": {}},
    }
    policy, req = placement.make_policy(), placement.make_request(1, 64)
    since = time.time()
    with fleetstate.lock(opts, ["web1"]) as lease:
        quota.reserve(lease.store, lease, "acme", "web1", req, fleet_vms, since, {})

        def place(hv):
            quota.place(lease.store, lease, hv, fleet_vms, since, groups)

        tried = []
        pos = vmcreate._reserve(lease, fleet_vms, ["gpu1", "hv2"], 0, "web1", req, policy, since, tried, place=place)
        assert pos == 1 and [t["outcome"] for t in tried] == ["quota"], tried
        assert (
            tried[0]["error"]
            == "tenant acme on hypervisor group gpu: 1 of 1 VMs used, asked 1: no room for web1 on gpu1"
        )
        tried = []
        assert vmcreate._reserve(lease, fleet_vms, ["gpu1"], 0, "web1", req, policy, since, tried, place=place) is None
        err = vmcreate._no_room("web1", {"reason": "", "ranking": [], "excluded": {}}, tried)
        assert str(err) == f"no host can take web1 any more: {tried[0]['error']}"
        # a group already full is left out of placement, with its reason (run G: the tie-break put gpu1 first,
        # so the answer listed a refused attempt)
        full = quota.full(lease.store, lease, ["gpu1", "hv2"], fleet_vms, since, groups)
        assert full == {"gpu1": ["tenant acme on hypervisor group gpu: 1 of 1 VMs used, asked 1"]}
        plan = placement.rank(fleet_vms, req, policy, exclude=full)
        assert [r["host"] for r in plan["ranking"]] == ["hv2"] and plan["excluded"] == full, plan


def test_the_tenant_quota_counts_every_disk_the_vm_gets(tmp_path):
    """virt.init takes from the tenant's disk quota the image and the new disks (the runner's ``disk_mib``),
    while placement keeps its own request; a request over the disk quota is refused before placement."""
    from saltvirt.fleet import publish, quota

    opts = fleet_opts(tmp_path, ["hv1"])
    client = SigningClient({"virt.full_info": {"hv1": {"vm_info": {}}}})
    cfg, req = publish.config(opts), placement.make_request(1, 64, 2048)
    tenant = {"name": "acme", "quota": {"disk": 12288}, "groups": {}, "allowed": lambda h: True, "disk_mib": 12288}
    since = time.time()
    with fleetstate.lock(opts, ["web1"]) as lease:
        vmcreate._tenant_quota(publish.Fleet(opts, cfg, client), lease, tenant, "web1", req, {"hv1": {}}, since)
        entry = lease.store.fetch(quota.QUOTAS, "acme")["entries"]["web1"]
        assert entry["disk_mib"] == 12288 and req["disk_mib"] == 2048
    with fleetstate.lock(opts, ["web2"]) as lease, pytest.raises(quota.QuotaError) as err:
        fleet = publish.Fleet(opts, cfg, client)
        vmcreate._tenant_quota(fleet, lease, dict(tenant, disk_mib=1), "web2", req, {"hv1": {}}, since)
    assert str(err.value).startswith("tenant acme: 12288 of 12288 MiB disk used, asked 1: no room for web2")


# the shared store (redis) dying while virt.init runs ---------------------------------------------------
class _StoreDiesClient(SigningClient):
    """Publishes as SigningClient; redis crashes (connection refused from then on) once ``crash_on`` is
    published; virt.init's answer comes (``answers``) or never does (hv1 still works on it, and says so)."""

    def __init__(self, answers, server, crash_on="virt.init"):
        super().__init__(answers, busy={"hv1"})
        self.server, self.waited, self.crash_on = server, 0, crash_on
        self.event.get_event = self._look
        self._give_up = None

    def run_job(self, tgt, fun, arg, tgt_type, **kwargs):
        pub = super().run_job(tgt, fun, arg, tgt_type, **kwargs)
        if kwargs["kwarg"]["fun"] == self.crash_on:
            self.server.crash()
            if "virt.init" not in self.answers:  # a wait the lost lease does not stop fails, never hangs
                self._give_up = time.monotonic() + 60
        return pub

    def _look(self, tag="", **kw):
        if self._give_up is not None:
            self.waited += 1
            if time.monotonic() > self._give_up:
                raise AssertionError("virt.init's wait went on after its lock was lost")
        return Bus.get_event(self.event, tag, **kw)


@pytest.fixture
def dying_redis(tmp_path):
    """Fleet opts (hv1) on a redis-server of this test only (it is crashed here); lock_ttl 1 s."""
    from tests.support.redis_server import RedisServer

    server = RedisServer().start()
    opts = fleet_opts(tmp_path, ["hv1"])
    opts.update(server.master_opts())
    opts["virt"]["shared"] = {"lock_ttl": 1}
    yield opts, server
    server.stop()


def _init_on_hv1(opts, client):
    from saltvirt.fleet import publish

    return vmcreate.create(
        opts,
        "web2",
        placement.make_request(1, 64),
        None,
        {},
        policy=placement.make_policy(mem_reserve_mib=0),
        fleet=publish.Fleet(opts, publish.config(opts), client),
        seed=False,
    )


HV1 = {"host": {"mem_total": 4096, "vcpus_total": 4, "disk_free": 99999}, "vm_info": {}}


def test_the_store_lost_while_init_runs_stops_the_wait_and_says_where_to_look(dying_redis):
    """redis dies once virt.init is published and its answer is slow: the wait stops once the lock could not
    be renewed for lock_ttl (another master may take the name then), with redis's error and where the job
    may still create the VM, instead of waiting init_timeout (1800 s) for it."""
    opts, server = dying_redis
    client = _StoreDiesClient({"virt.capacity": {"hv1": HV1}}, server)
    with pytest.raises(CommandExecutionError) as err:
        _init_on_hv1(opts, client)
    msg = str(err.value)
    jid = err.value.details["tried"][-1]["jid"]
    assert msg.startswith(f"stopped waiting for virt.init of web2 on hv1 (job {jid}): the lock of 'web2' could not"), (
        msg
    )
    assert f"redis (127.0.0.1:{server.port}))" in msg and "Check the master's cache: setting" in msg, msg
    assert f"salt-run jobs.lookup_jid {jid}" in msg and "salt-run virt.purge web2" in msg, msg
    assert client.waited and err.value.details["tried"][-1]["outcome"] == "unknown"


def test_an_init_done_while_the_store_is_down_is_reported_with_a_warning(dying_redis):
    """The hypervisor creates the VM while redis is down: the VM is reported (not turned into an error
    because its reservation could not be settled), with a warning that the entry expires by itself."""
    opts, server = dying_redis
    ok = {"name": "web2", "started": True, "vm_info": {"state": "running"}}
    res = _init_on_hv1(opts, _StoreDiesClient({"virt.capacity": {"hv1": HV1}, "virt.init": {"hv1": ok}}, server))
    assert res["host"] == "hv1" and res["vm_info"] == {"state": "running"}
    (warning,) = res["warnings"]
    assert warning.startswith("its capacity reservation could not be marked settled in the shared runner state")
    assert "Connection refused" in warning and "expires by itself within virt:shared:lock_ttl, 1 s" in warning


def test_the_store_lost_before_placing_stops_init_with_nothing_created(dying_redis):
    """redis dies while the capacity query runs: the next store read (the in-flight reservations) fails
    before any host is reserved, and virt.init stops with the same message as a lost lock, naming redis."""
    opts, server = dying_redis
    client = _StoreDiesClient({"virt.capacity": {"hv1": HV1}}, server, crash_on="virt.capacity")
    with pytest.raises(CommandExecutionError) as err:
        _init_on_hv1(opts, client)
    msg = str(err.value)
    assert msg.startswith("virt.init of web2 stopped before placing it, nothing was created: the shared runner"), msg
    assert f"redis (127.0.0.1:{server.port})) cannot be read" in msg and "Check the master's cache" in msg, msg
    assert client.published == [("virt.capacity", ["hv1"])]


# the fleet view: a per-call tgt narrows where a VM goes, never which VMs count ---------------------------
def _host(mem_total=4096, vms=None):
    """One hypervisor's answer, for virt.capacity and virt.full_info alike (the owner is in both)."""
    return {"host": {"mem_total": mem_total, "vcpus_total": 4, "disk_free": 99999}, "vm_info": vms or {}}


def _vm(tenant, cpu=1):
    return {"cpu": cpu, "mem": 64, "state": "running", "owner": {"tenant": tenant, "creator": "u"}}


ACME = {"name": "acme", "quota": {"vcpus": 2}, "groups": {}, "allowed": lambda h: True}
CREATED = {"started": True, "vm_info": {"state": "running"}}


def _fleet(first, second=None):
    """The answers of hv1 and hv2 (None: it does not answer) to the queries, and virt.init on both."""
    hosts = {h: a for h, a in (("hv1", first), ("hv2", second)) if a is not None}
    return {"virt.capacity": hosts, "virt.full_info": hosts, "virt.init": {"hv1": CREATED, "hv2": CREATED}}


def _init(opts, client, name, tgt=None, **kwargs):
    from saltvirt.fleet import publish

    return vmcreate.create(
        opts,
        name,
        placement.make_request(1, 64),
        None,
        {},
        policy=placement.make_policy(mem_reserve_mib=0),
        fleet=publish.Fleet(opts, publish.config(opts, tgt=tgt), client),
        seed=False,
        **kwargs,
    )


def test_a_tenants_tgt_never_hides_its_vms_elsewhere_from_its_quota(tmp_path):
    """acme (2 vCPUs) has a1 (2 vCPUs) on hv2: virt.init tgt=hv1 counts it all the same; with room, tgt=hv1
    still decides where the VM goes (hv2, with more memory, would win the placement)."""
    from saltvirt.fleet import quota

    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    client = SigningClient(_fleet(_host(), _host(65536, {"a1": _vm("acme", 2)})))
    with pytest.raises(quota.QuotaError) as err:
        _init(opts, client, "web2", tgt="hv1", tenant=ACME)
    assert str(err.value).startswith("tenant acme: 2 of 2 vCPUs used, asked 1: no room for web2"), str(err.value)
    assert [fun for fun, _ in client.published] == ["virt.capacity", "virt.full_info"]
    res = _init(opts, client, "web2", tgt="hv1", tenant=dict(ACME, quota={"vcpus": 3}))
    assert res["host"] == "hv1" and [h["host"] for h in res["placement"]["ranking"]] == ["hv1"]
    assert client.published[-3:] == [
        ("virt.capacity", ["hv1", "hv2"]),
        ("virt.full_info", ["hv1", "hv2"]),
        ("virt.init", ["hv1"]),
    ]
    with pytest.raises(CommandExecutionError, match="^hv2 is not a candidate for web3: this call's tgt .or the"):
        _init(opts, client, "web3", tgt="hv1", host="hv2")


@pytest.mark.parametrize("tenant", [None, ACME], ids=["operator", "tenant"])
def test_a_name_defined_outside_tgt_is_refused(tmp_path, tenant):
    """beta's web2 is on hv2: virt.init web2 tgt=hv1 (a tenant's or an operator's) refuses the name."""
    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    client = SigningClient(_fleet(_host(), _host(vms={"web2": _vm("beta")})))
    with pytest.raises(CommandExecutionError) as err:
        _init(opts, client, "web2", tgt="hv1", tenant=tenant)
    assert str(err.value) == "a VM named 'web2' already exists on hv2: pick another name or purge it"
    assert client.published == [("virt.capacity", ["hv1", "hv2"])]


def _ledger_a9_on_hv2(opts):
    """acme's ledger: a9, created on hv2 (settled)."""
    from saltvirt.fleet import quota

    store = fleetstate.Store(opts)
    a9 = {"cpu": 1, "mem": 64, "disk_mib": 0, "state": "settled", "settled_at": time.time() - 600, "host": "hv2"}
    store.transact(quota.QUOTAS, "acme", lambda _old: {"entries": {"a9": a9}})
    return lambda: store.fetch(quota.QUOTAS, "acme")["entries"]


def test_a_silent_hypervisor_keeps_the_ledger_and_no_tenant_name_is_admitted(tmp_path):
    """hv2 does not answer: a tenant's virt.init tgt=hv1 cannot tell which names are free (a9, the ledger's VM
    on hv2, nor any other), so it is refused with the hosts to wait for; acme's ledger keeps a9."""
    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    ledger = _ledger_a9_on_hv2(opts)
    client = SigningClient(_fleet(_host()))
    for name in ("a9", "web3"):
        with pytest.raises(CommandExecutionError) as err:
            _init(opts, client, name, tgt="hv1", tenant=ACME)
        assert str(err.value) == (
            f"cannot tell whether a VM named {name!r} exists: hv2 (down) did not answer and may have one; "
            f"retry virt.init of {name} when it answers"
        ), str(err.value)
        assert err.value.details["down"] == ["hv2"]
    assert "virt.init" not in [fun for fun, _ in client.published]
    assert sorted(ledger()) == ["a9"] and ledger()["a9"]["state"] == "settled"


def test_a_silent_hypervisor_and_an_operator(tmp_path):
    """hv2 does not answer: an operator's virt.init of a9 (acme's ledger has it: it may be on hv2) is refused;
    another name goes on with a warning, and one for acme (its quota: a9 counts) keeps a9 in the ledger."""
    from saltvirt.fleet import quota

    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    ledger = _ledger_a9_on_hv2(opts)
    client = SigningClient(_fleet(_host()))
    with pytest.raises(CommandExecutionError) as err:
        _init(opts, client, "a9", operator=True)
    assert str(err.value) == (
        "cannot tell whether a VM named 'a9' exists: hv2 (down) did not answer and may have one (tenant acme's "
        "quota ledger has it); retry virt.init of a9 when it answers"
    ), str(err.value)
    res = _init(opts, client, "op1", operator=True)
    assert res["host"] == "hv1" and res["warnings"] == [
        "hv2 (down) did not answer: a VM named 'op1' there was not seen (no tenant's quota ledger has one)"
    ]
    with pytest.raises(quota.QuotaError, match="^tenant acme: 1 of 1 vCPUs used, asked 1: no room for op2"):
        _init(opts, client, "op2", tgt="hv1", tenant=dict(ACME, quota={"vcpus": 1}), operator=True)
    assert _init(opts, client, "op3", tgt="hv1", tenant=ACME, operator=True)["host"] == "hv1"
    assert sorted(ledger()) == ["a9", "op3"] and ledger()["a9"]["state"] == "settled"


def test_a_tenant_is_told_a_name_is_taken_never_whose_or_where(tmp_path, test_conn):
    """A tenant caller (``private``) asking for a name a VM on any hypervisor (another tenant's, on a hypervisor
    not its own), a minion key or another call's lock has gets one refusal, without the hypervisor or the
    holder (issue 34 #7); an operator keeps the details."""
    from saltvirt.fleet import publish, tenants
    from saltvirt.host import capacity

    test_conn.defineXML(
        "<domain type='test'><name>theirs1</name><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>"
    )
    try:
        with_theirs = capacity.capacity(test_conn, str(tmp_path / "images"))
    finally:
        test_conn.lookupByName("theirs1").undefine()
    opts = fleet_opts(tmp_path, ["hv1", "hv2"])
    empty = {"host": with_theirs["host"], "vm_info": {}}
    client = SigningClient({"virt.capacity": {"hv1": with_theirs, "hv2": empty}})
    minionkeys.preaccept(opts, "keyed1", envelope.new_keypair()[0])

    def init(name, private):
        return vmcreate.create(
            opts,
            name,
            placement.make_request(1, 64),
            "salt://images/tiny.qcow2",
            {},
            policy=placement.make_policy(mem_reserve_mib=0),
            fleet=publish.Fleet(opts, publish.config(opts), client),
            private=private,
        )

    with fleetstate.lock(opts, ["busy1"], kind="virt.migrate"):
        for name in ("theirs1", "keyed1", "busy1"):
            with pytest.raises(SaltInvocationError) as refused:
                init(name, private=True)
            assert str(refused.value) == tenants.name_taken(name) == f"the name {name} is taken: pick another name"
        with pytest.raises(vmcreate.NameTaken, match="a VM named 'theirs1' already exists on hv1: pick another"):
            init("theirs1", private=False)
        with pytest.raises(minionkeys.KeyExistsError, match="already has a accepted key for 'keyed1'"):
            init("keyed1", private=False)
        with pytest.raises(fleetstate.HeldError, match="'busy1' is held: virt.migrate by master master"):
            init("busy1", private=False)
    assert minionkeys.key_state(opts, "theirs1") is None and minionkeys.key_state(opts, "busy1") is None


class _GoneClient(SigningClient):
    """Hypervisors in ``gone`` answer job checks "not running" (signed), as a real one does once the job
    ended, died, or was fenced before it started."""

    def __init__(self, answers_by_fun, gone=()):
        super().__init__(answers_by_fun)
        self.gone = set(gone)

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        pub = super().run_job(tgt, fun, arg, tgt_type, timeout, kwarg, listen, jid)
        if kwarg["fun"] == answers.JOB_CHECK:
            for mid in set(tgt) & self.gone:
                self.reply(pub["jid"], mid, kwarg, {})
        return pub


@pytest.mark.parametrize(
    ("gone", "was_up", "defined", "why"),
    [
        (False, True, [], "hv1 stopped answering while it ran virt.init of web1, and may still create it"),
        (False, False, [], ""),  # down for the query too: the publication did not reach it
        (True, True, [], ""),  # its job is fenced there and web1 is not defined: the next host may go
        (True, True, ["web1"], "virt.init of web1 ended on hv1 without an answer, and web1 is defined there"),
        (True, True, None, "virt.init of web1 ended on hv1 without an answer, and hv1 did not say whether"),
    ],
)
def test_an_init_falls_over_only_when_it_cannot_create_the_vm_where_it_ran(tmp_path, gone, was_up, defined, why):
    """A run that left 'fall1' defined on two hypervisors (CI): the runner fell over from a host whose job
    it had given up on while that job went on. It falls over only when that job can no longer create the VM."""
    opts = fleet_opts(tmp_path, ["hv1"])
    cfg = publish.config(opts)
    client = _GoneClient(
        {"virt.list_domains": {"hv1": defined}} if defined is not None else {}, gone=["hv1"] if gone else []
    )
    fleet = publish.Fleet(opts, cfg, client)
    ans, jid = fleet.call("hv1", "virt.init", ["web1", 1, 128], {})
    assert ans["status"] == "down" and ans["gone"] is gone, ans
    hosts = {"hv1": {"status": "up" if was_up else "down"}}
    reason = vmcreate._still_may_create(fleet, "hv1", hosts, ans, "web1")
    assert reason.startswith(why) and bool(reason) is bool(why), reason
    err = vmcreate._attempt_failed("web1", "hv1", ans, jid, cfg, "web1", [], reason)
    assert not reason or "no other hypervisor was tried, so that web1 never runs twice" in str(err)
