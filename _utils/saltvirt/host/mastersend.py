"""Events from a hypervisor minion's engine straight to its master(s), as ``salt-call event.send`` does."""

import os
import time

from salt.exceptions import CommandExecutionError


class MasterSender:
    """``fire(tag, data)`` straight to the master's request server, as ``salt-call event.send`` does:
    the master confirms it took the event (the minion's own event bus drops events while the minion is
    not connected, e.g. while it starts, without telling). Raises CommandExecutionError when no master
    took it. With several masters, every one gets it. The master publishes it on its bus with the
    minion id it authenticated (``data['id']``)."""

    def __init__(self, opts, timeout=10):
        self.opts, self.timeout, self.uris = opts, timeout, None

    def _master_uris(self):
        if self.opts.get("master_uri_list"):
            return list(self.opts["master_uri_list"])
        if self.opts.get("master_uri"):
            return [self.opts["master_uri"]]
        import salt.minion  # noqa: PLC0415 - only on a minion, and only when its opts lack the URI

        masters = self.opts["master"] if isinstance(self.opts["master"], list) else [self.opts["master"]]
        return [salt.minion.resolve_dns(dict(self.opts, master=m))["master_uri"] for m in masters]

    def _await_minion_key(self):
        """The minion's own key pair, made by the minion's main process when it first starts. The engine
        runs in a process of its own and starts before the minion signs in: Salt's channel would make a
        second key pair here, the master (auto_accept) would take one and deny the other, and the minion
        exit. So the sender waits for the minion's key (bounded) and never makes one."""
        if self.opts.get("keys.cache_driver", "localfs_key") != "localfs_key":
            return  # keys kept elsewhere: the minion's files are not ours to look at
        paths = [os.path.join(self.opts["pki_dir"], f"minion.{ext}") for ext in ("pem", "pub")]
        deadline = time.monotonic() + self.timeout
        while not all(os.path.exists(p) for p in paths):
            if time.monotonic() >= deadline:
                raise CommandExecutionError(
                    f"the minion has no key yet in {self.opts['pki_dir']} (it makes one when it first starts); "
                    "nothing was sent"
                )
            time.sleep(0.2)

    def __call__(self, tag, data):
        import salt.channel.client  # noqa: PLC0415 - minion side only

        self._await_minion_key()
        self.uris = self.uris or self._master_uris()
        load = {"id": self.opts["id"], "tag": tag, "data": data, "cmd": "_minion_event"}
        took, errors = 0, []
        for uri in self.uris:
            try:
                with salt.channel.client.ReqChannel.factory(self.opts, master_uri=uri) as channel:
                    channel.send(load, tries=1, timeout=self.timeout)
                took += 1
            except Exception as exc:  # noqa: BLE001 - reported below, the event is kept for a retry
                errors.append(f"{uri}: {exc or type(exc).__name__}")
        if not took:
            self.uris = None  # resolve again next time (the master may have moved)
            raise CommandExecutionError(f"no master took the event: {'; '.join(errors)}")
        return True
