"""salt-virt.example.sls (which includes the salt-virt formula, salt-virt/): renders for Debian, RedHat
(EL 9: the modular daemons) and Suse grains (state.show_sls on real minions), with pillar salt_virt:lookup
over the map; its package, config and keys parts apply for real on this machine (config into temp copies,
keys into a temp PKI dir), idempotently; the service and bridge parts (no systemd here, and the host's
network must not change) run in test=True only.

saltstack-formulas/libvirt-formula (tests/data/libvirt-formula) with salt-virt: applied twice on hyper1, the
second run changes nothing, and a lab libvirtd with what it wrote takes TLS clients as salt-virt's PKI says."""

import json
import os
import pathlib
import shutil
import tempfile

import pytest

from saltvirt.pki import ca as pki
from tests.support import lab, pkitools
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


# the grains the minion rh1 (systemd) renders with: it starts as el9, then takes the others in turn (show_as);
# hyper1 renders with its own (Debian, no systemd)
OSES = {
    "el9": {"os_family": "RedHat", "os": "Rocky", "osfullname": "Rocky Linux", "osrelease": "9.4", "osmajorrelease": 9},
    "tumbleweed": {
        "os_family": "Suse",
        "os": "SUSE",
        "osfullname": "Tumbleweed",
        "osrelease": "20250101",
        "osmajorrelease": 20250101,
    },
    "sles15sp5": {"os_family": "Suse", "os": "SUSE", "osfullname": "SLES", "osrelease": "15.5", "osmajorrelease": 15},
}
MODULAR = ["virtqemud", "virtlogd", "virtnetworkd", "virtstoraged", "virtsecretd", "virtnodedevd"]


def grains_file(minion):
    return pathlib.Path(minion.config["conf_file"]).parent / "grains"


@pytest.fixture(scope="module")
def other_os_minion(salt_master):
    """Grains in its config override every other source: only init is set there, the OS comes from its grains
    file (el9 from its start on)."""
    factory = start_minion(salt_master, "rh1", {"grains": {"init": "systemd"}})
    grains_file(factory).write_text(json.dumps(OSES["el9"]))  # JSON is YAML
    with factory.started():
        yield factory


def show(salt_cli, minion_id, sls, pillar=None):
    cmd = ["state.show_sls", sls, *([f"pillar={json.dumps(pillar)}"] if pillar else [])]
    rendered = salt_cli.run(*cmd, minion_tgt=minion_id).data
    assert isinstance(rendered, dict), rendered
    return rendered


def show_as(salt_cli, minion, grains, sls):
    """state.show_sls on ``minion`` once it has taken ``grains``: its grains file, then a module refresh (which
    reloads the grains) that the call waits for."""
    grains_file(minion).write_text(json.dumps(grains))
    assert salt_cli.run("saltutil.refresh_modules", "async=False", minion_tgt=minion.id).data is True
    return show(salt_cli, minion.id, sls)


def states_by_id(data):
    assert isinstance(data, dict), data
    return {v["__id__"]: v for v in data.values()}


def arg(rendered, state_id, key):
    """The value of ``key`` among a rendered (show_sls) state's arguments."""
    (fun,) = [k for k in rendered[state_id] if not k.startswith("__")]
    return next(a[key] for a in rendered[state_id][fun] if isinstance(a, dict) and key in a)


