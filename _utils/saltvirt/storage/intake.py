"""Image intake: the one door every image source (absolute path, ``salt://``, ``http(s)://``) goes
through before ``virt.init`` clones it. Images are untrusted input.

* the format is decided here from the file's header, then confirmed with
  ``qemu-img info -f <format>``: qemu never guesses a format;
* only raw and qcow2 are accepted; a qcow2 with a backing file, an external data file or encryption
  is refused, and so is anything that looks like another format (a vmdk descriptor saved as
  ``image.img`` would make qemu read the host file its extent names);
* ``checksum='sha256:<hex>'`` / ``'sha512:<hex>'`` is verified before the image is used, for every
  source;
* downloads: https only unless ``allow_http=True`` (the minion config's ``virt:insecure_http_images``);
  only from the operator's ``virt:image_sources`` when a list is given (:func:`check_source`: the URL and
  every redirect; the runner checks its callers' URLs against the master's list, the hypervisor against its
  own when set); never an https -> http redirect; credentials in
  the URL go into an Authorization header (never to a redirect target) and are stripped from every
  message, event, log line and return (:func:`saltvirt.base.validate.shown_url`, which drops the query
  too); at most ``virt:max_image_mib`` MiB,
  enforced while downloading;
* ``trusted=True`` (``virt.init ... trusted_image=True``) is the documented opt-in for a *local
  absolute path* the operator built: backing files, data files and other formats are then accepted
  as they are (never for ``salt://`` or URLs);
* :func:`existing_disk`: the same checks for a disk that already exists (a file or volume attached to a
  VM by :mod:`saltvirt.storage.attach`), whose declared format must be what is on it: it is never
  assumed to be qcow2;
* :func:`gc_bases` removes cached base images (``<virt:images>/.bases``) no image backs onto any more;
  ``virt.purge`` runs it after removing a VM, ``virt.image_gc`` runs it on demand.
"""

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import struct
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.base import fsutil, tools, validate
from saltvirt.base.salttypes import Conn, Data
from saltvirt.storage import images

log = logging.getLogger(__name__)

ACCEPTED = ("raw", "qcow2")
DEFAULT_MAX_IMAGE_MIB = 65536
DOWNLOAD_TIMEOUT = 60
BASES_DIR = ".bases"  # <images>/.bases: immutable copies of fetched images that overlays back onto
CACHE_DIR = ".cache"  # <images>/.cache: http(s) downloads
_CHUNK = 1 << 20
_HASHES = {"sha256": 64, "sha512": 128}
# header signatures of formats qemu would otherwise recognise (qemu's own probes, block/*.c)
_MAGIC = (
    (b"KDMV", "vmdk"),
    (b"COWD", "vmdk"),
    (b"conectix", "vpc"),
    (b"vhdxfile", "vhdx"),
    (b"QED\x00", "qed"),
    (b"LUKS\xba\xbe", "luks"),
    (b"WithoutFreeSpace", "parallels"),
    (b"WithouFreSpacExt", "parallels"),
    (b"Bochs Virtual HD Image", "bochs"),
    (b"#!/bin/sh\n#V2.0 Format\n", "cloop"),
    (b"<<< ", "vdi"),
)
_VMDK_TEXT = re.compile(rb"(?im)^\s*(createType\s*=|version\s*=\s*[123]\b|(RW|RDONLY|NOACCESS)\s+\d+\s+\w+)")
_QCOW2_EXTERNAL_DATA = 1 << 2
HV_CONFIG = "hypervisor's minion config"  # where the list fetch() is given comes from


