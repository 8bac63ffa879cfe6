"""Answers a hypervisor signs with its minion key, so the runner believes only what that hypervisor said.

Why: the ``virt`` runner publishes to the hypervisors and reads their answers from the master's event bus
(``salt/job/<jid>/ret/<id>``). That bus is not an authenticated channel in Salt 3008.5: any minion can
fire any tag on it (``_minion_event``'s batch form; ``MINION_EVENT_BLACKLIST`` covers
``salt/job/*/return``, not ``salt/job/*/ret/*``), and a minion's return may carry a ``resource_id`` that
the master's ``_return`` puts in place of the authenticated id before it fires the event and writes the
job cache. With zeromq's defaults every minion also decrypts every publication, so a guest learns each
jid as it is published. Neither the bus nor the job cache tells who really answered.

So the runner publishes ``virt.answer`` (a hypervisor-side wrapper) with a fresh random ``nonce``; the
hypervisor runs the asked function and signs ``(id, fun, nonce, sha256(body))`` with its own
``<pki_dir>/minion.pem`` (RSA-PSS, SHA-256). The runner verifies the signature with the public key the
master *accepted* for the minion it asked (:func:`saltvirt.fleet.minionkeys.accepted_pub`) and that id,
function and nonce are the ones it published. A forged answer fails one of these and is ignored; an old
answer does not carry the new nonce. The body is the answer serialized once (msgpack, as Salt's own
returns), so both sides hash the same bytes.

An answer is plain data: ``{"saltvirt_answer": 1, "id", "fun", "nonce", "body", "sig"}``.
"""

import base64
import functools
import hashlib
import json
import os
import secrets
from collections.abc import Callable
from typing import Any, TypeGuard

import salt.payload
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from saltvirt.base import jobfence
from saltvirt.base.salttypes import Data
from saltvirt.pki import privkey

VERSION = 1
MARK = "saltvirt_answer"
_CONTEXT = b"salt-virt/answer/v1\0"


class Unverified(ValueError):  # noqa: N818 - reads as what it says: raise Unverified("why")
    """An answer that does not prove it comes from the minion that was asked (the reason is the message)."""


def new_nonce() -> str:
    """A fresh request nonce: letters first, so Salt never reads it as a number."""
    return "n" + secrets.token_hex(16)


def _pss() -> padding.PSS:
    return padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)


