"""The libvirt CA kept on the master and the per-hypervisor certificates it signs (``cryptography``).

On-disk layout below ``ca_dir`` (default ``<master pki_dir>/libvirt``; directories 0700, keys 0600)::

    cacert.pem  cakey.pem                       the CA (``ca_days`` valid, default 10 years)
    previous/*.pem                              retired CA certificates still trusted during a rotation
    minions/<id>/servercert.pem  serverkey.pem  CN=<fqdn or id>, SAN DNS + IP, EKU serverAuth
    minions/<id>/clientcert.pem  clientkey.pem  CN="<id> libvirt client", EKU clientAuth

A certificate is (re)issued when it is missing, its key is missing or does not match, it is within
``renew_days`` of expiry, its SAN set or CN differs from the wanted one, its key type/size differs from
the configured one, or it was not signed by the current CA (after a rotation). A leaf never outlives
its CA; a CA close to expiry is reported (:func:`ca_warning`), an expired one refuses to sign.

The profiles match the certtool templates in the repository's ``pki/`` directory (tested).
Command line (on the master, as root)::

    python3 -m saltvirt.pki.ca show <ca_dir>
    python3 -m saltvirt.pki.ca rotate-ca <ca_dir> [--days 3650] [--key-type rsa --key-size 3072]
"""

import argparse
import datetime
import ipaddress
import json
import os
from collections.abc import Iterable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Data
from saltvirt.pki import castore, crl, privkey
from saltvirt.pki.castore import signed_by

KINDS = ("server", "client", "qemu-server", "qemu-client")
SERVER_KINDS = ("server", "qemu-server")
CLIENT_DN_PATTERN = "O=salt-virt,CN=* libvirt client"  # libvirtd tls_allowed_dn_list: hypervisor client certs only
KEY_TYPES = ("rsa", "ec")
RSA_SIZES = (2048, 3072, 4096)
EC_CURVES: dict[int, type[ec.EllipticCurve]] = {256: ec.SECP256R1, 384: ec.SECP384R1, 521: ec.SECP521R1}
DEFAULTS: dict[str, Any] = {"days": 825, "renew_days": 30, "ca_days": 3650, "key_type": "rsa", "key_size": 3072}
CA_CN = "salt-virt libvirt CA"
ORG = "salt-virt"


# files -----------------------------------------------------------------------------------------
def _key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM)


def load_cert(pem: str | bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)


def load_certs(pem: str | bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode() if isinstance(pem, str) else pem)


# parameters ------------------------------------------------------------------------------------
def _ca_days(days):
    days = validate.int_in(DEFAULTS["ca_days"] if days is None else days, "libvirt pki: ca_days", 0)
    if days < 1:
        raise SaltInvocationError("libvirt pki: ca_days must be at least 1")
    return days


def key_settings(key_type: str | None = None, key_size: Any = None) -> tuple[str, int]:
    """Validated (key_type, key_size): rsa 2048/3072/4096 (default 3072) or ec 256/384/521 (default 256)."""
    key_type = str(key_type or DEFAULTS["key_type"]).lower()
    if key_type not in KEY_TYPES:
        raise SaltInvocationError(f"libvirt pki: key_type must be one of {KEY_TYPES}, got {key_type!r}")
    key_size = validate.int_in(
        key_size or (DEFAULTS["key_size"] if key_type == "rsa" else 256), "libvirt pki: key_size", 0
    )
    allowed = RSA_SIZES if key_type == "rsa" else tuple(EC_CURVES)
    if key_size not in allowed:
        raise SaltInvocationError(f"libvirt pki: key_size for {key_type} must be one of {allowed}, got {key_size}")
    return key_type, key_size


def settings(
    days: Any = None, renew_days: Any = None, ca_days: Any = None, key_type: str | None = None, key_size: Any = None
) -> Data:
    """Validated validity and key parameters (missing ones from :data:`DEFAULTS`)."""
    out: Data = {
        "days": validate.int_in(DEFAULTS["days"] if days is None else days, "libvirt pki: days", 0),
        "renew_days": validate.int_in(
            DEFAULTS["renew_days"] if renew_days is None else renew_days, "libvirt pki: renew_days", 0
        ),
        "ca_days": validate.int_in(DEFAULTS["ca_days"] if ca_days is None else ca_days, "libvirt pki: ca_days", 0),
    }
    out["key_type"], out["key_size"] = key_settings(key_type, key_size)
    if out["days"] < 1 or out["ca_days"] < 1:
        raise SaltInvocationError("libvirt pki: days and ca_days must be at least 1")
    if out["renew_days"] >= out["days"]:
        raise SaltInvocationError(
            f"libvirt pki: renew_days ({out['renew_days']}) must be smaller than days ({out['days']}), "
            "or every pillar refresh would issue a new certificate"
        )
    return out


