"""libvirt XML: domain, network, pool, volume and secret documents; ElementTree only, no libvirt calls (layer 4).

The package ``domain`` is the only builder/reader of domain XML, by element group (devices, tuning, boot,
metadata), each element's builder beside its reader; ``netxml`` and ``poolxml`` the same for networks and
storage. Minion side.
May import: ``base``, ``pki``, ``model``.
"""
