"""saltvirt.vm.hostready through virt.host_ready on Salt's real loader (libvirt's test driver): what salt-run
virt.roll waits for after a reboot. Its TLS part against a real TLS libvirtd: tests/integration/test_pki_tls.py."""

from saltvirt.host import readiness
from tests.support.saltloader import make_minion_mods


def test_virt_host_ready_on_the_test_driver(tmp_path):
    """virt.host_ready through Salt's loader: libvirtd (the test driver) answers; TLS by default, and this host has
    no libvirt client certificate; migrations in clear by name: no TLS to wait for; the events engine counted only
    when the minion config starts it, and ready once it beats."""
    mods = make_minion_mods(tmp_path, "test:///default", migration={"pkipath": str(tmp_path)})
    out = mods["virt.host_ready"]()
    assert out["libvirtd"]["ok"] is True and out["engine"] == {
        "ok": None,
        "why": "the minion config starts no events engine (virt_events)",
    }
    assert out["ready"] is False and out["tls"]["ok"] is False and "clientcert.pem" in out["tls"]["why"], out
    tcp = {"transport": "tcp", "allow_cleartext": True}
    mods = make_minion_mods(
        tmp_path / "tcp", "test:///default", opts_extra={"engines": [{"virt_events": {}}]}, migration=tcp
    )
    out = mods["virt.host_ready"]()
    assert out["tls"]["ok"] is None and out["engine"]["ok"] is False and out["ready"] is False, out
    readiness.engine_beat(mods.opts["cachedir"], "virt_events", True)
    assert mods["virt.host_ready"]() == dict(out, ready=True, engine=readiness.engine_state(mods.opts["cachedir"]))
