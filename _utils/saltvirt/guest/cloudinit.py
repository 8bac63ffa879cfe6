"""cloud-init's NoCloud seed: the ``cidata`` volume stock cloud images (Debian, Ubuntu, Fedora generic
cloud) configure themselves from on their first boot.

:func:`documents` writes ``user-data``, ``meta-data`` and ``network-config`` from ``cloud_init=`` (as
:func:`saltvirt.model.checks.cloud_init` checked it): documents given as text go byte for byte; the short
forms (``users``, ``ssh_authorized_keys``, ``hostname``, ``ip``/``gateway``/``dns``) build them.
salt-virt's own additions (the Salt minion's files when no seeding backend could mount the image, the
minion installer: :mod:`saltvirt.guest.firstboot`) are a cloud-config of their own, merged with the user's
user-data as a MIME multipart (the user's part unchanged). :func:`make_iso` writes the ISO 9660 volume
(label ``cidata``, Rock Ridge + Joliet names) in pure Python with pycdlib, or with xorriso/genisoimage
when pycdlib is not installed. The volume is written on the hypervisor: a minion key in it was opened
there (the runner seals it to the hypervisor), never sent in clear.

When the seed goes away (:func:`retire`): as soon as the VM has started, the CD-ROM is detached from the
persistent definition and the ISO file is deleted. "Ready", for the seed, is "qemu holds it open": the
running VM keeps its CD for the whole first boot (in-guest reboots included: the live definition still
has it), where cloud-init reads it (its init-local stage) and caches what it read in the guest; the next
cold start has no CD, like ``virt-install --cloud-init``. Waiting for a sign from the guest instead (a
console line, the minion answering) would hang on every guest that never gives one and make the seed's
life depend on what the guest says; the hypervisor cannot tell more than "started" without trusting the
guest. With ``start=False`` the CD stays in the definition (and the ISO in the VM's directory) until the
VM is purged: start it with ``virt.init``'s ``start=True`` to get a single-use seed.
"""

import base64
import contextlib
import email.message
import email.mime.multipart
import email.mime.text
import io
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from typing import Any

import yaml
from salt.exceptions import CommandExecutionError

from saltvirt.base import fsutil
from saltvirt.base.salttypes import Data, Domain
from saltvirt.host.conn import libvirt, lv_errors
from saltvirt.model import vmspec
from saltvirt.xml.domain import devices, edit

LABEL = "cidata"
# file name in the volume -> ISO 9660 level-3 name (Rock Ridge and Joliet carry the real name)
NAMES = {"user-data": "USER_DATA.;1", "meta-data": "META_DATA.;1", "network-config": "NETWORK_CONFIG.;1"}
MERGE_HOW = [{"name": "list", "settings": ["append"]}, {"name": "dict", "settings": ["no_replace", "recurse_list"]}]
_SUBTYPES = {
    "#cloud-config": "cloud-config",
    "#!": "x-shellscript",
    "#include": "x-include-url",
    "#cloud-boothook": "cloud-boothook",
    "#part-handler": "part-handler",
}


def _yaml(data):
    return yaml.safe_dump(data, default_flow_style=False, sort_keys=False)


def _user_part(text):
    """The user's user-data as one part of a multipart: its content unchanged."""
    if text.startswith("Content-Type: multipart"):
        return email.message_from_string(text)  # cloud-init walks nested multiparts
    subtype = next((sub for prefix, sub in _SUBTYPES.items() if text.startswith(prefix)), "plain")
    return _text_part(text, subtype)


def _text_part(text, subtype):
    charset = "us-ascii" if text.isascii() else "utf-8"
    return email.mime.text.MIMEText(text, subtype, charset)


def user_data(ci: Data, additions: Data | None = None) -> str:
    """user-data (str): the user's text as given; with salt-virt ``additions`` (a cloud-config dict) a
    MIME multipart of the user's part and ours; otherwise a cloud-config from the short forms."""
    additions = additions or {}
    given = ci.get("user_data")
    if given is not None and not additions:
        return given
    if given is not None:
        ours = "#cloud-config\n" + _yaml(dict(additions, merge_how=MERGE_HOW))
        msg = email.mime.multipart.MIMEMultipart()
        msg.attach(_user_part(given))
        msg.attach(_text_part(ours, "cloud-config"))
        return msg.as_string()
    cfg = {}
    if ci.get("users"):
        cfg["users"] = ["default", *ci["users"]]  # "default": the image's own user stays
    if ci.get("ssh_authorized_keys"):
        cfg["ssh_authorized_keys"] = list(ci["ssh_authorized_keys"])
    cfg.update(additions)
    return "#cloud-config\n" + (_yaml(cfg) if cfg else "")


def meta_data(ci: Data, name: str, instance_id: str) -> str:
    """meta-data (str): as given, or ``instance-id`` (new for every virt.init, so cloud-init runs on a
    clone of an image that ran it before) and ``local-hostname``."""
    given = ci.get("meta_data")
    if isinstance(given, str):
        return given
    data = {"instance-id": instance_id, "local-hostname": ci.get("hostname") or name}
    if isinstance(given, dict):
        data = dict(given, **{k: v for k, v in data.items() if k not in given})
    return _yaml(data)


