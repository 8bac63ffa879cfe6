"""saltvirt.host.vncticket: one-time console tickets on the libvirt test driver. The test driver neither gives a
websocket a port nor changes a live device, so :class:`Live` stands in for QEMU there: it reports the port
QEMU would and keeps what ``updateDeviceFlags`` set (the real thing: tests/integration/test_tenants.py)."""

import base64
import os
import queue
import threading
import time
import xml.etree.ElementTree as ET

import libvirt
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import vncticket
from tests.support.paths import TEST_NODE_XML

VM = """<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os><devices>
<graphics type='vnc' autoport='yes' websocket='-1' listen='127.0.0.1'><listen type='address' address='127.0.0.1'/>
</graphics></devices></domain>"""
CONF = {"address": "hv1.example.com", "lifetime": 60, "tls": True}


class Live:
    """A running test-driver domain as QEMU's would look: websocket port ``port``, password updates kept."""

    def __init__(self, dom, port):
        self.dom, self.port, self.updates = dom, port, []

    def __getattr__(self, name):
        return getattr(self.dom, name)

    def XMLDesc(self, flags=0):
        return self.dom.XMLDesc(flags).replace("websocket='-1'", f"websocket='{self.port}'")

    def updateDeviceFlags(self, xml, flags):
        self.updates.append((ET.fromstring(xml), flags))


class Conn:
    def __init__(self, conn, port=5701):
        self.conn, self.port, self.doms = conn, port, {}

    def __getattr__(self, name):
        return getattr(self.conn, name)

    def lookupByName(self, name):
        return self.doms.setdefault(name, Live(self.conn.lookupByName(name), self.port))


@pytest.fixture
def conn():
    raw = libvirt.open(f"test://{TEST_NODE_XML}")  # a fresh node per test
    raw.createXML(VM.format(name="web1"), 0)
    raw.defineXML(VM.format(name="off1"))
    yield Conn(raw)
    raw.close()


