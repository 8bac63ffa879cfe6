"""Hypervisors that sign their answers, without a salt-master: what the runner's fleet code (``fleet.run``)
reads from LocalClient, for unit tests. The keys and signatures are real (:mod:`saltvirt.pki.answers`); the
wire is a stand-in because a real one needs a running salt-master (tests/integration/test_runner.py and
test_authority.py go through one)."""

import functools

import salt.client

from saltvirt.pki import answers, envelope


@functools.cache
def _keypair(mid):
    return envelope.new_keypair()  # one per minion id per test process: RSA generation is the slow part


def fleet_opts(opts, tmp_path, ids):
    """``opts`` (a master's) with hypervisors ``hv*``, each of ``ids`` accepted with its own key; the
    minions' private keys in ``tmp_path/<id>-pki/minion.pem``."""
    opts.update(pki_dir=str(tmp_path / "pki"), virt={"hypervisors": {"tgt": "hv*"}})
    (tmp_path / "pki" / "minions").mkdir(parents=True, exist_ok=True)
    for mid in ids:
        pub, priv = _keypair(mid)
        (tmp_path / "pki" / "minions" / mid).write_text(pub)
        (tmp_path / f"{mid}-pki").mkdir(exist_ok=True)
        (tmp_path / f"{mid}-pki" / "minion.pem").write_text(priv)
    return opts


class Bus:
    """The master event bus as the runner reads it: queued events, one per look."""

    def __init__(self):
        self.queue = []

    def get_event(self, tag="", **_kw):
        for i, ev in enumerate(self.queue):
            if ev["tag"].startswith(tag):
                return self.queue.pop(i)
        return None


class SigningClient:
    """LocalClient's part ``fleet.run`` uses. Each publication of ``virt.answer`` is answered, signed by each
    hypervisor's own key, from ``answers[fun][minion]`` (no entry: that hypervisor is still at work, and says
    so to job checks); ``published`` records ``(fun, sorted targets)`` of every virt function asked."""

    def __init__(self, tmp_path, answers_by_fun, silent=()):
        self.tmp_path, self.answers, self.silent = tmp_path, answers_by_fun, set(silent)
        self.published, self.checks = [], 0
        self.event = Bus()
        self._jid = 0

    def new_jid(self, jid=""):
        self._jid += 1
        return jid or str(20260000000000000000 + self._jid)

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        jid = self.new_jid(jid)
        inner = kwarg["fun"]
        if inner == answers.JOB_CHECK:
            self.checks += 1
            for mid in tgt:
                if mid not in self.silent:
                    self.reply(jid, mid, kwarg, {"jid": kwarg["args"][0]})  # still running
            return {"jid": jid, "minions": list(tgt)}
        self.published.append((inner, sorted(tgt)))
        for mid in sorted(tgt):
            if mid in self.answers.get(inner, {}):
                self.reply(jid, mid, kwarg, self.answers[inner][mid])
        return {"jid": jid, "minions": list(tgt)}

    def reply(self, jid, mid, kwarg, ret, retcode=0):
        pki = str(self.tmp_path / f"{mid}-pki")
        signed = answers.sign(pki, mid, kwarg["fun"], kwarg["nonce"], ret, retcode)
        self.event.queue.append({"tag": f"salt/job/{jid}/ret/{mid}", "data": {"id": mid, "return": signed}})

    def _clean_up_subscriptions(self, jid):
        pass

    def __enter__(self):  # the runner's `with salt.client.get_local_client(...) as client`
        return self

    def __exit__(self, *exc):
        return False


def serve(monkeypatch, client):
    """Have ``salt.client.get_local_client`` hand out ``client``: the runner's loader modules build their own
    LocalClient, and a real one needs a running salt-master."""
    monkeypatch.setattr(salt.client, "get_local_client", lambda *_args, **_kwargs: client)
