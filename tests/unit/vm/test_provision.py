"""saltvirt.vm.provision: faults after defineXML in virt.init (libvirt's test driver).

The post-define faults are injected through init's own ``progress`` callback (the hook that sends the
progress events): raising there is a failure at exactly that step, with nothing mocked.
"""

import os

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.model import vmargs
from saltvirt.vm import provision

# a graphics listen that is not a string: libvirt stores it and then hands back XML that does not parse
BAD_LISTEN = {"listen": {"address": "1.2.3.4'/><x"}}  # Salt's mapping form is honoured; this address is not


def _left(conn, tmp_path):
    names = sorted(d.name() for d in conn.listAllDomains(0))
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    return names, files


def test_bad_graphics_leaves_nothing_defined(test_conn, tmp_path):
    before = _left(test_conn, tmp_path)
    with pytest.raises(SaltInvocationError, match="graphics:listen:address"):
        provision.init(
            test_conn,
            vmargs.InitRequest("gfx1", 1, 64, nic=None, start=False, graphics=BAD_LISTEN),
            provision.Host(images_dir=str(tmp_path)),
        )
    with pytest.raises(SaltInvocationError, match="graphics:port"):
        provision.init(
            test_conn,
            vmargs.InitRequest("gfx1", 1, 64, nic=None, graphics={"port": "x"}),
            provision.Host(images_dir=str(tmp_path)),
        )
    assert _left(test_conn, tmp_path) == before


@pytest.mark.parametrize("step", ["defined", "started"])
def test_failure_after_define_is_undone(test_conn, tmp_path, step):
    before = _left(test_conn, tmp_path)

    def progress(at, **_data):
        if at == step:
            raise CommandExecutionError(f"injected fault at {at}")

    with pytest.raises(CommandExecutionError, match=f"injected fault at {step}"):
        provision.init(
            test_conn,
            vmargs.InitRequest("late1", 1, 64, nic=None),
            provision.Host(images_dir=str(tmp_path)),
            progress=progress,
        )
    assert _left(test_conn, tmp_path) == before  # no domain, no disk, no manifest, no VM directory


def test_undo_that_cannot_finish_reports_the_vm_state(test_conn, tmp_path):
    """The undo cannot remove the domain (here: another one took its name meanwhile; on a real host:
    libvirtd died, see tests/integration/test_faults.py): the error says what is left and what to run."""
    xml = "<domain type='test'><name>late2</name><memory>65536</memory><os><type>hvm</type></os></domain>"

    def progress(at, **_data):
        if at == "defined":
            test_conn.lookupByName("late2").undefine()
            test_conn.defineXML(xml)
            raise CommandExecutionError("connection lost")

    with pytest.raises(CommandExecutionError) as err:
        provision.init(
            test_conn,
            vmargs.InitRequest("late2", 1, 64, nic=None),
            provision.Host(images_dir=str(tmp_path)),
            progress=progress,
        )
    msg = str(err.value)
    assert "connection lost" in msg and "cleanup incomplete: undefine late2" in msg, msg
    assert "VM 'late2' is still defined, state shutoff" in msg and "virt.cleanup late2" in msg, msg


def test_console_password_generated_or_unsealed_never_returned(test_conn, tmp_path):
    """A console gets a generated password unless given one; one sealed by the runner is opened with
    this minion's key (<pki_dir>/minion.pem); neither appears in the return."""
    import libvirt

    from saltvirt.pki import envelope

    ret = provision.init(
        test_conn,
        vmargs.InitRequest("gfx2", 1, 64, nic=None, disk=None, enable_vnc=True),
        provision.Host(images_dir=str(tmp_path)),
    )
    secure = test_conn.lookupByName("gfx2").XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE)
    generated = secure.split("passwd='")[1].split("'")[0]
    assert len(generated) == 8 and generated not in repr(ret)
    pub, priv = envelope.new_keypair()
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "minion.pem").write_text(priv)
    sealed = envelope.seal(pub, "s3cret-1", "gfx3/graphics", "20261125000000000001")
    gfx = {"type": "vnc", "password": sealed}
    ret = provision.init(
        test_conn,
        vmargs.InitRequest("gfx3", 1, 64, nic=None, disk=None, graphics=gfx),
        provision.Host(images_dir=str(tmp_path), pki_dir=str(tmp_path / "pki"), job="20261125000000000001"),
    )
    assert "passwd='s3cret-1'" in test_conn.lookupByName("gfx3").XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE)
    assert "s3cret-1" not in repr(ret)


