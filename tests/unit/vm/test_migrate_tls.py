"""saltvirt.vm.migrate_tls: what a migration encrypts (the libvirtd connection, QEMU's stream of memory and
disks) and the operator's opt-in for what it cannot (``virt:migration:allow_cleartext``, issue 34 #7);
the refusal comes before libvirt is asked (libvirt's test driver cannot migrate: flags are checked)."""

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.vm import migrate, migrate_tls
from tests.support.saltloader import make_minion_mods

REFUSED = "in clear: refused. Keep transport tls"
QUERY_REFUSED = (
    r"^virt\.migrate target URI must be qemu\+tls://<host>/system or qemu\+tcp://<host>/system with no user, "
    r"query or fragment \(transport options come from the operator's virt:migration config\)$"
)


@pytest.fixture
def migrations(monkeypatch):
    """What libvirt was asked: ``(uri, flags)`` of every ``migrateToURI3`` (the real call follows: libvirt's
    test driver cannot migrate, so it fails there, after the URI and flags were chosen)."""
    asked = []
    real = libvirt.virDomain.migrateToURI3

    def spy(dom, uri, params, flags):
        asked.append((uri, flags))
        return real(dom, uri, params, flags)

    monkeypatch.setattr(libvirt.virDomain, "migrateToURI3", spy)
    return asked


def _files(folder, names):
    folder.mkdir()
    for name in names:
        (folder / name).write_text("x")
    return str(folder)


@pytest.fixture
def qemu_dir(tmp_path):
    """QEMU's TLS directory as the virt.keys state writes it with qemu: True (the client side)."""
    return _files(tmp_path / "qemu", migrate_tls.QEMU_CLIENT_FILES)


@pytest.fixture
def pki(tmp_path):
    """A ``virt:migration:pkipath`` directory: libvirt's TLS client files (cacert, clientcert, clientkey)."""
    return _files(tmp_path / "pki dir", migrate_tls.DEFAULT_PKI)


def test_transport_is_tls_unless_tcp_is_named(tmp_path):
    """TLS by default; plaintext only by name and with a warning; TLS without the client files is
    refused before anything moves."""
    with pytest.raises(CommandExecutionError, match="virt.keys") as exc:
        migrate_tls.choose_transport(pkipath=str(tmp_path))
    assert "transport=tcp" in str(exc.value) and str(tmp_path / "clientkey.pem") in str(exc.value)
    assert "virt:migration:allow_cleartext: True" in str(exc.value)
    for name in migrate_tls.DEFAULT_PKI:
        (tmp_path / name).write_text("x")
    assert migrate_tls.choose_transport(pkipath=str(tmp_path)) == ("tls", [])
    transport, warnings = migrate_tls.choose_transport("tcp", pkipath=str(tmp_path))
    assert transport == "tcp" and "plaintext" in warnings[0]
    assert migrate_tls.choose_transport(target_uri="qemu+tcp://hv2/system")[1] == [migrate_tls.PLAINTEXT_WARNING]
    assert migrate_tls.choose_transport(pkipath=str(tmp_path), target_uri="qemu+tls://hv2/system") == (None, [])
    with pytest.raises(SaltInvocationError, match="transport must be one of"):
        migrate_tls.choose_transport("ssh")


def test_a_tls_target_uri_needs_the_operators_client_files_too(tmp_path, pki):
    """Salt's ``virt.migrate web1 qemu+tls://hv2/system`` is TLS as ``transport=tls`` is: refused before anything
    moves when the client files of ``virt:migration:pkipath`` (else libvirt's defaults) are missing."""
    for pkipath in (str(tmp_path / "empty"), None):
        with pytest.raises(CommandExecutionError, match="needs this host's libvirt client certificate") as exc:
            migrate_tls.choose_transport("tls", pkipath, "qemu+tls://hv2/system")
        want = migrate_tls.tls_missing(pkipath)
        assert want and f"{', '.join(want)} missing" in str(exc.value)
    assert migrate_tls.choose_transport(None, pki, "qemu+tls://hv2/system") == (None, [])
    # no TLS, no client files: qemu+tcp (plaintext: warned, and streams() wants the opt-in) and qemu+ssh
    assert migrate_tls.choose_transport(None, None, "qemu+tcp://hv2/system") == (None, [migrate_tls.PLAINTEXT_WARNING])
    assert migrate_tls.choose_transport(None, None, "qemu+ssh://hv2/system") == (None, [])


