"""libvirt PKI end to end with real daemons: the master's CA signs certs in the `libvirt` ext_pillar,
only hypervisor minions get them (each only its own), `virt.keys` writes them with safe modes, and a
real libvirtd with listen_tls and the distributed server cert accepts a `qemu+tls://` client using the
distributed client cert, and rejects a client cert from another CA and a host name outside the SANs."""

import datetime
import json
import os
import pathlib
import shutil
import stat
import sys
import tempfile

import pytest

from saltvirt.pki import ca as pki
from tests.support import lab, pkitools
from tests.support.paths import ROOT
from tests.support.saltd import start_minion

STATE = ("state.single", "virt.keys", "libvirt-keys")
# virt.host_ready's check run inside a lab hypervisor's namespaces (where its TLS listener is): argv uri, pkipath
HOST_READY = f"""import json, sys
sys.path.insert(0, {str(ROOT / "_utils")!r})
from saltvirt.vm import hostready
conf = {{"virt:migration": {{"pkipath": sys.argv[2]}}}}
print(json.dumps(hostready.check(sys.argv[1], lambda key, default=None: conf.get(key, default), [], "/nonexistent")))
"""


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def only(ret):
    (state,) = ret.data.values()
    return state


@pytest.fixture(scope="module")
def plain_minion(salt_master):
    """A minion that is not a hypervisor (static grain override): it must get no certificates."""
    factory = start_minion(salt_master, "plain1", {"grains": {"virt_hypervisor": False}})
    with factory.started():
        yield factory


