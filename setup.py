"""pip install . -> the ``saltvirt`` library plus the Salt loader directories, registered through the
``salt.loader`` entry point (see _utils/saltvirt/loader.py)."""

from setuptools import find_packages, setup

EXT_DIRS = {
    "modules": "_modules",
    "states": "_states",
    "runners": "_runners",
    "pillar": "_pillar",
    "output": "_output",
    "grains": "_grains",
    "engines": "_engines",
}

setup(
    name="salt-virt",
    version="0.1.0",
    description="Salt as a private-cloud controller for libvirt/KVM: virt module, states, runner, PKI pillar",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=["saltvirt", *(f"saltvirt.{p}" for p in find_packages("_utils/saltvirt"))]
    + [f"saltvirt.ext.{kind}" for kind in EXT_DIRS],
    package_dir={"saltvirt": "_utils/saltvirt", **{f"saltvirt.ext.{k}": d for k, d in EXT_DIRS.items()}},
    install_requires=["salt>=3006", "libvirt-python", "cryptography"],
    entry_points={"salt.loader": ["salt-virt = saltvirt.loader:get_dirs"]},
)
