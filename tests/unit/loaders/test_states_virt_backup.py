"""_states/virt_backup.py (``virt.backed_up``) through Salt's real state loader on libvirt's test driver."""

import pytest

from saltvirt.vm import backupstore
from tests.support.saltloader import load_states
from tests.unit.vm.test_backup import bk  # noqa: F401 - the fixture is shared


def test_backed_up_makes_a_backup_only_when_the_newest_is_too_old(bk):  # noqa: F811
    v, tmp = bk
    preview = load_states(v, test=True)["virt.backed_up"]("bk1", max_age="24h")
    assert preview["result"] is None and preview["changes"] == {"backup": {"would_make": "full"}}
    assert v["virt.backup_list"]("bk1")["backups"] == []  # test=True made nothing
    st = load_states(v)
    made = st["virt.backed_up"]("bk1", max_age="24h")
    assert made["result"] is True and made["changes"]["backup"]["type"] == "full"
    again = st["virt.backed_up"]("bk1", max_age="1d")
    assert again["result"] is True and again["changes"] == {} and "within 1d" in again["comment"]
    # an old backup: its manifest says it finished long ago
    uuid = v["virt.vm_info"]("bk1")["bk1"]["uuid"]
    directory = backupstore.vm_dir(str(tmp / "backups"), "bk1", uuid)
    key = backupstore.manifest_key(None, str(tmp / "pki"))  # the minion's (made in its pki_dir)
    m, _ = backupstore.read_manifest(directory, made["changes"]["backup"]["id"], key)
    m["finished"] = "2001-01-01T00:00:00Z"
    backupstore.write_manifest(directory, m, key)
    preview = load_states(v, test=True)["virt.backed_up"]("bk1", max_age=3600)
    assert preview["result"] is None and preview["changes"] == {"backup": {"would_make": "incremental"}}
    assert "2001-01-01T00:00:00Z" in preview["comment"]


@pytest.mark.parametrize("bad", ["0", "-1h", "1y", "soon"])
def test_backed_up_refuses_a_bad_max_age(bk, bad):  # noqa: F811
    v, _tmp = bk
    ret = load_states(v)["virt.backed_up"]("bk1", max_age=bad)
    assert ret["result"] is False and "max_age must be" in ret["comment"]


def test_pillar_and_grains_never_set_the_backup_dir(tmp_path):
    """virt:backup:dir decides where files are written as root: the minion config only."""
    from tests.support.saltloader import make_minion_mods

    mods = make_minion_mods(tmp_path, "test:///default", opts_extra={"pillar": {"virt": {"backup": {"dir": "/"}}}})
    mods.opts["grains"]["virt"] = {"backup": {"dir": "/"}}
    ret = load_states(mods)["virt.backed_up"]("bk1")
    assert ret["result"] is False and "set virt:backup:dir in the minion config" in ret["comment"]
