"""
States for libvirt hypervisors and their VMs: ``virt.keys`` (libvirt TLS files from the ``libvirt``
pillar), VMs (``running``, ``defined``, ``stopped``, ``powered_off``, ``rebooted``, ``absent``),
networks and storage pools. The logic lives in the ``saltvirt`` library.
"""
import os
import sys

try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{states,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, "virt states: the saltvirt library is missing (run saltutil.sync_all, or pip install salt-virt)"
    return __virtualname__


def keys(name, basepath="/etc/pki", qemu=False, qemu_group=None, replace_foreign=False, **kwargs):  # pylint: disable=unused-argument
    """
    Write the libvirt TLS CA, server and client certificates and keys from this minion's ``libvirt``
    pillar (the ``libvirt`` ext_pillar) where libvirtd reads them:
    ``<basepath>/CA/cacert.pem``, ``<basepath>/libvirt/{servercert,clientcert}.pem`` (0644),
    ``<basepath>/libvirt/private/{serverkey,clientkey}.pem`` (0600, ``private/`` 0700).

    qemu
        Also fill ``<basepath>/qemu/`` (ca-cert, server-cert, server-key, client-cert, client-key) for
        QEMU-native migration TLS (qemu.conf ``default_tls_x509_cert_dir``); keys there are 0640
        root:``qemu_group`` because QEMU reads them as its own user.
    qemu_group
        Default: ``libvirt-qemu`` (Debian/Ubuntu) or ``qemu`` (Fedora/RHEL), whichever exists.
    replace_foreign
        A file that exists with other content and was not written by this state is never overwritten
        (the state fails and names it) unless this is True; it is then kept as ``<file>.salt-virt-orig``.

    Changes name the files ("created", "updated", "key written", "key replaced", "mode ..."), never key
    material; ``test=True`` reports exactly those changes and writes nothing. Watch it to restart libvirtd.

    .. code-block:: yaml

        libvirt_keys:
          virt.keys:
            - basepath: /etc/pki
    """
    from saltvirt import keyfiles

    data = __pillar__.get("libvirt")
    if not data:  # a host that just became a hypervisor in this very run: ask the master afresh
        data = __salt__["pillar.items"](unmask=True).get("libvirt")
    return keyfiles.keys_state(
        name, data, basepath, qemu=qemu, test=__opts__["test"], qemu_group=qemu_group, replace_foreign=replace_foreign
    )


# VMs -----------------------------------------------------------------------------------------------
def _ret(name):
    return {"name": name, "result": True, "changes": {}, "comment": ""}


def _errors():
    from salt.exceptions import CommandExecutionError, SaltInvocationError

    return (CommandExecutionError, SaltInvocationError)


def _vm_state(name, connection=None):
    states = __salt__["virt.vm_state"](connection=connection) if name in __salt__["virt.list_domains"](connection=connection) else {}
    return states.get(name)


def _preview(name, cpu, mem, kwargs):
    """What ``virt.init`` would create, from the same spec code (validates the arguments too)."""
    from saltvirt import spec as vmspec

    spec_args = {k: v for k, v in kwargs.items() if k in ("nic", "disk", "disks", "interfaces", "enable_qcow", "enable_vnc", "graphics", "boot", "group")}
    image = kwargs.get("image")
    image_format = None
    if image and image.startswith("/") and os.path.isfile(image):
        from saltvirt import images

        image_format = images.image_info(image)["format"]
    spec = vmspec.build(
        name,
        cpu,
        mem,
        image=image,
        image_format=image_format,
        images_dir=__salt__["config.get"]("virt:images", vmspec.DEFAULT_IMAGES_DIR) or vmspec.DEFAULT_IMAGES_DIR,
        profiles={"nic": __salt__["config.get"]("virt:nic", {}), "disk": __salt__["config.get"]("virt:disk", {})},
        **spec_args,
    )
    return {
        "cpu": spec.cpu,
        "mem": spec.mem,
        "image": kwargs.get("image"),
        "disks": {d.target: {"path": d.path, "overlay": d.overlay, "size": d.size} for d in spec.disks},
        "nics": [{"type": n.type, "source": n.source, "model": n.model} for n in spec.nics],
        "graphics": spec.graphics.type if spec.graphics else None,
    }


def _ensure_vm(name, cpu, mem, start, kwargs):
    ret = _ret(name)
    test = __opts__["test"]
    connection = kwargs.get("connection")
    try:
        state = _vm_state(name, connection)
        if state is None:
            created = _preview(name, cpu, mem, kwargs)
            created["started"] = bool(start)
            ret["changes"] = {"created": created}
            if test:
                ret["result"] = None
                ret["comment"] = f"VM {name} would be created" + (" and started" if start else "")
                return ret
            done = __salt__["virt.init"](name, cpu, mem, start=start, **kwargs)
            ret["changes"]["created"]["uuid"] = done["uuid"]
            ret["comment"] = f"VM {name} created" + (" and started" if start else "") + f" on {done['host']}"
            return ret
        update_args = {k: v for k, v in kwargs.items() if k in ("nic", "disk", "disks", "interfaces", "enable_vnc", "graphics", "connection")}
        upd = __salt__["virt.update"](name, cpu=cpu, mem=mem, test=test, **update_args)
        ret["changes"] = {k: v for k, v in upd["changes"].items() if k != "disks" or v.get("added")}
        notes = []
        if upd["changes"].get("disks", {}).get("not_in_spec"):
            notes.append(f"disks not in the state, kept: {', '.join(upd['changes']['disks']['not_in_spec'])}")
        if start and state != "running":
            ret["changes"]["state"] = {"old": state, "new": "running"}
            if not test:
                __salt__["virt.resume" if state == "paused" else "virt.start"](name, connection=connection)
        if test:
            ret["result"] = None if ret["changes"] else True
            live = [k for k in ret["changes"] if k != "state"]
            ret["comment"] = (f"VM {name} would be updated: {', '.join(sorted(ret['changes']))}" if ret["changes"] else f"VM {name} is as declared")
            if live and state == "running":
                ret["comment"] += " (live where possible, the rest at the next restart)"
        else:
            applied = upd["applied"]
            parts = [f"VM {name} " + ("updated" if ret["changes"] else "is as declared")]
            if applied["live"]:
                parts.append("applied live: " + ", ".join(applied["live"]))
            if applied["restart"]:
                parts.append("needs a restart: " + ", ".join(applied["restart"]))
            ret["comment"] = "; ".join(parts + notes)
    except _errors() as exc:
        ret["result"] = False
        ret["comment"] = str(exc)
    return ret


def running(name, cpu=None, mem=None, **kwargs):
    """
    The VM exists with this shape and runs. Takes the arguments of ``virt.init`` (image, nic, disk,
    disks, interfaces, enable_qcow, enable_vnc, graphics, boot, seed, ...): an absent VM is created
    exactly as ``virt.init`` would; an existing one gets cpu, mem, NICs, blank disks and graphics
    enforced (live where possible; the comment says what needs a restart) and is started.

    .. code-block:: yaml

        web1:
          virt.running:
            - cpu: 2
            - mem: 1024
            - image: salt://images/web.qcow2
            - enable_qcow: True
    """
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    if _vm_state(name, kwargs.get("connection")) is None and (cpu is None or mem is None):
        return dict(_ret(name), result=False, comment="cpu and mem are needed to create the VM")
    return _ensure_vm(name, cpu, mem, True, kwargs)


def defined(name, cpu=None, mem=None, **kwargs):
    """
    Like ``virt.running`` without starting the VM (a running VM is left running).

    .. code-block:: yaml

        db1:
          virt.defined:
            - cpu: 4
            - mem: 4096
            - image: /srv/images/db.qcow2
    """
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    if _vm_state(name, kwargs.get("connection")) is None and (cpu is None or mem is None):
        return dict(_ret(name), result=False, comment="cpu and mem are needed to create the VM")
    return _ensure_vm(name, cpu, mem, False, kwargs)


def _power(name, wanted, action, connection, **args):
    ret = _ret(name)
    try:
        state = _vm_state(name, connection)
        if state is None:
            return dict(ret, result=False, comment=f"VM {name} is not defined")
        if state in wanted:
            return dict(ret, comment=f"VM {name} is already {state}")
        if __opts__["test"]:
            return dict(ret, result=None, changes={"state": {"old": state, "new": wanted[0]}}, comment=f"VM {name} would be {wanted[0]}")
        done = __salt__[action](name, connection=connection, **args)
        ret["changes"] = {"state": {"old": state, "new": done["state"]}}
        if done["state"] not in wanted:
            ret["result"] = False
            ret["comment"] = f"VM {name} is still {done['state']} after {action}"
        else:
            ret["comment"] = f"VM {name} is {done['state']}"
    except _errors() as exc:
        ret["result"] = False
        ret["comment"] = str(exc)
    return ret


def stopped(name, timeout=60, connection=None):
    """
    The VM is shut down gracefully (ACPI), waiting up to ``timeout`` seconds. A guest that ignores the
    request makes the state fail; use ``virt.powered_off`` to pull the plug.

    .. code-block:: yaml

        web1:
          virt.stopped:
            - timeout: 120
    """
    ret = _power(name, ("shutoff",), "virt.stop", connection, timeout=timeout)
    if ret["result"] is False and "still" in ret["comment"]:
        ret["comment"] += f": the guest did not shut down within {timeout}s (use virt.powered_off to force it)"
    return ret


def powered_off(name, connection=None):
    """
    The VM is off, forcibly if needed (``virt.destroy``).

    .. code-block:: yaml

        web1:
          virt.powered_off
    """
    return _power(name, ("shutoff",), "virt.destroy", connection)


def rebooted(name, connection=None):
    """
    Reboot a running VM (always a change).

    .. code-block:: yaml

        web1:
          virt.rebooted
    """
    ret = _ret(name)
    try:
        state = _vm_state(name, connection)
        if state != "running":
            return dict(ret, result=False, comment=f"VM {name} is {state or 'not defined'}: only a running VM can reboot")
        if __opts__["test"]:
            return dict(ret, result=None, changes={"rebooted": True}, comment=f"VM {name} would be rebooted")
        __salt__["virt.reboot"](name, connection=connection)
        return dict(ret, changes={"rebooted": True}, comment=f"VM {name} rebooted")
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))


