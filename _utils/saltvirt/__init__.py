"""salt-virt shared library: plain, importable Python used by the `virt` execution module, state
module, runner and the `libvirt` ext_pillar (domain spec, XML, placement, PKI, images, seeding).

Deployed two ways:
* ``pip install .`` installs this package as ``saltvirt``;
* ``saltutil.sync_all`` copies ``_utils/saltvirt`` to ``<extension_modules>/utils/saltvirt`` and the loader
  modules put that directory on ``sys.path`` (see ``_modules/virt.py``).
"""

__version__ = "1.0.0"
