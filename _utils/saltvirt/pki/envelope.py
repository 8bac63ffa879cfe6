"""Seal a secret (a new VM minion's private key) so that exactly one minion can open it.

Why: ``salt-run virt.init`` generates the new minion's key pair on the master, pre-accepts the public
half and sends the private half to the chosen hypervisor, which writes it into the guest's disk. Salt
publications are encrypted with the AES session key that *every* minion holds, and the publication's
arguments land in the master's job cache, so a plain PEM argument would be readable by every minion
and by anyone reading the job cache. Instead the runner seals it:

* a fresh 256-bit content key encrypts the secret with AES-256-GCM (authenticated; the recipient's key
  fingerprint and a context string are bound in as associated data);
* the content key is encrypted with RSA-OAEP (SHA-256) to the hypervisor minion's *accepted* public
  key, read from the master's key store (``<pki_dir>/minions/<id>``), never from what a minion says;
* :func:`unseal` runs on that hypervisor with its own ``<pki_dir>/minion.pem``. Another minion holding
  the envelope cannot open it (wrong RSA key), and a tampered envelope fails the GCM tag check.

An envelope is bound to its purpose: the context (``<minion_id>/priv_key``, ``<vm>/graphics``), the Salt
job it was published in, a random id and the sealing time are authenticated data. :func:`unseal` opens it
only for the context and job the caller names, at most ``MAX_AGE`` after sealing, and once: the ids it
opened are remembered (``replay_cache``) until they expire. Every minion sees every publication and the
job cache keeps them, so without this an envelope passed elsewhere (e.g. a VM's sealed key as another
VM's console password) would make the hypervisor a decryption oracle.

The envelope is plain JSON-able data: ``{v, alg, kid, context, job, id, iat, ek, nonce, ct}``.
"""

import base64
import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import Data
from saltvirt.pki import privkey

VERSION = 2
ALG = "RSA-OAEP-SHA256+A256GCM"
_FIELDS = ("v", "alg", "kid", "ek", "nonce", "ct")
MAX_AGE = 24 * 3600  # an envelope older than this is refused (and its id forgotten by the replay cache)
CLOCK_SKEW = 300
PURPOSE_REFUSED = (
    "the sealed secret was not sealed as {context}: an envelope opens only for the purpose salt-run virt.init "
    "sealed it for; pass it nowhere else"
)
JOB_REFUSED = "the sealed secret belongs to another job: it opens only in the job salt-run virt.init published it in"
REPLAY_REFUSED = "the sealed secret was opened before: an envelope opens once; run salt-run virt.init again"
EXPIRED_REFUSED = "the sealed secret has expired or its time is invalid: run salt-run virt.init again"


def _oaep():
    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _unb64(text, field):
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except Exception:  # noqa: BLE001 - any decoding problem is the same user-facing error
        raise SaltInvocationError(f"sealed key: field {field!r} is not valid base64") from None


def _load_public(pub_pem):
    data = pub_pem.encode() if isinstance(pub_pem, str) else pub_pem
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise SaltInvocationError(f"cannot seal: the recipient's public key is not a PEM public key ({exc})") from None
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
        raise SaltInvocationError("cannot seal: the recipient's key must be an RSA key of at least 2048 bits")
    return key


def fingerprint(pub: str | bytes) -> str:
    """SHA-256 of the DER SubjectPublicKeyInfo: the same for PKCS#1 and SPKI PEM spellings of a key."""
    key = _load_public(pub) if isinstance(pub, (str, bytes)) else pub
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _aad(env: Data) -> str:
    parts = (env["kid"], env.get("context") or "", env.get("job") or "", env.get("id") or "", str(env.get("iat")))
    return f"salt-virt/envelope/v{VERSION}|" + "|".join(parts)


