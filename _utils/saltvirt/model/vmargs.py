"""The arguments of ``virt.init`` and ``virt.update``, declared once: :class:`InitRequest`.

Each field of :class:`InitRequest` is one row: its type, its default, what it takes, Salt's other
spelling(s), whether ``salt-run virt.init`` forwards it to the hypervisor, what ``virt.running``/
``virt.defined`` do with it on an existing VM, whether ``virt.update`` takes it and compares it, its checker
and the :class:`saltvirt.model.vmspec.VMSpec` field it fills. The loader builds one request from its
arguments; :func:`saltvirt.model.vmspec.build` loops the rows. Everything else is derived from the rows
(:data:`ARGS`): ``virt.init``'s accepted names (its signature is checked against the table by
tests/unit/model/test_vmargs.py), ``SPEC_ARGS``, the runner's forwarding
(:func:`saltvirt.fleet.vmcreate.forward`), the states' argument lists and the reference page
(:func:`markdown`).

Adding an argument: HACKING.md, "Add a domain argument" (a row here, the parameter of ``_modules/virt.py``'s
``init``, the element's builder and reader); the coverage test then checks the module, the runner and the
states do what the row says.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.model import checks

# salt-run virt.init: what the runner does with an argument
OWN = "own"  # a parameter of the runner itself, checked there and passed on to the hypervisor
FORWARD = "forward"  # passed to the hypervisor's virt.init as given
REFUSE = "refuse"  # refused: the runner sets it itself (:attr:`Arg.refusal` says why)
# virt.running / virt.defined on a VM that exists already
GIVEN = "given"  # enforced when the state gives it (not None), else the VM keeps what it has (as Salt's update)
CREATE = "create"  # only shapes a new VM (never compared with an existing one)
CALL = "call"  # says how to reach libvirt, not what the VM is (passed to every call)
KEY = "key"  # the state's name
NOT_TAKEN = "not taken"  # the states refuse it (:data:`STATE_REFUSALS` says why)


@dataclasses.dataclass(frozen=True)
class Arg:
    """One row of :class:`InitRequest`, as the rest of salt-virt reads it."""

    name: str
    default: object
    takes: str  # what it takes, in words (the reference page)
    doc: str  # one line for the reference page
    runner: str = FORWARD
    state: str = CREATE
    update: bool = False  # virt.update takes it
    spec: bool = False  # shapes the domain: virt.update compares it (saltvirt.vm.converge)
    salt: tuple = ()  # Salt's other spellings taken by virt.init, virt.update and the states
    salt_update: tuple = ()  # Salt's spellings only virt.update takes (its function has other names)
    refusal: str = ""  # why the runner refuses it (runner=REFUSE)
    required: bool = False
    type: str = ""  # the request's annotation (what Salt may pass: YAML gives strings for booleans too)
    # the checker: the VMSpec field ``into`` is check(value) (saltvirt.model.vmspec.build loops these rows);
    # None: not the domain's, or vmspec.build combines it with other arguments into ``into``
    check: Callable[[Any], Any] | None = None
    # the saltvirt.model.vmspec.VMSpec field it fills, or VMSpec.elements[into] for a row that is one element of
    # its own (saltvirt.xml.domain.elements); None: none
    into: str | None = None


_REQUIRED = object()
_UNSET = "<unset>"  # into= left out: a checked row fills the VMSpec field of its own name, another one none
_ITS_NAME = "<its name>"


def _row(
    default: object,
    takes: str,
    doc: str,
    check: Callable[[Any], Any] | None = None,
    into: str | None = _UNSET,
    **how: Any,
) -> Any:
    """One row: the request field's default, the rest of the row in its metadata (read back as :data:`ARGS`)."""
    if into == _UNSET:
        into = None if check is None else _ITS_NAME
    meta = {"row": dict(how, takes=takes, doc=doc, check=check, into=into)}
    if default is _REQUIRED:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def arg(default: object, takes: str, doc: str, **how: Any) -> Any:
    """A row with a default."""
    return _row(default, takes, doc, **how)


