"""The arguments of ``virt.init`` and ``virt.update``, declared once.

Each :class:`Arg` says what it takes, its default, Salt's other spelling(s), whether ``salt-run virt.init``
forwards it to the hypervisor, what ``virt.running``/``virt.defined`` do with it on an existing VM, whether
``virt.update`` takes it and whether it shapes the domain (:func:`saltvirt.spec.vmspec.build`). Everything
else is derived from :data:`ARGS`: ``virt.init``'s accepted names (its signature is checked against the
table by tests/unit/spec/test_vmargs.py), ``SPEC_ARGS``, the runner's forwarding (:func:`forward`), the
states' argument lists and the reference page (:func:`markdown`).

Adding an argument: a row here, the parameter in ``_modules/virt.py``'s ``init`` (same default), and its
handling; the coverage test then checks the module, the runner and the states do what the row says.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from salt.exceptions import SaltInvocationError

from saltvirt.base.salttypes import Data
from saltvirt.spec import compat

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
    name: str
    default: object
    takes: str  # what it takes, in words (the reference page)
    doc: str  # one line for the reference page
    runner: str = FORWARD
    state: str = CREATE
    update: bool = False  # virt.update takes it
    spec: bool = False  # shapes the domain: goes to saltvirt.spec.vmspec.build
    salt: tuple = ()  # Salt's other spellings taken by virt.init, virt.update and the states
    salt_update: tuple = ()  # Salt's spellings only virt.update takes (its function has other names)
    refusal: str = ""  # why the runner refuses it (runner=REFUSE)
    required: bool = False


_REQUIRED = object()

ARGS = (
    Arg("name", _REQUIRED, "str", "VM name; also the new minion's id unless minion_id", OWN, KEY, True, required=True),
    Arg("cpu", _REQUIRED, "int or dict", "vCPUs, or Salt's cpu mapping (model, topology, numa, tuning)", OWN, GIVEN,
        True, required=True),
    Arg("mem", _REQUIRED, "int (MiB) or dict", "memory, or Salt's mem mapping (boot, max, hugepages, ...)", OWN,
        GIVEN, True, required=True),
    Arg("image", None, "salt:// URL, https URL or absolute path", "the image the system disk is cloned from", OWN,
        GIVEN, True),
    Arg("nic", "default", "profile name", "NIC profile from virt:nic", state=GIVEN, update=True, spec=True,
        salt_update=("nic_profile",)),
    Arg("disk", "default", "profile name", "disk profile from virt:disk", state=GIVEN, update=True, spec=True,
        salt_update=("disk_profile",)),
    Arg("disks", None, "list or mapping", "disks added to or overriding the profile's, by name", state=GIVEN,
        update=True, spec=True),
    Arg("interfaces", None, "list or mapping", "NICs added to or overriding the profile's, by name", state=GIVEN,
        update=True, spec=True),
    Arg("enable_qcow", False, "bool", "a qcow2 overlay on the image instead of a full copy", OWN, GIVEN, True, True),
    Arg("enable_vnc", False, "bool", "a VNC console on 127.0.0.1", OWN, GIVEN, True, True),
    Arg("graphics", None, "dict", "{type, listen, port, password}", state=GIVEN, update=True, spec=True),
    Arg("boot", None, "dict", "direct kernel boot or UEFI ({kernel, initrd, cmdline} / {efi: True})", state=GIVEN,
        update=True, spec=True),
    Arg("start", True, "bool", "start the VM after seeding", OWN, NOT_TAKEN),
    Arg("seed", True, "bool", "write minion config and keys into the image before boot", OWN),
    Arg("seed_cmd", "seed.apply", "str", "Salt's seed function: ignored (salt-virt seeds with its own backends)"),
    Arg("seed_backend", "auto", "str", "auto, libguestfs, qemu-nbd, qsd-fuse, loop or cloud-init"),
    Arg("saltenv", "base", "str", "the fileserver environment of salt:// images", OWN),
    Arg("pub_key", None, "PEM", "the new minion's public key", REFUSE,
        refusal="salt-run virt.init makes the new minion's key pair and pre-accepts it"),
    Arg("priv_key", None, "PEM", "the new minion's private key", REFUSE,
        refusal="salt-run virt.init makes the new minion's key pair and pre-accepts it"),
    Arg("master", None, "str or list", "the master the new minion connects to"),
    Arg("minion_id", None, "str", "the new minion's id (default: the VM name)", OWN),
    Arg("minion_config", None, "dict", "extra minion config written into the image"),
    Arg("vtype", None, "kvm or qemu", "domain type (default virt:type, or what the host can run)",
        salt=("hypervisor", "vm_type")),
    Arg("serial_log", True, "bool or path", "log the serial console to a file", update=True, spec=True),
    Arg("group", None, "str", "anti-affinity group (the runner never puts two of one group on a host)", OWN,
        update=True, spec=True),
    Arg("connection", None, "name", "a libvirt connection the minion config names (virt:connections)", REFUSE,
        CALL, True, refusal="each one uses the libvirt connection its minion config names (virt:connection)"),
    Arg("checksum", None, "sha256:<hex> or sha512:<hex>", "verify the image before use"),
    Arg("allow_http", False, "bool", "operator switch: refused (minion config virt:insecure_http_images)"),
    Arg("trusted_image", False, "bool", "operator switch: refused (minion config virt:insecure_trusted_images)"),
    Arg("cloud_init", None, "bool or dict", "a cloud-init NoCloud seed CD-ROM for the first boot"),
    Arg("guest_agent", True, "bool", "the QEMU guest agent channel"),
    Arg("boot_dev", None, "str", 'boot order without a kernel ("hd cdrom network")', state=GIVEN, update=True,
        spec=True),
    Arg("os_type", None, "hvm", "Salt's os_type (only hvm)", update=True, spec=True),
    Arg("arch", None, "str", "Salt's arch (only the host's)", update=True, spec=True),
    Arg("stop_on_reboot", False, "bool", "stop instead of rebooting", state=GIVEN, update=True, spec=True),
    Arg("serials", None, "list", "extra serial ports (pty or tcp)", state=GIVEN, update=True, spec=True),
    Arg("consoles", None, "list", "virtio consoles (pty or tcp)", state=GIVEN, update=True, spec=True),
    Arg("tpm", None, "bool or dict", "an emulated TPM (swtpm)", state=GIVEN, update=True, spec=True),
    Arg("clock", None, "dict", "Salt's clock: utc, timezone, adjustment, timers", state=GIVEN, update=True,
        spec=True),
    Arg("hypervisor_features", None, "dict", "{kvm-hint-dedicated, kvm-hidden}", state=GIVEN, update=True,
        spec=True),
    Arg("numatune", None, "dict", "host NUMA memory placement", state=GIVEN, update=True, spec=True),
    Arg("host_devices", None, "list", "node devices to pass through (PCI, USB)", state=GIVEN, update=True,
        spec=True),
    Arg("owner", None, "{tenant, creator}", "the VM's tenant and creator, kept in its <metadata>", REFUSE,
        refusal="salt-run virt.init records the tenant and the caller Salt authenticated"),
    Arg("ha", None, "bool", "automatic HA restarts it when its host is lost (kept in <metadata>; a tenant's only with "
        "the master's virt:ha:tenant_flag)", state=GIVEN, update=True, spec=True),
    Arg("catalog_image", None, "catalog image name", "the virt:catalog entry image= came from, kept in <metadata> as "
        "the VM's image (else image= without user:password, query and fragment)", REFUSE,
        refusal="salt-run virt.init records the catalog entry its image= names"),
)  # fmt: skip
BY_NAME = {a.name: a for a in ARGS}
NAMES = tuple(a.name for a in ARGS)  # virt.init's arguments, in its signature's order
# what goes straight to saltvirt.spec.vmspec.build
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
# Salt's virt.init arguments that are not salt-virt's: what happens to them (saltvirt.spec.compat.init_args)
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


def update_renames() -> dict[str, str]:
    """``{Salt's virt.update spelling: salt-virt's name}`` (``disk_profile`` -> ``disk``)."""
    return {old: a.name for a in ARGS for old in a.salt_update}


def forward(kwargs: Data, where: str = "salt-run virt.init") -> Data:
    """The keywords ``salt-run virt.init`` passes on to the hypervisor's ``virt.init``: ``kwargs`` (Salt's
    old spellings already mapped by :func:`saltvirt.spec.compat.init_args`) minus the loader's ``__`` keys.
    Refuses what the runner sets itself and names it does not know (with the nearest one)."""
    kwargs = {k: v for k, v in kwargs.items() if not str(k).startswith("__")}
    refused = sorted(k for k in kwargs if k in BY_NAME and BY_NAME[k].runner == REFUSE)
    if refused:  # the value is not echoed (a key, a URI)
        arg = refused[0]
        raise SaltInvocationError(
            f"{where}: {arg}= is not forwarded to the hypervisors: {BY_NAME[arg].refusal}; drop {arg}="
        )
    # SALT_TAKEN (images=): checked by the hypervisor (compat.images_dir)
    compat.refuse_unknown(kwargs, [*(a.name for a in ARGS if a.runner != REFUSE), *SALT_TAKEN], where)
    return kwargs


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
        "Generated from `saltvirt.spec.vmargs` (the one declaration of these arguments): "
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
