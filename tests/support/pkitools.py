"""Helpers for the PKI tests: quick keys, file modes, gnutls' certtool as the independent judge; a real libvirtd's
TLS seen from a client (certificate directories for virsh, a rogue certificate, the server's log)."""

import datetime
import os
import shutil
import stat
import subprocess

from tests.support.paths import ROOT

K = {"key_size": 2048}  # quick keys
QUICK_KEYS = {"key_type": "ec", "key_size": 256}  # quicker: where the key type is not the point


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def days_left(cert):
    return (cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)).days


def certtool_verify(tmp_path, ca_pem, cert_pem, hostname=None, purpose=None):
    """gnutls' verdict on ``cert_pem`` against the CA bundle ``ca_pem`` (0 = trusted)."""
    (tmp_path / "v-ca.pem").write_text(ca_pem)
    (tmp_path / "v-cert.pem").write_text(cert_pem)
    cmd = [
        "certtool",
        "--verify",
        "--load-ca-certificate",
        str(tmp_path / "v-ca.pem"),
        "--infile",
        str(tmp_path / "v-cert.pem"),
    ]
    if hostname:
        cmd.append(f"--verify-hostname={hostname}")
    if purpose:
        cmd.append(f"--verify-purpose={purpose}")
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


# a real libvirtd's TLS from a client's side (tests/integration: test_pki_tls, test_example_sls) ---------------
def client_dir(base, cacert, cert, key):
    """A ``?pkipath=`` directory for virsh: cacert.pem, clientcert.pem, clientkey.pem (0600)."""
    os.makedirs(base, mode=0o700, exist_ok=True)
    for name, src in (("cacert.pem", cacert), ("clientcert.pem", cert), ("clientkey.pem", key)):
        shutil.copyfile(src, os.path.join(base, name))
    os.chmod(os.path.join(base, "clientkey.pem"), 0o600)
    return base


def hypervisor_client_dir(base, keys):
    """:func:`client_dir` of the hypervisor client pair ``virt.keys`` wrote below ``keys`` (its basepath)."""
    own = os.path.join(keys, "libvirt")
    return client_dir(
        base,
        os.path.join(keys, "CA", "cacert.pem"),
        os.path.join(own, "clientcert.pem"),
        os.path.join(own, "private", "clientkey.pem"),
    )


def rogue_client(tmp_path, ca_dir):
    """A certificate from *our* CA (``ca_dir``: cacert.pem, cakey.pem) with a CN that is not a salt-virt
    client's (made with certtool and pki/client.tmpl, as an admin would): (cert path, key path)."""
    tmpl = tmp_path / "rogue.tmpl"
    tmpl.write_text((ROOT / "pki" / "client.tmpl").read_text() + 'cn = "rogue"\n')
    key, cert = tmp_path / "rogue.key", tmp_path / "rogue.pem"
    subprocess.run(
        ["certtool", "--generate-privkey", "--bits", "2048", "--outfile", str(key)], check=True, capture_output=True
    )
    ca = [
        "--load-ca-certificate",
        os.path.join(ca_dir, "cacert.pem"),
        "--load-ca-privkey",
        os.path.join(ca_dir, "cakey.pem"),
    ]
    subprocess.run(
        [
            "certtool",
            "--generate-certificate",
            "--load-privkey",
            str(key),
            "--template",
            str(tmpl),
            "--outfile",
            str(cert),
            *ca,
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def virsh_tls(netns, host, pkipath):
    """``virsh hostname`` over ``qemu+tls://<host>/system`` from network namespace ``netns`` (a lab fabric's),
    the client's certificates in ``pkipath`` (:func:`client_dir`)."""
    uri = f"qemu+tls://{host}/system?pkipath={pkipath}"
    return subprocess.run(
        ["ip", "netns", "exec", netns, "virsh", "-c", uri, "hostname"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class LogTail:
    """A growing log (a lab libvirtd's ``log/libvirtd.log``): :meth:`new` returns what it got since the last call."""

    def __init__(self, path):
        self.path, self.seen = path, 0

    def new(self):
        with open(self.path) as fh:
            fh.seek(self.seen)
            text = fh.read()
            self.seen = fh.tell()
        return text