def required(takes: str, doc: str, **how: Any) -> Any:
    """A row without a default (``name``, ``cpu``, ``mem``)."""
    return _row(_REQUIRED, takes, doc, required=True, **how)


@dataclasses.dataclass
class InitRequest:
    """The arguments of one ``virt.init`` (and, with what a call gives, ``virt.update`` and the states), as the
    loader got them: the table. Each field is one row (its default, what it takes, what the runner and the
    states do with it, its checker and the VMSpec field it fills); the field order is ``virt.init``'s
    signature. Built once by the loader, it travels down to :func:`saltvirt.model.vmspec.build` as it is."""

    # fmt: off
    name: str = required("str", "VM name; also the new minion's id unless minion_id", runner=OWN, state=KEY,
        update=True, into="name")
    cpu: int | str | dict | None = required("int or dict",
        "vCPUs, or Salt's cpu mapping (model, topology, numa, tuning)", runner=OWN, state=GIVEN, update=True,
        into="cpu")
    mem: int | str | dict | None = required("int (MiB) or dict",
        "memory, or Salt's mem mapping (boot, max, hugepages, ...)", runner=OWN, state=GIVEN, update=True, into="mem")
    image: str | None = arg(None, "salt:// URL, https URL or absolute path", "the image the system disk is cloned from",
        runner=OWN, state=GIVEN, update=True, into="disks")
    nic: str | None = arg("default", "profile name", "NIC profile from virt:nic", state=GIVEN, update=True, spec=True,
        salt_update=("nic_profile",), into="nics")
    disk: str | None = arg("default", "profile name", "disk profile from virt:disk", state=GIVEN, update=True,
        spec=True, salt_update=("disk_profile",), into="disks")
    disks: list | dict | None = arg(None, "list or mapping", "disks added to or overriding the profile's, by name",
        state=GIVEN, update=True, spec=True, into="disks")
    interfaces: list | dict | None = arg(None, "list or mapping", "NICs added to or overriding the profile's, by name",
        state=GIVEN, update=True, spec=True, into="nics")
    enable_qcow: bool | str = arg(False, "bool", "a qcow2 overlay on the image instead of a full copy", runner=OWN,
        state=GIVEN, update=True, spec=True, into="disks")
    enable_vnc: bool | str = arg(False, "bool", "a VNC console on 127.0.0.1", runner=OWN, state=GIVEN, update=True,
        spec=True, into="graphics")
    graphics: dict | str | None = arg(None, "dict", "{type, listen, port, password}", state=GIVEN, update=True,
        spec=True, into="graphics")
    boot: dict | None = arg(None, "dict", "direct kernel boot or UEFI ({kernel, initrd, cmdline} / {efi: True})",
        state=GIVEN, update=True, spec=True, into="boot")
    start: bool | str = arg(True, "bool", "start the VM after seeding", runner=OWN, state=NOT_TAKEN)
    seed: bool | str = arg(True, "bool", "write minion config and keys into the image before boot", runner=OWN)
    seed_cmd: str | None = arg("seed.apply", "str",
        "Salt's seed function: ignored (salt-virt seeds with its own backends)")
    seed_backend: str = arg("auto", "str", "auto, libguestfs, qemu-nbd, qsd-fuse, loop or cloud-init")
    saltenv: str = arg("base", "str", "the fileserver environment of salt:// images", runner=OWN)
    pub_key: str | None = arg(None, "PEM", "the new minion's public key", runner=REFUSE,
        refusal="salt-run virt.init makes the new minion's key pair and pre-accepts it")
    priv_key: str | dict | None = arg(None, "PEM", "the new minion's private key", runner=REFUSE,
        refusal="salt-run virt.init makes the new minion's key pair and pre-accepts it")
    master: str | list | None = arg(None, "str or list", "the master the new minion connects to")
    minion_id: str | None = arg(None, "str", "the new minion's id (default: the VM name)", runner=OWN)
    minion_config: dict | None = arg(None, "dict", "extra minion config written into the image")
    vtype: str | None = arg(None, "kvm or qemu", "domain type (default virt:type, or what the host can run)",
        salt=("hypervisor", "vm_type"), into="vtype")
    serial_log: bool | str | None = arg(True, "bool or path", "log the serial console to a file", update=True,
        spec=True, into="serial_log")
    group: str | None = arg(None, "str", "anti-affinity group (the runner never puts two of one group on a host)",
        runner=OWN, update=True, spec=True, check=checks.group)
    connection: str | None = arg(None, "name", "a libvirt connection the minion config names (virt:connections)",
        runner=REFUSE, state=CALL, update=True,
        refusal="each one uses the libvirt connection its minion config names (virt:connection)")
    checksum: str | None = arg(None, "sha256:<hex> or sha512:<hex>", "verify the image before use")
    allow_http: bool | str = arg(False, "bool", "operator switch: refused (minion config virt:insecure_http_images)")
    trusted_image: bool | str = arg(False, "bool",
        "operator switch: refused (minion config virt:insecure_trusted_images)")
    cloud_init: bool | str | dict | None = arg(None, "bool or dict",
        "a cloud-init NoCloud seed CD-ROM for the first boot", check=checks.cloud_init)
    guest_agent: bool | str = arg(True, "bool", "the QEMU guest agent channel", check=validate.to_bool)
    boot_dev: str | list | None = arg(None, "str", 'boot order without a kernel ("hd cdrom network")', state=GIVEN,
        update=True, spec=True, check=checks.boot_dev)
    os_type: str | None = arg(None, "hvm", "Salt's os_type (only hvm)", update=True, spec=True, check=checks.os_type,
        into=None)
    arch: str | None = arg(None, "str", "Salt's arch (only the host's)", update=True, spec=True, check=checks.arch)
    stop_on_reboot: bool | str | None = arg(False, "bool", "stop instead of rebooting", state=GIVEN, update=True,
        spec=True, check=checks.stop_on_reboot)
    serials: list | dict | None = arg(None, "list", "extra serial ports (pty or tcp)", state=GIVEN, update=True,
        spec=True, check=checks.serials)
    consoles: list | dict | None = arg(None, "list", "virtio consoles (pty or tcp)", state=GIVEN, update=True,
        spec=True, check=checks.consoles)
    tpm: bool | str | dict | None = arg(None, "bool or dict", "an emulated TPM (swtpm)", state=GIVEN, update=True,
        spec=True, check=checks.tpm)
    clock: dict | None = arg(None, "dict", "Salt's clock: utc, timezone, adjustment, timers", state=GIVEN, update=True,
        spec=True, check=checks.clock)
    hypervisor_features: dict | None = arg(None, "dict", "{kvm-hint-dedicated, kvm-hidden}", state=GIVEN, update=True,
        spec=True, check=checks.hypervisor_features)
    numatune: dict | None = arg(None, "dict", "host NUMA memory placement", state=GIVEN, update=True, spec=True,
        into="numatune")
    host_devices: list | str | None = arg(None, "list", "node devices to pass through (PCI, USB)", state=GIVEN,
        update=True, spec=True, check=checks.host_devices)
    owner: dict | None = arg(None, "{tenant, creator}", "the VM's tenant and creator, kept in its <metadata>",
        runner=REFUSE, refusal="salt-run virt.init records the tenant and the caller Salt authenticated",
        check=checks.owner)
    ha: bool | str | None = arg(None, "bool",
        "automatic HA restarts it when its host is lost (kept in <metadata>; a tenant's only with the master's "
        "virt:ha:tenant_flag)",
        state=GIVEN, update=True, spec=True, check=checks.ha)
    catalog_image: str | None = arg(None, "catalog image name",
        "the virt:catalog entry image= came from, kept in <metadata> as the VM's image (else image= without "
        "user:password, query and fragment)",
        runner=REFUSE, refusal="salt-run virt.init records the catalog entry its image= names")
    watchdog: bool | str | dict | None = arg(None, "bool, model or dict",
        "a watchdog device ({model: i6300esb|ib700|diag288, action: reset|shutdown|poweroff|pause|none|dump|"
        "inject-nmi})", state=GIVEN, update=True, spec=True, check=checks.watchdog)
    rng: bool | str | None = arg(None, "bool", "a virtio RNG fed by the host's /dev/urandom (entropy at first boot)",
        state=GIVEN, update=True, spec=True, check=lambda v: v is not None and checks.flag(v, "rng"))
    # fmt: on


