"""What the ``virt.keys`` state writes: the ``libvirt`` pillar's CA, certs and keys, at the paths
libvirtd reads (and, optionally, QEMU's own TLS directory for migration data streams)."""
import grp
import os
import tempfile

# pillar key -> path below basepath, mode
LIBVIRT_FILES = {
    "cacert": ("CA/cacert.pem", 0o644),
    "servercert": ("libvirt/servercert.pem", 0o644),
    "serverkey": ("libvirt/private/serverkey.pem", 0o600),
    "clientcert": ("libvirt/clientcert.pem", 0o644),
    "clientkey": ("libvirt/private/clientkey.pem", 0o600),
}
# QEMU-native TLS (qemu.conf default_tls_x509_cert_dir): qemu runs as libvirt-qemu and reads these
# itself, so keys there are 0640 root:libvirt-qemu.
QEMU_FILES = {
    "cacert": ("qemu/ca-cert.pem", 0o644),
    "servercert": ("qemu/server-cert.pem", 0o644),
    "serverkey": ("qemu/server-key.pem", 0o640),
    "clientcert": ("qemu/client-cert.pem", 0o644),
    "clientkey": ("qemu/client-key.pem", 0o640),
}
DIR_MODES = {"CA": 0o755, "libvirt": 0o755, "libvirt/private": 0o700, "qemu": 0o750}
SECRET = ("serverkey", "clientkey")


def _group(name):
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def plan(data, basepath, qemu=False):
    """[(path, content, mode, gid, what)] for every file that differs from the pillar."""
    files = dict((k, [v]) for k, v in LIBVIRT_FILES.items())
    if qemu:
        for key, value in QEMU_FILES.items():
            files[key].append(value)
    qemu_gid = _group("libvirt-qemu") if qemu else None
    todo = []
    for key, targets in files.items():
        content = data.get(key)
        if not content:
            continue
        for rel, mode in targets:
            path = os.path.join(basepath, rel)
            gid = qemu_gid if rel.startswith("qemu/") else None
            what = _compare(path, content, mode, key in SECRET)
            if what:
                todo.append((path, content, mode, gid, what))
    return todo


def _compare(path, content, mode, secret):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "key written" if secret else "created"
    with open(path, encoding="utf-8", errors="replace") as fh:
        same = fh.read() == content
    if not same:
        return "key replaced" if secret else "updated"
    if st.st_mode & 0o777 != mode:
        return f"mode {oct(st.st_mode & 0o777)[2:].zfill(4)} -> {oct(mode)[2:].zfill(4)}"
    return None


def apply(todo, basepath):
    for sub, mode in DIR_MODES.items():
        path = os.path.join(basepath, sub)
        if any(p.startswith(path + os.sep) for p, *_ in todo):
            os.makedirs(path, mode=mode, exist_ok=True)
            os.chmod(path, mode)
            if sub == "qemu" and _group("libvirt-qemu") is not None:
                os.chown(path, 0, _group("libvirt-qemu"))
    for path, content, mode, gid, _what in todo:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            os.fchmod(fd, mode)
            if gid is not None:
                os.fchown(fd, 0, gid)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def keys_state(name, data, basepath, qemu=False, test=False):
    """The whole ``virt.keys`` state as plain Python (the state module only passes pillar and opts)."""
    ret = {"name": name, "result": True, "changes": {}, "comment": ""}
    if not data:
        ret["result"] = False
        ret["comment"] = (
            "no 'libvirt' pillar for this minion: is it matched by the libvirt ext_pillar's target "
            "(default G@virt_hypervisor:True)? After changing grains run saltutil.refresh_pillar"
        )
        return ret
    missing = [k for k in LIBVIRT_FILES if not data.get(k)]
    if missing:
        ret["result"] = False
        ret["comment"] = f"the libvirt pillar lacks {', '.join(missing)}"
        return ret
    todo = plan(data, basepath, qemu)
    ret["changes"] = {path: what for path, _c, _m, _g, what in todo}
    if not todo:
        ret["comment"] = f"libvirt TLS files in {basepath} are up to date"
    elif test:
        ret["result"] = None
        ret["comment"] = f"{len(todo)} libvirt TLS file(s) would be written in {basepath}"
    else:
        apply(todo, basepath)
        ret["comment"] = f"{len(todo)} libvirt TLS file(s) written in {basepath}; restart libvirtd to use them"
    return ret
