"""
States for libvirt hypervisors and their VMs: ``virt.keys`` (libvirt TLS files from the ``libvirt``
pillar), VMs (``running``, ``defined``, ``stopped``, ``powered_off``, ``rebooted``, ``absent``),
networks (storage pools: _states/virt_storage.py). The logic lives in the ``saltvirt`` library.
"""

import os
import sys
import types
from typing import TYPE_CHECKING

saltvirt: types.ModuleType | None  # None: the library is missing (__virtual__ says so)
try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{states,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

if saltvirt is not None:
    # virt.init's arguments: what the states take and enforce on an existing VM (the one declaration)
    from saltvirt.model import vmargs

if TYPE_CHECKING:  # what Salt's loader injects into this module
    from saltvirt.base.salttypes import SaltFunctions, SaltOpts, SaltPillar

    __opts__: SaltOpts
    __salt__: SaltFunctions
    __pillar__: SaltPillar

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, (
            "virt states: the saltvirt library is missing: run saltutil.sync_all, or "
            "pip install 'salt-virt[hypervisor]' (Salt's onedir packages: salt-pip install 'salt-virt[hypervisor]')"
        )
    return __virtualname__


def keys(name, basepath="/etc/pki", qemu=False, qemu_group=None, replace_foreign=False, libvirtd_conf=None, **kwargs):  # pylint: disable=unused-argument
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
    libvirtd_conf
        A libvirtd config file to set ``crl_file`` (``<basepath>/CA/cacrl.pem``, the CA's revocation list)
        and ``tls_allowed_dn_list`` (hypervisor client certificates only: not QEMU's, not a tenant's) in.
        Default: none, every file is left alone, as Salt's own ``virt.keys`` does: libvirtd.conf is often
        a formula's (libvirt-formula templates it from the pillar ``libvirt:libvirtd``, where the
        ``libvirt`` ext_pillar puts both settings). Name it only when nothing else manages that file.

    The CRL is also written as ``<basepath>/CA/cacrl.pem`` (and ``qemu/ca-crl.pem``); QEMU's directory
    gets its own key pair, which libvirtd does not accept as a client.

    Changes name the files ("created", "updated", "key written", "key replaced", "mode ..."), never key
    material; ``test=True`` reports exactly those changes and writes nothing. Watch it to restart libvirtd.

    .. code-block:: yaml

        libvirt_keys:
          virt.keys:
            - basepath: /etc/pki
    """
    from saltvirt.pki import keyfiles

    data = __pillar__.get("libvirt")
    if not data:  # a host that just became a hypervisor in this very run: ask the master afresh
        data = __salt__["pillar.items"](unmask=True).get("libvirt")
    return keyfiles.keys_state(
        name,
        data,
        basepath,
        qemu=qemu,
        test=__opts__["test"],
        qemu_group=qemu_group,
        replace_foreign=replace_foreign,
        libvirtd_conf=libvirtd_conf,
    )


# VMs -----------------------------------------------------------------------------------------------
def _ret(name, **kw):
    return dict({"name": name, "result": True, "changes": {}, "comment": ""}, **kw)


def _errors():
    from salt.exceptions import CommandExecutionError, SaltInvocationError

    return (CommandExecutionError, SaltInvocationError)


def _vm_state(name, connection=None):
    if name not in __salt__["virt.list_domains"](connection=connection):
        return None
    return __salt__["virt.vm_state"](name, connection=connection).get(name)


def _check_args(kwargs):
    """The state takes virt.init's arguments (saltvirt.model.vmargs): refuse others (a typo must not pass silently)."""
    from salt.exceptions import SaltInvocationError

    from saltvirt.model import compat

    refused = sorted(set(kwargs) & set(vmargs.STATE_REFUSALS))
    if refused:
        raise SaltInvocationError(vmargs.STATE_REFUSALS[refused[0]])
    compat.refuse_operator_switches(kwargs)  # trusted_image=, allow_http=: the minion config's, also for test=True
    compat.refuse_unknown(
        kwargs,
        sorted({*vmargs.STATE_KWARGS, *vmargs.SALT_TAKEN}),  # images=: compat.images_dir
        "virt.running/defined (they take the arguments of virt.init)",
    )


def _image_format(image, saltenv, test, trusted=False, roots=()):
    """Format of the image the VM would be cloned from, when it can be known without side effects
    (test=True never fetches: an uncached salt:// image or a URL stays "as the image"). Decided by
    saltvirt.storage.intake (header + ``qemu-img info -f``): a hostile image, or a local path outside ``roots``
    (virt:images + virt:allowed_paths), is refused here already."""
    from saltvirt.base.validate import to_bool
    from saltvirt.storage import intake

    if not image:
        return None
    intake.confine_local(image, roots)
    if image.startswith("/"):
        return intake.probe(image, trusted=to_bool(trusted))["format"]
    if image.startswith("salt://"):
        local = __salt__["cp.is_cached"](image, saltenv) if test else __salt__["cp.cache_file"](image, saltenv)
        return intake.probe(local, image)["format"] if local else None
    return None


def _config(key, default):
    from saltvirt.host import conn as _c

    return _c.salt_config(__salt__)(key, default) or default


def _create(ret, name, cpu, mem, start, kwargs):
    from salt.exceptions import SaltInvocationError

    from saltvirt.model.vmspec import DEFAULT_IMAGES_DIR
    from saltvirt.vm import converge

    if cpu is None or mem is None:
        raise SaltInvocationError(f"VM {name} does not exist: cpu and mem are needed to create the VM")
    from saltvirt.base.validate import allowed_paths as _allowed

    test = __opts__["test"]
    from saltvirt.base.validate import configured_allowed_paths
    from saltvirt.model import compat

    allowed = configured_allowed_paths(__opts__)  # minion config only
    images_dir = compat.images_dir(kwargs.get("images"), _config("virt:images", DEFAULT_IMAGES_DIR), allowed)
    profiles = {"nic": _config("virt:nic", {}), "disk": _config("virt:disk", {})}
    unused = compat.images_unused(
        kwargs.get("images"), name, profiles, kwargs.get("disk", "default"), kwargs.get("disks")
    )
    if unused:  # virt.init's return has it too, but this return is the state's own
        ret.setdefault("warnings", []).append(unused)
    req = vmargs.InitRequest(name, cpu, mem, **{k: v for k, v in kwargs.items() if k in vmargs.BY_NAME})
    created = converge.preview(
        req,
        images_dir=images_dir,
        profiles=profiles,
        image_format=_image_format(
            kwargs.get("image"),
            kwargs.get("saltenv", "base"),
            test,
            trusted=kwargs.get("image") in (((__opts__.get("virt") or {}).get("insecure_trusted_images")) or ()),
            roots=(images_dir, *_allowed(allowed)),
        ),
        allowed_paths=allowed,
    )
    created["started"] = bool(start)
    ret["changes"] = {"created": created}
    what = "created" + (" and started" if start else "")
    if test:
        return dict(ret, result=None, comment=f"VM {name} would be {what}")
    done = __salt__["virt.init"](name, cpu, mem, start=start, **kwargs)
    ret["changes"]["created"]["uuid"] = done["uuid"]
    comment = [f"VM {name} {what} on {done['host']}"]
    if done.get("seed"):
        comment.append(f"seeded with {done['seed']['backend']}")
    if (done.get("key") or {}).get("hint"):
        comment.append(done["key"]["hint"])
    return dict(ret, comment="; ".join(comment))


def _update(ret, name, cpu, mem, start, state, kwargs, live):
    test = __opts__["test"]
    connection = kwargs.get("connection")
    # only what the state gives (not None): the rest of the VM is left as it is, as Salt's update
    args = {k: v for k, v in kwargs.items() if k in vmargs.STATE_UPDATE_ARGS and v is not None}
    upd = __salt__["virt.update"](name, cpu=cpu, mem=mem, test=test, live=live, **args)
    changes = {k: v for k, v in upd["changes"].items() if k != "disks" or v.get("added")}
    if "disks" in changes:
        changes["disks"] = {"added": changes["disks"]["added"]}
    starting = start and state != "running"
    if starting:
        changes["state"] = {"old": state, "new": "running"}
    would = "would " if test else ""
    done = upd["plan"] if test else upd["applied"] or {}
    updated = any(k != "state" for k in changes)
    parts = [f"VM {name} " + (("would be updated" if test else "updated") if updated else "is as declared")]
    for key, text in (("live", "apply live"), ("restart", "need restart"), ("definition", "apply to the definition")):
        if done.get(key):
            label = (
                f"{would}{text}"
                if test
                else {"live": "applied live", "restart": "needs restart", "definition": "applied to the definition"}[
                    key
                ]
            )
            if key == "definition":
                label += " (takes effect when the VM starts)" if not starting else ""
            parts.append(f"{label}: {', '.join(done[key])}")
    if starting:
        parts.append(
            f"{would}{'resume' if state == 'paused' else 'start'} it"
            if test
            else f"{'resumed' if state == 'paused' else 'started'} it"
        )
        if not test:
            __salt__["virt.resume" if state == "paused" else "virt.start"](name, connection=connection)
    elif upd.get("pending_restart"):
        parts.append(f"pending restart (defined, not yet in the running VM): {', '.join(upd['pending_restart'])}")
    unlisted = upd["changes"].get("disks", {}).get("not_in_spec")
    if unlisted:
        parts.append(f"disks not in the state, kept: {', '.join(unlisted)}")
    return dict(ret, changes=changes, result=None if test and changes else True, comment="; ".join(parts))


def _ensure_vm(name, cpu, mem, start, kwargs):
    ret = _ret(name)
    from saltvirt.model import compat

    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("__")}
    live = kwargs.pop("live", True)  # Salt's: False changes only the definition of a running VM
    try:
        warnings = compat.init_args(kwargs, "virt.running/defined")
        _check_args(kwargs)
        if warnings:
            ret["warnings"] = warnings
        state = _vm_state(name, kwargs.get("connection"))
        if state is None:
            return _create(ret, name, cpu, mem, start, kwargs)
        return _update(ret, name, cpu, mem, start, state, kwargs, live)
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))


