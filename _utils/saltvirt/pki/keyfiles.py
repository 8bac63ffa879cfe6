"""What the ``virt.keys`` state writes: the ``libvirt`` pillar's CA, certificates and keys at the paths
libvirtd reads (and, with ``qemu=True``, QEMU's own TLS directory for migration data streams).

Only files that differ are written, atomically and with their final mode from the start. A file that
exists, differs, and was not written by ``virt.keys`` (its checksum is not in the manifest
``libvirt/private/.salt-virt-keys.json``) is never overwritten: the state fails and names it, unless
``replace_foreign=True``, which keeps it as ``<file>.salt-virt-orig``.

The CRL goes to ``CA/cacrl.pem`` (libvirtd's default ``crl_file``) and ``qemu/ca-crl.pem``. QEMU's
directory gets its own key pair (``qemu_*`` in the pillar, CN "<id> qemu migration ..."): a QEMU
process that is taken over holds a certificate libvirtd does not accept as a client.

libvirtd.conf is left alone unless the caller names it (``libvirtd_conf``): a formula may own that file
(saltstack-formulas/libvirt-formula templates it from the pillar ``libvirt:libvirtd``, where the
``libvirt`` ext_pillar puts ``crl_file`` and ``tls_allowed_dn_list``), and two writers of one file never
converge. Named, ``crl_file`` and ``tls_allowed_dn_list`` (hypervisor client certificates only) are set
in it (:func:`conf_plan`).
"""

import grp
import json
import os
import re
from typing import Any

from saltvirt.base import fsutil
from saltvirt.base.fsutil import atomic_write
from saltvirt.base.salttypes import Data

# pillar key -> (path below basepath, mode)
LIBVIRT_FILES = {
    "cacert": ("CA/cacert.pem", 0o644),
    "crl": ("CA/cacrl.pem", 0o644),
    "servercert": ("libvirt/servercert.pem", 0o644),
    "serverkey": ("libvirt/private/serverkey.pem", 0o600),
    "clientcert": ("libvirt/clientcert.pem", 0o644),
    "clientkey": ("libvirt/private/clientkey.pem", 0o600),
}
# QEMU-native TLS (qemu.conf default_tls_x509_cert_dir / migrate_tls_x509_cert_dir): QEMU runs as an
# unprivileged user and reads these itself, so keys there are 0640 root:<qemu group>.
QEMU_FILES = {
    "cacert": ("qemu/ca-cert.pem", 0o644),
    "crl": ("qemu/ca-crl.pem", 0o644),
    "qemu_servercert": ("qemu/server-cert.pem", 0o644),
    "qemu_serverkey": ("qemu/server-key.pem", 0o640),
    "qemu_clientcert": ("qemu/client-cert.pem", 0o644),
    "qemu_clientkey": ("qemu/client-key.pem", 0o640),
}
SECRET = ("serverkey", "clientkey", "qemu_serverkey", "qemu_clientkey")
# directory -> mode for a new directory; ``enforce``: an existing one is tightened to it too
DIRS = {"CA": (0o755, False), "libvirt": (0o755, False), "libvirt/private": (0o700, True), "qemu": (0o750, True)}
QEMU_GROUPS = ("libvirt-qemu", "qemu")  # Debian/Ubuntu, Fedora/RHEL
MANIFEST = "libvirt/private/.salt-virt-keys.json"
ORIG_SUFFIX = ".salt-virt-orig"


def qemu_gid(group: str | None = None) -> tuple[int | None, str | None]:
    """(gid, name) of the group QEMU runs as (``group`` or the first of QEMU_GROUPS that exists)."""
    for name in [group] if group else QEMU_GROUPS:
        try:
            return grp.getgrnam(name).gr_gid, name
        except KeyError:
            continue
    return None, group


def _mode_str(mode):
    return oct(mode)[2:].zfill(4)


