"""saltvirt.storage.intake with the real qemu-img, hostile images built by it, and real HTTP/HTTPS servers on
127.0.0.1 started by the tests; then the same hostile images through ``virt.init`` on the real Salt
loader (libvirt's test driver): refused with a clear message and nothing left behind."""

import hashlib
import http.server
import json
import os
import pathlib
import shutil
import threading

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.storage import images, intake
from tests.support import hostile, toollimits
from tests.support.saltloader import SOURCES, load_states, make_minion_mods

MIB = 1048576


@pytest.fixture
def sources(tmp_path):
    """tmp_path/sources: in the loader's virt:allowed_paths (tests.support.saltloader)."""
    folder = tmp_path / SOURCES
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def base(sources, guest):
    """Private copies of the guest images: {'raw': path, 'qcow2': path}."""
    out = {}
    for fmt in ("raw", "qcow2"):
        out[fmt] = str(sources / f"base.{fmt}")
        shutil.copyfile(guest[fmt], out[fmt])
    return out


@pytest.fixture
def evil(sources):
    """Every hostile image, each aimed at an /etc/shadow-like host file."""
    folder = sources / "evil"
    folder.mkdir()
    secret = hostile.secret_file(str(folder))
    return {
        "secret": secret,
        "backing file": hostile.backing_file_image(str(folder), secret),
        "external data file": hostile.data_file_image(str(folder)),
        "vmdk descriptor": hostile.vmdk_descriptor_image(str(folder), secret),
        "vmdk descriptor without comment": hostile.vmdk_descriptor_image(str(folder), secret, comment=False),
        "vpc": hostile.other_format_image(str(folder), "vpc"),
        "vmdk": hostile.other_format_image(str(folder), "vmdk"),
        "qcow (v1)": hostile.other_format_image(str(folder), "qcow"),
    }


REFUSALS = {
    "backing file": "is a qcow2 with a backing file: refused",
    "external data file": "is a qcow2 with an external data file: refused",
    "vmdk descriptor": "is a vmdk descriptor image: only raw and qcow2 images are accepted",
    "vmdk descriptor without comment": "is a vmdk descriptor image: only raw and qcow2",
    "vpc": "is a vpc image: only raw and qcow2",
    "vmdk": "is a vmdk image: only raw and qcow2",
    "qcow (v1)": r"is a qcow \(v1\) image: only raw and qcow2",
}


def digest(path, algo="sha256"):
    with open(path, "rb") as fh:
        return hashlib.new(algo, fh.read()).hexdigest()