def running(name, cpu=None, mem=None, **kwargs):
    """
    The VM exists with this shape and runs. Takes the arguments of ``virt.init`` (image, nic, disk,
    disks, interfaces, enable_qcow, enable_vnc, graphics, boot, seed, ...) and builds the same spec:

    - absent: created exactly as ``virt.init`` would (cpu and mem needed), and started;
    - present: what the state names is enforced (cpu, mem, NICs, disks, graphics, boot, boot_dev and the
      other domain features); what it does not name (or names as None) is left as it is, as Salt's
      update does: ``virt.running: [name: web1]`` never touches an existing VM's devices. Applied live
      where the hypervisor can, the rest to the definition, and the comment says which ("applied live:
      ..." / "needs restart: ..."). Disks the state does not list are reported, never removed; a new
      disk must be blank (size) or an existing file (path). Arguments that only matter at creation
      (image, seed, cloud_init, vm_type, ...) are not enforced.

    ``test=True`` returns the changes it would make (for a new VM: what ``virt.init`` will create).

    .. code-block:: yaml

        web1:
          virt.running:
            - cpu: 2
            - mem: 1024
            - image: salt://images/web.qcow2
            - enable_qcow: True
            - disks:
              - data: {size: 10240}
    """
    return _ensure_vm(name, cpu, mem, True, kwargs)