@pytest.mark.parametrize(
    ("uri", "want"),
    [
        ("qemu+tls://hv2/system", "qemu+tls://hv2/system?pkipath=/etc/pki/libvirt%20migrate"),
        ("qemu+tls://hv2:16600/system/", "qemu+tls://hv2:16600/system/?pkipath=/etc/pki/libvirt%20migrate"),
        ("qemu+tls://[fd00::2]/system", "qemu+tls://[fd00::2]/system?pkipath=/etc/pki/libvirt%20migrate"),
        # a pkipath= of its own that is the operator's: kept, written as the operator's
        ("qemu+tls://hv2/system?pkipath=/etc/pki/libvirt%20migrate", None),
        ("qemu+tls://hv2/system?PKIPATH=%2Fetc%2Fpki%2Flibvirt%20migrate", None),
        # no TLS: no client certificate, the URI as given
        ("qemu+tcp://hv2/system", "qemu+tcp://hv2/system"),
        ("qemu+ssh://hv2/system", "qemu+ssh://hv2/system"),
    ],
)
def test_operator_uri_gives_a_tls_uri_the_operators_pkipath(uri, want):
    pkipath = "/etc/pki/libvirt migrate"
    want = want or "qemu+tls://hv2/system?pkipath=/etc/pki/libvirt%20migrate"
    assert migrate_tls.operator_uri(uri, pkipath) == want
    assert migrate_tls.operator_uri(want, pkipath) == want  # once is enough
    if uri == "qemu+tls://hv2/system":  # exactly what transport=tls gives for the host name
        assert want == migrate.destination_uri("hv2", transport="tls", pkipath=pkipath)
    if "?" not in uri:  # without virt:migration:pkipath, libvirt's defaults: the URI as given
        assert migrate_tls.operator_uri(uri, None) == uri


@pytest.mark.parametrize(
    ("uri", "pkipath"),
    [
        ("qemu+tls://hv2/system?pkipath=/root", "/etc/pki/x"),  # another directory than the operator's
        ("qemu+tls://hv2/system?pkipath=/root", None),  # the operator set none: libvirt's defaults
        ("qemu+tls://hv2/system?pkipath=/etc/pki/x/", "/etc/pki/x"),  # not the same string
        ("qemu+tls://hv2/system?pKiPaTh=%2Froot", "/etc/pki/x"),  # libvirt reads it so
        ("qemu+tls://hv2/system?pkipath=/etc/pki/x&pkipath=/root", "/etc/pki/x"),
        ("qemu+tls://hv2/system?pkipath=/etc/pki/x;pkipath=/root", "/etc/pki/x"),  # libvirt splits at ; too
        ("qemu+tls://hv2/system?pkipath=/etc/pki/x&no_verify=1", "/etc/pki/x"),
        ("qemu+tls://hv2/system?pkipath", "/etc/pki/x"),
        ("qemu+tcp://hv2/system?socket=/run/libvirt/libvirt-sock", "/etc/pki/x"),
        ("qemu+ssh://hv2/system?keyfile=/root/.ssh/id_ed25519", "/etc/pki/x"),
    ],
)
def test_operator_uri_refuses_a_callers_query(uri, pkipath):
    """What the caller's URI would have libvirtd read (as root) is the operator's to say: refused in
    ``conn.peer_uri``'s words, naming neither the caller's path nor the operator's."""
    with pytest.raises(SaltInvocationError, match=QUERY_REFUSED) as exc:
        migrate_tls.operator_uri(uri, pkipath)
    assert "/root" not in str(exc.value) and "/etc/pki/x" not in str(exc.value)


