"""salt-virt.example.sls: renders for Debian and RedHat grains (state.show_sls on real minions); its
package, config and keys parts apply for real on this machine (config into temp copies, keys into a
temp PKI dir), idempotently; the service and bridge parts (no systemd here, and the host's network
must not change) run in test=True only."""

import json
import os
import pathlib
import shutil
import tempfile

import pytest

from tests.support.paths import ROOT
from tests.support.saltd import start_minion

REAL_PARTS = {
    "salt-virt-packages",
    "salt-virt-refresh-grains",
    "salt-virt-libvirtd-listen",
    "salt-virt-libvirtd-args",
    "salt-virt-keys",
}


@pytest.fixture(scope="module")
def hypervisor_sls(state_tree):
    shutil.copyfile(ROOT / "salt-virt.example.sls", state_tree / "hypervisor.sls")
    return "hypervisor"


@pytest.fixture(scope="module")
def redhat_minion(salt_master):
    factory = start_minion(salt_master, "rh1", {"grains": {"os_family": "RedHat", "os": "Rocky", "init": "systemd"}})
    with factory.started():
        yield factory


def states_by_id(data):
    assert isinstance(data, dict), data
    return {v["__id__"]: v for v in data.values()}


def arg(rendered, state_id, key):
    """The value of ``key`` among a rendered (show_sls) state's arguments."""
    (fun,) = [k for k in rendered[state_id] if not k.startswith("__")]
    return next(a[key] for a in rendered[state_id][fun] if isinstance(a, dict) and key in a)


def test_renders_for_debian_and_redhat(salt_cli, hyper1, redhat_minion, hypervisor_sls):
    deb = salt_cli.run("state.show_sls", hypervisor_sls, minion_tgt="hyper1").data
    rh = salt_cli.run("state.show_sls", hypervisor_sls, minion_tgt="rh1").data
    assert isinstance(deb, dict) and isinstance(rh, dict), (deb, rh)
    assert {"libvirt-daemon-system", "libvirt-clients", "qemu-system-x86", "qemu-utils", "python3-libvirt"} <= set(
        arg(deb, "salt-virt-packages", "pkgs")
    )
    assert {"libvirt", "qemu-kvm", "qemu-img", "python3-libvirt"} <= set(arg(rh, "salt-virt-packages", "pkgs"))
    for rendered in (deb, rh):
        assert {"salt-virt-keys", "salt-virt-libvirtd-listen", "salt-virt-libvirtd", "salt-virt-bridge"} <= set(
            rendered
        )
        assert (
            arg(rendered, "salt-virt-keys", "basepath") == "/etc/pki"
            and arg(rendered, "salt-virt-keys", "qemu") is True
        )
        assert arg(rendered, "salt-virt-libvirtd-listen", "key_values")["listen_tls"] == "1"
        assert arg(rendered, "salt-virt-bridge", "unless") == "ip link show br0"
    # systemd (the RedHat minion): socket activation for TLS; without systemd (this host): --listen
    assert "salt-virt-libvirtd-tls-socket" in rh and "salt-virt-libvirtd-args" not in rh
    assert "salt-virt-libvirtd-args" in deb and arg(deb, "salt-virt-libvirtd-args", "name") == "/etc/default/libvirtd"
    assert "salt-virt-libvirtd-tls-socket" not in deb


