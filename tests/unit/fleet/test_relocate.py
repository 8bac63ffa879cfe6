"""saltvirt.fleet.relocate: the migration settings from the master config (moving VMs needs hypervisors:
tests/integration/test_migration.py)."""

import pytest
from salt.exceptions import SaltInvocationError

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
