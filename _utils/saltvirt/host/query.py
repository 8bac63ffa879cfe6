"""Read-only facts about domains and hosts, shaped for Salt output. Bulk calls where libvirt has them:
``full_info`` costs one listAllDomains + one getAllDomainStats + one XMLDesc per domain (two for a running
persistent one: its definition too, see :func:`describe`'s ``defined``)."""

import concurrent.futures
import os
from collections.abc import Iterator

from salt.exceptions import CommandExecutionError

from saltvirt.base.salttypes import Conn, Data, Domain
from saltvirt.host import guestips
from saltvirt.host.conn import get_domain, libvirt
from saltvirt.host.stats import uptimes
from saltvirt.xml import etree
from saltvirt.xml.domain import boot, definition, devices

STATES = {
    0: "nostate",
    1: "running",
    2: "blocked",
    3: "paused",
    4: "shutdown",
    5: "shutoff",
    6: "crashed",
    7: "pmsuspended",
}


SHUTOFF = 5


def state_name(code: int) -> str:
    return STATES.get(code, "unknown")


def list_domains(conn: Conn, which: str = "all") -> list[str]:
    flags = {
        "all": 0,
        "active": libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE,
        "inactive": libvirt.VIR_CONNECT_LIST_DOMAINS_INACTIVE,
    }[which]
    return sorted(d.name() for d in conn.listAllDomains(flags))


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _graphics_address(g, hostname):
    """Where the console really listens (``host:port``): a loopback listener stays loopback (reach it
    through :func:`graphics_tunnel`), a wildcard one is reached at the hypervisor's host name."""
    if g["port"] in (None, -1):
        return None
    host = g["listen"]
    if not host or host in ("0.0.0.0", "::"):
        host = hostname
    return f"[{host}]:{g['port']}" if ":" in host else f"{host}:{g['port']}"


def graphics_tunnel(g: Data, hostname: str) -> str | None:
    """The ssh command that reaches a console listening on the hypervisor's loopback, or None."""
    if g.get("port") in (None, -1) or (g.get("listen") or "127.0.0.1") not in LOOPBACK:
        return None
    listen = "[::1]" if g.get("listen") == "::1" else "127.0.0.1"
    return f"ssh -N -L {g['port']}:{listen}:{g['port']} {hostname}"


def _block_stats(stats):
    out = {}
    for i in range(stats.get("block.count", 0)):
        name = stats.get(f"block.{i}.name")
        if name:
            out[name] = {
                "capacity": stats.get(f"block.{i}.capacity"),
                "allocation": stats.get(f"block.{i}.allocation"),
            }
    return out


XML_SECURE = 1  # libvirt.VIR_DOMAIN_XML_SECURE


def _by_mac(ours, theirs):
    """Salt's NIC entries (:func:`devices.salt_devices`) lined up with ours (by MAC; None where none)."""
    by_mac = {n["mac"]: n for n in theirs}
    return [by_mac.get(n["mac"]) for n in ours]


def _disk(d, size):
    """One disk as Salt's ``get_disks`` entry (``file``, ``type``: the device, ``file format``, ``virtual
    size``, ``disk size``: left out when unknown, as Salt) plus ours. A pool volume's ``file`` is Salt's
    ``<pool>/<volume>`` (clients take the pool from it: Uyuni starts a VM's pools that way)."""
    out = {
        "file": f"{d['pool']}/{d['volume']}" if d.get("pool") and d.get("volume") else d["file"],
        "type": d["device"],
        "format": d["format"],
        "device": d["device"],
        "bus": d["bus"],
        "backing_file": d["backing_file"],
        **({"pool": d["pool"], "volume": d["volume"]} if d.get("pool") else {}),  # from XML: a stopped pool is fine
        "virtual_size": size.get("capacity"),
        "allocation": size.get("allocation"),
    }
    salts = {"file format": d["format"], "virtual size": size.get("capacity"), "disk size": size.get("allocation")}
    out.update({k: v for k, v in salts.items() if v is not None})
    return out


def _domain_xml(dom):
    """(XML, whether it is the secure one) in one round trip: the secure XML tells whether a console has a
    password (only that yes/no, and none of its other additions, leaves :func:`describe`); the plain one
    where this connection may not read it (read-only)."""
    try:
        return dom.XMLDesc(XML_SECURE), True
    except libvirt.libvirtError as exc:
        if _vanished(exc):
            raise
        return dom.XMLDesc(0), False


