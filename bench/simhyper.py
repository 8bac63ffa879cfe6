"""Simulated hypervisors for bench_fleetwire: H minion identities in one process, on the real wire.

Each identity has its own RSA key pair, accepted on the real salt-master, authenticates with Salt's own
request channel (``salt.channel.client.AsyncReqChannel``, AES session per identity, as a salt-minion) and
sends its returns as a minion does (``cmd: _return`` to the master's ReqServer: decrypted by the master's
workers, written to its job cache, fired on its event bus). Each answer is signed with that identity's own key
(``saltvirt.pki.answers``' scheme, the nonce of the request), so the runner verifies 200 keys, not one.

What is simulated: the hypervisor's work. Its answers are computed once (the real ``virt.full_info`` of a
test:/// node of D domains, names, UUIDs and MACs renamed per host; ``virt.vm_state`` derived from it) and
serialized once; per request only the signature is made. The simulator learns a publication from the master's
event bus (``salt/job/<jid>/new``, which carries the request) instead of Salt's publisher: 200 ZeroMQ
subscriptions in one process would measure that process, not the master.

    python bench/simhyper.py SPEC.json      # prints "ready" when every identity has authenticated
"""

import asyncio
import base64
import copy
import json
import os
import sys
import threading
import time

# what the salt CLI's own rounds ask (its batch ping, its job checks): answered as a minion would, unsigned
PLAIN = {"test.ping": True, "saltutil.find_job": {}}


def host_answers(template, index, domains):
    """``(full_info, vm_state)`` of simulated host ``index``: ``template`` (one real full_info) renamed."""
    fi = copy.deepcopy(template)
    vms = {}
    for j, (_name, tvm) in enumerate(sorted(template["vm_info"].items())[:domains]):
        vm = copy.deepcopy(tvm)
        name = f"h{index:03d}vm{j:03d}"
        vm["name"] = name
        vm["uuid"] = f"{index:08x}-0000-4000-8000-{j:012x}"
        for disk in (vm.get("disks") or {}).values():
            if isinstance(disk, dict) and disk.get("file"):
                disk["file"] = f"/srv/salt-images/{name}/system.qcow2"
        nics = {}
        for nic in (vm.get("nics") or {}).values():
            mac = f"52:54:{index >> 8:02x}:{index & 255:02x}:{j >> 8:02x}:{j & 255:02x}"
            nics[mac] = dict(nic, mac=mac)
        vm["nics"] = nics
        vms[name] = vm
    fi["vm_info"] = vms
    fi["host"] = dict(fi.get("host") or {}, hostname=f"hyper{index:03d}", vms_defined=len(vms))
    return fi, {n: v.get("state") for n, v in vms.items()}


class Identity:
    def __init__(self, mid, pki_dir, opts):
        import salt.payload
        from cryptography.hazmat.primitives import serialization

        self.mid, self.opts = mid, opts
        with open(os.path.join(pki_dir, "minion.pem"), "rb") as fh:
            self.key = serialization.load_pem_private_key(fh.read(), None)
        self.bodies = {}
        self.payload = salt.payload
        self.channel = None

    def body(self, fun, ret):
        self.bodies[fun] = self.payload.dumps({"ret": ret, "retcode": 0})

    def answer(self, fun, nonce, body):
        from cryptography.hazmat.primitives import hashes

        from saltvirt.pki import answers

        sig = self.key.sign(answers._signed_bytes(self.mid, fun, nonce, body), answers._pss(), hashes.SHA256())
        return {
            answers.MARK: answers.VERSION,
            "id": self.mid,
            "fun": fun,
            "nonce": nonce,
            "body": base64.b64encode(body).decode("ascii"),
            "sig": base64.b64encode(sig).decode("ascii"),
        }


