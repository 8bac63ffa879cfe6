"""saltvirt.pki.ca: the libvirt CA and certificates (the files virt.keys writes: test_keyfiles.py; the
``libvirt`` ext_pillar: loaders/test_pillar_libvirt.py).

gnutls' certtool is the independent judge where it matters: libvirt verifies TLS with gnutls."""

import datetime
import ipaddress
import os
import shutil
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.pki import ca as pki
from tests.support.paths import ROOT
from tests.support.pkitools import K, certtool_verify, days_left, mode


# the CA ----------------------------------------------------------------------------------------
def test_ca_created_private_with_configurable_validity_and_reused(tmp_path):
    ca_dir = tmp_path / "libvirt"
    cert, _key = pki.ensure_ca(str(ca_dir), days=4000, **K)
    assert mode(ca_dir) == 0o700 and mode(ca_dir / "cakey.pem") == 0o600 and mode(ca_dir / "cacert.pem") == 0o644
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign and not ku.digital_signature
    assert 3998 <= days_left(cert) <= 4000  # configurable, not a silent one year
    assert 3648 <= days_left(pki.ensure_ca(str(tmp_path / "default"), **K)[0]) <= 3650  # 10 years by default
    again, _ = pki.ensure_ca(str(ca_dir))
    assert again.serial_number == cert.serial_number
    os.chmod(ca_dir / "cakey.pem", 0o644)
    pki.ensure_ca(str(ca_dir))
    assert mode(ca_dir / "cakey.pem") == 0o600  # loosened by hand: tightened again