def test_salts_uri_form_migrates_with_the_operators_pkipath(tmp_path, pki, qemu_dir, migrations):
    """Issue #36: ``virt.migrate NAME qemu+tls://HOST/system`` (Salt's form, as Salt's own test calls it) reaches
    libvirt with ``virt:migration:pkipath``, as ``transport=tls`` does; its missing client files are refused
    before libvirt is asked (naming the pkipath's files, not /etc/pki's); a caller's pkipath= is refused, and
    qemu+tcp stays as given (libvirt's test driver cannot migrate: a spy on the real call records the URI)."""
    migration = {"pkipath": pki, "qemu_tls_dir": qemu_dir, "allow_cleartext": True}
    mods = make_minion_mods(tmp_path, "test:///default", migration=migration)
    failed = r"migrating VM 'test' from .* to hv2 failed: .* VM 'test' is still running"
    with pytest.raises(CommandExecutionError, match=failed):
        mods["virt.migrate"]("test", "qemu+tls://hv2/system")
    with pytest.raises(CommandExecutionError, match=failed):
        mods["virt.migrate"]("test", "hv2", transport="tls")
    with pytest.raises(CommandExecutionError, match=failed):
        mods["virt.migrate"]("test", "qemu+tcp://hv2/system")
    pkiq = "pkipath=" + pki.replace(" ", "%20")
    asked = [uri for uri, _flags in migrations]
    assert asked == [f"qemu+tls://hv2/system?{pkiq}", f"qemu+tls://hv2/system?{pkiq}", "qemu+tcp://hv2/system"]
    with pytest.raises(SaltInvocationError, match=r"^virt\.migrate target URI must be qemu\+tls://<host>/system or"):
        mods["virt.migrate"]("test", "qemu+tls://hv2/system?pkipath=/root")
    missing = str(tmp_path / "no-pki")
    mods = make_minion_mods(tmp_path, "test:///default", migration=dict(migration, pkipath=missing))
    with pytest.raises(CommandExecutionError, match=f"client certificate: {missing}/cacert.pem, "):
        mods["virt.migrate"]("test", "qemu+tls://hv2/system")
    assert len(migrations) == 3  # refused before libvirt was asked


@pytest.mark.parametrize(
    ("active", "tunnel", "transport", "uri"),
    [
        (True, False, "tls", None),  # the default: QEMU's TLS on the direct stream
        (True, True, "tls", None),  # tunnelled through the TLS libvirtd connection
        (False, False, "tls", None),  # offline: the definition only, over the TLS connection
        (True, False, None, "qemu+tls://hv2/system"),
    ],
)
def test_encrypted_migrations_need_no_opt_in(qemu_dir, active, tunnel, transport, uri):
    on, warnings = migrate_tls.streams(active, tunnel, transport, uri, None, qemu_dir)
    assert on is (active and not tunnel) and warnings == []


@pytest.mark.parametrize(
    ("active", "tunnel", "transport", "uri", "qemu_tls", "what"),
    [
        (True, False, "tls", None, None, r"the VM's memory and disks \(QEMU's stream: .*client-key.pem missing\)"),
        (True, False, "tls", None, False, r"the VM's memory and disks \(QEMU's stream: virt:migration:qemu_tls is"),
        (True, True, "tcp", None, None, r"the libvirtd connection \(qemu\+tcp\) and the VM's memory \(tunnelled"),
        (False, False, "tcp", None, None, r"the libvirtd connection \(qemu\+tcp\)"),
        (True, False, None, "qemu+tcp://hv2/system", None, r"the libvirtd connection \(qemu\+tcp\) and the VM's"),
    ],
)
def test_anything_in_clear_needs_the_operators_opt_in(tmp_path, active, tunnel, transport, uri, qemu_tls, what):
    """Without QEMU's certificates (an empty directory), with qemu_tls False or a plaintext libvirtd
    connection: refused with the way to fix it, and allowed (with a warning for the VM's data) only with
    virt:migration:allow_cleartext."""
    empty = str(tmp_path)
    with pytest.raises(CommandExecutionError, match=f"would send {what}.* {REFUSED}") as refused:
        migrate_tls.streams(active, tunnel, transport, uri, qemu_tls, empty)
    assert "virt.keys state with qemu: True" in str(refused.value)
    assert "set virt:migration:allow_cleartext: True in this hypervisor's minion config" in str(refused.value)
    on, warnings = migrate_tls.streams(active, tunnel, transport, uri, qemu_tls, empty, allow_cleartext=True)
    assert on is False
    assert bool(warnings) is active and all("cleartext migration" in w for w in warnings)