def _arg(f: dataclasses.Field) -> Arg:
    row = dict(f.metadata["row"])
    if row["into"] == _ITS_NAME:
        row["into"] = f.name
    default = _REQUIRED if f.default is dataclasses.MISSING else f.default
    return Arg(name=f.name, default=default, type=getattr(f.type, "__name__", None) or str(f.type), **row)


ARGS = tuple(_arg(f) for f in dataclasses.fields(InitRequest))
BY_NAME = {a.name: a for a in ARGS}
NAMES = tuple(a.name for a in ARGS)  # virt.init's arguments, in its signature's order
# what goes straight to saltvirt.model.vmspec.build
SPEC_ARGS = tuple(a.name for a in ARGS if a.spec)
# the keywords virt.update passes to saltvirt.vm.converge.update (cpu, mem and connection are its own)
UPDATE_KWARGS = tuple(a.name for a in ARGS if a.update and a.name not in ("name", "cpu", "mem", "connection"))
# virt.running/defined on an existing VM: what virt.update gets when the state gives it (the rest is left alone)
STATE_UPDATE_ARGS = tuple(a.name for a in ARGS if a.state in (GIVEN, CALL) and a.name not in ("cpu", "mem"))
# what the states refuse, and why
STATE_REFUSALS = {
    "start": "start is not an argument of virt.running/defined: virt.running starts the VM, virt.defined does not"
}
# the keywords virt.running/defined take besides their own name, cpu and mem
STATE_KWARGS = tuple(a.name for a in ARGS if a.state not in (KEY, NOT_TAKEN) and a.name not in ("cpu", "mem"))
# virt.update's own arguments besides virt.init's (the reference page)
UPDATE_ONLY = {
    "test": "return the changes and the plan without making them",
    "live": "Salt's live: True (the default) changes a running VM live where libvirt can; False only its "
    "definition (taken at the next start)",
    "autostart": "Salt's autostart: set the VM's autostart flag",
}
# Salt's virt.init arguments that are not salt-virt's: what happens to them (saltvirt.model.compat.init_args)
SALT_RETIRED = {
    "install": "ignored with a warning: virt:minion_install installs salt-minion at first boot",
    "serial_type": "pty (or empty) ignored with a warning; anything else refused",
    "console": "True ignored with a warning (every VM has a serial console); False refused",
    "username": "empty accepted; anything else refused",
    "password": "empty accepted; anything else refused",
}
# Salt's virt.init arguments taken under Salt's meaning without being salt-virt's own parameters
SALT_TAKEN = {
    "images": "old Salt's per-call images directory: the VM's disks go there when it is virt:images or inside "
    "virt:allowed_paths (the hypervisor's config decides), else refused naming those settings; when every "
    "disk names a pool (none goes there) the return's warnings say so",
}


