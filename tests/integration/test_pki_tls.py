"""libvirt PKI end to end: the master's CA signs certs in the `libvirt` ext_pillar, only hypervisor
minions get them, `virt.keys` writes them, and a real libvirtd with listen_tls accepts a client using
the distributed client cert and rejects one signed by another CA."""
import datetime
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

import lab
from conftest import start_minion
from saltvirt import pki


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(scope="module")
def plain_minion(salt_master):
    """A minion that is not a hypervisor (grain forced False): it must get no certificates."""
    factory = start_minion(salt_master, "plain1", {"virt_hypervisor": False})
    with factory.started():
        assert factory.salt_call_cli(timeout=120).run("saltutil.sync_all").returncode == 0
        yield factory


@pytest.fixture(scope="module")
def keys_dir():
    path = tempfile.mkdtemp(prefix="svpki-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def refresh(salt_cli, minion):
    assert salt_cli.run("saltutil.refresh_pillar", "wait=True", minion_tgt=minion).returncode == 0


def test_only_hypervisors_get_their_own_certs(salt_cli, hyper1, plain_minion):
    refresh(salt_cli, "hyper1")
    refresh(salt_cli, "plain1")
    assert salt_cli.run("grains.get", "virt_hypervisor", minion_tgt="plain1").data is False
    assert salt_cli.run("pillar.get", "libvirt", "unmask=True", minion_tgt="plain1").data == ""
    server = salt_cli.run("pillar.get", "libvirt:server", "unmask=True", minion_tgt="hyper1").data
    assert {"hv1", "hyper1"} <= set(server["san_dns"])
    assert "10.252.0.11" in server["san_ip"]
    client = salt_cli.run("pillar.get", "libvirt:client", "unmask=True", minion_tgt="hyper1").data
    assert client["subject"].startswith("CN=hyper1 libvirt client")
    own_key = salt_cli.run("pillar.get", "libvirt:serverkey", "unmask=True", minion_tgt="hyper1").data
    assert "PRIVATE KEY" in own_key  # the minion really has its key ...
    items = salt_cli.run("pillar.items", minion_tgt="hyper1")
    assert "libvirt" in items.data and "PRIVATE KEY" not in items.stdout  # ... and output masks it


def test_keys_state_writes_files_with_safe_modes(salt_cli, hyper1, keys_dir):
    refresh(salt_cli, "hyper1")
    preview = salt_cli.run("state.single", "virt.keys", "libvirt-keys", f"basepath={keys_dir}", "test=True", minion_tgt="hyper1")
    (ret,) = preview.data.values()
    assert ret["result"] is None and len(ret["changes"]) == 5
    assert not os.path.exists(os.path.join(keys_dir, "CA"))
    applied = salt_cli.run("state.single", "virt.keys", "libvirt-keys", f"basepath={keys_dir}", minion_tgt="hyper1")
    (ret,) = applied.data.values()
    assert ret["result"] is True and len(ret["changes"]) == 5, ret
    assert "PRIVATE KEY" not in applied.stdout
    assert mode(os.path.join(keys_dir, "libvirt", "private")) == 0o700
    for key in ("serverkey", "clientkey"):
        assert mode(os.path.join(keys_dir, "libvirt", "private", f"{key}.pem")) == 0o600
    again = salt_cli.run("state.single", "virt.keys", "libvirt-keys", f"basepath={keys_dir}", minion_tgt="hyper1")
    (ret,) = again.data.values()
    assert ret["result"] is True and ret["changes"] == {}


def _client_dir(base, cacert, cert, key):
    os.makedirs(base, mode=0o700, exist_ok=True)
    for name, src in (("cacert.pem", cacert), ("clientcert.pem", cert), ("clientkey.pem", key)):
        shutil.copyfile(src, os.path.join(base, name))
    os.chmod(os.path.join(base, "clientkey.pem"), 0o600)
    return base


def test_real_libvirtd_accepts_distributed_client_cert_and_rejects_foreign_ca(keys_dir, tmp_path, lab_dir):
    assert os.path.exists(os.path.join(keys_dir, "libvirt", "servercert.pem")), "run after the keys state test"
    fab = lab.Fabric(lab.new_tag()).start()
    hv = lab.Hypervisor(os.path.join(lab_dir, "tls"), 1, fab, tls_dir=keys_dir)
    try:
        hv.start()
        ours = _client_dir(
            str(tmp_path / "ours"),
            os.path.join(keys_dir, "CA", "cacert.pem"),
            os.path.join(keys_dir, "libvirt", "clientcert.pem"),
            os.path.join(keys_dir, "libvirt", "private", "clientkey.pem"),
        )
        foreign_ca = str(tmp_path / "foreign-ca")
        foreign = pki.issue(foreign_ca, "intruder", "client", key_size=2048)
        (tmp_path / "f.pem").write_text(foreign["cert"])
        (tmp_path / "f.key").write_text(foreign["key"])
        theirs = _client_dir(str(tmp_path / "theirs"), os.path.join(keys_dir, "CA", "cacert.pem"), str(tmp_path / "f.pem"), str(tmp_path / "f.key"))

        def virsh(pkipath):
            uri = f"qemu+tls://10.252.0.11/system?pkipath={pkipath}"
            return subprocess.run(
                ["ip", "netns", "exec", fab.netns, "virsh", "-c", uri, "hostname"], capture_output=True, text=True, timeout=60
            )

        ok = virsh(ours)
        assert ok.returncode == 0 and ok.stdout.strip() == "hv1", ok.stderr
        bad = virsh(theirs)
        assert bad.returncode != 0
        assert "certificate" in bad.stderr.lower() or "tls" in bad.stderr.lower(), bad.stderr
    finally:
        hv.stop()
        fab.stop()


def test_near_expiry_cert_is_renewed_and_rewritten(salt_cli, salt_master, hyper1, keys_dir):
    ca_dir = os.path.join(salt_master.config["pki_dir"], "libvirt")
    cert_path = os.path.join(ca_dir, "minions", "hyper1", "servercert.pem")
    with open(cert_path) as fh:
        before = fh.read()
    # replace the stored cert by one from the same CA that expires tomorrow
    ca_cert, ca_key = pki.ensure_ca(ca_dir)
    sans = pki.cert_sans(pki.load_cert(before))
    short, key = pki._issue(ca_cert, ca_key, "hyper1", "server", sorted(sans[0]) + [str(i) for i in sans[1]], 1, 2048)
    pki._write(cert_path, pki._cert_pem(short), 0o644)
    pki._write(os.path.join(ca_dir, "minions", "hyper1", "serverkey.pem"), pki._key_pem(key), 0o600)
    refresh(salt_cli, "hyper1")
    server = salt_cli.run("pillar.get", "libvirt:server", "unmask=True", minion_tgt="hyper1").data
    not_after = datetime.datetime.fromisoformat(server["not_after"])
    assert (not_after - datetime.datetime.now(datetime.timezone.utc)).days > 800
    ret = salt_cli.run("state.single", "virt.keys", "libvirt-keys", f"basepath={keys_dir}", minion_tgt="hyper1")
    (state,) = ret.data.values()
    assert state["changes"] == {
        os.path.join(keys_dir, "libvirt", "servercert.pem"): "updated",
        os.path.join(keys_dir, "libvirt", "private", "serverkey.pem"): "key replaced",
    }
