"""A master's view of a fleet without a salt-master, for unit tests of the runner's fleet code: hypervisors
that sign their answers with their own keys (real keys and signatures, :mod:`saltvirt.pki.answers`) over a
stand-in for LocalClient, because a real one needs a running salt-master (tests/integration/test_runner.py,
test_tenants.py and test_authority.py publish through real ones).

:func:`fleet_opts` gives master opts whose accepted keys are the hypervisors' (``hv*``), with short waits;
:class:`SigningClient` answers the runner's publications from canned answers (or live ones: callables, e.g. a
test-driver hypervisor's real host-layer functions) and records them."""

import atexit
import functools
import pathlib
import shutil
import tempfile
import time

import salt.client
import salt.config
from salt.exceptions import SaltException

from saltvirt.pki import answers, envelope

# a hypervisor with no answer stays silent: down after these (seconds), not the product's 25 s
QUICK_WAITS = {"timeout": 0.05, "gather_job_timeout": 0.05, "down_after": 0.1}


@functools.cache
def _keys_dir():
    path = tempfile.mkdtemp(prefix="svkeys-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return pathlib.Path(path)


@functools.cache
def minion_key(mid):
    """``(public PEM, pki_dir holding minion.pem)`` of hypervisor ``mid``: one per id per test process (RSA
    generation is the slow part)."""
    pub, priv = envelope.new_keypair()
    pki = _keys_dir() / mid
    pki.mkdir()
    (pki / "minion.pem").write_text(priv)
    return pub, str(pki)


def master_opts(tmp_path):
    """Master opts with the default cache (localfs, one master), as salt-run has them."""
    opts = dict(salt.config.master_config(None), id="master", cachedir=str(tmp_path))
    assert opts["cache"] == "localfs"
    return opts


def fleet_opts(tmp_path, ids, **virt):
    """:func:`master_opts` whose ``virt:hypervisors`` (``hv*``, :data:`QUICK_WAITS`) are the accepted keys of
    ``ids``; ``virt``: more ``virt:`` keys (``tenants``, ...)."""
    opts = accept(master_opts(tmp_path), tmp_path, ids)
    opts["virt"].update(virt)
    return opts


def accept(opts, tmp_path, ids):
    """``opts`` (a master's, changed in place: a runner loader's own) with hypervisors ``hv*``
    (:data:`QUICK_WAITS`), each of ``ids`` accepted with its key in ``tmp_path/pki``."""
    opts.update(pki_dir=str(tmp_path / "pki"), virt={"hypervisors": {"tgt": "hv*", **QUICK_WAITS}})
    (tmp_path / "pki" / "minions").mkdir(parents=True, exist_ok=True)
    for mid in ids:
        (tmp_path / "pki" / "minions" / mid).write_text(minion_key(mid)[0])
    return opts


class Bus:
    """The master event bus as the runner reads it: queued events, one per look."""

    def __init__(self):
        self.queue = []

    def get_event(self, tag="", wait=0, no_block=False, **_kw):
        for i, ev in enumerate(self.queue):
            if ev["tag"].startswith(tag):
                return self.queue.pop(i)
        if not no_block:  # Salt's blocking read: nothing came within ``wait``
            time.sleep(wait)
        return None


class SigningClient:
    """LocalClient's part ``publish.Fleet.run`` uses. Each publication of ``virt.answer`` is answered, signed by each
    hypervisor's own key, from ``answers[fun][minion]``; a hypervisor without an answer is silent (``down``),
    unless it is ``busy``: then it says to job checks that it still runs the job. ``published`` records
    ``(fun, sorted targets)`` of every function asked (job checks apart: ``checks`` counts them)."""

    def __init__(self, answers_by_fun, busy=(), room=None):
        # room: {minion: need -> reasons}, the hypervisor's own check of virt.answer's ``capacity`` (virt.init)
        self.answers, self.busy, self.room = answers_by_fun, set(busy), room or {}
        self.published, self.checks = [], 0
        self.event = Bus()
        self._jid = 0

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        self._jid += 1
        jid = jid or str(20260000000000000000 + self._jid)
        inner = kwarg["fun"]
        if inner == answers.JOB_CHECK:
            self.checks += 1
            for mid in tgt:
                if mid in self.busy:
                    self.reply(jid, mid, kwarg, {"jid": kwarg["args"][0]})  # still running
            return {"jid": jid, "minions": list(tgt)}
        self.published.append((inner, sorted(tgt)))
        for mid in sorted(tgt):
            reasons = self.room[mid](kwarg["capacity"]) if mid in self.room and "capacity" in kwarg else []
            if reasons:  # refused before the function runs, in virt.answer's words
                self.reply(jid, mid, kwarg, f"ERROR: {answers.NO_ROOM} for {kwarg['args'][0]}: {reasons[0]}", 1)
            elif mid in self.answers.get(inner, {}):
                self.reply(jid, mid, kwarg, *self._outcome(self.answers[inner][mid], kwarg))
        return {"jid": jid, "minions": list(tgt)}

    @staticmethod
    def _outcome(answer, kwarg):
        """``(ret, retcode)``: a canned answer as is; a callable one (a live hypervisor) called with the
        request's ``args``, ``kwargs`` and ``tenant`` as ``virt.answer`` would run it (a Salt error: retcode 1)."""
        if not callable(answer):
            return answer, 0
        try:
            return answer(*kwarg["args"], tenant=kwarg.get("tenant"), **kwarg["kwargs"]), 0
        except SaltException as exc:
            return f"ERROR: {exc}", 1

    def reply(self, jid, mid, kwarg, ret, retcode=0):
        signed = answers.sign(minion_key(mid)[1], mid, kwarg["fun"], kwarg["nonce"], ret, retcode)
        self.event.queue.append({"tag": f"salt/job/{jid}/ret/{mid}", "data": {"id": mid, "return": signed}})

    def _clean_up_subscriptions(self, jid):
        pass

    def __enter__(self):  # the runner's `with salt.client.get_local_client(...) as client`
        return self

    def __exit__(self, *exc):
        return False


def published_kwargs(job):
    """The keyword arguments the runner passed to the hypervisor's function in the job ``jobs.list_job`` shows:
    the runner publishes ``virt.answer`` with ``{fun, nonce, args, kwargs}`` (:mod:`saltvirt.pki.answers`)."""
    outer = next(a for a in job["Arguments"] if isinstance(a, dict))
    return outer["kwargs"] if job.get("Function") == "virt.answer" else outer


def serve(monkeypatch, client):
    """Have ``salt.client.get_local_client`` hand out ``client``: the runner's loader modules build their own
    LocalClient, and a real one needs a running salt-master."""
    monkeypatch.setattr(salt.client, "get_local_client", lambda *_args, **_kwargs: client)


def live_answers(conns, funs=("virt.full_info", "virt.vm_state", "virt.stop", "virt.start")):
    """Answers of live hypervisors for :class:`SigningClient`: ``conns`` is ``{minion: libvirt connection}`` (e.g.
    private ``test:///`` nodes), each function answered by the real host-layer code on that minion's connection
    as ``_modules/virt.py`` runs it, after ``virt.answer``'s own check of the VM's owner for a tenant's call."""
    from saltvirt.host import lifecycle, ownership, query

    def host(conn, fun):
        def answer(*args, tenant=None, **_kwargs):
            if tenant is not None:
                ownership.check(conn, str(args[0]), tenant)
            if fun == "virt.full_info":
                return query.full_info(conn, agent_timeout=0.1)
            if fun == "virt.vm_state":
                return query.vm_state(conn)
            if fun == "virt.stop":
                return bool(lifecycle.destroy(conn, args[0]))
            return bool(lifecycle.start(conn, args[0]))

        return answer

    return {fun: {mid: host(conn, fun) for mid, conn in conns.items()} for fun in funs}