def absent(name, remove_disks=False, connection=None):
    """
    The VM is not defined. Its disks are kept unless ``remove_disks: True``, and then only the disk
    files salt-virt created for it (``virt.purge``).

    .. code-block:: yaml

        old-web:
          virt.absent:
            - remove_disks: True
    """
    ret = _ret(name)
    try:
        state = _vm_state(name, connection)
        if state is None:
            return dict(ret, comment=f"VM {name} is not defined")
        change = {"old": state, "new": "absent", "disks": "removed (own files only)" if remove_disks else "kept"}
        if __opts__["test"]:
            return dict(ret, result=None, changes={"vm": change}, comment=f"VM {name} would be removed")
        if remove_disks:
            purged = __salt__["virt.purge"](name, connection=connection)
            change["removed"], change["kept"] = purged["removed"], purged["kept"]
        else:
            if state != "shutoff":
                __salt__["virt.destroy"](name, connection=connection)
            __salt__["virt.undefine"](name, connection=connection)
        return dict(ret, changes={"vm": change}, comment=f"VM {name} removed")
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))


# networks and pools --------------------------------------------------------------------------------
def _object_state(kind, name, spec, autostart, run, connection):
    from saltvirt import conn as vconn
    from saltvirt import netpool

    ret = _ret(name)
    test = __opts__["test"]
    uri = vconn.resolve_uri(__salt__["config.get"], connection)
    try:
        with vconn.connect(uri) as conn:
            obj = netpool.lookup(conn, kind, name)
            if obj is None:
                ret["changes"]["defined"] = spec
            else:
                current = netpool.info(conn, kind, name)[name]
                diff = netpool.network_diff(spec, current) if kind == "network" else {k: {"old": current[k], "new": spec[k]} for k in ("type", "target") if current[k] != spec[k]}
                if diff:
                    ret["changes"]["redefined"] = diff
            active = bool(obj and obj.isActive())
            if autostart is not None and bool(obj and obj.autostart()) != bool(autostart):
                ret["changes"]["autostart"] = bool(autostart)
            if run and not active:
                ret["changes"]["started"] = True
            if test:
                ret["result"] = None if ret["changes"] else True
                ret["comment"] = f"{kind} {name} would change" if ret["changes"] else f"{kind} {name} is as declared"
                return ret
            if "defined" in ret["changes"] or "redefined" in ret["changes"]:
                netpool.define(conn, kind, spec, replace=True)
            if "autostart" in ret["changes"]:
                netpool.set_autostart(conn, kind, name, autostart)
            if run and not active:
                netpool.start(conn, kind, name, build=True) if kind == "pool" else netpool.start(conn, kind, name)
            comment = f"{kind} {name} " + ("updated" if ret["changes"] else "is as declared")
            if "redefined" in ret["changes"] and active:
                comment += f"; the running {kind} uses the new definition after a restart"
            ret["comment"] = comment
    except _errors() as exc:
        ret["result"] = False
        ret["comment"] = str(exc)
    return ret


