"""saltvirt.storage.intake: where an image may be downloaded from (``virt:image_sources``, issue 34 #7): the
operator's hosts and URL prefixes, checked before any request and for every redirect, with real HTTP(S)
servers on loopback (tests/support/hostile.py)."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.storage import intake
from tests.support import hostile
from tests.support.saltloader import make_minion_mods

REFUSED = "is not from a source the operator allows"


@pytest.fixture
def web(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with hostile.Server() as srv:
        yield srv


@pytest.fixture
def tls(tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with hostile.Server(str(tmp_path), tls=True) as srv:
        monkeypatch.setenv("SSL_CERT_FILE", srv.cert)
        yield srv


@pytest.mark.parametrize(
    "entry",
    [
        "https://user:pw@images.example.com/",
        "https://images.example.com/?x=1",
        "https://images.example.com/#frag",
        "ftp://images.example.com/",
        "images.example.com/cloud",  # a path needs the scheme: https://images.example.com/cloud/
        "https://images.example.com:99999/",
        "",
    ],
)
def test_image_sources_are_hosts_and_url_prefixes(entry):
    assert intake.image_sources(None, "master config") is None
    assert intake.image_sources([], "master config") == ()
    assert intake.image_sources("images.example.com", "master config") == ("images.example.com",)
    with pytest.raises(SaltInvocationError, match="virt:image_sources in the master config"):
        intake.image_sources([entry], "master config")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://images.example.com/debian/12.qcow2", True),
        ("https://IMAGES.example.com:8443/x.raw", True),  # a host entry: any port
        ("http://images.example.com/x.raw", True),  # and scheme (plain http stays the minion's switch)
        ("https://images.example.com.evil.net/x.raw", False),
        ("https://images.example.com@10.0.0.5/x.raw", False),  # userinfo, host 10.0.0.5
        ("https://mirror.example.net/cloud/x.raw", True),
        ("https://mirror.example.net/cloud", True),
        ("https://mirror.example.net:443/cloud/a/b.qcow2", True),  # the default port is the same
        ("https://mirror.example.net/cloudy/x.raw", False),  # whole path segments
        ("https://mirror.example.net/x.raw", False),
        ("https://mirror.example.net:8443/cloud/x.raw", False),
        ("http://mirror.example.net/cloud/x.raw", False),
        ("https://169.254.169.254/latest/meta-data/", False),
    ],
)
def test_a_url_is_within_the_sources_by_host_or_prefix(url, allowed):
    sources = intake.image_sources(["images.example.com", "https://mirror.example.net/cloud"], "minion config")
    assert intake.source_allowed(url, sources) is allowed
    if allowed:
        intake.check_source(url, sources, "master config")
    else:
        with pytest.raises(SaltInvocationError, match=REFUSED):
            intake.check_source(url, sources, "master config")
    intake.check_source(url, None, "master config")  # no list: nothing refused
    intake.check_source("salt://images/x.qcow2", (), "master config")  # never a download from a host
    intake.check_source("/srv/images/x.qcow2", (), "master config")


def test_the_refusal_says_what_to_add():
    with pytest.raises(SaltInvocationError) as refused:
        intake.check_source("https://u:pw@10.0.0.5/latest/meta-data", ("images.example.com",), "master config")
    assert str(refused.value) == (
        "image https://10.0.0.5/latest/meta-data is not from a source the operator allows (virt:image_sources in "
        "the master config: images.example.com): the operator adds 10.0.0.5 (or https://10.0.0.5/<path>/) to "
        "virt:image_sources"
    )


def test_a_hypervisor_with_a_list_asks_no_other_host_and_follows_no_redirect_out(tls, web, tmp_path):
    """Refused before any request (the server never sees one), and a redirect from an allowed source to
    another host (``localhost`` is not ``127.0.0.1``) or outside the prefix is refused before it is followed."""
    cache = str(tmp_path / "cache")
    tls.files["/ok/x.raw"] = b"\1" * 4096
    tls.files["/secret/x.raw"] = b"\2" * 4096
    prefix = tls.url("/ok/")
    with pytest.raises(SaltInvocationError, match=REFUSED):
        intake.accept(tls.url("/secret/x.raw"), cache, sources=(prefix,))
    assert tls.log == []
    assert intake.accept(tls.url("/ok/x.raw"), cache, sources=(prefix,))["format"] == "raw"
    tls.redirects["/ok/moved.raw"] = tls.url("/secret/x.raw")
    with pytest.raises(SaltInvocationError, match=r"image https://127\.0\.0\.1:\d+/secret/x\.raw is not from"):
        intake.accept(tls.url("/ok/moved.raw"), cache, sources=(prefix,))
    assert [entry[0] for entry in tls.log] == ["/ok/x.raw", "/ok/moved.raw"]
    web.files["/x.raw"] = b"\0" * 4096
    web.redirects["/moved.raw"] = web.url("/x.raw").replace("127.0.0.1", "localhost")
    with pytest.raises(SaltInvocationError, match=r"image http://localhost:\d+/x\.raw is not from"):
        intake.accept(web.url("/moved.raw"), cache, allow_http=True, sources=("127.0.0.1",))
    assert [entry[0] for entry in web.log] == ["/moved.raw"]


def test_virt_init_and_image_warm_take_the_list_from_the_minion_config(tls, tmp_path):
    tls.files["/x.raw"] = b"\1" * 4096
    mods = make_minion_mods(tmp_path, "test:///default", image_sources=["images.example.com"])
    with pytest.raises(SaltInvocationError, match="virt:image_sources in the hypervisor's minion config"):
        mods["virt.init"]("srcvm", 1, 64, image=tls.url("/x.raw"), nic=None, seed=False, start=False)
    with pytest.raises(SaltInvocationError, match=REFUSED):
        mods["virt.image_warm"](tls.url("/x.raw"))
    assert tls.log == []
    listed = make_minion_mods(tmp_path, "test:///default", image_sources=["127.0.0.1"])
    assert listed["virt.image_warm"](tls.url("/x.raw"))["format"] == "raw"
