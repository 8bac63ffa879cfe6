"""saltvirt.host.conn: libvirt URIs come from the operator's configuration only (issue 23): a call picks a
configured connection by name, never passes a URI; peer URIs a call may give are qemu+tls/tcp only."""

import os
import re
import subprocess
import sys

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.host import conn as vconn
from tests.support.paths import ROOT
from tests.support.saltloader import make_minion_mods

# each of these reached libvirt.open as root before: a program run, a file read, another socket, root's keys
HOSTILE_URIS = [
    "qemu+ext:///system?command=/bin/touch",
    "test:///etc/shadow",
    "qemu+unix:///system?socket=/run/other.sock",
    "qemu+ssh://root@localhost/system?keyfile=/root/.ssh/id_rsa",
    "qemu:///system",
]


def _getter(conf):
    def get(key, default=None):
        node = conf
        for part in key.split(":")[1:]:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    return get


def test_no_connection_is_the_configured_uri():
    get = _getter({"connection": {"uri": "test:///default"}})
    assert vconn.resolve_uri(get) == "test:///default"
    assert vconn.resolve_uri(get, "test:///default") == "test:///default"  # Salt SLS naming the configured URI
    assert vconn.resolve_uri(_getter({})) is None  # libvirt's default


def test_a_configured_name_picks_its_uri():
    get = _getter({"connection": {"uri": "test:///default"}, "connections": {"session": "qemu:///session"}})
    assert vconn.resolve_uri(get, "session") == "qemu:///session"


@pytest.mark.parametrize("uri", HOSTILE_URIS)
def test_a_uri_from_a_call_is_refused_without_echoing_it(uri):
    get = _getter({"connection": {"uri": "test:///default"}, "connections": {"session": "qemu:///session"}})
    with pytest.raises(SaltInvocationError) as err:
        vconn.resolve_uri(get, uri)
    msg = str(err.value)
    assert msg == vconn.CONNECTION_REFUSED.format(names=": session"), msg
    assert uri not in msg and "shadow" not in msg and "keyfile" not in msg


def test_loader_module_refuses_a_uri_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    mods = make_minion_mods(tmp_path, "test:///default")
    for fun in ("virt.list_domains", "virt.node_info", "virt.pool_capabilities", "virt.list_snapshots"):
        with pytest.raises(SaltInvocationError, match="must name a libvirt connection the operator configured"):
            mods[fun](connection=f"qemu+ext:///system?command=/bin/touch%20{marker}")
    assert not marker.exists()
    with pytest.raises(SaltInvocationError, match="must name a libvirt connection") as err:
        mods["virt.list_domains"](connection="test:///etc/shadow")
    assert "root:" not in str(err.value)


def test_pillar_cannot_set_the_uri(tmp_path):
    """Pillar is written by callers (pillar authors): virt:connection from pillar is never read."""
    pillar = {"virt": {"connection": {"uri": "test:///etc/shadow"}, "connections": {"x": "test:///etc/hostname"}}}
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pillar": pillar})
    assert mods["config.get"]("virt:connections:x") == "test:///etc/hostname"  # the pillar is there ...
    assert "test" in mods["virt.list_domains"]()
    with pytest.raises(SaltInvocationError, match="must name a libvirt connection"):  # ... and not read
        mods["virt.list_domains"](connection="x")


