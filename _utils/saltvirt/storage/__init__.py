"""Disks and images: qemu-img, the ownership manifest, the one door for untrusted images, pool volumes (layer 6).

``images`` (create, clone, info, manifests), ``intake`` (fetch, checksum, format checks, base gc), ``attach``
(the one door for existing disks a VM is given, checked against the operator's switches), ``volumes``
(VM disks on pool volumes), ``pools`` (what pool calls and VM disks share: secrets, facts, volumes),
``poolcalls`` (Salt's ``pool_*``/``volume_*``, one function each: ``poollimits``' checks, then
``host.netpool``'s lifecycle and ``pools``), ``poollimits`` (the operator's limits on them, as checks) and
``firmware`` (the UEFI files a VM may be given). Both sides (the runner uses intake).
May import: ``base``, ``pki``, ``model``, ``xml``, ``host``.
"""