def new_keypair(bits: int = 2048) -> tuple[str, str]:
    """A fresh RSA key pair for a new minion: ``(public PEM (SPKI), private PEM (PKCS#1))``, as Salt
    writes them (``minion.pub`` / ``minion.pem``)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pub.decode(), priv


def keypair_maker(bits: int = 2048) -> Callable[[], tuple[str, str]]:
    """:func:`new_keypair` started now in a thread: RSA generation (14-80 ms for 2048 bits) releases the
    GIL and runs beside the caller's own work. Call the returned function for the pair: it waits for it
    and raises what the generation raised."""
    box: dict[str, Any] = {}

    def make() -> None:
        try:
            box["pair"] = new_keypair(bits)
        except Exception as exc:  # noqa: BLE001 - handed to whoever asks for the pair
            box["error"] = exc

    thread = threading.Thread(target=make, daemon=True, name="new minion key pair")
    thread.start()

    def pair() -> tuple[str, str]:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["pair"]

    return pair


def seal(pub_pem: str | bytes, secret: str, context: str, job: str) -> Data:
    """Encrypt ``secret`` (str) for the holder of the private key matching ``pub_pem``, to be opened only
    as ``context`` (e.g. ``web1/priv_key``) in Salt job ``job`` (the jid the runner publishes it in)."""
    if not isinstance(secret, (str, bytes)) or not secret:
        raise SaltInvocationError("cannot seal an empty secret")
    if not context or not job:
        raise SaltInvocationError("cannot seal without a context and a job: an envelope is bound to its purpose")
    plain = secret.encode() if isinstance(secret, str) else secret
    key = _load_public(pub_pem)
    env = {
        "v": VERSION,
        "alg": ALG,
        "kid": fingerprint(key),
        "context": str(context),
        "job": str(job),
        "id": _b64(os.urandom(16)),
        "iat": int(time.time()),
    }
    cek = AESGCM.generate_key(bit_length=256)
    nonce = os.urandom(12)
    ct = AESGCM(cek).encrypt(nonce, plain, _aad(env).encode())
    return dict(env, ek=_b64(key.encrypt(cek, _oaep())), nonce=_b64(nonce), ct=_b64(ct))


def is_envelope(value: Any) -> bool:
    return isinstance(value, dict) and all(f in value for f in _FIELDS)


def _minion_private_key(pki_dir):
    path = os.path.join(pki_dir or "", "minion.pem")
    try:
        with open(path, "rb") as fh:
            return privkey.load_own(fh.read())
    except FileNotFoundError:
        raise CommandExecutionError(
            f"cannot open the sealed key: this minion's private key {path} does not exist (is pki_dir right?)"
        ) from None
    except (OSError, ValueError, TypeError) as exc:
        raise CommandExecutionError(f"cannot open the sealed key: cannot read {path}: {exc}") from None


def _remember(replay_cache: str | None, env_id: str, now: float) -> None:
    """Record ``env_id`` as opened in the file ``replay_cache`` (``<id> <expiry>`` lines, locked; expired
    lines dropped); raise if it was opened before. None: no cache (a caller outside a minion job)."""
    if not replay_cache:
        return
    os.makedirs(os.path.dirname(replay_cache) or ".", mode=0o700, exist_ok=True)
    fd = os.open(replay_cache, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        live = {}
        for line in fh.read().splitlines():
            seen, _, expiry = line.partition(" ")
            with contextlib.suppress(ValueError):
                if float(expiry) > now:
                    live[seen] = expiry
        if env_id in live:
            raise CommandExecutionError(REPLAY_REFUSED)
        live[env_id] = str(int(now + MAX_AGE + CLOCK_SKEW))
        fh.seek(0)
        fh.truncate()
        fh.write("".join(f"{k} {v}\n" for k, v in live.items()))


def unseal(envelope: Any, pki_dir: str, context: str, job: str, replay_cache: str | None = None) -> str:
    """Open an envelope with this minion's key (``<pki_dir>/minion.pem``) as ``context`` in job ``job``;
    returns the secret as str. Refused: another context or job, too old, already opened (``replay_cache``:
    the file remembering opened envelopes). No refusal shows anything of the secret."""
    if not is_envelope(envelope):
        raise SaltInvocationError(f"sealed key: not an envelope (needs fields {', '.join(_FIELDS)})")
    if envelope["v"] != VERSION or envelope["alg"] != ALG:
        raise SaltInvocationError(
            f"sealed key: unsupported envelope v={envelope['v']!r} alg={envelope['alg']!r} "
            f"(this salt-virt reads v{VERSION} {ALG}): update salt-virt on this hypervisor"
        )
    if not context or envelope.get("context") != context:
        raise CommandExecutionError(PURPOSE_REFUSED.format(context=context))
    if not job or str(envelope.get("job")) != str(job):
        raise CommandExecutionError(JOB_REFUSED)
    now = time.time()
    iat = envelope.get("iat")
    if not isinstance(iat, int) or isinstance(iat, bool) or not now - MAX_AGE <= iat <= now + CLOCK_SKEW:
        raise CommandExecutionError(EXPIRED_REFUSED)
    key = _minion_private_key(pki_dir)
    mine = fingerprint(key.public_key())
    if mine != envelope["kid"]:
        raise CommandExecutionError(
            f"the sealed key was sealed for another minion (key {envelope['kid'][:16]}...), not for this one "
            f"(key {mine[:16]}...): it was meant for a different hypervisor, or this minion's key changed "
            "since the master accepted it"
        )
    try:
        cek = key.decrypt(_unb64(envelope["ek"], "ek"), _oaep())
        plain = AESGCM(cek).decrypt(
            _unb64(envelope["nonce"], "nonce"),
            _unb64(envelope["ct"], "ct"),
            _aad(envelope).encode(),
        )
    except (SaltInvocationError, CommandExecutionError):
        raise
    except Exception:  # noqa: BLE001 - InvalidTag/ValueError: tampered or corrupt, never say more
        raise CommandExecutionError("the sealed key could not be opened: it is corrupt or was tampered with") from None
    _remember(replay_cache, str(envelope.get("id")), now)
    return plain.decode()
