"""Both ways users deploy the bundle load `virt`: saltutil.sync_all from file_roots, and pip install ."""

import json
import os
import shutil
import subprocess
import sys

import salt.config

from tests.support.paths import ROOT
from tests.support.saltd import compiled

LOADERS = {
    # kind -> (existing repo dir, loader call, expected function)
    "modules": ("_modules", "salt.loader.minion_mods(opts, utils=utils)", "virt.init"),
    "states": ("_states", "salt.loader.states(opts, mods, utils, {})", "virt.running"),
    "runners": ("_runners", "salt.loader.runner(opts, utils=utils)", "virt.query"),
    "engines": ("_engines", "salt.loader.engines(opts, mods, [], utils)", "virt_events.start"),
}


def test_sync_all_route_loads_virt_on_minion(hyper1, salt_cli):
    ret = salt_cli.run("saltutil.sync_all", minion_tgt="hyper1")
    assert ret.returncode == 0, ret
    compiled(hyper1)  # the sync removed the bytecode it did not write: the session's later jobs need it
    ret = salt_cli.run("virt.get_hypervisor", minion_tgt="hyper1")
    assert ret.returncode == 0, ret
    assert ret.data == {"type": "qemu", "reason": ret.data["reason"]}
    ret = salt_cli.run("sys.doc", "virt.init", minion_tgt="hyper1")
    assert "salt 'hyper*' virt.init centos1 2 512" in ret.data["virt.init"]


def test_master_serves_salt_files_in_salts_own_chunk_size(salt_master):
    # one request per chunk: salt-factories' 8 KiB made salt://images/debian.qcow2 (197 MB) a minute (#33)
    assert salt_master.config["file_buffer_size"] >= salt.config.DEFAULT_MASTER_OPTS["file_buffer_size"]


def test_pip_install_registers_salt_loader_entry_point(tmp_path):
    target = tmp_path / "site"
    # pip builds in the source tree (build/, *.egg-info): build from a copy, never write into the checkout
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "tests"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    probe = f"""
import json, sys, tempfile
import salt.config, salt.loader
opts = salt.config.minion_config(None)
opts.update(file_client="local", cachedir=tempfile.mkdtemp(), virt={{"connection": {{"uri": "test:///default"}}}})
opts["grains"] = {{}}
utils = salt.loader.utils(opts)
mods = salt.loader.minion_mods(opts, utils=utils)
found = {{}}
for kind, (repo_dir, call, fun) in {json.dumps(LOADERS)}.items():
    loader = eval(call)
    found[kind] = [fun, fun in loader]
import saltvirt, saltvirt.loader
found["saltvirt"] = saltvirt.__file__
found["dirs"] = saltvirt.loader.get_dirs()
found["virt_type"] = mods["virt.virt_type"]()
print(json.dumps(found))
"""
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=str(tmp_path), env=env, check=True, capture_output=True, text=True
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["saltvirt"].startswith(str(target))
    assert found["virt_type"] == "test"
    for kind, (repo_dir, _call, fun) in LOADERS.items():
        if (ROOT / repo_dir / f"{fun.split('.')[0]}.py").exists():
            assert found[kind] == [fun, True], (kind, found)
            assert found["dirs"][kind] == [str(target / "saltvirt" / "ext" / kind)]
