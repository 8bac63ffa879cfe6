"""
States for libvirt hypervisors and their VMs: ``virt.keys`` (libvirt TLS files from the ``libvirt``
pillar), VMs (``running``, ``defined``, ``stopped``, ``powered_off``, ``rebooted``, ``absent``),
networks and storage pools. The logic lives in the ``saltvirt`` library.
"""
import os
import sys

try:
    import saltvirt  # pip install . puts it on sys.path
except ImportError:  # saltutil.sync_all: <extension_modules>/{states,utils/saltvirt}, or a repo checkout
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [p for p in (os.path.join(_ROOT, "utils"), os.path.join(_ROOT, "_utils")) if os.path.isdir(p)]
    try:
        import saltvirt
    except ImportError:
        saltvirt = None

__virtualname__ = "virt"


def __virtual__():
    if saltvirt is None:
        return False, "virt states: the saltvirt library is missing (run saltutil.sync_all, or pip install salt-virt)"
    return __virtualname__


def keys(name, basepath="/etc/pki", qemu=False, **kwargs):  # pylint: disable=unused-argument
    """
    Write the libvirt TLS CA, server and client certificates and keys from this minion's ``libvirt``
    pillar (the ``libvirt`` ext_pillar) where libvirtd reads them:
    ``<basepath>/CA/cacert.pem``, ``<basepath>/libvirt/{servercert,clientcert}.pem``,
    ``<basepath>/libvirt/private/{serverkey,clientkey}.pem`` (keys 0600, private/ 0700).
    ``qemu=True`` also fills ``<basepath>/qemu/`` for QEMU-native migration TLS.
    Changes name the files, never key material. Watch it to restart libvirtd.

    .. code-block:: yaml

        libvirt_keys:
          virt.keys:
            - basepath: /etc/pki
    """
    from saltvirt import keyfiles

    return keyfiles.keys_state(name, __pillar__.get("libvirt"), basepath, qemu=qemu, test=__opts__["test"])