def network_config(ci: Data) -> str | None:
    """network-config (str) or None (cloud-init's default: DHCP on the first NIC)."""
    given = ci.get("network_config")
    if isinstance(given, str):
        return given
    if isinstance(given, dict):
        return _yaml(given)
    if not ci.get("ip"):
        return None
    eth = {"match": {"name": "e*"}, "addresses": [ci["ip"]]}  # the first Ethernet NIC: eth0, ens3, enp1s0
    if ci.get("gateway"):
        eth["routes"] = [{"to": "default" if ":" not in ci["gateway"] else "::/0", "via": ci["gateway"]}]
    if ci.get("dns"):
        eth["nameservers"] = {"addresses": list(ci["dns"])}
    return _yaml({"version": 2, "ethernets": {"primary": eth}})


def documents(ci: Any, *, name: str, instance_id: str, additions: Data | None = None) -> dict[str, bytes]:
    """``{file name: bytes}`` of the cidata volume (``network-config`` only when there is one)."""
    docs = {
        "user-data": user_data(ci, additions),
        "meta-data": meta_data(ci, name, instance_id),
        "network-config": network_config(ci),
    }
    return {k: v.encode("utf-8", "surrogatepass") for k, v in docs.items() if v is not None}


def write_files(files: Mapping[str, Data]) -> list[Data]:
    """cloud-config ``write_files`` for ``{guest path: {'content': bytes|str, 'mode': int}}`` (as
    :func:`saltvirt.guest.seed.salt_minion_files` makes them), base64 so any byte survives YAML."""
    out = []
    for path, spec in files.items():
        content = spec["content"].encode() if isinstance(spec["content"], str) else spec["content"]
        out.append(
            {
                "path": path,
                "encoding": "b64",
                "content": base64.b64encode(content).decode(),
                "owner": "root:root",
                "permissions": f"0{spec.get('mode', 0o644):o}",
            }
        )
    return out


# the ISO -------------------------------------------------------------------------------------------
def make_iso(path: str, docs: Mapping[str, bytes]) -> str:
    """Write the cidata ISO ``path`` (mode 0600: it may hold a minion key) with ``docs`` ({name: bytes}).
    Never overwrites: an existing ``path`` is an error. Returns which tool wrote it."""
    if os.path.lexists(path):
        raise CommandExecutionError(f"{path} already exists: refusing to overwrite it")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        try:
            import pycdlib  # noqa: PLC0415 - optional: xorriso/genisoimage otherwise
        except ImportError:
            pycdlib = None  # type: ignore[assignment]
        tool = _pycdlib(pycdlib, tmp, docs) if pycdlib else _mkisofs(tmp, docs)
        os.chmod(tmp, 0o600)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.link(tmp, path)  # fails if path appeared meanwhile: never overwrite
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return tool


def _pycdlib(pycdlib, tmp, docs):
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=LABEL)
    try:
        for name, data in docs.items():
            iso.add_fp(io.BytesIO(data), len(data), f"/{NAMES[name]}", rr_name=name, joliet_path=f"/{name}")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as fh:
            iso.write_fp(fh)
    finally:
        iso.close()
    return "pycdlib"


def _mkisofs(tmp, docs):
    tool = next((t for t in ("xorriso", "genisoimage", "mkisofs") if shutil.which(t)), None)
    if tool is None:
        raise CommandExecutionError(
            "cannot write the cloud-init ISO: install pycdlib (pip) or xorriso/genisoimage on the hypervisor"
        )
    with tempfile.TemporaryDirectory(prefix="salt-virt-cidata-") as staging:
        for name, data in docs.items():
            fsutil.atomic_write(os.path.join(staging, name), data, 0o600)
        cmd = ([tool, "-as", "mkisofs"] if tool == "xorriso" else [tool]) + ["-quiet", "-output", tmp]
        cmd += ["-volid", LABEL, "-joliet", "-rock", *(os.path.join(staging, n) for n in docs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if proc.returncode != 0:
            raise CommandExecutionError(f"{tool} could not write the cloud-init ISO: {proc.stderr.strip()}")
    return tool


# the seed's life -----------------------------------------------------------------------------------
def iso_path(vm_dir: str) -> str:
    return os.path.join(vm_dir, vmspec.CIDATA_DISK["file"])


def leftover(vm_dir: str) -> list[str]:
    """The seed ISO still in ``vm_dir`` (a VM created with start=False), for virt.purge: [] or [path]."""
    path = iso_path(vm_dir)
    return [path] if os.path.isfile(path) else []


def retire(dom: Domain, spec: vmspec.VMSpec) -> Data:
    """Once the VM runs: detach the cidata CD-ROM from the persistent definition (the running VM keeps
    it for this boot) and delete the ISO (qemu holds it open). Returns what was done."""
    disk: Any = vmspec.cidata_disk(spec)
    with lv_errors(f"detach the cloud-init CD-ROM of {spec.name!r} from its definition"):
        dom.detachDeviceFlags(edit.device_xml(devices.disk(disk)), libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(disk.path)
    return {"detached": True, "iso_removed": True, "target": disk.target}


def write_seed(spec: vmspec.VMSpec, additions: Data | None) -> Data:
    """Write ``spec``'s cidata ISO with salt-virt's ``additions`` (cloud-config). Returns ``{iso, tool,
    target, documents: {name: sha256}}`` (hashes only: user-data may hold a minion key)."""
    disk: Any = vmspec.cidata_disk(spec)
    instance_id = f"iid-{spec.name}-{secrets.token_hex(4)}"
    docs = documents(spec.cloud_init, name=spec.name, instance_id=instance_id, additions=additions)
    tool = make_iso(disk.path, docs)
    return {
        "iso": disk.path,
        "tool": tool,
        "target": disk.target,
        "instance_id": instance_id,
        "documents": {name: fsutil.sha256(data) for name, data in docs.items()},
    }
