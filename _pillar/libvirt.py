"""
ext_pillar ``libvirt``: libvirt TLS certificates for hypervisor minions, signed by a CA the master keeps.

Each matching minion gets, in its own pillar only::

    libvirt:
      cacert: <PEM bundle: current CA + retired CAs still trusted>
      servercert: <PEM>   serverkey: <PEM>
      clientcert: <PEM>   clientkey: <PEM>
      ca: {subject, not_after, sha256, ...}       # summaries, no secrets
      server: {subject, san_dns, san_ip, not_after, sha256, ...}
      client: {subject, not_after, sha256, ...}

Other minions get nothing. The ``virt.keys`` state writes the files where libvirtd reads them.

Master config (every key optional)::

    on_demand_ext_pillar: []                 # recommended: Salt's default lists 'libvirt' (see below)
    ext_pillar:
      - libvirt:
          target: 'G@virt_hypervisor:True'   # who gets certs (default; see "trust" below)
          tgt_type: compound                 # any Salt matcher: glob, list, pcre, grain, compound, ...
          ca_dir: /etc/salt/pki/master/libvirt   # default <pki_dir>/libvirt
          days: 825                          # validity of server/client certs
          renew_days: 30                     # reissue when fewer days are left (or SANs/CN/key changed)
          ca_days: 3650                      # validity of a new CA
          key_type: rsa                      # rsa (key_size 2048/3072/4096) or ec (256/384/521)
          key_size: 3072
          san_from_grains: true              # fqdn, host, ipv4/ipv6 grains and the virt:tls:extra_sans grain
          extra_sans:                        # trusted, master-side extra names per minion id
            hyper1: [hyper1.lan, 10.0.0.11]

Server SANs: the minion id, plus (``san_from_grains``) its ``fqdn`` and ``host`` grains, its
``ipv4``/``ipv6`` grains minus loopback/link-local/unspecified addresses and the names in a
``virt:tls:extra_sans`` grain, plus ``extra_sans``. The server CN is the FQDN; the client CN is
"<id> libvirt client".

Trust: grains are reported by the minion itself, and the pillar handed to an ext_pillar includes
overrides a minion can pass on the command line (``pillar=``). So ``G@``/``I@`` targets and grain
SANs are only as trustworthy as the minions; for a hard boundary target by minion id (glob, ``L@``,
nodegroups) and set ``san_from_grains: false`` with the names in ``extra_sans``. A minion can also
ask for an ext_pillar with its own configuration (``pillar.ext``, allowed for ``libvirt`` by Salt's
default ``on_demand_ext_pillar``): this module refuses such calls. See pki/README.md.
"""

import ipaddress
import logging
import os
import sys

from salt.exceptions import SaltInvocationError

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
CONFIG_KEYS = (
    "target",
    "tgt_type",
    "ca_dir",
    "days",
    "renew_days",
    "ca_days",
    "key_type",
    "key_size",
    "san_from_grains",
    "extra_sans",
)
NOT_HOST_NAMES = ("localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6")


def __virtual__():
    if saltvirt is None:
        return False, "libvirt ext_pillar: the saltvirt library is missing (saltutil.sync_all or pip install)"
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False, "libvirt ext_pillar: the cryptography library is missing"
    return __virtualname__