def test_a_sealed_key_is_no_console_password(test_conn, tmp_path):
    """Issue 23: another VM's sealed private key passed as graphics:password is refused before it is opened
    (the hypervisor is no decryption oracle), and nothing is defined."""
    from saltvirt.pki import envelope

    pub, priv = envelope.new_keypair()
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "minion.pem").write_text(priv)
    victim_key = envelope.new_keypair()[1]
    job = "20261125000000000002"
    sealed = envelope.seal(pub, victim_key, "victim/priv_key", job)
    for name, context_job in (("gfx4", job), ("gfx5", "20261125000000000003")):
        with pytest.raises(CommandExecutionError) as err:
            provision.init(
                test_conn,
                vmargs.InitRequest(name, 1, 64, nic=None, disk=None, graphics={"type": "vnc", "password": sealed}),
                provision.Host(images_dir=str(tmp_path), pki_dir=str(tmp_path / "pki"), job=context_job),
            )
        assert "sealed" in str(err.value) and "PRIVATE KEY" not in str(err.value)
        assert name not in [d.name() for d in test_conn.listAllDomains(0)]


def test_init_returns_the_new_vms_info_as_vm_info_reports_it(test_conn, tmp_path):
    """The runner puts virt.init's own vm_info in its answer instead of asking the hypervisor again."""
    from saltvirt.host import query

    ret = provision.init(
        test_conn, vmargs.InitRequest("info1", 1, 64, nic=None), provision.Host(images_dir=str(tmp_path))
    )
    try:
        now = query.vm_info(test_conn, "info1")["info1"]
        assert ret["vm_info"] == dict(now, cputime=ret["vm_info"]["cputime"])  # test driver: cputime is the clock
        assert ret["state"] == ret["vm_info"]["state"] == "running"
    finally:
        provision.purge(test_conn, "info1", images_dir=str(tmp_path))


def test_image_warm_fetches_checks_and_imports_the_base_once(tmp_path, guest):
    """virt.image_warm: the image through virt.init's own door, then its base in <images>/.bases, where an
    overlay init finds it; a second warm-up finds it warm; a bad checksum is refused as by virt.init."""
    import hashlib
    import os
    import shutil

    from saltvirt.storage import intake

    cached = tmp_path / "minion-cache" / "web.qcow2"  # where cp.cache_file would have put it
    cached.parent.mkdir()
    shutil.copyfile(guest["qcow2"], cached)
    images_dir = str(tmp_path / "images")
    asked = []

    def cache_file(url):
        asked.append(url)
        return str(cached)

    first = provision.warm("salt://images/web.qcow2", images_dir=images_dir, cache_file=cache_file)
    assert asked == ["salt://images/web.qcow2"] and first["path"] == str(cached) and first["format"] == "qcow2"
    assert os.path.dirname(first["base"]) == os.path.join(images_dir, intake.BASES_DIR)
    assert provision.base_image(str(cached), images_dir, "salt://images/web.qcow2") == first["base"]  # init's base
    assert os.stat(first["base"]).st_mode & 0o777 == 0o444
    again = provision.warm("salt://images/web.qcow2", images_dir=images_dir, cache_file=cache_file)
    assert again["base"] == first["base"] and len(os.listdir(os.path.dirname(first["base"]))) == 1
    bad = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(SaltInvocationError, match="does not match checksum"):
        provision.warm("salt://images/web.qcow2", images_dir=images_dir, cache_file=cache_file, checksum=bad)
    with pytest.raises(SaltInvocationError, match="allowed_paths"):
        provision.warm(str(cached), images_dir=images_dir)  # a local path outside virt:images / allowed_paths
    assert again["type"] is None  # no connection: libvirt not asked


def test_image_warm_asks_libvirt_what_init_asks_first(tmp_path, guest, test_conn):
    """With a connection, warm-up also detects the domain type as virt.init does before the image step:
    a libvirtd's first getCapabilities probes QEMU (seconds), paid here instead of by the first init."""
    import shutil

    images_dir = tmp_path / "images"
    images_dir.mkdir()
    shutil.copyfile(guest["qcow2"], images_dir / "web.qcow2")
    warm = provision.warm(str(images_dir / "web.qcow2"), images_dir=str(images_dir), conn=test_conn)
    assert warm["type"] == "test" and warm["base"] is None
    pinned = provision.warm(str(images_dir / "web.qcow2"), images_dir=str(images_dir), conn=test_conn, vtype="qemu")
    assert pinned["type"] == "qemu"  # virt:type set: init asks libvirt nothing, nor does warm-up


