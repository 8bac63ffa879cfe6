"""
ext_pillar ``libvirt``: libvirt TLS certificates for the hypervisors, signed by a CA the master keeps.

Each hypervisor (``virt:hypervisors`` in the master config, see ``saltvirt.fleet.hypervisors``: minion ids,
never grains) gets, in its own pillar only::

    libvirt:
      cacert: <PEM bundle: current CA + retired CAs still trusted>
      crl: <PEM: the CA's revocation list>        # libvirtd crl_file, QEMU ca-crl.pem
      servercert: <PEM>   serverkey: <PEM>        # libvirtd's server pair
      clientcert: <PEM>   clientkey: <PEM>        # libvirtd's client pair (CN "<id> libvirt client")
      qemu_servercert / qemu_serverkey / qemu_clientcert / qemu_clientkey   # QEMU migration TLS: a
                                                  # separate pair libvirtd does not accept as a client
      tls_allowed_dn_list: ["O=salt-virt,CN=* libvirt client"]   # libvirtd: hypervisor clients only
      libvirtd: {crl_file: /etc/pki/CA/cacrl.pem, tls_allowed_dn_list: [...]}   # for libvirtd.conf: what
                                                  # saltstack-formulas/libvirt-formula templates into it
      ca: {subject, not_after, sha256, ...}       # summaries, no secrets
      server: {subject, san_dns, san_ip, not_after, sha256, ...}
      client: {subject, not_after, sha256, ...}

    virt_tenant_members: {alice: acme, bob: beta}   # the master config's virt:tenants members, resolved
                                                  # on the master ('group%' too): the virt_vm resources'
                                                  # tenant gate (docs/topics/resources.md)

Other minions get nothing. The ``virt.keys`` state writes the files where libvirtd and QEMU read them.

Master config (``virt:hypervisors`` required; every ext_pillar key optional)::

    on_demand_ext_pillar: []                 # recommended: Salt's default lists 'libvirt' (see below)
    virt:
      hypervisors: [hyper1, hyper2]          # who gets certificates (and who the runner uses)
    ext_pillar:
      - libvirt:
          ca_dir: /etc/salt/pki/master/libvirt   # default <pki_dir>/libvirt
          days: 825                          # validity of server/client certs
          renew_days: 30                     # reissue when fewer days are left (or SANs/CN/key changed)
          ca_days: 3650                      # validity of a new CA
          key_type: rsa                      # rsa (key_size 2048/3072/4096) or ec (256/384/521)
          key_size: 3072
          extra_sans:                        # trusted, master-side extra names per minion id
            hyper1: [hyper1.lan, 10.0.0.11]
          san_from_grains: false             # opt-in: also the minion's own fqdn/host/ipv4/ipv6 grains
          basepath: /etc/pki                 # where virt.keys writes (its basepath): libvirtd:crl_file

Server SANs: the minion id plus ``extra_sans`` (master-side data only). With ``san_from_grains: true``
(an opt-in: the minion reports its grains itself) also its ``fqdn``/``host`` grains, its ``ipv4``/``ipv6``
grains minus loopback/link-local, and a ``virt:tls:extra_sans`` grain, and the server CN is the
FQDN grain. A name another minion's certificate already holds is never issued again (left out, logged).
Certificates are revoked (the CRL) when reissued and when their minion is no longer a hypervisor (its
key deleted on the master or removed from ``virt:hypervisors``).

Trust: hypervisor identity comes only from the master config and the keys the master accepted; the
pillar handed to an ext_pillar and the grains are the minion's own data and decide nothing here. A
minion can also ask for an ext_pillar with its own configuration (``pillar.ext``, allowed for
``libvirt`` by Salt's default ``on_demand_ext_pillar``): this module refuses such calls. See pki/README.md.
"""

import ipaddress
import logging
import os
import sys
import types
from typing import TYPE_CHECKING

