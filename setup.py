"""pip install . -> the ``saltvirt`` library plus the Salt loader directories, registered through the
``salt.loader`` entry point (see _utils/saltvirt/loader.py). The master takes ``salt-virt``; hypervisor
minions take ``salt-virt[hypervisor]``, which brings libvirt-python (docs/install.md)."""

import os
import re

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
EXT_DIRS = {
    "modules": "_modules",
    "states": "_states",
    "runners": "_runners",
    "pillar": "_pillar",
    "output": "_output",
    "grains": "_grains",
    "engines": "_engines",
    "resources": "_resources",  # Salt 3008 resource types: <type>/__init__.py and <type>/modules/*.py
}
# a resource type is a package with a modules/ folder: Salt's entry-point loader finds <ext>/resources/<type>/modules
RESOURCE_PACKAGES = [
    f"saltvirt.ext.resources.{os.path.relpath(d, os.path.join(HERE, '_resources')).replace(os.sep, '.')}"
    for d, _, files in sorted(os.walk(os.path.join(HERE, "_resources")))
    if d != os.path.join(HERE, "_resources") and "__pycache__" not in d and any(f.endswith(".py") for f in files)
]
# They stay at the repository root, where file_roots serves them (salt://salt-virt.reactor.sls, salt://salt-virt/
# the formula); the wheel carries them as package data, saltvirt/data/ (the formula in saltvirt/data/salt-virt/):
# data_files would be lost to salt-pip, whose pip --target keeps only what lands in site-packages.
EXAMPLES = [
    "salt-virt.example.sls",
    "salt-virt.reactor.sls",
    "salt-virt.remediate.sls",
    "salt-virt/init.sls",
    "salt-virt/map.jinja",
    "salt-virt/pillar.example",
]
# the web console (docs/topics/console.md): static files salt-api serves from saltvirt/data/console/
CONSOLE = [
    "console/index.html",
    "console/console.js",
    "console/console.css",
    "console/vnc.js",
    "console/jobs.js",
    "console/create.js",
    "console/vm.js",
    "console/views.css",
]
# whole trees copied with it: the vendored noVNC client (its licence files included)
CONSOLE_TREES = ["console/vendor/novnc"]


def tree_files(top):
    """The files under ``top`` (relative to the checkout), sorted."""
    return sorted(
        os.path.relpath(os.path.join(d, f), HERE) for d, _, files in os.walk(os.path.join(HERE, top)) for f in files
    )


def version():
    """``__version__`` of _utils/saltvirt/__init__.py, the one place it is written: read, not imported
    (setup.py runs where the package is not installed yet)."""
    with open(os.path.join(HERE, "_utils", "saltvirt", "__init__.py"), encoding="utf-8") as fh:
        found = re.search(r'^__version__ = "([^"]+)"$', fh.read(), re.M)
    if not found:
        raise RuntimeError('_utils/saltvirt/__init__.py has no line __version__ = "..."')
    return found.group(1)


class BuildPy(build_py):
    """build_py, plus EXAMPLES and CONSOLE copied into saltvirt/data/."""

    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "saltvirt", "data")
        for name in EXAMPLES + CONSOLE + [f for top in CONSOLE_TREES for f in tree_files(top)]:
            self.mkpath(os.path.dirname(os.path.join(dest, name)))
            self.copy_file(os.path.join(HERE, name), os.path.join(dest, name))


with open(os.path.join(HERE, "README.md"), encoding="utf-8") as fh:
    README = fh.read()

setup(
    name="salt-virt",
    version=version(),
    description="Salt as a private-cloud controller for libvirt/KVM: virt module, states, runner, PKI pillar",
    long_description=README,
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE", "NOTICE"],
    python_requires=">=3.10",
    packages=["saltvirt", *(f"saltvirt.{p}" for p in find_packages("_utils/saltvirt"))]
    + [f"saltvirt.ext.{kind}" for kind in EXT_DIRS]
    + RESOURCE_PACKAGES,
    package_dir={"saltvirt": "_utils/saltvirt", **{f"saltvirt.ext.{k}": d for k, d in EXT_DIRS.items()}},
    # libvirt-python is an sdist (a compiler, pkg-config and libvirt's headers): only where VMs run
    install_requires=["salt>=3006", "cryptography"],
    extras_require={"hypervisor": ["libvirt-python"]},
    entry_points={"salt.loader": ["salt-virt = saltvirt.loader:get_dirs"]},
    cmdclass={"build_py": BuildPy},
)