@pytest.fixture
def web(tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with hostile.Server() as srv:
        yield srv


@pytest.fixture
def tls(tmp_path, monkeypatch):
    """An HTTPS server whose self-signed certificate this process trusts (SSL_CERT_FILE)."""
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with hostile.Server(str(tmp_path), tls=True) as srv:
        monkeypatch.setenv("SSL_CERT_FILE", srv.cert)
        yield srv


# format ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_probe_accepts_raw_and_qcow2(base, fmt):
    info = intake.probe(base[fmt])
    assert info["format"] == fmt and info["virtual_size"] == 64 * MIB and info["path"] == base[fmt]


def test_probe_reads_a_raw_image_as_qemu_img_does_without_running_it(base, sources, monkeypatch):
    """raw has nothing for qemu-img to check: probe reads the sizes itself, the same figures qemu-img gives
    (also for a sparse file). qemu-img is checked first, then taken off PATH to show probe does not run it."""
    sparse = str(sources / "sparse.raw")
    with open(sparse, "wb") as fh:
        fh.write(b"\1" * 65536)
        fh.truncate(32 * MIB)
    for path in (base["raw"], sparse):
        qemu = intake._qemu_info(path, "raw")
        monkeypatch.setenv("PATH", str(sources))  # no qemu-img here: a run would fail
        info = intake.probe(path)
        monkeypatch.undo()
        assert info["format"] == "raw"
        assert (info["virtual_size"], info["actual_size"]) == (qemu["virtual-size"], qemu["actual-size"])


def test_qemu_img_info_of_an_untrusted_image_runs_capped(base, tmp_path, monkeypatch):
    """Issue 36 #3: Nova's caps (1 GiB of address space, 30 s of CPU) on qemu-img info of a caller's image."""
    runs = toollimits.note_limits(monkeypatch, tmp_path)
    assert intake.probe(base["qcow2"])["format"] == "qcow2"
    capped = {"address space": ("1073741824", "1073741824"), "cpu time": ("30", "31")}
    assert runs() and all(run == capped for run in runs())


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_probe_refuses_hostile_images(evil, kind):
    with pytest.raises(SaltInvocationError, match=REFUSALS[kind]):
        intake.probe(evil[kind])


# existing disks (saltvirt.storage.attach's format check) ----------------------------------------
FORMATS = [
    # (file, declared, attached as or the refusal)
    ("raw", None, "raw"),
    ("raw", "raw", "raw"),
    ("raw", "qcow2", "is raw, not qcow2: attach it with format: raw"),
    ("qcow2", None, "starts with a qcow2 header and no format is given: salt-virt never assumes qcow2"),
    ("qcow2", "qcow2", "qcow2"),
    ("qcow2", "raw", "raw"),
    ("backing file", None, "is a qcow2 with a backing file: refused"),
    ("backing file", "qcow2", "is a qcow2 with a backing file: refused"),
    ("backing file", "raw", "raw"),  # a raw disk whose guest wrote that header: its bytes, never the host file
    ("external data file", "qcow2", "is a qcow2 with an external data file: refused"),
    ("external data file", "raw", "raw"),
    ("vmdk descriptor", None, "looks like a vmdk descriptor image: only raw and qcow2 disks are attached"),
    ("vmdk descriptor", "qcow2", "looks like a vmdk descriptor image"),
    ("vmdk descriptor", "raw", "raw"),
]


@pytest.mark.parametrize(("kind", "declared", "want"), FORMATS)
def test_existing_disk_format_is_what_is_on_it(base, evil, kind, declared, want):
    path = dict(base, **evil)[kind]
    if want in ("raw", "qcow2"):
        assert intake.existing_disk(path, declared, "data") == want
    else:
        with pytest.raises(SaltInvocationError, match=want):
            intake.existing_disk(path, declared, "data")


def test_an_overlay_is_attached_only_onto_a_base_the_operator_trusts(base, evil, tmp_path):
    """An overlay the operator made on a golden image (shared storage): accepted when the operator lists
    the base in virt:insecure_trusted_images and the overlay records the base's format; else refused."""
    golden = base["qcow2"]
    overlay, unrecorded = str(tmp_path / "vm.qcow2"), str(tmp_path / "unrecorded.qcow2")
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", golden, overlay])
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", golden, unrecorded])
    with open(unrecorded, "r+b") as fh:  # the backing format header extension (0xe2792aca) becomes the end marker
        head = fh.read(4096)
        fh.seek(head.index(bytes.fromhex("e2792aca")))
        fh.write(b"\0\0\0\0")
    assert "backing-filename-format" not in json.loads(
        hostile.run(["qemu-img", "info", "--output=json", "-f", "qcow2", unrecorded]).stdout
    )
    with pytest.raises(SaltInvocationError, match="is a qcow2 with a backing file: refused"):
        intake.existing_disk(overlay, "qcow2", "system")
    with pytest.raises(SaltInvocationError, match="is a qcow2 with a backing file: refused"):
        intake.existing_disk(overlay, "qcow2", "system", [base["raw"]])  # another base trusted, not this one
    assert intake.existing_disk(overlay, "qcow2", "system", [golden]) == "qcow2"
    with pytest.raises(SaltInvocationError, match="starts with a qcow2 header and no format is given"):
        intake.existing_disk(overlay, None, "system", [golden])
    with pytest.raises(SaltInvocationError, match="with a backing file whose format it does not record: refused"):
        intake.existing_disk(unrecorded, "qcow2", "system", [golden])
    with pytest.raises(SaltInvocationError, match="is a qcow2 with a backing file: refused"):
        intake.existing_disk(evil["backing file"], "qcow2", "data", [golden])  # a guest's header naming a host file


def test_trusted_local_path_is_the_documented_opt_in(evil, tmp_path):
    assert intake.probe(evil["backing file"], trusted=True)["format"] == "qcow2"
    roots = [os.path.dirname(evil["vmdk"])]
    assert intake.accept(evil["vmdk"], str(tmp_path / "c"), trusted=True, roots=roots)["format"] == "vmdk"
    with pytest.raises(SaltInvocationError, match="trusted_image=True is only for a local absolute path"):
        intake.accept("salt://evil.qcow2", str(tmp_path / "c"), lambda u: evil["backing file"], trusted=True)
    with pytest.raises(SaltInvocationError, match="trusted_image=True is only for a local absolute path"):
        intake.accept("https://example.invalid/x.qcow2", str(tmp_path / "c"), trusted=True)


# checksum ----------------------------------------------------------------------------------------
def test_checksum_verified_for_local_and_salt_sources(base, tmp_path):
    cache, roots = str(tmp_path / "cache"), [os.path.dirname(base["raw"])]
    for algo in ("sha256", "sha512"):
        good = f"{algo}:{digest(base['qcow2'], algo)}"
        assert intake.accept(base["qcow2"], cache, checksum=good, roots=roots)["checksum"] == good
        got = intake.accept(
            "salt://g.qcow2", cache, lambda u: base["qcow2"], checksum=good.upper().replace("SHA", "sha")
        )
        assert got["checksum"] == good and got["source"] == "salt://g.qcow2"
    wrong = "sha256:" + "0" * 64
    for src, cache_file in ((base["raw"], None), ("salt://g.raw", lambda u: base["raw"])):
        with pytest.raises(SaltInvocationError, match=f"does not match checksum {wrong}"):
            intake.accept(src, cache, cache_file, checksum=wrong, roots=roots)
    for bad in ("md5:" + "0" * 32, "sha256:xyz", "sha256:" + "0" * 63, "0" * 64):
        with pytest.raises(SaltInvocationError, match="checksum must be 'sha256:<64 hex digits>'"):
            intake.accept(base["raw"], cache, checksum=bad, roots=roots)
    assert not os.path.exists(cache)


def test_http_checksum_and_nothing_kept_on_mismatch(base, web, tmp_path):
    with open(base["qcow2"], "rb") as fh:
        web.files["/g.qcow2"] = fh.read()
    cache = str(tmp_path / "cache")
    with pytest.raises(SaltInvocationError, match="does not match checksum"):
        intake.accept(web.url("/g.qcow2"), cache, allow_http=True, checksum="sha512:" + "a" * 128)
    assert not os.path.exists(cache)
    good = "sha512:" + digest(base["qcow2"], "sha512")
    info = intake.accept(web.url("/g.qcow2"), cache, allow_http=True, checksum=good)
    assert info["format"] == "qcow2" and info["checksum"] == good and os.path.dirname(info["path"]) == cache


# downloads ---------------------------------------------------------------------------------------
def test_plain_http_needs_allow_http(web, tmp_path):
    web.files["/x.raw"] = b"\0" * 4096
    with pytest.raises(
        SaltInvocationError, match="plain http is refused .* virt:insecure_http_images: True in the minion"
    ):
        intake.accept(web.url("/x.raw"), str(tmp_path / "cache"))
    assert web.log == [] and not os.path.exists(tmp_path / "cache")


def test_https_download_and_no_redirect_to_http(tls, web, tmp_path):
    cache = str(tmp_path / "cache")
    tls.files["/ok.raw"] = b"\1" * 8192
    assert intake.accept(tls.url("/ok.raw"), cache)["format"] == "raw"
    web.files["/x.raw"] = b"\0" * 4096
    tls.redirects["/moved.raw"] = web.url("/x.raw")
    for allow_http in (False, True):
        with pytest.raises(CommandExecutionError, match=r"redirects to http://.*refused \(https -> http"):
            intake.accept(tls.url("/moved.raw"), cache, allow_http=allow_http)
    assert web.log == []  # the http server was never asked
    tls.redirects["/again.raw"] = tls.url("/ok.raw")  # https -> https is fine
    assert intake.accept(tls.url("/again.raw"), cache)["format"] == "raw"


def test_http_redirect_to_http_needs_allow_http_too(web, tmp_path):
    web.files["/x.raw"] = b"\0" * 4096
    web.redirects["/moved.raw"] = web.url("/x.raw")
    assert intake.accept(web.url("/moved.raw"), str(tmp_path / "c"), allow_http=True)["format"] == "raw"
    with pytest.raises(SaltInvocationError, match="plain http is refused"):
        intake.accept(web.url("/moved.raw"), str(tmp_path / "c2"))


@pytest.mark.parametrize("announced", [True, False])
def test_download_size_cap(web, tmp_path, announced):
    """Announced (Content-Length) or not, nothing beyond virt:max_image_mib is kept: the download
    stops at the cap (the streaming server would send 64 MiB)."""
    cache = str(tmp_path / "cache")
    if announced:
        web.files["/big.raw"] = b"\0" * (2 * MIB)
    else:
        web.streams["/big.raw"] = (b"\0" * 65536, 1024)
    what = "announces 2 MiB" if announced else "sent more than 1 MiB"
    with pytest.raises(SaltInvocationError, match=f"the server {what}, more than virt:max_image_mib \\(1 MiB\\)"):
        intake.accept(web.url("/big.raw"), cache, allow_http=True, max_image_mib=1)
    assert not os.path.exists(cache)


def test_salt_image_size_cap(base, tmp_path):
    with pytest.raises(SaltInvocationError, match=r"more than virt:max_image_mib \(1 MiB\)"):
        intake.accept("salt://g.raw", str(tmp_path / "c"), lambda u: base["raw"], max_image_mib=1)


def test_credentials_never_shown_and_never_redirected(tls, tmp_path):
    cache = str(tmp_path / "cache")
    tls.files["/p.raw"] = b"\2" * 4096
    url = tls.url("/p.raw", userinfo="alice:s3cr%40t")
    info = intake.accept(url, cache)
    assert info["source"] == tls.url("/p.raw") and tls.log[-1][2] == hostile.basic("alice", "s3cr@t")
    with open(info["path"] + ".meta.json") as fh:
        meta = fh.read()
    assert "s3cr" not in meta and json.loads(meta)["url"] == tls.url("/p.raw")
    with pytest.raises(CommandExecutionError) as exc:
        intake.accept(tls.url("/missing.raw", userinfo="alice:s3cr%40t"), cache)
    assert "HTTP 404" in str(exc.value) and "s3cr" not in str(exc.value) and "alice" not in str(exc.value)
    tls.redirects["/r.raw"] = tls.url("/p.raw")
    intake.accept(tls.url("/r.raw", userinfo="alice:s3cr%40t"), cache)
    assert tls.log[-2][2] == hostile.basic("alice", "s3cr@t") and tls.log[-1][2] is None  # not sent on
    assert intake.redact("https://u:p@h:1/x?y") == "https://h:1/x?y" and intake.redact("/a@b") == "/a@b"


def test_a_presigned_urls_token_is_requested_but_never_shown(tls, tmp_path):
    """A presigned URL's query is its credential: the request carries it; the return, the errors and the cache's
    metadata show the URL without it (the old ``redact`` kept the query)."""
    cache = str(tmp_path / "cache")
    tls.files["/s.raw?X-Amz-Signature=s3cret"] = b"\3" * 4096  # served only to a request with the token
    info = intake.accept(tls.url("/s.raw") + "?X-Amz-Signature=s3cret#frag", cache)
    assert tls.log[-1][:2] == ("/s.raw?X-Amz-Signature=s3cret", 200)  # requested with its token
    assert info["source"] == tls.url("/s.raw")
    with open(info["path"] + ".meta.json") as fh:
        assert "s3cret" not in fh.read()
    with pytest.raises(CommandExecutionError) as exc:
        intake.accept(tls.url("/missing.raw") + "?sig=s3cret", cache)
    assert "HTTP 404" in str(exc.value) and "s3cret" not in str(exc.value)
    with pytest.raises(SaltInvocationError) as exc:
        intake.check_source(tls.url("/s.raw") + "?sig=s3cret", ["https://elsewhere.example/"], "minion config")
    assert "is not from a source the operator allows" in str(exc.value) and "s3cret" not in str(exc.value)


def test_cached_download_reused_and_refreshed(web, tmp_path):
    cache = str(tmp_path / "cache")
    web.files["/g.raw"] = b"A" * 100000
    first = intake.fetch(web.url("/g.raw"), cache, allow_http=True)
    with open(first + ".meta.json") as fh:
        meta = json.load(fh)
    assert meta["length"] == 100000 and meta["sha256"] == hashlib.sha256(b"A" * 100000).hexdigest()
    web.files["/g.raw"] = b"B" * 50000
    assert intake.fetch(web.url("/g.raw"), cache, allow_http=True) == first  # no ETag: fetched again
    with open(first, "rb") as fh:
        assert fh.read() == b"B" * 50000


def test_fetch_bad_sources(tmp_path):
    cache = str(tmp_path / "cache")
    for bad in ("", None, 42, "images/../../etc/shadow", f"{tmp_path}/../../etc/shadow"):
        with pytest.raises(SaltInvocationError):
            intake.fetch(bad, cache)
    with pytest.raises(SaltInvocationError, match="'ftp'"):
        intake.fetch("ftp://example.invalid/x.img", cache)
    with pytest.raises(SaltInvocationError, match="'file'"):
        intake.fetch("file:///etc/shadow", cache)
    with pytest.raises(SaltInvocationError, match=r"'\.\.'"):
        intake.fetch("salt://images/../../etc/shadow", cache, cache_file=lambda u: "/etc/shadow")
    with pytest.raises(SaltInvocationError, match=r"not found on the master \(file_roots"):
        intake.fetch("salt://images/nope.raw", cache, cache_file=lambda u: False)
    assert not os.path.exists(cache)


# conditional re-download (ETag / Last-Modified) ----------------------------------------------
class _Files(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files[path] = bytes`` with ETag/Last-Modified; honours conditionals only when
    ``server.conditional``; logs (method, path, status) in ``server.log``."""

    def do_GET(self):
        srv = self.server
        body = srv.files.get(self.path)
        if body is None:
            srv.log.append((self.path, 404))
            self.send_error(404)
            return
        etag = f'"{len(body)}-{hashlib.sha1(body).hexdigest()[:10]}"'
        if srv.conditional and self.headers.get("If-None-Match") == etag:
            srv.log.append((self.path, 304))
            self.send_response(304)
            self.end_headers()
            return
        srv.log.append((self.path, 200))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", "Sun, 01 Nov 2026 00:00:00 GMT")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    srv.files, srv.log, srv.conditional = {}, [], True
    # shutdown() waits for serve_forever's next poll: the default 0.5 s was most of each test's time
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("conditional", [True, False])
def test_fetch_http_downloads_once_and_refreshes_on_change(http_server, tmp_path, monkeypatch, conditional):
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    http_server.conditional = conditional
    http_server.files["/img/guest.qcow2"] = b"A" * 100000
    url = f"http://127.0.0.1:{http_server.server_port}/img/guest.qcow2"
    cache = str(tmp_path / "cache")
    path = intake.fetch(url, cache, allow_http=True)
    assert os.path.dirname(path) == cache and path.endswith("-guest.qcow2")
    assert pathlib.Path(path).read_bytes() == b"A" * 100000
    meta = json.loads(pathlib.Path(path + ".meta.json").read_text())
    assert meta["url"] == url and meta["length"] == 100000 and meta["etag"]
    first = os.stat(path).st_ino
    # unchanged on the server: the cached copy is reused (304, or same length/ETag/Last-Modified)
    assert intake.fetch(url, cache, allow_http=True) == path
    assert os.stat(path).st_ino == first
    assert http_server.log[-1] == ("/img/guest.qcow2", 304 if conditional else 200)
    # changed on the server: downloaded again, atomically replacing the old copy
    http_server.files["/img/guest.qcow2"] = b"B" * 50000
    assert intake.fetch(url, cache, allow_http=True) == path
    assert pathlib.Path(path).read_bytes() == b"B" * 50000 and os.stat(path).st_ino != first
    assert sorted(os.listdir(cache)) == sorted([os.path.basename(path), os.path.basename(path) + ".meta.json"])


def test_fetch_http_errors_leave_no_partial_file(http_server, tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    cache = str(tmp_path / "cache")
    with pytest.raises(CommandExecutionError, match="HTTP 404"):
        intake.fetch(f"http://127.0.0.1:{http_server.server_port}/missing.img", cache, allow_http=True)
    http_server.server_close()  # nothing listens there any more
    with pytest.raises(CommandExecutionError, match="downloading image .* failed"):
        intake.fetch("http://127.0.0.1:9/x.img", cache, allow_http=True)
    assert os.listdir(cache) == []


# gc ----------------------------------------------------------------------------------------------
def test_gc_removes_only_bases_nothing_backs_onto(base, tmp_path):
    images_dir = tmp_path / "images"
    (images_dir / ".bases").mkdir(parents=True)
    (images_dir / "vm1").mkdir()
    used, unused = str(images_dir / ".bases" / "used.qcow2"), str(images_dir / ".bases" / "old.qcow2")
    shutil.copyfile(base["qcow2"], used)
    shutil.copyfile(base["qcow2"], unused)
    overlay = str(images_dir / "vm1" / "system.qcow2")
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", used, overlay])
    (images_dir / ".cache").mkdir()
    (images_dir / ".cache" / "x.raw").write_bytes(b"x")
    assert intake.gc_bases(str(images_dir)) == {"removed": [unused], "kept": [used]}
    os.unlink(overlay)
    out = intake.gc_bases(str(images_dir), cache=True)
    assert out["removed"] == [used, str(images_dir / ".cache" / "x.raw")] and out["kept"] == []
    assert intake.gc_bases(str(tmp_path / "nothing")) == {"removed": [], "kept": []}


def _overlay(backing, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, path])
    return path


def test_gc_keeps_bases_used_at_any_depth_by_libvirt_manifests_and_chains(base, tmp_path, test_conn):
    """Every base below is used from somewhere a two-level scan never looked: deep directories, another
    directory only a libvirt domain names, an overlay of an overlay, a chain of bases. Only the base
    nothing uses goes, and once its last user is gone each of the others goes too."""
    images_dir, other = tmp_path / "images", tmp_path / "elsewhere"
    bases = images_dir / ".bases"
    bases.mkdir(parents=True)
    names = ("deep", "outside", "chained", "lower", "unused")
    b = {n: str(bases / f"{n}.qcow2") for n in names}
    for n in ("deep", "outside", "lower", "unused"):
        shutil.copyfile(base["qcow2"], b[n])
    _overlay(b["lower"], b["chained"])  # a base on a base: "lower" is used through "chained"
    deep = _overlay(b["deep"], str(images_dir / "vm1" / "disks" / "a" / "b" / "system.qcow2"))
    mid = _overlay(b["chained"], str(images_dir / "vm2" / "mid.qcow2"))
    top = _overlay(mid, str(other / "x" / "y" / "top.qcow2"))  # outside images: only libvirt knows it
    os.unlink(mid)  # ... and its middle link moves out of images too
    mid = _overlay(b["chained"], str(other / "mid.qcow2"))
    hostile.run(["qemu-img", "rebase", "-u", "-F", "qcow2", "-b", mid, top])
    outside = _overlay(b["outside"], str(other / "z" / "data.qcow2"))
    xml = f"""<domain type='test'><name>gcuser</name><memory>65536</memory><os><type>hvm</type></os>
      <devices><disk type='file' device='disk'><source file='{top}'/><target dev='vda'/></disk>
      <disk type='file' device='disk'><source file='{outside}'/><target dev='vdb'/></disk></devices></domain>"""
    dom = test_conn.defineXML(xml)
    try:
        out = intake.gc_bases(str(images_dir), conn=test_conn)
        assert out == {"removed": [b["unused"]], "kept": sorted(b[n] for n in names if n != "unused")}
        refs = intake.references(str(images_dir), test_conn)
        assert any("domain gcuser" in who for who in refs[os.path.realpath(b["lower"])])
        # without libvirt's view the bases only the domain uses would go: that is what conn= is for
        dom.undefine()
        dom = None
        out = intake.gc_bases(str(images_dir), conn=test_conn)
        assert out == {"removed": [b["chained"], b["outside"], b["lower"]], "kept": [b["deep"]]}
        os.unlink(deep)
        assert intake.gc_bases(str(images_dir), conn=test_conn) == {"removed": [b["deep"]], "kept": []}
    finally:
        if dom is not None:
            dom.undefine()


def test_gc_keeps_what_an_ownership_manifest_lists_through_a_symlinked_folder(base, tmp_path):
    """A manifest's files count even where the image walk does not go (it never follows symlinks)."""
    images_dir = tmp_path / "images"
    (images_dir / ".bases").mkdir(parents=True)
    used = str(images_dir / ".bases" / "used.qcow2")
    shutil.copyfile(base["qcow2"], used)
    real_dir = tmp_path / "real"
    disk = _overlay(used, str(real_dir / "system.qcow2"))
    (images_dir / "vm1").mkdir()
    os.symlink(disk, images_dir / "vm1" / "system.qcow2")
    images.record_owned(str(images_dir / "vm1"), "vm1", [str(images_dir / "vm1" / "system.qcow2")])
    assert intake.gc_bases(str(images_dir)) == {"removed": [], "kept": [used]}


# through virt.init on the real loader (test driver) ----------------------------------------------
def _nothing_left(v, name, images_dir):
    """No domain, no file (disk, download, lock file) and no directory but the init-lock folder."""
    assert name not in v["virt.list_domains"]()
    files = [os.path.join(d, f) for d, _, names in os.walk(images_dir) for f in names]
    dirs = [d for d, _, _ in os.walk(images_dir) if d != images_dir and os.path.basename(d) != ".locks"]
    assert files == [] and dirs == []


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_virt_init_refuses_hostile_images(virt_test, evil, kind):
    images_dir = virt_test.opts["virt"]["images"]
    with pytest.raises(SaltInvocationError, match=REFUSALS[kind]):
        virt_test["virt.init"]("evilvm", 1, 64, image=evil[kind], nic=None, seed=False, start=False)
    _nothing_left(virt_test, "evilvm", images_dir)
    # a second disk with an image of its own goes through the same door
    with pytest.raises(SaltInvocationError, match=REFUSALS[kind]):
        virt_test["virt.init"]("evilvm", 1, 64, nic=None, disk=None, disks=[{"d": {"image": evil[kind]}}], seed=False)
    _nothing_left(virt_test, "evilvm", images_dir)


def test_virt_init_refuses_bad_checksum_redirect_and_oversize(virt_test, base, tls, web, tmp_path):
    v, images_dir = virt_test, virt_test.opts["virt"]["images"]
    args = {"nic": None, "seed": False, "start": False}
    with pytest.raises(SaltInvocationError, match="does not match checksum"):
        v["virt.init"]("evilvm", 1, 64, image=base["raw"], checksum="sha256:" + "1" * 64, **args)
    web.files["/x.raw"] = b"\0" * 4096
    tls.redirects["/moved.raw"] = web.url("/x.raw")
    with pytest.raises(CommandExecutionError, match=r"refused \(https -> http"):
        v["virt.init"]("evilvm", 1, 64, image=tls.url("/moved.raw", userinfo="u:pw"), **args)
    web.streams["/big.raw"] = (b"\0" * 65536, 1024)
    # plain http only because the operator opted in (minion config), never by a call argument
    capped = make_minion_mods(
        tmp_path, "test:///default", images_dir=images_dir, max_image_mib=1, insecure_http_images=True
    )
    with pytest.raises(SaltInvocationError, match=r"more than virt:max_image_mib \(1 MiB\)"):
        capped["virt.init"]("evilvm", 1, 64, image=web.url("/big.raw"), **args)
    _nothing_left(v, "evilvm", images_dir)
    ok = v["virt.init"](
        "goodvm", 1, 64, image=base["qcow2"], checksum="sha256:" + digest(base["qcow2"]), enable_qcow=False, **args
    )
    assert ok["disks"][0]["format"] == "qcow2" and ok["state"] == "shutoff"
    assert v["virt.purge"]("goodvm")["removed"] == [ok["disks"][0]["path"]]


def test_purge_collects_the_cached_base_of_its_overlay(virt_test, base, web, tmp_path):
    """An overlay from a downloaded image backs onto <images>/.bases/...; purging the last VM that uses
    it removes the base too (virt.image_gc cache=True then empties the download cache)."""
    images_dir = virt_test.opts["virt"]["images"]  # virt_test: removes the test driver's domains afterwards
    # plain http only because the operator opted in (minion config), never by a call argument
    v = make_minion_mods(tmp_path / "http", "test:///default", images_dir=images_dir, insecure_http_images=True)
    with open(base["qcow2"], "rb") as fh:
        web.files["/g.qcow2"] = fh.read()
    args = {"nic": None, "seed": False, "start": False, "enable_qcow": True}
    one = v["virt.init"]("gc1", 1, 64, image=web.url("/g.qcow2"), **args)
    two = v["virt.init"]("gc2", 1, 64, image=web.url("/g.qcow2"), **args)
    # the server sends no ETag: the second init downloads again and gets a base of its own
    b1, b2 = one["disks"][0]["backing"], two["disks"][0]["backing"]
    assert sorted(os.listdir(os.path.join(images_dir, ".bases"))) == sorted(
        {os.path.basename(b1), os.path.basename(b2)}
    )
    three = v["virt.init"]("gc3", 1, 64, image=b2, **dict(args, enable_qcow=False))  # a full copy: no backing
    assert three["disks"][0]["backing"] is None
    hostile.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", b2, f"{images_dir}/gc3/extra.qcow2"])
    assert v["virt.purge"]("gc1")["bases_removed"] == ([b1] if b1 != b2 else [])
    assert v["virt.purge"]("gc2")["bases_removed"] == []  # gc3/extra.qcow2 still backs onto it
    os.unlink(f"{images_dir}/gc3/extra.qcow2")
    assert v["virt.purge"]("gc3")["bases_removed"] == [b2]
    assert os.listdir(os.path.join(images_dir, ".bases")) == []
    cached = v["virt.image_gc"](cache=True)["removed"]
    assert len(cached) == 2 and os.listdir(os.path.join(images_dir, ".cache")) == []  # image + its metadata


# local source paths: only from virt:images or virt:allowed_paths ---------------------------------
@pytest.fixture
def outside(tmp_path):
    """An /etc/shadow-like host file outside virt:images and virt:allowed_paths, and a symlink to it
    planted inside an allowed directory."""
    folder = tmp_path / "outside"
    folder.mkdir()
    secret = hostile.secret_file(str(folder))
    sources = tmp_path / SOURCES
    sources.mkdir(exist_ok=True)
    link = sources / "innocent.raw"
    link.symlink_to(secret)
    return {"secret": secret, "link": str(link), "sources": str(sources)}


def test_local_image_confined_to_the_given_roots(outside, base, tmp_path):
    cache = str(tmp_path / "c")
    for image in (outside["secret"], outside["link"]):
        for trusted in (False, True):  # trusted_image lifts the format checks, never the confinement
            with pytest.raises(SaltInvocationError, match="outside the directories salt-virt may use"):
                intake.accept(image, cache, trusted=trusted, roots=[outside["sources"]])
    with pytest.raises(SaltInvocationError, match=r"\(none\).*virt:allowed_paths in the minion config"):
        intake.accept(base["raw"], cache)  # no roots given: every local path refused
    assert intake.accept(base["raw"], cache, roots=[outside["sources"]])["format"] == "raw"
    assert not os.path.exists(cache)


def test_virt_init_refuses_a_local_image_outside_images_and_allowed_paths(virt_test, outside, base, tmp_path):
    """``virt.init x 1 64 image=/etc/shadow``: the host file would become the VM's disk."""
    images_dir = virt_test.opts["virt"]["images"]
    args = {"nic": None, "seed": False, "start": False}
    msg = r"image .*host-shadow.* is outside the directories salt-virt may use .*virt:allowed_paths in the minion"
    for image in (outside["secret"], outside["link"]):
        with pytest.raises(SaltInvocationError, match=msg):
            virt_test["virt.init"]("evilvm", 1, 64, image=image, **args)
            _nothing_left(virt_test, "evilvm", images_dir)
        with pytest.raises(SaltInvocationError, match=msg):  # a per-disk image: the same door
            virt_test["virt.init"]("evilvm", 1, 64, disk=None, disks=[{"d": {"image": image}}], **args)
        _nothing_left(virt_test, "evilvm", images_dir)
    preview = load_states(virt_test, test=True)["virt.running"]("evilvm", cpu=1, mem=64, image=outside["secret"])
    assert preview["result"] is False and "virt:allowed_paths" in preview["comment"]
    _nothing_left(virt_test, "evilvm", images_dir)
    with open(outside["secret"], "rb") as fh:
        assert fh.read() == hostile.SECRET * 64  # untouched
    # inside virt:allowed_paths (the loader's tmp_path/sources): accepted
    ok = virt_test["virt.init"]("goodvm", 1, 64, image=base["raw"], **args)
    assert ok["disks"][0]["format"] == "raw" and ok["state"] == "shutoff"
    assert virt_test["virt.purge"]("goodvm")["removed"] == [ok["disks"][0]["path"]]
    # the operator's virt:insecure_trusted_images lifts the format checks, never the confinement
    images = [outside["secret"], outside["link"]]
    trusting = make_minion_mods(
        tmp_path / "t", "test:///default", images_dir=images_dir, insecure_trusted_images=images
    )
    for image in images:
        with pytest.raises(SaltInvocationError, match=msg):
            trusting["virt.init"]("evilvm", 1, 64, image=image, **args)
        _nothing_left(virt_test, "evilvm", images_dir)
