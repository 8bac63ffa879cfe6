"""What limits a host tool ran under: a stand-in first on PATH notes its ``/proc/self/limits``, then execs the
real tool (the call under test runs exactly as it would, through its own runner)."""

import os
import re
import shutil


def note_limits(monkeypatch, tmp_path, tool="qemu-img"):
    """Put the stand-in for ``tool`` first on PATH; returns a function giving, per run so far, its
    ``{"address space": (soft, hard), "cpu time": (soft, hard)}``."""
    real = shutil.which(tool)
    bindir = tmp_path / "noting-bin"
    bindir.mkdir()
    noted = tmp_path / "noted-limits"
    stand_in = bindir / tool
    stand_in.write_text(f'#!/bin/sh\ncat /proc/self/limits >> "{noted}"\nexec "{real}" "$@"\n')
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def runs():
        text = noted.read_text() if noted.exists() else ""
        return [
            {"address space": (space[0], space[1]), "cpu time": (cpu[0], cpu[1])}
            for cpu, space in zip(
                re.findall(r"^Max cpu time\s+(\S+)\s+(\S+)", text, re.M),
                re.findall(r"^Max address space\s+(\S+)\s+(\S+)", text, re.M),
                strict=True,
            )
        ]

    return runs
