"""saltvirt.pki.answers: a hypervisor's answer signed with its minion key, and ``virt.answer`` that makes it
(through Salt's real loader, on libvirt's test driver)."""

import base64
import threading

import pytest

from saltvirt.pki import answers
from tests.support import keystore
from tests.support.saltloader import make_minion_mods


@pytest.fixture
def keys(tmp_path):
    pub, priv = keystore.keypair("answering hypervisor")  # made once: a key's freshness is not the point here
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "minion.pem").write_text(priv)
    return pub, str(tmp_path / "pki")


def test_a_signed_answer_verifies_only_for_its_minion_function_and_nonce(keys):
    pub, pki = keys
    nonce = answers.new_nonce()
    signed = answers.sign(pki, "hv1", "virt.vm_state", nonce, {"web1": "running", 7: "int keys stay ints"}, 0)
    assert answers.verify(pub, "hv1", "virt.vm_state", nonce, signed) == (
        {"web1": "running", 7: "int keys stay ints"},
        0,
    )
    for minion, fun, other in (
        ("hv2", "virt.vm_state", nonce),
        ("hv1", "virt.purge", nonce),
        ("hv1", "virt.vm_state", "n0"),
    ):
        with pytest.raises(answers.Unverified):
            answers.verify(pub, minion, fun, other, signed)


@pytest.mark.parametrize("field", ["body", "id", "sig"])
def test_a_tampered_answer_is_not_believed(keys, field):
    pub, pki = keys
    nonce = answers.new_nonce()
    signed = answers.sign(pki, "hv1", "virt.vm_state", nonce, {"web1": "running"})
    other = answers.sign(pki, "hv1", "virt.vm_state", nonce, {"web1": "shutoff"})
    tampered = dict(signed, **{field: other[field] if field != "id" else "hv2"})
    with pytest.raises(answers.Unverified):
        answers.verify(pub, "hv1", "virt.vm_state", nonce, tampered)


def test_an_answer_signed_with_another_key_is_not_believed(keys, tmp_path):
    pub, _pki = keys
    _other_pub, other_priv = keystore.keypair("another hypervisor")
    (tmp_path / "guest").mkdir()
    (tmp_path / "guest" / "minion.pem").write_text(other_priv)
    nonce = answers.new_nonce()
    forged = answers.sign(str(tmp_path / "guest"), "hv1", "virt.vm_state", nonce, {})
    with pytest.raises(answers.Unverified, match="does not match the accepted key"):
        answers.verify(pub, "hv1", "virt.vm_state", nonce, forged)
    with pytest.raises(answers.Unverified, match="not a signed"):
        answers.verify(pub, "hv1", "virt.vm_state", nonce, {"web1": "running"})


def test_a_signed_body_reads_as_salts_own_loads_without_walking_it(keys, monkeypatch):
    """Issue 40: Salt's loads reads every string as bytes and walks the whole answer to decode them (550 ms for 20,000
    VMs' answers, 168 ms without the walk: bench/RESULTS.md). A plain body is decoded by msgpack itself, with the
    same result; a body with a string that is not UTF-8, or a datetime (msgpack's extension type), is read Salt's
    way and reads as before."""
    import datetime

    import salt.payload
    import salt.transport.frame

    walks = []
    real_walk = salt.transport.frame.decode_embedded_strs
    monkeypatch.setattr(salt.transport.frame, "decode_embedded_strs", lambda src: walks.append(1) or real_walk(src))
    pub, pki = keys
    nonce = answers.new_nonce()
    plain = {"web1": {"state": "running", "disks": {"vda": {"file": "/srv/é.qcow2", "size": None}}}, 7: [b"x", 1.5]}
    signed = answers.sign(pki, "hv1", "virt.full_info", nonce, plain)
    expected = salt.payload.loads(base64.b64decode(signed["body"]))["ret"]
    walks.clear()
    assert answers.verify(pub, "hv1", "virt.full_info", nonce, signed) == (expected, 0)
    assert expected[7] == ["x", 1.5]  # bytes read as str, int keys stay ints: as Salt reads them
    assert not walks  # decoded by msgpack, not by Salt's walk
    for unusual in ({"raw": b"\xff\xfe", "name": "web1"}, {"at": datetime.datetime(2026, 11, 30, 21, 0)}):
        signed = answers.sign(pki, "hv1", "virt.full_info", nonce, unusual)
        got = answers.verify(pub, "hv1", "virt.full_info", nonce, signed)
        assert got == (salt.payload.loads(base64.b64decode(signed["body"]))["ret"], 0)
    assert got[0]["at"] == datetime.datetime(2026, 11, 30, 21, 0)
    raw = answers.verify(
        pub, "hv1", "virt.full_info", nonce, answers.sign(pki, "hv1", "virt.full_info", nonce, {"raw": b"\xff"})
    )
    assert raw == ({"raw": b"\xff"}, 0)  # Salt's walk leaves what is not UTF-8 as bytes, and so does this