def _new_key(key_type, key_size):
    if key_type == "ec":
        return ec.generate_private_key(EC_CURVES[key_size]())
    return rsa.generate_private_key(public_exponent=65537, key_size=key_size)


def key_params(public_key: Any) -> tuple[str, int | None]:
    """('rsa', 3072) / ('ec', 256) for a public (or private) key."""
    if isinstance(public_key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return "rsa", public_key.key_size
    if isinstance(public_key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        return "ec", public_key.curve.key_size
    return type(public_key).__name__, None


def valid_minion_id(minion_id: Any) -> str:
    if (
        not isinstance(minion_id, str)
        or not minion_id
        or minion_id.startswith(".")
        or "/" in minion_id
        or "\0" in minion_id
    ):
        raise SaltInvocationError(f"libvirt pki: unusable minion id {minion_id!r}")
    return minion_id


# the CA ----------------------------------------------------------------------------------------
def _ca_paths(ca_dir):
    return os.path.join(ca_dir, "cacert.pem"), os.path.join(ca_dir, "cakey.pem")


def _new_ca(ca_dir, cn, days, key_type, key_size):
    cert_path, key_path = _ca_paths(ca_dir)
    key = _new_key(key_type, key_size)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG), x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = castore.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - castore.SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    castore.write(key_path, _key_pem(key), 0o600)
    castore.write(cert_path, _cert_pem(cert), 0o644)
    return cert, key


def ensure_ca(
    ca_dir: str, cn: str = CA_CN, days: Any = None, key_size: Any = None, key_type: str | None = None
) -> tuple[x509.Certificate, Any]:
    """Load the CA in ``ca_dir``, creating it (directory 0700, key 0600) the first time.

    Refuses (CommandExecutionError) a half-present CA (cert without key or the reverse: never
    overwritten) and an expired one."""
    ca_days = _ca_days(days)
    key_type, key_size = key_settings(key_type, key_size)
    castore.mkdir_private(ca_dir)
    cert_path, key_path = _ca_paths(ca_dir)
    with castore.locked(ca_dir):
        have_cert, have_key = os.path.exists(cert_path), os.path.exists(key_path)
        if not have_cert and not have_key:
            return _new_ca(ca_dir, cn, ca_days, key_type, key_size)
        if have_cert != have_key:
            missing = key_path if have_cert else cert_path
            raise CommandExecutionError(
                f"libvirt CA in {ca_dir} is incomplete ({missing} is missing). Restore it, or retire the CA "
                f"(move cacert.pem to {ca_dir}/previous/, remove cakey.pem) so a new one is created; see pki/README.md"
            )
        cert = x509.load_pem_x509_certificate(castore.read(cert_path))
        key = privkey.load_own(castore.read(key_path))
    if os.stat(key_path).st_mode & 0o777 != 0o600:
        os.chmod(key_path, 0o600)
    # RSA or EC keys only (key_settings), both have public_numbers()
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise CommandExecutionError(f"libvirt CA in {ca_dir}: cakey.pem does not belong to cacert.pem")
    if cert.not_valid_after_utc <= castore.now():
        raise CommandExecutionError(
            f"libvirt CA in {ca_dir} expired on {cert.not_valid_after_utc:%Y-%m-%d}: rotate it "
            f"(python3 -m saltvirt.pki.ca rotate-ca {ca_dir}, see pki/README.md)"
        )
    return cert, key


def ca_warning(ca_cert: x509.Certificate, renew_days: int = DEFAULTS["renew_days"], minimum: int = 90) -> str:
    """A message when the CA expires within max(renew_days, minimum) days, else ''."""
    left = ca_cert.not_valid_after_utc - castore.now()
    if left < datetime.timedelta(days=max(int(renew_days), minimum)):
        return (
            f"the libvirt CA expires in {max(left.days, 0)} days ({ca_cert.not_valid_after_utc:%Y-%m-%d}); "
            "certificates cannot outlive it: rotate it (see pki/README.md, CA rotation)"
        )
    return ""


def rotate_ca(
    ca_dir: str, cn: str = CA_CN, days: Any = None, key_type: str | None = None, key_size: Any = None
) -> Data:
    """Retire the current CA (its cert to ``previous/<date>-<serial>.pem``, still trusted; its key
    deleted) and create a new one. Every certificate is reissued on the next pillar compile."""
    ca_days = _ca_days(days)
    key_type, key_size = key_settings(key_type, key_size)
    old_cert, _old_key = ensure_ca(ca_dir)
    cert_path, key_path = _ca_paths(ca_dir)
    previous = os.path.join(ca_dir, "previous")
    with castore.locked(ca_dir):
        castore.mkdir_private(previous)
        retired = os.path.join(previous, f"{castore.now():%Y%m%dT%H%M%S}-{old_cert.serial_number:x}"[:40] + ".pem")
        castore.write(retired, castore.read(cert_path), 0o644)
        os.unlink(key_path)  # created by ensure_ca; a retired CA key has no further use
        os.unlink(cert_path)
        new = _new_ca(ca_dir, cn, ca_days, key_type, key_size)
    return {"retired": retired, "previous": summary(_cert_pem(old_cert)), "current": summary(_cert_pem(new[0]))}


def trusted_bundle(ca_dir: str) -> str:
    """PEM bundle: the current CA certificate plus unexpired retired ones in ``previous/``."""
    bundle = [castore.read(os.path.join(ca_dir, "cacert.pem"))]
    previous = os.path.join(ca_dir, "previous")
    if os.path.isdir(previous):
        for name in sorted(os.listdir(previous)):
            if name.endswith(".pem"):
                pem = castore.read(os.path.join(previous, name))
                if all(c.not_valid_after_utc > castore.now() for c in load_certs(pem)):
                    bundle.append(pem)
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in bundle).decode()


