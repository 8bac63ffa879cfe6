"""saltvirt.host.schemacache: libvirt's schema check once per definition shape, libvirt version and URI (issue 40).

libvirt's test driver honours ``VIR_DOMAIN_DEFINE_VALIDATE`` as libvirtd does (it refuses an unknown element
with it, drops it without); which define call was made is counted around the real connection's methods."""

import json
import os

import libvirt
import pytest

from saltvirt.host import schemacache
from tests.support.paths import TEST_NODE_XML

VM = """<domain type='test'><name>{name}</name><memory unit='KiB'>65536</memory><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os><on_reboot>{on_reboot}</on_reboot>
<metadata><x:vm xmlns:x="https://example.com/x"><x:image>{name}.raw</x:image></x:vm></metadata>
<devices><disk type='file' device='disk'><source file='/var/lib/x/{name}.raw'/><target dev='vda' bus='virtio'/></disk>
{extra}</devices></domain>"""


class Counting:
    """The real connection, its define calls counted: ``validated`` (with the schema check) or ``plain``."""

    def __init__(self, conn):
        self.conn, self.calls = conn, []

    def __getattr__(self, name):
        return getattr(self.conn, name)

    def defineXMLFlags(self, xml, flags):
        self.calls.append("validated" if flags & libvirt.VIR_DOMAIN_DEFINE_VALIDATE else "plain")
        return self.conn.defineXMLFlags(xml, flags)

    def defineXML(self, xml):
        self.calls.append("plain")
        return self.conn.defineXML(xml)


@pytest.fixture
def conn():
    real = libvirt.open(f"test://{TEST_NODE_XML}")
    yield Counting(real)
    real.close()


def _define(conn, cache, name, on_reboot="restart", extra=""):
    dom = schemacache.define_domain(conn, VM.format(name=name, on_reboot=on_reboot, extra=extra), str(cache))
    dom.undefine()


def test_a_shape_is_validated_once(conn, tmp_path):
    cache = tmp_path / "cache"
    _define(conn, cache, "a1")
    _define(conn, cache, "a2")  # another name, disk path and metadata: the same shape
    assert conn.calls == ["validated", "plain"]
    assert os.stat(cache / schemacache.CACHE_FILE).st_mode & 0o777 == 0o600
    _define(conn, cache, "a3", on_reboot="destroy")  # a word the schema chooses by: another shape
    _define(conn, cache, "a4", extra="<watchdog model='i6300esb'/>")  # a new device
    assert conn.calls == ["validated", "plain", "validated", "validated"]
    _define(conn, cache, "a5", extra="<watchdog model='i6300esb'/>")
    assert conn.calls[-1] == "plain"


def test_an_unknown_element_is_never_defined_unchecked(conn, tmp_path):
    cache = tmp_path / "cache"
    _define(conn, cache, "b1")
    with pytest.raises(libvirt.libvirtError, match="(?i)schema|relax|element"):
        _define(conn, cache, "b2", extra="<nosuchdevice/>")
    assert conn.calls == ["validated", "validated"]


def test_another_libvirt_or_no_cache_validates_again(conn, tmp_path):
    cache = tmp_path / "cache"
    _define(conn, cache, "c1")
    data = json.loads((cache / schemacache.CACHE_FILE).read_text())
    assert data["key"] == [conn.getURI(), conn.getLibVersion()]
    (cache / schemacache.CACHE_FILE).write_text(json.dumps(dict(data, key=[conn.getURI(), 1])))  # an older libvirt
    _define(conn, cache, "c2")
    dom = schemacache.define_domain(conn, VM.format(name="c3", on_reboot="restart", extra=""), None)
    dom.undefine()
    assert conn.calls == ["validated", "validated", "validated"]


def test_a_cache_others_may_write_is_not_trusted(conn, tmp_path):
    cache = tmp_path / "cache"
    _define(conn, cache, "d1")
    (cache / schemacache.CACHE_FILE).chmod(0o666)
    _define(conn, cache, "d2")
    cache.chmod(0o777)
    _define(conn, cache, "d3")
    assert conn.calls == ["validated"] * 3


def test_the_shape_leaves_out_names_paths_and_numbers():
    one = VM.format(name="e1", on_reboot="restart", extra="")
    assert schemacache.shape(one) == schemacache.shape(VM.format(name="other-vm", on_reboot="restart", extra=""))
    assert schemacache.shape(one) == schemacache.shape(one.replace("65536", "131072"))
    assert schemacache.shape(one) != schemacache.shape(one.replace("bus='virtio'", "bus='sata'"))
    assert schemacache.shape(one) != schemacache.shape(one.replace("<vcpu>", "<vcpu placement='static'>"))
