"""What a new VM does on its first boot besides reading its seeded files: is there a Salt minion in the
image, and if not, install one; and when no seeding backend can mount the image, hand the minion's
files to cloud-init instead.

A :class:`Plan` is made per ``virt.init``. While the seeding backend has the guest's root filesystem
mounted (:func:`saltvirt.guest.seed.seed`'s ``inspect``), :meth:`Plan.inspect` looks for salt-minion and
cloud-init *as files* (:data:`MINION_PATHS`, :data:`CLOUD_INIT_PATHS`, symlinks resolved inside the
guest): nothing of the guest is ever executed on the hypervisor. With no minion and
``virt:minion_install`` configured (minion config only)::

    virt:
      minion_install:
        url: https://repo.example.net/bootstrap-salt.sh   # or http:// (the checksum is what is trusted),
                                                          # or salt://... (the master's file server)
        checksum: sha256:<hex>                            # required: verified in the guest before it runs
        args: [-X, stable, 3008.5]                        # optional: arguments of the script

the installer (:data:`SCRIPT`: fetch with curl or wget, verify the checksum, ``sh`` it with ``args``,
once) runs at first boot (a ``salt://`` installer is fetched by the hypervisor, checked there and in
the guest, and written into the guest with the script: the guest needs no route to the master):
through cloud-init's ``runcmd`` when the VM gets a cidata volume and the image
has cloud-init (or could not be inspected), otherwise through a seeded systemd one-shot unit
(:data:`UNIT`, enabled by its ``multi-user.target.wants`` link; it disables itself once it succeeded).
The script does nothing if a minion is there by then. What was found and done is reported as
``minion: {found, path, cloud_init_in_image, install}`` (the URL without credentials).
"""

import os
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil
from saltvirt.base.salttypes import Data
from saltvirt.guest import cloudinit
from saltvirt.model import checks
from saltvirt.storage import intake

MINION_PATHS = (
    "/usr/bin/salt-minion",
    "/usr/local/bin/salt-minion",
    "/opt/saltstack/salt/salt-minion",
    "/opt/saltstack/salt/bin/salt-minion",
)
CLOUD_INIT_PATHS = ("/usr/bin/cloud-init", "/usr/local/bin/cloud-init")
SCRIPT = "/usr/local/sbin/salt-virt-install-minion"
EMBEDDED = "/usr/local/sbin/salt-virt-minion-installer"  # a salt:// installer, written with the script
MAX_EMBEDDED = 4 << 20
UNIT_NAME = "salt-virt-install-minion.service"
UNIT = f"/etc/systemd/system/{UNIT_NAME}"
UNIT_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
DONE_MARK = "/var/lib/salt-virt/minion-installed"
INSTALL_KEYS = ("url", "checksum", "args")
_URL_RE = re.compile(r"^https?://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+$")
_SALT_RE = re.compile(r"^salt://[A-Za-z0-9._/-]+$")
_SUMS = {"sha256": 64, "sha512": 128}
RESTART_MINION = "if command -v systemctl >/dev/null 2>&1; then systemctl restart salt-minion || true; fi"


