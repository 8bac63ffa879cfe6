"""libvirt domain XML by element group, each element's builder beside its reader (as nova's
``format_dom``/``parse_dom``): ``devices``, ``tuning`` (CPU, memory, NUMA), ``boot`` (os, firmware, features,
clock, lifecycle actions), ``metadata`` (salt-virt's own record); ``definition`` composes them (``build`` the
builders, ``parse`` and ``feature_facts`` the readers, ``replace_features`` the replacers); ``edit`` changes an
existing definition with the same builders. ElementTree only, no libvirt calls.
"""
