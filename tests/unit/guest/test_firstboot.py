"""saltvirt.guest.firstboot: what a new VM's first boot gets, from what was found in its image (the inspection
itself runs inside the seeding backends: tests/integration/test_cloudinit.py boots it)."""

import hashlib
import shlex
import subprocess

import pytest
import yaml
from salt.exceptions import CommandExecutionError, SaltInvocationError

from saltvirt.guest import cloudinit, firstboot

SUM = "sha256:" + "ab" * 32
SOURCE = {"url": "https://user:s3cret@repo.example.net/bootstrap-salt.sh", "checksum": SUM, "args": ["-X", "a b"]}


def exists_in(*paths):
    return lambda p: p in paths


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"url": "ftp://x/y.sh", "checksum": SUM}, "http\\(s\\) or salt:// URL"),
        ({"url": "https://x/y.sh'; reboot; '", "checksum": SUM}, "http\\(s\\) or salt:// URL"),
        ({"url": "https://x/y.sh\nreboot", "checksum": SUM}, "http\\(s\\) or salt:// URL"),
        ({"url": "https://x/y.sh\n", "checksum": SUM}, "http\\(s\\) or salt:// URL"),
        ({"url": "https://x/y.sh"}, "checksum is required"),
        ({"url": "https://x/y.sh", "checksum": "md5:" + "a" * 32}, "checksum is required"),
        ({"url": "https://x/y.sh", "checksum": "sha256:xyz"}, "checksum is required"),
        ({"url": "https://x/y.sh", "checksum": SUM, "args": [1]}, "list of strings"),
        ({"url": "https://x/y.sh", "checksum": SUM, "sha": 1}, "unknown key 'sha'"),
    ],
)
def test_bad_install_source_is_refused(conf, message):
    with pytest.raises(SaltInvocationError, match=message):
        firstboot.Plan(None, conf)


def test_credentials_never_in_the_report_but_in_the_script():
    plan = firstboot.Plan(None, SOURCE)
    plan.inspect(exists_in())
    report = plan.report()
    assert report == {
        "found": False,
        "path": None,
        "cloud_init_in_image": False,
        "install": f"seeded boot hook ({firstboot.UNIT_NAME}) from https://repo.example.net/bootstrap-salt.sh",
    }
    assert "s3cret" not in str(report)
    script = firstboot.script(plan.source)
    assert "s3cret" in script.split("fetch()", 1)[1].split("}", 1)[0]  # only where the guest fetches it
    assert "s3cret" not in "".join(line for line in script.splitlines() if "say " in line)


def test_script_is_valid_sh_and_quotes_every_argument():
    script = firstboot.script(firstboot.install_source(SOURCE))
    assert subprocess.run(["sh", "-n"], input=script, text=True, check=False).returncode == 0
    odd = firstboot.script(firstboot.install_source(dict(SOURCE, url="https://x.example/$(reboot)?a=1&b=2")))
    assert "src='https://x.example/$(reboot)?a=1&b=2'" in odd  # never expanded by the guest's shell
    assert odd.count("$(reboot)") == 3  # src= and the two fetch commands, all single-quoted
    assert 'sh "$tmp/installer" -X ' + shlex.quote("a b") in script
    assert "ab" * 32 + "  " in script and "sha256sum -c" in script


def test_image_without_minion_gets_a_boot_hook():
    plan = firstboot.Plan(None, SOURCE)
    extra = plan.inspect(exists_in("/usr/bin/cloud-init"))
    assert set(extra) == {firstboot.SCRIPT, firstboot.UNIT, firstboot.UNIT_LINK}
    assert extra[firstboot.UNIT_LINK] == {"symlink": firstboot.UNIT}
    assert extra[firstboot.SCRIPT]["mode"] == 0o755
    assert f"ExecStart=/bin/sh {firstboot.SCRIPT}" in extra[firstboot.UNIT]["content"]
    assert plan.additions() == {}  # no cidata volume asked for


