"""Domain lifecycle: each function returns the domain's resulting state (or a dict) and raises
CommandExecutionError with libvirt's reason when the action is refused."""

import time

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.host.conn import define, domain_exists, get_domain, libvirt, lv_errors
from saltvirt.host.query import state_name
from saltvirt.xml.domain import definition


def _state(dom):
    try:
        return state_name(dom.state()[0])
    except libvirt.libvirtError:
        if not domain_exists(dom.connect(), dom.name()):
            return "undefined"  # a transient VM is gone once it stops
        raise


def _act(conn, name, action, method, *args, allowed=None):
    dom = get_domain(conn, name)
    current = _state(dom)
    if allowed and current not in allowed:
        raise CommandExecutionError(f"cannot {action} VM {name!r}: it is {current}")
    with lv_errors(f"{action} VM {name!r}"):
        getattr(dom, method)(*args)
    return {"name": name, "action": action, "state": _state(dom), "previous": current}


def start(conn: Conn, name: str) -> Data:
    dom = get_domain(conn, name)
    if dom.isActive():
        return {"name": name, "action": "start", "state": _state(dom), "previous": _state(dom), "changed": False}
    with lv_errors(f"start VM {name!r}"):
        dom.create()
    return {"name": name, "action": "start", "state": _state(dom), "previous": "shutoff", "changed": True}


def shutdown(conn: Conn, name: str, timeout: float = 0) -> Data:
    """Ask the guest to shut down (ACPI). With ``timeout`` > 0, wait up to that many seconds."""
    ret = _act(conn, name, "shut down", "shutdown", allowed=("running", "blocked", "paused"))
    dom = get_domain(conn, name)
    deadline = time.monotonic() + float(timeout or 0)
    while dom.isActive() and time.monotonic() < deadline:
        time.sleep(0.2)
    ret["state"] = _state(dom)
    return ret


def destroy(conn: Conn, name: str) -> Data:
    return _act(
        conn,
        name,
        "force off",
        "destroy",
        allowed=("running", "blocked", "paused", "pmsuspended", "crashed", "shutdown"),
    )


def reboot(conn: Conn, name: str) -> Data:
    return _act(conn, name, "reboot", "reboot", 0, allowed=("running", "blocked"))


def reset(conn: Conn, name: str) -> Data:
    return _act(conn, name, "reset", "reset", 0, allowed=("running", "blocked", "paused"))


def pause(conn: Conn, name: str) -> Data:
    return _act(conn, name, "pause", "suspend", allowed=("running", "blocked", "paused"))


def resume(conn: Conn, name: str) -> Data:
    return _act(conn, name, "resume", "resume", allowed=("paused", "running"))


def undefine(conn: Conn, name: str) -> Data:
    dom = get_domain(conn, name)
    flags = 0
    for flag in (
        "VIR_DOMAIN_UNDEFINE_MANAGED_SAVE",
        "VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA",
        "VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA",  # backup checkpoints: their bitmaps go with the disks
        "VIR_DOMAIN_UNDEFINE_NVRAM",
    ):
        flags |= getattr(libvirt, flag, 0)
    with lv_errors(f"undefine VM {name!r}"):
        try:
            dom.undefineFlags(flags)
        except libvirt.libvirtError:
            dom.undefine()
    return {"name": name, "action": "undefine", "defined": False}


def set_autostart(conn: Conn, name: str, state: bool = True) -> Data:
    dom = get_domain(conn, name)
    with lv_errors(f"set autostart of VM {name!r}"):
        dom.setAutostart(1 if validate.to_bool(state) else 0)
    return {"name": name, "autostart": bool(dom.autostart())}


def setmem(conn: Conn, name: str, mem: int, config: bool = True, live: bool | None = None) -> Data:
    """Set memory (MiB). Inactive domain: config only. Active: live + config, max raised only in config."""
    mem = validate.positive_int(mem, "mem (MiB)")
    dom = get_domain(conn, name)
    kib = mem * 1024
    applied = []
    with lv_errors(f"set memory of VM {name!r}"):
        if dom.isActive() and live is not False and kib <= dom.maxMemory():
            dom.setMemoryFlags(kib, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            applied.append("live")
        if config:
            flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
            if kib > dom.maxMemory() or not dom.isActive():
                dom.setMemoryFlags(kib, flags | libvirt.VIR_DOMAIN_MEM_MAXIMUM)
            dom.setMemoryFlags(kib, flags)
            applied.append("config")
    return {
        "name": name,
        "mem": mem,
        "applied": applied,
        "restart_needed": "live" not in applied and bool(dom.isActive()),
    }


def setvcpus(conn: Conn, name: str, cpu: int, config: bool = True, live: bool | None = None) -> Data:
    cpu = validate.positive_int(cpu, "cpu")
    dom = get_domain(conn, name)
    applied = []
    with lv_errors(f"set vCPUs of VM {name!r}"):
        if config:
            cfg = libvirt.VIR_DOMAIN_AFFECT_CONFIG
            dom.setVcpusFlags(cpu, cfg | libvirt.VIR_DOMAIN_VCPU_MAXIMUM)
            dom.setVcpusFlags(cpu, cfg)
            applied.append("config")
        if dom.isActive() and live is not False:
            try:
                dom.setVcpusFlags(cpu, libvirt.VIR_DOMAIN_AFFECT_LIVE)
                applied.append("live")
            except libvirt.libvirtError:
                pass  # vCPU hotplug beyond the boot maximum is not possible: applies at next boot
    return {
        "name": name,
        "cpu": cpu,
        "applied": applied,
        "restart_needed": "live" not in applied and bool(dom.isActive()),
    }


def _xml_vm_name(xml):
    """The checked VM name of domain XML a caller passed (bad XML or name: SaltInvocationError)."""
    try:
        name = definition.domain_name(xml)
    except ValueError as exc:
        raise SaltInvocationError(str(exc)) from None
    return validate.vm_name(name or "")


def define_xml_str(conn: Conn, xml: str) -> Data:
    name = _xml_vm_name(xml)
    with lv_errors(f"define VM {name!r}"):
        dom = define(conn, "domain", xml)
    return {"name": dom.name(), "uuid": dom.UUIDString(), "defined": True}


def get_xml(conn: Conn, name: str, inactive: bool = False) -> str:
    flags = libvirt.VIR_DOMAIN_XML_INACTIVE if inactive else 0
    return get_domain(conn, name).XMLDesc(flags)


def create_xml_str(conn: Conn, xml: str) -> Data:
    """Start a transient domain from XML (Salt's ``virt.create_xml_str``)."""
    name = _xml_vm_name(xml)
    with lv_errors(f"create transient VM {name!r}"):
        dom = conn.createXML(xml, 0)
    return {"name": dom.name(), "uuid": dom.UUIDString(), "state": _state(dom)}


def ctrl_alt_del(conn: Conn, name: str) -> Data:
    """Send Ctrl+Alt+Del (Linux keycodes: left ctrl 29, left alt 56, delete 111) for 3 ms."""
    dom = get_domain(conn, name)
    if not dom.isActive():
        raise CommandExecutionError(f"cannot send ctrl+alt+del to VM {name!r}: it is {_state(dom)}")
    with lv_errors(f"send ctrl+alt+del to VM {name!r}"):
        dom.sendKey(libvirt.VIR_KEYCODE_SET_LINUX, 3, [29, 56, 111], 3, 0)
    return {"name": name, "action": "ctrl_alt_del", "state": _state(dom)}
