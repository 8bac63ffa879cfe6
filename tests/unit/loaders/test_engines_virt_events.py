"""_engines/virt_events.py through Salt's real engine loader (no daemons): it loads, and a bad option
in the engine's config is refused with the reason (the engine then idles instead of crash-looping)."""

import threading

import pytest

from tests.support.enginecheck import logged
from tests.support.paths import ROOT


def load_engines(tmp_path, module_dirs=(), **virt):
    import salt.config
    import salt.loader

    opts = salt.config.minion_config(None)
    opts.update(
        id="hyper-test",
        file_client="local",
        cachedir=str(tmp_path / "cache"),
        pki_dir=str(tmp_path / "pki"),
        engines_dirs=[str(ROOT / "_engines")],
        module_dirs=list(module_dirs),
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


def stop_pushers():
    """Stops the capacity pushers this process's engines started. The engine's own thread has no stop (Salt
    ends an engine with its process) and idles on; its pusher would go on pushing through whatever
    MinionEvent a later test in this worker installs, on every lifecycle event of test:///default (run K4)."""
    for thread in threading.enumerate():
        if thread.name == "virt-capacity-push":
            pusher = thread._target.__self__  # type: ignore[attr-defined]  # Thread keeps it while it runs
            pusher.stop.set()
            pusher.wake.set()
            thread.join(10)
            assert not thread.is_alive(), "a capacity pusher did not stop within 10 s"


def test_the_engine_pushes_the_hosts_capacity_when_it_starts_and_when_a_vm_changes(tmp_path, request):
    """Issue 40: the engine puts the signed record in the mine when it starts and after a lifecycle event (a
    masterless minion's own mine here: mine.send with file_client local; the master's path:
    tests/unit/pki/test_answers.py)."""
    import time

    import salt.loader

    from saltvirt.pki import answers
    from tests.support import keystore

    (tmp_path / "pki").mkdir()
    pub, priv = keystore.keypair("answering hypervisor")
    (tmp_path / "pki" / "minion.pem").write_text(priv)
    # its first push is at start; no heartbeat after it
    engines = load_engines(tmp_path, [str(ROOT / "_modules")], capacity_push={"every": 3600})
    mods = salt.loader.minion_mods(engines.opts)
    threading.Thread(target=engines["virt_events.start"], daemon=True).start()
    request.addfinalizer(stop_pushers)
    deadline, record = time.monotonic() + 60, None
    while record is None and time.monotonic() < deadline:  # the condition: the record is there
        record = (mods["data.get"]("mine_cache") or {}).get(answers.MINE_KEY)
        time.sleep(0.05)
    assert record is not None, "the engine pushed no capacity within 60 s"
    at, cap = answers.verify_record(pub, "hyper-test", record["__data__"])
    assert cap["host"]["vms_defined"] >= 1 and at <= time.time() and "pushed1" not in cap["vm_info"]
    # a VM started on this hypervisor (the engine's libvirt: test:///default is one per process) is pushed at once
    import libvirt

    conn = libvirt.open("test:///default")
    try:
        conn.defineXML(
            "<domain type='test'><name>pushed1</name><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>"
        ).create()
        deadline = time.monotonic() + 60
        while "pushed1" not in cap["vm_info"] and time.monotonic() < deadline:  # no heartbeat: only the change
            time.sleep(0.05)
            record = (mods["data.get"]("mine_cache") or {}).get(answers.MINE_KEY)
            cap = answers.verify_record(pub, "hyper-test", record["__data__"])[1]
        assert "pushed1" in cap["vm_info"], "the engine did not push the started VM within 60 s"
    finally:
        dom = conn.lookupByName("pushed1")
        dom.destroy()
        dom.undefine()
        conn.close()
