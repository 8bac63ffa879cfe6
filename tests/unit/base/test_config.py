"""saltvirt.base.config: the operator's virt: configuration, its old flat spellings, one checked section."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.base import config


def test_old_flat_config_spellings_are_honoured():
    store = {"virt.images": "/srv/old", "virt.tunnel": True, "virt": {"type": "qemu"}}

    def get(key, default=None):
        value = store
        for part in key.split(":"):
            if not isinstance(value, dict) or part not in value:
                return default
            value = value[part]
        return value

    cfg = config.getter(get)
    assert cfg("virt:images") == "/srv/old"
    assert cfg("virt:tunnel", False) is True
    assert cfg("virt:type") == "qemu"
    assert cfg("virt:nic", {}) == {}
    conf, warnings = config.master_virt({"virt.tunnel": True, "virt": {"tunnel": False, "x": 1}})
    assert conf == {"tunnel": False, "x": 1} and not warnings  # the mapping wins
    conf, warnings = config.master_virt({"virt.tunnel": True, "virt.hypervisors.timeout": 9})
    assert conf == {"tunnel": True, "hypervisors": {"timeout": 9}} and len(warnings) == 2
    assert config.master_opts({"virt.tunnel": True, "id": "m"}) == {
        "virt.tunnel": True,
        "id": "m",
        "virt": {"tunnel": True},
    }


def test_virt_conf_is_the_mapping_or_nothing():
    assert config.virt_conf(None) == {} and config.virt_conf({"virt": None}) == {}
    assert config.virt_conf({"virt": {"pools": ["a"]}}) == {"pools": ["a"]}
    with pytest.raises(SaltInvocationError, match="master config 'virt' must be a mapping"):
        config.virt_conf({"virt": ["pools"]}, "master config")


def test_virt_conf_never_counts_the_opts():
    """Salt's ``OptsDict`` counts its ~1,300 keys for ``len()`` and so for ``bool()``: ``virt_conf`` runs
    several times per ``virt.init`` and must only look its key up (bench/RESULTS.md, quiet pass)."""

    class Uncountable(dict):
        def __len__(self):
            raise AssertionError("virt_conf counted the opts")

    assert config.virt_conf(Uncountable(virt={"images": "/srv"})) == {"images": "/srv"}
    assert config.virt_conf(None) == {}


def test_a_section_is_a_mapping_of_known_keys():
    assert config.section(None, "virt:fence", ("command", "timeout")) == {}
    raw = {"timeout": 5}
    got = config.section(raw, "virt:fence", ("command", "timeout"))
    assert got == raw and got is not raw  # a copy: callers merge defaults into it
    assert config.section({"x": 1}, "virt:console") == {"x": 1}  # None: any key
    with pytest.raises(SaltInvocationError, match=r"virt:fence must be a mapping \{command\}, not \[1\]"):
        config.section([1], "virt:fence", ("command",), " {command}")
    with pytest.raises(SaltInvocationError, match=r"virt:fence: unknown key\(s\) cmd, x \(known: command, timeout\)"):
        config.section({"cmd": 1, "x": 2}, "virt:fence", ("command", "timeout"))
