"""The libvirt CA's certificate revocation list, kept with the CA on the master.

A certificate is revoked when it is reissued (renewal, SAN/CN/key change, ``force``) and when its
minion stops being a hypervisor (its key deleted on the master, or no longer in ``virt:hypervisors``:
:func:`sweep`, run by the ``libvirt`` ext_pillar). The ``libvirt`` pillar carries the CRL; the
``virt.keys`` state writes it where libvirtd (``crl_file``) and QEMU (``ca-crl.pem``) read it.

On-disk layout below ``ca_dir``::

    crl/revoked.json      [{serial, revoked_at, reason, not_after}]  (the record; 0600)
    crl/crl.pem           the signed CRL, rebuilt when the record or the CA changes
    retired/<id>-<time>/  the certificates and keys of a minion that is no longer a hypervisor

The CRL's nextUpdate is the CA's expiry: libvirtd (GnuTLS) refuses every client once a CRL is past
its nextUpdate, and this CRL only changes when the master compiles a hypervisor's pillar. Certificates
signed by a retired CA cannot be listed (its key is gone): they stop working when ``previous/`` no
longer holds that CA, or when they expire.
"""

import datetime
import json
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from saltvirt.pki import ca as pki


def _paths(ca_dir):
    folder = os.path.join(ca_dir, "crl")
    return folder, os.path.join(folder, "revoked.json"), os.path.join(folder, "crl.pem")


def _record(path):
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, list) else []
    except (OSError, ValueError):
        return []


def _build(ca_cert, ca_key, record):
    now = pki._now()
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - pki._SKEW)
        .next_update(ca_cert.not_valid_after_utc)
        .add_extension(x509.CRLNumber(len(record) + int(now.timestamp())), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    for entry in record:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(int(entry["serial"], 16))
            .revocation_date(datetime.datetime.fromisoformat(entry["revoked_at"]))
            .build()
        )
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _fresh(pem, ca_cert, record):
    try:
        crl = x509.load_pem_x509_crl(pem)
    except ValueError:
        return False
    listed = {f"{r.serial_number:x}" for r in crl}
    return (
        crl.issuer == ca_cert.subject
        and crl.is_signature_valid(ca_cert.public_key())
        and listed == {e["serial"] for e in record}
        and crl.next_update_utc is not None
        and crl.next_update_utc >= ca_cert.not_valid_after_utc - datetime.timedelta(minutes=1)
    )


def crl_pem(ca_dir):
    """The current CRL (PEM text), rebuilt if missing, stale or signed by a retired CA."""
    ca_cert, ca_key = pki.ensure_ca(ca_dir)
    folder, record_path, crl_path = _paths(ca_dir)
    with pki._locked(folder):
        record = _prune(_record(record_path))
        try:
            pem = pki._read(crl_path)
        except OSError:
            pem = b""
        if not _fresh(pem, ca_cert, record):
            pem = _build(ca_cert, ca_key, record)
            pki._write(crl_path, pem, 0o644)
    return pem.decode()


def _prune(record):
    """Entries of certificates that have expired anyway are dropped (the CRL stays small)."""
    now = pki._now()
    return [e for e in record if datetime.datetime.fromisoformat(e["not_after"]) > now]


def revoke(ca_dir, certs, reason):
    """Put ``certs`` (signed by the current CA) on the CRL; returns the serials added."""
    ca_cert, ca_key = pki.ensure_ca(ca_dir)
    folder, record_path, crl_path = _paths(ca_dir)
    added = []
    with pki._locked(folder):
        record = _prune(_record(record_path))
        known = {e["serial"] for e in record}
        for cert in certs:
            serial = f"{cert.serial_number:x}"
            if serial in known or not pki.signed_by(cert, ca_cert) or cert.not_valid_after_utc <= pki._now():
                continue
            record.append(
                {
                    "serial": serial,
                    "revoked_at": pki._now().isoformat(),
                    "reason": str(reason)[:200],
                    "subject": cert.subject.rfc4514_string(),
                    "not_after": cert.not_valid_after_utc.isoformat(),
                }
            )
            added.append(serial)
        if added:
            pki._write(record_path, json.dumps(record, indent=1).encode(), 0o600)
            pki._write(crl_path, _build(ca_cert, ca_key, record), 0o644)
    return added


def revoked(ca_dir):
    """The record: what is revoked, when and why (no secrets)."""
    return _record(_paths(ca_dir)[1])


def retire_minion(ca_dir, minion_id, reason):
    """Revoke every certificate of ``minion_id`` and move its directory to ``retired/``."""
    pki.valid_minion_id(minion_id)
    directory = os.path.join(ca_dir, "minions", minion_id)
    if not os.path.isdir(directory):
        return []
    certs = []
    for kind in pki.KINDS:
        try:
            certs.append(pki.load_cert(pki._read(os.path.join(directory, f"{kind}cert.pem"))))
        except (OSError, ValueError):
            continue
    added = revoke(ca_dir, certs, f"{minion_id}: {reason}")
    retired = os.path.join(ca_dir, "retired")
    pki._mkdir_private(retired)
    with pki._locked(directory):
        os.rename(directory, os.path.join(retired, f"{minion_id}-{pki._now():%Y%m%dT%H%M%S%f}"))
    return added


def sweep(ca_dir, still_hypervisor):
    """Retire every minion below ``ca_dir`` for which ``still_hypervisor(id)`` is False:
    ``{id: [revoked serials]}``."""
    minions = os.path.join(ca_dir, "minions")
    out = {}
    for minion_id in sorted(os.listdir(minions)) if os.path.isdir(minions) else ():
        if not os.path.isdir(os.path.join(minions, minion_id)) or still_hypervisor(minion_id):
            continue
        out[minion_id] = retire_minion(ca_dir, minion_id, "no longer a hypervisor (key deleted or not configured)")
    return out
