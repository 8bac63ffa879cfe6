"""saltvirt.vm.cleanup / virt.cleanup: what an interrupted virt.init left (test driver)."""


def _interrupted(images_dir, name):
    """What a virt.init killed before it finished leaves: its init lock file, no longer held."""
    from saltvirt.vm import cleanup

    path = cleanup._lock_path(str(images_dir), name)
    with open(path, "w") as fh:
        fh.write("virt.init pid 0\n")


def test_cleanup_removes_an_interrupted_init_and_keeps_foreign_files(virt_test, tmp_path):
    images_dir = tmp_path / "images"
    ret = virt_test["virt.init"]("half1", 1, 64, nic=None, start=False)
    disk = ret["disks"][0]["path"]
    foreign = images_dir / "half1" / "notes.txt"
    foreign.write_text("not salt-virt's")
    assert virt_test["virt.cleanup"]("half1")["domain"].startswith("kept: a complete VM")  # finished init
    _interrupted(images_dir, "half1")
    out = virt_test["virt.cleanup"]("half1")
    assert out["interrupted"] is True and out["domain"].startswith("undefined")
    assert out["removed"] == [disk] and out["errors"] == []
    assert "half1" not in virt_test["virt.list_domains"]() and foreign.read_text() == "not salt-virt's"
    assert not (images_dir / ".locks" / "init-half1").exists()
    assert virt_test["virt.cleanup"]("half1")["interrupted"] is False  # idempotent


def test_cleanup_removes_disks_with_a_manifest_but_no_domain(virt_test, tmp_path):
    ret = virt_test["virt.init"]("half2", 1, 64, nic=None, start=False)
    disk = ret["disks"][0]["path"]
    virt_test["virt.undefine"]("half2")
    assert virt_test["virt.cleanup"]("half2")["removed"] == [disk]
    assert not (tmp_path / "images" / "half2").exists()


def test_init_after_an_interrupted_init_cleans_up_first(virt_test, tmp_path):
    virt_test["virt.init"]("half3", 1, 64, nic=None, start=False)
    _interrupted(tmp_path / "images", "half3")
    ret = virt_test["virt.init"]("half3", 1, 64, nic=None, start=False)
    assert ret["cleaned_up"]["domain"].startswith("undefined") and ret["state"] == "shutoff"
    assert not (tmp_path / "images" / ".locks" / "init-half3").exists()