def test_virt_answer_runs_a_virt_function_and_signs_its_result_or_its_error(tmp_path, keys):
    pub, pki = keys
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": pki})
    nonce = answers.new_nonce()
    signed = mods["virt.answer"]("virt.vm_state", nonce, kwargs={"vm_": "test"}, __pub_user="root", __pub_jid="1")
    assert answers.verify(pub, "hyper-test", "virt.vm_state", nonce, signed) == ({"test": "running"}, 0)
    failed = mods["virt.answer"]("virt.vm_state", nonce, kwargs={"vm_": "nope"})
    ret, retcode = answers.verify(pub, "hyper-test", "virt.vm_state", nonce, failed)
    assert retcode == 1 and ret.startswith("ERROR") and "nope" in ret
    missing = mods["virt.answer"]("virt.nothing_like_this", nonce)
    assert answers.verify(pub, "hyper-test", "virt.nothing_like_this", nonce, missing)[0] == (
        "'virt.nothing_like_this' is not available."
    )
    check = mods["virt.answer"](answers.JOB_CHECK, nonce, args=["20260101000000000000"])
    assert answers.verify(pub, "hyper-test", answers.JOB_CHECK, nonce, check) == ({}, 0)  # no such job running


@pytest.mark.parametrize("fun", ["cmd.run", "virt.answer", "state.apply", None])
def test_virt_answer_runs_nothing_but_virt_and_the_job_check(tmp_path, keys, fun):
    from salt.exceptions import SaltInvocationError

    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": keys[1]})
    with pytest.raises(SaltInvocationError, match="virt.answer runs virt.\\* functions"):
        mods["virt.answer"](fun, answers.new_nonce(), args=["id"])


def test_virt_answer_is_for_operators_only(tmp_path, keys):
    from salt.exceptions import CommandExecutionError

    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": keys[1]})
    with pytest.raises(CommandExecutionError, match="for operators"):
        mods["virt.answer"]("virt.vm_state", answers.new_nonce(), __pub_user="tenant1")


def test_virt_answer_for_a_tenant_refuses_a_vm_of_another_owner(tmp_path, keys):
    """Defence in depth (issue 34): the runner's per-VM call for a tenant carries the tenant, and the hypervisor
    refuses a domain whose recorded owner differs, whatever the runner decided."""
    pub, pki = keys
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": pki})
    nonce = answers.new_nonce()
    refused = mods["virt.answer"]("virt.stop", nonce, args=["test"], tenant="acme", __pub_user="root")
    ret, retcode = answers.verify(pub, "hyper-test", "virt.stop", nonce, refused)
    assert (ret, retcode) == ("ERROR: no VM named test in tenant acme", 1)
    assert mods["virt.vm_state"]("test") == {"test": "running"}  # untouched


def test_a_job_the_check_said_was_not_running_does_nothing_when_it_starts_late(tmp_path, keys):
    """The master falls over to another hypervisor on a signed "not running": the late job must not create
    the VM here too (Salt's proc file is written only after the job's process loaded its modules)."""
    pub, pki = keys
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": pki})
    jid, nonce = "20261129000000000042", answers.new_nonce()
    check = mods["virt.answer"](answers.JOB_CHECK, nonce, args=[jid])
    assert answers.verify(pub, "hyper-test", answers.JOB_CHECK, nonce, check) == ({}, 0)
    late = mods["virt.answer"]("virt.stop", nonce, args=["test"], __pub_user="root", __pub_jid=jid)
    ret, retcode = answers.verify(pub, "hyper-test", "virt.stop", nonce, late)
    assert retcode == 1 and "did nothing" in ret, ret
    assert mods["virt.vm_state"]("test") == {"test": "running"}


