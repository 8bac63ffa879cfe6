"""_states/libvirt.py: ``libvirt.keys``, the older tutorial's name of ``virt.keys``, through Salt's real
state loader (formulas written as ``libvirt_keys: libvirt.keys``)."""

from tests.support.saltloader import load_states, make_minion_mods
from tests.unit.pki.test_keyfiles import _pillar


def test_libvirt_keys_is_virt_keys_under_its_old_name(tmp_path):
    data, base = _pillar(tmp_path), tmp_path / "pki"
    mods = make_minion_mods(tmp_path, "test:///default")
    mods.opts["pillar"] = {"libvirt": data}
    states = load_states(mods)
    assert "libvirt.keys" in states
    ret = states["libvirt.keys"]("libvirt_keys", basepath=str(base))
    assert ret["result"] is True and str(base / "libvirt/private/serverkey.pem") in ret["changes"]
    assert "old name of virt.keys" in ret["comment"] and ret["warnings"] == [
        "libvirt.keys is the old name of virt.keys: write virt.keys"
    ]
    assert (base / "libvirt/servercert.pem").read_text() == data["servercert"]
    again = states["libvirt.keys"]("libvirt_keys", basepath=str(base))
    assert again["result"] is True and again["changes"] == {}
    old = states["libvirt.keys"]("libvirt_keys", basepath=str(base), expiration_days=700, country="US")
    assert old["result"] is False and "country, expiration_days are not supported" in old["comment"]