def install_source(conf: Any, cache_file: Callable[[str], Any] | None = None) -> Data | None:
    """``virt:minion_install`` checked: ``{url, algo, hex, args, content}`` or None when not configured.
    ``content``: a ``salt://`` installer fetched with ``cache_file`` (the master's file server) and
    checked here; None for http(s), which the guest fetches."""
    if not conf:
        return None
    checks.check_keys(conf, "virt:minion_install", INSTALL_KEYS)
    url = conf.get("url")
    salt_url = isinstance(url, str) and bool(_SALT_RE.fullmatch(url)) and ".." not in url.split("/")
    if not salt_url and (not isinstance(url, str) or not _URL_RE.fullmatch(url) or "'" in url):
        raise SaltInvocationError(
            "virt:minion_install:url must be an http(s) or salt:// URL of an installer script, "
            f"got {intake.redact(url)!r}"
        )
    checksum = conf.get("checksum")
    algo, _, digest = str(checksum or "").partition(":")
    if algo not in _SUMS or not re.fullmatch(f"[0-9a-fA-F]{{{_SUMS[algo]}}}", digest):
        raise SaltInvocationError(
            "virt:minion_install:checksum is required (sha256:<hex> or sha512:<hex>): the guest runs the "
            "installer only when its checksum matches"
        )
    args = conf.get("args") or []
    if isinstance(args, str):
        args = shlex.split(args)
    if not isinstance(args, list) or not all(isinstance(a, str) and "\n" not in a for a in args):
        raise SaltInvocationError(f"virt:minion_install:args must be a list of strings, got {args!r}")
    source = {"url": url, "algo": algo, "hex": digest.lower(), "args": args, "content": None}
    if salt_url:
        source["content"] = _from_master(url, algo, source["hex"], cache_file)
    return source


def _from_master(url, algo, digest, cache_file):
    """The installer from the master's file server, checked against its checksum here already."""
    local = cache_file(url) if cache_file else None
    if not local or not os.path.isfile(local):
        raise CommandExecutionError(f"virt:minion_install: {url} is not on the master's file server")
    if os.path.getsize(local) > MAX_EMBEDDED:
        raise CommandExecutionError(f"virt:minion_install: {url} is larger than {MAX_EMBEDDED >> 20} MiB")
    if fsutil.file_digest(local, algo) != digest:
        raise CommandExecutionError(f"virt:minion_install: {url} does not match its checksum: not using it")
    with open(local, "rb") as fh:
        return fh.read()


def script(source: Data) -> str:
    """The first-boot installer (POSIX sh): fetch, verify, run once."""
    q = shlex.quote
    shown = intake.redact(source["url"])
    return f"""#!/bin/sh
# salt-virt: install a Salt minion on first boot (the image had none). Runs once.
say() {{ echo "salt-virt-install-minion: $*"; }}
src={q(shown)}
if command -v salt-minion >/dev/null 2>&1 || [ -x /opt/saltstack/salt/salt-minion ]; then
  say "a salt-minion is installed already"; exit 0
fi
tmp=$(mktemp -d) || exit 1
{_fetch(source)}
n=0
until fetch; do n=$((n+1)); [ $n -ge 30 ] && {{ say "could not fetch $src"; exit 1; }}; sleep 2; done
echo {q(source["hex"] + "  ")}"$tmp/installer" | {source["algo"]}sum -c - >/dev/null 2>&1 || {{
  say "checksum mismatch for $src: not running it"; exit 1; }}
say "fetched $src ({source["algo"]} ok), running it"
sh "$tmp/installer" {" ".join(q(a) for a in source["args"])}
rc=$?
rm -rf "$tmp"
if [ $rc -eq 0 ]; then
  mkdir -p {posixpath.dirname(DONE_MARK)} && touch {DONE_MARK}
  rm -f {UNIT_LINK}
fi
say "installer exited with $rc"
exit $rc
"""


def _fetch(source):
    q = shlex.quote
    if source.get("content") is not None:
        return f'fetch() {{ cp {EMBEDDED} "$tmp/installer"; }}'
    return f"""fetch() {{
  if command -v curl >/dev/null 2>&1; then curl -fsSL -o "$tmp/installer" {q(source["url"])}
  elif command -v wget >/dev/null 2>&1; then wget -q -O "$tmp/installer" {q(source["url"])}
  else say "neither curl nor wget: cannot fetch the installer"; return 2; fi
}}"""


def _installer_files(source):
    """The script, and a salt:// installer embedded next to it."""
    files = {SCRIPT: {"content": script(source), "mode": 0o755}}
    if source.get("content") is not None:
        files[EMBEDDED] = {"content": source["content"], "mode": 0o644}
    return files


