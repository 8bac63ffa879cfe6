"""
ext_pillar ``libvirt``: libvirt TLS certificates for hypervisor minions, signed by a CA the master keeps.

Each matching minion gets, in its own pillar only, ``libvirt: {cacert, servercert, serverkey,
clientcert, clientkey, server, client}`` (the last two: subject, SANs, expiry, fingerprint). Other
minions get nothing. The ``virt.keys`` state writes the files where libvirtd reads them.

Master config (every key optional)::

    ext_pillar:
      - libvirt:
          target: 'G@virt_hypervisor:True'   # who gets certs (compound matcher on the minion's grains)
          ca_dir: /etc/salt/pki/master/libvirt   # default <pki_dir>/libvirt
          days: 825                          # validity of server/client certs
          renew_days: 30                     # reissue when fewer days are left (or SANs changed)
          ca_days: 3650                      # validity of a new CA
          key_size: 3072
          san_from_grains: true              # fqdn, host and non-loopback IPs from grains
          extra_sans:                        # trusted, master-side extra names per minion id
            hyper1: [hyper1.lan, 10.0.0.11]

SANs: the minion id, plus (``san_from_grains``) its ``fqdn``, ``host`` and ``ipv4``/``ipv6`` grains
minus loopback, plus ``extra_sans``. Grains are reported by the minion itself: set ``san_from_grains:
false`` and list names in ``extra_sans`` if minions must not choose the names their cert is valid for.
See pki/README.md for the layout, renewal and CA rotation.
"""
import logging
import os
import sys

try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{pillar,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

log = logging.getLogger(__name__)
__virtualname__ = "libvirt"
DEFAULT_TARGET = "G@virt_hypervisor:True"


def __virtual__():
    if saltvirt is None:
        return False, "libvirt ext_pillar: the saltvirt library is missing (saltutil.sync_all or pip install)"
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False, "libvirt ext_pillar: the cryptography library is missing"
    return __virtualname__


def _matches(minion_id, target, tgt_type):
    import salt.loader

    opts = dict(__opts__, id=minion_id)
    matchers = salt.loader.matchers(opts)
    fun = f"{tgt_type}_match.match"
    if fun not in matchers:
        log.error("libvirt ext_pillar: unknown tgt_type %s", tgt_type)
        return False
    return bool(matchers[fun](target, opts=opts, minion_id=minion_id) if tgt_type == "compound" else matchers[fun](target, opts=opts))


def sans_for(minion_id, grains, config):
    names = [minion_id]
    if config.get("san_from_grains", True):
        for key in ("fqdn", "host"):
            if grains.get(key):
                names.append(grains[key])
        for ip in list(grains.get("ipv4") or []) + list(grains.get("ipv6") or []):
            if not (ip.startswith("127.") or ip in ("::1",) or ip.lower().startswith("fe80:")):
                names.append(ip)
    names += list((config.get("extra_sans") or {}).get(minion_id, []))
    return sorted(set(str(n) for n in names if n))


def ext_pillar(minion_id, pillar, **config):  # pylint: disable=unused-argument
    from saltvirt import pki

    target = config.get("target", DEFAULT_TARGET)
    tgt_type = config.get("tgt_type", "compound")
    if not _matches(minion_id, target, tgt_type):
        return {}
    grains = __opts__.get("grains") or {}
    ca_dir = config.get("ca_dir") or os.path.join(__opts__["pki_dir"], "libvirt")
    sans = sans_for(minion_id, grains, config)
    common = {
        "days": int(config.get("days", 825)),
        "renew_days": int(config.get("renew_days", 30)),
        "key_size": int(config.get("key_size", 3072)),
        "ca_days": int(config.get("ca_days", 3650)),
    }
    server = pki.issue(ca_dir, minion_id, "server", sans, cn=grains.get("fqdn") or minion_id, **common)
    client = pki.issue(ca_dir, minion_id, "client", **common)
    for kind, ret in (("server", server), ("client", client)):
        if ret["issued"]:
            log.info("libvirt ext_pillar: issued %s cert for %s (%s)", kind, minion_id, ret["reason"])
    return {
        "libvirt": {
            "cacert": pki.trusted_bundle(ca_dir),
            "servercert": server["cert"],
            "serverkey": server["key"],
            "clientcert": client["cert"],
            "clientkey": client["key"],
            "server": pki.summary(server["cert"]),
            "client": pki.summary(client["cert"]),
        }
    }