def test_image_with_cloud_init_and_a_cidata_volume_installs_through_runcmd():
    plan = firstboot.Plan({}, SOURCE)
    assert plan.inspect(exists_in("/usr/bin/cloud-init")) == {}
    cfg = plan.additions()
    assert cfg["runcmd"] == [["sh", firstboot.SCRIPT]]
    assert [f["path"] for f in cfg["write_files"]] == [firstboot.SCRIPT]
    assert plan.report()["install"] == "cloud-init runcmd from https://repo.example.net/bootstrap-salt.sh"


def test_image_with_a_minion_is_left_alone():
    plan = firstboot.Plan({}, SOURCE)
    assert plan.inspect(exists_in("/opt/saltstack/salt/bin/salt-minion", "/usr/bin/cloud-init")) == {}
    assert plan.additions() == {}
    report = plan.report()
    assert report["found"] is True and report["path"] == "/opt/saltstack/salt/bin/salt-minion"
    assert report["install"] is None and "left alone" in report["note"]


def test_no_minion_and_no_source_says_so():
    plan = firstboot.Plan(None, None)
    assert plan.inspect(exists_in()) == {}
    assert "virt:minion_install is not configured" in plan.report()["note"]


def test_minion_files_through_cloud_init_when_not_mounted():
    plan = firstboot.Plan({}, SOURCE)
    files = {"/etc/salt/pki/minion/minion.pem": {"content": b"-----BEGIN PRIVATE KEY-----\n", "mode": 0o400}}
    plan.via_cloud_init(files)
    cfg = plan.additions()
    paths = [f["path"] for f in cfg["write_files"]]
    assert paths == ["/etc/salt/pki/minion/minion.pem", firstboot.SCRIPT]
    assert cfg["write_files"][0]["permissions"] == "0400"
    assert cfg["runcmd"] == [["sh", firstboot.SCRIPT], ["sh", "-c", firstboot.RESTART_MINION]]
    report = plan.report()
    assert report["found"] is None and "not inspected" in report["note"]
    user = cloudinit.user_data({}, cfg)
    assert yaml.safe_load(user)["write_files"][0]["encoding"] == "b64"


def test_installer_from_the_masters_file_server_is_checked_and_embedded(tmp_path):
    """salt://: fetched by the hypervisor (cp.cache_file in virt.init), checked there, written into the
    guest with the script, which copies it instead of fetching (and checks it again)."""
    body = b"#!/bin/sh\necho installing\n"
    cached = tmp_path / "bootstrap-salt.sh"
    cached.write_bytes(body)
    asked = []

    def cache_file(url):
        asked.append(url)
        return str(cached)

    conf = {"url": "salt://salt/bootstrap-salt.sh", "checksum": "sha256:" + hashlib.sha256(body).hexdigest()}
    plan = firstboot.Plan(None, conf, cache_file)
    assert asked == ["salt://salt/bootstrap-salt.sh"]
    extra = plan.inspect(exists_in())
    assert extra[firstboot.EMBEDDED] == {"content": body, "mode": 0o644}
    assert f'cp {firstboot.EMBEDDED} "$tmp/installer"' in extra[firstboot.SCRIPT]["content"]
    assert "wget" not in extra[firstboot.SCRIPT]["content"]
    assert plan.report()["install"].endswith(
        "from salt://salt/bootstrap-salt.sh (fetched by the hypervisor, written into the guest)"
    )
    runcmd = firstboot.Plan({}, conf, cache_file)
    runcmd.via_cloud_init({})
    assert [f["path"] for f in runcmd.additions()["write_files"]] == [firstboot.SCRIPT, firstboot.EMBEDDED]


@pytest.mark.parametrize(
    "url, content, message",
    [
        ("salt://salt/bootstrap-salt.sh", b"tampered", "does not match its checksum"),
        ("salt://salt/missing.sh", None, "is not on the master's file server"),
        ("salt://../etc/shadow", b"", "http\\(s\\) or salt:// URL"),
    ],
)
def test_bad_installer_from_the_master_is_refused(tmp_path, url, content, message):
    path = tmp_path / "cached"
    if content is not None:
        path.write_bytes(content)
    conf = {"url": url, "checksum": SUM}
    with pytest.raises((SaltInvocationError, CommandExecutionError), match=message):
        firstboot.Plan(None, conf, lambda u: str(path) if content is not None else "")
