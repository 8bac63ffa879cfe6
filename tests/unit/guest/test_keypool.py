"""saltvirt.guest.keypool: new minions' key pairs made ahead (issue #40: RSA generation was most of what
seeding added to virt.init). Real pairs, real files, a real detached refill process."""

import json
import os
import stat
import subprocess
import sys
import time

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.guest import keypool
from saltvirt.pki import envelope


@pytest.fixture
def pool(tmp_path):
    path = tmp_path / "cache" / "saltvirt" / "keypool"
    path.mkdir(parents=True, mode=0o700)
    return str(path)


def wait_for(cond, timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_pair_is_taken_once_and_removed(pool):
    assert keypool.fill(pool, 2, envelope.new_keypair) == 2
    names = keypool.ready(pool)
    assert len(names) == 2
    for name in names:
        assert stat.S_IMODE(os.stat(os.path.join(pool, name)).st_mode) == 0o600
    first, second = keypool.take(pool, 2), keypool.take(pool, 2)
    assert first and second and first != second
    assert first[0].startswith("-----BEGIN PUBLIC KEY-----") and "PRIVATE KEY" in first[1]
    assert keypool.take(pool, 2) is None  # none left: the caller makes its own
    assert os.listdir(pool) == [keypool.LOCK]  # nothing of a taken pair stays behind


def test_no_pool_no_pair(pool):
    keypool.fill(pool, 1, envelope.new_keypair)
    assert keypool.take(None, 2) is None and keypool.take(pool, 0) is None
    assert len(keypool.ready(pool)) == 1


def test_a_pair_others_could_read_is_never_handed_out(pool):
    keypool.fill(pool, 1, envelope.new_keypair)
    os.chmod(os.path.join(pool, keypool.ready(pool)[0]), 0o644)
    assert keypool.take(pool, 1) is None
    assert keypool.ready(pool) == []  # and it is gone


def test_a_pool_others_can_reach_is_not_used(pool):
    keypool.fill(pool, 1, envelope.new_keypair)
    os.chmod(pool, 0o755)
    assert keypool.take(pool, 1) is None
    assert keypool.refill(pool, 2) is None  # nor filled
    assert keypool.fill(pool, 2, envelope.new_keypair) == 0


def test_one_fill_at_a_time(pool):
    import fcntl

    fd = os.open(os.path.join(pool, keypool.LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert keypool.fill(pool, 2, envelope.new_keypair) == 0
    finally:
        os.close(fd)
    assert keypool.fill(pool, 2, envelope.new_keypair) == 2


def test_a_claim_whose_claimer_died_is_removed(pool):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = os.path.join(pool, f"1-1{keypool.SUFFIX}.taken-{dead.pid}")
    with open(left, "w") as fh:
        json.dump({"pub": "p", "priv": "k"}, fh)
    keypool.fill(pool, 1, envelope.new_keypair)
    assert not os.path.exists(left)


def test_the_refill_runs_detached_and_fills_the_pool(tmp_path):
    """After an init the pool is topped up by a process of its own (it outlives a minion's job process),
    which finds saltvirt where this copy lives."""
    pool = str(tmp_path / "fresh" / "keypool")
    proc = keypool.refill(pool, 2)
    assert proc is not None and stat.S_IMODE(os.stat(pool).st_mode) == 0o700
    assert proc.wait(timeout=120) == 0
    wait_for(lambda: len(keypool.ready(pool)) == 2)
    pub, priv = keypool.take(pool, 2)
    assert pub.startswith("-----BEGIN PUBLIC KEY-----") and priv.startswith("-----BEGIN RSA PRIVATE KEY-----")
    assert keypool.refill(pool, 1) is None  # full enough: nothing started


@pytest.mark.parametrize("value", [-1, 65, "2", 1.5, True, None])
def test_the_pool_size_is_checked(value):
    with pytest.raises(SaltInvocationError, match="virt:insecure_seed_key_pool"):
        keypool.pool_size(value)
    assert keypool.pool_size(0) == 0 and keypool.pool_size(keypool.DEFAULT_SIZE) == 2
