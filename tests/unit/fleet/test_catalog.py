"""saltvirt.fleet.catalog: virt:catalog checked; names resolved; tenants limited to their catalog images."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.fleet import catalog

SHA = "sha256:" + "ab" * 32
OPTS = {
    "virt": {
        "catalog": {
            "debian12": {"source": "salt://images/d12.qcow2", "checksum": SHA, "min_size": 2048},
            "alpine": {"source": "https://i.example/a.raw", "checksum": SHA, "format": "raw", "profile": "small"},
        }
    }
}


def test_entries_with_defaults():
    conf = catalog.config(OPTS)
    assert conf["debian12"] == {
        "source": "salt://images/d12.qcow2",
        "checksum": SHA,
        "format": "qcow2",
        "min_size": 2048,
        "profile": "default",
    }
    assert conf["alpine"]["min_size"] == 0 and conf["alpine"]["profile"] == "small"


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"source": "/var/lib/x.qcow2", "checksum": SHA}, "salt:// or https://"),
        ({"source": "http://x/y", "checksum": SHA}, "salt:// or https://"),
        ({"source": "salt://x"}, "checksum is required"),
        ({"source": "salt://x", "checksum": "md5:00"}, "checksum"),
        ({"source": "salt://x", "checksum": SHA, "format": "vmdk"}, "format must be one of"),
        ({"source": "salt://x", "checksum": SHA, "url": "x"}, "unknown key"),
    ],
)
def test_bad_entries(entry, match):
    with pytest.raises(SaltInvocationError, match=match):
        catalog.config({"virt": {"catalog": {"img": entry}}})


def test_resolve_for_operators_and_tenants():
    assert catalog.resolve(OPTS, "debian12")[1] == "salt://images/d12.qcow2"
    assert catalog.resolve(OPTS, "salt://other.qcow2") == (None, "salt://other.qcow2")  # an operator's own source
    entry, source = catalog.resolve(OPTS, "debian12", "acme", ["debian12"])
    assert entry["checksum"] == SHA and source == "salt://images/d12.qcow2"
    assert catalog.resolve(OPTS, None, "acme", ["debian12"]) == (None, None)
    for image in ("alpine", "salt://images/d12.qcow2", "nope"):
        with pytest.raises(SaltInvocationError, match="tenant acme may use catalog images only: .* \\(debian12\\)"):
            catalog.resolve(OPTS, image, "acme", ["debian12", "nope"])


def test_a_runner_callers_urls_come_from_the_operators_sources_only():
    """virt:image_sources (master config; default none, issue 34 #7): an http(s) image or disk image of a runner
    call outside it is refused before anything is published; the catalog's sources, salt:// and the
    hypervisors' own files need no entry."""
    catalog.check_sources(OPTS, "https://i.example/a.raw")  # the catalog's alpine: vouched for
    catalog.check_sources(OPTS, "salt://images/other.qcow2", [{"name": "data", "image": "/srv/golden/x.qcow2"}])
    catalog.check_sources(OPTS, None)
    wording = (
        "image https://10.0.0.5/latest/meta-data is not from a source the operator allows (virt:image_sources in "
        "the master config: none): the operator adds 10.0.0.5 (or https://10.0.0.5/<path>/) to "
        "virt:image_sources, or puts the image in virt:catalog or on the master's fileserver"
    )
    for image, disks in [
        ("https://10.0.0.5/latest/meta-data", None),
        ("salt://images/d12.qcow2", {"data": {"image": "https://10.0.0.5/latest/meta-data"}}),
    ]:
        with pytest.raises(SaltInvocationError) as refused:
            catalog.check_sources(OPTS, image, disks)
        assert str(refused.value) == wording
    listed = {"virt": dict(OPTS["virt"], image_sources=["https://images.example.com/cloud/"])}
    catalog.check_sources(listed, "https://images.example.com/cloud/debian.qcow2")
    with pytest.raises(SaltInvocationError, match="in the master config: https://images.example.com/cloud/\\)"):
        catalog.check_sources(listed, "http://images.example.com/cloud/debian.qcow2")
    with pytest.raises(SaltInvocationError, match="virt:image_sources in the master config must be a list"):
        catalog.check_sources({"virt": {"image_sources": [1]}}, "salt://x")
