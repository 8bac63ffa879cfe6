"""_engines/libvirt_events.py (Salt's engine name and options, salt-virt's watcher) through Salt's real
engine loader (no daemons): it loads from this repository, takes Salt's options and refuses a bad one
with the reason (then idles instead of crash-looping). Its events: tests/integration/test_events.py."""

import threading

import pytest

from tests.support.enginecheck import logged
from tests.support.paths import ROOT
from tests.unit.loaders.test_engines_virt_events import engines  # noqa: F401 - the fixture


def test_the_engine_loads_from_this_repository(engines):  # noqa: F811 - the fixture
    start = engines["libvirt_events.start"]
    assert (ROOT / "_engines" / "libvirt_events.py").samefile(start.__globals__["__file__"])


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"filters": ["pool/lifecyle"]}, "unknown filter(s) pool/lifecyle"),
        ({"tag_prefix": "/"}, "tag_prefix must be a non-empty string"),
        ({"uri": "test:///default", "bakoff_max": 3}, "unknown option(s) bakoff_max"),
    ],
)
def test_salts_options_are_checked_and_a_bad_one_idles_the_engine(engines, caplog, options, error):  # noqa: F811
    thread = threading.Thread(target=engines["libvirt_events.start"], kwargs=options, daemon=True)
    with caplog.at_level("ERROR"):
        thread.start()
        logged(caplog, thread, "libvirt_events engine not started")
    assert thread.is_alive()  # idling, not returning (Salt would restart it at once)
    assert "libvirt_events engine not started" in caplog.text and error in caplog.text, caplog.text
