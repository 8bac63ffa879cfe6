"""Revocation at the level of one ``ca_dir``: the CRL the ``libvirt`` pillar carries, revoking certificates
and retiring a minion that is no longer a hypervisor (:func:`sweep`, run by the ``libvirt`` ext_pillar).

Above :mod:`saltvirt.pki.ca` (it loads the CA) and :mod:`saltvirt.pki.crl` (the list itself, kept given the
CA's certificate and key); see :mod:`saltvirt.pki.crl` for the on-disk layout.
"""

import os
from collections.abc import Callable, Iterable

from cryptography import x509

from saltvirt.pki import ca, castore, crl


def crl_pem(ca_dir: str) -> str:
    """The current CRL (PEM text) of the CA in ``ca_dir``, rebuilt if missing, stale or signed by a retired CA."""
    ca_cert, ca_key = ca.ensure_ca(ca_dir)
    return crl.current(ca_dir, ca_cert, ca_key)


def revoke(ca_dir: str, certs: Iterable[x509.Certificate], reason: str) -> list[str]:
    """Put ``certs`` (signed by the current CA of ``ca_dir``) on the CRL; returns the serials added."""
    ca_cert, ca_key = ca.ensure_ca(ca_dir)
    return crl.revoke(ca_dir, ca_cert, ca_key, certs, reason)


def retire_minion(ca_dir: str, minion_id: str, reason: str) -> list[str]:
    """Revoke every certificate of ``minion_id`` and move its directory to ``retired/``."""
    ca.valid_minion_id(minion_id)
    directory = os.path.join(ca_dir, "minions", minion_id)
    if not os.path.isdir(directory):
        return []
    certs: list[x509.Certificate] = []
    for kind in ca.KINDS:
        try:
            certs.append(ca.load_cert(castore.read(os.path.join(directory, f"{kind}cert.pem"))))
        except (OSError, ValueError):
            continue
    added = revoke(ca_dir, certs, f"{minion_id}: {reason}")
    retired = os.path.join(ca_dir, "retired")
    castore.mkdir_private(retired)
    with castore.locked(directory):
        os.rename(directory, os.path.join(retired, f"{minion_id}-{castore.now():%Y%m%dT%H%M%S%f}"))
    return added


def sweep(ca_dir: str, still_hypervisor: Callable[[str], bool]) -> dict[str, list[str]]:
    """Retire every minion below ``ca_dir`` for which ``still_hypervisor(id)`` is False:
    ``{id: [revoked serials]}``."""
    minions = os.path.join(ca_dir, "minions")
    out: dict[str, list[str]] = {}
    for minion_id in sorted(os.listdir(minions)) if os.path.isdir(minions) else ():
        if not os.path.isdir(os.path.join(minions, minion_id)) or still_hypervisor(minion_id):
            continue
        out[minion_id] = retire_minion(ca_dir, minion_id, "no longer a hypervisor (key deleted or not configured)")
    return out
