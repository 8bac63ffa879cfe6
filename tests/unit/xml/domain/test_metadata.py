"""saltvirt.xml.domain.metadata: salt-virt's own <metadata> (group, minion key, owner, image, HA flag) as
definition.build writes it and parse reads it back, and the HA flag changed through libvirt's setMetadata."""

import xml.etree.ElementTree as ET

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.model import vmargs
from saltvirt.model import vmspec as spec
from saltvirt.xml.domain import definition, metadata
from saltvirt.xml.etree import read


def test_what_goes_in_comes_back():
    """Built then read: every field salt-virt records, and nothing (no <metadata>) when there is none."""
    vm = spec.build(
        vmargs.InitRequest("web1", 1, 128, group="web", owner={"tenant": "acme", "creator": "alice"}, ha=True)
    )
    vm.minion_key, vm.image_origin = {"minion_id": "web1", "fingerprint": "ab" * 32}, "debian12"
    assert metadata.facts(read(definition.build(vm))) == {
        "group": "web",
        "minion": {"id": "web1", "key_sha256": "ab" * 32},
        "owner": {"tenant": "acme", "creator": "alice"},
        "image": "debian12",
        "ha": True,
    }
    bare = spec.build(vmargs.InitRequest("web2", 1, 128))
    assert metadata.build_metadata(bare) == [] and "<metadata" not in definition.build(bare)
    assert metadata.facts(read(definition.build(bare))) == {
        "group": None,
        "minion": None,
        "owner": None,
        "image": None,
        "ha": False,
    }


def test_minion_key_kept_in_metadata():
    """virt.init records the seeded minion key; salt-run virt.purge compares it with the master's."""
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, disk=None, group="web"), images_dir="/srv/img", profiles={})
    assert definition.parse(definition.build(vm))["minion"] is None
    vm.minion_key = {"minion_id": "web1", "fingerprint": "ab" * 32}
    facts = definition.parse(definition.build(vm))
    assert facts["minion"] == {"id": "web1", "key_sha256": "ab" * 32} and facts["group"] == "web"


def test_owner_kept_in_metadata():
    """salt-run virt.init records the tenant and the creator; the runner scopes tenants by it."""
    vm = spec.build(
        vmargs.InitRequest("web1", 1, 128, owner={"tenant": "acme", "creator": "alice"}),
        images_dir="/srv/img",
        profiles={},
    )
    xml = definition.build(vm)
    assert '<saltvirt:owner tenant="acme" creator="alice" />' in xml
    assert definition.parse(xml)["owner"] == {"tenant": "acme", "creator": "alice"}
    assert definition.parse(definition.build(spec.build(vmargs.InitRequest("web2", 1, 128))))["owner"] is None
    only = spec.build(vmargs.InitRequest("web3", 1, 128, owner={"creator": "root"}))
    assert definition.parse(definition.build(only))["owner"] == {"tenant": None, "creator": "root"}
    for bad in ({"tenant": "a b"}, {"tenant": "x", "role": "admin"}, "acme", {"creator": "<x>"}):
        with pytest.raises(SaltInvocationError, match="owner"):
            spec.build(vmargs.InitRequest("web4", 1, 128, owner=bad))


@pytest.mark.parametrize("image", ["debian12", "https://images.example.com:8443/a&b/web.qcow2", "/srv/img/x.raw"])
def test_image_kept_in_metadata(image):
    """virt.init records the image a VM came from (a catalog name or a source); parse reads it back."""
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, owner={"tenant": "acme"}), images_dir="/srv/img", profiles={})
    assert definition.parse(definition.build(vm))["image"] is None
    vm.image_origin = image
    xml = definition.build(vm)
    assert definition.parse(xml)["image"] == image and definition.parse(xml)["owner"] == {
        "tenant": "acme",
        "creator": None,
    }
    assert (
        ET.fromstring(xml).find(f"metadata/{{{metadata.METADATA_NS}}}vm/{{{metadata.METADATA_NS}}}image").text == image
    )
    alone = spec.build(vmargs.InitRequest("web2", 1, 128))  # the image is reason enough for salt-virt's <metadata>
    alone.image_origin = image
    assert definition.parse(definition.build(alone))["image"] == image


def test_ha_kept_in_metadata():
    """virt.init ha=True records the flag automatic HA reads (saltvirt.fleet.ha); parse reads it back."""
    assert definition.parse(definition.build(spec.build(vmargs.InitRequest("web1", 1, 128))))["ha"] is False
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, group="web", owner={"creator": "root"}, ha="yes"))
    xml = definition.build(vm)
    assert ET.fromstring(xml).find(f"metadata/{{{metadata.METADATA_NS}}}vm/{{{metadata.METADATA_NS}}}ha").text == "true"
    facts = definition.parse(xml)
    assert facts["ha"] is True and facts["group"] == "web" and facts["owner"] == {"tenant": None, "creator": "root"}
    with pytest.raises(SaltInvocationError, match="ha must be true or false"):
        spec.build(vmargs.InitRequest("web1", 1, 128, ha="maybe"))


def test_with_ha_keeps_the_rest_of_salt_virts_metadata():
    """virt.update ha=: libvirt's setMetadata replaces salt-virt's whole <vm> element: the group, owner, minion key
    and image must survive, as libvirt writes it back (namespaced) into the domain."""
    vm = spec.build(vmargs.InitRequest("web1", 1, 128, group="web", owner={"tenant": "acme", "creator": "alice"}))
    vm.minion_key, vm.image_origin = {"minion_id": "web1", "fingerprint": "ab" * 32}, "debian12"
    xml = definition.build(vm)
    on = metadata.with_ha(xml, True)
    assert ET.fromstring(on).tag == "vm" and "{" not in "".join(el.tag for el in ET.fromstring(on).iter())

    def injected(fragment):  # what libvirt makes of it: its <vm> and children in our namespace, in <metadata>
        root = ET.fromstring(xml)
        meta = root.find("metadata")
        meta.remove(meta[0])
        el = ET.fromstring(fragment)
        for child in el.iter():
            child.tag = f"{{{metadata.METADATA_NS}}}{child.tag}"
        meta.append(el)
        return definition.parse(ET.tostring(root, encoding="unicode"))

    facts = injected(on)
    assert facts["ha"] is True and facts["group"] == "web" and facts["image"] == "debian12"
    assert facts["owner"] == {"tenant": "acme", "creator": "alice"} and facts["minion"]["id"] == "web1"
    assert (
        injected(metadata.with_ha(definition.build(spec.build(vmargs.InitRequest("web1", 1, 128, ha=True))), False))[
            "ha"
        ]
        is False
    )
    assert (
        ET.fromstring(
            metadata.with_ha(definition.build(spec.build(vmargs.InitRequest("web2", 1, 128))), True)
        ).findtext("ha")
        == "true"
    )
