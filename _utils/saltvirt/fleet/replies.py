"""Waiting for the hypervisors' signed replies to one publication (master side; used by
:meth:`saltvirt.fleet.publish.Fleet.run`).

What is believed: only a reply that the asked hypervisor signed for this request (:mod:`saltvirt.pki.answers`).
Anything else on the bus under the job's tag (a guest firing ``salt/job/<jid>/ret/<hypervisor>``, a return
remapped by a forged ``resource_id``) is logged and ignored, and the wait goes on for the real one.

Slow is not silent: a hypervisor that has not answered ``timeout`` seconds after the publication (or after
its last sign of life) is asked whether it still runs the job (Salt's ``saltutil.find_job``, asked through
``virt.answer`` so that the reply is signed too), every ``gather_job_timeout`` seconds. A signed "still
running" is a sign of life, however late it arrives (a loaded minion answers its checks late, not never), and
the wait goes on, up to ``max_wait``. A hypervisor is reported ``down`` only after ``down_after`` seconds
without any sign of life, or when it says the job is gone and no signed answer came (after a last look in the
master's job cache). A hypervisor reported down within ``down_memory`` seconds by an earlier call
(:mod:`saltvirt.fleet.silence`) is given up after one unanswered job check instead; any reply it signs clears it.
A silent hypervisor's resources are unregistered from Salt's registry, and registered again once it signs a reply
(:mod:`saltvirt.fleet.resourcereg`).
"""

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from saltvirt.base.salttypes import Data, SaltOpts
from saltvirt.fleet import minionkeys, resourcereg, silence
from saltvirt.pki import answers

log = logging.getLogger(__name__)

GONE_GRACE = 2.0  # seconds a reply may still be on its way after its job ended