def test_qemu_tls_true_without_its_files_is_refused_even_with_the_opt_in(tmp_path, qemu_dir):
    with pytest.raises(CommandExecutionError, match="qemu_tls is True, but QEMU's TLS files are missing"):
        migrate_tls.streams(True, False, "tls", None, True, str(tmp_path), allow_cleartext=True)
    assert migrate_tls.streams(True, False, "tcp", None, True, qemu_dir, allow_cleartext=True) == (True, [])
    assert migrate_tls.setting("auto") is None and migrate_tls.setting(None) is None
    assert migrate_tls.setting("no") is False and migrate_tls.setting(True) is True
    with pytest.raises(SaltInvocationError, match="virt:migration:qemu_tls_dir"):
        migrate_tls.streams(True, False, "tls", None, None, "relative/qemu")


def test_migrate_asks_libvirt_for_qemus_tls_and_refuses_clear_before_it(test_conn, qemu_dir, pki, tmp_path, migrations):
    """``migrate.migrate`` of a running VM: without QEMU's certificates and without the opt-in it is refused
    before libvirt is asked; with them libvirt gets VIR_MIGRATE_TLS (its test driver cannot migrate: the
    call fails there, after the flags were chosen, which a spy on the real call records)."""
    xml = "<domain type='test'><name>mt</name><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>"
    test_conn.defineXML(xml).create()
    uri = "qemu+tls://hv2/system"
    with pytest.raises(CommandExecutionError, match=REFUSED):
        migrate.migrate(test_conn, "mt", "hv2", target_uri=uri, pkipath=pki, qemu_tls_dir=str(tmp_path))
    assert migrations == []
    with pytest.raises(CommandExecutionError, match="migrating VM 'mt' from .* to hv2 failed"):
        migrate.migrate(test_conn, "mt", "hv2", target_uri=uri, pkipath=pki, qemu_tls_dir=qemu_dir)
    assert len(migrations) == 1 and migrations[0][1] & libvirt.VIR_MIGRATE_TLS
    with pytest.raises(CommandExecutionError, match="migrating VM 'mt' from .* to hv2 failed"):
        migrate.migrate(
            test_conn, "mt", "hv2", target_uri=uri, pkipath=pki, qemu_tls_dir=str(tmp_path), allow_cleartext=True
        )
    assert len(migrations) == 2 and not migrations[1][1] & libvirt.VIR_MIGRATE_TLS  # allowed in clear: no TLS


@pytest.mark.parametrize("uri", ["qemu+TCP://hv2/system", "Qemu+Tcp://hv2/system"])
def test_a_plaintext_uri_in_capitals_is_plaintext(tmp_path, qemu_dir, uri, monkeypatch):
    """libvirt reads a URI's transport in any case (``qemu+TCP://`` is TCP, in clear): so do the plaintext
    checks, and such a URI needs the operator's opt-in as ``qemu+tcp://`` does, before libvirt is asked."""
    asked = []
    monkeypatch.setattr(libvirt.virDomain, "migrateToURI3", lambda dom, uri, params, flags: asked.append(uri))
    assert migrate_tls.choose_transport(target_uri=uri) == (None, [migrate_tls.PLAINTEXT_WARNING])
    with pytest.raises(CommandExecutionError, match=r"would send the libvirtd connection \(qemu\+tcp\) in clear"):
        migrate_tls.streams(True, False, None, uri, None, qemu_dir)
    mods = make_minion_mods(tmp_path, "test:///default", migration={"qemu_tls_dir": qemu_dir})
    with pytest.raises(CommandExecutionError, match=REFUSED):
        mods["virt.migrate"]("test", uri)
    assert asked == []
