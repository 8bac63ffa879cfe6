"""The libvirt CA and certificates (saltvirt.pki) and the files virt.keys writes (saltvirt.keyfiles)."""
import datetime
import ipaddress
import os
import shutil
import stat

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from saltvirt import keyfiles, pki


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_ca_created_private_and_reused(tmp_path):
    ca_dir = tmp_path / "libvirt"
    cert, _key = pki.ensure_ca(str(ca_dir), days=4000)
    assert mode(ca_dir) == 0o700 and mode(ca_dir / "cakey.pem") == 0o600
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    assert 3990 < left.days <= 4000  # configurable, not the anchor's silent one year
    again, _ = pki.ensure_ca(str(ca_dir))
    assert again.serial_number == cert.serial_number


def test_server_and_client_certs_have_sans_distinct_cns_and_eku(tmp_path):
    ca = str(tmp_path / "ca")
    sans = ["hyper1", "hyper1.example.com", "10.0.0.11", "fd00::11"]
    server = pki.issue(ca, "hyper1", "server", sans, cn="hyper1.example.com", days=90, key_size=2048)
    client = pki.issue(ca, "hyper1", "client", days=90, key_size=2048)
    s, c = pki.load_cert(server["cert"]), pki.load_cert(client["cert"])
    assert s.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "hyper1.example.com"
    assert c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "hyper1 libvirt client"
    dns, ips = pki.cert_sans(s)
    assert dns == {"hyper1", "hyper1.example.com"}
    assert ips == {ipaddress.ip_address("10.0.0.11"), ipaddress.ip_address("fd00::11")}
    assert list(s.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert list(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert 88 <= (s.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)).days <= 90
    assert mode(os.path.join(ca, "minions", "hyper1", "serverkey.pem")) == 0o600
    assert mode(os.path.join(ca, "minions", "hyper1")) == 0o700


def test_reused_while_valid_renewed_near_expiry_or_on_san_change(tmp_path):
    ca = str(tmp_path / "ca")
    first = pki.issue(ca, "h", "server", ["h", "10.0.0.1"], days=60, renew_days=30, key_size=2048)
    assert first["issued"]
    same = pki.issue(ca, "h", "server", ["10.0.0.1", "h"], days=60, renew_days=30, key_size=2048)
    assert not same["issued"] and same["cert"] == first["cert"]
    changed = pki.issue(ca, "h", "server", ["h", "10.0.0.2"], days=60, renew_days=30, key_size=2048)
    assert changed["issued"] and changed["reason"] == "SAN set changed"
    near = pki.issue(ca, "h", "server", ["h", "10.0.0.2"], days=60, renew_days=61, key_size=2048)
    assert near["issued"] and near["reason"].startswith("expires in")


def test_ca_rotation_reissues_and_keeps_old_ca_trusted(tmp_path):
    ca = tmp_path / "ca"
    old = pki.issue(str(ca), "h", "client", key_size=2048)
    (ca / "previous").mkdir()
    shutil.move(str(ca / "cacert.pem"), str(ca / "previous" / "2025.pem"))
    os.unlink(ca / "cakey.pem")
    new = pki.issue(str(ca), "h", "client", key_size=2048)
    assert new["issued"] and "CA" in new["reason"]
    assert pki.load_cert(new["cert"]).issuer != pki.load_cert(old["cert"]).issuer or new["cert"] != old["cert"]
    bundle = pki.trusted_bundle(str(ca))
    assert bundle.count("BEGIN CERTIFICATE") == 2


def _pillar(tmp_path):
    ca = str(tmp_path / "ca")
    server = pki.issue(ca, "h", "server", ["h"], key_size=2048)
    client = pki.issue(ca, "h", "client", key_size=2048)
    return {
        "cacert": pki.trusted_bundle(ca),
        "servercert": server["cert"],
        "serverkey": server["key"],
        "clientcert": client["cert"],
        "clientkey": client["key"],
    }


def test_keys_state_writes_modes_is_idempotent_and_previews(tmp_path):
    data, base = _pillar(tmp_path), tmp_path / "pki"
    preview = keyfiles.keys_state("k", data, str(base), test=True)
    assert preview["result"] is None and len(preview["changes"]) == 5 and not base.exists()
    assert preview["changes"][str(base / "libvirt/private/serverkey.pem")] == "key written"
    done = keyfiles.keys_state("k", data, str(base))
    assert done["result"] is True and done["changes"] == preview["changes"]
    assert mode(base / "libvirt/private") == 0o700
    assert mode(base / "libvirt/private/serverkey.pem") == 0o600
    assert mode(base / "libvirt/private/clientkey.pem") == 0o600
    assert mode(base / "CA/cacert.pem") == 0o644
    assert (base / "libvirt/servercert.pem").read_text() == data["servercert"]
    assert "BEGIN" not in str(done)  # no key material in the state's return
    assert keyfiles.keys_state("k", data, str(base))["changes"] == {}
    os.chmod(base / "libvirt/private/clientkey.pem", 0o644)
    fixed = keyfiles.keys_state("k", data, str(base))
    assert fixed["changes"] == {str(base / "libvirt/private/clientkey.pem"): "mode 0644 -> 0600"}


def test_keys_state_without_pillar_says_why():
    ret = keyfiles.keys_state("k", None, "/nonexistent")
    assert ret["result"] is False and "no 'libvirt' pillar" in ret["comment"]
