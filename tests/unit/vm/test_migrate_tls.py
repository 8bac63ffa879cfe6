"""saltvirt.vm.migrate_tls: what a migration encrypts (the libvirtd connection, QEMU's stream of memory and
disks) and the operator's opt-in for what it cannot (``virt:migration:allow_cleartext``, issue 34 #7);
the refusal comes before libvirt is asked (libvirt's test driver cannot migrate: flags are checked)."""

import libvirt
import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.vm import migrate, migrate_tls

REFUSED = "in clear: refused. Keep transport tls"


@pytest.fixture
def qemu_dir(tmp_path):
    """QEMU's TLS directory as the virt.keys state writes it with qemu: True (the client side)."""
    folder = tmp_path / "qemu"
    folder.mkdir()
    for name in migrate_tls.QEMU_CLIENT_FILES:
        (folder / name).write_text("x")
    return str(folder)


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
    assert migrate_tls.choose_transport(target_uri="qemu+tls://hv2/system") == (None, [])
    with pytest.raises(SaltInvocationError, match="transport must be one of"):
        migrate_tls.choose_transport("ssh")


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


def test_migrate_asks_libvirt_for_qemus_tls_and_refuses_clear_before_it(test_conn, qemu_dir, tmp_path, monkeypatch):
    """``migrate.migrate`` of a running VM: without QEMU's certificates and without the opt-in it is refused
    before libvirt is asked; with them libvirt gets VIR_MIGRATE_TLS (its test driver cannot migrate: the
    call fails there, after the flags were chosen, which a spy on the real call records)."""
    xml = "<domain type='test'><name>mt</name><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>"
    test_conn.defineXML(xml).create()
    asked = []
    real = libvirt.virDomain.migrateToURI3

    def spy(dom, uri, params, flags):
        asked.append(flags)
        return real(dom, uri, params, flags)

    monkeypatch.setattr(libvirt.virDomain, "migrateToURI3", spy)
    uri = "qemu+tls://hv2/system"
    with pytest.raises(CommandExecutionError, match=REFUSED):
        migrate.migrate(test_conn, "mt", "hv2", target_uri=uri, qemu_tls_dir=str(tmp_path))
    assert asked == []
    with pytest.raises(CommandExecutionError, match="migrating VM 'mt' from .* to hv2 failed"):
        migrate.migrate(test_conn, "mt", "hv2", target_uri=uri, qemu_tls_dir=qemu_dir)
    assert len(asked) == 1 and asked[0] & libvirt.VIR_MIGRATE_TLS
    with pytest.raises(CommandExecutionError, match="migrating VM 'mt' from .* to hv2 failed"):
        migrate.migrate(test_conn, "mt", "hv2", target_uri=uri, qemu_tls_dir=str(tmp_path), allow_cleartext=True)
    assert len(asked) == 2 and not asked[1] & libvirt.VIR_MIGRATE_TLS  # allowed in clear: no TLS asked for