def test_grains_cannot_set_operator_settings(tmp_path, default_uri):
    """Grains are written by callers too (a caller allowed ``grains.setval``): virt:* operator settings from a
    grain are never read (issue 34), only the minion config's."""
    marker = tmp_path / "ran"
    script = tmp_path / "hostile.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    hostile = f"qemu+ext:///system?command={script}"  # libvirt would run the script as the minion (root)
    grain = {"connection": {"uri": hostile, "open_timeout": 5}, "connections": {"x": hostile}}
    # no virt:connection in the minion config: libvirt's default connection, here the test driver
    default_uri.setenv(vconn.DEFAULT_URI_ENV, "test:///default")
    # grains.setval writes <conf_file's dir>/grains; local: as salt-call --local (no minion to refresh)
    local = {"conf_file": str(tmp_path / "minion"), "local": True}
    (tmp_path / "cache").mkdir()
    mods = make_minion_mods(tmp_path, None, connection={}, opts_extra=local)
    mods["grains.setval"]("virt", grain)
    assert mods["config.get"]("virt:connection:uri") == hostile  # the grain is there ...
    assert mods["virt.list_domains"]() == ["test"]  # ... and not read
    with pytest.raises(SaltInvocationError, match="must name a libvirt connection"):
        mods["virt.list_domains"](connection="x")
    assert not marker.exists()
    # the same key in the minion config is honoured, the grain beside it still ignored
    node = tmp_path / "node.xml"
    node.write_text(NODE_ONE_VM)
    mods = make_minion_mods(tmp_path, f"test://{node}", opts_extra=local)
    mods["grains.setval"]("virt", grain)
    assert mods["virt.list_domains"]() == ["from-opts"]
    assert not marker.exists()


def test_operator_settings_are_read_in_one_place():
    """Salt's ``config.get`` reads grains and pillar unless told otherwise: the minion side calls it only
    through ``salt_config``, so a new lookup cannot bring grains or pillar back."""
    calls = [
        str(path.relative_to(ROOT))
        for folder in ("_modules", "_states", "_engines", "_grains", "_utils")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in path.read_text().splitlines()
        if re.search(r"""["']config\.(get|option|merge)["']""", line)
    ]
    assert calls == ["_utils/saltvirt/host/conn.py"], calls


NODE_ONE_VM = """<node><cpu><mhz>2400</mhz><active>1</active><max>1</max><nodes>1</nodes><sockets>1</sockets>
<cores>1</cores><threads>1</threads></cpu><memory>1048576</memory>
<domain type='test'><name>from-opts</name><memory>65536</memory><os><type>hvm</type></os></domain></node>"""


@pytest.mark.parametrize(
    "uri",
    [
        "qemu+ext:///system?command=/bin/sh",
        "qemu+ssh://hv2/system",
        "qemu+tls://hv2/system?pkipath=/root",
        "qemu+tls://root@hv2/system",
        "qemu+tcp://hv2/session",
        "qemu+tls:///system",
        "qemu+tls://hv2/system\n",
    ],
)
def test_peer_uri_refusals(uri):
    with pytest.raises(SaltInvocationError, match=r"^target must be qemu\+tls://<host>/system or qemu\+tcp"):
        vconn.peer_uri(uri, "target")


def test_peer_uri_accepts_plain_remote_system_daemons():
    assert vconn.peer_uri("qemu+tls://hv2/system", "t") == "qemu+tls://hv2/system"
    assert vconn.peer_uri("qemu+tcp://[fd00::2]/system", "t") == "qemu+tcp://[fd00::2]/system"


def test_migrate_and_probe_refuse_a_hostile_peer_uri(tmp_path):
    marker = tmp_path / "ran"
    mods = make_minion_mods(tmp_path, "test:///default")
    with pytest.raises(SaltInvocationError, match="virt.migrate target URI must be"):
        mods["virt.migrate"]("test", "hv2", target_uri=f"qemu+ext:///system?command=/bin/touch%20{marker}")
    with pytest.raises(SaltInvocationError, match="virt.recovery_probe uri must be"):
        mods["virt.recovery_probe"]("hv2", uri=f"qemu+ext:///system?command=/bin/touch%20{marker}")
    assert not marker.exists()


