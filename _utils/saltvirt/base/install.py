"""How salt-virt is installed, as its messages say it: the one pip hint (Salt's onedir packages have their
own pip, ``salt-pip``). User guide: docs/install.md."""

# The master needs no libvirt-python (an sdist that needs a compiler and libvirt's headers); a hypervisor
# minion takes the extra that brings it.
MASTER = "salt-virt"
HYPERVISOR = "salt-virt[hypervisor]"


def pip_hint(requirement: str = HYPERVISOR) -> str:
    """The one wording of "install it with pip" (an extra is quoted: ``[...]`` is a shell glob)."""
    req = f"'{requirement}'" if "[" in requirement else requirement
    return f"pip install {req} (Salt's onedir packages: salt-pip install {req})"


HYPERVISOR_HINT = pip_hint(HYPERVISOR)
MASTER_HINT = pip_hint(MASTER)
