"""Before the first boot: seeding a minion config and key into the image, cloud-init, minion install (layer 7).

``seed`` (backends: libguestfs, qemu-nbd, qsd-fuse, loop), ``guestroot`` (paths resolved and files written inside a
mounted guest), ``disklabel`` (partition table, filesystem type),
``cloudinit`` (NoCloud ISO), ``firstboot``. Minion side.
May import: every layer below (``base`` .. ``storage``).
"""
