"""The libvirt CA's certificate revocation list, kept with the CA on the master.

A certificate is revoked when it is reissued (renewal, SAN/CN/key change, ``force``) and when its
minion stops being a hypervisor (its key deleted on the master, or no longer in ``virt:hypervisors``:
:func:`saltvirt.pki.revocation.sweep`, run by the ``libvirt`` ext_pillar). The ``libvirt`` pillar carries the CRL; the
``virt.keys`` state writes it where libvirtd (``crl_file``) and QEMU (``ca-crl.pem``) read it.

On-disk layout below ``ca_dir``::

    crl/revoked.json      [{serial, revoked_at, reason, not_after}]  (the record; 0600)
    crl/crl.pem           the signed CRL, rebuilt when the record or the CA changes
    retired/<id>-<time>/  the certificates and keys of a minion that is no longer a hypervisor

The CRL's nextUpdate is the CA's expiry: libvirtd (GnuTLS) refuses every client once a CRL is past
its nextUpdate, and this CRL only changes when the master compiles a hypervisor's pillar. Certificates
signed by a retired CA cannot be listed (its key is gone): they stop working when ``previous/`` no
longer holds that CA, or when they expire.

This module keeps the CRL given the CA's certificate and key (it never loads the CA itself:
:mod:`saltvirt.pki.ca` imports it to revoke what it reissues); :mod:`saltvirt.pki.revocation` holds the
``ca_dir``-level operations above both.
"""

import datetime
import json
import os
from collections.abc import Iterable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from saltvirt.base.salttypes import Data
from saltvirt.pki import castore


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
    now = castore.now()
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - castore.SKEW)
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


def current(ca_dir: str, ca_cert: x509.Certificate, ca_key: Any) -> str:
    """The current CRL of the CA ``ca_cert``/``ca_key`` (PEM text), rebuilt if missing, stale or signed by
    a retired CA."""
    folder, record_path, crl_path = _paths(ca_dir)
    with castore.locked(folder):
        record = _prune(_record(record_path))
        try:
            pem = castore.read(crl_path)
        except OSError:
            pem = b""
        if not _fresh(pem, ca_cert, record):
            pem = _build(ca_cert, ca_key, record)
            castore.write(crl_path, pem, 0o644)
    return pem.decode()


def _prune(record):
    """Entries of certificates that have expired anyway are dropped (the CRL stays small)."""
    now = castore.now()
    return [e for e in record if datetime.datetime.fromisoformat(e["not_after"]) > now]


def revoke(
    ca_dir: str, ca_cert: x509.Certificate, ca_key: Any, certs: Iterable[x509.Certificate], reason: str
) -> list[str]:
    """Put ``certs`` signed by ``ca_cert`` on the CRL; returns the serials added (others are skipped:
    already listed, expired, or signed by another CA)."""
    folder, record_path, crl_path = _paths(ca_dir)
    added: list[str] = []
    with castore.locked(folder):
        record = _prune(_record(record_path))
        known = {e["serial"] for e in record}
        for cert in certs:
            serial = f"{cert.serial_number:x}"
            if serial in known or not castore.signed_by(cert, ca_cert) or cert.not_valid_after_utc <= castore.now():
                continue
            record.append(
                {
                    "serial": serial,
                    "revoked_at": castore.now().isoformat(),
                    "reason": str(reason)[:200],
                    "subject": cert.subject.rfc4514_string(),
                    "not_after": cert.not_valid_after_utc.isoformat(),
                }
            )
            added.append(serial)
        if added:
            castore.write(record_path, json.dumps(record, indent=1).encode(), 0o600)
            castore.write(crl_path, _build(ca_cert, ca_key, record), 0o644)
    return added


def revoked(ca_dir: str) -> list[Data]:
    """The record: what is revoked, when and why (no secrets)."""
    return _record(_paths(ca_dir)[1])
