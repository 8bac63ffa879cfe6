"""The libguestfs backend of :mod:`saltvirt.seed`: ``guestfish --rw -i`` inspects the image (LVM,
unusual partition layouts), then uploads the files. Tried first when libguestfs is installed
(``apt-get install libguestfs-tools``); it boots a small appliance VM, under TCG where KVM is not
usable (``LIBGUESTFS_BACKEND_SETTINGS=force_tcg``)."""

import os
import shutil
import subprocess

from salt.exceptions import CommandExecutionError

from saltvirt import hosttype
from saltvirt.seed import _Skip


def _quote(path):
    if '"' in path or "\\" in path or "\n" in path:
        raise CommandExecutionError(f"cannot pass {path!r} to guestfish")
    return f'"{path}"'


def run(image, fmt, files, tmp, undo):  # pylint: disable=unused-argument
    guestfish = shutil.which("guestfish")
    if not guestfish:
        raise _Skip("libguestfs is not installed (apt-get install libguestfs-tools)")
    script = []
    for i, (path, (content, mode)) in enumerate(sorted(files.items())):
        local = os.path.join(tmp, f"upload-{i}")
        fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
        script += [
            f"mkdir-p {_quote(os.path.dirname(path))}",
            f"upload {_quote(local)} {_quote(path)}",
            f"chmod 0{mode:o} {_quote(path)}",
        ]
    script.append("sync")
    env = dict(os.environ, LIBGUESTFS_BACKEND="direct")
    if not hosttype.probe_kvm()[0]:
        env["LIBGUESTFS_BACKEND_SETTINGS"] = "force_tcg"
    try:
        proc = subprocess.run(
            [guestfish, "--rw", "-a", image, f"--format={fmt}", "-i"],
            input="\n".join(script) + "\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CommandExecutionError("guestfish did not finish within 600s") from None
    if proc.returncode != 0:
        raise CommandExecutionError(f"guestfish: {proc.stderr.strip()[-400:] or 'failed'}")
    return {"root": "found by libguestfs inspection", "fstype": None}
