"""Master side of cleaning up after an interrupted ``salt-run virt.init`` (``salt-run virt.purge`` of a
VM that is defined nowhere): ``virt.cleanup`` on every hypervisor, and the runner's stale init lock.
The pre-accepted key is deleted by the runner's purge like any purged VM's key."""

import contextlib
import fcntl
import os

from salt.exceptions import CommandExecutionError


def master_running(opts):
    """Whether this master's salt-master still accepts connections on its ret port (the runner runs on
    the master host): when it stopped, a hypervisor that "did not answer" had no master to answer to."""
    import socket  # noqa: PLC0415 - only on this rare path

    host = opts.get("interface") or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((host, int(opts.get("ret_port", 4506))), timeout=5):
            return True
    except OSError:
        return False


def master_gone_message(name, host, jid, key_id):
    return (
        f"the salt-master stopped while virt.init of {name} ran on {host}"
        + (f" (job {jid})" if jid else "")
        + ": its outcome is unknown and "
        f"the job may finish without the master. Once the master is back, `salt-run virt.query` shows whether "
        f"{name} exists; the pre-accepted key of {key_id} is kept for it (`salt-run virt.purge {name}` removes the "
        "VM, whatever an interrupted init left, and the key)"
    )


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
            raise CommandExecutionError(f"a virt.init of {name!r} is running on this master: wait for it") from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True


def purge_leftovers(opts, name, cfg, client):
    """None if ``name`` is defined somewhere or a hypervisor did not answer (the VM may be there);
    otherwise run ``virt.cleanup name`` everywhere and return ``{name, defined, cleanup, lock_removed}``."""
    from saltvirt.fleet import publish as fleet  # noqa: PLC0415 - fleet imports this module

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
