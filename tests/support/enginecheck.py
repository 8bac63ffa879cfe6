"""A master engine that runs rounds (virt_balance, virt_ha) through Salt's real engine loader on master opts (no
daemons): the checks every such engine passes (tests/unit/loaders/test_engines_virt_*.py)."""

import threading
import time

from tests.support.paths import ROOT

WAIT = 30  # seconds: a bound for an engine's first log line on a loaded machine, not a speed check


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
        logged(caplog, thread, "engine not started")
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
        logged(caplog, thread, says, "the round failed")
    assert thread.is_alive()
    assert says in caplog.text


def logged(caplog, thread, *texts):
    """Wait until one of ``texts`` is in ``caplog`` (or ``thread`` ended, or :data:`WAIT` passed), then give the
    thread a moment more: one that logged and then returned (an engine Salt would restart at once) has ended by
    then, so ``thread.is_alive()`` still tells an idling engine from a returning one. A fixed 1-3 s join did
    both, at the price of its whole length each time."""
    deadline = time.monotonic() + WAIT
    while not any(t in caplog.text for t in texts) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    thread.join(0.2)


class _NoClient:
    def __init__(self, run_job):
        self.run_job = run_job

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
