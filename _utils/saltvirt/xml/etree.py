"""ElementTree helpers shared by the XML builders and readers (``domxml``, ``domxml_features``).

Below both, so neither imports the other for them.
"""

import xml.etree.ElementTree as ET
from typing import Any


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


def to_int(text: Any, default: int = 0) -> int:
    """An integer from XML text, ``default`` when it is missing or not a number."""
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def mib(node: ET.Element | None, attr: str | None = None) -> int:
    """An element's size (its text, or its attribute ``attr``) in MiB; libvirt's default unit is KiB."""
    if node is None:
        return 0
    unit = (node.get("unit") or "KiB").lower()
    factor = {
        "b": 1 / 1048576,
        "bytes": 1 / 1048576,
        "kib": 1 / 1024,
        "k": 1 / 1024,
        "mib": 1,
        "m": 1,
        "gib": 1024,
        "g": 1024,
    }
    return int(to_int(node.get(attr) if attr else node.text) * factor.get(unit, 1 / 1024))
