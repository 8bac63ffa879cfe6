"""saltvirt.xml.etree: the ElementTree helpers under the XML builders and readers (xml/domain, netxml, poolxml)."""

import xml.etree.ElementTree as ET

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.xml import etree


def test_el_drops_none_attributes_and_stringifies():
    node = etree.el("memory", 512, unit="MiB", dumpCore=None)
    assert ET.tostring(node) == b'<memory unit="MiB">512</memory>'


def test_sub_appends_to_parent():
    parent = etree.el("devices")
    child = etree.sub(parent, "disk", type="file")
    assert list(parent) == [child] and child.get("type") == "file"


@pytest.mark.parametrize(("text", "default", "want"), [("7", 0, 7), (None, 3, 3), ("x", -1, -1)])
def test_to_int(text, default, want):
    assert etree.to_int(text, default) == want


@pytest.mark.parametrize(
    ("xml", "want"),
    [
        ("<m>1048576</m>", 1024),
        ("<m unit='GiB'>2</m>", 2048),
        ("<m unit='bytes'>1048576</m>", 1),
        ("<m>x</m>", 0),
        ("<m unit='TiB'>1</m>", 1024 * 1024),  # issue 36 #1: TiB and decimal units were read as KiB
        ("<m unit='GB'>2</m>", 2 * 10**9 // 2**20),
        ("<m unit='KB'>2048000</m>", 2048 * 10**3 * 1000 // 2**20),
    ],
)
def test_mib_units(xml, want):
    assert etree.mib(ET.fromstring(xml)) == want
    assert etree.mib(None) == 0


def test_an_unknown_unit_is_refused_not_read_as_kib():
    with pytest.raises(SaltInvocationError, match="<memory> unit: unknown unit 'parsecs'; the units are B, K/KiB"):
        etree.mib(ET.fromstring("<memory unit='parsecs'>2</memory>"))
    assert etree.kib(ET.fromstring("<page size='2' unit='MiB'/>"), "size") == 2048


@pytest.mark.parametrize(
    "path",
    ["serial/log", "backingStore/source", "metadata/{urn:x}vm/{urn:x}group", "os/loader", "devices/graphics", "nope/x"],
)
def test_first_and_every_walk_a_path_as_find_and_findall_do(path):
    """One tag at a time (ElementTree's C code) gives what ElementPath gives: the first match under any
    branch, not only under the first element of the first tag."""
    root = ET.fromstring(
        "<r xmlns:x='urn:x'><serial/><serial><log file='b'/></serial><serial><log file='c'/></serial>"
        "<backingStore><format/></backingStore><backingStore><source file='s'/></backingStore>"
        "<metadata><other/></metadata><metadata><x:vm><x:group>web</x:group></x:vm></metadata>"
        "<os><type/></os><devices><graphics type='vnc'/><disk/><graphics type='spice'/></devices><devices>"
        "<graphics type='sdl'/></devices></r>"
    )
    tags = path.split("/")
    assert etree.first(root, *tags) is root.find(path)
    assert etree.every(root, *tags) == root.findall(path)


def test_need_names_what_libvirt_always_writes_and_attr_reads_what_may_be_missing():
    """A reader given XML libvirt did not write fails with the element's name (it raised AttributeError on
    None further on before), and an optional attribute is None wherever it is missing."""
    root = ET.fromstring("<domain><name>web1</name><os><type arch='x86_64'>hvm</type></os></domain>")
    assert etree.need(root, "name").text == "web1"
    with pytest.raises(ValueError, match="<domain> has no <devices>: not an XML description libvirt wrote"):
        etree.need(root, "devices")
    assert etree.attr(root, "os/type", "arch") == "x86_64"
    assert etree.attr(root, "os/type", "machine") is None
    assert etree.attr(root, "os/loader", "type") is None
    assert etree.attr(None, "os", "x") is None
    assert etree.read(root) is root and etree.read("<a/>").tag == "a"
