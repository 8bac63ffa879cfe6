"""_runners/virt_recover.py's continuous balancing functions through Salt's real runner loader (no daemons; the
hypervisors sign their answers, tests/support/signedfleet.py): ``virt.balance`` is a dry run unless told,
``virt.balance_log`` shows the last decisions; ``virt.ha_log`` automatic HA's."""

import time

import pytest

from saltvirt.fleet import balance, fleetstate, ha
from tests.support import fleetfacts, signedfleet


@pytest.fixture
def salt_run(tmp_path, monkeypatch):
    """``(call(fun, **kwargs) -> answer, client, opts)``: ``salt-run <fun>`` as root, balancing enabled."""
    from tests.support.saltloader import make_runners

    client = signedfleet.SigningClient(fleetfacts.answers(fleetfacts.fleet()))
    signedfleet.serve(monkeypatch, client)
    opts = fleetfacts.held(fleetfacts.master(tmp_path), time.time())

    def call(fun, **kwargs):
        runner = make_runners(tmp_path)  # a new job: Salt's loader copies the opts it is given
        runner.opts.update(pki_dir=opts["pki_dir"], cachedir=opts["cachedir"], virt=opts["virt"])
        runner[fun].__globals__["__user__"] = "root"
        return runner[fun](**kwargs)

    return call, client, opts


def test_a_balance_round_is_a_dry_run_unless_told(salt_run):
    call, client, opts = salt_run
    out = call("virt.balance")
    assert (out["dry_run"], out["committed"]) == (True, False) and [m["vm"] for m in out["moves"]] == ["v0"]
    assert [t for f, t in client.published if f == "virt.migrate"] == []
    assert call("virt.balance_log") == {"entries": []}
    out = call("virt.balance", dry_run=False)
    assert (out["dry_run"], out["committed"], sorted(out["moved"])) == (False, True, ["v0"]), out
    assert [t for f, t in client.published if f == "virt.migrate"] == [["hv1"]]
    log = call("virt.balance_log", last=1)["entries"]
    assert [e["decision"] for e in log] == ["moved"]
    assert len(call("virt.balance_log")["entries"]) == len(balance.JOURNAL.history(fleetstate.Store(opts)))


@pytest.mark.parametrize("last", [0, 201, "many"])
def test_balance_log_refuses_a_bad_last(salt_run, last):
    call, _client, _opts = salt_run
    out = call("virt.balance_log", last=last)
    assert out["retcode"] == 1 and out["error"].startswith("last must be")


def test_ha_log_shows_the_last_decisions(salt_run):
    call, _client, opts = salt_run
    assert call("virt.ha_log") == {"entries": []}
    records = [{"at": 1.0 + i, "host": "hv1", "decision": d, "reason": "r"} for i, d in enumerate(("lost", "alert"))]
    ha.JOURNAL.append(fleetstate.Store(opts), records)
    assert call("virt.ha_log", last=1) == {"entries": records[1:]}
    assert call("virt.ha_log")["entries"] == records
    assert call("virt.ha_log", last=0)["retcode"] == 1
