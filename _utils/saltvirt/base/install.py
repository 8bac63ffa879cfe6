"""How salt-virt is installed, as its messages say it: the one pip hint (Salt's onedir packages have their
own pip, ``salt-pip``), and the check that the community ``saltext.virt`` is not installed beside it (both
provide ``virt``). User guide: docs/install.md."""

import importlib.metadata
import logging

# The master needs no libvirt-python (an sdist that needs a compiler and libvirt's headers); a hypervisor
# minion takes the extra that brings it.
MASTER = "salt-virt"
HYPERVISOR = "salt-virt[hypervisor]"
# saltext-virt's distribution as PyPI spells it, and normalized
SALTEXT_VIRT = ("saltext.virt", "saltext-virt")
CLASH = (
    "%s is installed beside salt-virt: both provide Salt's `virt` execution module, states and runner, and Salt's "
    "loader picks one `virt` of the two unpredictably. Uninstall one of them (pip uninstall saltext.virt, or "
    "salt-virt; salt-pip with Salt's onedir packages), then restart the salt daemons (docs/install.md)"
)
_checked = False


def pip_hint(requirement: str = HYPERVISOR) -> str:
    """The one wording of "install it with pip" (an extra is quoted: ``[...]`` is a shell glob)."""
    req = f"'{requirement}'" if "[" in requirement else requirement
    return f"pip install {req} (Salt's onedir packages: salt-pip install {req})"


HYPERVISOR_HINT = pip_hint(HYPERVISOR)
MASTER_HINT = pip_hint(MASTER)


def saltext_virt() -> str | None:
    """``"<name> <version>"`` of saltext-virt when it is installed in this Python, else None."""
    for name in SALTEXT_VIRT:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return f"{dist.metadata['Name'] or name} {dist.version}"
    return None


def warn_saltext_virt(log: logging.Logger) -> str | None:
    """Log :data:`CLASH` when saltext-virt is installed too, once per process (Salt loads modules many times);
    returns what was found on that first call."""
    global _checked
    if _checked:
        return None
    _checked = True
    found = saltext_virt()
    if found:
        log.warning(CLASH, found)
    return found
