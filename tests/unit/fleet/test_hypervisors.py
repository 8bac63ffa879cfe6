"""Who the hypervisors are (``saltvirt.fleet.hypervisors``): master-side minion ids only; anything a minion
reports about itself is refused unless the operator opts in by name."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import hypervisors


def opts(hv, **virt):
    return {"virt": dict({"hypervisors": hv}, **virt), "nodegroups": {"hvs": "L@hv1,hv2", "bad": "G@os:Debian"}}


@pytest.mark.parametrize(
    ("conf", "want"),
    [
        (["hv1", "hv2"], (["hv1", "hv2"], "list")),
        ("hv*", ("hv*", "glob")),
        ("hv1,hv2", (["hv1", "hv2"], "list")),
        ({"tgt": "^hv\\d$", "tgt_type": "pcre", "timeout": 3}, ("^hv\\d$", "pcre")),
        ({"tgt": "hvs", "tgt_type": "nodegroup"}, ("hvs", "nodegroup")),
        ("hv* and not E@hv9", ("hv* and not E@hv9", "compound")),
    ],
)
def test_id_based_targets(conf, want):
    assert hypervisors.target(opts(conf)) == want


@pytest.mark.parametrize(
    "conf",
    [
        "G@virt_hypervisor:True",
        {"tgt": "hv* or G@virt_hypervisor:True", "tgt_type": "compound"},
        {"tgt": "virt_hypervisor:True", "tgt_type": "grain"},
        {"tgt": "role:hv", "tgt_type": "pillar"},
        "I@role:hv",
        "S@10.0.0.0/8",
        "hv1 or N@bad",
        {"tgt": "bad", "tgt_type": "nodegroup"},
    ],
)
def test_minion_reported_data_is_refused_without_the_opt_in(conf):
    with pytest.raises(SaltInvocationError, match="hypervisors_trust_minion_data"):
        hypervisors.target(opts(conf))


def test_opt_in_must_be_exactly_true():
    conf = {"tgt": "virt_hypervisor:True", "tgt_type": "grain"}
    assert hypervisors.target(opts(conf, hypervisors_trust_minion_data=True)) == ("virt_hypervisor:True", "grain")
    with pytest.raises(SaltInvocationError):
        hypervisors.target(opts(conf, hypervisors_trust_minion_data="yes"))


@pytest.mark.parametrize("conf", [None, [], "", {"timeout": 5}, {"tgt": None}])
def test_nothing_configured_says_what_to_add(conf):
    with pytest.raises(hypervisors.NotConfiguredError) as exc:
        hypervisors.target({"virt": {"hypervisors": conf}} if conf is not None else {})
    assert "virt:\n    hypervisors: [hyper1, hyper2]" in str(exc.value) and "virt_hypervisor grain" in str(exc.value)


def test_match_all_and_garbage_are_refused():
    for conf, msg in (
        ("*", "every minion"),
        ({"tgt": "x", "tgt_type": "nosuch"}, "tgt_type must be"),
        ({"tgt": "x", "tmeout": 1}, "unknown key"),
        (5, "must be a list"),
    ):
        with pytest.raises(SaltInvocationError, match=msg):
            hypervisors.target(opts(conf))


def test_matching_uses_the_id_never_grains():
    spoof = {"virt_hypervisor": True, "id": "hv1", "fqdn": "hv1"}
    assert hypervisors.matches(opts(["hv1"]), "hv1")
    assert not hypervisors.matches(opts(["hv1"]), "tenant", grains=spoof, pillar={"id": "hv1"})
    assert hypervisors.matches(opts("hv*"), "hv7") and not hypervisors.matches(opts("hv*"), "tenant")
    assert hypervisors.matches(opts({"tgt": "^hv\\d$", "tgt_type": "pcre"}), "hv3")
    assert not hypervisors.matches(opts({"tgt": "^hv\\d$", "tgt_type": "pcre"}), "hv33")
    assert hypervisors.members(opts("hv*"), ["hv1", "tenant", "hv2"]) == ["hv1", "hv2"]
    assert hypervisors.waits(opts({"tgt": "hv*", "timeout": 3})) == {"timeout": 3}


def _master_opts(tmp_path, hv):
    import salt.config

    master = salt.config.master_config(None)
    master.update(cachedir=str(tmp_path / "cache"), pki_dir=str(tmp_path / "pki"), virt={"hypervisors": hv})
    return master


@pytest.mark.parametrize(
    ("name", "minion_id", "what"), [("hyper-db1", None, "VM name"), ("db1", "hyper9", "minion id")]
)
def test_a_vm_named_like_a_hypervisor_is_refused(tmp_path, name, minion_id, what):
    """Issue 23 #3: with virt:hypervisors 'hyper*', a VM 'hyper-db1' would be a hypervisor (certificates)."""
    master = _master_opts(tmp_path, "hyper*")
    with pytest.raises(SaltInvocationError) as err:
        hypervisors.refuse_vm_id(master, name, minion_id)
    value = minion_id or name
    assert str(err.value) == hypervisors.VM_ID_REFUSED.format(what=what, value=value)
    hypervisors.refuse_vm_id(master, "db1", "db1")  # anything else passes


def test_a_recorded_vm_id_never_matches(tmp_path):
    """An id the runner pre-accepted for a VM stays out of the hypervisors even when a glob matches it."""
    master = _master_opts(tmp_path, "*-1")
    assert hypervisors.matches(master, "web-1")
    hypervisors.record_vm_id(master, "web-1", "web-1")
    assert not hypervisors.matches(master, "web-1")
    assert hypervisors.members(master, ["web-1", "hv-1"]) == ["hv-1"]
    assert hypervisors.vm_ids(master) == {"web-1"}