def shaping(req: InitRequest) -> InitRequest:
    """Of ``req``, what shapes the domain as ``virt.update`` compares it (:data:`SPEC_ARGS`; ``cloud_init`` for
    a new VM's preview): the rest at its defaults."""
    return InitRequest(req.name, req.cpu, req.mem, cloud_init=req.cloud_init, **{k: getattr(req, k) for k in SPEC_ARGS})


def update_request(name: str, cpu: Any, mem: Any, given: Mapping[str, Any]) -> tuple[InitRequest, frozenset[str]]:
    """``virt.update``'s request from its keywords ``given`` (Salt's spellings already mapped, see
    :func:`update_renames`), and the names it was given: only those are managed. Refuses what
    ``virt.update`` does not take (:data:`UPDATE_KWARGS`)."""
    unknown = sorted(k for k in given if k not in UPDATE_KWARGS)
    if unknown:
        raise SaltInvocationError(
            f"cannot update {', '.join(unknown)} of an existing VM (only cpu, mem, {', '.join(SPEC_ARGS)})"
        )
    return InitRequest(name, cpu, mem, **given), frozenset(given)


def update_renames() -> dict[str, str]:
    """``{Salt's virt.update spelling: salt-virt's name}`` (``disk_profile`` -> ``disk``)."""
    return {old: a.name for a in ARGS for old in a.salt_update}


