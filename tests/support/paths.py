"""Where things are: the repository, the test guest, the libvirt test driver's node files."""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
GUEST_DIR = pathlib.Path(os.environ.get("SALT_VIRT_GUEST", "/var/cache/salt-virt/guest"))
TEST_NODE_XML = SUPPORT / "node-small.xml"  # a file-based test:/// node: fresh state per connection
NODES = SUPPORT / "nodes"  # read-only test:/// nodes of different capacities (runner tests)
# the test guest prints its markers on the serial console; no_timer_check: a vCPU starved by a loaded host (TCG)
# fails the kernel's early IO-APIC timer check and panics ("IO-APIC + timer doesn't work!", run G1, load 15)
GUEST_CMDLINE = "console=ttyS0 quiet no_timer_check"
# Salt 3008.5's resource registry sizes its index for a million resources: a 256 MiB file written full of zeros in
# every master's cachedir (and every test's). A test fleet registers dozens; 4,096 slots are 512 KiB.
SMALL_REGISTRY = {"resource_index_primary_capacity": 1 << 12}


def guest_boot(guest: dict, extra: str = "", initrd: str = "initrd") -> dict:
    """``boot=`` for the test guest (the ``guest`` fixture): its kernel, its initrd (``initrd_qga``: the one
    with the guest agent) and :data:`GUEST_CMDLINE` plus ``extra`` (``guest.ip=...``, ``guest.mode=...``)."""
    return {"kernel": guest["kernel"], "initrd": guest[initrd], "cmdline": f"{GUEST_CMDLINE} {extra}".strip()}


def master_engines() -> list[pathlib.Path]:
    """The engines that run on the master (their docstring says "Engine ``name`` (master)"): the master side's
    rules apply to them; every other engine runs on a hypervisor minion."""
    return [p for p in sorted((ROOT / "_engines").glob("*.py")) if "(master)" in p.read_text().split("\n", 3)[1]]


# the library is plain Python under _utils (Salt ships it to minions as utils): importable as `saltvirt`
if str(ROOT / "_utils") not in sys.path:
    sys.path.insert(0, str(ROOT / "_utils"))