def network_defined(name, bridge=None, forward="nat", ip=None, dhcp_start=None, dhcp_end=None, autostart=True, connection=None):
    """
    A libvirt virtual network with this definition exists.

    .. code-block:: yaml

        isolated:
          virt.network_defined:
            - forward: none
            - ip: 10.50.0.1/24
            - dhcp_start: 10.50.0.10
            - dhcp_end: 10.50.0.99
    """
    from saltvirt import netpool

    try:
        spec = netpool.network_spec(name, bridge, forward, ip, dhcp_start, dhcp_end)
    except _errors() as exc:
        return dict(_ret(name), result=False, comment=str(exc))
    return _object_state("network", name, spec, autostart, False, connection)


def network_running(name, bridge=None, forward="nat", ip=None, dhcp_start=None, dhcp_end=None, autostart=True, connection=None):
    """
    Like ``virt.network_defined``, and the network is started.

    .. code-block:: yaml

        isolated:
          virt.network_running:
            - forward: none
            - ip: 10.50.0.1/24
    """
    from saltvirt import netpool

    try:
        spec = netpool.network_spec(name, bridge, forward, ip, dhcp_start, dhcp_end)
    except _errors() as exc:
        return dict(_ret(name), result=False, comment=str(exc))
    return _object_state("network", name, spec, autostart, True, connection)


def pool_defined(name, ptype="dir", target=None, autostart=True, connection=None):
    """
    A storage pool with this definition exists.

    .. code-block:: yaml

        images:
          virt.pool_defined:
            - target: /srv/salt-images
    """
    from saltvirt import netpool

    try:
        spec = netpool.pool_spec(name, ptype, target)
    except _errors() as exc:
        return dict(_ret(name), result=False, comment=str(exc))
    return _object_state("pool", name, spec, autostart, False, connection)


def pool_running(name, ptype="dir", target=None, autostart=True, connection=None):
    """
    Like ``virt.pool_defined``, and the pool is started (its directory created if needed).

    .. code-block:: yaml

        images:
          virt.pool_running:
            - target: /srv/salt-images
    """
    from saltvirt import netpool

    try:
        spec = netpool.pool_spec(name, ptype, target)
    except _errors() as exc:
        return dict(_ret(name), result=False, comment=str(exc))
    return _object_state("pool", name, spec, autostart, True, connection)
