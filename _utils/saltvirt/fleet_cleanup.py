"""Master side of cleaning up after an interrupted ``salt-run virt.init`` (``salt-run virt.purge`` of a
VM that is defined nowhere): ``virt.cleanup`` on every hypervisor, and the runner's stale init lock.
The pre-accepted key is deleted by the runner's purge like any purged VM's key."""

import contextlib
import fcntl
import os

from saltvirt import fleet


def _stale_lock(opts, name):
    """Remove the runner's init lock file of ``name`` if no virt.init holds it; True if removed."""
    path = os.path.join(opts["cachedir"], "salt-virt", "locks", f"init-{name}")
    try:
        fh = open(path, "a")  # noqa: SIM115 - closed below, after the lock test
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise fleet.Failed(f"a virt.init of {name!r} is running on this master: wait for it") from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True


def purge_leftovers(opts, name, cfg, client):
    """None if ``name`` is defined somewhere or a hypervisor did not answer (the VM may be there);
    otherwise run ``virt.cleanup name`` everywhere and return ``{name, defined, cleanup, lock_removed}``."""
    hosts = fleet.gather(opts, "virt.vm_state", cfg, client)
    if fleet.down_hosts(hosts) or any(name in (a.get("vms") or {}) for a in hosts.values()):
        return None
    answers, _jid = fleet.run(opts, "virt.cleanup", [name], cfg=cfg, client=client)
    report = {}
    for mid, ans in answers.items():
        report[mid] = ans["ret"] if ans["status"] == "up" else {"error": f"{ans['status']}: {ans.get('error')}"}
    failed = sorted(m for m, r in report.items() if "error" in r or r.get("errors"))
    out = {"name": name, "defined": False, "cleanup": report, "lock_removed": _stale_lock(opts, name)}
    if failed:
        out["error"] = f"virt.cleanup of {name} did not finish on {', '.join(failed)}: see cleanup"
    return out
