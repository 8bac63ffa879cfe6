"""saltvirt.fleet.engineloop: the rounds of the master engines (virt_balance, virt_ha); their loops are exercised
through balancer.serve and ha.serve in test_balancer.py and test_ha.py."""

from saltvirt.fleet import engineloop


def test_current_opts_has_the_virt_settings_of_the_config_file_now(tmp_path):
    conf = tmp_path / "master"
    conf.write_text("virt:\n  balance:\n    enabled: true\nvirt.tunnel: true\n")
    opts = {"conf_file": str(conf), "id": "m1", "sock_dir": "/run/x", "virt": {"balance": {"enabled": False}}}
    opts["virt.migration_timeout"] = 5  # gone from the file: gone from the round's opts
    fresh = engineloop.current_opts(opts)
    assert fresh["virt"] == {"balance": {"enabled": True}} and fresh["virt.tunnel"] is True
    assert "virt.migration_timeout" not in fresh
    assert (fresh["id"], fresh["sock_dir"], fresh["conf_file"]) == ("m1", "/run/x", str(conf))  # the rest kept
    assert opts["virt"] == {"balance": {"enabled": False}}  # not changed in place
    conf.write_text("virt: [unclosed\n")  # being edited: the settings read before
    assert engineloop.current_opts(opts) is opts
    assert engineloop.current_opts(dict(opts, conf_file=str(tmp_path / "none")))["virt"] == opts["virt"]
