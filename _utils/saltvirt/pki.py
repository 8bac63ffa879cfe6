"""The libvirt CA kept on the master and the per-hypervisor certificates it signs (``cryptography``).

On-disk layout below ``ca_dir`` (default ``<master pki_dir>/libvirt``, directories 0700, keys 0600)::

    cacert.pem  cakey.pem            the CA (RSA 3072, ``ca_days`` valid, default 10 years)
    previous/*.pem                   retired CA certificates still trusted during a rotation
    minions/<id>/servercert.pem  serverkey.pem   CN=<fqdn or id>, SAN: DNS + IP, EKU serverAuth
    minions/<id>/clientcert.pem  clientkey.pem   CN=<id> libvirt client, EKU clientAuth

A certificate is (re)issued when it is missing, within ``renew_days`` of expiry, its SAN set differs
from the wanted one, or it was not signed by the current CA (after a rotation).
"""
import datetime
import ipaddress
import os
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KINDS = ("server", "client")


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def _write(path, data, mode):
    """Atomic write with the final mode from the start (no window where a key is world-readable)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert_pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def load_cert(pem):
    return x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)


def ensure_ca(ca_dir, cn="salt-virt libvirt CA", days=3650, key_size=3072):
    """Load the CA in ``ca_dir``, creating it (and the directory, 0700) the first time."""
    os.makedirs(ca_dir, mode=0o700, exist_ok=True)
    os.chmod(ca_dir, 0o700)
    cert_path, key_path = os.path.join(ca_dir, "cacert.pem"), os.path.join(ca_dir, "cakey.pem")
    if os.path.exists(cert_path) and os.path.exists(key_path):
        with open(cert_path, "rb") as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
        with open(key_path, "rb") as fh:
            key = serialization.load_pem_private_key(fh.read(), password=None)
        return cert, key
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "salt-virt")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, _cert_pem(cert), 0o644)
    return cert, key


def trusted_bundle(ca_dir):
    """The current CA certificate plus retired ones kept in ``previous/`` (for a rotation)."""
    with open(os.path.join(ca_dir, "cacert.pem"), "rb") as fh:
        bundle = fh.read()
    previous = os.path.join(ca_dir, "previous")
    if os.path.isdir(previous):
        for name in sorted(os.listdir(previous)):
            if name.endswith(".pem"):
                with open(os.path.join(previous, name), "rb") as fh:
                    bundle += fh.read()
    return bundle.decode()


def _split_sans(sans):
    dns, ips = set(), set()
    for item in sans or ():
        item = str(item).strip()
        if not item:
            continue
        try:
            ips.add(ipaddress.ip_address(item))
        except ValueError:
            dns.add(item.lower())
    return dns, ips


def cert_sans(cert):
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return {d.lower() for d in ext.get_values_for_type(x509.DNSName)}, set(ext.get_values_for_type(x509.IPAddress))


def needs_renewal(cert, ca_cert, sans=None, renew_days=30, kind="server"):
    """(True, reason) if ``cert`` must be reissued, else (False, '')."""
    if cert.issuer != ca_cert.subject:
        return True, "signed by another CA"
    try:
        ca_cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes, _padding(), cert.signature_hash_algorithm)
    except Exception:  # noqa: BLE001 - any verification failure means: not ours
        return True, "not signed by the current CA"
    left = cert.not_valid_after_utc - _now()
    if left < datetime.timedelta(days=renew_days):
        return True, f"expires in {max(left.days, 0)} days (renewal window {renew_days} days)"
    if kind == "server" and cert_sans(cert) != _split_sans(sans):
        return True, "SAN set changed"
    return False, ""


def _padding():
    from cryptography.hazmat.primitives.asymmetric import padding

    return padding.PKCS1v15()


def _issue(ca_cert, ca_key, cn, kind, sans, days, key_size):
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "salt-virt"), x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if kind == "server":
        dns, ips = _split_sans(sans)
        names = [x509.DNSName(d) for d in sorted(dns)] + [x509.IPAddress(i) for i in sorted(ips, key=str)]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert, key


def issue(ca_dir, minion_id, kind, sans=None, days=825, renew_days=30, key_size=3072, ca_days=3650, cn=None):
    """The ``kind`` (server|client) cert + key of ``minion_id``: reused while valid, else (re)issued.

    Returns {'cert': pem, 'key': pem, 'issued': bool, 'reason': str}."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    ca_cert, ca_key = ensure_ca(ca_dir, days=ca_days)
    directory = os.path.join(ca_dir, "minions", minion_id)
    cert_path, key_path = os.path.join(directory, f"{kind}cert.pem"), os.path.join(directory, f"{kind}key.pem")
    reason = "new"
    if os.path.exists(cert_path) and os.path.exists(key_path):
        with open(cert_path, "rb") as fh:
            cert_pem = fh.read()
        renew, reason = needs_renewal(x509.load_pem_x509_certificate(cert_pem), ca_cert, sans, renew_days, kind)
        if not renew:
            with open(key_path, "rb") as fh:
                return {"cert": cert_pem.decode(), "key": fh.read().decode(), "issued": False, "reason": "valid"}
    sans = list(sans or [])
    cn = (cn or minion_id) if kind == "server" else f"{minion_id} libvirt client"
    cert, key = _issue(ca_cert, ca_key, cn, kind, sans, days, key_size)
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, _cert_pem(cert), 0o644)
    return {"cert": _cert_pem(cert).decode(), "key": _key_pem(key).decode(), "issued": True, "reason": reason}


def summary(pem):
    cert = load_cert(pem)
    dns, ips = cert_sans(cert)
    return {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "san_dns": sorted(dns),
        "san_ip": sorted(str(i) for i in ips),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }
