"""Hostile images through ``salt-run virt.init`` on a real salt-master and a real hypervisor minion
(``hyper-intake``, managing the real namespaced libvirtd hv1): each is refused with a clear message, and
nothing is left behind: no domain, no file in the minion's virt:images, no pre-accepted minion key.

The minion trusts the test's self-signed HTTPS server through SSL_CERT_FILE and has
``virt:max_image_mib: 1``; the HTTP(S) servers run on 127.0.0.1 in this process."""

import os
import pathlib
import shutil
import tempfile

import libvirt
import pytest

from tests.support import hostile
from tests.support.saltd import hypervisor_minion_config, start_minion

MINION = "hyper-intake"  # one of the master's virt:hypervisors (hyper*); every call narrows to it with tgt=


@pytest.fixture(scope="module")
def folder():
    path = tempfile.mkdtemp(prefix="svintake-", dir="/var/tmp")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def servers(folder):
    with hostile.Server(str(folder), tls=True) as tls, hostile.Server() as web:
        web.files["/x.raw"] = b"\0" * 4096
        tls.streams["/big.raw"] = (b"\0" * 65536, 1024)  # 64 MiB, no Content-Length
        tls.redirects["/moved.raw"] = web.url("/x.raw")
        yield {"tls": tls, "web": web}


