"""Elements of their own: one row of the argument table (:mod:`saltvirt.model.vmargs`) is one element, written
by its builder from the row's checked value (``VMSpec.elements``) and read back by its reader. A group
registers each with :func:`of` on its builder; its ``build``, ``feature_facts`` and ``replace`` loop them, and
``definition.FEATURES`` lists them: a new one is its row, its builder and its reader, nothing else."""

import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from saltvirt.base.salttypes import Data


@dataclasses.dataclass(frozen=True)
class Element:
    key: str  # the row: VMSpec.elements' key, definition.feature_facts' key, what virt.update manages
    tag: str  # the element, under the group's parent (the domain, or its <devices>)
    build: Callable[[Any], ET.Element]  # from the row's checked value
    read: Callable[[ET.Element], Any]  # normalized so what libvirt reads back equals what build wrote


def of(registry: list[Element], key: str, tag: str, read: Callable[[ET.Element], Any]) -> Callable:
    """Register the builder it decorates (and its reader ``read``) in the group's ``registry``; the group
    writes its elements in the order they are registered."""

    def register(build: Callable[[Any], ET.Element]) -> Callable[[Any], ET.Element]:
        if any(e.key == key for e in registry):
            raise ValueError(f"element {key!r} is registered twice")
        registry.append(Element(key, tag, build, read))
        return build

    return register


def build_all(registry: Iterable[Element], values: Mapping[str, Any]) -> list[ET.Element]:
    """The registered elements a spec asks for (a value that is not None, False or empty)."""
    return [e.build(values[e.key]) for e in registry if values.get(e.key)]


def read_all(registry: Iterable[Element], parent: ET.Element) -> Data:
    """Each registered element's facts under ``parent``; None where it is absent."""
    out = {}
    for e in registry:
        node = parent.find(e.tag)
        out[e.key] = e.read(node) if node is not None else None
    return out


def replace_all(registry: Iterable[Element], parent: ET.Element, new: ET.Element, fields: Iterable[str]) -> None:
    """The registered elements of ``fields`` under ``parent`` taken whole from ``new`` (the desired parent)."""
    for e in registry:
        if e.key in fields:
            for old in parent.findall(e.tag):
                parent.remove(old)
            parent.extend(new.findall(e.tag))
