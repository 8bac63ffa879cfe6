"""_runners/virt_assign.py through Salt's real runner loader (no daemons): merged into the ``virt`` runner
with _runners/virt.py, and ``virt.provision_assigned`` acts only for configured hypervisors."""

import pytest

from tests.support import keystore
from tests.support.paths import ROOT
from tests.support.saltloader import new_job


@pytest.fixture
def runners(tmp_path):
    import salt.config
    import salt.loader

    opts = salt.config.master_config(None)
    opts.update(
        cachedir=str(tmp_path / "cache"),
        pki_dir=str(tmp_path / "pki"),
        sock_dir=str(tmp_path / "sock"),
        runner_dirs=[str(ROOT / "_runners")],
        extension_modules=str(tmp_path / "ext"),
        pillar_roots={"base": [str(tmp_path / "pillar")]},
        virt={"hypervisors": ["hyper1"]},
    )
    keys = tmp_path / "pki" / "minions"
    keys.mkdir(parents=True)
    for mid in ("hyper1", "tenant-vm1"):
        (keys / mid).write_text(keystore.keypair(mid)[0])  # made once per id: only which keys are accepted counts
    return new_job(salt.loader.runner(opts, utils=salt.loader.utils(opts)))


def test_one_virt_runner_from_both_files(runners):
    assert {"virt.init", "virt.query", "virt.provision_assigned"} <= set(runners)
    assert "virt_assign.provision_assigned" not in runners


@pytest.mark.parametrize("host", ["tenant-vm1", "nobody", "hyper*", "../hyper1"])
def test_only_a_configured_hypervisor_gets_its_vms(runners, host):
    ret = runners["virt.provision_assigned"](host=host)
    assert ret["retcode"] == 1 and ret["host"] == host
    assert ret["error"] == (
        f"{host} is not one of the hypervisors (virt:hypervisors in the master config): refusing provisioning the "
        "VMs assigned to it"
    )


@pytest.mark.parametrize("nonce", [None, ""])
def test_a_reactor_job_without_the_hosts_nonce_provisions_nothing(runners, nonce):
    """The reactor runs provision_assigned for any "ready" event, and Salt lets any minion forge one (tag and
    data): without a nonce the host can confirm, nothing is asked or created (no master runs here: a
    publication would fail differently)."""
    fun = runners["virt.provision_assigned"]
    fun.__globals__["__user__"] = "Reactor"  # what Salt's reactor injects into its runner jobs
    try:
        ret = fun(host="hyper1", ready_nonce=nonce)
    finally:
        fun.__globals__.pop("__user__", None)
    assert ret["retcode"] == 1 and ret["host"] == "hyper1"
    assert ret["error"].startswith(
        "hyper1 did not confirm that it sent this ready event (no nonce in the event): nothing provisioned. "
        "Any minion can forge an event; a hypervisor announces itself with salt-call virt.ready"
    )
