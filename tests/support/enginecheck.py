"""A master engine that runs rounds (virt_balance, virt_ha) through Salt's real engine loader on master opts (no
daemons): the checks every such engine passes (tests/unit/loaders/test_engines_virt_*.py)."""

import threading

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


def bad_interval_idles(engines, caplog, engine):
    """A bad interval is logged with the reason and the engine idles (Salt would restart a crashed one at once)."""
    thread = threading.Thread(target=engines[f"{engine}.start"], kwargs={"interval": "often"}, daemon=True)
    with caplog.at_level("ERROR"):
        thread.start()
        thread.join(2)
    assert thread.is_alive()
    assert f"{engine} engine not started: {engine} engine: interval must be a number of seconds" in caplog.text


def off_asks_nothing(engines, caplog, monkeypatch, engine, says):
    """While the engine is off its round says ``says`` and asks the hypervisors nothing."""
    import salt.client

    def no_master(*_args, **_kwargs):  # a LocalClient needs a running salt-master: none is asked for here
        raise AssertionError("a disabled round asked the hypervisors")

    monkeypatch.setattr(salt.client, "get_local_client", lambda *_a, **_k: _NoClient(no_master))
    thread = threading.Thread(target=engines[f"{engine}.start"], kwargs={"interval": 3600}, daemon=True)
    with caplog.at_level("INFO"):
        thread.start()
        thread.join(1)
    assert thread.is_alive()
    assert says in caplog.text


class _NoClient:
    def __init__(self, run_job):
        self.run_job = run_job

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
