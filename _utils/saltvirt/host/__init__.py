"""One libvirtd: connections, facts, lifecycle, networks and pools, events, the recovery record (layer 5).

``conn`` (URIs, connections, error translation), ``hosttype``, ``caps``, ``query``, ``capacity`` (what
placement asks), ``guestips``, ``stats``, ``lifecycle``, ``snapshot``, ``netpool``, ``events`` (the
``virt_events`` engine) and ``hostrecord``. Minion side.
May import: ``base``, ``pki``, ``model``, ``xml``.
"""