def test_virt_init_is_refused_on_the_host_when_it_no_longer_has_room(tmp_path, keys):
    """Issue 40: placement may run on a pushed (stale) record, so virt.answer checks the room virt.init takes on what
    the host holds now, before virt.init runs: refused in the words the runner falls over on, nothing defined."""
    pub, pki = keys
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": pki})
    nonce = answers.new_nonce()
    need = {"cpu": 1, "mem": 10**9, "disk_mib": 0, "mem_reserve_mib": 0, "cpu_overcommit": 4.0, "disk_reserve_mib": 0}
    signed = mods["virt.answer"]("virt.init", nonce, args=["big1", 1, 10**9], capacity=need, __pub_user="root")
    ret, retcode = answers.verify(pub, "hyper-test", "virt.init", nonce, signed)
    assert retcode == 1 and ret.startswith(f"ERROR: {answers.NO_ROOM} for big1: memory: needs 1e+09 MiB")
    assert "big1" not in mods["virt.list_domains"]()
    fits = dict(need, mem=1)  # what fits passes the check and reaches virt.init (which says why it cannot go on)
    signed = mods["virt.answer"]("virt.init", nonce, args=["small1", 1, 1], capacity=fits, __pub_user="root")
    ret, retcode = answers.verify(pub, "hyper-test", "virt.init", nonce, signed)
    assert answers.NO_ROOM not in str(ret)


def test_pushed_capacity_reaches_the_masters_mine_signed_and_for_the_master_only(tmp_path, keys, monkeypatch):
    """virt.push_capacity: Salt's mine.send with the signed record, stored by the master's own mine code under the id
    the request came from, and readable by no other minion (a minion-side ACL of this hypervisor's id: a tenant VM's
    minion asking mine.get for it gets nothing)."""
    import salt.cache
    import salt.config
    import salt.daemons.masterapi
    import salt.utils.event
    import salt.utils.mine

    pub, pki = keys
    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pki_dir": pki, "file_client": "remote"})
    master = dict(salt.config.master_config(None), cachedir=str(tmp_path / "master"))
    stored = []

    class ToMaster:
        """Stand-in for the minion's own bus and request channel (no salt-minion or salt-master in a unit test;
        Salt authenticates the id on that channel: its token, checked against the accepted key): mine.send's
        load, as fired, is handed to the master's own _mine, which stores it."""

        def __init__(self, opts, listen=False):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def fire_event(self, load, tag):
            if threading.get_ident() != caller:
                # an engine's capacity pusher that an earlier test in this process started (its thread outlives
                # that test and pushes on test:///default's lifecycle events, or virt:capacity_push:every's beat)
                # pushed through this stand-in too (run K4): not this call
                return True
            assert tag == "_minion_mine"
            stored.append(load["id"])
            funcs = salt.daemons.masterapi.RemoteFuncs(master)
            try:
                return funcs._mine(dict(load))
            finally:
                funcs.mminion.destroy()

    caller = threading.get_ident()
    monkeypatch.setattr(salt.utils.event, "MinionEvent", ToMaster)
    assert mods["virt.push_capacity"]() is True and stored == ["hyper-test"]
    entry = salt.cache.Cache(master).fetch("mine", "hyper-test")[answers.MINE_KEY]
    assert entry["allow_tgt"] == "hyper-test" and entry["allow_tgt_type"] == "list"
    at, cap = answers.verify_record(pub, "hyper-test", entry[salt.utils.mine.MINE_ITEM_ACL_DATA])
    assert cap["host"]["vms_defined"] == 1 and "test" in cap["vm_info"]
    with pytest.raises(answers.Unverified, match="another id"):
        answers.verify_record(pub, "hyper-other", entry[salt.utils.mine.MINE_ITEM_ACL_DATA])
    for mid in ("hyper-test", "web1"):  # the hypervisor and a tenant VM's minion, both accepted on this master
        (tmp_path / "master-pki" / "minions").mkdir(parents=True, exist_ok=True)
        (tmp_path / "master-pki" / "minions" / mid).write_text(pub)
    funcs = salt.daemons.masterapi.RemoteFuncs(dict(master, pki_dir=str(tmp_path / "master-pki")))
    try:  # what a minion's mine.get of it gets: the master's own answer to that request
        ask = {"tgt": "hyper-test", "fun": answers.MINE_KEY, "tgt_type": "glob"}
        assert funcs._mine_get(dict(ask, id="web1")) == {}
        assert funcs._mine_get(dict(ask, id="hyper-test"))["hyper-test"]["sig"] == entry["__data__"]["sig"]
    finally:
        funcs.mminion.destroy()