def test_domain_lookups(test_conn):
    from salt.exceptions import CommandExecutionError

    test_conn.defineXML("<domain type='test'><name>web1</name><memory>8192</memory><os><type>hvm</type></os></domain>")
    assert vconn.lookup_domain(test_conn, "web1").name() == "web1"
    assert vconn.get_domain(test_conn, "web1").name() == "web1"
    assert vconn.domain_exists(test_conn, "web1")
    assert vconn.lookup_domain(test_conn, "nosuchvm") is None
    assert not vconn.domain_exists(test_conn, "nosuchvm")
    with pytest.raises(CommandExecutionError, match="^VM 'nosuchvm' is not defined on "):
        vconn.get_domain(test_conn, "nosuchvm")


@pytest.fixture
def default_uri(monkeypatch):
    """LIBVIRT_DEFAULT_URI unset and nothing exported yet (both restored afterwards)."""
    monkeypatch.delenv(vconn.DEFAULT_URI_ENV, raising=False)
    monkeypatch.setattr(vconn, "_exported", {"uri": None})
    return monkeypatch


def test_the_configured_uri_becomes_libvirts_default_connection(default_uri):
    """A client opening libvirt's default connection in the minion (Uyuni's virt_utils: libvirt.open())
    reaches the configured libvirtd."""
    import libvirt

    assert vconn.export_default_uri(_getter({"connection": {"uri": "test:///default"}})) == "test:///default"
    conn = libvirt.open()
    try:
        assert conn.getURI() == "test:///default" and "test" in [d.name() for d in conn.listAllDomains(0)]
    finally:
        conn.close()
    # the configuration changed: the value exported before follows it, or goes with it
    assert vconn.export_default_uri(_getter({"connection": {"uri": "test:///other"}})) == "test:///other"
    assert vconn.export_default_uri(_getter({})) is None
    assert vconn.DEFAULT_URI_ENV not in os.environ


def test_virt_connection_wins_over_an_inherited_default_uri(default_uri, caplog):
    """virt_utils pairs libvirt.open() with virt.get_xml: both must reach the same libvirtd."""
    default_uri.setenv(vconn.DEFAULT_URI_ENV, "qemu:///session")
    with caplog.at_level("INFO"):
        assert vconn.export_default_uri(_getter({"connection": {"uri": "test:///default"}})) == "test:///default"
    assert os.environ[vconn.DEFAULT_URI_ENV] == "test:///default"
    assert "replaced by virt:connection:uri" in caplog.text and "session" not in caplog.text
    # no URI configured: virt.* uses libvirt's default too, an inherited value is left as it is
    default_uri.setattr(vconn, "_exported", {"uri": None})
    default_uri.setenv(vconn.DEFAULT_URI_ENV, "qemu:///session")
    assert vconn.export_default_uri(_getter({})) is None
    assert os.environ[vconn.DEFAULT_URI_ENV] == "qemu:///session"


def test_loading_the_virt_module_exports_the_minion_configs_uri_not_pillars(default_uri, tmp_path):
    pillar = {"virt": {"connection": {"uri": "test:///etc/shadow"}}}
    make_minion_mods(tmp_path, "test:///default", opts_extra={"pillar": pillar})["virt.list_domains"]()
    assert os.environ[vconn.DEFAULT_URI_ENV] == "test:///default"


_BAD = {  # each violates libvirt's schema (an unknown element): a plain define drops it without a word
    "domain": "<domain type='test'><name>v1</name><memory>8192</memory><os><type>hvm</type></os><bogus/></domain>",
    "network": "<network><name>n1</name><bogus/></network>",
    "pool": "<pool type='dir'><name>p1</name><target><path>/srv/p1</path></target><bogus/></pool>",
}


@pytest.mark.parametrize("kind", sorted(_BAD))
def test_define_checks_libvirts_schema(test_conn, kind):
    """Issue 36 #2: defineXML without VIR_*_DEFINE_VALIDATE took XML libvirt's schema refuses."""
    import libvirt

    with pytest.raises(libvirt.libvirtError, match="(?s)failed to validate against schema.*extra content: bogus"):
        vconn.define(test_conn, kind, _BAD[kind])
    good = _BAD[kind].replace("<bogus/>", "")
    assert vconn.define(test_conn, kind, good).name() in ("v1", "n1", "p1")


