"""saltvirt.pki.keyfiles: the files virt.keys writes from the ``libvirt`` pillar (modes, idempotence,
test=True preview, never overwriting what it did not write)."""

import grp
import json
import os

from saltvirt.pki import ca as pki
from saltvirt.pki import keyfiles, revocation
from tests.support.pkitools import QUICK_KEYS, mode


def _pillar(tmp_path, ca="ca"):
    # quick EC keys: these tests are about the files (key types: test_ca.py)
    ca = str(tmp_path / ca)
    server = pki.issue(ca, "h", "server", ["h"], **QUICK_KEYS)
    client = pki.issue(ca, "h", "client", **QUICK_KEYS)
    qserver = pki.issue(ca, "h", "qemu-server", ["h"], **QUICK_KEYS)
    qclient = pki.issue(ca, "h", "qemu-client", **QUICK_KEYS)
    return {
        "cacert": pki.trusted_bundle(ca),
        "crl": revocation.crl_pem(ca),
        "servercert": server["cert"],
        "serverkey": server["key"],
        "clientcert": client["cert"],
        "clientkey": client["key"],
        "qemu_servercert": qserver["cert"],
        "qemu_serverkey": qserver["key"],
        "qemu_clientcert": qclient["cert"],
        "qemu_clientkey": qclient["key"],
        "tls_allowed_dn_list": [pki.CLIENT_DN_PATTERN],
    }


def test_keys_state_writes_modes_is_idempotent_and_previews(tmp_path):
    data, base = _pillar(tmp_path), tmp_path / "pki"
    preview = keyfiles.keys_state("k", data, str(base), test=True)
    assert preview["result"] is None and len(preview["changes"]) == 6 and not base.exists()
    assert preview["changes"][str(base / "libvirt/private/serverkey.pem")] == "key written"
    done = keyfiles.keys_state("k", data, str(base))
    assert done["result"] is True and done["changes"] == preview["changes"]
    assert mode(base / "libvirt/private") == 0o700
    assert mode(base / "libvirt/private/serverkey.pem") == 0o600
    assert mode(base / "libvirt/private/clientkey.pem") == 0o600
    assert mode(base / "CA/cacert.pem") == 0o644 and mode(base / "libvirt/servercert.pem") == 0o644
    assert (base / "libvirt/servercert.pem").read_text() == data["servercert"]
    assert "PRIVATE KEY" not in str(done) and "PRIVATE KEY" not in str(preview)  # no key material in returns
    assert keyfiles.keys_state("k", data, str(base)) == dict(
        done, changes={}, comment=f"libvirt TLS files in {base} are up to date"
    )
    assert keyfiles.keys_state("k", data, str(base), test=True)["result"] is True  # test=True, nothing to do

    os.chmod(base / "libvirt/private/clientkey.pem", 0o644)
    os.chmod(base / "libvirt/private", 0o755)
    preview = keyfiles.keys_state("k", data, str(base), test=True)
    assert preview["result"] is None and mode(base / "libvirt/private/clientkey.pem") == 0o644  # test writes nothing
    fixed = keyfiles.keys_state("k", data, str(base))
    assert (
        fixed["changes"]
        == preview["changes"]
        == {
            str(base / "libvirt/private"): "mode 0755 -> 0700",
            str(base / "libvirt/private/clientkey.pem"): "mode 0644 -> 0600",
        }
    )
    assert mode(base / "libvirt/private") == 0o700 and mode(base / "libvirt/private/clientkey.pem") == 0o600


def test_keys_state_renewal_reports_only_what_changed(tmp_path):
    data, base = _pillar(tmp_path), tmp_path / "pki"
    keyfiles.keys_state("k", data, str(base))
    renewed = pki.issue(str(tmp_path / "ca"), "h", "server", ["h", "h.example.com"], **QUICK_KEYS)
    data = dict(data, servercert=renewed["cert"], serverkey=renewed["key"])
    preview = keyfiles.keys_state("k", data, str(base), test=True)
    expected = {
        str(base / "libvirt/servercert.pem"): "updated",
        str(base / "libvirt/private/serverkey.pem"): "key replaced",
    }
    assert preview["changes"] == expected and preview["result"] is None
    assert keyfiles.keys_state("k", data, str(base))["changes"] == expected
    assert (base / "libvirt/private/serverkey.pem").read_text() == renewed["key"]


def test_keys_state_never_overwrites_files_it_did_not_write(tmp_path):
    data, base = _pillar(tmp_path), tmp_path / "pki"
    (base / "libvirt" / "private").mkdir(parents=True)
    own = base / "libvirt" / "servercert.pem"
    own.write_text("an admin's own certificate\n")
    refused = keyfiles.keys_state("k", data, str(base))
    assert refused["result"] is False and str(own) in refused["comment"] and "replace_foreign" in refused["comment"]
    assert own.read_text() == "an admin's own certificate\n" and not (base / "CA").exists()  # nothing written at all
    done = keyfiles.keys_state("k", data, str(base), replace_foreign=True)
    assert done["result"] is True and "kept as servercert.pem.salt-virt-orig" in done["changes"][str(own)]
    assert (base / "libvirt" / "servercert.pem.salt-virt-orig").read_text() == "an admin's own certificate\n"
    assert own.read_text() == data["servercert"]
    # what virt.keys wrote itself is replaced without asking (renewal)
    assert keyfiles.keys_state("k", _pillar(tmp_path, "ca2"), str(base))["result"] is True