# URLs --------------------------------------------------------------------------------------------
def redact(url: str) -> str:
    """``url`` without user:password: what is requested (the credentials go in a header) and what a guest is
    told to fetch. Messages, events, logs and returns show :func:`saltvirt.base.validate.shown_url` (no
    query either: a presigned URL's token is there)."""
    if not isinstance(url, str) or "://" not in url or "@" not in url.split("://", 1)[1].split("/", 1)[0]:
        return url
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def parse_checksum(checksum: Any) -> tuple[str, str] | None:
    """``'sha256:<hex>'`` / ``'sha512:<hex>'`` -> ``(algorithm, hex)``; None -> None."""
    if checksum in (None, ""):
        return None
    algo, _, digest = str(checksum).strip().partition(":")
    algo, digest = algo.lower(), digest.strip().lower()
    if algo not in _HASHES or not re.fullmatch(f"[0-9a-f]{{{_HASHES[algo]}}}", digest):
        raise SaltInvocationError(
            f"checksum must be 'sha256:<64 hex digits>' or 'sha512:<128 hex digits>', got {checksum!r}"
        )
    return algo, digest


def _origin(parts):
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def image_sources(value: Any, where: str) -> tuple[str, ...] | None:
    """``virt:image_sources`` of the ``where`` config checked: host names (``images.example.com``: any port
    and path) and URL prefixes (``https://images.example.com:8443/cloud/``; no credentials, query or
    fragment). None when the config has none (``[]`` is a list that allows no http(s) source)."""
    if value is None:
        return None
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) and e.strip() for e in entries):
        raise SaltInvocationError(f"virt:image_sources in the {where} must be a list of hosts and URL prefixes")
    for entry in entries:
        parts = urllib.parse.urlsplit(entry if "://" in entry else f"https://{entry}")
        ok = parts.scheme.lower() in ("http", "https") and parts.hostname and not parts.username
        ok = ok and not parts.query and not parts.fragment and ("://" in entry or not parts.path)
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            ok = False
        if not ok:
            raise SaltInvocationError(
                f"virt:image_sources in the {where}: {entry!r} is neither a host name nor an http(s):// URL prefix "
                "(https://host[:port][/path], without credentials, query or fragment)"
            )
    return tuple(e.strip() for e in entries)


def source_allowed(url: str, sources: Sequence[str]) -> bool:
    """Whether http(s) ``url`` is within ``sources`` (:func:`image_sources`): the same host (any port and
    scheme for a host entry), or the same scheme, host and port and a path under the prefix's (whole
    path segments: ``/cloud`` covers ``/cloud/x``, not ``/cloudy``)."""
    parts = urllib.parse.urlsplit(url)
    for entry in sources:
        if "://" not in entry:
            if (parts.hostname or "").lower() == entry.strip().lower():
                return True
            continue
        allowed = urllib.parse.urlsplit(entry)
        if _origin(parts) != _origin(allowed):
            continue
        prefix = allowed.path or "/"
        if parts.path == prefix or parts.path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
            return True
    return False


def check_source(image: Any, sources: Sequence[str] | None, where: str, instead: str = "") -> None:
    """Refuse an ``http(s)://`` image URL outside ``sources`` (:func:`image_sources` of the ``where`` config;
    None: no list, nothing refused): the fetch would reach whatever host it names, internal ones too.
    ``instead``: what else the caller may use (``salt://`` images, the catalog)."""
    if sources is None or not isinstance(image, str) or "://" not in image:
        return
    parts = urllib.parse.urlsplit(image.strip())
    if parts.scheme.lower() not in ("http", "https") or source_allowed(image.strip(), sources):
        return
    port = f":{parts.port}" if parts.port else ""
    raise SaltInvocationError(
        f"image {validate.shown_url(image)} is not from a source the operator allows "
        f"(virt:image_sources in the {where}: "
        f"{', '.join(sources) or 'none'}): the operator adds {parts.hostname} (or "
        f"{parts.scheme.lower()}://{parts.hostname}{port}/<path>/) to virt:image_sources{instead}"
    )


def _max_bytes(max_mib):
    if max_mib in (None, ""):
        max_mib = DEFAULT_MAX_IMAGE_MIB
    return validate.positive_int(max_mib, "virt:max_image_mib (MiB)") * images.MIB


