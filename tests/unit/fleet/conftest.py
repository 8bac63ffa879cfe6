"""Fixtures of the fleet tests: "masters" (opts with their own ids) sharing one runner state store."""

import pytest

from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["localfs", "redis"])
def backend(request, tmp_path):
    """``make(master_id) -> opts`` sharing one store (one cachedir for localfs, one redis db)."""
    import salt.config

    extra = {}
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        server.client().flushdb()
        extra = server.master_opts()

    def make(mid="m1", **virt):
        opts = salt.config.master_config(None)
        opts.update({"id": mid, "cachedir": str(tmp_path / "cache"), "virt": {"shared": virt} if virt else {}})
        opts.update(extra)
        return opts

    make.name = request.param
    return make
