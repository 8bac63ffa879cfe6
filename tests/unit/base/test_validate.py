"""Names and paths: full-match validation (a trailing newline or '..' never passes)."""

import os

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.base import validate
from saltvirt.model import vmargs
from saltvirt.model import vmspec as spec
from saltvirt.vm import migrate
from saltvirt.xml import netxml, poolxml
from tests.support.saltloader import make_minion_mods

HOSTILE_NAMES = ["web1\n", "a\n", "../x", "..", ".", "a/b", "-a", "a b", "", "x" * 64, "a\0b", "\nweb1"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_vm_names_refused(name):
    with pytest.raises(SaltInvocationError, match="VM name"):
        validate.vm_name(name)


@pytest.mark.parametrize("name", ["a\n", "../x"])
def test_hostile_names_refused_for_every_kind(name):
    with pytest.raises(SaltInvocationError, match="network name"):
        netxml.network_spec(name)
    with pytest.raises(SaltInvocationError, match="pool name"):
        poolxml.pool_spec(name, target="/srv/x")
    with pytest.raises(SaltInvocationError, match="VM name"):
        spec.build(vmargs.InitRequest(name, 1, 64, disk=None, nic=None), images_dir="/srv/vms")
    with pytest.raises(SaltInvocationError, match="disk name"):
        spec.build(vmargs.InitRequest("ok", 1, 64, disks=[{"name": name, "size": 1}], nic=None), images_dir="/srv/vms")
    with pytest.raises(SaltInvocationError, match="host name"):
        migrate.destination_uri(name)


def test_good_names_pass():
    assert validate.vm_name("web-1.example_2") == "web-1.example_2"
    assert validate.host_name("hv1.example.com") == "hv1.example.com"
    assert validate.host_name("fd00::1") == "fd00::1"
    with pytest.raises(SaltInvocationError):
        validate.host_name("hv1\n")


# paths: through virt.init / virt.update on the real loader (test driver) ------------------------------
@pytest.fixture
def outside(tmp_path):
    """A host file outside virt:images (the /etc/passwd or authorized_keys of the tests)."""
    folder = tmp_path / "host"
    folder.mkdir()
    path = folder / "authorized_keys"
    path.write_text("ssh-ed25519 AAAA operator\n")
    return str(path)


def _refused(v, match, **args):
    with pytest.raises(SaltInvocationError, match=match):
        v["virt.init"]("pathvm", 1, 64, **dict({"nic": None, "disk": None, "start": False}, **args))
    assert "pathvm" not in v["virt.list_domains"]()


def test_hostile_paths_refused(virt_test, outside, tmp_path):
    v = virt_test
    images_dir = v.opts["virt"]["images"]
    setting = r"outside the directories salt-virt may use .*virt:allowed_paths in the minion config"
    _refused(v, f"path of disk data {outside} is {setting}", disks=[{"data": {"path": outside}}])
    _refused(v, f"boot:kernel {outside} is {setting}", boot={"kernel": outside})
    _refused(v, f"boot:initrd {outside} is {setting}", boot={"kernel": f"{images_dir}/k", "initrd": outside})
    _refused(v, f"serial_log {outside} is {setting}", serial_log=outside)
    _refused(v, "serial_log /root/.ssh/authorized_keys is outside", serial_log="/root/.ssh/authorized_keys")
    _refused(v, "must be an absolute path without '..'", disks=[{"d": {"path": f"{images_dir}/../host/x"}}])
    # a symlink inside virt:images that leads out is judged by where it leads
    os.makedirs(images_dir, exist_ok=True)
    link = os.path.join(images_dir, "innocent.img")
    os.symlink(outside, link)
    _refused(v, f"path of disk d {link} \\(resolves to {outside}\\) is outside", disks=[{"d": {"path": link}}])
    with open(outside) as fh:
        assert fh.read() == "ssh-ed25519 AAAA operator\n"


def test_allowed_paths_come_from_the_minion_config_only(virt_test, outside, tmp_path):
    with pytest.raises(SaltInvocationError, match="unknown argument.*allowed_paths"):
        virt_test["virt.init"]("pathvm", 1, 64, nic=None, disk=None, allowed_paths=["/"])
    virt_test["virt.init"]("pathvm", 1, 64, nic=None, disk=None, start=False)
    with pytest.raises(SaltInvocationError, match="minion config"):
        virt_test["virt.update"]("pathvm", disks=[{"data": {"path": outside}}], allowed_paths=["/"])
    with pytest.raises(SaltInvocationError, match="outside the directories"):
        virt_test["virt.update"]("pathvm", disk=None, disks=[{"data": {"path": outside}}])
    assert virt_test["virt.get_disks"]("pathvm") == {}
    folder = os.path.dirname(outside)
    allowed = make_minion_mods(tmp_path, "test:///default", allowed_paths=[folder])
    made = allowed["virt.update"]("pathvm", disk=None, disks=[{"data": {"path": outside}}])
    assert made["changes"]["disks"]["added"][0]["attach"] is True


def test_serial_log_may_go_to_libvirts_log_dir():
    s = spec.build(
        vmargs.InitRequest("n", 1, 64, disk=None, nic=None, serial_log=f"{spec.SERIAL_LOG_DIR}/n-x.log"),
        images_dir="/v",
    )
    assert s.serial_log == f"{spec.SERIAL_LOG_DIR}/n-x.log"
    with pytest.raises(SaltInvocationError, match="outside"):
        spec.build(
            vmargs.InitRequest("n", 1, 64, disk=None, nic=None, serial_log="/var/log/libvirt/x.log"), images_dir="/v"
        )


@pytest.mark.parametrize("name", ["a\n", "../x"])
def test_hostile_names_refused_by_virt_init(virt_test, name):
    with pytest.raises(SaltInvocationError, match="invalid VM name"):
        virt_test["virt.init"](name, 1, 64, nic=None, disk=None, start=False)
    assert name not in virt_test["virt.list_domains"]()
    with pytest.raises(SaltInvocationError, match="invalid network name"):
        virt_test["virt.network_define"](name, bridge="br9")
    with pytest.raises(SaltInvocationError, match="invalid pool name"):
        virt_test["virt.pool_define"](name, target="/srv/x")


def test_credentials_are_refused_in_one_wording_without_the_value():
    for empty in (None, "", "None"):
        validate.no_credentials(empty, empty)  # Salt's default
    with pytest.raises(
        SaltInvocationError, match=r"^virt.start: username/password connections are not supported"
    ) as exc:
        validate.no_credentials("admin", None, "virt.start")
    with pytest.raises(SaltInvocationError, match="^username/password connections are not supported") as exc:
        validate.no_credentials(None, "s3cret-pw")
    assert "s3cret-pw" not in str(exc.value)


@pytest.mark.parametrize(
    ("value", "low", "high", "message"),
    [
        ("x", 0, 10, "n must be a whole number 0-10, got 'x'"),
        (True, 0, 10, "n must be a whole number 0-10, got True"),  # a bool is not a number here
        (11, 0, 10, "n must be a whole number 0-10, got 11"),
        (0, 1, None, "n must be a positive integer, got 0"),
        (-1, 0, None, "n must be a whole number >= 0, got -1"),
        ("5; reboot", None, 4, "n must be a whole number <= 4, got '5; reboot'"),
    ],
)
def test_int_in_refuses_in_one_wording(value, low, high, message):
    with pytest.raises(SaltInvocationError) as exc:
        validate.int_in(value, "n", low, high)
    assert str(exc.value) == message


def test_int_in_and_its_lenient_sibling():
    assert validate.int_in(" 7 ", "n", 0, 10) == 7 and validate.int_in("-1", "n", -1) == -1
    assert validate.positive_int("3", "cpu", maximum=4) == 3
    with pytest.raises(SaltInvocationError, match="cpu must be a positive integer, got 0"):
        validate.positive_int(0, "cpu", maximum=4)
    with pytest.raises(SaltInvocationError, match="cpu must be a whole number 1-4, got 5"):
        validate.positive_int(5, "cpu", maximum=4)
    assert [validate.int_or_none(v) for v in ("12", None, "n/a", 3)] == [12, None, None, 3]


def test_inside_checks_share_one_comparison(tmp_path):
    root, other = tmp_path / "images", tmp_path / "images-other"
    (root / "vm").mkdir(parents=True)
    other.mkdir()
    (root / "escape").symlink_to(other)
    assert validate.is_inside(str(root / "vm"), str(root)) and not validate.is_inside(str(root), str(root))
    assert not validate.is_inside(str(other), str(root))  # a sibling sharing the prefix is not inside
    assert not validate.is_inside(str(root / "escape"), str(root))  # nor a symlink out
    assert validate.root_of(str(root / "vm" / "disk"), [None, str(other), str(root)]) == str(root)
    assert validate.root_of(str(root / "escape" / "x"), [str(root)]) is None
    assert validate.inside(str(root), "vm") == str(root / "vm")
    with pytest.raises(SaltInvocationError, match="escapes"):
        validate.inside(str(root), "escape", "x")
    assert validate.is_inside("/srv/x", "/")


@pytest.mark.parametrize(("value", "expect"), [(5, 5.0), ("0.5", 0.5), (60, 60.0)])
def test_seconds(value, expect):
    assert validate.seconds(value, "t", 60) == expect


@pytest.mark.parametrize("value", [0, -1, "soon", None, True, 61, "nan"])
def test_seconds_refused_in_one_wording(value):
    with pytest.raises(SaltInvocationError, match=r"^t must be a number of seconds above 0 \(at most 60\), not "):
        validate.seconds(value, "t", 60)


@pytest.mark.parametrize("bad", [{"x": 1}, [1], [""], None, 3, [None]])
def test_config_names_refused_in_one_wording(bad):
    with pytest.raises(SaltInvocationError, match=r"^virt:pools in the minion config must be a list of names, got "):
        validate.config_names(bad, "virt:pools")
    with pytest.raises(SaltInvocationError, match=r"in the master config .*: fix the master config$"):
        validate.config_names(bad, "virt:operators", "master config")


def test_config_names_takes_one_name_or_a_list():
    assert validate.config_names("ops", "virt:operators") == ("ops",)
    assert validate.config_names(["a", "b*"], "virt:operators") == ("a", "b*")
    assert validate.config_names((), "virt:host_devices") == ()


@pytest.mark.parametrize(
    ("given", "want"),
    [("3", (3 * 2**20, False)), ("2 KiB", (2048, False)), ("2k", (2048, False)), ("2KB", (2000, True))]
    + [("1T", (2**40, False)), ("1tb", (10**12, True)), ("5 B", (5, False)), ("1PiB", (2**50, False))],
)
def test_size_bytes_units(given, want):
    assert validate.size_bytes(given, "size", "MiB", "a size") == want


@pytest.mark.parametrize("given", ["2 XB", "2ki", "2 kibb", "2iB"])
def test_size_bytes_refuses_an_unknown_unit(given):
    with pytest.raises(SaltInvocationError, match=r"size \(.*\): unknown unit .*; the units are B, K/KiB"):
        validate.size_bytes(given, "size", "MiB", "a size")


@pytest.mark.parametrize("given", [True, "1.5g", "-2g", "g", "", "2 g b"])
def test_size_bytes_refuses_a_non_size(given):
    with pytest.raises(SaltInvocationError, match="size must be a size like 2g, got"):
        validate.size_bytes(given, "size", "MiB", "a size like 2g")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:p@h:1/x.qcow2?X-Amz-Signature=s#f", "https://h:1/x.qcow2"),
        ("salt://images/a.qcow2?saltenv=prod", "salt://images/a.qcow2"),
        ("/var/lib/images/a@b.qcow2", "/var/lib/images/a@b.qcow2"),  # a path: as it is
        (None, None),
        ("https://[::1/x?token=s", "https://..."),  # urllib cannot split it: nothing of it shown
    ],
)
def test_a_url_is_shown_without_credentials_query_or_fragment(url, shown):
    assert validate.shown_url(url) == shown
