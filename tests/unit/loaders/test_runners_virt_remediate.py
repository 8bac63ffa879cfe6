"""_runners/virt_remediate.py through Salt's real runner loader (no daemons): merged into the ``virt`` runner, off
until the master config turns a kind on, and a hint naming a minion that is no hypervisor is refused before
anything is asked (the kinds themselves: tests/unit/fleet/test_remediate.py)."""

import pytest

from tests.support import keystore
from tests.support.paths import ROOT
from tests.support.saltloader import new_job


@pytest.fixture
def runners(tmp_path):
    import salt.config
    import salt.loader

    def make(**remediate):
        opts = salt.config.master_config(None)
        opts.update(
            cachedir=str(tmp_path / "cache"),
            pki_dir=str(tmp_path / "pki"),
            sock_dir=str(tmp_path / "sock"),
            runner_dirs=[str(ROOT / "_runners")],
            extension_modules=str(tmp_path / "ext"),
            virt={"hypervisors": ["hyper1"], "remediate": remediate},
        )
        keys = tmp_path / "pki" / "minions"
        keys.mkdir(parents=True, exist_ok=True)
        for mid in ("hyper1", "tenant-vm1"):
            (keys / mid).write_text(keystore.keypair(mid)[0])
        return new_job(salt.loader.runner(opts, utils=salt.loader.utils(opts)))

    return make


def test_one_virt_runner_and_every_kind_off_by_default(runners):
    funs = runners()
    assert {"virt.init", "virt.remediate", "virt.remediate_log"} <= set(funs)
    for kind in ("crashed", "io_error", "agent", "beacon"):
        ret = funs["virt.remediate"](kind=kind, host="hyper1", name="web1")
        assert (ret["acted"], ret["decision"]) == (False, "off")
    assert funs["virt.remediate_log"]() == {"entries": []}


@pytest.mark.parametrize("host", ["tenant-vm1", "nobody", "hyper*"])
def test_a_hint_naming_no_hypervisor_is_refused(runners, host):
    ret = runners(crashed={"enabled": True})["virt.remediate"](kind="crashed", host=host, name="web1")
    assert ret["retcode"] == 1 and (ret["kind"], ret["host"]) == ("crashed", host)
    assert ret["error"].startswith(f"{host} is not one of the hypervisors (virt:hypervisors in the master config)")


def test_bad_arguments_say_what_to_fix(runners):
    funs = runners(crashed={"enabled": True})
    assert funs["virt.remediate"](kind="reboot", host="hyper1")["error"].startswith("kind must be one of crashed")
    assert "needs host=" in funs["virt.remediate"](kind="crashed")["error"]
    assert funs["virt.remediate_log"](last=0)["retcode"] == 1
