"""The tutorial image's recipe (scripts/build-debian-image.sh), read as text: the units it writes into the guest
and the code they run. Building and booting the image: tests/integration/test_tutorial.py (the markers, the
leased address in the new minion's grains) and bench/bench_tutorial.py --ratios (the times)."""

import configparser
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
    """The minion's imports are read while the boot waits for its lease (issue #40): at the lowest priority,
    after the local filesystems only, and no unit (the minion, network-online, the boot's targets) orders
    itself after it, so it can only use time the boot leaves idle."""
    prefetch = unit("sv-minion-prefetch.service")
    assert prefetch["Unit"]["After"].split() == ["local-fs.target"]
    assert not {"Before", "Requires", "RequiredBy", "BindsTo", "PartOf"} & set(prefetch["Unit"])
    assert prefetch["Unit"]["DefaultDependencies"] == "no"  # not after basic.target: it starts early
    assert prefetch["Service"]["Type"] == "simple"  # multi-user.target does not wait for it to end
    assert prefetch["Service"]["Nice"] == "19" and prefetch["Service"]["IOSchedulingClass"] == "idle"
    assert prefetch["Install"]["WantedBy"] == "multi-user.target"
    assert "sv-minion-prefetch.service" in enabled()
    minion = unit("salt-minion.service")
    assert "sv-minion-prefetch" not in str({k: dict(v) for k, v in minion.items()})
    assert "sv-minion-prefetch" not in heredoc("etc/systemd/system/sv-phase-dhcp.service")


def test_the_prefetch_code_runs_against_salt_and_touches_no_key_or_network():
    """The guest runs it with its output discarded (a failure would only make it useless, silently): run it here
    with this venv's Salt (the image's version) and check it names no key, master or socket."""
    script = heredoc("usr/local/sbin/sv-minion-prefetch")
    code = re.search(r"/opt/saltstack/salt/bin/python -c '(.*?)'", script, re.S).group(1)
    for word in ("pki", "master", "socket", "connect", "open(", "write", "auth"):
        assert word not in code, word
    assert "exec /usr/local/sbin/sv-phase prefetch" in script  # its end on the console, for the bench
    wanted = ("salt.minion", "salt.crypt", "salt.grains.core")
    probe = code + f"\nimport sys\nprint(sorted(m for m in {wanted!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "['salt.crypt', 'salt.grains.core', 'salt.minion']"