def signature_mismatches(func: Callable[..., Any]) -> list[str]:
    """How ``func``'s signature (``virt.init``) differs from the table: ``[]`` when it matches, names and
    defaults in order."""
    import inspect  # noqa: PLC0415 - only the check needs it

    params = [p for p in inspect.signature(func).parameters.values() if p.kind is not p.VAR_KEYWORD]
    out = []
    if [p.name for p in params] != list(NAMES):
        out.append(f"names: signature {[p.name for p in params]} != table {list(NAMES)}")
    for p in params:
        arg = BY_NAME.get(p.name)
        if arg is None:
            continue
        want = inspect.Parameter.empty if arg.required else arg.default
        if p.default != want:
            out.append(f"{p.name}: default {p.default!r} in the signature, {want!r} in the table")
    return out


_RUNNER_WORDS = {OWN: "yes (its own parameter)", FORWARD: "yes", REFUSE: "refused"}
_STATE_WORDS = {
    GIVEN: "to virt.update when given",
    CREATE: "creation only",
    CALL: "every call",
    KEY: "the state's name",
    NOT_TAKEN: "refused (virt.running starts, virt.defined does not)",
}


def markdown() -> str:
    """The reference page of ``virt.init``/``virt.update``'s arguments (MyST markdown), from :data:`ARGS`."""
    lines = [
        "# virt.init and virt.update arguments",
        "",
        "Generated from `saltvirt.model.vmargs` (the one declaration of these arguments): "
        "`salt-run virt.init` column: whether the runner passes the argument to the hypervisor; "
        "`virt.running` column: what the states do with it on a VM that exists already.",
        "",
        "| argument | takes | default | Salt's spelling | salt-run virt.init | virt.running / defined | virt.update "
        "| what it does |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in ARGS:
        default = "required" if a.required else f"`{a.default!r}`"
        spellings = ", ".join(f"`{s}`" for s in a.salt) + (
            ", ".join(f"`{s}` (virt.update)" for s in a.salt_update) if a.salt_update else ""
        )
        runner = _RUNNER_WORDS[a.runner] + (f": {a.refusal}" if a.refusal else "")
        lines.append(
            f"| `{a.name}` | {a.takes} | {default} | {spellings or '-'} | {runner} | {_STATE_WORDS[a.state]} "
            f"| {'yes' if a.update else '-'} | {a.doc} |"
        )
    lines += ["", "## virt.update only", ""]
    lines += [f"- `{name}`: {doc}" for name, doc in UPDATE_ONLY.items()]
    lines += ["", "## Salt's arguments taken under Salt's meaning", ""]
    lines += [f"- `{name}`: {doc}" for name, doc in SALT_TAKEN.items()]
    lines += ["", "## Salt's arguments salt-virt does not take", ""]
    lines += [f"- `{name}`: {doc}" for name, doc in SALT_RETIRED.items()]
    return "\n".join(lines) + "\n"
