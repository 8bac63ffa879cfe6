"""One VM on its hypervisor: create, converge, clean up, migrate (layer 8, minion side).

``provision`` (the minion side of ``virt.init`` and purge), ``converge`` (``virt.update`` and the VM states),
``resolve`` (desired -> resolved: what only the hypervisor knows, into a copy of the spec),
``cleanup`` (init lock, ``virt.cleanup``), ``progress`` (``virt.init`` progress events), ``migrate`` (+
``migrate_tls``: what a migration encrypts).
May import: every layer below (``base`` .. ``guest``).
"""
