"""libvirt XML: domain, network, pool, volume and secret documents; ElementTree only, no libvirt calls (layer 4).

``domxml`` (+ its part ``domxml_features``) is the only builder/reader of domain XML, one builder per
element; ``netxml`` and ``poolxml`` the same for networks and storage. Minion side.
May import: ``base``, ``pki``, ``spec``.
"""