class Replies:
    """The signed replies of ``expected`` to ``fun`` published as job ``jid`` with ``nonce``."""

    def __init__(
        self,
        opts: SaltOpts,
        client: Any,
        cfg: Data,
        jid: str,
        fun: str,
        nonce: str,
        expected: set[str],
        classify: Callable[[Any, Any], Data],
    ) -> None:
        self.opts, self.client, self.cfg = opts, client, cfg
        self.jid, self.fun, self.nonce = jid, fun, nonce
        self.classify = classify
        self.missing = set(expected)
        self.answers: dict[str, Data] = {}
        self.down: dict[str, Data] = {}
        self.unverified: dict[str, str] = {}  # minion -> why what came in its name was not believed
        self.keys: dict[str, str | None] = {}
        now = time.monotonic()
        self.started = now
        self.life = dict.fromkeys(expected, now)  # last sign of life (the publication, then a signed check)
        self.gone: dict[str, float] = {}  # the job ended there (a signed check said so) at
        self.checks: dict[str, tuple[str, set[str]]] = {}  # check jid -> (nonce, minions asked)
        self.asked: dict[str, float] = {}  # minion -> when its last outstanding check was sent
        # minion -> seconds since an earlier call reported it down (silence.py): one check, not down_after
        self.suspects = silence.recent(opts, expected, cfg.get("down_memory", 0))
        self.restored: set[str] = set()  # minions whose signed reply has been seen (resourcereg.restore asked)

    # reading -------------------------------------------------------------------------------------------
    def _pub(self, minion: str) -> str | None:
        if not self.keys:  # the first reply: every expected minion's key through one key store (~8 ms each else)
            try:
                self.keys.update(minionkeys.accepted_pubs(self.opts, sorted(self.life)))
            except Exception as exc:  # noqa: BLE001 - each is then read (and refused) on its own below
                log.debug("virt runner: reading the accepted keys at once failed: %s", exc)
        if minion not in self.keys:
            try:
                self.keys[minion] = minionkeys.accepted_pub(self.opts, minion)
            except Exception as exc:  # noqa: BLE001 - no accepted key: nothing it says can be believed
                log.warning("virt runner: no accepted key for %s: %s", minion, exc)
                self.keys[minion] = None
        return self.keys[minion]

    def _verified(self, minion: str, fun: str, nonce: str, reply: Any) -> tuple[Any, int] | None:
        pub = self._pub(minion)
        try:
            if pub is None:
                raise answers.Unverified("the master has no accepted key for it")
            return answers.verify(pub, minion, fun, nonce, reply)
        except answers.Unverified as exc:
            if minion not in self.unverified:
                log.warning("virt runner: ignored a reply in %s's name to job %s: %s", minion, self.jid, exc)
            shown = reply if isinstance(reply, str) else f"not believed: {exc}"
            self.unverified[minion] = str(shown)[:300]
            return None

    def _claimed(self, data: Any) -> tuple[str | None, Any]:
        if not isinstance(data, dict):
            return None, None
        reply = data.get("return")
        claimed = reply.get("id") if answers.is_answer(reply) else data.get("id")
        return (claimed if isinstance(claimed, str) else None), reply

    def take(self, event: Data) -> None:
        """One ``salt/job/<jid>/ret/<id>`` event: the publication's reply or a job check's."""
        parts = str(event.get("tag", "")).split("/")
        if len(parts) < 5 or parts[:2] != ["salt", "job"] or parts[3] != "ret":
            return
        minion, reply = self._claimed(event.get("data"))
        if minion is None:
            return
        if parts[2] == self.jid:
            if minion in self.missing:
                got = self._verified(minion, self.fun, self.nonce, reply)
                if got is not None:
                    self.answers[minion] = self.classify(*got)
                    self.missing.discard(minion)
                    self._alive(minion)
        elif parts[2] in self.checks:
            nonce, asked = self.checks[parts[2]]
            if minion in asked:
                got = self._verified(minion, answers.JOB_CHECK, nonce, reply)
                if got is not None:
                    self._checked(minion, got[0])

    def _alive(self, minion: str) -> None:
        """``minion`` signed a reply: whatever an earlier call found, it is not down (its resources, dropped when
        it was found down, are registered again)."""
        if self.suspects.pop(minion, None) is not None:
            silence.forget(self.opts, minion)
        if minion not in self.restored:
            self.restored.add(minion)
            resourcereg.restore(self.opts, self.client, minion)

    def _checked(self, minion: str, running: Any) -> None:
        self.asked.pop(minion, None)
        self._alive(minion)
        if running:
            self.life[minion] = time.monotonic()
            self.gone.pop(minion, None)
        else:
            self.gone.setdefault(minion, time.monotonic())

    # asking ----------------------------------------------------------------------------------------------
    def due(self, now: float) -> list[str]:
        """Minions to ask now whether they still run the job."""
        due = []
        for minion in sorted(self.missing - set(self.gone)):
            sent = self.asked.get(minion)
            if sent is not None and now - sent < self.cfg["gather_job_timeout"]:
                continue  # its check is still out
            if now - self.life[minion] >= self.cfg["timeout"]:
                due.append(minion)
        return due

    def ask(self, now: float) -> None:
        due = self.due(now)
        if not due:
            return
        nonce = answers.new_nonce()
        request = {"fun": answers.JOB_CHECK, "nonce": nonce, "args": [self.jid], "kwargs": {}}
        try:
            pub = self.client.run_job(
                due, "virt.answer", [], "list", timeout=self.cfg["gather_job_timeout"], kwarg=request, listen=True
            )
        except Exception as exc:  # noqa: BLE001 - a check that cannot be sent is a check not answered
            log.warning("virt runner: could not ask %s about job %s: %s", ", ".join(due), self.jid, exc)
            pub = None
        for minion in due:
            self.asked[minion] = now
        if pub and pub.get("jid"):
            self.checks[pub["jid"]] = (nonce, set(due))

    # deciding --------------------------------------------------------------------------------------------
    def silent(self, now: float) -> list[str]:
        """The minions silent for ``down_after`` seconds, or whose job is gone for a while."""
        silent = []
        for minion in self.missing:
            gone = self.gone.get(minion)
            quiet = now - self.life[minion] >= self.cfg["timeout"] + self._patience(minion)
            if quiet or (gone is not None and now - gone >= GONE_GRACE):
                silent.append(minion)
        return silent

    def _patience(self, minion: str) -> float:
        """Seconds without a sign of life, after the first ``timeout``, before ``minion`` is down."""
        if minion in self.suspects:  # one job check's answer time, never more than a first silence gets
            return min(self.cfg["gather_job_timeout"], self.cfg["down_after"])
        return self.cfg["down_after"]

    def give_up(self, now: float) -> None:
        """Give up the :meth:`silent` minions (after a last look in the job cache)."""
        silent = self.silent(now)
        if not silent:
            return
        self.from_job_cache(silent)
        for minion in silent:
            if minion in self.missing:
                self.down[minion] = self.down_answer(minion)
                self.missing.discard(minion)
                if minion not in self.gone:  # silent, not merely without an answer to this job
                    silence.remember(self.opts, minion)
                    resourcereg.drop(self.opts, minion, "no signed reply, nor to its job checks")

    def from_job_cache(self, minions: list[str]) -> None:
        """A last look in the master's job cache for replies whose event was missed."""
        try:
            import salt.loader  # noqa: PLC0415 - only when a reply went missing

            returners = salt.loader.returners(self.opts, {})
            cached = returners[f"{self.opts['master_job_cache']}.get_jid"](self.jid) or {}
        except Exception as exc:  # noqa: BLE001 - the cache is a second chance, not the source
            log.debug("virt runner: job cache for %s not read: %s", self.jid, exc)
            return
        for minion in minions:
            entry = cached.get(minion)
            if isinstance(entry, dict) and minion in self.missing:
                got = self._verified(minion, self.fun, self.nonce, entry.get("return"))
                if got is not None:
                    self.answers[minion] = self.classify(*got)
                    self.missing.discard(minion)
                    self._alive(minion)

    def down_answer(self, minion: str) -> Data:
        if minion in self.gone:
            why = "its job ended there without a reply signed by its key"
        elif minion in self.suspects:
            why = (
                f"no sign of life for {self._patience(minion):g} s after the first {self.cfg['timeout']:g} s, "
                f"and reported down {self.suspects[minion]:.0f} s ago: its job checks went unanswered"
            )
        else:
            why = (
                f"no sign of life for {self.cfg['down_after']:g} s after the first {self.cfg['timeout']:g} s: "
                "its job checks went unanswered"
            )
        if minion in self.unverified:
            why += f"; what came in its name was not believed ({self.unverified[minion]})"
        # gone: it signed that the job is not running, which fences the job there for good
        # (saltvirt.base.jobfence); otherwise the job may still run
        return {"status": "down", "error": f"did not answer ({why})", "gone": minion in self.gone}

    def clean_up(self) -> None:
        for jid in [self.jid, *self.checks]:
            with contextlib.suppress(Exception):
                self.client._clean_up_subscriptions(jid)
