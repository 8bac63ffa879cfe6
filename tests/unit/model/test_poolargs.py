"""saltvirt.model.poolargs: the storage pool arguments declared once, and the coverage test (as virtinst's
test_checkprops.py): every signature is the table, and every declared argument travels through the real
loaders (virt.pool_define, the virt.pool_defined state with Salt's source mapping) into libvirt's definition
on the test driver, where the reader finds what the spec asked for."""

import inspect

import libvirt
import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.host import netpool
from saltvirt.model import poolargs
from saltvirt.xml import poolxml
from tests.support.argtables import signature_mismatches
from tests.support.saltloader import load_states, make_minion_mods

ADAPTER = {"type": "scsi_host", "name": "host9"}
AUTH = {"type": "ceph", "username": "admin", "secret": {"type": "usage", "value": "pool_pa-auth"}}
# a value of every argument, and what else the pool needs for it
EXAMPLES = {
    "ptype": ("logical", {"source_devices": [{"path": "/dev/vd-pa"}]}),
    "target": ("/srv/pa-pools/t", {}),
    "permissions": ({"mode": "0770", "owner": 1000, "group": 100}, {"target": "/srv/pa-pools/p"}),
    "source_devices": ([{"path": "/dev/vd-pa"}], {"ptype": "fs", "target": "/srv/pa-pools/d"}),
    "source_dir": ("/export/pa", {"ptype": "netfs", "target": "/srv/pa-pools/n", "source_hosts": ["nfs.example"]}),
    "source_initiator": ("iqn.2013-06.com.example:pa", {"ptype": "iscsi-direct", "source_hosts": ["iscsi.example"],
                         "source_devices": [{"path": "iqn.2013-06.com.example:target"}]}),
    "source_adapter": (ADAPTER, {"ptype": "scsi", "target": "/dev/disk/by-path"}),
    "source_hosts": (["nfs.example"], {"ptype": "netfs", "target": "/srv/pa-pools/h", "source_dir": "/export"}),
    "source_auth": (AUTH, {"ptype": "rbd", "source_hosts": ["ceph.example"], "source_name": "rbd"}),
    "source_name": ("vg_pa", {"ptype": "logical", "source_devices": [{"path": "/dev/vd-pa"}]}),
    "source_format": ("ext4", {"ptype": "fs", "target": "/srv/pa-pools/f", "source_devices": [{"path": "/dev/vd-pa"}]}),
}  # fmt: skip


@pytest.fixture(scope="module")
def virt(tmp_path_factory):
    """An operator who made every source available (the limits are tests/unit/storage/test_poolcalls.py's)."""
    conn = libvirt.open("test:///default")  # test:///default keeps its pools while a connection is open
    everything = {"devices": ["*"], "names": ["*"], "hosts": ["*"], "adapters": ["*"]}
    tmp = tmp_path_factory.mktemp("poolargs")
    yield make_minion_mods(tmp, "test:///default", pool_paths=["/srv/pa-pools", "/dev"], pool_sources=everything)
    conn.close()


TABLE = {a.name: a.default for a in poolargs.ARGS} | {"name": inspect.Parameter.empty, "source": None}


@pytest.mark.parametrize("fun", sorted(poolargs.CALLS))
def test_function_signatures_are_the_table(virt, fun):
    names = ["name", *poolargs.NAMES, *poolargs.CALLS[fun]]
    assert signature_mismatches(virt[fun], names, TABLE | poolargs.CALLS[fun], var_keyword=True) == []


@pytest.mark.parametrize("fun", poolargs.STATES)
def test_state_signatures_are_the_table(virt, fun):
    names = ["name", *poolargs.STATE_PARAMS, *poolargs.STATE_CALLS]
    assert signature_mismatches(load_states(virt)[fun], names, TABLE | poolargs.STATE_CALLS, var_keyword=False) == []


def test_the_spec_builder_takes_the_table():
    params = inspect.signature(poolxml.pool_spec).parameters
    assert set(params) == {"name", *poolargs.NAMES, "require"}
    assert {n: params[n].default for n in poolargs.NAMES} == {a.name: a.default for a in poolargs.ARGS}
    assert set(poolargs.SOURCE) == set(poolxml.SOURCE_KEYS)  # the states' source keys are the spec's


def test_the_signature_check_sees_a_drift():
    def drifted(name, ptype="fs", target=None, **kwargs):
        pass

    found = signature_mismatches(drifted, ["name", "ptype", "target", "permissions"], TABLE, var_keyword=True)
    assert any(m.startswith("names:") for m in found) and any(m.startswith("ptype: default") for m in found)


def test_the_states_source_mapping_refuses_an_unknown_key():
    assert poolargs.from_source({"devices": [1]})["source_devices"] == [1]
    with pytest.raises(SaltInvocationError, match="unknown source key.s. device: use devices, dir"):
        poolargs.from_source({"device": []})


def test_every_argument_has_an_example():
    assert set(EXAMPLES) == set(poolargs.BY_NAME)


def _declared(spec):
    return {k: v for k, v in spec.items() if k != "name" and v not in (None, {}, [])}


def _read_back(conn, name, declared):
    facts = netpool.info(conn, "pool", name)[name]
    out = {k: facts[k] for k in declared if k != "source"}
    return dict(out, source={k: facts["source"].get(k) for k in declared["source"]})


@pytest.mark.parametrize("arg", poolargs.NAMES)
def test_every_argument_reaches_libvirt(virt, arg):
    """The argument changes the spec, and libvirt's read-back of what virt.pool_define and the
    virt.pool_defined state (Salt's ``source`` mapping) defined is that spec."""
    value, needs = EXAMPLES[arg]
    given = dict(needs, **{arg: value})
    spec = poolxml.pool_spec("x", **given)
    try:
        without = poolxml.pool_spec("x", **needs)
    except SaltInvocationError:
        without = None  # what else is given needs this argument
    assert spec != without, f"{arg} changes nothing in the spec"
    declared = _declared(spec)
    declared["source"] = {k: v for k, v in spec["source"].items() if v is not None}
    name = f"pa-{arg}".replace("_", "-")
    conn = libvirt.open("test:///default")
    try:
        assert virt["virt.pool_define"](name, start=False, **given) is True
        assert _read_back(conn, name, declared) == declared
        virt["virt.pool_undefine"](name)
        plain = {k: v for k, v in given.items() if k in poolargs.STATE_PARAMS}
        source = {poolargs.BY_NAME[k].source: v for k, v in given.items() if poolargs.BY_NAME[k].source}
        ret = load_states(virt)["virt.pool_defined"](name, source=source, autostart=False, **plain)
        assert ret["result"] is True, ret
        assert _read_back(conn, name, declared) == declared
        virt["virt.pool_undefine"](name)
    finally:
        conn.close()
