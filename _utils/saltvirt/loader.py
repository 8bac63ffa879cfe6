"""Entry point for Salt's loader (``salt.loader`` group, new style: a callable returning a dict).

After ``pip install .`` Salt calls :func:`get_dirs` and adds these directories to its module search
path, so ``virt.*`` (modules, states, runners), the ``libvirt`` ext_pillar, the ``virt_query``
outputter, the ``virt_hypervisor`` grain and the ``virt_events`` engine and the ``virt_vm`` resource type load without
``saltutil.sync_all``. It also warns once when saltext-virt is installed too (see
:func:`saltvirt.base.install.warn_saltext_virt`).
"""

import logging
import os

from saltvirt.base import install

log = logging.getLogger(__name__)

_EXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ext")
KINDS = {
    "modules": "modules",
    "states": "states",
    "runners": "runners",
    "pillar": "pillar",
    "output": "output",
    "grains": "grains",
    "engines": "engines",
    # Salt 3008 resource types (``virt_vm``): Salt finds a type's own modules at <ext>/resources/<type>/modules,
    # <ext> being the parent of the "modules" path given here
    "resources": "resources",
}


def get_dirs():
    install.warn_saltext_virt(log)  # Salt calls this in every process that loads modules: the place to say it
    return {kind: [os.path.join(_EXT, sub)] for kind, sub in KINDS.items() if os.path.isdir(os.path.join(_EXT, sub))}