def _all_xml(doms, defined=frozenset()):
    """``{name: (xml, secure, definition XML or None) or the exception}`` of many domains (the inactive XML of
    those named in ``defined``), their round trips overlapped: libvirt's remote driver multiplexes one
    connection's calls from several threads, and libvirtd serves up to ``max_client_requests`` (default 5) of
    one client at once. Serially, 1,000 domains wait ~150 ms on the wire; the parsing that follows holds the
    GIL either way."""

    def one(dom):
        try:
            name = dom.name()
            inactive = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) if name in defined else None
            return name, (*_domain_xml(dom), inactive)
        except Exception as exc:  # noqa: BLE001 - handed to the caller's per-VM handling
            return dom.name(), exc

    if len(doms) < XML_THREADS * 8:  # a few domains: threads cost more than they save
        return dict(map(one, doms))
    with concurrent.futures.ThreadPoolExecutor(XML_THREADS, thread_name_prefix="virt-xml") as pool:
        return dict(pool.map(one, doms))


XML_THREADS = 4  # below libvirtd's max_client_requests (5), so other calls of this client still pass


def describe(
    dom: Domain,
    hostname: str,
    stats: Data | None = None,
    xml: str | etree.ET.Element | None = None,
    listed: Data | None = None,
    secure: bool = False,
    defined_xml: str | None = None,
) -> Data:
    """Everything ``virt.vm_info`` reports for one domain. ``listed``: :func:`_listed_flags` of all
    domains (autostart / persistent known without two round trips per domain). ``xml``: its XML (or its
    :func:`saltvirt.xml.etree.read` tree) when already fetched, ``secure`` when that is the secure one
    (:func:`_domain_xml`); ``defined_xml``: its inactive XML when already fetched. ``cpu``/``mem`` are the
    running VM's; ``defined`` ({cpu, mem}) its persistent definition's, what it gets at its next start
    (``virt.update``'s ``pending_restart``)."""
    if xml is None:
        xml, secure = _domain_xml(dom)
    root = etree.read(xml)  # parsed once for every fact below
    facts = definition.parse(root)
    if facts["graphics"] and not secure:
        # libvirt drops passwd from the plain XML: whether a console has one is read from the secure XML,
        # which is parsed here and dropped (only the yes/no leaves this function)
        consoles = definition.parse(etree.read(dom.XMLDesc(XML_SECURE)))["graphics"]
        for g, s in zip(facts["graphics"], consoles, strict=False):
            g["password"] = bool(s.get("password"))
    stats = stats or {}
    state_code = stats.get("state.state")
    if state_code is None:
        state_code = dom.state()[0]
    blocks = _block_stats(stats)
    salt = devices.salt_devices(root)
    disks = {d["target"]: _disk(d, blocks.get(d["target"], {})) for d in facts["disks"]}
    nics = {}
    for i, (n, theirs) in enumerate(zip(facts["nics"], _by_mac(facts["nics"], salt["nics"]), strict=True)):
        nic = {"type": n["type"], "mac": n["mac"], "model": n["model"], "target": n["target"]}
        # Salt's shape: keys it leaves out when unset are left out, source is {network|bridge|dev: ...}
        nic = {k: v for k, v in nic.items() if v is not None}
        nic.update(theirs or {"source": {}})
        nic["source_name"] = n["source"]  # ours: the network, bridge or device name alone
        nics[n["mac"] or f"nic{i}"] = nic
    graphics = dict(salt["graphics"], address=None, tunnel=None, password=False)
    if facts["graphics"]:  # ours besides Salt's: where it listens, how to reach it, whether it has a password
        g = facts["graphics"][0]
        graphics.update(address=_graphics_address(g, hostname), tunnel=graphics_tunnel(g, hostname))
        graphics["password"] = g["password"]
    cputime = stats.get("cpu.time")
    if cputime is None:
        cputime = dom.info()[4]  # drivers without bulk stats
    uuid = dom.UUIDString()  # kept by the domain object: no round trip
    if listed is not None:
        autostart, persistent = uuid in listed["autostart"], uuid in listed["persistent"]
    else:
        try:
            autostart = bool(dom.autostart())
        except libvirt.libvirtError:
            autostart = False
        persistent = bool(dom.isPersistent())
    defined = {"cpu": facts["cpu"], "mem": facts["mem"]}
    if persistent and state_code != SHUTOFF:  # running: its definition may hold a growth that waits for a restart
        config = definition.parse(defined_xml or dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        defined = {"cpu": config["cpu"], "mem": config["mem"]}
    return {
        "name": facts["name"],
        "uuid": uuid,
        "state": state_name(state_code),
        "type": facts["type"],
        "cpu": facts["cpu"],
        "mem": facts["mem"],
        "defined": defined,
        "current_mem": facts["current_mem"],
        "cputime": int(cputime),
        "autostart": autostart,
        "persistent": persistent,
        "disks": disks,
        "nics": nics,
        "graphics": graphics,
        "boot": facts["boot"],
        "serial_log": facts["serial_log"],
        "group": facts["group"],
        "owner": facts["owner"],  # {tenant, creator} salt-run virt.init recorded, or None
        "ha": facts["ha"],  # ha=True recorded: automatic HA restarts it when this host is lost
        "image": facts["image"],  # the catalog name or source virt.init recorded, or None (docs/topics/resources.md)
        "minion": facts["minion"],  # {id, key_sha256} of the key virt.init seeded, or None
        "guest_agent": facts["guest_agent"],  # its channel's state (saltvirt.host.guestips), None without one
        "maxMem": facts["mem"] * 1024,  # Salt's key, in KiB as Salt's (our "mem" is MiB)
        **boot.salt_facts(root),
    }


def bulk_stats(conn: Conn, doms: list[Domain]) -> dict[str, Data]:
    """``{name: libvirt's bulk stats}`` of ``doms`` in one call (state, cpu total, block; only the state
    where the driver has no more, ``{}`` where it has none): what :func:`describe` reads."""
    want = libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_BLOCK
    try:
        return {d.name(): s for d, s in conn.domainListGetStats(doms, want)} if doms else {}
    except libvirt.libvirtError:  # drivers without bulk stats (e.g. the test driver for some groups)
        try:
            return {d.name(): s for d, s in conn.domainListGetStats(doms, libvirt.VIR_DOMAIN_STATS_STATE)}
        except libvirt.libvirtError:
            return {}


def _listed_flags(conn):
    """``{autostart: {uuid}, persistent: {uuid}}`` of every domain: two listAllDomains calls instead of
    two round trips per domain (None when the driver cannot filter: then each domain is asked)."""
    try:
        return {
            "autostart": {d.UUIDString() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_AUTOSTART)},
            "persistent": {d.UUIDString() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_PERSISTENT)},
        }
    except libvirt.libvirtError:
        return None


