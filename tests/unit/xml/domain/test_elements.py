"""saltvirt.xml.domain.elements: a group's elements of their own, built from the spec's checked values, read
back (None where absent) and replaced whole, in the order they were registered."""

import xml.etree.ElementTree as ET

import pytest

from saltvirt.xml.domain import elements
from saltvirt.xml.etree import el


def _registry():
    reg: list[elements.Element] = []
    elements.of(reg, "first", "a", read=lambda n: n.get("v"))(lambda v: el("a", v=v))
    elements.of(reg, "second", "b", read=lambda n: n.text)(lambda v: el("b", str(v)))
    return reg


def test_built_in_registration_order_and_only_when_asked():
    reg = _registry()
    built = elements.build_all(reg, {"second": 2, "first": "x"})
    assert [(e.tag, e.get("v"), e.text) for e in built] == [("a", "x", None), ("b", None, "2")]
    assert elements.build_all(reg, {"first": None, "second": False}) == []  # None/False: not asked for


def test_read_back_with_none_for_an_absent_element():
    parent = ET.fromstring("<devices><a v='y'/><other/></devices>")
    assert elements.read_all(_registry(), parent) == {"first": "y", "second": None}


def test_replaced_whole_only_for_the_fields_given():
    parent = ET.fromstring("<devices><a v='old'/><b>old</b><keep/></devices>")
    new = ET.fromstring("<devices><b>new</b></devices>")
    elements.replace_all(_registry(), parent, new, ["first", "second"])
    assert [(c.tag, c.get("v"), c.text) for c in parent] == [("keep", None, None), ("b", None, "new")]
    elements.replace_all(_registry(), parent, ET.fromstring("<devices/>"), ["unrelated"])
    assert [c.tag for c in parent] == ["keep", "b"]


def test_a_key_registered_twice_is_refused():
    reg = _registry()
    with pytest.raises(ValueError, match="'first' is registered twice"):
        elements.of(reg, "first", "c", read=lambda n: None)(lambda v: el("c"))