@pytest.fixture(scope="module")
def hostile_tree(state_tree, folder):
    """Hostile images in the master's file_roots (salt://images/evil-*) and one on the hypervisor."""
    images = pathlib.Path(state_tree) / "images"
    secret = hostile.secret_file(str(folder))
    made = {
        "backing": hostile.backing_file_image(str(folder), secret),
        "data": hostile.data_file_image(str(folder)),
        "vmdk": hostile.vmdk_descriptor_image(str(folder), secret),
    }
    for kind, path in made.items():
        shutil.copyfile(path, images / f"evil-{kind}{pathlib.Path(path).suffix}")
    (images / "small.raw").write_bytes(b"\3" * 65536)
    yield {"local backing": made["backing"]}
    for name in ("evil-backing.qcow2", "evil-data.qcow2", "evil-vmdk.img", "small.raw"):
        (images / name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def intake_hv(salt_master, hv1, lab_dir, servers, folder):
    config = hypervisor_minion_config(hv1, pathlib.Path(lab_dir) / "intake-images")
    config["virt"]["max_image_mib"] = 1
    # the local hostile image lies in an allowed directory: refused for what it is, not for where it is
    config["virt"]["allowed_paths"].append(str(folder))
    environ = dict(os.environ, SSL_CERT_FILE=servers["tls"].cert, no_proxy="127.0.0.1")
    factory = start_minion(salt_master, MINION, config)
    factory.environ.update(environ)
    with factory.started():
        yield {"factory": factory, "images": pathlib.Path(lab_dir) / "intake-images"}
    # a stopped hypervisor whose key stays accepted is a down host to every later fleet-wide call on this
    # session master (each would wait virt:hypervisors:down_after for it)
    salt_master.salt_key_cli(timeout=60).run("-d", MINION, "-y")


def cases(servers, tree):
    tls, web = servers["tls"], servers["web"]
    return {
        "backing file": (["salt://images/evil-backing.qcow2"], "is a qcow2 with a backing file: refused"),
        "local backing file": ([tree["local backing"]], "is a qcow2 with a backing file: refused"),
        "data file": (["salt://images/evil-data.qcow2"], "is a qcow2 with an external data file: refused"),
        "vmdk descriptor": (["salt://images/evil-vmdk.img"], "is a vmdk descriptor image: only raw and qcow2"),
        "wrong checksum": (
            ["salt://images/small.raw", "checksum=sha256:" + "0" * 64],
            "does not match checksum sha256:" + "0" * 64,
        ),
        "https to http": ([tls.url("/moved.raw", userinfo="alice:s3cret")], r"refused (https -> http"),
        "plain http": ([web.url("/x.raw")], "plain http is refused"),
        "oversized": (
            [tls.url("/big.raw")],
            "the server sent more than 1 MiB, more than virt:max_image_mib (1 MiB): nothing kept",
        ),
    }


CASES = [
    "backing file",
    "local backing file",
    "data file",
    "vmdk descriptor",
    "wrong checksum",
    "https to http",
    "plain http",
    "oversized",
]


def test_allow_http_from_a_call_is_refused_before_anything(salt_master, salt_run_cli, intake_hv, servers, hv1):
    """Issue 23: allow_http is the operator's switch (minion config), never a call's: nothing is fetched
    (an SSRF to a loopback-only service), no key pre-accepted."""
    web = servers["web"]
    ret = salt_run_cli.run("virt.init", "evilhttp", "1", "64", web.url("/x.raw"), "allow_http=True", f"tgt={MINION}")
    assert ret.returncode == 1, ret
    assert ret.data["error"].startswith("allow_http= is an operator switch, not a call argument"), ret.data
    assert "evilhttp" not in str(salt_master.salt_key_cli().run("-L").data)
    ret = salt_master.salt_cli(timeout=120).run(
        "virt.init", "evilhttp", "1", "64", web.url("/x.raw"), "allow_http=True", minion_tgt=MINION
    )
    assert "allow_http= is an operator switch" in str(ret.data), ret


@pytest.mark.parametrize("case", CASES)
def test_salt_run_virt_init_refuses_hostile_images(
    salt_master, salt_run_cli, intake_hv, servers, hostile_tree, hv1, case
):
    name = "evil" + str(CASES.index(case))
    args, message = cases(servers, hostile_tree)[case]
    ret = salt_run_cli.run("virt.init", name, "1", "64", *args, f"tgt={MINION}", "tgt_type=glob", "fallback=False")
    assert ret.returncode == 1, ret
    error = ret.data["error"]
    assert error.startswith(f"virt.init of {name} on {MINION} failed: ") and message in error, error
    assert "s3cret" not in str(ret.data) and "alice" not in str(ret.data)
    # nothing left: no pre-accepted key, no domain, no file (an empty init-lock folder is all)
    assert ret.data["cleanup"] == {"key_removed": True, "minion_id": name}, ret.data
    keys = salt_master.salt_key_cli().run("-L")
    assert name not in str(keys.data), keys
    conn = libvirt.open(hv1.uri)
    try:
        assert name not in [d.name() for d in conn.listAllDomains(0)]
    finally:
        conn.close()
    images = intake_hv["images"]
    files = [os.path.join(d, f) for d, _, names in os.walk(images) for f in names]
    dirs = [d for d, _, _ in os.walk(images) if d != str(images) and os.path.basename(d) != ".locks"]
    assert files == [] and dirs == [], (files, dirs)
    if case == "https to http":
        assert servers["web"].log == [] or all(p != "/x.raw" for p, *_ in servers["web"].log)


def test_a_salt_image_changed_on_the_master_is_fetched_again_despite_the_recorded_digest(
    salt_master, intake_hv, state_tree
):
    """Issue 40: a salt:// image's cached copy is used without reading it whole when the master's hash matches
    the digest recorded for it (storage/saltcache). With the real cp.is_cached/hash_file/cache_file: the
    digest is recorded beside Salt's file cache, and an image that changed on the master (same size) is fetched
    again: the second warm-up's checksum is the new content's."""
    import hashlib
    import json

    path = pathlib.Path(state_tree) / "images" / "swap.raw"
    salt = salt_master.salt_cli(timeout=180)
    try:
        for fill in (b"\1", b"\2"):
            path.write_bytes(fill * 65536)
            want = hashlib.sha256(fill * 65536).hexdigest()
            ret = salt.run("virt.image_warm", "salt://images/swap.raw", f"checksum=sha256:{want}", minion_tgt=MINION)
            assert ret.returncode == 0 and ret.data["checksum"] == f"sha256:{want}", ret
            record = pathlib.Path(intake_hv["factory"].config["cachedir"]) / "salt-virt" / "salt-files.json"
            digests = [rec[-1] for copy, rec in json.loads(record.read_text()).items() if copy.endswith("/swap.raw")]
            assert digests == [want], digests
    finally:
        path.unlink(missing_ok=True)