def _running_persistent(doms, stats, listed):
    """Names of the domains whose definition :func:`describe` reads besides their live XML (fetched with it,
    overlapped): the persistent ones the bulk stats show not shut off (the others are asked one by one)."""
    if listed is None:
        return frozenset()
    running = {n for n, s in stats.items() if (s or {}).get("state.state") not in (None, SHUTOFF)}
    return frozenset(d.name() for d in doms if d.name() in running and d.UUIDString() in listed["persistent"])


def _vanished(exc):
    return isinstance(exc, libvirt.libvirtError) and exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN


def _unreadable(dom, exc, stats):
    """The entry for a VM that cannot be described: its error, and its state if libvirt still knows it."""
    message = exc.get_error_message() if isinstance(exc, libvirt.libvirtError) else f"{type(exc).__name__}: {exc}"
    state = (stats or {}).get("state.state")
    if state is None:
        try:
            state = dom.state()[0]
        except libvirt.libvirtError:
            state = None
    return {
        "name": dom.name(),
        "state": state_name(state) if state is not None else "unknown",
        "error": f"cannot read VM {dom.name()!r}: {message} (see virt.get_xml {dom.name()})",
    }


def domain_disks(
    conn: Conn, but: str | None = None, but_uuid: str | None = None, unread: str = ""
) -> Iterator[tuple[str, Data]]:
    """(VM name, disk facts) of every disk of every domain on this host, in its definition and, while it
    runs, its live one (a hot-plugged disk counts too); not those of VM ``but`` (by name) or ``but_uuid``.
    A domain gone meanwhile uses nothing any more and is skipped; a definition libvirt cannot give raises
    CommandExecutionError with ``unread`` (what the caller therefore did not do) appended."""
    for dom in conn.listAllDomains(0):
        try:
            if dom.name() == but or (but_uuid and dom.UUIDString() == but_uuid):
                continue
            flags = [libvirt.VIR_DOMAIN_XML_INACTIVE] + ([0] if dom.isActive() else [])
            xmls = [dom.XMLDesc(flag) for flag in flags]
        except libvirt.libvirtError as exc:
            if _vanished(exc):
                continue
            raise CommandExecutionError(
                f"cannot read the definition of VM {dom.name()}: {exc.get_error_message()}{unread}"
            ) from None
        for xml in xmls:
            for disk in definition.parse(xml)["disks"]:
                yield dom.name(), disk


