"""Master options with a private key store (no daemon): Salt's own key cache on a temporary pki_dir."""

import functools

import salt.config


def master_key_store_opts(base):
    """Master opts with a private pki_dir under ``base`` (no daemon): Salt's real key cache
    ('localfs_key') then writes ``<pki_dir>/minions/<id>`` exactly as salt-key does."""
    opts = salt.config.master_config(None)
    opts.update(pki_dir=str(base / "pki"), cachedir=str(base / "cache"), sock_dir=str(base / "sock"))
    for sub in ("minions", "minions_pre", "minions_rejected", "minions_denied"):
        (base / "pki" / sub).mkdir(parents=True)
    (base / "cache").mkdir()
    return opts


@functools.cache
def keypair(name):
    """A real minion RSA key pair ``(public PEM, private PEM)`` (:func:`saltvirt.pki.envelope.new_keypair`) made
    once per test process and ``name``: for tests where a key's freshness is not the point (RSA generation,
    15-80 ms a key, was the largest part of several PKI and runner tests). Different names, different keys."""
    from saltvirt.pki import envelope

    return envelope.new_keypair()