def test_keys_state_qemu_dir_is_readable_by_the_qemu_group(tmp_path):
    gid = grp.getgrnam("libvirt-qemu").gr_gid  # libvirt-daemon on Debian creates it
    data, base = _pillar(tmp_path), tmp_path / "pki"
    ret = keyfiles.keys_state("k", data, str(base), qemu=True)
    assert ret["result"] is True and len(ret["changes"]) == 12
    qemu = base / "qemu"
    assert mode(qemu) == 0o750 and os.stat(qemu).st_gid == gid
    for name in ("server-key.pem", "client-key.pem"):
        assert mode(qemu / name) == 0o640 and os.stat(qemu / name).st_gid == gid
    assert (qemu / "ca-cert.pem").read_text() == data["cacert"]
    assert keyfiles.keys_state("k", data, str(base), qemu=True)["changes"] == {}


def test_keys_state_without_pillar_says_why():
    ret = keyfiles.keys_state("k", None, "/nonexistent")
    assert ret["result"] is False and "no 'libvirt' pillar" in ret["comment"]
    ret = keyfiles.keys_state("k", {"cacert": "x"}, "/nonexistent")
    assert ret["result"] is False and "lacks crl, servercert" in ret["comment"]


def test_libvirtd_conf_lines(tmp_path):
    conf = tmp_path / "libvirtd.conf"
    conf.write_text('listen_tls = 1\n#crl_file = "/etc/pki/CA/cacrl.pem"\n#tls_allowed_dn_list = ["DN1"]\n')
    wanted = keyfiles.conf_settings("/etc/pki", {"tls_allowed_dn_list": ["O=salt-virt,CN=* libvirt client"]})
    text, changes = keyfiles.conf_plan(str(conf), wanted)
    dn = 'tls_allowed_dn_list = ["O=salt-virt,CN=* libvirt client"]\n'
    assert text == 'listen_tls = 1\ncrl_file = "/etc/pki/CA/cacrl.pem"\n' + dn
    assert set(changes) == {"crl_file", "tls_allowed_dn_list"}
    conf.write_text(text)
    assert keyfiles.conf_plan(str(conf), wanted) == (None, {})
    conf.write_text("listen_tls = 1\n")
    text, changes = keyfiles.conf_plan(str(conf), wanted)
    assert text.endswith(
        'crl_file = "/etc/pki/CA/cacrl.pem"\ntls_allowed_dn_list = ["O=salt-virt,CN=* libvirt client"]\n'
    )


def test_libvirtd_conf_is_left_alone_unless_named(tmp_path):
    """Issue 36: with libvirt-formula (which templates /etc/libvirt/libvirtd.conf and calls ``virt.keys`` with
    its defaults) a highstate never converged: virt.keys edited the formula's file on every run. Its default
    is now Salt's: no libvirtd.conf is touched (test=True: reported, nothing written)."""
    ret = keyfiles.keys_state("k", _pillar(tmp_path), "/etc/pki", test=True)
    assert ret["result"] is None and ret["changes"], ret
    assert not [path for path in ret["changes"] if not path.startswith("/etc/pki/")], ret["changes"]
    conf = tmp_path / "libvirtd.conf"
    conf.write_text("listen_tls = 1\n")
    ret = keyfiles.keys_state("k", _pillar(tmp_path), str(tmp_path / "pki"), libvirtd_conf=str(conf))
    crl = tmp_path / "pki" / "CA" / "cacrl.pem"
    assert str(conf) in ret["changes"] and f'crl_file = "{crl}"' in conf.read_text()


def test_libvirtd_settings_are_libvirt_formulas_pillar_values():
    """What the ext_pillar publishes as ``libvirt:libvirtd``: values libvirt-formula's template renders with
    ``|json`` into the same lines virt.keys writes."""
    dns = ["O=salt-virt,CN=* libvirt client", "O=x,CN=y"]
    settings = keyfiles.libvirtd_settings("/etc/pki", dns)
    assert settings == {"crl_file": "/etc/pki/CA/cacrl.pem", "tls_allowed_dn_list": dns}
    assert keyfiles.conf_settings("/etc/pki", {"tls_allowed_dn_list": dns}) == {
        key: json.dumps(value) for key, value in settings.items()
    }


def test_a_virt_keys_without_qemu_keeps_the_record_of_the_qemu_files(tmp_path):
    """Seen with libvirt-formula (its virt.keys has no qemu) beside salt-virt's formula (qemu: True) on one
    basepath: the call without qemu rewrote the record of what virt.keys wrote without the QEMU files, so
    at their next renewal salt-virt's own state refused them as files it had not written."""
    base = tmp_path / "pki"
    data = _pillar(tmp_path)
    assert keyfiles.keys_state("k", data, str(base), qemu=True)["result"] is True
    assert keyfiles.keys_state("k", data, str(base))["result"] is True  # the other state, no qemu
    renewed = dict(data, **{k: v for k, v in _pillar(tmp_path, ca="ca2").items() if k.startswith("qemu_")})
    ret = keyfiles.keys_state("k", renewed, str(base), qemu=True)
    assert ret["result"] is True and str(base / "qemu" / "server-cert.pem") in ret["changes"], ret