# fetch -------------------------------------------------------------------------------------------
def fetch(
    image: str,
    cache_dir: str,
    cache_file: Callable[[str], Any] | None = None,
    *,
    allow_http: bool = False,
    max_image_mib: Any = None,
    sources: Sequence[str] | None = None,
) -> str:
    """A local path for ``image``: an absolute path, ``salt://...`` or ``http(s)://...``.

    ``cache_file`` fetches a salt:// URL as Salt's ``cp.cache_file`` does (the loader modules pass
    :class:`saltvirt.storage.saltcache.SaltFiles`). Downloads go to ``cache_dir`` and are
    reused while the server's Content-Length/ETag/Last-Modified stay the same; with ``sources`` (the
    minion config's checked ``virt:image_sources``) only from there, redirects included. Checks nothing
    about the content: :func:`accept` does (checksum, format).
    """
    if not isinstance(image, str) or not image.strip() or "\0" in image:
        raise SaltInvocationError(f"image must be an absolute path or a salt://, https:// URL, got {image!r}")
    image = image.strip()
    limit = _max_bytes(max_image_mib)
    if "://" not in image:
        return images.existing_image(image)
    scheme = image.split("://", 1)[0].lower()
    if scheme == "salt":
        if ".." in image.split("://", 1)[1].split("/"):
            raise SaltInvocationError(f"image URL {image!r} must not contain '..'")
        if cache_file is None:
            raise SaltInvocationError(f"image {image}: salt:// images need Salt's cp.cache_file (use the minion)")
        local = cache_file(image)
        if not local:
            raise SaltInvocationError(
                f"image {image} not found on the master (file_roots of the master's fileserver): "
                "check the path with 'salt-run fileserver.file_list'"
            )
        if not os.path.isfile(local):
            raise CommandExecutionError(f"image {image} was cached as {local!r}, which is not a file")
        if os.path.getsize(local) > limit:
            raise SaltInvocationError(
                f"image {image} is {os.path.getsize(local) // images.MIB} MiB, more than virt:max_image_mib "
                f"({limit // images.MIB} MiB): raise virt:max_image_mib in the minion config if it is expected"
            )
        return local
    if scheme == "https" or (scheme == "http" and allow_http):
        check_source(image, sources, HV_CONFIG)
        return _download(image, images.abs_path(cache_dir, "image cache directory"), limit, sources)
    if scheme == "http":
        raise SaltInvocationError(
            f"image {validate.shown_url(image)}: plain http is refused (anyone on the path can change the image): use "
            "https://, or (the operator, if it must be) set virt:insecure_http_images: True in the minion "
            "config and pass checksum=sha256:..."
        )
    raise SaltInvocationError(
        f"unsupported image source scheme {scheme!r} in {validate.shown_url(image)!r}: use an absolute path, salt:// or https://"
    )


