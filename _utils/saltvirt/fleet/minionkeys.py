"""The master's minion-key store, as the ``virt`` runner uses it (master side only).

Read a hypervisor's accepted key (to seal a new VM's private key for it, see :mod:`saltvirt.pki.envelope`),
pre-accept a new VM's key, take back a key we stored, delete a key as ``salt-key -d`` does. The store
is Salt's own key cache (``keys.cache_driver``, default ``localfs_key``): what ``salt-key`` shows.
"""

import hashlib

import salt.cache
import salt.key
import salt.utils.verify
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base.salttypes import Data, SaltOpts


def _keys(opts):
    return salt.cache.Cache(opts, driver=opts.get("keys.cache_driver") or "localfs_key")


def _valid(opts, minion_id):
    if (
        not isinstance(minion_id, str)
        or minion_id != minion_id.strip()
        or not salt.utils.verify.valid_id(opts, minion_id)
    ):
        raise SaltInvocationError(f"{minion_id!r} is not a valid minion id")


def key_state(opts: SaltOpts, minion_id: str) -> str | None:
    """``accepted|pending|rejected|denied`` or None: what the master has for ``minion_id``."""
    _valid(opts, minion_id)
    store = _keys(opts)
    entry = store.fetch("keys", minion_id)
    if entry:
        return entry.get("state")
    return "denied" if store.fetch("denied_keys", minion_id) else None


def accepted_pub(opts: SaltOpts, minion_id: str) -> str:
    """The public key the master accepted for ``minion_id`` (never what a minion claims)."""
    _valid(opts, minion_id)
    entry = _keys(opts).fetch("keys", minion_id)
    if not entry or entry.get("state") != "accepted":
        raise CommandExecutionError(f"the master has no accepted key for {minion_id!r}: cannot seal the new key for it")
    return entry["pub"]


def accepted_pubs(opts: SaltOpts, minion_ids: list[str]) -> dict[str, str]:
    """:func:`accepted_pub` of each of ``minion_ids`` that has an accepted key, read through one key store (one
    store per key costs a Salt loader each: ~8 ms, most of reading 100 hypervisors' pushed capacity)."""
    store, out = _keys(opts), {}
    for minion_id in minion_ids:
        _valid(opts, minion_id)
        entry = store.fetch("keys", minion_id)
        if entry and entry.get("state") == "accepted":
            out[minion_id] = entry["pub"]
    return out


class KeyExistsError(SaltInvocationError):
    """The master has a key for the minion id already (a tenant caller is told less: whose it is not)."""


def refuse_existing_key(opts: SaltOpts, minion_id: str) -> None:
    state = key_state(opts, minion_id)
    if state:
        raise KeyExistsError(
            f"the master already has a {state} key for {minion_id!r}: remove it first (salt-key -d {minion_id}) "
            "or choose another name"
        )


def preaccept(opts: SaltOpts, minion_id: str, pub: str) -> None:
    """Store ``pub`` as the accepted key of ``minion_id``; refuses if the master has any key for it."""
    refuse_existing_key(opts, minion_id)
    _keys(opts).store("keys", minion_id, {"state": "accepted", "pub": pub})


def remove_key(opts: SaltOpts, minion_id: str, pub: str) -> bool:
    """Remove ``minion_id``'s key only if it is still the one we stored. True if removed."""
    store = _keys(opts)
    entry = store.fetch("keys", minion_id)
    if not entry or entry.get("pub", "").strip() != pub.strip():
        return False
    store.flush("keys", minion_id)
    return True


def delete_key(opts: SaltOpts, minion_id: str) -> str | None:
    """Delete ``minion_id``'s key in whatever state it is (``salt-key -d``); the state it had, or None."""
    state = key_state(opts, minion_id)
    if state:
        folder = {
            "accepted": "minions",
            "pending": "minions_pre",
            "rejected": "minions_rejected",
            "denied": "minions_denied",
        }
        with salt.key.Key(opts) as keys:
            keys.delete_key(match_dict={folder[state]: [minion_id]})
    return state


def _sha(pub):
    return hashlib.sha256(pub.encode()).hexdigest()


def delete_recorded_key(opts: SaltOpts, name: str, recorded: Data | None, minion_id: str | None = None) -> Data:
    """``salt-run virt.purge``: delete the minion key only when it is the one ``virt.init`` seeded into
    VM ``name`` (``recorded``: ``{id, key_sha256}`` from the domain's <metadata>); anything else is
    reported and left alone. Returns ``{key_deleted: state or False, key_note?: why not}``."""
    if not recorded:
        return {
            "key_deleted": False,
            "key_note": f"no minion key recorded in VM {name}'s definition (not created by salt-run virt.init, or "
            f"created before keys were recorded): no key deleted; salt-key -d <id> if one is this VM's",
        }
    mid = recorded["id"]
    if minion_id and minion_id != mid:
        return {
            "key_deleted": False,
            "key_note": f"VM {name} holds the key of minion {mid}, not {minion_id}: no key deleted",
        }
    _valid(opts, mid)
    entry = _keys(opts).fetch("keys", mid) or {}
    pub = str(entry.get("pub") or "")
    if not pub:
        return {"key_deleted": False, "key_note": f"the master has no key for {mid}: nothing to delete"}
    if recorded["key_sha256"] not in {_sha(pub), _sha(pub.strip()), _sha(pub.strip() + "\n")}:
        return {
            "key_deleted": False,
            "key_note": f"the master's key for {mid} is not the one virt.init seeded into VM {name} (sha256 "
            f"{recorded['key_sha256'][:16]}...): left alone",
        }
    return {"key_deleted": delete_key(opts, mid)}
