"""saltvirt.fleet.relocate: the migration settings from the master config (moving VMs needs hypervisors:
tests/integration/test_migration.py)."""

import pytest
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.fleet import relocate


def test_settings_defaults_config_and_the_calls_own_tunnel():
    assert relocate.settings({}) == (False, float(relocate.DEFAULT_TIMEOUT))
    assert relocate.settings({"tunnel": True, "migration_timeout": "90"}) == (True, 90.0)
    assert relocate.settings({"tunnel": True}, tunnel=False)[0] is False
    assert relocate.settings({}, tunnel="yes")[0] is True


@pytest.mark.parametrize("bad", ["soon", 0, -5, True])
def test_settings_refuse_a_bad_migration_timeout(bad):
    with pytest.raises(SaltInvocationError, match="^virt:migration_timeout must be a number of seconds above 0"):
        relocate.settings({"migration_timeout": bad})


# the shared store (redis) dying during a migration -----------------------------------------------------
class _Hypervisors:
    """relocate.Remote's part migrate uses, answering each step of a shared-storage migration of web1 from
    hv1 to hv2 and recording it. A stand-in for Salt's publication (tests/integration/test_migration.py
    migrates through real ones); what the real one reads from the shared store before publishing (which
    minions are hypervisors, hypervisors.members) it reads for real. ``crash_after``: the step after which
    redis dies."""

    def __init__(self, opts, server, crash_after):
        self.opts, self.server, self.crash_after, self.calls = opts, server, crash_after, []

    def gather(self, fun):
        return {"hv1": {"status": "up", "vms": {"web1": "running"}}, "hv2": {"status": "up", "vms": {}}}

    def call(self, minion, fun, *args, **kwargs):
        from saltvirt.fleet import hypervisors

        hypervisors.members(self.opts, [minion])  # as fleet.run does before it publishes
        self.calls.append((minion, fun))
        ret = {
            "virt.migrate_source_info": {"active": True, "probes": {}},
            "virt.migrate_prepare": {
                "copy_storage": None,
                "unsafe": True,
                "disk_map": None,
                "migrate_disks": None,
                "verify_backing": None,
                "address": "hv2",
                "created": ["/srv/vms/web1/made-for-it"],
                "disks": [],
            },
            "virt.migrate": {"undefined_on_source": True, "live": True, "tunnelled": False, "target_uri": "x"},
            "virt.migrate_finish": {"host": "hv2", "state": "running", "persistent": True, "disks": []},
            "virt.migrate_abort_cleanup": {"removed": args[1] if len(args) > 1 else []},
        }[fun]
        if fun == self.crash_after:
            self.server.crash()
        return dict(ret, seconds=0.1) if fun == "virt.migrate" else ret


@pytest.fixture
def redis_opts(tmp_path):
    import salt.config

    from tests.support.redis_server import RedisServer

    server = RedisServer().start()
    opts = dict(salt.config.master_config(None), id="m1", cachedir=str(tmp_path), **server.master_opts())
    opts["virt"] = {"hypervisors": {"tgt": "hv*"}}
    yield opts, server
    server.stop()


def test_a_store_gone_before_the_move_migrates_nothing_and_takes_back_what_the_target_made(redis_opts):
    opts, server = redis_opts
    remote = _Hypervisors(opts, server, crash_after="virt.migrate_prepare")
    with pytest.raises(CommandExecutionError) as err:
        relocate.migrate(remote, "web1", "hv2")
    assert str(err.value).startswith("VM 'web1' was not migrated, it stays on hv1: the shared runner state (redis")
    assert "virt.migrate" not in [fun for _m, fun in remote.calls]
    assert ("hv2", "virt.migrate_abort_cleanup") not in remote.calls  # the store is needed to reach it too ...
    assert "Connection refused" in err.value.details["target_cleanup"]["error"]  # ... and the answer says so


def test_a_store_lost_during_the_move_still_reports_the_migration(redis_opts):
    opts, server = redis_opts
    ret = relocate.migrate(_Hypervisors(opts, server, crash_after="virt.migrate"), "web1", "hv2")
    assert (ret["source"], ret["target"], ret["state"]) == ("hv1", "hv2", "unknown")
    unconfirmed, unreleased = ret["warnings"]
    assert unconfirmed.startswith("the migration of VM 'web1' finished (the source's libvirt reported it done), but")
    assert "hv2 could not be asked how the VM runs there: the shared runner state (redis" in unconfirmed
    assert unreleased.startswith("the lock of 'web1' could not be given back: the shared runner state (redis")
    assert unreleased.endswith("(it expires by itself 60 s after its last renewal, virt:shared:lock_ttl)")
