"""Three (or more) "hypervisors" on libvirt's test driver for the recovery tests: each a private
file-based ``test:///`` connection (its own domains), all seeing one shared disk directory.

:class:`TestFleet` stands in for :class:`saltvirt.fleet.publish.Fleet`, the runner's transport only
(the real publication to real minions is tests/integration/test_recovery.py): every call is answered by
the real :mod:`saltvirt.host.hostrecord` function on that host's own connection, the way
``_modules/virt_recovery.py`` answers it. A host in ``silent`` does not answer (a down or cut-off minion).
"""

import os

import libvirt

from saltvirt.fleet import publish as fleet
from saltvirt.host import hostrecord
from saltvirt.host.query import state_name
from tests.support.paths import SMALL_REGISTRY, TEST_NODE_XML


def local_store(tmp_path, master_id="m1"):
    """A real localfs store (Salt's cache), as one master uses it."""
    import salt.config

    from saltvirt.fleet import fleetstate

    opts = salt.config.master_config(None)
    opts.update({"id": master_id, "cachedir": str(tmp_path / "cache"), "pki_dir": str(tmp_path / "pki"), "virt": {}})
    opts.update(SMALL_REGISTRY)
    return fleetstate.Store(opts)


def domain_xml(name, disk, uuid, mem=128):
    return (
        f"<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>{mem}</memory><vcpu>1</vcpu>"
        "<os><type>hvm</type></os><devices>"
        f"<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk}'/>"
        "<target dev='vda' bus='virtio'/></disk></devices></domain>"
    )


class TestFleet:
    __test__ = False  # not a test class for pytest

    def __init__(self, tmp_path, names=("hv1", "hv2", "hv3"), opts=None):
        self.shared = str(tmp_path / "shared")
        os.makedirs(self.shared, exist_ok=True)
        self.images = {n: str(tmp_path / f"{n}-images") for n in names}
        for path in self.images.values():
            os.makedirs(path, exist_ok=True)
        self.conns = {n: libvirt.open(f"test://{TEST_NODE_XML}") for n in names}
        # a libvirtd that is not there: its unix socket does not exist (connect: ENOENT, i.e. down)
        self.dead_uri = f"qemu+unix:///system?socket={tmp_path}/nothing/libvirt-sock"
        self.silent, self.calls, self.gathers = set(), [], []  # gathers: the down_after each gather waited
        # cfg: the waits a caller set (with_cfg: automatic HA's shorter down_after); answers do not depend on them
        self.opts, self.cfg, self.client = opts or {"id": "m1"}, {"down_after": 20}, None
        self.probe_uri = None  # None: the dead socket above; else every probe tries this URI

    def close(self):
        for conn in self.conns.values():
            conn.close()

    # what each hypervisor answers (the module functions of _modules/virt_recovery.py, minus Salt)
    def _answer(self, host, fun, args, kwargs):
        conn = self.conns[host]
        self.calls.append((host, fun, args[:1]))
        if fun == "virt.recovery_record":
            return hostrecord.record(conn, self.images[host], [self.shared])
        if fun == "virt.recovery_where":
            return hostrecord.where(conn, *args)
        if fun == "virt.recovery_check":
            return hostrecord.check_all(*args, self.images[host], [self.shared])
        if fun == "virt.recovery_restart":
            name, xml, storage = args
            start = kwargs.get("start", True)
            return hostrecord.restart(conn, name, xml, storage, self.images[host], [self.shared], start=start)
        if fun == "virt.recovery_probe":
            return hostrecord.probe(self.probe_uri or self.dead_uri, 5)
        if fun == "virt.recovery_disarm":
            return hostrecord.disarm(conn, args[0])
        if fun == "virt.undefine":
            conn.lookupByName(args[0]).undefine()
            return True
        raise AssertionError(f"unexpected call {fun} on {host}")

    def target(self):
        return sorted(self.conns)

    def with_cfg(self, cfg):
        self.cfg = cfg
        return self

    def ret(self, minion, fun, *args, max_wait=None, **kwargs):
        if minion in self.silent:
            raise fleet.Failed(f"{fun} on {minion}: did not answer", host=minion, status="down")
        return self._answer(minion, fun, args, kwargs)

    def answers(self, fun, *args, tgt=None):
        return {
            h: {"status": "down", "error": "did not answer"}
            if h in self.silent
            else {"status": "up", "ret": self._answer(h, fun, args, {})}
            for h in sorted(tgt or self.conns)
        }

    def gather(self, fun):
        assert fun == "virt.full_info", fun
        self.gathers.append(self.cfg["down_after"])
        out = {}
        for h, conn in sorted(self.conns.items()):
            if h in self.silent:
                out[h] = {"status": "down", "error": "did not answer"}
                continue
            vms = {
                d.name(): {"state": state_name(d.state()[0]), "uuid": d.UUIDString()} for d in conn.listAllDomains(0)
            }
            facts = {"mem_total": 8192, "mem_used_by_vms": 0, "vcpus_total": 4, "vcpus_used_by_vms": 0}
            out[h] = {"status": "up", "host": facts, "vm_info": vms}
        return out

    # facts for the asserts: libvirt itself, on every host
    def running(self, name):
        """The hosts where ``name`` runs, by libvirt (all hosts, silent ones included)."""
        out = []
        for h, conn in sorted(self.conns.items()):
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                if dom.name() == name:
                    out.append(h)
        return out
