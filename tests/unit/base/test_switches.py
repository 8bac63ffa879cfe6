"""saltvirt.base.switches: the operator's switches, read from the minion config only."""

import pytest
from salt.exceptions import SaltInvocationError

from saltvirt.base import switches


def test_operator_settings_come_from_the_minion_config_only():
    libvirts = ("/var/lib/libvirt/images",)
    none = {
        "adopt_orphan_disks": False,
        "pools": None,
        "host_devices": (),
        "trusted_images": (),
        "allowed_paths": libvirts,
        "pool_paths": libvirts,  # virt:allowed_paths' unless set
        "pool_sources": {"devices": (), "names": (), "hosts": (), "adapters": ()},
        "serial_tcp_ports": None,
        "serial_tcp_listen": switches.DEFAULT_SERIAL_LISTEN,
        "firmware": (),
    }
    assert switches.operator_settings({}) == none
    conf = {
        "virt": {
            "pools": "vms",
            "host_devices": ["pci_0000_00_1f_2"],
            "adopt_orphan_disks": "true",
            "allowed_paths": [],
            "pool_paths": "/srv/pools",
            "pool_sources": {"devices": "/dev/sdb", "hosts": ["nfs*.example.com"]},
            "serial_tcp_ports": "4600-4699",
            "serial_tcp_listen": ["192.0.2.1"],
            "firmware": ["/srv/fw/CODE.fd"],
        }
    }
    assert switches.operator_settings(conf) == {
        "adopt_orphan_disks": True,
        "pools": ("vms",),
        "host_devices": ("pci_0000_00_1f_2",),
        "trusted_images": (),
        "allowed_paths": (),
        "pool_paths": ("/srv/pools",),
        "pool_sources": {"devices": ("/dev/sdb",), "names": (), "hosts": ("nfs*.example.com",), "adapters": ()},
        "serial_tcp_ports": (4600, 4699),
        "serial_tcp_listen": ("192.0.2.1",),
        "firmware": ("/srv/fw/CODE.fd",),
    }
    for key, bad, message in [
        ("pool_sources", {"disks": ["/dev/sdb"]}, "virt:pool_sources in the minion config must be a mapping of"),
        ("pool_sources", {"devices": [3]}, "virt:pool_sources:devices in the minion config must be a list of names"),
        ("pool_paths", ["relative"], "virt:pool_paths entry must be an absolute path"),
        ("serial_tcp_ports", "22-4000", "virt:serial_tcp_ports in the minion config must be a port range"),
        ("serial_tcp_ports", [5000, 4000], "must be a port range"),
        ("serial_tcp_ports", "many", "must be a port range"),
        ("firmware", [""], "virt:firmware entry must be a non-empty string"),
    ]:
        with pytest.raises(SaltInvocationError, match=message):
            switches.operator_settings({"virt": {key: bad}})
    assert switches.operator_settings({"virt": {"serial_tcp_ports": 5901}})["serial_tcp_ports"] == (5901, 5901)
