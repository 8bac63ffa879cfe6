"""ElementTree helpers shared by the XML builders and readers (the ``domain`` package, ``netxml``, ``poolxml``).

Below them all, so none imports another for them.
"""

import xml.etree.ElementTree as ET
from typing import Any

from saltvirt.base import validate


def el(tag: str, text: Any = None, **attrs: Any) -> ET.Element:
    """A new element; attributes whose value is None are left out, values and text become strings."""
    new = ET.Element(tag, {k: str(v) for k, v in attrs.items() if v is not None})
    if text is not None:
        new.text = str(text)
    return new


def sub(parent: ET.Element, tag: str, text: Any = None, **attrs: Any) -> ET.Element:
    """A new child element of ``parent`` (see :func:`el`)."""
    child = el(tag, text, **attrs)
    parent.append(child)
    return child


def first(node: ET.Element, *tags: str) -> ET.Element | None:
    """``node.find("a/b/c")`` for plain tags (``a``, ``{ns}b``), one tag at a time: ElementTree's C code
    finds one tag, a path goes through ElementPath in Python (several times slower per call)."""
    head, rest = tags[0], tags[1:]
    if not rest:
        return node.find(head)
    for child in node.findall(head):
        found = first(child, *rest)
        if found is not None:
            return found
    return None


def read(xml: str | ET.Element) -> ET.Element:
    """The parsed XML (``xml``: a string, or what this returned already): parse once, then hand the tree to
    every reader (``definition.parse``, ``boot.salt_facts``, ``boot.loader``, ``definition.feature_facts``)."""
    return xml if isinstance(xml, ET.Element) else ET.fromstring(xml)


def need(node: ET.Element, tag: str) -> ET.Element:
    """``node.find(tag)`` of an element libvirt always writes: a ValueError naming it when it is missing (a
    document libvirt did not write), not an AttributeError on None further on."""
    found = node.find(tag)
    if found is None:
        raise ValueError(f"<{node.tag}> has no <{tag}>: not an XML description libvirt wrote")
    return found


def attr(node: ET.Element | None, tag: str, name: str) -> str | None:
    """Attribute ``name`` of ``node.find(tag)``; None when ``node``, that child or the attribute is missing."""
    found = node.find(tag) if node is not None else None
    return found.get(name) if found is not None else None


def every(node: ET.Element, *tags: str) -> list[ET.Element]:
    """``node.findall("a/b")`` for plain tags, one tag at a time (see :func:`first`)."""
    found = [node]
    for tag in tags:
        found = [child for parent in found for child in parent.findall(tag)]
    return found


def to_int(text: Any, default: int = 0) -> int:
    """An integer from XML text, ``default`` when it is missing or not a number."""
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def mib(node: ET.Element | None, attr: str | None = None) -> int:
    """An element's size (its text, or its attribute ``attr``) in MiB, rounded down; libvirt's default unit is
    KiB, any of its units (``validate.SIZE_UNITS``) is read and another refused."""
    return _scaled(node, attr, 2**20)


def kib(node: ET.Element | None, attr: str | None = None) -> int:
    """As :func:`mib`, in KiB."""
    return _scaled(node, attr, 1024)


def _scaled(node: ET.Element | None, attr: str | None, per: int) -> int:
    if node is None:
        return 0
    unit = node.get("unit") or "KiB"
    return to_int(node.get(attr) if attr else node.text) * validate.unit_bytes(unit, f"<{node.tag}> unit") // per