def test_renders_per_os_family(salt_cli, hyper1, other_os_minion, hypervisor_sls):
    rendered = {"debian": show(salt_cli, "hyper1", hypervisor_sls), "el9": show(salt_cli, "rh1", hypervisor_sls)}
    for name in ("tumbleweed", "sles15sp5"):
        rendered[name] = show_as(salt_cli, other_os_minion, OSES[name], hypervisor_sls)
    deb, el9, tw, sles = rendered["debian"], rendered["el9"], rendered["tumbleweed"], rendered["sles15sp5"]
    assert {"libvirt-daemon-system", "libvirt-clients", "qemu-system-x86", "qemu-utils", "python3-libvirt"} <= set(
        arg(deb, "salt-virt-packages", "pkgs")
    )
    assert {"libvirt", "libvirt-client", "qemu-kvm", "qemu-img", "python3-libvirt"} <= set(
        arg(el9, "salt-virt-packages", "pkgs")
    )
    for suse in (tw, sles):
        assert {"libvirt-daemon-qemu", "libvirt-client", "qemu-kvm", "qemu-tools", "python3-libvirt-python"} <= set(
            arg(suse, "salt-virt-packages", "pkgs")
        )
    for name, r in rendered.items():
        assert {"salt-virt-keys", "salt-virt-libvirtd-listen", "salt-virt-libvirtd", "salt-virt-bridge"} <= set(r), name
        assert arg(r, "salt-virt-keys", "basepath") == "/etc/pki" and arg(r, "salt-virt-keys", "qemu") is True
        assert arg(r, "salt-virt-libvirtd-listen", "key_values")["listen_tls"] == "1"
        assert arg(r, "salt-virt-libvirtd-listen", "name") == arg(r, "salt-virt-keys", "libvirtd_conf")
        assert arg(r, "salt-virt-bridge", "unless") == "ip link show br0"
    # the monolithic libvirtd (Debian, SLES 15 SP5), nothing of the modular daemons
    for r in (deb, sles):
        assert arg(r, "salt-virt-libvirtd", "name") == "libvirtd"
        assert arg(r, "salt-virt-libvirtd-listen", "name") == "/etc/libvirt/libvirtd.conf"
        assert not [k for k in r if k.startswith("salt-virt-virt") and k != "salt-virt-virtlockd"]
        assert "salt-virt-libvirtd-monolithic-off" not in r
    # the modular daemons (EL 9, Tumbleweed): virtproxyd listens for TLS, virtqemud and its peers run, the
    # monolithic libvirtd and its sockets are stopped and disabled
    for r in (el9, tw):
        assert arg(r, "salt-virt-libvirtd", "name") == "virtproxyd"
        assert arg(r, "salt-virt-libvirtd-tls-socket", "name") == "virtproxyd-tls.socket"
        assert arg(r, "salt-virt-libvirtd-listen", "name") == "/etc/libvirt/virtproxyd.conf"
        assert [arg(r, f"salt-virt-{d}", "name") for d in MODULAR] == MODULAR
        required = arg(r, "salt-virt-libvirtd", "require")
        assert [d for d in MODULAR if {"service": f"salt-virt-{d}"} not in required] == [], required
        off = arg(r, "salt-virt-libvirtd-monolithic-off", "names")
        assert {"libvirtd.service", "libvirtd.socket", "libvirtd-tls.socket"} <= set(off), off
    # systemd (rh1): socket activation for TLS; without systemd (this host): --listen
    assert arg(sles, "salt-virt-libvirtd-tls-socket", "name") == "libvirtd-tls.socket"
    assert not [r for r in (el9, tw, sles) if "salt-virt-libvirtd-args" in r]
    assert arg(deb, "salt-virt-libvirtd-args", "name") == "/etc/default/libvirtd"
    assert arg(deb, "salt-virt-libvirtd-args", "key_values") == {"LIBVIRTD_ARGS": '"--listen"'}
    assert "salt-virt-libvirtd-tls-socket" not in deb


def test_pillar_lookup_overrides_the_map(salt_cli, hyper1, hypervisor_sls):
    """salt_virt:lookup over map.jinja (here: the modular daemons on Debian, other packages); libvirtd_conf
    False: the daemon's config is another formula's (docs/install.md: libvirt-formula), left alone."""
    pillar = {"salt_virt": {"lookup": {"modular": True, "pkgs": ["libvirt-daemon-kvm"]}, "libvirtd_conf": False}}
    r = show(salt_cli, "hyper1", hypervisor_sls, pillar)
    assert arg(r, "salt-virt-packages", "pkgs") == ["libvirt-daemon-kvm"]
    assert arg(r, "salt-virt-libvirtd", "name") == "virtproxyd" and "salt-virt-virtqemud" in r
    assert arg(r, "salt-virt-libvirtd-args", "name") == "/etc/default/virtproxyd"  # no systemd here
    assert arg(r, "salt-virt-libvirtd-args", "key_values") == {"VIRTPROXYD_ARGS": '"--listen"'}
    assert "salt-virt-libvirtd-listen" not in r and arg(r, "salt-virt-keys", "libvirtd_conf") is False


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