def vm_info(conn: Conn, name: str | None = None, agent_timeout: float = guestips.AGENT_TIMEOUT) -> dict[str, Data]:
    """{name: info} for one VM or all of them. With all of them, a VM that cannot be read (XML that
    does not parse, a device libvirt cannot report) is listed with its ``error`` (and state, if known)
    instead of failing the whole answer; a VM that vanishes meanwhile is left out. Running VMs' NICs
    get their ``ips`` (:mod:`saltvirt.host.guestips`; the guest agent calls share ``agent_timeout`` seconds)."""
    hostname = conn.getHostname()
    doms = [get_domain(conn, name)] if name else conn.listAllDomains(0)
    stats = bulk_stats(conn, doms)
    listed = None if name else _listed_flags(conn)
    xmls = _all_xml(doms, _running_persistent(doms, stats, listed))
    out, described = {}, {}
    for dom in doms:
        try:
            vm_name = dom.name()
            got = xmls[vm_name]
            if isinstance(got, Exception):
                raise got
            xml, secure, inactive = got
            out[vm_name] = describe(
                dom, hostname, stats.get(vm_name), xml=xml, listed=listed, secure=secure, defined_xml=inactive
            )
            described[vm_name] = dom
        except Exception as exc:  # noqa: BLE001 - one unreadable VM must not hide the others
            if _vanished(exc):
                if name:
                    raise CommandExecutionError(f"VM {name!r} vanished while being read") from None
                continue
            entry = _unreadable(dom, exc, stats.get(vm_name))
            if name:
                raise CommandExecutionError(entry["error"]) from None
            out[vm_name] = entry
    guestips.annotate(described, {n: out[n] for n in described if n in out}, agent_timeout, conn=conn)
    add_uptimes(conn, {n: out[n] for n in described})
    return out


def add_uptimes(conn: Conn, infos: dict[str, Data]) -> None:
    """Set ``uptime`` in each of ``infos`` (:func:`describe`'s, by name): the seconds a running VM's QEMU has run
    (:func:`saltvirt.host.stats.uptimes`, one pass for all), None for a VM not running or whose process this
    machine does not have (a remote libvirtd)."""
    running = {n: str(i["uuid"]).lower() for n, i in infos.items() if i.get("state") == "running"}
    ran = uptimes(conn, list(running.values()))
    for n, info in infos.items():
        info["uptime"] = ran.get(running.get(n, ""))


def vm_state(conn: Conn, name: str | None = None) -> dict[str, str]:
    doms = [get_domain(conn, name)] if name else conn.listAllDomains(0)
    out = {}
    for dom in doms:
        try:
            out[dom.name()] = state_name(dom.state()[0])
        except libvirt.libvirtError as exc:
            if not _vanished(exc) or name:
                raise
    return out


def _active_infos(conn):
    """``info()`` of every running VM, leaving out those that stop or vanish while we ask."""
    infos = []
    for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
        try:
            infos.append(dom.info())
        except libvirt.libvirtError as exc:
            if not _vanished(exc) and exc.get_error_code() != libvirt.VIR_ERR_OPERATION_INVALID:
                raise
    return infos


def node_info(conn: Conn) -> Data:
    model, mem_mib, cpus, mhz, nodes, sockets, cores, threads = conn.getInfo()
    return {
        "cpumodel": model,
        "phymemory": mem_mib,
        "cpus": cpus,
        "cpumhz": mhz,
        "numanodes": nodes,
        "sockets": sockets,  # Salt's key
        "cpusockets": sockets,
        "cpucores": cores,
        "cputhreads": threads,
    }


