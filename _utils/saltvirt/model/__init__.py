"""What a VM should be, checked from Salt's arguments: pure data, no libvirt, no files (layer 3, both sides).

``vmargs`` (the argument table: ``InitRequest``, the typed request of one ``virt.init``), ``vmspec`` (the one
VM spec for ``virt.init``, ``virt.update`` and the states, built from that request), ``checks`` (nested arguments
checked key by key), ``cpumem`` (Salt's ``cpu``/``mem``/``numatune`` dicts), ``compat`` (Salt's old argument
spellings), ``netargs`` and ``poolargs`` (the network and pool calls' arguments declared once).
May import: ``base``, ``pki``.
"""