# saltstack-formulas/libvirt-formula v3.10.0, vendored unchanged (tests/data/libvirt-formula/README.md), beside
# salt-virt: its server config and TLS parts as a hypervisor's highstate applies them, adapted only where this
# lab cannot follow
LIBVIRT_FORMULA = ROOT / "tests" / "data" / "libvirt-formula" / "libvirt"
LIBVIRT_FORMULA_SLS = """\
include:
  - libvirt.server.config   # libvirtd.conf from the pillar libvirt:libvirtd, the daemon's defaults file, the package
  - libvirt.server.tls      # virt.keys (salt-virt's), after libvirt.python (the bindings' package)

# no systemd here, and the host's libvirtd must not start. Salt drops excluded IDs after it turned requisite_in into
# requisites, so the formula's watch_in to this one goes with it
exclude:
  - id: libvirt-server-service-running-service-running

# the keys in a temp dir, not the host's /etc/pki (the default; the lab's libvirtd sees this dir there)
extend:
  libvirt-server-tls-certs-virt-keys:
    virt.keys:
      - basepath: {{ pillar['libvirt_formula_lab']['pki'] }}
"""
LIBVIRT_FORMULA_STATES = {
    "libvirt-server-package-install-pkg-installed",  # libvirt-daemon-system: installed here
    "libvirt-python-install-pkg-installed",  # python3-libvirt: installed here
    "libvirt-server-config-files-libvirtd-file-managed",
    "libvirt-server-config-files-daemonconfig-dir-managed",
    "libvirt-server-config-files-daemonconfig-file-managed",
    "libvirt-server-tls-certs-virt-keys",
}
ALLOWED_DN = '["O=salt-virt,CN=* libvirt client"]'  # the libvirt ext_pillar's libvirt:libvirtd:tls_allowed_dn_list


@pytest.fixture(scope="module")
def libvirt_formula_sls(state_tree, salt_run_cli):
    """salt://libvirt/ is the vendored formula, salt://libvirt_formula_lab.sls the test's wrapper."""
    shutil.copytree(LIBVIRT_FORMULA, state_tree / "libvirt")
    (state_tree / "libvirt_formula_lab.sls").write_text(LIBVIRT_FORMULA_SLS)
    # file.managed looks the formula's TOFS sources up in the master's file list, cached for 20 s
    assert salt_run_cli.run("fileserver.clear_file_list_cache", "backend=roots").returncode == 0
    yield "libvirt_formula_lab"
    shutil.rmtree(state_tree / "libvirt", ignore_errors=True)
    (state_tree / "libvirt_formula_lab.sls").unlink()


