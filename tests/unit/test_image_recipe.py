"""The tutorial image's recipe (scripts/build-debian-image.sh), read as text: the units it writes into the guest
and the code they run. Building and booting the image: tests/integration/test_tutorial.py (the markers, the
leased address in the new minion's grains) and bench/bench_tutorial.py --ratios (the times)."""

import configparser
import os
import re
import subprocess
import sys

from tests.support.paths import ROOT

RECIPE = (ROOT / "scripts" / "build-debian-image.sh").read_text()


def heredoc(target):
    """The text the recipe writes to ``"$R/<target>"`` with a quoted here-document (``cat > ... <<'TAG'``)."""
    m = re.search(rf"cat > \"\$R/{re.escape(target)}\" <<'(\w+)'\n(.*?)\n\1\n", RECIPE, re.S)
    assert m, f"the recipe no longer writes {target} with a quoted here-document"
    return m.group(2)


def unit(name):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(heredoc(f"etc/systemd/system/{name}"))
    return parser


def enabled():
    """Units the recipe enables in the image (``chroot "$R" systemctl enable ...``)."""
    return {u for line in re.findall(r'chroot "\$R" systemctl enable ([^>\n]+)', RECIPE) for u in line.split()}


def test_the_prefetch_runs_beside_the_boot_and_nothing_waits_for_it():
    """The minion's files are read while the boot goes on to its lease (issue #40): right after the local
    filesystems, and no unit (the minion, network-online, the boot's targets) orders itself after it, so the
    boot never waits for it."""
    prefetch = unit("sv-minion-prefetch.service")
    assert prefetch["Unit"]["After"].split() == ["local-fs.target"]
    assert not {"Before", "Requires", "RequiredBy", "BindsTo", "PartOf"} & set(prefetch["Unit"])
    assert prefetch["Unit"]["DefaultDependencies"] == "no"  # not after basic.target: it starts early
    assert prefetch["Service"]["Type"] == "simple"  # multi-user.target does not wait for it to end
    # a short burst (one Python, an open and an fadvise per file) at normal priority: at nice 19 the busy boot
    # left it the CPU only just before the lease, or after the minion's start (bench/RESULTS.md, round 5)
    assert int(prefetch["Service"].get("Nice", "0")) >= 0
    # idle I/O class: its reads would wait behind the boot's, and the minion's own reads of the same pages behind them
    assert prefetch["Service"].get("IOSchedulingClass") != "idle"
    assert prefetch["Service"]["ExecStart"] == "/usr/local/sbin/sv-minion-prefetch"
    assert prefetch["Install"]["WantedBy"] == "multi-user.target"
    assert "sv-minion-prefetch.service" in enabled()
    minion = unit("salt-minion.service")
    assert "sv-minion-prefetch" not in str({k: dict(v) for k, v in minion.items()})
    assert "sv-minion-prefetch" not in heredoc("etc/systemd/system/sv-phase-dhcp.service")


def test_the_prefetch_asks_the_kernel_to_read_each_listed_file(tmp_path):
    """The reader (the guest's system Python, no site) opens each listed file and asks for its pages
    (posix_fadvise WILLNEED: no copy, little CPU), skips what it cannot open, then marks its end on the
    console: run here against a list of a file, a missing path and a directory (whatever fadvise says of
    it), the marker's command replaced by a script that records its arguments."""
    script = heredoc("usr/local/sbin/sv-minion-prefetch")
    assert script.startswith("#!/usr/bin/python3 -SI\n")
    assert '"/usr/local/share/sv-minion-prefetch.list"' in script
    listed = tmp_path / "listed.bin"
    listed.write_bytes(b"x" * 300_000)
    (tmp_path / "list").write_text(f"{listed}\n{tmp_path}/missing\n{tmp_path}\n")
    phase = tmp_path / "sv-phase"
    phase.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/marker\n')
    phase.chmod(0o755)
    code = script.replace("/usr/local/share/sv-minion-prefetch.list", str(tmp_path / "list"))
    code = code.replace('"/usr/local/sbin/sv-phase"', repr(str(phase)))
    strace = subprocess.run(
        ["strace", "-f", "-e", "trace=fadvise64,openat", sys.executable, "-SI", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert strace.returncode == 0, strace.stderr[-3000:]
    assert (tmp_path / "marker").read_text() == "prefetch\n"
    advised = re.findall(r"fadvise64\((\d+), 0, 0, POSIX_FADV_WILLNEED\) = 0", strace.stderr)
    opened = re.findall(rf'openat\(AT_FDCWD, "{re.escape(str(listed))}", O_RDONLY.*\) = (\d+)', strace.stderr)
    assert len(opened) == 1 and opened[0] in advised  # the listed file's pages asked for; the rest skipped


def test_the_prefetch_list_names_what_the_minion_reads():
    """The list is made at build time by Salt itself (the image's version is this venv's): run its code here and
    check it names the interpreter, the minion's bytecode, a grain module's and the shared libraries, and only
    files that exist. The guest discards the readers' errors, so a wrong list would only make it useless."""
    code = re.search(
        r"chroot \"\$R\" /opt/saltstack/salt/bin/python -c '(.*?)' > \"\$R/usr/local/share/sv-minion-prefetch.list\"",
        RECIPE,
        re.S,
    ).group(1)
    for word in ("pki", "socket", "connect", "write", "auth", 'open("/etc'):
        assert word not in code, word
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    files = out.stdout.split()
    assert all(os.path.isfile(f) for f in files)
    names = {os.path.basename(f) for f in files}
    assert os.path.realpath(sys.executable) in files
    assert {f"{m}.{sys.implementation.cache_tag}.pyc" for m in ("minion", "core", "crypt")} <= names
    assert any(n.startswith("_rust.") and n.endswith(".so") for n in names)  # cryptography: the RSA of the auth
    assert any(n.startswith("libc.so") for n in names)
    assert not [f for f in files if f.endswith(".py")]  # bytecode: the sources are not read
