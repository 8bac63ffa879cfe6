"""Private keys this host made itself (its minion key, the CA's key, the keys the CA issued), read back.

cryptography checks an RSA key's consistency (p, q, d against n) on every load: 57 ms of CPU for a 2048-bit
key, 314 ms for 4096 (measured, cryptography 50). A hypervisor signs each answer in a fresh job process,
and the master reads the CA key on each pillar compile, so that check was most of a signed answer's cost.
It guards against keys from elsewhere; these files are root's own (0600, written by Salt or by
:mod:`saltvirt.pki.ca`). A damaged one still cannot leak itself: OpenSSL verifies every CRT result of a
private-key operation and recomputes it without CRT on a mismatch, and the master verifies each answer
with the accepted public key, so a bad key gives refused answers, nothing more.
"""

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes


def load_own(pem: bytes) -> PrivateKeyTypes:
    """The unencrypted PEM private key ``pem``, which this host wrote itself (never a caller's key)."""
    return serialization.load_pem_private_key(pem, password=None, unsafe_skip_rsa_key_validation=True)
