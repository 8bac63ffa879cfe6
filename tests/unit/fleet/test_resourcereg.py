"""saltvirt.fleet.resourcereg: a hypervisor decided down drops out of Salt's real resource registry (an mmap index
in the master's cachedir) and its resources' grains out of the cache; it is asked to register again when it signs
a reply. Also what Salt 3008.5's registry does with a UUID two minions register one after the other (a migration),
which the hypervisor's Refresher works around (saltvirt.host.vmresources)."""

import pytest
import salt.cache
import salt.utils.resource_registry as registry

from saltvirt.fleet import publish as fleet
from saltvirt.fleet import resourcereg
from tests.support.paths import SMALL_REGISTRY
from tests.unit.fleet.test_replies import _Fleet

U1, U2, U3 = (f"3f0c6a52-1d8e-4c55-9a0b-51d0c3f1a00{i}" for i in (1, 2, 3))
GRAINS = registry.RESOURCE_GRAINS_BANK


@pytest.fixture
def opts(tmp_path):
    registry.reset_registry()
    yield {"cachedir": str(tmp_path / "cache"), "minion_data_cache": True, "cache": "localfs", **SMALL_REGISTRY}
    registry.reset_registry()


def registered(opts, minion, *uuids):
    registry.get_registry(opts).register_minion(minion, {"virt_vm": list(uuids)})
    for uuid in uuids:
        salt.cache.factory(opts).store(GRAINS, f"virt_vm:{uuid}", {"hypervisor": minion})


def held(opts, minion):
    return registry.get_registry(opts).get_resources_for_minion(minion)


def test_a_minion_decided_down_drops_out_with_its_grains_and_the_others_stay(opts):
    registered(opts, "hv1", U1, U2)
    registered(opts, "hv2", U3)
    assert resourcereg.drop(opts, "hv1", "silent") == 2
    assert held(opts, "hv1") == {} and held(opts, "hv2") == {"virt_vm": [U3]}
    assert registry.get_registry(opts).get_managing_minions_for_srn("virt_vm", U1) == []
    assert sorted(salt.cache.factory(opts).list(GRAINS)) == [f"virt_vm:{U3}"]
    assert resourcereg.drop(opts, "hv1", "silent") == 0  # nothing left: nothing to do


def test_a_minion_with_nothing_registered_is_not_marked(opts):
    class Client:
        def run_job(self, *args, **kwargs):
            raise AssertionError("asked to register again, but nothing was dropped")

    assert resourcereg.drop(opts, "hv3", "silent") == 0
    assert resourcereg.restore(opts, Client(), "hv3") is False


@pytest.mark.parametrize("minion", ["../x", "", ".hidden", None])
def test_odd_minion_ids_never_make_a_path(opts, minion):
    assert resourcereg._mark(opts, minion) is None


class _Refreshing(_Fleet):
    """The fleet of test_replies.py, recording the ``saltutil.refresh_resources`` jobs the runner publishes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.refreshed = []

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        if fun == resourcereg.REFRESH:
            self.refreshed.append(list(tgt))
            return {"jid": "1", "minions": list(tgt)}
        return super().run_job(tgt, fun, arg, tgt_type, timeout=timeout, kwarg=kwarg, listen=listen, jid=jid)


def test_a_silent_hypervisor_drops_out_and_is_asked_to_register_again_once_it_answers(tmp_path):
    fleet_ = _Refreshing(tmp_path, {"hv1": {"a": 1}, "hv3": {"c": 3}}, silent={"hv2"})
    opts = fleet_.opts
    registry.reset_registry()
    registered(opts, "hv2", U1)
    registered(opts, "hv1", U2)
    cfg = fleet.config(opts, timeout=0.05, gather_job_timeout=0.05, down_after=0.3)
    got, _jid = fleet.Fleet(opts, cfg, fleet_).run("virt.full_info")
    assert got["hv2"]["status"] == "down", got
    assert held(opts, "hv2") == {} and held(opts, "hv1") == {"virt_vm": [U2]}
    assert fleet_.refreshed == []
    fleet_.answers_["hv2"] = {"b": 2}  # back: it signs its reply
    fleet_.answers["virt.full_info"] = fleet_.answers_
    got, _jid = fleet.Fleet(opts, cfg, fleet_).run("virt.full_info")
    assert got["hv2"]["status"] == "up" and fleet_.refreshed == [["hv2"]], got
    fleet.Fleet(opts, cfg, fleet_).run("virt.full_info")
    assert fleet_.refreshed == [["hv2"]]  # once
    registry.reset_registry()


# Salt 3008.5's registry and a migration -----------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["source first", "destination first"])
def test_a_uuid_registered_by_two_minions_one_after_the_other_ends_up_the_destinations(opts, order):
    reg = registry.get_registry(opts)
    reg.register_minion("hvA", {"virt_vm": [U1, U2]})
    steps = [("hvA", [U2]), ("hvB", [U1])]  # the source without it, the destination with it
    for minion, uuids in steps if order == "source first" else reversed(steps):
        reg.register_minion(minion, {"virt_vm": uuids})
    assert reg.get_managing_minions_for_srn("virt_vm", U1) == ["hvB"]
    assert held(opts, "hvA") == {"virt_vm": [U2]}


def test_two_registrations_landing_together_lose_the_uuid_until_the_destination_registers_again(opts, monkeypatch):
    """Two master workers (two registries over one index file): the source's worker still sees its old view of
    the index (re-read at most every STALENESS_CHECK_INTERVAL s, 0.25 s; made long here so that the test does not
    depend on timing) and deletes the UUID the destination's worker just put (register_minion deletes the ids it
    believes the minion had, whoever holds them now). The destination's second
    registration (the Refresher's, after a migration in) brings it back."""
    monkeypatch.setattr(registry, "STALENESS_CHECK_INTERVAL", 3600)
    source_worker = registry.ResourceRegistry(opts)
    destination_worker = registry.ResourceRegistry(opts)
    try:
        source_worker.register_minion("hvA", {"virt_vm": [U1]})
        # the source's worker reads its view just before the destination's put lands (its own registration
        # reading the previous set, or any targeting it serves), then writes
        assert source_worker.get_resources_for_minion("hvA") == {"virt_vm": [U1]}
        destination_worker.register_minion("hvB", {"virt_vm": [U1]})
        source_worker.register_minion("hvA", {"virt_vm": []})
        assert destination_worker.get_managing_minions_for_srn("virt_vm", U1) == []  # lost
        destination_worker.register_minion("hvB", {"virt_vm": [U1]})
        assert source_worker.get_managing_minions_for_srn("virt_vm", U1) == ["hvB"]
    finally:
        source_worker.close()
        destination_worker.close()