def defined(name, cpu=None, mem=None, **kwargs):
    """
    Like ``virt.running``, but a new VM is not started and a stopped one stays stopped (a running VM
    is left running, and changed live where possible; with Salt's ``live: False`` only its definition
    changes, taken at its next start).

    .. code-block:: yaml

        db1:
          virt.defined:
            - cpu: 4
            - mem: 4096
            - image: /srv/images/db.qcow2
    """
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
            return dict(
                ret,
                result=None,
                changes={"state": {"old": state, "new": wanted[0]}},
                comment=f"VM {name} would be {wanted[0]}",
            )
        __salt__[action](name, connection=connection, **args)
        now = _vm_state(name, connection)
        if now != state:
            ret["changes"] = {"state": {"old": state, "new": now}}
        if now not in wanted:
            return dict(ret, result=False, comment=f"VM {name} is still {now} after {action}")
        return dict(ret, comment=f"VM {name} is {now}")
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))


def stopped(name, timeout=60, connection=None):
    """
    The VM is shut down gracefully (ACPI power button), waiting up to ``timeout`` seconds. A guest that
    ignores the request makes the state fail; use ``virt.powered_off`` to pull the plug.

    .. code-block:: yaml

        web1:
          virt.stopped:
            - timeout: 120
    """
    ret = _power(name, ("shutoff",), "virt.shutdown", connection, timeout=timeout)
    if ret["result"] is False and "still" in ret["comment"]:
        ret["comment"] += f": the guest did not shut down within {timeout}s (use virt.powered_off to force it)"
    return ret


def powered_off(name, connection=None):
    """
    The VM is off, forcibly if needed (``virt.destroy``: like pulling the plug).

    .. code-block:: yaml

        web1:
          virt.powered_off
    """
    return _power(name, ("shutoff",), "virt.destroy", connection)


def rebooted(name, hard=False, connection=None):
    """
    Reboot a running VM (always a change; a VM that is not running is an error). By default the guest
    is asked to reboot (ACPI, like ``virt.reboot``) and does so itself; ``hard: True`` resets it
    (``virt.reset``: like pressing the reset button), for guests that ignore the request.

    .. code-block:: yaml

        web1:
          virt.rebooted:
            - hard: True
    """
    from saltvirt.base.validate import to_bool

    hard = to_bool(hard)
    ret = _ret(name)
    try:
        state = _vm_state(name, connection)
        if state != "running":
            return dict(
                ret, result=False, comment=f"VM {name} is {state or 'not defined'}: only a running VM can reboot"
            )
        how = "reset" if hard else "asked to reboot (ACPI; a guest that ignores it needs hard: True)"
        if __opts__["test"]:
            return dict(ret, result=None, changes={"rebooted": True}, comment=f"VM {name} would be {how}")
        __salt__["virt.reset" if hard else "virt.reboot"](name, connection=connection)
        return dict(ret, changes={"rebooted": True}, comment=f"VM {name} {how}")
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))


