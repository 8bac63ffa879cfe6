"""Entry point for Salt's loader (``salt.loader`` group, new style: a callable returning a dict).

After ``pip install .`` Salt calls :func:`get_dirs` and adds these directories to its module search
path, so ``virt.*`` (modules, states, runners), the ``libvirt`` ext_pillar, the ``virt_query``
outputter, the ``virt_hypervisor`` grain and the ``virt_events`` engine load without
``saltutil.sync_all``.
"""

import os

_EXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ext")
KINDS = {
    "modules": "modules",
    "states": "states",
    "runners": "runners",
    "pillar": "pillar",
    "output": "output",
    "grains": "grains",
    "engines": "engines",
}


def get_dirs():
    return {kind: [os.path.join(_EXT, sub)] for kind, sub in KINDS.items() if os.path.isdir(os.path.join(_EXT, sub))}