from salt.exceptions import SaltInvocationError

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{pillar,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltOpts

    __opts__: SaltOpts

log = logging.getLogger(__name__)
__virtualname__ = "libvirt"
CONFIG_KEYS = (
    "ca_dir",
    "days",
    "renew_days",
    "ca_days",
    "key_type",
    "key_size",
    "san_from_grains",
    "extra_sans",
    "basepath",
)
NOT_HOST_NAMES = ("localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6")


def __virtual__():
    if saltvirt is None:
        return False, (
            "libvirt ext_pillar: the saltvirt library is missing: saltutil.sync_all, or "
            "pip install salt-virt (Salt's onedir packages: salt-pip install salt-virt)"
        )
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False, "libvirt ext_pillar: the cryptography library is missing"
    return __virtualname__


def _on_demand():
    """True when this call comes from a minion's ``pillar.ext`` (its own configuration), False for the
    master's ext_pillar configuration, None when the caller cannot be identified."""
    frame = sys._getframe(1).f_back  # pylint: disable=protected-access
    for _ in range(40):
        if frame is None:
            return None
        if frame.f_code.co_name == "_external_pillar_data" and "val" in frame.f_locals:
            ext = getattr(frame.f_locals.get("self"), "ext", None)
            return isinstance(ext, dict) and any(v is frame.f_locals["val"] for v in ext.values())
        frame = frame.f_back
    return None


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
    if _san_from_grains(config):
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


def _san_from_grains(config):
    return config.get("san_from_grains") is True


def _moved(config):
    """An ext_pillar config from before ``virt:hypervisors``: say where the target went."""
    if "target" in config or "tgt_type" in config:
        return (
            "libvirt ext_pillar: 'target'/'tgt_type' are gone: who is a hypervisor (and gets certificates) is now "
            "virt:hypervisors in the master config (minion ids, a glob or a nodegroup), e.g. "
            "virt: {hypervisors: [hyper1, hyper2]}; remove target/tgt_type from the ext_pillar entry"
        )
    return None


def _members(opts, minion_id):
    """``{virt_tenant_members: {user: tenant}}`` for hypervisor ``minion_id``; a broken ``virt:tenants`` gives
    an empty map (the hypervisor then lets no tenant in) and says why in the master's log."""
    from saltvirt.fleet import callers
    from saltvirt.model import tenancy

    try:
        members = callers.tenant_members(opts)
    except SaltInvocationError as exc:
        log.error("libvirt ext_pillar: no tenant membership for %s: %s", minion_id, exc)
        members = {}
    return {tenancy.MEMBERS_PILLAR: members}


def ext_pillar(minion_id, pillar, *args, **config):  # pylint: disable=unused-argument
    from saltvirt.fleet import hypervisors
    from saltvirt.pki import ca, keyfiles, revocation

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
        if len(args) == 1 and isinstance(args[0], str) and not config:
            # Salt's own libvirt ext_pillar was configured as "- libvirt: _" (a placeholder value)
            log.warning(
                "libvirt ext_pillar: '- libvirt: %s' is the old configuration: write '- libvirt: {}' "
                "(options as a mapping, see pki/README.md)",
                args[0],
            )
        else:  # the minion is told why (virt.keys fails with it), not only the master log
            msg = "libvirt ext_pillar: configure it with a mapping, e.g. '- libvirt: {}' (see pki/README.md)"
            log.error(msg)
            return {"libvirt": {"error": msg}}
    unknown = sorted(set(config) - set(CONFIG_KEYS) - {"target", "tgt_type"})
    if unknown:
        log.warning("libvirt ext_pillar: ignoring unknown option(s) %s", ", ".join(unknown))
    # the master's own data only: __opts__ without the minion's grains, never the pillar passed in
    opts = {k: v for k, v in __opts__.items() if k not in ("grains", "pillar")}
    try:
        problem = _moved(config)
        if problem:
            raise SaltInvocationError(problem)
        hypervisors.target(opts)
    except SaltInvocationError as exc:
        # every minion sees why (virt.keys fails with it); no key material for anyone
        log.error("libvirt ext_pillar: %s", exc)
        return {"libvirt": {"error": f"libvirt ext_pillar: {exc}"}}
    grains = __opts__.get("grains") or {}
    ca_dir = config.get("ca_dir") or os.path.join(__opts__["pki_dir"], "libvirt")
    try:
        accepted = set(hypervisors.accepted(opts)) | {minion_id}  # compiling for it: it is authenticated
        swept = revocation.sweep(ca_dir, lambda mid: mid in accepted and hypervisors.matches(opts, mid))
    except Exception as exc:
        log.error("libvirt ext_pillar: revoking the certificates of former hypervisors failed: %s", exc)
        raise
    for mid, serials in swept.items():
        log.warning("libvirt ext_pillar: %s is no longer a hypervisor: revoked %d certificate(s)", mid, len(serials))
    if not hypervisors.matches(opts, minion_id, grains=grains, pillar=pillar):
        return {}
    params = ca.settings(**{k: config.get(k) for k in ("days", "renew_days", "ca_days", "key_type", "key_size")})
    sans = sans_for(minion_id, grains, config)
    fqdn = str(grains.get("fqdn") or "").lower() if _san_from_grains(config) else ""
    cn = fqdn if fqdn and fqdn not in NOT_HOST_NAMES else minion_id
    issued = {
        "server": ca.issue(ca_dir, minion_id, "server", sans, cn=cn, **params),
        "client": ca.issue(ca_dir, minion_id, "client", **params),
        "qemu-server": ca.issue(ca_dir, minion_id, "qemu-server", sans, **params),
        "qemu-client": ca.issue(ca_dir, minion_id, "qemu-client", **params),
    }
    for kind, ret in issued.items():
        if ret["issued"]:
            log.info("libvirt ext_pillar: issued the %s certificate of %s (%s)", kind, minion_id, ret["reason"])
        if ret["warning"]:
            log.warning("libvirt ext_pillar: %s: %s (%s)", minion_id, ret["warning"], ca_dir)
    bundle = ca.trusted_bundle(ca_dir)
    out = {
        "cacert": bundle,
        "crl": revocation.crl_pem(ca_dir),
        "tls_allowed_dn_list": [ca.CLIENT_DN_PATTERN],
        "libvirtd": keyfiles.libvirtd_settings(str(config.get("basepath") or "/etc/pki"), [ca.CLIENT_DN_PATTERN]),
        "ca": ca.summary(bundle),
    }
    for kind, ret in issued.items():
        prefix = "qemu_" if kind.startswith("qemu-") else ""
        base = kind.split("-")[-1]
        out[f"{prefix}{base}cert"], out[f"{prefix}{base}key"] = ret["cert"], ret["key"]
        if not prefix:
            out[base] = ca.summary(ret["cert"])
    return {"libvirt": out, **_members(opts, minion_id)}