# names -----------------------------------------------------------------------------------------
def split_sans(sans: Iterable[Any]) -> tuple[set[str], set[Any]]:
    """({dns names, lower case}, {ip addresses}) from a list mixing both."""
    dns, ips = set(), set()
    for raw in sans or ():
        item = str(raw).strip()
        if not item:
            continue
        try:
            ips.add(ipaddress.ip_address(item))
        except ValueError:
            dns.add(item.lower().rstrip("."))
    return dns, ips


def cert_sans(cert: x509.Certificate) -> tuple[set[str], set[Any]]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return {d.lower() for d in ext.get_values_for_type(x509.DNSName)}, set(ext.get_values_for_type(x509.IPAddress))


def common_name(cert: x509.Certificate) -> str:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return attrs[0].value if attrs else ""  # type: ignore[return-value]  # a CN is a str (bytes: other OIDs)


def default_cn(minion_id: str, kind: str, cn: str | None = None) -> str:
    """Server: the host's FQDN (or id); client: "<id> libvirt client" (what libvirtd's
    ``tls_allowed_dn_list`` admits, :data:`CLIENT_DN_PATTERN`); QEMU's migration pair: "<id> qemu
    migration server|client", which libvirtd's allow list does not admit."""
    if kind == "server":
        return cn or minion_id
    if kind == "client":
        return f"{minion_id} libvirt client"
    return f"{minion_id} qemu migration {kind.split('-')[1]}"


# leaf certificates -----------------------------------------------------------------------------
def needs_renewal(
    cert: x509.Certificate,
    ca_cert: x509.Certificate,
    sans: Iterable[Any] | None = None,
    renew_days: int = DEFAULTS["renew_days"],
    kind: str = "server",
    cn: str | None = None,
    key: Any = None,
) -> tuple[bool, str]:
    """(True, reason) if ``cert`` must be reissued, else (False, '').

    ``sans``/``cn`` are the wanted names (None: not compared); ``key`` the wanted (key_type, key_size)."""
    if not signed_by(cert, ca_cert):
        return True, "not signed by the current CA"
    left = cert.not_valid_after_utc - castore.now()
    # a leaf is capped at the CA's expiry: reissuing only helps if the CA outlives this cert
    if left < datetime.timedelta(days=int(renew_days)) and (
        ca_cert.not_valid_after_utc - cert.not_valid_after_utc > datetime.timedelta(hours=1)
    ):
        return True, f"expires in {max(left.days, 0)} days (renewal window {renew_days} days)"
    if cn is not None and common_name(cert) != cn:
        return True, f"CN changed ({common_name(cert)} -> {cn})"
    if sans is not None and kind in SERVER_KINDS and cert_sans(cert) != split_sans(sans):
        return True, "SAN set changed"
    if key is not None and key_params(cert.public_key()) != tuple(key):
        have = " ".join(str(p) for p in key_params(cert.public_key()))
        return True, f"key parameters changed ({have} -> {key[0]} {key[1]})"
    return False, ""