@pytest.fixture(scope="module")
def keys_dir():
    path = tempfile.mkdtemp(prefix="svpki-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def applied_keys(salt_cli, hyper1, keys_dir):
    """hyper1's TLS files written by virt.keys into keys_dir (a no-op if a test already did it)."""
    state = only(salt_cli.run(*STATE, f"basepath={keys_dir}", minion_tgt="hyper1"))
    assert state["result"] is True, state
    return keys_dir


def refresh(salt_cli, minion):
    assert salt_cli.run("saltutil.refresh_pillar", "wait=True", minion_tgt=minion).returncode == 0


def unmasked(salt_cli, minion, key):
    return salt_cli.run("pillar.get", key, "unmask=True", minion_tgt=minion).data


def test_only_hypervisors_get_their_own_certs(salt_cli, hyper1, plain_minion):
    refresh(salt_cli, "hyper1")
    refresh(salt_cli, "plain1")
    assert salt_cli.run("grains.get", "virt_hypervisor", minion_tgt="plain1").data is False
    assert salt_cli.run("grains.get", "virt_hypervisor", minion_tgt="hyper1").data is True
    assert unmasked(salt_cli, "plain1", "libvirt") == ""
    server = unmasked(salt_cli, "hyper1", "libvirt:server")
    assert {"hv1", "hyper1"} <= set(server["san_dns"]) and "10.252.0.11" in server["san_ip"]
    assert "127.0.0.1" not in server["san_ip"]
    client = unmasked(salt_cli, "hyper1", "libvirt:client")
    assert client["subject"] == "CN=hyper1 libvirt client,O=salt-virt" and client["subject"] != server["subject"]
    own_key = unmasked(salt_cli, "hyper1", "libvirt:serverkey")
    assert "PRIVATE KEY" in own_key  # the minion really has its key ...
    items = salt_cli.run("pillar.items", minion_tgt="hyper1")
    assert "libvirt" in items.data and "PRIVATE KEY" not in items.stdout  # ... and pillar.items masks it
    # nothing of hyper1's reaches another minion, even unmasked
    other = salt_cli.run("pillar.items", "unmask=True", minion_tgt="plain1")
    assert "libvirt" not in other.data and own_key.splitlines()[1] not in other.stdout


def test_a_minion_cannot_get_certs_with_its_own_ext_pillar_config(salt_cli, hyper1, plain_minion):
    """Salt's default on_demand_ext_pillar allows `pillar.ext` for 'libvirt': the module refuses it."""
    ask = '{"libvirt": {"target": "*", "extra_sans": {"plain1": ["hv1"], "hyper1": ["bank.example.com"]}}}'
    ret = salt_cli.run("pillar.ext", ask, "unmask=True", minion_tgt="plain1")
    assert ret.returncode == 0 and isinstance(ret.data, dict) and "libvirt" not in ret.data, ret
    ret = salt_cli.run("pillar.ext", ask, "unmask=True", minion_tgt="hyper1")
    server = ret.data["libvirt"]["server"]  # the master's own configuration still answers ...
    assert "hv1" in server["san_dns"] and "bank.example.com" not in server["san_dns"]  # ... with its names only


def test_keys_state_writes_files_with_safe_modes(salt_cli, hyper1, keys_dir):
    refresh(salt_cli, "hyper1")
    preview = only(salt_cli.run(*STATE, f"basepath={keys_dir}", "test=True", minion_tgt="hyper1"))
    assert preview["result"] is None and len(preview["changes"]) == 6
    assert preview["changes"][os.path.join(keys_dir, "libvirt", "private", "serverkey.pem")] == "key written"
    assert not os.path.exists(os.path.join(keys_dir, "CA"))  # test=True wrote nothing
    applied = salt_cli.run(*STATE, f"basepath={keys_dir}", minion_tgt="hyper1")
    state = only(applied)
    assert state["result"] is True and state["changes"] == preview["changes"], state
    assert "PRIVATE KEY" not in applied.stdout
    assert mode(os.path.join(keys_dir, "libvirt", "private")) == 0o700
    for key in ("serverkey", "clientkey"):
        assert mode(os.path.join(keys_dir, "libvirt", "private", f"{key}.pem")) == 0o600
    for cert in ("CA/cacert.pem", "libvirt/servercert.pem", "libvirt/clientcert.pem"):
        assert mode(os.path.join(keys_dir, cert)) == 0o644
    with open(os.path.join(keys_dir, "libvirt", "private", "serverkey.pem")) as fh:
        assert fh.read() == unmasked(salt_cli, "hyper1", "libvirt:serverkey")
    again = only(salt_cli.run(*STATE, f"basepath={keys_dir}", minion_tgt="hyper1"))
    assert again["result"] is True and again["changes"] == {}


def test_keys_state_on_a_minion_without_certs_says_why(salt_cli, plain_minion, tmp_path):
    state = only(salt_cli.run(*STATE, f"basepath={tmp_path}", minion_tgt="plain1"))
    assert state["result"] is False and "no 'libvirt' pillar" in state["comment"]
    assert os.listdir(tmp_path) == []


def test_real_libvirtd_accepts_distributed_client_cert_rejects_foreign_ca_rogue_cn_and_wrong_host(
    applied_keys, salt_master, salt_cli, tmp_path, lab_dir
):
    keys_dir = applied_keys
    ca_dir = os.path.join(salt_master.config["pki_dir"], "libvirt")
    # hyper1's client certificate is reissued (forced): the old one is revoked, and the CRL in the
    # pillar that virt.keys writes lists it
    old_client = str(tmp_path / "old-client.pem"), str(tmp_path / "old-client.key")
    shutil.copyfile(os.path.join(keys_dir, "libvirt", "clientcert.pem"), old_client[0])
    shutil.copyfile(os.path.join(keys_dir, "libvirt", "private", "clientkey.pem"), old_client[1])
    pki.issue(ca_dir, "hyper1", "client", key_size=2048, force=True)
    refresh(salt_cli, "hyper1")
    # virt.keys sets crl_file and tls_allowed_dn_list in the libvirtd config it is given: that config
    # is what the real libvirtd below runs with
    conf = tmp_path / "libvirtd.conf"
    conf.write_text('#crl_file = "/etc/pki/CA/cacrl.pem"\n')
    state = only(
        salt_cli.run(*STATE, f"basepath={keys_dir}", "qemu=True", f"libvirtd_conf={conf}", minion_tgt="hyper1")
    )
    assert state["result"] is True and str(conf) in state["changes"], state
    written = conf.read_text()
    assert f'crl_file = "{keys_dir}/CA/cacrl.pem"' in written
    assert 'tls_allowed_dn_list = ["O=salt-virt,CN=* libvirt client"]' in written
    fab = lab.Fabric(lab.new_tag()).start()
    hv = lab.Hypervisor(os.path.join(lab_dir, "tls"), 1, fab, tls_dir=keys_dir, extra_libvirtd_conf=written)
    try:
        hv.start()
        ca = os.path.join(keys_dir, "CA", "cacert.pem")
        ours = pkitools.hypervisor_client_dir(str(tmp_path / "ours"), keys_dir)
        foreign = pki.issue(str(tmp_path / "foreign-ca"), "intruder", "client", key_size=2048)
        (tmp_path / "f.pem").write_text(foreign["cert"])
        (tmp_path / "f.key").write_text(foreign["key"])
        # the client's cacert.pem trusts both CAs, else virsh refuses its own certificate before connecting
        (tmp_path / "both.pem").write_text(
            pathlib.Path(ca).read_text() + pathlib.Path(tmp_path / "foreign-ca" / "cacert.pem").read_text()
        )
        theirs = pkitools.client_dir(
            str(tmp_path / "theirs"), str(tmp_path / "both.pem"), str(tmp_path / "f.pem"), str(tmp_path / "f.key")
        )

        def virsh(host, pkipath):
            return pkitools.virsh_tls(fab.netns, host, pkipath)

        server_log = pkitools.LogTail(hv.path("log", "libvirtd.log")).new  # errors and warnings since the last call
        ok = virsh("10.252.0.11", ours)
        assert ok.returncode == 0 and ok.stdout.strip() == "hv1", ok.stderr
        server_log()
        # by name too, from inside hv1's namespaces (its /etc/hosts knows hv1): the DNS SAN from extra_sans
        by_name = hv.ns_run(["virsh", "-c", f"qemu+tls://hv1/system?pkipath={ours}", "hostname"], check=False)
        assert by_name.returncode == 0 and by_name.stdout.strip() == "hv1", by_name.stderr
        # virt.host_ready's TLS part (salt-run virt.roll waits for it after a reboot): this host's own client
        # certificate opens its libvirtd's TLS listener by the name libvirtd gives; a foreign one does not
        for pkipath, expected in ((ours, True), (theirs, False)):
            ready = json.loads(hv.ns_run([sys.executable, "-c", HOST_READY, hv.uri, pkipath]).stdout)
            assert ready["libvirtd"]["ok"] is True and ready["tls"]["ok"] is expected, ready
        # a client certificate from another CA: libvirtd refuses it (its log says why)
        bad = virsh("10.252.0.11", theirs)
        assert bad.returncode != 0, bad.stdout
        log = server_log()
        assert "Failed to verify peer's certificate" in log and "known issuer" in log, log
        # our CA, but not a salt-virt client CN: refused by tls_allowed_dn_list
        rogue_cert, rogue_key = pkitools.rogue_client(tmp_path, ca_dir)
        rogue = virsh("10.252.0.11", pkitools.client_dir(str(tmp_path / "rogue"), ca, str(rogue_cert), str(rogue_key)))
        assert rogue.returncode != 0, rogue.stdout
        assert "tls_allowed_dn_list" in server_log(), "refused for another reason"
        # QEMU's migration key pair (virt.keys qemu=True), signed by the same CA: not a libvirtd client
        qdir = os.path.join(keys_dir, "qemu")
        qemu = virsh(
            "10.252.0.11",
            pkitools.client_dir(str(tmp_path / "qemu"), ca, f"{qdir}/client-cert.pem", f"{qdir}/client-key.pem"),
        )
        assert qemu.returncode != 0, qemu.stdout
        assert "tls_allowed_dn_list" in server_log(), "QEMU's certificate refused for another reason"
        # hyper1's previous (revoked) client certificate: refused by the CRL
        revoked = virsh("10.252.0.11", pkitools.client_dir(str(tmp_path / "revoked"), ca, *old_client))
        assert revoked.returncode != 0, revoked.stdout
        assert "revoked" in server_log().lower(), "the revoked certificate was refused for another reason"
        # the client checks the server's SANs: an address the certificate does not name is refused
        wrong_name = hv.ns_run(["virsh", "-c", f"qemu+tls://127.0.0.1/system?pkipath={ours}", "hostname"], check=False)
        assert wrong_name.returncode != 0 and "hostname" in wrong_name.stderr.lower(), wrong_name.stderr
    finally:
        hv.stop()
        fab.stop()


def test_near_expiry_cert_is_renewed_and_rewritten(salt_cli, salt_master, hyper1, applied_keys):
    keys_dir = applied_keys
    ca_dir = os.path.join(salt_master.config["pki_dir"], "libvirt")
    with open(os.path.join(ca_dir, "minions", "hyper1", "servercert.pem")) as fh:
        before = pki.load_cert(fh.read())
    # replace hyper1's stored server cert by one with the same names that expires in two days
    dns, ips = pki.cert_sans(before)
    short = pki.issue(
        ca_dir,
        "hyper1",
        "server",
        sorted(dns) + [str(i) for i in ips],
        cn=pki.common_name(before),
        days=2,
        renew_days=1,
        key_size=2048,
        force=True,
    )
    assert (pki.load_cert(short["cert"]).not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)).days <= 2
    refresh(salt_cli, "hyper1")
    server = unmasked(salt_cli, "hyper1", "libvirt:server")
    not_after = datetime.datetime.fromisoformat(server["not_after"])
    assert (not_after - datetime.datetime.now(datetime.timezone.utc)).days > 800  # renewed on the compile
    assert server["sha256"] != pki.summary(short["cert"])["sha256"]
    expected = {
        os.path.join(keys_dir, "libvirt", "servercert.pem"): "updated",
        os.path.join(keys_dir, "libvirt", "private", "serverkey.pem"): "key replaced",
        # the replaced certificate is revoked: the CRL that libvirtd reads changes with it
        os.path.join(keys_dir, "CA", "cacrl.pem"): "updated",
    }
    preview = only(salt_cli.run(*STATE, f"basepath={keys_dir}", "test=True", minion_tgt="hyper1"))
    assert preview["result"] is None and preview["changes"] == expected
    state = only(salt_cli.run(*STATE, f"basepath={keys_dir}", minion_tgt="hyper1"))
    assert state["result"] is True and state["changes"] == expected
    with open(os.path.join(keys_dir, "libvirt", "servercert.pem")) as fh:
        assert pki.summary(fh.read())["sha256"] == server["sha256"]
    assert mode(os.path.join(keys_dir, "libvirt", "private", "serverkey.pem")) == 0o600
