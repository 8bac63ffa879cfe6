"""saltvirt.base.undo: steps taken back newest first; stop at the first failure, or go on and report all."""

from saltvirt.base.undo import Undo


def _fails(msg):
    def step():
        raise OSError(msg)

    return step


def test_newest_first_and_stop_at_the_first_failure_naming_what_is_left():
    done = []
    undo = Undo(stop_at_failure=True)
    undo.add("remove dir", lambda: done.append("dir"))
    undo.add("remove disk", lambda: done.append("disk"))
    assert undo.run() == [] and done == ["disk", "dir"]
    done.clear()
    undo.add("remove dir", lambda: done.append("dir"))
    undo.add("remove disk", lambda: done.append("disk"))
    undo.add("undefine vm", _fails("libvirtd is gone"))
    assert undo.run() == ["undefine vm: libvirtd is gone", "left for virt.cleanup: remove disk, remove dir"]
    assert done == []  # the disks of a VM still defined are kept for virt.cleanup


def test_without_stop_every_step_runs_and_every_failure_is_reported(caplog):
    done = []
    undo = Undo(what="seed cleanup")
    undo.add("remove tmp", lambda: done.append("tmp"))
    undo.add("detach loop", _fails("busy"))
    undo.add("unmount", _fails("target is busy"))
    assert undo.run() == ["unmount: target is busy", "detach loop: busy"] and done == ["tmp"]
    assert "seed cleanup: unmount failed: target is busy" in caplog.text
    assert undo.run() == []  # run once: the steps are gone