def _leaf(ca_cert, ca_key, cn, kind, sans, days, key_type, key_size):
    key = _new_key(key_type, key_size)
    now = castore.now()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG), x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - castore.SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=key_type == "rsa",
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if kind in SERVER_KINDS else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if kind in SERVER_KINDS:
        dns, ips = split_sans(sans)
        names = [x509.DNSName(d) for d in sorted(dns)] + [x509.IPAddress(i) for i in sorted(ips, key=str)]
        if not names:
            raise SaltInvocationError(f"libvirt pki: a server certificate for {cn} needs at least one SAN")
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def issue(
    ca_dir: str,
    minion_id: str,
    kind: str,
    sans: Iterable[Any] | None = None,
    days: Any = None,
    renew_days: Any = None,
    key_size: Any = None,
    ca_days: Any = None,
    cn: str | None = None,
    key_type: str | None = None,
    force: bool = False,
) -> Data:
    """The ``kind`` (server|client) certificate + key of ``minion_id``: reused while valid, else (re)issued
    and stored under ``ca_dir/minions/<id>/``. Server certificates carry ``sans`` (DNS names and IPs;
    default: the minion id).

    Returns {'cert': pem, 'key': pem, 'issued': bool, 'reason': str, 'warning': str}."""
    if kind not in KINDS:
        raise SaltInvocationError(f"libvirt pki: kind must be one of {KINDS}, got {kind!r}")
    valid_minion_id(minion_id)
    params = settings(days=days, renew_days=renew_days, ca_days=ca_days, key_type=key_type, key_size=key_size)
    ca_cert, ca_key = ensure_ca(
        ca_dir, days=params["ca_days"], key_type=params["key_type"], key_size=params["key_size"]
    )
    server = kind in SERVER_KINDS
    sans = sorted({str(s) for s in (sans or [minion_id])}) if server else []
    taken = []
    if server:  # a name another minion's certificate holds is never handed out again
        held = claimed_elsewhere(ca_dir, minion_id)
        taken = [s for s in sans if _norm(s) in held]
        sans = [s for s in sans if _norm(s) not in held] or [minion_id]
        if _norm(minion_id) in held:
            raise CommandExecutionError(
                f"libvirt pki: the name {minion_id} is held by the certificate of {held[_norm(minion_id)]}: "
                "remove it from that minion's extra_sans"
            )
    cn = default_cn(minion_id, kind, cn)
    wanted_key = (params["key_type"], params["key_size"])
    minions = os.path.join(ca_dir, "minions")
    castore.mkdir_private(minions)
    directory = os.path.join(minions, minion_id)
    cert_path, key_path = os.path.join(directory, f"{kind}cert.pem"), os.path.join(directory, f"{kind}key.pem")
    with castore.locked(directory):
        reason = "forced" if force else "new"
        cert = old_cert = None
        if os.path.exists(cert_path):
            try:
                cert = x509.load_pem_x509_certificate(castore.read(cert_path))
            except ValueError:
                reason = "stored certificate unreadable"
        if cert is not None and not force:
            renew, reason = needs_renewal(
                cert, ca_cert, sans if server else None, params["renew_days"], kind, cn, wanted_key
            )
            if not renew:
                try:
                    key_pem = castore.read(key_path)
                    key = privkey.load_own(key_pem)
                except (OSError, ValueError):
                    renew, reason = True, "key missing or unreadable"
                else:
                    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
                        renew, reason = True, "key does not match the certificate"
            if not renew:
                if os.stat(key_path).st_mode & 0o777 != 0o600:
                    os.chmod(key_path, 0o600)
                return {
                    "cert": _cert_pem(cert).decode(),
                    "key": key_pem.decode(),
                    "issued": False,
                    "reason": "valid",
                    "warning": _warnings(ca_cert, params["renew_days"], taken),
                }
        old_cert = cert
        cert, key = _leaf(ca_cert, ca_key, cn, kind, sans, params["days"], params["key_type"], params["key_size"])
        castore.write(key_path, _key_pem(key), 0o600)
        castore.write(cert_path, _cert_pem(cert), 0o644)
    if old_cert is not None:  # the replaced certificate must stop working (the CRL in the pillar)
        crl.revoke(ca_dir, ca_cert, ca_key, [old_cert], f"{minion_id} {kind}: reissued ({reason})")
    return {
        "cert": _cert_pem(cert).decode(),
        "key": _key_pem(key).decode(),
        "issued": True,
        "reason": reason,
        "warning": _warnings(ca_cert, params["renew_days"], taken),
    }