@pytest.fixture(scope="module")
def browser():
    """The browser's ephemeral key pair, its public half as WebCrypto exports it (SPKI, base64)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, base64.b64encode(der).decode()


def opened(key, sealed):
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    return key.decrypt(base64.b64decode(sealed), oaep).decode()


def test_a_ticket_sets_a_fresh_password_on_the_live_console_and_only_the_browser_can_read_it(conn, browser):
    key, pub = browser
    before = time.time()
    t = vncticket.issue(conn, "web1", pub, CONF, None)
    assert {k: t[k] for k in ("vm", "host", "port", "tls")} == {
        "vm": "web1",
        "host": "hv1.example.com",
        "port": 5701,
        "tls": True,
    }
    assert before + 59 <= t["valid_until"] <= time.time() + 61
    ((xml, flags),) = conn.doms["web1"].updates
    assert flags == libvirt.VIR_DOMAIN_AFFECT_LIVE
    password = opened(key, t["password"])
    assert len(password) == 8 and xml.get("passwd") == password and password not in str(t)
    assert xml.get("passwdValidTo") == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t["valid_until"]))
    # the rest of the live element unchanged (libvirt refuses other changes of a live console)
    assert (xml.get("websocket"), xml.get("listen"), xml.find("listen").get("address")) == ("5701", *["127.0.0.1"] * 2)
    # another ticket (this VM or another): another password
    t2 = vncticket.issue(conn, "web1", pub, CONF, None)
    assert opened(key, t2["password"]) != password


def test_a_pem_key_works_too_and_weak_or_foreign_keys_are_refused(conn, browser):
    key, _ = browser
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len(opened(key, vncticket.issue(conn, "web1", pem.decode(), CONF, None)["password"])) == 8
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    ecdh = ec.generate_private_key(ec.SECP256R1()).public_key()
    for bad in (small, ecdh):
        der = bad.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        with pytest.raises(SaltInvocationError, match="RSA key of at least 2048 bits"):
            vncticket.issue(conn, "web1", base64.b64encode(der).decode(), CONF, None)
    for junk in ("not base64!", base64.b64encode(b"garbage").decode(), None, {"k": 1}, "A" * 5000):
        with pytest.raises(SaltInvocationError, match="pubkey"):
            vncticket.issue(conn, "web1", junk, CONF, None)
    assert len(conn.doms["web1"].updates) == 1  # the PEM one: the others were refused before any change


def test_no_ticket_without_a_running_websocket_console_or_without_the_engine(conn, browser, tmp_path):
    _, pub = browser
    with pytest.raises(CommandExecutionError, match="^off1 is not running: start it to open its console$"):
        vncticket.issue(conn, "off1", pub, CONF, None)
    conn.conn.createXML(VM.format(name="plain1").replace(" websocket='-1'", ""), 0)  # an older salt-virt's console
    with pytest.raises(CommandExecutionError, match="^plain1's VNC console has no websocket \\(defined by an older"):
        vncticket.issue(conn, "plain1", pub, CONF, None)
    no_vnc = "<domain type='test'><name>bare1</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    conn.conn.createXML(no_vnc, 0)
    with pytest.raises(CommandExecutionError, match="^bare1 has no VNC console: give it one \\(salt-run virt.update"):
        vncticket.issue(conn, "bare1", pub, CONF, None)
    with pytest.raises(CommandExecutionError, match="'nosuch' is not defined"):
        vncticket.issue(conn, "nosuch", pub, CONF, None)
    alive = str(tmp_path / "saltvirt" / "virt_console.alive")
    with pytest.raises(CommandExecutionError, match="the virt_console engine is not running on this hypervisor"):
        vncticket.issue(conn, "web1", pub, CONF, alive)
    vncticket.beat(alive)
    assert vncticket.issue(conn, "web1", pub, CONF, alive)["port"] == 5701
    old = time.time() - vncticket.HEARTBEAT_STALE - 1
    os.utime(alive, (old, old))
    with pytest.raises(CommandExecutionError, match="engine is not running"):
        vncticket.issue(conn, "web1", pub, CONF, alive)


class QemuRefusal(libvirt.libvirtError):
    def get_error_message(self):
        return "internal error: unable to execute QEMU command 'set_password': Could not set password"


def test_a_console_without_password_authentication_is_named_with_the_way_out(conn, browser):
    """QEMU checks passwords only on a console that started with one (older salt-virt VNC consoles have none)."""

    def refuse(_xml, _flags):
        raise QemuRefusal("set_password")

    conn.lookupByName("web1").updateDeviceFlags = refuse
    with pytest.raises(CommandExecutionError) as exc:
        vncticket.issue(conn, "web1", browser[1], CONF, None)
    assert str(exc.value) == (
        "web1's VNC console started without password authentication (defined by an older salt-virt): an operator "
        "gives it a new one (virt.update web1 graphics=none, then enable_vnc=True) and restarts it"
    )


def test_the_engine_spends_the_password_when_a_client_authenticates(conn, tmp_path):
    """:func:`vncticket._serve` (the engine's loop) on a graphics ``initialize`` event: a new password nobody
    was told, already expired. A client that only connected (not yet authenticated) or left queues nothing."""
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    alive = str(tmp_path / "alive")
    on_graphics = vncticket.graphics_callback(inbox)
    dom = conn.lookupByName("web1")
    for phase in (libvirt.VIR_DOMAIN_EVENT_GRAPHICS_CONNECT, libvirt.VIR_DOMAIN_EVENT_GRAPHICS_DISCONNECT):
        on_graphics(conn, dom, phase, {}, {}, "vnc", [], None)
    assert inbox.empty()
    assert vncticket.GRAPHICS_INITIALIZE == libvirt.VIR_DOMAIN_EVENT_GRAPHICS_INITIALIZE
    assert vncticket.EVENT_ID_GRAPHICS == libvirt.VIR_DOMAIN_EVENT_ID_GRAPHICS
    assert vncticket.AFFECT_LIVE == libvirt.VIR_DOMAIN_AFFECT_LIVE
    on_graphics(conn, dom, libvirt.VIR_DOMAIN_EVENT_GRAPHICS_INITIALIZE, {}, {}, "vnc", [], None)
    worker = threading.Thread(target=vncticket._serve, args=(conn, inbox, alive, stop))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not conn.doms.get("web1", Live(None, 0)).updates and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join()
    ((xml, _),) = conn.doms["web1"].updates
    assert len(xml.get("passwd")) == 8
    valid_to = time.mktime(time.strptime(xml.get("passwdValidTo"), "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert valid_to <= time.time() + 1
    assert vncticket.fresh(alive)


def test_settings_are_the_operators_and_plain_websocket_is_an_opt_in():
    def get(conf):
        return lambda key, default=None: conf if key == "virt:console" else default

    assert vncticket.settings(get(None), {"fqdn": "hv1.lab"}) == {"address": "hv1.lab", "lifetime": 60, "tls": True}
    plain = vncticket.settings(get({"address": "10.0.0.5", "lifetime": 30, "insecure_plain_websocket": True}))
    assert plain == {"address": "10.0.0.5", "lifetime": 30, "tls": False}
    with pytest.raises(SaltInvocationError, match="virt:console:lifetime"):
        vncticket.settings(get({"lifetime": 3600}))
    with pytest.raises(SaltInvocationError, match="virt:console:address must be an IP address or a host name"):
        vncticket.settings(get({"address": "<b>x</b>"}))
