"""The VMs of the domain XML golden cases (tests/unit/xml/domain/, tests/golden/domain/<case>.xml)."""

from saltvirt.model import vmspec
from saltvirt.xml.domain import definition


def vm(**kw):
    """A VM with no devices but the ones a case adds (the serial console is always there; the guest agent
    channel, on by default in a VMSpec, only in its own case). A keyword that is no VMSpec field is an element of
    its own (VMSpec.elements), as vmspec.build files it."""
    own = {k: kw.pop(k) for k in list(kw) if k not in vmspec.FIELDS}
    return vmspec.VMSpec(**dict({"name": "golden1", "cpu": 2, "mem": 256, "guest_agent": False}, **kw), elements=own)


def check_features(golden, case, spec):
    """Case ``case``'s XML of ``spec`` is its golden file (valid for libvirt's schema, defined on its test driver)
    and libvirt reads back the same feature facts as ours."""
    xml = definition.build(spec)
    assert definition.feature_facts(golden(f"domain/{case}", xml)) == definition.feature_facts(xml)