def absent(name, remove_disks=False, connection=None):
    """
    The VM is not defined (powered off first if it runs). Its disks are kept unless
    ``remove_disks: True``, and then only the disk files salt-virt created for it (``virt.purge``);
    what was kept and why is in the changes.

    .. code-block:: yaml

        old-web:
          virt.absent:
            - remove_disks: True
    """
    from saltvirt.base.validate import to_bool

    ret = _ret(name)
    remove_disks = to_bool(remove_disks)
    try:
        state = _vm_state(name, connection)
        if state is None:
            return dict(ret, comment=f"VM {name} is not defined")
        change = {
            "old": state,
            "new": "absent",
            "disks": "removed (the files salt-virt created for it)" if remove_disks else "kept",
        }
        if __opts__["test"]:
            return dict(ret, result=None, changes={"vm": change}, comment=f"VM {name} would be removed")
        if remove_disks:
            purged = __salt__["virt.purge"](name, connection=connection)
            change["removed"], change["kept"] = purged["removed"], purged["kept"]
        else:
            if state != "shutoff":
                __salt__["virt.destroy"](name, connection=connection)
            __salt__["virt.undefine"](name, connection=connection)
        return dict(
            ret, changes={"vm": change}, comment=f"VM {name} removed" + ("" if remove_disks else ", its disks kept")
        )
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))


# networks (pools: _states/virt_storage.py) -----------------------------------------------------------
def _object_state(kind, name, make_spec, autostart, run, connection):
    from saltvirt.host import conn as _c
    from saltvirt.host import netpool

    ret = _ret(name)
    try:
        spec = make_spec()
        with _c.salt_connect(__salt__, connection) as conn:  # open_timeout and keepalive apply
            done = netpool.ensure(conn, kind, spec, autostart=autostart, run=run, test=__opts__["test"])
    except _errors() as exc:
        return dict(ret, result=False, comment=str(exc))
    return dict(
        ret,
        changes=done["changes"],
        comment=done["comment"],
        result=None if __opts__["test"] and done["changes"] else True,
    )


def _network_state(args, started):
    """The network states' common body: ``args`` are the state's own arguments (its locals(); their names
    and defaults are ``saltvirt.model.netargs``' table, checked by tests/unit/model/test_netargs.py)."""
    from saltvirt.model import netargs
    from saltvirt.xml import netxml

    def spec():
        return netxml.network_spec(args["name"], **netargs.spec_kwargs(args))

    return _object_state("network", args["name"], spec, args["autostart"], started, args["connection"])


def network_defined(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    autostart=True,
    connection=None,
    ipv4_config=None,
    ipv6_config=None,
    vport=None,
    tag=None,
    mtu=None,
    domain=None,
    nat=None,
    interfaces=None,
    addresses=None,
    physical_function=None,
    dns=None,
):
    """
    A libvirt virtual network with this definition exists: the arguments of ``virt.network_define``
    (Salt's ``ipv4_config``/``ipv6_config`` with static DHCP ``hosts`` and ``bootp``, ``nat``, ``vport``,
    ``tag``, ``mtu``, ``domain``, ``dns``, ``interfaces``, ``physical_function``, ``addresses``; what
    is left out stays as the network has it). Changed static DHCP hosts of a running network are applied
    live; any other change of a running network is written and used after its restart (the comment
    says so). ``autostart``: True/False, or None to leave it.

    .. code-block:: yaml

        isolated:
          virt.network_defined:
            - forward: none
            - ipv4_config:
                cidr: 10.50.0.0/24
                dhcp_ranges:
                  - {start: 10.50.0.10, end: 10.50.0.99}
                hosts:
                  10.50.0.5: {mac: "52:54:00:00:00:05", name: db}
            - ipv6_config:
                cidr: fd00:50::/64
            - domain: {name: lab.example, localOnly: True}
    """
    return _network_state(locals(), started=False)


def network_running(
    name,
    bridge=None,
    forward="nat",
    ip=None,
    netmask=None,
    dhcp_start=None,
    dhcp_end=None,
    autostart=True,
    connection=None,
    ipv4_config=None,
    ipv6_config=None,
    vport=None,
    tag=None,
    mtu=None,
    domain=None,
    nat=None,
    interfaces=None,
    addresses=None,
    physical_function=None,
    dns=None,
):
    """
    Like ``virt.network_defined`` (the same arguments), and the network is started.

    .. code-block:: yaml

        lan:
          virt.network_running:
            - forward: bridge
            - bridge: br0
    """
    return _network_state(locals(), started=True)