def test_libvirt_formula_converges_beside_salt_virt_and_its_libvirtd_admits_only_hypervisors(
    salt_cli, salt_master, hyper1, libvirt_formula_sls, lab_dir, tmp_path
):
    """libvirt-formula applied twice on hyper1: libvirtd.conf written from its template with the CRL and the
    client allow list the libvirt ext_pillar adds to libvirt:libvirtd, the keys by virt.keys; the second run
    changes nothing (issue 36: the formula rewrote the file, virt.keys edited it, every run). A real libvirtd with
    that libvirtd.conf and those keys admits hyper1's client certificate over TLS and refuses one of the same CA
    outside the allow list and a revoked one."""
    tmp = tempfile.mkdtemp(prefix="svlvf-", dir="/var/tmp")
    os.chmod(tmp, 0o755)
    conf, keys = os.path.join(tmp, "libvirtd.conf"), os.path.join(tmp, "pki")
    # hyper1's client certificate now, then reissued: the CRL virt.keys writes lists it (reused while valid)
    ca_dir = os.path.join(salt_master.config["pki_dir"], "libvirt")
    revoked = pki.issue(ca_dir, "hyper1", "client", key_size=2048)
    pki.issue(ca_dir, "hyper1", "client", key_size=2048, force=True)
    (tmp_path / "revoked.pem").write_text(revoked["cert"])
    (tmp_path / "revoked.key").write_text(revoked["key"])
    # the formula's own lookup points its files at temp paths; merged with the ext_pillar's libvirt:libvirtd
    pillar = {
        "libvirt": {
            "lookup": {"libvirtd_config": conf, "daemon_config_path": os.path.join(tmp, "default")},
            "libvirtd": {"listen_tls": 1},
        },
        "libvirt_formula_lab": {"pki": keys},
    }

    def apply():
        cmd = ["state.apply", libvirt_formula_sls, f"pillar={json.dumps(pillar)}"]
        states = states_by_id(salt_cli.run(*cmd, minion_tgt="hyper1", _timeout=600).data)
        assert set(states) == LIBVIRT_FORMULA_STATES, sorted(states)  # the service excluded, nothing else
        assert all(s["result"] is True for s in states.values()), {k: s["comment"] for k, s in states.items()}
        return states

    fab = hv = None
    try:
        first = apply()
        written = pathlib.Path(conf).read_text()
        assert written.startswith("# This file is managed by Salt")  # the formula's template
        assert "\nlisten_tls = 1\n" in written
        assert '\ncrl_file = "/etc/pki/CA/cacrl.pem"\n' in written  # the ext_pillar's basepath: the default
        assert f"\ntls_allowed_dn_list = {ALLOWED_DN}\n" in written
        keyed = first["libvirt-server-tls-certs-virt-keys"]["changes"]
        assert os.path.join(keys, "CA", "cacrl.pem") in keyed and conf not in keyed  # virt.keys leaves the file alone
        assert os.path.isfile(os.path.join(tmp, "default", "libvirtd"))  # the daemon's defaults file
        before = os.stat(conf)

        second = apply()
        assert {k: s["changes"] for k, s in second.items()} == dict.fromkeys(LIBVIRT_FORMULA_STATES, {})
        after = os.stat(conf)
        assert pathlib.Path(conf).read_text() == written and after.st_mtime_ns == before.st_mtime_ns

        # libvirtd with that libvirtd.conf (after the lab's own lines: listen, log, host UUID) and the keys at
        # /etc/pki, where the conf's crl_file and libvirtd's default certificate paths look. libvirtd starts as well
        # when crl_file names no file (9.0 here): only the revoked certificate's refusal shows the CRL is read
        fab = lab.Fabric(lab.new_tag()).start()
        hv = lab.Hypervisor(
            os.path.join(lab_dir, "libvirt-formula"),
            1,  # 10.252.0.11: a SAN of hyper1's server certificate (extra_sans)
            fab,
            tls_dir="/etc/pki",
            extra_libvirtd_conf=written,
            etc_pki=keys,
        )
        hv.start()
        server_log = pkitools.LogTail(hv.path("log", "libvirtd.log")).new
        cacert = os.path.join(keys, "CA", "cacert.pem")
        ours = pkitools.hypervisor_client_dir(str(tmp_path / "ours"), keys)
        ok = pkitools.virsh_tls(fab.netns, hv.ip, ours)
        assert ok.returncode == 0 and ok.stdout.strip() == "hv1", ok.stderr
        server_log()
        # our CA, a CN outside the allow list
        rogue = pkitools.client_dir(str(tmp_path / "rogue"), cacert, *pkitools.rogue_client(tmp_path, ca_dir))
        refused = pkitools.virsh_tls(fab.netns, hv.ip, rogue)
        assert refused.returncode != 0, refused.stdout
        log = server_log()
        assert "tls_allowed_dn_list" in log, f"refused for another reason: {log}"
        # hyper1's previous client certificate: in the allow list, but revoked
        old = pkitools.client_dir(
            str(tmp_path / "revoked"), cacert, str(tmp_path / "revoked.pem"), str(tmp_path / "revoked.key")
        )
        refused = pkitools.virsh_tls(fab.netns, hv.ip, old)
        assert refused.returncode != 0, refused.stdout
        log = server_log()
        assert "revoked" in log.lower(), f"refused for another reason: {log}"
    finally:
        if hv:
            hv.stop()
        if fab:
            fab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