def test_half_present_or_expired_ca_is_refused_not_replaced(tmp_path):
    ca_dir = tmp_path / "ca"
    pki.ensure_ca(str(ca_dir), **K)
    original = (ca_dir / "cacert.pem").read_bytes()
    os.unlink(ca_dir / "cakey.pem")
    with pytest.raises(CommandExecutionError, match="incomplete"):
        pki.ensure_ca(str(ca_dir), **K)
    assert (ca_dir / "cacert.pem").read_bytes() == original  # never overwritten

    expired = tmp_path / "expired"
    expired.mkdir(mode=0o700)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=400))
        .not_valid_after(now - datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (expired / "cacert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (expired / "cakey.pem").write_bytes(pki._key_pem(key))
    with pytest.raises(CommandExecutionError, match="expired.*rotate"):
        pki.issue(str(expired), "h", "client", **K)


# leaf certificates -----------------------------------------------------------------------------
def test_server_and_client_certs_have_sans_distinct_cns_and_usages(tmp_path):
    ca = str(tmp_path / "ca")
    sans = ["hyper1", "hyper1.example.com", "10.0.0.11", "fd00::11"]
    server = pki.issue(ca, "hyper1", "server", sans, cn="hyper1.example.com", days=90, **K)
    client = pki.issue(ca, "hyper1", "client", days=90, **K)
    s, c = pki.load_cert(server["cert"]), pki.load_cert(client["cert"])
    assert pki.common_name(s) == "hyper1.example.com"
    assert pki.common_name(c) == "hyper1 libvirt client"
    dns, ips = pki.cert_sans(s)
    assert dns == {"hyper1", "hyper1.example.com"}
    assert ips == {ipaddress.ip_address("10.0.0.11"), ipaddress.ip_address("fd00::11")}
    assert list(s.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert list(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not s.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert 88 <= days_left(s) <= 90 and 88 <= days_left(c) <= 90  # configurable validity
    for name in ("serverkey.pem", "clientkey.pem"):
        assert mode(os.path.join(ca, "minions", "hyper1", name)) == 0o600
    assert mode(os.path.join(ca, "minions")) == 0o700 and mode(os.path.join(ca, "minions", "hyper1")) == 0o700
    assert "BEGIN PRIVATE KEY" in server["key"]


def test_gnutls_accepts_the_server_cert_for_its_sans_only_and_with_the_right_purpose(tmp_path):
    ca = str(tmp_path / "ca")
    server = pki.issue(ca, "hv1", "server", ["hv1", "hv1.example.com", "10.0.0.11"], cn="hv1.example.com", **K)
    client = pki.issue(ca, "hv1", "client", **K)
    bundle = pki.trusted_bundle(ca)
    assert certtool_verify(tmp_path, bundle, server["cert"], hostname="hv1.example.com").returncode == 0
    assert certtool_verify(tmp_path, bundle, server["cert"], hostname="10.0.0.11").returncode == 0
    assert certtool_verify(tmp_path, bundle, server["cert"], hostname="hv2.example.com").returncode != 0
    assert certtool_verify(tmp_path, bundle, server["cert"], purpose="1.3.6.1.5.5.7.3.1").returncode == 0
    assert certtool_verify(tmp_path, bundle, client["cert"], purpose="1.3.6.1.5.5.7.3.2").returncode == 0
    assert certtool_verify(tmp_path, bundle, client["cert"], purpose="1.3.6.1.5.5.7.3.1").returncode != 0


def test_ec_keys(tmp_path):
    ca = str(tmp_path / "ca")
    server = pki.issue(ca, "h", "server", ["h"], key_type="ec", key_size=384)
    cert = pki.load_cert(server["cert"])
    assert pki.key_params(cert.public_key()) == ("ec", 384)
    assert not cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_encipherment
    assert certtool_verify(tmp_path, pki.trusted_bundle(ca), server["cert"], hostname="h").returncode == 0


def test_profiles_match_the_certtool_templates_in_pki_dir(tmp_path):
    """pki/*.tmpl document the profiles for certtool users: the same extensions as saltvirt.pki.ca's."""
    ca = tmp_path / "ca"
    ours = {
        "server": pki.issue(str(ca), "h", "server", ["h"], **K)["cert"],
        "client": pki.issue(str(ca), "h", "client", **K)["cert"],
    }

    def extensions(cert):
        out = {}
        for ext in cert.extensions:
            if isinstance(ext.value, (x509.BasicConstraints, x509.KeyUsage, x509.ExtendedKeyUsage)):
                out[type(ext.value).__name__] = (ext.critical, ext.value)
        return out

    subprocess.run(
        ["certtool", "--generate-privkey", "--bits", "2048", "--outfile", str(tmp_path / "k.pem")],
        check=True,
        capture_output=True,
    )
    for kind, extra in (("server", 'cn = "h"\ndns_name = "h"\n'), ("client", 'cn = "h libvirt client"\n')):
        (tmp_path / f"{kind}.tmpl").write_text((ROOT / "pki" / f"{kind}.tmpl").read_text() + extra)
        subprocess.run(
            [
                "certtool",
                "--generate-certificate",
                "--load-privkey",
                str(tmp_path / "k.pem"),
                "--load-ca-certificate",
                str(ca / "cacert.pem"),
                "--load-ca-privkey",
                str(ca / "cakey.pem"),
                "--template",
                str(tmp_path / f"{kind}.tmpl"),
                "--outfile",
                str(tmp_path / f"{kind}.pem"),
            ],
            check=True,
            capture_output=True,
        )
        theirs = x509.load_pem_x509_certificate((tmp_path / f"{kind}.pem").read_bytes())
        assert extensions(theirs) == extensions(pki.load_cert(ours[kind])), kind
        assert 823 <= days_left(theirs) <= 825
    subprocess.run(
        [
            "certtool",
            "--generate-self-signed",
            "--load-privkey",
            str(tmp_path / "k.pem"),
            "--template",
            str(ROOT / "pki" / "ca.tmpl"),
            "--outfile",
            str(tmp_path / "ca.pem"),
        ],
        check=True,
        capture_output=True,
    )
    theirs = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    assert extensions(theirs) == extensions(pki.ensure_ca(str(ca))[0])
    assert pki.common_name(theirs) == pki.CA_CN


# renewal ---------------------------------------------------------------------------------------
def test_reused_while_valid_renewed_on_san_cn_or_key_change(tmp_path):
    ca = str(tmp_path / "ca")
    first = pki.issue(ca, "h", "server", ["h", "10.0.0.1"], **K)
    assert first["issued"] and first["reason"] == "new"
    same = pki.issue(ca, "h", "server", ["10.0.0.1", "H"], **K)  # order and case do not matter
    assert not same["issued"] and same["cert"] == first["cert"] and same["key"] == first["key"]
    changed = pki.issue(ca, "h", "server", ["h", "10.0.0.2"], **K)
    assert changed["issued"] and changed["reason"] == "SAN set changed" and changed["key"] != first["key"]
    renamed = pki.issue(ca, "h", "server", ["h", "10.0.0.2"], cn="h.example.com", **K)
    assert renamed["issued"] and renamed["reason"].startswith("CN changed")
    bigger = pki.issue(ca, "h", "server", ["h", "10.0.0.2"], cn="h.example.com", key_size=3072)
    assert bigger["issued"] and bigger["reason"] == "key parameters changed (rsa 2048 -> rsa 3072)"
    assert not pki.issue(ca, "h", "server", ["h", "10.0.0.2"], cn="h.example.com", key_size=3072)["issued"]


def test_near_expiry_cert_is_renewed(tmp_path):
    ca = str(tmp_path / "ca")
    short = pki.issue(ca, "h", "client", days=2, renew_days=1, **K)
    assert days_left(pki.load_cert(short["cert"])) <= 2
    assert not pki.issue(ca, "h", "client", days=2, renew_days=1, **K)["issued"]  # outside its own window
    renewed = pki.issue(ca, "h", "client", days=825, renew_days=30, **K)
    assert renewed["issued"] and renewed["reason"] == "expires in 1 days (renewal window 30 days)"
    assert days_left(pki.load_cert(renewed["cert"])) >= 824


def test_broken_stored_key_is_reissued_and_force_reissues(tmp_path):
    ca = tmp_path / "ca"
    first = pki.issue(str(ca), "h", "client", **K)
    os.unlink(ca / "minions" / "h" / "clientkey.pem")
    again = pki.issue(str(ca), "h", "client", **K)
    assert again["issued"] and again["reason"] == "key missing or unreadable" and again["cert"] != first["cert"]
    other = pki.issue(str(ca), "x", "client", **K)
    shutil.copyfile(ca / "minions" / "x" / "clientkey.pem", ca / "minions" / "h" / "clientkey.pem")
    mismatch = pki.issue(str(ca), "h", "client", **K)
    assert (
        mismatch["issued"]
        and mismatch["reason"] == "key does not match the certificate"
        and mismatch["key"] != other["key"]
    )
    forced = pki.issue(str(ca), "h", "client", force=True, **K)
    assert forced["issued"] and forced["reason"] == "forced"


def test_leaf_never_outlives_the_ca_and_a_short_lived_ca_does_not_cause_churn(tmp_path):
    ca = str(tmp_path / "ca")
    pki.ensure_ca(ca, days=20, **K)
    first = pki.issue(ca, "h", "server", ["h"], days=825, renew_days=30, **K)
    ca_cert = pki.load_cert(pki.trusted_bundle(ca))
    assert pki.load_cert(first["cert"]).not_valid_after_utc == ca_cert.not_valid_after_utc
    assert "rotate" in first["warning"]
    again = pki.issue(ca, "h", "server", ["h"], days=825, renew_days=30, **K)
    assert not again["issued"]  # inside the renewal window, but a new cert could not last longer


def test_settings_are_validated():
    with pytest.raises(SaltInvocationError, match="renew_days"):
        pki.settings(days=30, renew_days=30)
    with pytest.raises(SaltInvocationError, match="key_type"):
        pki.settings(key_type="dsa")
    with pytest.raises(SaltInvocationError, match="key_size"):
        pki.settings(key_size=1024)
    with pytest.raises(SaltInvocationError, match="minion id"):
        pki.issue("/nonexistent", "../etc", "client")
    assert pki.settings() == {"days": 825, "renew_days": 30, "ca_days": 3650, "key_type": "rsa", "key_size": 3072}


# CA rotation (the procedure in pki/README.md) ----------------------------------------------------
def test_ca_rotation_keeps_the_fleet_talking_then_drops_the_old_ca(tmp_path):
    ca = tmp_path / "ca"
    old_server = pki.issue(str(ca), "hv1", "server", ["hv1"], **K)  # a host that has not applied virt.keys yet
    old_ca_pem = (ca / "cacert.pem").read_text()
    rotated = pki.rotate_ca(str(ca), **K)
    assert os.path.exists(rotated["retired"]) and mode(ca / "previous") == 0o700
    assert rotated["previous"]["sha256"] != rotated["current"]["sha256"]
    assert mode(ca / "cakey.pem") == 0o600
    bundle = pki.trusted_bundle(str(ca))
    assert bundle.count("BEGIN CERTIFICATE") == 2 and old_ca_pem in bundle
    new_server = pki.issue(str(ca), "hv1", "server", ["hv1"], **K)
    assert new_server["issued"] and new_server["reason"] == "not signed by the current CA"
    new_client = pki.issue(str(ca), "hv2", "client", **K)
    # during the rollout both generations verify against the distributed bundle (gnutls, as libvirt)
    assert certtool_verify(tmp_path, bundle, old_server["cert"], hostname="hv1").returncode == 0
    assert certtool_verify(tmp_path, bundle, new_server["cert"], hostname="hv1").returncode == 0
    assert certtool_verify(tmp_path, old_ca_pem, new_client["cert"]).returncode != 0  # why the bundle goes first
    # step 4: retire the previous CA for good
    os.unlink(rotated["retired"])
    bundle = pki.trusted_bundle(str(ca))
    assert bundle.count("BEGIN CERTIFICATE") == 1
    assert certtool_verify(tmp_path, bundle, old_server["cert"], hostname="hv1").returncode != 0
    assert certtool_verify(tmp_path, bundle, new_server["cert"], hostname="hv1").returncode == 0
    inv = pki.inventory(str(ca))
    assert set(inv["minions"]) == {"hv1", "hv2"} and "BEGIN" not in str(inv)


def test_command_line_show_and_rotate(tmp_path, capsys):
    ca = str(tmp_path / "ca")
    pki.issue(ca, "hv1", "client", **K)
    assert pki.main(["show", ca]) == 0
    assert '"hv1"' in capsys.readouterr().out
    assert pki.main(["rotate-ca", ca, "--days", "100", "--key-size", "2048"]) == 0
    assert 98 <= days_left(pki.load_cert((tmp_path / "ca" / "cacert.pem").read_bytes())) <= 100


def _issue_in_process(args):
    ca, minion_id = args
    return pki.issue(ca, minion_id, "server", [minion_id], **K)["cert"]


def test_concurrent_master_workers_share_one_ca(tmp_path):
    """Master workers compile pillars in parallel processes: the first compiles must not race to
    create two CAs (a cert signed by a CA that is then replaced would be useless)."""
    import multiprocessing

    ca = str(tmp_path / "ca")
    with multiprocessing.get_context("fork").Pool(6) as pool:
        certs = pool.map(_issue_in_process, [(ca, f"hv{i % 3}") for i in range(12)])
    ca_cert = pki.ensure_ca(ca)[0]
    assert all(pki.signed_by(pki.load_cert(c), ca_cert) for c in certs)
    for i in range(3):  # one stored cert per minion, and what was handed out last is what is stored
        stored = (tmp_path / "ca" / "minions" / f"hv{i}" / "servercert.pem").read_text()
        assert pki.issue(ca, f"hv{i}", "server", [f"hv{i}"], **K)["cert"] == stored
