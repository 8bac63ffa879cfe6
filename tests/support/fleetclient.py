"""A master's view of a fleet without a salt-master: :class:`RecordingClient` answers the runner's
publications (:func:`saltvirt.fleet.publish.run`) from canned answers and records them; :func:`fleet_opts`
gives master opts whose accepted keys are the hypervisors'. A stand-in for LocalClient, which needs a running
salt-master (tests/integration/test_runner.py and test_tenants.py publish through real ones)."""

import salt.config


class RecordingClient:
    """LocalClient's part fleet.run uses, answering each publication from ``answers[fun][minion]`` (a minion
    without one does not answer: ``down``) and recording what was published as ``(fun, sorted targets)``."""

    def __init__(self, answers):
        self.answers, self.published = answers, []
        self.event = None

    def run_job(self, tgt, fun, arg, tgt_type, timeout=None, kwarg=None, listen=True, jid=""):
        self.published.append((fun, sorted(tgt)))
        self._fun, self._tgt = fun, list(tgt)
        return {"jid": jid or str(len(self.published)), "minions": list(tgt)}

    def get_iter_returns(self, jid, minions, **_kw):
        for mid in self._tgt:
            if mid in self.answers.get(self._fun, {}):
                yield {mid: {"ret": self.answers[self._fun][mid], "retcode": 0}}

    def _clean_up_subscriptions(self, jid):
        pass


def master_opts(tmp_path):
    """Master opts with the default cache (localfs, one master), as salt-run has them."""
    opts = dict(salt.config.master_config(None), id="master", cachedir=str(tmp_path))
    assert opts["cache"] == "localfs"
    return opts


def fleet_opts(tmp_path, ids, **virt):
    """:func:`master_opts` whose ``virt:hypervisors`` (``hv*``) are the accepted keys ``ids``; ``virt``: more
    ``virt:`` keys (``tenants``, ...)."""
    opts = master_opts(tmp_path)
    opts.update(pki_dir=str(tmp_path / "pki"), virt={"hypervisors": {"tgt": "hv*"}, **virt})
    (tmp_path / "pki" / "minions").mkdir(parents=True)
    for mid in ids:
        (tmp_path / "pki" / "minions" / mid).write_text("-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----\n")
    return opts