def _on_demand():
    """True when this call comes from a minion's ``pillar.ext`` (its own configuration), False for the
    master's ext_pillar configuration, None when the caller cannot be identified."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    for _ in range(40):
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code.co_name == "_external_pillar_data" and "val" in frame.f_locals:
            ext = getattr(frame.f_locals.get("self"), "ext", None)
            return isinstance(ext, dict) and any(v is frame.f_locals["val"] for v in ext.values())
    return None


def _matches(minion_id, pillar, target, tgt_type):
    import salt.loader

    opts = dict(__opts__, id=minion_id, minion_id=minion_id, pillar=pillar or {})
    matchers = salt.loader.matchers(opts)
    fun = f"{tgt_type}_match.match"
    if fun not in matchers:
        raise SaltInvocationError(f"libvirt ext_pillar: unknown tgt_type {tgt_type!r}")
    if tgt_type == "compound":
        return bool(matchers[fun](target, opts=opts, minion_id=minion_id))
    return bool(matchers[fun](target, opts=opts))


def _host_ip(value):
    try:
        ip = ipaddress.ip_address(str(value).split("%")[0])
    except ValueError:
        return None
    if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
        return None
    return str(ip)


def sans_for(minion_id, grains, config):
    """The server certificate's SANs for ``minion_id`` (see the module doc)."""
    names = [minion_id]
    if config.get("san_from_grains", True):
        for key in ("fqdn", "host"):
            value = str(grains.get(key) or "").strip().lower()
            if value and value not in NOT_HOST_NAMES:
                names.append(value)
        for value in list(grains.get("ipv4") or []) + list(grains.get("ipv6") or []):
            ip = _host_ip(value)
            if ip:
                names.append(ip)
        tls = (grains.get("virt") or {}).get("tls") if isinstance(grains.get("virt"), dict) else None
        extra = tls.get("extra_sans") if isinstance(tls, dict) else None
        names += [str(n) for n in _as_list(extra, "grain virt:tls:extra_sans")]
    names += [str(n) for n in _as_list((config.get("extra_sans") or {}).get(minion_id), f"extra_sans:{minion_id}")]
    return sorted({n.strip() for n in names if n and str(n).strip()})


def _as_list(value, what):
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    log.warning("libvirt ext_pillar: %s must be a list of names/addresses, ignoring %r", what, value)
    return []


def ext_pillar(minion_id, pillar, *args, **config):
    from saltvirt import pki

    on_demand = _on_demand()
    if on_demand or (on_demand is None and "libvirt" in (__opts__.get("on_demand_ext_pillar") or [])):
        log.warning(
            "libvirt ext_pillar: refused a request from minion %s with its own configuration (pillar.ext); "
            "certificates come only from the master's ext_pillar configuration. Remove 'libvirt' from "
            "on_demand_ext_pillar in the master config.",
            minion_id,
        )
        return {}
    if args:
        raise SaltInvocationError("libvirt ext_pillar: configure it with a mapping (see pki/README.md)")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        log.warning("libvirt ext_pillar: ignoring unknown option(s) %s", ", ".join(unknown))
    if not _matches(minion_id, pillar, config.get("target", DEFAULT_TARGET), config.get("tgt_type", "compound")):
        return {}
    grains = __opts__.get("grains") or {}
    ca_dir = config.get("ca_dir") or os.path.join(__opts__["pki_dir"], "libvirt")
    params = pki.settings(**{k: config.get(k) for k in ("days", "renew_days", "ca_days", "key_type", "key_size")})
    sans = sans_for(minion_id, grains, config)
    fqdn = str(grains.get("fqdn") or "").lower() if config.get("san_from_grains", True) else ""
    cn = fqdn if fqdn and fqdn not in NOT_HOST_NAMES else minion_id
    server = pki.issue(ca_dir, minion_id, "server", sans, cn=cn, **params)
    client = pki.issue(ca_dir, minion_id, "client", **params)
    for kind, ret in (("server", server), ("client", client)):
        if ret["issued"]:
            log.info("libvirt ext_pillar: issued the %s certificate of %s (%s)", kind, minion_id, ret["reason"])
    if server["warning"]:
        log.warning("libvirt ext_pillar: %s (%s)", server["warning"], ca_dir)
    bundle = pki.trusted_bundle(ca_dir)
    return {
        "libvirt": {
            "cacert": bundle,
            "servercert": server["cert"],
            "serverkey": server["key"],
            "clientcert": client["cert"],
            "clientkey": client["key"],
            "ca": pki.summary(bundle),
            "server": pki.summary(server["cert"]),
            "client": pki.summary(client["cert"]),
        }
    }
