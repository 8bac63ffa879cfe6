"""_engines/virt_balance.py through Salt's real engine loader (tests/support/enginecheck.py): it loads, a bad
interval is refused with the reason, and with balancing off its rounds ask nothing. Rounds themselves:
tests/unit/fleet/test_balancer.py."""

import pytest

from tests.support import enginecheck


@pytest.fixture
def engines(tmp_path):
    return enginecheck.load_engines(tmp_path)


def test_the_engine_loads(engines):
    assert "virt_balance.start" in engines


def test_a_bad_interval_is_logged_and_the_engine_idles(engines, caplog):
    enginecheck.bad_interval_idles(engines, caplog, "virt_balance")


def test_while_off_a_round_says_so_and_asks_nothing(engines, caplog, monkeypatch):
    enginecheck.off_asks_nothing(
        engines,
        caplog,
        monkeypatch,
        "virt_balance",
        "virt_balance: continuous balancing is off: set virt:balance:enabled: True",
    )