def _signed_bytes(minion_id: str, fun: str, nonce: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return _CONTEXT + json.dumps([minion_id, fun, nonce, digest]).encode()


@functools.lru_cache(maxsize=4)
def _private_key(path: str, mtime_ns: int) -> rsa.RSAPrivateKey:
    with open(path, "rb") as fh:
        key = privkey.load_own(fh.read())
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError(f"{path} is not an RSA private key")
    return key


def sign(pki_dir: str, minion_id: str, fun: str, nonce: str, ret: Any, retcode: int = 0) -> Data:
    """This minion's signed answer ``ret`` (with ``retcode``) to ``fun`` asked with ``nonce``."""
    path = os.path.join(pki_dir or "", "minion.pem")
    key = _private_key(path, os.stat(path).st_mtime_ns)
    body = salt.payload.dumps({"ret": ret, "retcode": retcode})
    sig = key.sign(_signed_bytes(minion_id, fun, nonce, body), _pss(), hashes.SHA256())
    return {
        MARK: VERSION,
        "id": minion_id,
        "fun": fun,
        "nonce": nonce,
        "body": base64.b64encode(body).decode("ascii"),
        "sig": base64.b64encode(sig).decode("ascii"),
    }


def is_answer(value: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(value, dict) and value.get(MARK) == VERSION


@functools.lru_cache(maxsize=1024)
def _public_key(pub_pem: str) -> rsa.RSAPublicKey:
    key = serialization.load_pem_public_key(pub_pem.encode())
    if not isinstance(key, rsa.RSAPublicKey):
        raise Unverified("the accepted key is not an RSA key")
    return key


def verify(pub_pem: str, minion_id: str, fun: str, nonce: str, answer: Any) -> tuple[Any, int]:
    """``(ret, retcode)`` of ``answer`` if ``minion_id`` (whose accepted public key is ``pub_pem``) signed
    it for ``fun`` and ``nonce``; else :class:`Unverified`."""
    if not is_answer(answer):
        raise Unverified("not a signed salt-virt answer")
    for field, want in (("id", minion_id), ("fun", fun), ("nonce", nonce)):
        if answer.get(field) != want:
            raise Unverified(f"signed for another {field}")
    try:
        body = base64.b64decode(str(answer["body"]).encode("ascii"), validate=True)
        sig = base64.b64decode(str(answer["sig"]).encode("ascii"), validate=True)
    except (KeyError, ValueError):
        raise Unverified("body or signature is not base64") from None
    try:
        _public_key(pub_pem).verify(sig, _signed_bytes(minion_id, fun, nonce, body), _pss(), hashes.SHA256())
    except (InvalidSignature, ValueError):
        raise Unverified("the signature does not match the accepted key") from None
    data = salt.payload.loads(body)
    if not isinstance(data, dict) or "ret" not in data:
        raise Unverified("the signed body has no answer")
    retcode = data.get("retcode")
    return data["ret"], retcode if isinstance(retcode, int) else 0


# the hypervisor side: run what the runner asked and sign the outcome ---------------------------------
JOB_CHECK = "saltutil.find_job"  # the one non-virt function: "is this job still running here?"


def allowed(fun: Any) -> bool:
    """``virt.answer`` runs only ``virt.*`` functions and the job check: it is no way around an ACL."""
    return isinstance(fun, str) and (fun == JOB_CHECK or (fun.startswith("virt.") and fun != "virt.answer"))


def outcome(
    funcs: Any,
    context: Any,
    fun: str,
    args: Any,
    kwargs: Any,
    pub: dict[str, Any],
    before: Callable[[], None] | None = None,
) -> tuple[Any, int]:
    """``(ret, retcode)`` of ``funcs[fun](*args, **kwargs, **pub)`` as Salt's minion reports a job: an error
    is Salt's ``ERROR: ...`` text with retcode 1 (``fun`` missing: Salt's "is not available" text).
    ``pub``: the wrapper's ``__pub_*`` keywords, so the function sees the same job (user, jid). ``before()``:
    a check that may refuse the call (raised errors are reported as the function's own)."""
    from salt.exceptions import CommandExecutionError, SaltInvocationError  # noqa: PLC0415 - the minion side only

    if fun not in funcs:
        return f"'{fun}' is not available.", 254
    try:
        if before is not None:
            before()
        ret = funcs[fun](*(args or ()), **dict(kwargs or {}, **pub))
    except SaltInvocationError as exc:
        return f"ERROR executing '{fun}': {exc}", 1
    except CommandExecutionError as exc:
        return f"ERROR: {exc}", 1
    except TypeError as exc:
        return f"Passed invalid arguments to {fun}: {exc}", 1
    retcode = context.get("retcode", 0) if hasattr(context, "get") else 0
    return ret, retcode if isinstance(retcode, int) else 1


def fenced_outcome(
    funcs: Any,
    context: Any,
    cachedir: str,
    fun: str,
    args: Any,
    kwargs: Any,
    pub: dict[str, Any],
    own: dict[str, Any],
    before: Callable[[], None] | None = None,
) -> tuple[Any, int]:
    """:func:`outcome` as job ``pub['__pub_jid']``, under :mod:`saltvirt.base.jobfence`: a job the master
    was told is not running here does nothing when it starts late, and the job check's "not running"
    fences the job it names (``{}``: not running; anything else: running)."""
    from salt.exceptions import CommandExecutionError  # noqa: PLC0415 - the minion side only

    if fun == JOB_CHECK:
        ret, retcode = outcome(funcs, context, fun, args, kwargs, own)
        checked = str((args or [""])[0])
        if jobfence.still_running(cachedir, checked, bool(ret) and not retcode):
            return ret or {"jid": checked}, 0
        return {}, 0
    try:
        with jobfence.running_job(cachedir, pub.get("__pub_jid")):
            return outcome(funcs, context, fun, args, kwargs, own, before)
    except CommandExecutionError as exc:  # fenced before it started (outcome reports the function's own)
        return f"ERROR: {exc}", 1


# capacity a hypervisor pushes (docs/topics/capacity.md "Pushed capacity") ------------------------------
# A record is an answer signed for this function name and nonce: never one the runner asked for (those carry a
# fresh random nonce), so neither can pass for the other. The body holds when it was measured (``at``).
PUSH_FUN = "virt.capacity_record"
PUSH_NONCE = "push"
# what virt.answer says when the host's own check refuses a virt.init (nothing created): the runner falls over to
# its next candidate on these words
NO_ROOM = "this hypervisor has no room now"
MINE_KEY = "saltvirt_capacity"  # the hypervisor's Salt mine entry holding its latest record


def sign_record(pki_dir: str, minion_id: str, capacity: Any, at: float) -> Data:
    """This minion's signed capacity record: ``capacity`` (``virt.capacity``'s answer) measured at ``at``."""
    return sign(pki_dir, minion_id, PUSH_FUN, PUSH_NONCE, {"at": at, "capacity": capacity})


def verify_record(pub_pem: str, minion_id: str, record: Any) -> tuple[float, Any]:
    """``(at, capacity)`` of ``record`` if ``minion_id`` (accepted key ``pub_pem``) signed it; else
    :class:`Unverified`."""
    ret, _retcode = verify(pub_pem, minion_id, PUSH_FUN, PUSH_NONCE, record)
    if not isinstance(ret, dict) or not isinstance(ret.get("capacity"), dict):
        raise Unverified("the signed record holds no capacity")
    try:
        at = float(ret["at"])
    except (KeyError, TypeError, ValueError):
        raise Unverified("the signed record has no time") from None
    return at, ret["capacity"]
