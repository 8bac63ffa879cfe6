"""The master side: many hypervisors at once (layer 9, master only; nothing imports it).

``publish`` (publish to hypervisor minions, gather answers), ``fleetstate`` (locks and reservations shared by
masters), ``leftovers`` (cleaning up after an interrupted ``salt-run virt.init``), ``hypervisors``, ``placement``
(+ ``capacitypush``), ``minionkeys``, ``vmcreate``, ``vmwait``, ``relocate``, ``rebalance``, ``recovery``, ``assign``,
``callers`` (who called a runner job), ``tenants`` (virt:tenants), ``quota`` (tenant quotas), ``catalog``
(virt:catalog), ``vmrates`` (``salt-run virt.query rates=True``).
May import: every layer below.
"""