def test_virt_define_xml_str_refuses_xml_against_the_schema(virt_test):
    with pytest.raises(CommandExecutionError, match="define VM 'v1': XML document failed to validate against schema"):
        virt_test["virt.define_xml_str"](_BAD["domain"])
    assert "v1" not in virt_test["virt.list_domains"]()


class _OldDriver:
    """A libvirtd without the schema check: the test driver asked with a flag it does not know answers with
    its real "unsupported flags" error (a driver that truly lacks the check cannot run here)."""

    def __init__(self, conn):
        self._conn = conn

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def defineXMLFlags(self, xml, flags):
        return self._conn.defineXMLFlags(xml, flags << 20)


def test_define_falls_back_when_the_driver_lacks_the_schema_check(test_conn):
    dom = vconn.define(_OldDriver(test_conn), "domain", _BAD["domain"])
    assert dom.name() == "v1" and "bogus" not in dom.XMLDesc(0)  # what the plain define does: dropped


def test_opts_config_answers_as_config_get(tmp_path):
    """Issue 40: ``opts_config`` reads the minion config itself (no loader call and YAML re-read per key: 28 of
    them made ~1 ms of every virt.init) and answers every key as ``salt_config``'s ``config.get`` does: nested,
    old flat spellings, Salt's defaults, a list or a numeric key on the way, grains and pillar never read."""
    pillar = {"virt": {"type": "kvm", "max_image_mib": 1}}
    mods = make_minion_mods(
        tmp_path,
        "test:///default",
        opts_extra={"pillar": pillar, "virt.tunnel": True, "virt.minion_install": {"url": "https://x"}},
        nic={"default": [{"name": "eth0", "type": "bridge"}]},
        disk={"7": {"size": 5}, 8: {"size": 6}},
        keepalive=False,
        image_sources=None,
    )
    keys = [
        "virt:connection:uri",
        "virt:connection:keepalive",
        "virt:connection:open_timeout",
        "virt:images",
        "virt:tunnel",  # Salt's default (False), before the old flat spelling
        "virt:minion_install:url",  # virt.minion_install holding {url}
        "virt:nic:default:0:name",  # through a list
        "virt:nic:default:name",  # a list's embedded mapping
        "virt:disk:7:size",
        "virt:disk:8:size",  # an int key, found by Salt's YAML re-read
        "virt:type",  # set only in pillar
        "virt:max_image_mib",
        "virt:image_sources",  # set to None
        "virt:nothing:here",
        "virt:connection:uri:deeper",
    ]
    fast, salt = vconn.opts_config(mods.opts, mods), vconn.salt_config(mods)
    for key in keys:
        for default in (None, "dflt"):
            assert fast(key, default) == salt(key, default), key
    assert fast("virt:type") is None and fast("virt:disk:8:size") == 6 and fast("virt:minion_install:url")


# a hypervisor minion's main process imports the library anew after an upgrade (_grains/virt_hypervisor.py)
NEW_IMPORT = """
import sys
import saltvirt.host.conn as first
first._loop["registered"] = True  # as after virEventRegisterDefaultImpl()
for name in [m for m in sys.modules if m.partition(".")[0] == "saltvirt"]:
    del sys.modules[name]
import saltvirt.host.conn as second
print(second is not first, second._loop is first._loop, second._loop["registered"])
print(second._loop_lock is first._loop_lock)
"""


def test_libvirts_event_loop_is_the_processs_and_outlives_a_new_import_of_the_library():
    """libvirt has one event loop per process: a new import of the library must neither register it again (that
    re-initialises libvirt's poll loop under the connections using it) nor start a second thread running it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "_utils"))
    run = subprocess.run(
        [sys.executable, "-c", NEW_IMPORT], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True", "True", "True"]
