"""_engines/virt_ha.py through Salt's real engine loader (tests/support/enginecheck.py): it loads, a bad
interval is refused with the reason, and with HA off its rounds ask nothing. Rounds themselves:
tests/unit/fleet/test_ha.py."""

import pytest

from tests.support import enginecheck


@pytest.fixture
def engines(tmp_path):
    return enginecheck.load_engines(tmp_path)


def test_the_engine_loads(engines):
    assert "virt_ha.start" in engines


def test_a_bad_interval_is_logged_and_the_engine_idles(engines, caplog):
    enginecheck.bad_interval_idles(engines, caplog, "virt_ha")


def test_while_off_a_round_says_so_and_asks_nothing(engines, caplog, monkeypatch):
    enginecheck.off_asks_nothing(
        engines, caplog, monkeypatch, "virt_ha", "virt_ha: automatic HA is off: set virt:ha:enabled: True"
    )
