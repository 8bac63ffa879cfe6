"""Golden-file XML: the expected output of an XML builder, one file per case under tests/golden/.

A golden check (the ``golden`` fixture, tests/conftest.py) of ``xml`` for case ``<module>/<case>``:

1. pretty-prints ``xml`` (ElementTree, two-space indent) and compares it with
   tests/golden/<module>/<case>.xml; a difference fails with a unified diff. With
   ``pytest --regen-golden`` the file is (re)written instead, then reviewed in ``git diff``;
2. validates the golden file against libvirt's RelaxNG schemas with ``virt-xml-validate``;
3. defines it on libvirt's test driver (test:///default, with libvirt's own schema validation flag)
   and returns libvirt's read-back XML, so tests can also check what libvirt understood.

The schema and the define call come from the root element: domain, network, pool (storage pool),
volume (storage volume, created in the test driver's ``default-pool``), domaincheckpoint (created on the
test driver's domain ``test``), domainbackup (schema only: the test driver runs no backup jobs).
"""

import difflib
import pathlib
import subprocess
import xml.etree.ElementTree as ET

from tests.support.paths import ROOT

GOLDEN = ROOT / "tests" / "golden"
SCHEMAS = {
    "domain": "domain",
    "network": "network",
    "pool": "storagepool",
    "volume": "storagevol",
    "domaincheckpoint": "domaincheckpoint",
    "domainbackup": "domainbackup",
}


def pretty(xml):
    """Canonical text of ``xml`` for a golden file: two-space indent, attributes as built, final newline."""
    root = ET.fromstring(xml)
    ET.indent(root, space="  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def path_of(case):
    if case.startswith("/") or ".." in pathlib.PurePosixPath(case).parts or case.endswith(".xml"):
        raise ValueError(f"golden case {case!r}: give '<module>/<case>' (no .xml, no '..')")
    return GOLDEN / f"{case}.xml"


def compare_or_write(case, xml, regen):
    """The golden file's path after comparing (or, with ``regen``, writing) the pretty-printed ``xml``."""
    text, path = pretty(xml), path_of(case)
    if regen:
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return path
    if not path.exists():
        raise AssertionError(f"no golden file {path.relative_to(ROOT)}: run pytest --regen-golden, review, commit")
    expected = path.read_text()
    if expected != text:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), f"{path.relative_to(ROOT)} (golden)", "built now"
            )
        )
        raise AssertionError(
            f"XML differs from its golden file (intended? pytest --regen-golden, then review git diff):\n{diff}"
        )
    return path


def kind_of(xml):
    tag = ET.fromstring(xml).tag
    if tag not in SCHEMAS:
        raise ValueError(f"golden XML root <{tag}>: no libvirt schema known here (add it to SCHEMAS)")
    return tag


def validate(path):
    """libvirt's RelaxNG schema (virt-xml-validate) on the golden file."""
    kind = kind_of(path.read_text())
    out = subprocess.run(
        ["virt-xml-validate", str(path), SCHEMAS[kind]], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 0, f"virt-xml-validate {path.relative_to(ROOT)} {SCHEMAS[kind]}:\n{out.stdout}{out.stderr}"


def define_on_test_driver(xml):
    """Define ``xml`` on libvirt's test driver (test:///default) with schema validation, remove it again
    and return libvirt's read-back XML (secure: passwords included)."""
    import libvirt

    kind = kind_of(xml)
    conn = libvirt.open("test:///default")
    try:
        if kind == "domain":
            obj = conn.defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
            try:
                return obj.XMLDesc(libvirt.VIR_DOMAIN_XML_SECURE | libvirt.VIR_DOMAIN_XML_INACTIVE)
            finally:
                obj.undefine()
        if kind == "network":
            obj = conn.networkDefineXMLFlags(xml, libvirt.VIR_NETWORK_DEFINE_VALIDATE)
            try:
                return obj.XMLDesc(0)  # the test driver keeps one definition (no INACTIVE flag)
            finally:
                obj.undefine()
        if kind == "pool":
            obj = conn.storagePoolDefineXML(xml, libvirt.VIR_STORAGE_POOL_DEFINE_VALIDATE)
            try:
                return obj.XMLDesc(0)  # the test driver keeps one definition (no INACTIVE flag)
            finally:
                obj.undefine()
        if kind == "domainbackup":
            return xml  # the test driver has no backup jobs: the schema check above is the whole check
        if kind == "domaincheckpoint":  # on the test driver's own running domain 'test' (disk vda)
            cp = conn.lookupByName("test").checkpointCreateXML(xml, 0)  # no VALIDATE flag for a new one
            try:
                return cp.getXMLDesc(libvirt.VIR_DOMAIN_CHECKPOINT_XML_NO_DOMAIN)
            finally:
                cp.delete(0)
        pool = conn.storagePoolLookupByName("default-pool")
        # libvirt 9's volume parser takes no VALIDATE flag: the schema check above (virt-xml-validate) stands in
        obj = pool.createXML(xml, 0)
        try:
            return obj.XMLDesc(0)
        finally:
            obj.delete(0)
    finally:
        conn.close()


def check(case, xml, regen=False):
    """The whole golden check of one case (see the module docstring); libvirt's read-back XML."""
    path = compare_or_write(case, xml, regen)
    validate(path)
    return define_on_test_driver(path.read_text())