def freemem(conn: Conn, reserve_mib: int = 0) -> int:
    """MiB of host memory left for new VMs: physical memory minus what active VMs were given."""
    total = conn.getInfo()[1]
    used = sum(i[2] // 1024 for i in _active_infos(conn))
    return total - used - reserve_mib


def freecpu(conn: Conn) -> int:
    total = conn.getInfo()[2]
    used = sum(i[3] for i in _active_infos(conn))
    return total - used


def host_info(conn: Conn, images_dir: str | None = None) -> Data:
    """Host capacity and usage: what placement needs, in one call."""
    info = node_info(conn)
    infos = _active_infos(conn)
    out = {
        "hostname": conn.getHostname(),
        "uri": conn.getURI(),
        "hypervisor": conn.getType(),
        "node": info,
        "mem_total": info["phymemory"],
        "mem_used_by_vms": sum(i[2] // 1024 for i in infos),
        "vcpus_total": info["cpus"],
        "vcpus_used_by_vms": sum(i[3] for i in infos),
        "vms_active": len(infos),
        "vms_defined": len(conn.listAllDomains(0)),
    }
    try:
        out["mem_free_host"] = conn.getFreeMemory() // (1024 * 1024)
    except libvirt.libvirtError:
        out["mem_free_host"] = None
    if images_dir:
        out["images_dir"] = images_dir
        out["disk_free"] = free_mib(images_dir)
    return out


def free_mib(path: str) -> int:
    """MiB free for new files in ``path`` (or its nearest existing parent: it may not exist yet)."""
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe or "/")
    return st.f_bavail * st.f_frsize // (1024 * 1024)


def full_info(conn: Conn, images_dir: str | None = None, agent_timeout: float = guestips.AGENT_TIMEOUT) -> Data:
    return {"host": host_info(conn, images_dir), "vm_info": vm_info(conn, agent_timeout=agent_timeout)}


def defined_uuids(conn: Conn) -> dict[str, str]:
    """``{uuid: name}`` of every domain defined or running here (transient ones too): what the master
    gathers from every hypervisor before any leftover is deleted (:mod:`saltvirt.fleet.leftovers`)."""
    return {dom.UUIDString(): dom.name() for dom in conn.listAllDomains(0)}  # both kept by the object: no RPC


# libvirt's reason for a state, by the prefix of its constants (VIR_DOMAIN_SHUTOFF_CRASHED -> "crashed")
_REASON_PREFIXES = {code: f"VIR_DOMAIN_{STATES[code].upper()}_" for code in (1, 3, 5, 6)}
_DISK_ERRORS = {1: "unspec", 2: "no_space"}  # VIR_DOMAIN_DISK_ERROR_*; 0 (none) is left out


def reason_name(state: int, reason: int) -> str:
    """libvirt's reason ``reason`` for domain state ``state`` in lower case (``crashed``, ``ioerror``, ...);
    ``unknown`` for a state whose reasons are not named here or a reason this libvirt does not name."""
    prefix = _REASON_PREFIXES.get(state)
    if prefix is None:
        return "unknown"
    names = {getattr(libvirt, k): k[len(prefix) :].lower() for k in dir(libvirt) if k.startswith(prefix)}
    return names.get(reason, "unknown")


def condition(conn: Conn, name: str) -> Data:
    """What the master's remediation (:mod:`saltvirt.fleet.remediate`) asks of one VM, from libvirt here:
    ``{name, uuid, state, reason, guest_agent, disk_errors}``. ``reason``: libvirt's reason for the state
    (``shutoff``/``crashed`` or ``failed``: the guest crashed or QEMU died; ``paused``/``ioerror``: a disk
    error paused it); ``guest_agent``: its channel's state (:func:`describe`'s); ``disk_errors``: ``{target:
    no_space|unspec}`` of a running VM (libvirt's ``virDomainGetDiskErrors``)."""
    dom = get_domain(conn, name)
    code, reason = dom.state()
    errors: dict[str, str] = {}
    if code not in (SHUTOFF, 6):
        try:
            errors = {dev: _DISK_ERRORS.get(err, "unspec") for dev, err in dom.diskErrors().items() if err}
        except libvirt.libvirtError:
            errors = {}  # a driver without it: no errors known
    facts = definition.parse(etree.read(dom.XMLDesc(0)))
    return {
        "name": dom.name(),
        "uuid": dom.UUIDString(),
        "state": state_name(code),
        "reason": reason_name(code, reason),
        "guest_agent": facts["guest_agent"],
        "disk_errors": errors,
    }
