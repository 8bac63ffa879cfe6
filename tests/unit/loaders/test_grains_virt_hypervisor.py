"""_grains/virt_hypervisor.py: the ``virt_hypervisor`` grain through Salt's real grains loader."""

import json
import os
import shutil
import subprocess
import sys

from tests.support.paths import ROOT


def test_virt_hypervisor_grain_through_the_salt_loader(tmp_path):
    import salt.config
    import salt.loader

    def grain(config=""):
        conf = tmp_path / "minion"
        conf.write_text(f"cachedir: {tmp_path / 'cache'}\ngrains_dirs: [{ROOT / '_grains'}]\n{config}")
        opts = salt.config.minion_config(str(conf))
        return salt.loader.grains(opts, force_refresh=True).get("virt_hypervisor")

    # this machine has the libvirt bindings and libvirtd (scripts/setup.sh): a hypervisor
    assert shutil.which("libvirtd") or shutil.which("libvirtd", path="/usr/sbin")
    assert grain() is True
    assert grain("virt_hypervisor: false\n") is False  # the minion config decides
    assert grain("grains: {virt_hypervisor: false}\n") is False  # so does a static grain


# one minion's main process: its grains, then what a job forked from it loads for virt.answer
MAIN_PROCESS = """
import json, sys
import salt.config, salt.loader
opts = salt.config.minion_config(sys.argv[1])
opts["__cli"] = sys.argv[2]  # the process's name: salt-minion, salt-call, ...
opts["grains"] = salt.loader.grains(opts, force_refresh=True)
before = {m for m in sys.modules if m.startswith("saltvirt")}
salt.loader.minion_mods(opts)["virt.answer"]
after = {m for m in sys.modules if m.startswith("saltvirt")}
print(json.dumps({"grain": opts["grains"]["virt_hypervisor"], "before": sorted(before), "new": sorted(after - before)}))
"""


def test_a_hypervisors_grains_load_the_library_its_jobs_use_in_the_minions_main_process(tmp_path):
    """Salt forks each job from the minion's main process: the ``virt`` modules a job loads find the library
    there already (before: every ``virt.answer`` job imported ~85 library modules). A minion that is no
    hypervisor (a guest's) loads none of it, and no minion loads the master's side (``fleet``)."""

    def main_process(config, cli="salt-minion"):
        conf = tmp_path / "minion"
        conf.write_text(
            f"cachedir: {tmp_path / 'cache'}\ngrains_dirs: [{ROOT / '_grains'}]\n"
            f"module_dirs: [{ROOT / '_modules'}]\nvirt: {{connection: {{uri: 'test:///default'}}}}\n{config}"
        )
        run = subprocess.run(
            [sys.executable, "-c", MAIN_PROCESS, str(conf), cli],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(run.stdout.splitlines()[-1])

    hyper = main_process("")
    assert hyper["grain"] is True
    assert len(hyper["before"]) > 50
    assert hyper["new"] == []  # the job's load of virt.answer imported nothing of the library
    assert not [m for m in hyper["before"] if m.startswith("saltvirt.fleet")]

    # only the daemon that forks jobs: a salt-call (or salt-run's MasterMinion on a master that is a hypervisor
    # too) computes the same grain without paying for the import; a guest's minion imports none of it
    for other in (main_process("", cli="salt-call"), main_process("virt_hypervisor: false\n")):
        assert other["before"] == ["saltvirt"]  # the package alone (its bootstrap): no layer of it
        assert len(other["new"]) > 50  # what a hypervisor's main process holds for its jobs
    assert main_process("virt_hypervisor: false\n")["grain"] is False


# a minion's main process after saltutil.sync_all: grains at start, the library upgraded on disk, grains again
# (saltutil.refresh_modules computes them again), then what the next job would import
UPGRADED = """
import sys
import salt.config, salt.loader
opts = salt.config.minion_config(sys.argv[1])
opts["__cli"] = "salt-minion"
salt.loader.grains(opts, force_refresh=True)
before = sys.modules["saltvirt.base.validate"]
assert before.__file__.startswith(sys.argv[2]), before.__file__
with open(before.__file__, "a") as fh:
    fh.write("\\nUPGRADED = True\\n")
salt.loader.grains(opts, force_refresh=True)
import saltvirt.base.validate
print(getattr(saltvirt.base.validate, "UPGRADED", False), saltvirt.base.validate is before)
"""


def test_a_library_upgraded_on_disk_is_imported_anew_when_the_grains_are_computed_again(tmp_path):
    """The library in the minion's main process must not outlive an upgrade: ``saltutil.sync_all`` writes the new
    files and refreshes the modules, which computes the grains again; the next jobs must get the new library
    (as they did when each job imported it). Here the extension-modules layout a sync writes, in ``tmp_path``."""
    ext = tmp_path / "extmods"
    shutil.copytree(ROOT / "_grains", ext / "grains", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "_utils" / "saltvirt", ext / "utils" / "saltvirt", ignore=shutil.ignore_patterns("__pycache__")
    )
    conf = tmp_path / "minion"
    conf.write_text(f"cachedir: {tmp_path / 'cache'}\ngrains_dirs: [{ext / 'grains'}]\nvirt_hypervisor: true\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the library only where a sync puts it
    run = subprocess.run(
        [sys.executable, "-c", UPGRADED, str(conf), str(ext)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "False"]  # the upgraded module, a new import of it
