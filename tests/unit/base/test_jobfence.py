"""saltvirt.base.jobfence: a job check's "not running" stays true (real files, real processes)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from salt.exceptions import CommandExecutionError

from saltvirt.base import jobfence, procs
from tests.support.paths import ROOT

CHILD = """
import sys, time
sys.path.insert(0, {utils!r})
from saltvirt.base import jobfence
with jobfence.running_job({cachedir!r}, "20261129000000000001"):
    print("registered", flush=True)
    time.sleep(300)
"""


def test_a_job_checked_before_it_started_never_starts(tmp_path):
    """The race on a loaded minion: the check runs while the job's process still loads its modules."""
    cache = str(tmp_path)
    assert jobfence.still_running(cache, "20261129000000000001", salt_says=False) is False
    with pytest.raises(CommandExecutionError, match="did nothing: the master was told it was not running"):
        with jobfence.running_job(cache, "20261129000000000001"):
            pytest.fail("a fenced job ran")
    assert jobfence.still_running(cache, "20261129000000000001", salt_says=True) is False  # fenced stays fenced


def test_a_job_in_salts_proc_files_but_not_registered_yet_is_running(tmp_path):
    cache = str(tmp_path)
    assert jobfence.still_running(cache, "20261129000000000002", salt_says=True) is True
    with jobfence.running_job(cache, "20261129000000000002"):
        assert jobfence.still_running(cache, "20261129000000000002", salt_says=False) is True
    # it ended: a check now fences the jid (it was published once)
    assert jobfence.still_running(cache, "20261129000000000002", salt_says=False) is False


def test_a_registered_job_runs_until_its_process_dies(tmp_path):
    cache = str(tmp_path)
    code = CHILD.format(utils=str(ROOT / "_utils"), cachedir=cache)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "registered"
        assert jobfence.still_running(cache, "20261129000000000001", salt_says=False) is True
        os.kill(child.pid, signal.SIGKILL)  # its registration stays behind, naming a dead process
        child.wait()
        assert procs.exited(child.pid)
        assert jobfence.still_running(cache, "20261129000000000001", salt_says=False) is False
    finally:
        child.kill()
        child.wait()
    with pytest.raises(CommandExecutionError):
        with jobfence.running_job(cache, "20261129000000000001"):
            pass


def test_no_jid_no_fence_and_a_bad_jid_is_refused(tmp_path):
    with jobfence.running_job(str(tmp_path), None):
        pass
    with pytest.raises(CommandExecutionError, match="not a job id"):
        jobfence.still_running(str(tmp_path), "../etc", salt_says=False)


def test_old_fenced_jobs_are_forgotten(tmp_path):
    cache = str(tmp_path)
    jobfence.still_running(cache, "1", salt_says=False)
    old = os.path.join(jobfence.jobs_dir(cache), "1")
    os.utime(old, (time.time() - jobfence.KEEP_FENCED - 10,) * 2)
    jobfence.still_running(cache, "2", salt_says=False)
    assert sorted(os.listdir(jobfence.jobs_dir(cache))) == [".lock", "2"]