def _read_manifest(basepath):
    try:
        with open(os.path.join(basepath, MANIFEST), encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _targets(qemu):
    out = [(key, rel, mode) for key, (rel, mode) in LIBVIRT_FILES.items()]
    if qemu:
        out += [(key, rel, mode) for key, (rel, mode) in QEMU_FILES.items()]
    return out


def plan(
    data: Data, basepath: str, qemu: bool = False, qemu_group: str | None = None, replace_foreign: bool = False
) -> Data:
    """What ``virt.keys`` would do: {'files': [...], 'dirs': [...], 'foreign': [paths], 'manifest': {...}}.

    Each file: {path, rel, content, mode, gid, what, foreign}; each dir: {path, mode, gid, what}."""
    manifest = _read_manifest(basepath)
    gid, _name = qemu_gid(qemu_group) if qemu else (None, None)
    files, foreign, wanted = [], [], {}
    for key, rel, wanted_mode in _targets(qemu):
        mode = wanted_mode
        content = data[key]
        wanted[rel] = fsutil.sha256(content)
        path = os.path.join(basepath, rel)
        file_gid = gid if rel.startswith("qemu/") else None
        if file_gid is None and rel.startswith("qemu/") and mode == 0o640:
            mode = 0o600  # no QEMU group here: keep the key private (QEMU cannot read it, see README)
        what, is_foreign = _compare(path, content, mode, file_gid, key in SECRET, manifest.get(rel))
        if is_foreign:
            foreign.append(path)
            if replace_foreign:
                what += (
                    f" (the previous file, not written by virt.keys, is kept as {os.path.basename(path)}{ORIG_SUFFIX})"
                )
        if what:
            files.append(
                {
                    "path": path,
                    "rel": rel,
                    "content": content,
                    "mode": mode,
                    "gid": file_gid,
                    "what": what,
                    "foreign": is_foreign,
                }
            )
    dirs = []
    for rel, (mode, enforce) in DIRS.items():
        if rel == "qemu" and not qemu:
            continue
        path = os.path.join(basepath, rel)
        dir_gid = gid if rel == "qemu" else None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            dirs.append({"path": path, "mode": mode, "gid": dir_gid, "what": None})
            continue
        changes = []
        if enforce and st.st_mode & 0o777 != mode:
            changes.append(f"mode {_mode_str(st.st_mode & 0o777)} -> {_mode_str(mode)}")
        if dir_gid is not None and st.st_gid != dir_gid:
            changes.append(f"group {st.st_gid} -> {dir_gid}")
        if changes:
            dirs.append({"path": path, "mode": mode, "gid": dir_gid, "what": ", ".join(changes)})
    # the records of files this call does not manage stay: another virt.keys on the same directory (libvirt-
    # formula's, without qemu) must not make salt-virt's own QEMU files look foreign at their next renewal
    kept = {rel: sha for rel, sha in manifest.items() if rel not in wanted}
    return {"files": files, "dirs": dirs, "foreign": foreign, "manifest": {**kept, **wanted}, "old_manifest": manifest}


def _compare(path, content, mode, gid, secret, written_sha):
    """(what changes, foreign?) for one file; ('', False) when it is already right."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("key written" if secret else "created"), False
    with open(path, "rb") as fh:
        current = fh.read()
    if current != content.encode():
        foreign = fsutil.sha256(current) != written_sha
        return ("key replaced" if secret else "updated"), foreign
    changes = []
    if st.st_mode & 0o777 != mode:
        changes.append(f"mode {_mode_str(st.st_mode & 0o777)} -> {_mode_str(mode)}")
    if gid is not None and st.st_gid != gid:
        changes.append(f"group {st.st_gid} -> {gid}")
    return ", ".join(changes), False


def _ensure_dir(d):
    os.makedirs(d["path"], mode=d["mode"], exist_ok=True)
    if d["what"] is None or "mode" in d["what"]:
        os.chmod(d["path"], d["mode"])
    if d["gid"] is not None:
        os.chown(d["path"], -1, d["gid"])


def _keep_original(path):
    target = path + ORIG_SUFFIX
    n = 1
    while os.path.lexists(target):
        target = f"{path}{ORIG_SUFFIX}.{n}"
        n += 1
    os.rename(path, target)
    return target


def apply(todo: Data) -> None:
    """Carry out a :func:`plan`: directories first, then files, then the manifest."""
    for d in todo["dirs"]:
        _ensure_dir(d)
    for f in todo["files"]:
        os.makedirs(os.path.dirname(f["path"]), exist_ok=True)
        if f["foreign"]:
            _keep_original(f["path"])
        current = None
        try:
            with open(f["path"], "rb") as fh:
                current = fh.read()
        except FileNotFoundError:
            pass
        if current == f["content"].encode():  # only mode/group differ
            os.chmod(f["path"], f["mode"])
            if f["gid"] is not None:
                os.chown(f["path"], -1, f["gid"])
        else:
            atomic_write(f["path"], f["content"].encode(), f["mode"], f["gid"])
    if todo["manifest"] != todo["old_manifest"]:
        atomic_write(
            os.path.join(todo["base"], MANIFEST), json.dumps(todo["manifest"], indent=1, sort_keys=True).encode(), 0o600
        )


def libvirtd_settings(basepath: str, dns: list[str]) -> dict[str, Any]:
    """The libvirtd.conf settings salt-virt's TLS needs, as values: the CRL ``virt.keys`` writes below
    ``basepath`` and the client DN allow list. What the ``libvirt`` ext_pillar publishes as
    ``libvirt:libvirtd`` (libvirt-formula's pillar for libvirtd.conf) and ``virt.keys`` writes into a
    libvirtd.conf it is given."""
    return {"crl_file": os.path.join(basepath, LIBVIRT_FILES["crl"][0]), "tls_allowed_dn_list": [str(d) for d in dns]}


def conf_settings(basepath: str, data: Data) -> dict[str, str]:
    """:func:`libvirtd_settings` as libvirtd.conf writes them (JSON strings and lists, as libvirt-formula does)."""
    settings = libvirtd_settings(basepath, data.get("tls_allowed_dn_list") or [])
    return {key: json.dumps(value) for key, value in settings.items()}


def conf_plan(path: str, wanted: dict[str, str]) -> tuple[str | None, Data]:
    """(new text or None when unchanged, {key: change}) for setting ``wanted`` keys in libvirtd.conf:
    an existing (or commented-out) ``key = ...`` line is replaced, a missing key appended."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    changes, done = {}, set()
    for i, line in enumerate(lines):
        match = re.match(r"^\s*(#\s*)?([a-z_]+)\s*=\s*(.*)$", line)
        if not match or match.group(2) not in wanted or match.group(2) in done:
            continue
        key = match.group(2)
        value = wanted[key]
        if match.group(1) and any(re.match(rf"^\s*{key}\s*=", other) for other in lines):
            continue  # commented example while a live setting exists further on
        done.add(key)
        if match.group(1) or match.group(3).strip() != value:
            changes[key] = f"{path}: {key} = {value}"
            lines[i] = f"{key} = {value}"
    for key, value in wanted.items():
        if key not in done:
            changes[key] = f"{path}: {key} = {value} (added)"
            lines.append(f"{key} = {value}")
    return ("\n".join(lines) + "\n") if changes else None, changes


def _libvirtd_conf(libvirtd_conf):
    """The libvirtd.conf to edit: only one the caller named (None and False: leave every file alone)."""
    return str(libvirtd_conf) if libvirtd_conf else None


def keys_state(
    name: str,
    data: Data,
    basepath: str,
    qemu: bool = False,
    test: bool = False,
    qemu_group: str | None = None,
    replace_foreign: bool = False,
    libvirtd_conf: str | None = None,
) -> Data:
    """The whole ``virt.keys`` state as plain Python (the state module only passes pillar and opts)."""
    ret: Data = {"name": name, "result": True, "changes": {}, "comment": ""}
    if not data:
        ret["result"] = False
        ret["comment"] = (
            "no 'libvirt' pillar for this minion: is its minion id in virt:hypervisors in the master config "
            "and is the libvirt ext_pillar configured there? After changing either, run saltutil.refresh_pillar"
        )
        return ret
    if data.get("error"):
        ret["result"] = False
        ret["comment"] = str(data["error"])
        return ret
    missing = [k for k in list(LIBVIRT_FILES) + (list(QEMU_FILES) if qemu else []) if not data.get(k)]
    if missing:
        ret["result"] = False
        ret["comment"] = (
            f"the libvirt pillar lacks {', '.join(missing)}: check the master's log for libvirt ext_pillar errors"
        )
        return ret
    if not os.path.isabs(basepath):
        ret["result"] = False
        ret["comment"] = f"basepath must be an absolute path, got {basepath!r}"
        return ret
    todo = plan(data, basepath, qemu, qemu_group, replace_foreign)
    todo["base"] = basepath
    notes = []
    if qemu and qemu_gid(qemu_group)[0] is None:
        notes.append(
            f"no group {qemu_group or ' or '.join(QEMU_GROUPS)}: the keys in {basepath}/qemu are 0600 root and "
            "QEMU cannot read them (set qemu_group)"
        )
    if todo["foreign"] and not replace_foreign:
        ret["result"] = False
        ret["comment"] = (
            f"not written: {', '.join(todo['foreign'])} exist(s) with other content and were not written by virt.keys. "
            f"Move them away, or set replace_foreign: True (keeps them as *{ORIG_SUFFIX})"
        )
        return ret
    conf = _libvirtd_conf(libvirtd_conf)
    conf_text = None
    if conf:
        try:
            conf_text, conf_changes = conf_plan(conf, conf_settings(basepath, data))
        except OSError as exc:
            ret["result"] = False
            ret["comment"] = f"cannot read libvirtd config {conf}: {exc.strerror} (set libvirtd_conf, or False)"
            return ret
    ret["changes"] = {d["path"]: d["what"] for d in todo["dirs"] if d["what"]}
    ret["changes"].update({f["path"]: f["what"] for f in todo["files"]})
    if conf_text is not None:
        ret["changes"][conf] = "; ".join(conf_changes.values())
    if not ret["changes"]:
        if not test and todo["manifest"] != todo["old_manifest"]:
            apply(todo)  # records files that already had the right content as ours; nothing else changes
        ret["comment"] = f"libvirt TLS files in {basepath} are up to date"
    elif test:
        ret["result"] = None
        ret["comment"] = f"{len(ret['changes'])} change(s) would be made in {basepath}"
    else:
        apply(todo)
        if conf_text is not None:
            atomic_write(conf, conf_text.encode(), os.stat(conf).st_mode & 0o777)
        ret["comment"] = (
            f"{len(ret['changes'])} change(s) made in {basepath}; restart libvirtd (watch this state) to use them"
        )
    if notes:
        ret["comment"] += "; " + "; ".join(notes)
    return ret
