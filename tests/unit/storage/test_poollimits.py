"""saltvirt.storage.poollimits: the operator's limits on a pool definition, checked by themselves (through
Salt's calls: tests/unit/storage/test_poolcalls.py)."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.storage import poollimits
from saltvirt.xml import poolxml


def test_check_pool_by_itself():
    settings = {"pool_paths": ("/srv/pools",), "pool_sources": {"hosts": ("*.example.com",)}}
    poollimits.check_pool(poolxml.pool_spec("p", "dir", "/srv/pools/p"), settings, "/srv/salt-images")
    poollimits.check_pool(
        poolxml.pool_spec("g", "gluster", source_hosts=["gl1.example.com"], source_name="gv0"), settings, "/x"
    )
    with pytest.raises(SaltInvocationError, match="source host gl1 is not one"):
        poollimits.check_pool(
            poolxml.pool_spec("g", "gluster", source_hosts=["gl1"], source_name="gv0"), settings, "/x"
        )
    with pytest.raises(SaltInvocationError, match=r"outside the directories pools may use \(none\)"):
        poollimits.check_pool(poolxml.pool_spec("p", "dir", "/srv/pools/p"), {}, "/x")