def test_a_generated_key_pair_is_the_one_seeded_and_reported(test_conn, tmp_path, guest):
    """No key given: virt.init makes a pair (in a thread, beside the copy), seeds it and reports its
    fingerprint; here through cloud-init write_files (the route a unit test can read back)."""
    import base64
    import email
    import hashlib
    import io

    import pycdlib
    import yaml
    from cryptography.hazmat.primitives import serialization

    ret = provision.init(
        test_conn,
        vmargs.InitRequest(
            "key1", 1, 64, image=guest["qcow2"], nic=None, start=False, seed_backend="cloud-init", cloud_init=True
        ),
        provision.Host(images_dir=str(tmp_path), allowed_paths=(guest["dir"],)),
    )
    iso = pycdlib.PyCdlib()
    iso.open(ret["cloud_init"]["iso"])
    buf = io.BytesIO()
    iso.get_file_from_iso_fp(buf, rr_path="/user-data")
    iso.close()
    parts = [p.get_payload(decode=True) for p in email.message_from_bytes(buf.getvalue()).walk()]
    written = {
        f["path"]: base64.b64decode(f["content"])
        for part in parts
        if part and part.startswith(b"#cloud-config")
        for f in yaml.safe_load(part).get("write_files", [])
    }
    pub, priv = written["/etc/salt/pki/minion/minion.pub"], written["/etc/salt/pki/minion/minion.pem"]
    assert ret["key"]["generated"] is True and ret["key"]["fingerprint"] == hashlib.sha256(pub).hexdigest()
    mine = serialization.load_pem_private_key(priv, None).public_key()
    assert mine.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).strip() == (
        pub.strip()
    )


def test_the_manifest_names_the_vm_by_uuid_and_host_before_its_disks_are_ready(test_conn, tmp_path):
    """Issue 34 #3: what an init leaves behind is judged by UUID, never by name. The UUID is chosen before
    define, so the manifest records it and the creating host's minion id before anything it covers is
    made (here: seen when the disks are ready, long before define)."""
    from saltvirt.storage import images

    seen = {}

    def progress(at, **_data):
        if at == "disks_ready":
            seen.update(images.load_manifest(str(tmp_path / "uuid1")))

    ret = provision.init(
        test_conn,
        vmargs.InitRequest("uuid1", 1, 64, nic=None, start=False),
        provision.Host(images_dir=str(tmp_path), host_id="hv-a"),
        progress=progress,
    )
    assert seen["uuid"] == ret["uuid"] == test_conn.lookupByName("uuid1").UUIDString(), seen
    assert seen["host"] == "hv-a" and seen["files"] == [ret["disks"][0]["path"]], seen
    # until its last step the init is unfinished: a cleanup may take its domain only then
    assert seen["complete"] is False and images.load_manifest(str(tmp_path / "uuid1"))["complete"] is True


def test_the_image_is_recorded_and_a_urls_secrets_are_in_no_return(test_conn, tmp_path, monkeypatch):
    """<metadata> keeps the image a VM came from (vm_info's ``image``, the resource grain): an https source
    without its user:password, query and fragment (a token there would be in every vm_info), or the catalog
    entry's name the runner gives; a bad name stops before anything is made."""
    from saltvirt.host import query
    from tests.support import hostile

    monkeypatch.setenv("no_proxy", "127.0.0.1")
    with hostile.Server(str(tmp_path), tls=True) as srv:
        monkeypatch.setenv("SSL_CERT_FILE", srv.cert)
        srv.files["/img/web.raw?token=s3cret"] = b"\1" * 65536
        url = srv.url("/img/web.raw?token=s3cret#frag", userinfo="alice:pa55word")
        host = provision.Host(images_dir=str(tmp_path / "images"))
        args = {"nic": None, "start": False, "seed": False}
        ret = provision.init(test_conn, vmargs.InitRequest("img1", 1, 64, image=url, **args), host)
        assert srv.log[-1][0] == "/img/web.raw?token=s3cret"  # fetched as given
        local = str(tmp_path / "images" / "img1" / "system.raw")
        made = provision.init(
            test_conn, vmargs.InitRequest("img2", 1, 64, image=local, catalog_image="debian12", **args), host
        )
        with pytest.raises(SaltInvocationError, match="invalid catalog image name"):
            provision.init(test_conn, vmargs.InitRequest("img3", 1, 64, image=url, catalog_image="<x>", **args), host)
    bare = f"https://127.0.0.1:{srv.srv.server_port}/img/web.raw"
    info = query.vm_info(test_conn)
    assert ret["vm_info"]["image"] == info["img1"]["image"] == bare
    assert made["vm_info"]["image"] == info["img2"]["image"] == "debian12" and "img3" not in info
    for secret in ("s3cret", "pa55word", "alice", "frag"):
        assert secret not in repr(ret) and secret not in repr(info)
        assert secret not in test_conn.lookupByName("img1").XMLDesc(1)  # nor in the definition (secure XML)


