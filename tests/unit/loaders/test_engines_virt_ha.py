"""_engines/virt_ha.py through Salt's real engine loader on master opts (no daemons): it loads, a bad interval is
refused with the reason (the engine then idles instead of crash-looping), and with HA off its rounds ask nothing.
Rounds themselves: tests/unit/fleet/test_ha.py."""

import threading

import pytest

from tests.support.paths import ROOT


def load_engines(tmp_path, **virt):
    import salt.config
    import salt.loader

    opts = salt.config.master_config(None)
    opts.update(
        id="master",
        cachedir=str(tmp_path / "cache"),
        pki_dir=str(tmp_path / "pki"),
        sock_dir=str(tmp_path / "sock"),
        engines_dirs=[str(ROOT / "_engines")],
        virt={"hypervisors": ["hv1"], **virt},
    )
    utils = salt.loader.utils(opts)
    return salt.loader.engines(opts, salt.loader.minion_mods(opts, utils=utils), salt.loader.runner(opts), utils)


@pytest.fixture
def engines(tmp_path):
    return load_engines(tmp_path)


def test_the_engine_loads(engines):
    assert "virt_ha.start" in engines


def test_a_bad_interval_is_logged_and_the_engine_idles(engines, caplog):
    thread = threading.Thread(target=engines["virt_ha.start"], kwargs={"interval": "often"}, daemon=True)
    with caplog.at_level("ERROR"):
        thread.start()
        thread.join(2)
    assert thread.is_alive()
    assert "virt_ha engine not started: virt_ha engine: interval must be a number of seconds" in caplog.text


def test_with_ha_off_a_round_says_so_and_asks_nothing(engines, caplog, monkeypatch):
    import salt.client

    def no_master(*_args, **_kwargs):  # a LocalClient needs a running salt-master: none is asked for here
        raise AssertionError("a disabled round asked the hypervisors")

    monkeypatch.setattr(salt.client, "get_local_client", lambda *_a, **_k: _NoClient(no_master))
    thread = threading.Thread(target=engines["virt_ha.start"], kwargs={"interval": 3600}, daemon=True)
    with caplog.at_level("INFO"):
        thread.start()
        thread.join(1)
    assert thread.is_alive()
    assert "virt_ha: automatic HA is off: set virt:ha:enabled: True" in caplog.text


class _NoClient:
    def __init__(self, run_job):
        self.run_job = run_job

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
