"""The web console's default: QEMU's VNC websocket over TLS (docs/topics/console.md, "TLS (the default)"), as the
docs configure it (``vnc_tls``, ``vnc_tls_x509_cert_dir``, ``vnc_tls_x509_verify = 0`` in libvirt's qemu.conf),
on a real libvirtd with a VM salt-virt defines (``enable_vnc=True``) and a ticket from
:mod:`saltvirt.host.vncticket`. ``wss://`` checked against the CA opens the console with the ticket's password;
plain ``ws://`` is refused by QEMU, and so is a client that does not trust the certificate. The whole flow through
salt-api and a browser (over the plain-websocket opt-in): tests/integration/test_tenants.py."""

import base64
import ssl
import subprocess

import libvirt
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from saltvirt.host import vncticket
from saltvirt.model import vmargs, vmspec
from saltvirt.xml.domain import definition
from tests.support import lab, rfb

INDEX = 24  # a lab index no other module uses


def certificates(where, ip):
    """A CA and a server certificate for ``ip``, as QEMU reads them (``ca-cert.pem``, ``server-cert.pem``,
    ``server-key.pem``); returns the CA's path."""

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    ca = ("-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2", "-subj", "/CN=salt-virt test VNC CA")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", *ca)
    (where / "ext").write_text(f"subjectAltName=IP:{ip}\n")
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=hv"
    )
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
        "-out", "server-cert.pem", "-days", "2", "-extfile", "ext",
    )  # fmt: skip
    for pem in where.glob("*.pem"):
        pem.chmod(0o644)  # QEMU runs as another user
    return where / "ca-cert.pem"


@pytest.fixture
def tls_hv(lab_dir, fabric, qemu_tmp):
    """``(hypervisor, CA path)``: a libvirtd whose QEMU serves VNC (and its websocket) over TLS only."""
    ca = certificates(qemu_tmp, lab.loopback(INDEX))  # where the client reaches it (Hypervisor.forward)
    conf = f'vnc_tls = 1\nvnc_tls_x509_cert_dir = "{qemu_tmp}"\nvnc_tls_x509_verify = 0\n'
    hv = lab.Hypervisor(lab_dir, INDEX, fabric, extra_qemu_conf=conf).start()
    try:
        yield hv, ca
    finally:
        hv.stop()


def test_a_ticket_opens_the_console_over_wss_only(tls_hv, qemu_tmp):
    hv, ca = tls_hv
    conn = libvirt.open(hv.uri)
    try:
        spec = vmspec.build(
            vmargs.InitRequest("c1", 1, 64, disk=None, enable_vnc=True, vtype="qemu"), images_dir=str(qemu_tmp)
        )
        conn.defineXML(definition.build(spec)).create()
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        conf = {"address": hv.loopback, "lifetime": 60, "tls": True}
        ticket = vncticket.issue(conn, "c1", base64.b64encode(der).decode(), conf, None)
    finally:
        conn.close()
    assert ticket["tls"] is True
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    password = key.decrypt(base64.b64decode(ticket["password"]), oaep).decode()
    with hv.forward(ticket["port"]) as where:
        with pytest.raises(Exception, match="Connection to remote host was lost|Handshake status"):
            rfb.login(f"ws://{where}/", password, timeout=20)  # QEMU speaks TLS only
        with pytest.raises(ssl.SSLCertVerificationError):  # a client that does not trust the certificate
            rfb.login(f"wss://{where}/", password, timeout=20)
        assert rfb.login(f"wss://{where}/", password, timeout=20, sslopt={"ca_certs": str(ca)}) == "QEMU (c1)"
