"""_engines/virt_events.py through Salt's real engine loader (no daemons): it loads, and a bad option
in the engine's config is refused with the reason (the engine then idles instead of crash-looping)."""

import threading

import pytest

from tests.support.enginecheck import logged
from tests.support.paths import ROOT


def load_engines(tmp_path, **virt):
    import salt.config
    import salt.loader

    opts = salt.config.minion_config(None)
    opts.update(
        id="hyper-test",
        file_client="local",
        cachedir=str(tmp_path / "cache"),
        pki_dir=str(tmp_path / "pki"),
        engines_dirs=[str(ROOT / "_engines")],
        virt={"connection": {"uri": "test:///default"}, **virt},
    )
    opts["grains"] = {}
    utils = salt.loader.utils(opts)
    mods = salt.loader.minion_mods(opts, utils=utils)
    return salt.loader.engines(opts, mods, [], utils)


@pytest.fixture
def engines(tmp_path):
    return load_engines(tmp_path)


def test_the_engine_loads(engines):
    assert "virt_events.start" in engines


def test_a_bad_option_is_logged_and_the_engine_idles(engines, caplog):
    thread = threading.Thread(target=engines["virt_events.start"], kwargs={"bakoff_max": 3}, daemon=True)
    with caplog.at_level("ERROR"):
        thread.start()
        logged(caplog, thread, "virt_events engine not started")
    assert thread.is_alive()  # idling, not returning (Salt would restart it at once)
    assert "virt_events engine not started: virt_events: unknown option(s) bakoff_max" in caplog.text


def test_the_inbox_bound_comes_from_the_minion_config(tmp_path, caplog):
    """virt:events:inbox_max is read from the minion config and checked; a bad one idles the engine."""
    engines = load_engines(tmp_path, events={"inbox_max": 0})
    thread = threading.Thread(target=engines["virt_events.start"], daemon=True)
    with caplog.at_level("ERROR"):
        thread.start()
        logged(caplog, thread, "virt_events engine not started")
    assert thread.is_alive()
    assert "virt_events engine not started: virt:events:inbox_max in the minion config must be a whole number" in (
        caplog.text
    )
