"""saltvirt.fleet.tenants: virt:tenants / virt:operators checked; what a tenant may pass to virt.init."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import tenants

CONF = {
    "virt": {
        "tenants": {
            "acme": {
                "members": ["alice"],
                "quota": {"vcpus": 4, "mem": 2048, "vms": 2},
                "images": ["debian12"],
                "networks": ["tenantnet"],
                "pools": ["acme-pool"],
                "hypervisors": ["hyper1", "rack2-*"],
            },
            "empty": None,
        }
    }
}


def test_config_defaults_and_values():
    conf = tenants.config(CONF)
    acme = conf["tenants"]["acme"]
    assert acme["quota"] == {"vcpus": 4, "mem": 2048, "vms": 2}
    assert acme["profiles"] == ["default"]
    assert conf["tenants"]["empty"] == {
        "members": [],
        "quota": {},
        "images": [],
        "profiles": ["default"],
        "networks": [],
        "pools": [],
        "hypervisors": ["*"],
        "groups": {},
    }
    assert tenants.config({})["tenants"] == {}


def test_quotas_per_hypervisor_group():
    virt = {
        "hypervisor_groups": {"gpu": ["gpu*"], "ssd": ["hyper1", "gpu2"]},
        "tenants": {"acme": {"quota": {"vcpus": 8}, "group_quotas": {"gpu": {"vcpus": 2, "vms": 1}}}},
    }
    acme = tenants.config({"virt": virt})["tenants"]["acme"]
    assert acme["groups"] == {"gpu": {"hypervisors": ["gpu*"], "quota": {"vcpus": 2, "vms": 1}}}
    assert tenants.in_groups(acme["groups"], "gpu2") == ["gpu"] and tenants.in_groups(acme["groups"], "hyper1") == []
    virt["tenants"]["acme"]["group_quotas"] = {"fast": {"vcpus": 1}}
    with pytest.raises(
        SaltInvocationError, match=r"group_quotas: fast is no group of virt:hypervisor_groups \(known: gpu, ssd\)"
    ):
        tenants.config({"virt": virt})
    virt["tenants"]["acme"]["group_quotas"] = {"gpu": {"cpus": 1}}
    with pytest.raises(SaltInvocationError, match="group_quotas:gpu: unknown key"):
        tenants.config({"virt": virt})


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"a": {"quota": {"cpus": 1}}}, "unknown key.*cpus"),
        ({"a": {"quota": {"vcpus": -1}}}, "must be >= 0"),
        ({"a": {"quota": {"vcpus": "many"}}}, "whole number"),
        ({"a": {"member": ["x"]}}, "unknown key.*member"),
        ({"a": {"members": "x", "images": [3]}}, "list of names"),
        ({"a/b": {}}, "tenant"),
        (["a"], "must be a mapping"),
    ],
)
def test_config_errors(bad, match):
    with pytest.raises(SaltInvocationError, match=match):
        tenants.config({"virt": {"tenants": bad}})


def test_matches_users_and_groups():
    assert tenants.matches(["alice", "devs%"], "alice")
    assert tenants.matches(["alice", "devs%"], "carol", ("devs",))
    assert not tenants.matches(["alice", "devs%"], "devs")  # a user named like the group is not the group


def test_hosts():
    acme = tenants.tenant(CONF, "acme")
    assert tenants.host_allowed(acme, "rack2-h3") and not tenants.host_allowed(acme, "hyper2")
    with pytest.raises(SaltInvocationError, match="no tenant named 'nope'"):
        tenants.tenant(CONF, "nope")


def test_check_init_allows_what_the_operator_gave():
    acme = tenants.tenant(CONF, "acme")
    tenants.check_init(
        acme,
        "acme",
        {
            "interfaces": [{"name": "eth0", "network": "tenantnet"}],
            "disks": [{"name": "data", "size": 64, "pool": "acme-pool"}],
            "host": "hyper1",
            "start": False,
        },
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"boot": {"kernel": "/etc/shadow"}}, "may not pass boot to virt.init"),
        ({"trusted_image": True, "minion_config": {}}, "may not pass minion_config, trusted_image"),
        ({"nic": "uplink"}, "may not use nic profile 'uplink' \\(allowed: default\\)"),
        ({"interfaces": [{"name": "eth0", "bridge": "br-mgmt"}]}, "may not use network 'br-mgmt'"),
        ({"disks": [{"name": "d", "path": "/dev/sda"}]}, "may not set path in disks"),
        ({"disks": [{"name": "d", "size": 1, "pool": "other"}]}, "may not use pool 'other'"),
        ({"host": "hyper2"}, "may not use hypervisor 'hyper2' \\(allowed: hyper1, rack2-\\*\\)"),
    ],
)
def test_check_init_refusals(kwargs, match):
    with pytest.raises(SaltInvocationError, match=match):
        tenants.check_init(tenants.tenant(CONF, "acme"), "acme", kwargs)


def test_locate_as_a_tenant_sees_it():
    from saltvirt.fleet import callers, publish

    alice = callers.Caller("alice", False, "acme")
    ops = callers.Caller("root", True)
    hosts = {
        "hyper1": {"status": "up", "vm_info": {"web1": {"owner": {"tenant": "acme"}}}},
        "hyper2": {"status": "down", "error": "no answer"},
    }
    assert tenants.locate(hosts, "web1", alice) == tenants.locate(hosts, "web1", ops) == "hyper1"
    with pytest.raises(publish.Failed, match=r"^no VM named db1 in tenant acme \(these hypervisors did not answer: "):
        tenants.locate(hosts, "db1", alice)
    with pytest.raises(publish.Failed, match="^VM 'db1' is not defined on any hypervisor that answered"):
        tenants.locate(hosts, "db1", ops)  # an operator gets the fleet's own wording


def test_a_tenant_cannot_tell_another_tenants_vm_from_none():
    """What a tenant's start/stop/purge/vm_info/migrate/update find (``visible`` then ``locate``): another tenant's
    VM, asked with or without its hypervisor, gets the refusal of a name nobody has, naming no hypervisor."""
    from saltvirt.fleet import callers, publish

    alice = callers.Caller("alice", False, "acme")
    fleet = {
        "hyper1": {"status": "up", "vm_info": {"web1": {"owner": {"tenant": "acme"}}}},
        "hyper9": {"status": "up", "vm_info": {"db9": {"owner": {"tenant": "beta"}}}},  # not one of acme's
        "rack2-1": {"status": "up", "vm_info": {"db2": {"owner": {"tenant": "beta"}}}},  # one of acme's too
    }
    seen = tenants.visible(fleet, alice, tenants.config(CONF))
    assert sorted(seen) == ["hyper1", "rack2-1"] and seen["rack2-1"]["vm_info"] == {}
    for name, host in [("db9", None), ("db9", "hyper9"), ("db2", None), ("db2", "rack2-1"), ("nothere", None)]:
        with pytest.raises(publish.Failed) as refused:
            tenants.locate(seen, name, alice, host)
        assert str(refused.value) == tenants.missing(name, alice) == f"no VM named {name} in tenant acme"