def minion_opts(spec, mid):
    import salt.config

    opts = salt.config.minion_config(None)
    d = os.path.join(spec["base"], mid)
    opts.update(
        {
            "id": mid,
            "master": "127.0.0.1",
            "master_port": spec["ret_port"],
            "pki_dir": os.path.join(d, "pki"),
            "cachedir": os.path.join(d, "cache"),
            "sock_dir": os.path.join(d, "sock"),
            "master_uri": f"tcp://127.0.0.1:{spec['ret_port']}",
            "acceptance_wait_time": 1,
        }
    )
    return opts


async def serve(spec, idents, jobs):
    import salt.channel.client

    sem = asyncio.Semaphore(spec.get("concurrency", 16))

    async def connect(ident):
        async with sem:
            ident.channel = salt.channel.client.AsyncReqChannel.factory(ident.opts)
            await ident.channel.connect()
            await ident.channel.auth.authenticate()

    await asyncio.gather(*(connect(i) for i in idents.values()))
    print("ready", flush=True)

    async def send(ident, jid, job, fun, nonce):
        async with sem:
            if job in PLAIN:
                ret = PLAIN[job]
            else:
                ret = ident.answer(fun, nonce, ident.bodies.get(fun) or ident.bodies["empty"])
            load = {
                "cmd": "_return",
                "id": ident.mid,
                "jid": jid,
                "fun": job,
                "fun_args": [],
                "return": ret,
                "retcode": 0,
                "success": True,
            }
            await ident.channel.send(load, timeout=120)

    while True:
        got = await asyncio.get_running_loop().run_in_executor(None, jobs.get)
        if got is None:
            return
        jid, data = got
        kw = next((a for a in data.get("arg") or [] if isinstance(a, dict) and a.get("__kwarg__")), {})
        # the salt CLI publishes its key=value arguments as strings (the minion parses them)
        kw = kw or dict(a.split("=", 1) for a in data.get("arg") or [] if isinstance(a, str) and "=" in a)
        fun, nonce = kw.get("fun"), kw.get("nonce")
        mine = [idents[m] for m in data.get("minions") or [] if m in idents]
        job = data.get("fun")
        if mine and (job in PLAIN or (fun and nonce)):
            t0 = time.perf_counter()
            await asyncio.gather(*(send(i, jid, job, fun, nonce) for i in mine))
            print(f"answered {jid} {job} {fun} x{len(mine)} in {time.perf_counter() - t0:.3f}s", flush=True)


def listen(spec, jobs):
    """The master's event bus -> ``jobs``: every ``salt/job/<jid>/new`` of ``virt.answer``."""
    import queue  # noqa: F401 - jobs is a queue.Queue

    import salt.config
    import salt.utils.event

    mopts = salt.config.master_config(spec["master_conf"])
    bus = salt.utils.event.get_master_event(mopts, mopts["sock_dir"], listen=True)
    while True:
        ev = bus.get_event(wait=1, tag="salt/job/", full=True)
        if not ev:
            continue
        parts = ev["tag"].split("/")
        if len(parts) == 4 and parts[3] == "new" and ev["data"].get("fun") in ("virt.answer", *PLAIN):
            jobs.put((parts[2], ev["data"]))


def main():
    import queue

    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    sys.path.insert(0, spec["utils"])
    with open(spec["template"]) as fh:
        template = json.load(fh)
    idents = {}
    for i in range(spec["hosts"]):
        mid = f"hyper{i:03d}"
        ident = Identity(mid, os.path.join(spec["base"], mid, "pki"), minion_opts(spec, mid))
        fi, states = host_answers(template, i, spec["domains"])
        ident.body("virt.full_info", fi)
        ident.body("virt.vm_state", states)
        ident.body("virt.host_info", fi["host"])  # full_info's host part is virt.host_info's answer
        ident.body("empty", {})  # saltutil.find_job: the job is no longer running here (answered at once)
        idents[mid] = ident
    jobs = queue.Queue()
    threading.Thread(target=listen, args=(spec, jobs), daemon=True).start()
    asyncio.run(serve(spec, idents, jobs))


if __name__ == "__main__":
    main()