def test_packages_config_and_keys_apply_for_real(salt_cli, hyper1, hypervisor_sls):
    tmp = tempfile.mkdtemp(prefix="svsls-", dir="/var/tmp")
    try:
        conf, defaults = os.path.join(tmp, "libvirtd.conf"), os.path.join(tmp, "libvirtd.default")
        shutil.copyfile("/etc/libvirt/libvirtd.conf", conf)
        shutil.copyfile("/etc/default/libvirtd", defaults)
        pillar = {
            "salt_virt": {
                "libvirtd_conf": conf,
                "libvirtd_defaults": defaults,
                "pki_basepath": os.path.join(tmp, "pki"),
                "manage_service": False,
            }
        }

        def apply(**extra):
            cmd = ["state.sls", hypervisor_sls, f"pillar={json.dumps(pillar)}", 'exclude=[{"id": "salt-virt-bridge"}]']
            return states_by_id(
                salt_cli.run(*cmd, *[f"{k}={v}" for k, v in extra.items()], minion_tgt="hyper1", _timeout=600).data
            )

        states = apply()
        assert all(s["result"] is True for s in states.values()), {k: s["comment"] for k, s in states.items()}
        assert set(states) == REAL_PARTS
        text = pathlib.Path(conf).read_text()
        assert (
            "\nlisten_tls = 1" in text and "\nlisten_tcp = 0" in text and f'ca_file = "{tmp}/pki/CA/cacert.pem"' in text
        )
        # virt.keys: the CRL and only hypervisor client certificates admitted
        assert f'\ncrl_file = "{tmp}/pki/CA/cacrl.pem"' in text and os.path.exists(f"{tmp}/pki/CA/cacrl.pem")
        assert '\ntls_allowed_dn_list = ["O=salt-virt,CN=* libvirt client"]' in text
        assert 'LIBVIRTD_ARGS="--listen"' in pathlib.Path(defaults).read_text()
        for path, mode in (
            ("CA/cacert.pem", 0o644),
            ("libvirt/servercert.pem", 0o644),
            ("libvirt/private/serverkey.pem", 0o600),
            ("qemu/server-key.pem", 0o640),  # QEMU's own pair: migrations encrypt memory and disks
            ("qemu/client-cert.pem", 0o644),
        ):
            assert oct(os.stat(os.path.join(tmp, "pki", path)).st_mode & 0o777) == oct(mode), path
        assert {k: s["changes"] for k, s in apply().items() if s["changes"]} == {}  # idempotent

        pillar["salt_virt"]["manage_service"] = True
        preview = states_by_id(
            salt_cli.run(
                "state.sls", hypervisor_sls, f"pillar={json.dumps(pillar)}", "test=True", minion_tgt="hyper1"
            ).data
        )
        assert set(preview) == REAL_PARTS | {"salt-virt-libvirtd", "salt-virt-bridge"}
        assert preview["salt-virt-bridge"]["result"] is None  # network part: test mode only
        assert all(preview[k]["result"] is True for k in REAL_PARTS)  # the applied parts stay as they are
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_lockspace_configures_libvirts_lock_manager(salt_cli, hyper1, hypervisor_sls):
    """pillar salt_virt:lockspace: qemu.conf's lock_manager and qemu-lockd.conf's disk leases in that
    directory, applied for real into temp copies (tests/integration/test_lockspace.py shows what it does:
    QEMU refuses a disk another host holds); the virtlockd service only in test mode (no systemd here)."""
    tmp = tempfile.mkdtemp(prefix="svsls-", dir="/var/tmp")
    try:
        qemu, lockd = os.path.join(tmp, "qemu.conf"), os.path.join(tmp, "qemu-lockd.conf")
        shutil.copyfile("/etc/libvirt/qemu.conf", qemu)
        shutil.copyfile("/etc/libvirt/qemu-lockd.conf", lockd)
        pillar = {
            "salt_virt": {
                "lockspace": os.path.join(tmp, "shared", ".lockspace"),
                "qemu_conf": qemu,
                "qemu_lockd_conf": lockd,
                "manage_service": False,
            }
        }
        parts = ["salt-virt-lockspace", "salt-virt-lockd", "salt-virt-lock-manager"]

        def apply():
            out = {}
            for part in parts:  # each with its requisites (the package, the directory)
                cmd = ["state.sls_id", part, hypervisor_sls, f"pillar={json.dumps(pillar)}"]
                out.update(states_by_id(salt_cli.run(*cmd, minion_tgt="hyper1", _timeout=600).data))
            return {k: v for k, v in out.items() if k in parts}

        states = apply()
        assert set(states) == set(parts) and all(s["result"] is True for s in states.values()), states
        assert '\nlock_manager = "lockd"' in pathlib.Path(qemu).read_text()
        text = pathlib.Path(lockd).read_text()
        assert "\nauto_disk_leases = 1" in text and "\nrequire_lease_for_disks = 1" in text
        assert f'\nfile_lockspace_dir = "{tmp}/shared/.lockspace"' in text
        assert oct(os.stat(os.path.join(tmp, "shared", ".lockspace")).st_mode & 0o777) == "0o700"
        assert {k: s["changes"] for k, s in apply().items() if s["changes"]} == {}  # idempotent
        pillar["salt_virt"]["manage_service"] = True
        shown = salt_cli.run("state.show_sls", hypervisor_sls, f"pillar={json.dumps(pillar)}", minion_tgt="hyper1")
        assert arg(shown.data, "salt-virt-virtlockd", "name") == "virtlockd", shown.data
        watched = arg(shown.data, "salt-virt-libvirtd", "watch")
        assert {"file": "salt-virt-lock-manager"} in watched, watched
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