def _warnings(ca_cert, renew_days, taken):
    out = [ca_warning(ca_cert, renew_days)]
    if taken:
        out.append(f"left out SAN(s) {', '.join(taken)}: another minion's certificate holds them")
    return "; ".join(w for w in out if w)


def _norm(name):
    dns, ips = split_sans([name])
    return str(next(iter(ips))) if ips else next(iter(dns), "")


def claimed_elsewhere(ca_dir: str, minion_id: str) -> dict[str, str]:
    """{name: minion id} for every SAN a server certificate of another minion below ``ca_dir`` holds."""
    held: dict[str, str] = {}
    minions = os.path.join(ca_dir, "minions")
    for other in sorted(os.listdir(minions)) if os.path.isdir(minions) else ():
        if other == minion_id:
            continue
        for kind in SERVER_KINDS:
            try:
                cert = x509.load_pem_x509_certificate(castore.read(os.path.join(minions, other, f"{kind}cert.pem")))
            except (OSError, ValueError):
                continue
            dns, ips = cert_sans(cert)
            held.update({n: other for n in dns})
            held.update({str(i): other for i in ips})
    return held


def summary(pem: str | bytes) -> Data:
    """What a certificate is, without secrets: subject, issuer, serial, validity, SANs, fingerprint."""
    cert = load_cert(pem)
    dns, ips = cert_sans(cert)
    return {
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial": f"{cert.serial_number:x}",
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": cert.not_valid_after_utc.isoformat(),
        "san_dns": sorted(dns),
        "san_ip": sorted(str(i) for i in ips),
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
    }


def inventory(ca_dir: str) -> Data:
    """Summaries of the CA, the retired CAs and every minion certificate below ``ca_dir`` (no keys)."""
    out: Data = {"ca": summary(castore.read(os.path.join(ca_dir, "cacert.pem"))), "previous": [], "minions": {}}
    previous = os.path.join(ca_dir, "previous")
    if os.path.isdir(previous):
        out["previous"] = [
            summary(castore.read(os.path.join(previous, n))) for n in sorted(os.listdir(previous)) if n.endswith(".pem")
        ]
    minions = os.path.join(ca_dir, "minions")
    for minion_id in sorted(os.listdir(minions)) if os.path.isdir(minions) else ():
        for kind in KINDS:
            path = os.path.join(minions, minion_id, f"{kind}cert.pem")
            if os.path.exists(path):
                out["minions"].setdefault(minion_id, {})[kind] = summary(castore.read(path))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python3 -m saltvirt.pki show|rotate-ca CA_DIR``: prints the result as JSON."""
    parser = argparse.ArgumentParser(prog="python3 -m saltvirt.pki.ca", description="salt-virt libvirt CA")
    sub = parser.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show", help="CA, retired CAs and minion certificates (no keys)")
    show.add_argument("ca_dir")
    rot = sub.add_parser("rotate-ca", help="retire the CA (still trusted from previous/) and create a new one")
    rot.add_argument("ca_dir")
    rot.add_argument("--days", type=int)
    rot.add_argument("--key-type", choices=KEY_TYPES)
    rot.add_argument("--key-size", type=int)
    args = parser.parse_args(argv)
    if args.cmd == "show":
        result = inventory(args.ca_dir)
    else:
        result = rotate_ca(args.ca_dir, days=args.days, key_type=args.key_type, key_size=args.key_size)
    print(json.dumps(result, indent=2))
    return 0
