"""saltvirt.fleet.vminit: ``salt-run virt.init`` behind the runner's signature. What it refuses before anything
is published, through the runner: tests/unit/loaders/test_runners_virt.py; the whole creation with real
hypervisors: tests/integration/test_runner.py."""

import ast
import dataclasses

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import callers, vminit
from tests.support.paths import ROOT

SHA = "sha256:" + "ab" * 32
OPTS = {
    "virt": {
        "hypervisors": ["hyper1", "hyper2"],
        "operators": ["carol"],
        "tenants": {
            "acme": {"members": ["alice"], "quota": {"vcpus": 2}, "images": ["tiny"], "hypervisors": ["hyper1"]}
        },
        "catalog": {"tiny": {"source": "salt://images/tiny.qcow2", "checksum": SHA}},
    }
}
ALICE = callers.Caller("alice", False, "acme")
CAROL = callers.Caller("carol", True)


def test_call_carries_the_runners_named_arguments_with_their_defaults():
    """The runner builds a Call from its own parameters: a parameter added there (or a default changed) and not
    here would be lost, or default differently, on its way to the library."""
    tree = ast.parse((ROOT / "_runners" / "virt.py").read_text())
    init = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "init")
    names = [a.arg for a in init.args.args]
    defaults = dict(zip(names[len(names) - len(init.args.defaults) :], init.args.defaults, strict=True))
    fields = dataclasses.fields(vminit.Call)
    assert [f.name for f in fields] == names and init.args.kwarg is not None
    for f in fields:
        expected = ast.literal_eval(defaults[f.name]) if f.name in defaults else dataclasses.MISSING
        assert f.default == expected, f.name


def test_a_tenant_member_creates_in_its_own_tenant_from_its_catalog():
    meta, image, entry = vminit.tenancy(OPTS, ALICE, vminit.Call("web1", 1, 128, image="tiny"), {})
    assert meta["meta"] == {"tenant": "acme", "creator": "alice"} and image == "salt://images/tiny.qcow2"
    assert entry["checksum"] == SHA and meta["quota"]["name"] == "acme" and meta["quota"]["quota"]["vcpus"] == 2
    assert meta["quota"]["allowed"]("hyper1") and not meta["quota"]["allowed"]("hyper2")


@pytest.mark.parametrize(
    ("who", "call", "message"),
    [
        (ALICE, {"image": "tiny", "tenant": "beta"}, "user alice is in tenant acme: tenant=beta is refused"),
        (ALICE, {"image": "tiny", "minion_id": "hyper2"}, "tenant acme: a VM's minion id is its name"),
        (ALICE, {"image": "salt://images/tiny.qcow2"}, "tenant acme may use catalog images only"),
        (CAROL, {"tenant": "beta"}, "no tenant named 'beta' in virt:tenants"),
    ],
)
def test_tenancy_refuses(who, call, message):
    with pytest.raises(SaltInvocationError, match=f"^{message}"):
        vminit.tenancy(OPTS, who, vminit.Call("web1", 1, 128, **call), {})


def test_an_operator_may_create_for_a_tenant_or_for_nobody():
    meta, image, entry = vminit.tenancy(OPTS, CAROL, vminit.Call("web1", 1, 128, image="salt://x.qcow2"), {})
    assert meta == {"meta": {"creator": "carol"}, "quota": None} and image == "salt://x.qcow2" and entry is None
    meta, _image, _entry = vminit.tenancy(OPTS, CAROL, vminit.Call("web1", 1, 128, tenant="acme"), {})
    assert meta["meta"] == {"tenant": "acme", "creator": "carol"} and meta["quota"]["name"] == "acme"