def _cache_name(url):
    base = os.path.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "image"
    return f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{base[:100]}"


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never from https to anything else, only to http(s), and only within
    ``sources`` when the operator gave a list."""

    def __init__(self, allow_http, sources=None):
        self.allow_http, self.sources = allow_http, sources

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old = urllib.parse.urlsplit(req.full_url).scheme.lower()
        new = urllib.parse.urlsplit(urllib.parse.urljoin(req.full_url, newurl)).scheme.lower()
        downgrade = old == "https" and new != "https"
        if new not in ("http", "https") or downgrade or (new == "http" and not self.allow_http):
            raise CommandExecutionError(
                f"downloading image {validate.shown_url(req.full_url)}: the server redirects to "
                f"{validate.shown_url(newurl)}, "
                f"refused ({old} -> {new}: an https image is only ever fetched over https)"
            )
        check_source(urllib.parse.urljoin(req.full_url, newurl), self.sources, HV_CONFIG)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _request(url, headers):
    """A Request without the URL's userinfo; credentials become a Basic header that is never sent on
    to a redirect target (unredirected header)."""
    parts = urllib.parse.urlsplit(url)
    req = urllib.request.Request(redact(url), headers=headers)
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_unredirected_header("Authorization", f"Basic {token}")
    return req


def _download(url, cache_dir, limit, sources=None):
    shown = validate.shown_url(url)
    os.makedirs(cache_dir, mode=0o755, exist_ok=True)
    path = os.path.join(cache_dir, _cache_name(url))
    meta_path = path + ".meta.json"
    meta = images.read_json(meta_path) if os.path.isfile(path) else None
    if meta and meta.get("url_sha256") != hashlib.sha256(url.encode()).hexdigest():
        meta = None
    headers = {"User-Agent": "salt-virt"}
    if meta and meta.get("etag"):
        headers["If-None-Match"] = meta["etag"]
    if meta and meta.get("last_modified"):
        headers["If-Modified-Since"] = meta["last_modified"]
    allow_http = urllib.parse.urlsplit(url).scheme.lower() == "http"
    opener = urllib.request.build_opener(_Redirects(allow_http, sources))
    try:
        resp = opener.open(_request(url, headers), timeout=DOWNLOAD_TIMEOUT)
    except urllib.error.HTTPError as exc:
        if exc.code == 304 and meta:
            log.debug("image %s not modified, using %s", shown, path)
            return path
        raise CommandExecutionError(f"downloading image {shown} failed: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CommandExecutionError(
            f"downloading image {shown} failed: {reason} (is it reachable from here?)"
        ) from None
    with resp:
        length = resp.headers.get("Content-Length")
        length = int(length) if length and length.isdigit() else None
        if length is not None and length > limit:
            raise SaltInvocationError(_too_big(shown, f"announces {length // images.MIB} MiB", limit))
        fresh = {"url": shown, "url_sha256": hashlib.sha256(url.encode()).hexdigest(), "length": length}
        fresh.update(etag=resp.headers.get("ETag"), last_modified=resp.headers.get("Last-Modified"))
        if meta and _same_remote(meta, fresh) and os.path.getsize(path) == length:
            log.debug("image %s unchanged (length/etag/last-modified), using %s", shown, path)
            return path
        got, digests = _save(resp, path, shown, limit, length)
    fresh.update(length=got, fetched=images.timestamp(), **digests)
    images.write_json(meta_path, fresh)
    return path


def _save(resp, path, shown, limit, length):
    """Stream ``resp`` into ``path`` (temp file + rename), at most ``limit`` bytes, hashing as it goes.
    Returns ``(bytes, {algorithm: hex digest})``; on any failure nothing is left."""
    cache_dir = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{os.path.basename(path)}.", suffix=".part")
    digests = {algo: hashlib.new(algo) for algo in _HASHES}
    try:
        got = 0
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                got += len(chunk)
                if got > limit:
                    raise SaltInvocationError(_too_big(shown, f"sent more than {limit // images.MIB} MiB", limit))
                out.write(chunk)
                for h in digests.values():
                    h.update(chunk)
            out.flush()
            os.fsync(out.fileno())
        if length is not None and got != length:
            raise CommandExecutionError(f"downloading image {shown} failed: got {got} of {length} bytes (cut off?)")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CommandExecutionError(f"downloading image {shown} into {cache_dir} failed: {exc}") from None
        raise
    return got, {algo: h.hexdigest() for algo, h in digests.items()}


def _too_big(shown, what, limit):
    return (
        f"downloading image {shown}: the server {what}, more than virt:max_image_mib ({limit // images.MIB} MiB): "
        "nothing kept. Raise virt:max_image_mib in the minion config if the image really is that big"
    )


def _same_remote(meta, fresh):
    if fresh["length"] is None or fresh["length"] != meta.get("length"):
        return False
    if not fresh["etag"] and not fresh["last_modified"]:
        return False  # nothing to compare but the size: download again
    return fresh["etag"] == meta.get("etag") and fresh["last_modified"] == meta.get("last_modified")


# checksum ----------------------------------------------------------------------------------------
def verify_checksum(path: str, checksum: Any, source: str) -> str | None:
    """Raise unless ``path`` has the digest ``checksum`` names (a download's recorded digest is reused)."""
    parsed = parse_checksum(checksum)
    if parsed is None:
        return None
    algo, want = parsed
    meta = images.read_json(path + ".meta.json") if os.path.dirname(path).endswith(CACHE_DIR) else None
    have = (meta or {}).get(algo) if meta and meta.get("length") == os.path.getsize(path) else None
    have = have or fsutil.file_digest(path, algo)
    if not hmac.compare_digest(have, want):
        raise SaltInvocationError(
            f"image {validate.shown_url(source)} does not match checksum {algo}:{want} (it is {algo}:{have}): refused. "
            "Check the checksum you were given, or the image source"
        )
    return f"{algo}:{have}"


# format ------------------------------------------------------------------------------------------
def sniff(path: str) -> str:
    """The format the header of ``path`` claims: 'qcow2', 'raw', or the name of another format
    ('vmdk', 'vmdk descriptor', 'qcow (v1)', ...). Reads the first 64 KiB; runs no tool."""
    with open(path, "rb") as fh:
        head = fh.read(65536)
    if head[:4] == b"QFI\xfb":
        version = struct.unpack(">I", head[4:8])[0] if len(head) >= 8 else 0
        return "qcow2" if version in (2, 3) else f"qcow (v{version})"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            if name == "vdi" and head[64:68] != b"\x7f\x10\xda\xbe":
                continue
            return name
    if _VMDK_TEXT.search(head[:4096]):
        return "vmdk descriptor"
    return "raw"


def _qcow2_header(path):
    """(backing file offset, incompatible feature bits, crypt method) straight from the header."""
    with open(path, "rb") as fh:
        head = fh.read(104)
    if len(head) < 72:
        raise SaltInvocationError(f"image {path}: truncated qcow2 header")
    version, backing_offset = struct.unpack(">IQ", head[4:16])
    crypt = struct.unpack(">I", head[32:36])[0]
    incompatible = struct.unpack(">Q", head[72:80])[0] if version >= 3 and len(head) >= 80 else 0
    return backing_offset, incompatible, crypt


def _qemu_info(path, fmt, chain=False):
    cmd = ["qemu-img", "info", "--output=json", "-U", "-f", fmt] + (["--backing-chain"] if chain else []) + [path]
    proc = images.run_tool(cmd, f"reading image {path} as {fmt}", timeout=120, limits=tools.QEMU_IMG_INFO_LIMITS)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise CommandExecutionError(f"qemu-img info {path} returned unreadable output: {proc.stdout[:200]!r}") from None
    return data[0] if isinstance(data, list) else data


def probe(path: str, source: str | None = None, trusted: bool = False) -> Data:
    """Decide and check the format of the local image ``path``. Returns ``{path, format,
    virtual_size, actual_size}``; raises SaltInvocationError naming what is wrong."""
    path = os.path.abspath(images.existing_image(path, "image"))
    shown = validate.shown_url(source or path)
    fmt = sniff(path)
    hint = "convert it to raw or qcow2 with qemu-img convert first"
    if not trusted:
        if fmt not in ACCEPTED:
            raise SaltInvocationError(
                f"image {shown} is a {fmt} image: only {' and '.join(ACCEPTED)} images are accepted ({hint}; "
                "other formats can name host files as their data)"
            )
        if fmt == "qcow2":
            backing_offset, incompatible, crypt = _qcow2_header(path)
            if backing_offset:
                raise SaltInvocationError(
                    f"image {shown} is a qcow2 with a backing file: refused (it could make the VM read a host "
                    f"file). Flatten it with 'qemu-img convert -O qcow2' first"
                )
            if incompatible & _QCOW2_EXTERNAL_DATA:
                raise SaltInvocationError(
                    f"image {shown} is a qcow2 with an external data file: refused (its data would be a file "
                    f"on this host). Flatten it with 'qemu-img convert -O qcow2' first"
                )
            if crypt:
                raise SaltInvocationError(f"image {shown} is an encrypted qcow2: refused ({hint})")
    qemu_fmt = {"vmdk descriptor": "vmdk", "qcow (v1)": "qcow"}.get(fmt, fmt)
    if trusted and not re.fullmatch(r"[a-z0-9]+", qemu_fmt):
        raise SaltInvocationError(f"image {shown}: unknown format {fmt}")
    if fmt == "raw":
        # raw has no header, no backing and no data file: qemu-img info -f raw could only echo the file's
        # size back (a subprocess per init for nothing)
        st = os.stat(path)
        return {"path": path, "format": "raw", "virtual_size": st.st_size, "actual_size": st.st_blocks * 512}
    info = _qemu_info(path, qemu_fmt)
    if not trusted:
        specific = (info.get("format-specific") or {}).get("data") or {}
        if info.get("backing-filename") or info.get("full-backing-filename") or specific.get("data-file"):
            raise SaltInvocationError(f"image {shown}: qemu-img reports a backing or data file: refused")
        if info.get("format") != fmt:
            raise CommandExecutionError(f"image {shown}: qemu-img reads it as {info.get('format')}, not {fmt}")
    return {
        "path": path,
        "format": qemu_fmt,
        "virtual_size": info.get("virtual-size"),
        "actual_size": info.get("actual-size"),
    }


# existing disks -----------------------------------------------------------------------------------
# one wording per refusal of an existing disk (a file or volume attached to a VM): what to do is in it
DISK_REFUSALS = {
    "chain": (
        "disk {name}: {path} is a qcow2 with {what}: refused (the VM could read a host file through it). "
        "Flatten it with 'qemu-img convert -O qcow2' first, or (an overlay on a base image the operator "
        "built) the operator lists that base in virt:insecure_trusted_images; if it is a raw disk whose "
        "guest wrote this header, attach it with format: raw"
    ),
    "undeclared qcow2": (
        "disk {name}: {path} starts with a qcow2 header and no format is given: salt-virt never assumes "
        "qcow2 for an existing disk. Give format: qcow2 if it is a qcow2 image, or format: raw if it is a "
        "raw disk whose guest wrote that header"
    ),
    "not qcow2": "disk {name}: {path} is raw, not qcow2: attach it with format: raw",
    "foreign": (
        "disk {name}: {path} looks like a {found} image: only raw and qcow2 disks are attached. Convert it "
        "with 'qemu-img convert -O qcow2' first; if it is a raw disk whose guest wrote this header, attach "
        "it with format: raw"
    ),
}


def existing_disk(path: str, declared: str | None, name: str, trusted: Sequence[str] = ()) -> str:
    """The format an existing disk ``path`` (a file or a block device: an attached file or pool volume)
    is attached with, checked against what is on it as an image is: ``raw`` (qemu reads the bytes as
    they are, whatever they look like) or a ``qcow2`` with no backing file, external data file or
    encryption. ``declared``: the format the caller gave (None: as the content says, which must be
    raw: an existing file is never assumed to be qcow2). ``trusted``: the operator's
    ``virt:insecure_trusted_images``: a qcow2 whose backing file is one of them (its format recorded in
    the header) is accepted, an overlay on a base the operator built. Raises SaltInvocationError with one
    of :data:`DISK_REFUSALS`."""
    if declared not in (None, *ACCEPTED):
        raise SaltInvocationError(f"disk {name}: format must be one of {ACCEPTED}, got {declared!r}")
    try:
        found = sniff(path)
    except OSError as exc:
        raise SaltInvocationError(f"disk {name}: cannot read {path}: {exc.strerror}") from None
    if declared == "raw":
        return "raw"
    if found == "raw":
        if declared == "qcow2":
            raise SaltInvocationError(DISK_REFUSALS["not qcow2"].format(name=name, path=path))
        return "raw"
    if found != "qcow2":
        raise SaltInvocationError(DISK_REFUSALS["foreign"].format(name=name, path=path, found=found))
    what = _qcow2_chain(path, {os.path.realpath(t) for t in trusted or () if isinstance(t, str) and os.path.isabs(t)})
    if what:
        raise SaltInvocationError(DISK_REFUSALS["chain"].format(name=name, path=path, what=what))
    if declared is None:
        raise SaltInvocationError(DISK_REFUSALS["undeclared qcow2"].format(name=name, path=path))
    return "qcow2"


def _qcow2_chain(path, trusted):
    """What of a backing file (unless one of ``trusted``, with its format recorded), external data file
    or encryption the qcow2 ``path`` has (its header, then qemu-img's view of it read as qcow2), or None."""
    backing_offset, incompatible, crypt = _qcow2_header(path)
    if incompatible & _QCOW2_EXTERNAL_DATA:
        return "an external data file"
    if crypt:
        return "encryption"
    if backing_offset and not trusted:
        return "a backing file"
    info = _qemu_info(path, "qcow2")
    specific = (info.get("format-specific") or {}).get("data") or {}
    if specific.get("data-file"):
        return "an external data file"
    backing = info.get("full-backing-filename") or info.get("backing-filename")
    if backing_offset or backing:
        backing = backing and os.path.join(os.path.dirname(os.path.abspath(path)), backing)
        if not backing or os.path.realpath(backing) not in trusted:
            return "a backing file"
        if info.get("backing-filename-format") not in ACCEPTED:
            return "a backing file whose format it does not record"
    if info.get("encrypted"):
        return "encryption"
    return None


def accept(
    image: str,
    cache_dir: str,
    cache_file: Callable[[str], Any] | None = None,
    *,
    checksum: Any = None,
    allow_http: bool = False,
    max_image_mib: Any = None,
    trusted: bool = False,
    roots: Any = None,
    sources: Sequence[str] | None = None,
) -> Data:
    """Fetch ``image`` (any source), verify ``checksum`` and check its format: the only way an image
    enters salt-virt. Returns :func:`probe`'s dict plus ``source`` (redacted) and ``checksum``.
    ``sources``: the operator's ``virt:image_sources`` (minion config), checked; None: no list.

    ``roots``: the directories a local path may come from (``virt:images`` + the operator's
    ``virt:allowed_paths``); see :func:`confine_local`. ``trusted`` does not lift it."""
    trusted = bool(trusted)
    if trusted and (not isinstance(image, str) or "://" in image):
        raise SaltInvocationError(
            "trusted_image=True is only for a local absolute path you built yourself, never for salt:// or URLs"
        )
    parse_checksum(checksum)  # bad syntax fails before any download
    confine_local(image, roots)
    local = None
    try:
        local = fetch(image, cache_dir, cache_file, allow_http=allow_http, max_image_mib=max_image_mib, sources=sources)
        verified = verify_checksum(local, checksum, image)
        info = probe(local, image, trusted=trusted)
    except BaseException:
        _forget(local, cache_dir)
        raise
    if trusted:
        log.warning(
            "image %s accepted as trusted (format %s): not checked for backing or data files", local, info["format"]
        )
    return dict(info, source=validate.shown_url(image), checksum=verified, trusted=trusted)


def confine_local(image: str, roots: Sequence[str | None]) -> None:
    """A local image path (no ``scheme://``) must lie inside ``roots`` (``virt:images`` and the
    operator's ``virt:allowed_paths``) after resolving symlinks: otherwise ``image=/etc/shadow`` would
    become a VM's disk. ``roots=None`` (no directories given) refuses every local path."""
    if not isinstance(image, str) or "://" in image or not image.strip():
        return  # URLs and salt:// are fetched into our own cache; bad values fail in fetch
    validate.confined(image.strip(), "image", tuple(roots or ()))


def _forget(local, cache_dir):
    """A refused download is not kept (nor the cache directory if this left it empty)."""
    if local and os.path.dirname(os.path.abspath(local)) == os.path.abspath(cache_dir):
        for path in (local, local + ".meta.json"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(cache_dir)  # only when empty


# cached bases ------------------------------------------------------------------------------------
@contextlib.contextmanager
def bases_lock(images_dir: str) -> Iterator[str]:
    """Exclusive lock on ``<images>/.bases`` held while a base is chosen and an overlay is created on
    it, and while :func:`gc_bases` runs: a base is never collected between the two."""
    bases = os.path.join(images_dir, BASES_DIR)
    os.makedirs(bases, mode=0o755, exist_ok=True)
    fd = os.open(bases, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield bases
    finally:
        os.close(fd)


def references(images_dir: str, conn: Conn = None) -> dict[str, list[str]]:
    """``{file (realpath): [who uses it]}``: every file a domain on this host (``conn``: defined or
    running, wherever its disks live), an ownership manifest under ``images_dir`` or any image below
    ``images_dir`` (any depth) uses, with the whole backing chain of each (qcow2 headers). A file
    below ``images_dir`` lists itself (``image <path>``)."""
    tops = []
    if conn is not None:
        # here, not at the top: the master's runners import this module for its checks alone, and
        # saltvirt.host.query brings libvirt (~0.1 s of every salt-run virt.* start-up)
        from saltvirt.host import query  # noqa: PLC0415 - see above

        files: dict[str, str] = {}
        for name, disk in query.domain_disks(conn, unread="; image gc removed nothing"):
            for path in (disk.get("file"), disk.get("backing_file")):
                if path and os.path.isabs(path):
                    files.setdefault(path, name)
        tops += [(path, f"domain {name}") for path, name in files.items()]
    for path in images.image_files(images_dir):
        if os.path.basename(path) == images.MANIFEST:
            # every file it lists counts, even one purge would not delete (a symlink, outside): keeping is safe
            listed = (images.load_manifest(os.path.dirname(path)) or {}).get("files") or []
            tops += [(owned, f"manifest {path}") for owned in listed if os.path.exists(owned)]
        else:
            tops.append((path, f"image {path}"))
    refs: dict[str, list[str]] = {}
    for path, who in tops:
        refs.setdefault(os.path.realpath(path), []).append(who)
        for backing in images.backing_chain(path):
            refs.setdefault(backing, []).append(f"backing chain of {path} ({who})")
    return refs


def gc_bases(images_dir: str, cache: bool = False, conn: Conn = None) -> Data:
    """Remove cached bases (``<images>/.bases/*``) that nothing on this host uses (:func:`references`:
    libvirt's domains through ``conn``, the ownership manifests, every image under ``images_dir``, each
    with its whole backing chain); with ``cache=True`` also the http(s) download cache
    (``<images>/.cache``), which only speeds up the next ``virt.init`` of the same URL.
    Returns ``{removed: [paths], kept: [paths]}``."""
    removed, kept = [], []  # type: list[str], list[Any]
    if os.path.isdir(os.path.join(images_dir, BASES_DIR)):
        with bases_lock(images_dir) as bases:
            while True:  # a base removed may have been the last user of the base below it
                refs, before = references(images_dir, conn), len(removed)
                for entry in sorted(os.scandir(bases), key=lambda e: e.name):
                    if not entry.is_file(follow_symlinks=False) or entry.path in removed:
                        continue
                    # kept while anything but its own listing as an image refers to it
                    if [who for who in refs.get(os.path.realpath(entry.path), []) if who != f"image {entry.path}"]:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed.append(entry.path)
                if len(removed) == before:
                    break
            kept = sorted(e.path for e in os.scandir(bases) if e.is_file(follow_symlinks=False))
    if cache:
        folder = os.path.join(images_dir, CACHE_DIR)
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                if entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed.append(entry.path)
    if removed:
        log.info("image gc in %s removed %s", images_dir, removed)
    return {"removed": removed, "kept": kept}