def unit() -> str:
    return f"""[Unit]
Description=salt-virt: install a Salt minion (first boot)
Wants=network-online.target
After=network-online.target
ConditionPathExists=!{DONE_MARK}

[Service]
Type=oneshot
ExecStart=/bin/sh {SCRIPT}
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""


class Plan:
    """One VM's first boot: what was found in the image, how its minion files and installer get there."""

    def __init__(self, cloud_init, install_conf, cache_file=None):
        self.cloud = cloud_init  # the checked cloud_init= ({} for True) or None
        self.source = install_source(install_conf, cache_file)
        self.inspected = False
        self.found = self.path = self.image_cloud_init = None
        self.how = None  # "runcmd" | "boot hook" | None
        self.minion_files = {}  # the minion's files, when they go through cloud-init

    def inspect(self, exists: Callable[[str], bool]) -> dict[str, Data]:
        """Called by the seeding backend with the guest's root mounted; ``exists(path)`` looks inside the
        guest. Returns the extra files to seed (the boot hook), possibly {}."""
        self.inspected = True
        self.path = next((p for p in MINION_PATHS if exists(p)), None)
        self.found = self.path is not None
        self.image_cloud_init = any(exists(p) for p in CLOUD_INIT_PATHS)
        if self.found or not self.source:
            return {}
        if self.cloud is not None and self.image_cloud_init:
            self.how = "runcmd"
            return {}
        self.how = "boot hook"
        hook = {UNIT: {"content": unit(), "mode": 0o644}, UNIT_LINK: {"symlink": UNIT}}
        return {**_installer_files(self.source), **hook}

    def via_cloud_init(self, files: Mapping[str, Data]) -> None:
        """No seeding backend could write the image: the minion's ``files`` go through cloud-init."""
        self.minion_files = dict(files)
        if self.source:
            self.how = "runcmd"  # the image was not inspected: the script itself checks for a minion

    def additions(self) -> Data:
        """salt-virt's cloud-config for the cidata volume ({} when it has nothing to add)."""
        out, runcmd = {}, []  # type: dict[str, Any], list[Any]
        files = dict(self.minion_files)
        if self.how == "runcmd":
            files.update(_installer_files(self.source))
            runcmd.append(["sh", SCRIPT])
        if self.minion_files:
            runcmd.append(["sh", "-c", RESTART_MINION])  # a minion that started before write_files ran
        if files:
            out["write_files"] = cloudinit.write_files(files)
        if runcmd:
            out["runcmd"] = runcmd
        return out

    def report(self) -> Data:
        out = {"found": self.found, "path": self.path, "cloud_init_in_image": self.image_cloud_init}
        url: Any = intake.redact(self.source["url"]) if self.source else None
        if self.source and self.source["content"] is not None:
            url += " (fetched by the hypervisor, written into the guest)"
        if self.how == "runcmd":
            out["install"] = f"cloud-init runcmd from {url}"
        elif self.how == "boot hook":
            out["install"] = f"seeded boot hook ({UNIT_NAME}) from {url}"
        else:
            out["install"] = None
        if not self.inspected:
            out["note"] = "the image was not inspected (not seeded through a mounted filesystem)"
        elif self.found:
            out["note"] = "left alone: the image has a Salt minion"
        elif not self.source:
            out["note"] = "no Salt minion in the image and virt:minion_install is not configured: it gets none"
        return out


CLOUD_INIT_BACKEND = "cloud-init"  # seed_backend=cloud-init: the minion's files go on the cidata volume


def seeded_by_cloud_init(files: Mapping[str, Data], attempts: Sequence[Data]) -> Data:
    """The ``seed`` report when the minion's files ride on the cidata volume."""
    why = "no backend could mount the image: " if attempts else "asked for: "
    attempt = {"backend": CLOUD_INIT_BACKEND, "ok": True, "reason": why + "written as cloud-init write_files",
               "seconds": 0}  # fmt: skip
    return {"backend": CLOUD_INIT_BACKEND, "attempts": [*attempts, attempt], "files": sorted(files)}
