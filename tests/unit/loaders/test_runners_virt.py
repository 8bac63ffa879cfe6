"""_runners/virt.py through Salt's runner loader, without a salt-master: what is refused before anything
is published or created (``salt-run virt.init ... wait=``). Waiting itself needs a master and a hypervisor:
tests/integration/test_guest_ips.py."""

import pytest

from tests.support.saltloader import make_runners


@pytest.fixture
def runner(tmp_path):
    return make_runners(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wait": "ssh"}, "wait must be ip or minion (or left out), not 'ssh'"),
        ({"wait": "minion", "start": False}, "wait=minion needs the VM started: leave out start=False"),
        (
            {"wait": "ip", "wait_timeout": "0"},
            "wait_timeout must be a number of seconds above 0 (at most 86400), not '0'",
        ),
    ],
)
def test_init_refuses_a_bad_wait_before_anything_happens(runner, tmp_path, kwargs, message):
    ret = runner["virt.init"]("web1", 1, 128, **kwargs)
    assert ret["data"] == {"error": message, "retcode": 1}
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published


@pytest.mark.parametrize("arg", ["connection", "username", "password"])
def test_init_never_forwards_a_connection_argument(runner, tmp_path, arg):
    hostile = "qemu+ext:///system?command=/bin/sh"
    ret = runner["virt.init"]("web1", 1, 128, **{arg: hostile})
    message = (
        f"salt-run virt.init: {arg}= is not forwarded to the hypervisors: each one uses the libvirt connection its "
        f"minion config names (virt:connection); drop {arg}="
    )
    assert ret["data"] == {"error": message, "retcode": 1}
    assert hostile not in str(ret)
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"graphics": {"type": "vnc", "password": {"v": 2, "ct": "stolen"}}}, "graphics:password"),
        ({"priv_key": {"v": 2, "ct": "stolen"}}, "priv_key"),
    ],
)
def test_init_never_forwards_an_envelope_from_a_call(runner, tmp_path, kwargs, arg):
    """A sealed secret (e.g. another VM's key from the job cache) never passes the runner unsealed."""
    ret = runner["virt.init"]("web1", 1, 128, **kwargs)
    message = (
        f"salt-run virt.init: {arg} must be given in clear to the runner (it seals it for the chosen hypervisor "
        "itself); a sealed envelope or mapping is never accepted from a call"
    )
    assert ret["data"] == {"error": message, "retcode": 1}
    assert "stolen" not in str(ret)
    assert not (tmp_path / "pki").exists()


@pytest.mark.parametrize(
    ("name", "kwargs", "what", "value"),
    [("hyper1", {}, "VM name", "hyper1"), ("db1", {"minion_id": "hyper1"}, "minion id", "hyper1")],
)
def test_init_refuses_a_vm_the_hypervisor_target_matches(runner, tmp_path, name, kwargs, what, value):
    ret = runner["virt.init"](name, 1, 128, **kwargs)
    message = (
        f"salt-run virt.init: the {what} {value!r} matches virt:hypervisors in the master config: a VM must never "
        f"be taken for a hypervisor (it would get libvirt certificates); pick another {what}"
    )
    assert ret["data"] == {"error": message, "retcode": 1}
    assert not (tmp_path / "pki").exists()  # no key generated, nothing published