def test_a_new_manifest_lists_the_disks_to_be_made_in_its_first_write(test_conn, tmp_path, monkeypatch):
    """Issue 40: the manifest is written twice an init (was three times, each fsynced): its first write already
    lists the disk files the init is about to make (here the default profile's blank disk), the second marks
    the init complete. A crash in between is the next test's."""
    from saltvirt.storage import images

    writes = []
    real = images.write_json
    monkeypatch.setattr(
        images, "write_json", lambda path, data, **kw: (writes.append(dict(data)), real(path, data, **kw))
    )
    ret = provision.init(
        test_conn, vmargs.InitRequest("man1", 1, 64, nic=None, start=False), provision.Host(images_dir=str(tmp_path))
    )
    disk = ret["disks"][0]["path"]
    assert [(w["files"], w["complete"]) for w in writes] == [([disk], False), ([disk], True)], writes
    provision.purge(test_conn, "man1", images_dir=str(tmp_path))


@pytest.mark.parametrize("crash_at", ["manifest", "disks_ready"])
def test_an_init_killed_after_its_first_manifest_write_is_cleaned_up(test_conn, tmp_path, crash_at):
    """The manifest lists a disk before it is made: an init killed right after that write (the disk not made)
    or once the disk is made leaves what ``virt.cleanup`` removes whole, the missing file counted as gone."""
    from saltvirt.storage import images
    from saltvirt.vm import cleanup

    uri = test_conn.getURI()
    pid = os.fork()
    if pid == 0:  # the init, killed (os._exit: no undo, no finally) at the chosen point
        try:
            import libvirt

            if crash_at == "manifest":
                real = images.write_json
                images.write_json = lambda *a, **kw: (real(*a, **kw), os._exit(9))

            def progress(at, **_data):
                if at == crash_at:
                    os._exit(9)

            provision.init(
                libvirt.open(uri),
                vmargs.InitRequest("crash1", 1, 64, nic=None, start=False),
                provision.Host(images_dir=str(tmp_path)),
                progress=progress,
            )
        finally:
            os._exit(3)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 9
    vm_dir = tmp_path / "crash1"
    listed = images.load_manifest(str(vm_dir))["files"]
    assert len(listed) == 1 and os.path.exists(listed[0]) == (crash_at == "disks_ready"), listed
    out = cleanup.cleanup(test_conn, "crash1", str(tmp_path))
    assert out["interrupted"] and not out["errors"] and "refused" not in out, out
    assert out["removed"] == ([] if crash_at == "manifest" else listed), out
    assert not vm_dir.exists()


def test_the_read_back_asks_libvirt_only_what_the_init_did_not_decide(test_conn, tmp_path, monkeypatch):
    """Issue 40: the new VM's autostart (none set) and persistence (defined) come from what the init did, not
    two more round trips; the answer stays what virt.vm_info says."""
    import libvirt

    from saltvirt.host import query

    asked = []
    for name in ("autostart", "isPersistent"):
        real = getattr(libvirt.virDomain, name)
        monkeypatch.setattr(
            libvirt.virDomain, name, lambda self, *a, _r=real, _n=name: (asked.append(_n), _r(self, *a))[1]
        )
    ret = provision.init(
        test_conn, vmargs.InitRequest("rb1", 1, 64, nic=None, start=False), provision.Host(images_dir=str(tmp_path))
    )
    assert asked == []
    monkeypatch.undo()
    try:
        now = query.vm_info(test_conn, "rb1")["rb1"]
        assert ret["vm_info"] == dict(now, cputime=ret["vm_info"]["cputime"])  # test driver: cputime is the clock
        assert ret["vm_info"]["autostart"] is False and ret["state"] == "shutoff"
    finally:
        provision.purge(test_conn, "rb1", images_dir=str(tmp_path))


def test_a_second_init_of_the_same_shape_skips_libvirts_schema_check(test_conn, tmp_path):
    """Issue 40: libvirt's schema check (~4.7 ms of libvirtd's a define) runs once per definition shape
    (saltvirt.host.schemacache, kept in the type cache's directory): the next VM of the same shape is defined
    without it, one with another device is checked again."""
    import libvirt

    calls = []

    class Counted:  # the real connection, which define call it gets noted
        def __getattr__(self, name):
            return getattr(test_conn, name)

        def defineXMLFlags(self, xml, flags):
            calls.append(bool(flags & libvirt.VIR_DOMAIN_DEFINE_VALIDATE))
            return test_conn.defineXMLFlags(xml, flags)

        def defineXML(self, xml):
            calls.append(False)
            return test_conn.defineXML(xml)

    host = provision.Host(images_dir=str(tmp_path / "images"), type_cache=str(tmp_path / "cache"))
    for name, watchdog in (("sh1", None), ("sh2", None), ("sh3", True)):
        provision.init(Counted(), vmargs.InitRequest(name, 1, 64, nic=None, start=False, watchdog=watchdog), host)
    assert calls == [True, False, True]
    for name in ("sh1", "sh2", "sh3"):
        provision.purge(test_conn, name, images_dir=str(tmp_path / "images"))
