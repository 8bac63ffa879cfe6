"""One measurement in a fresh process, in whichever venv runs it (ours or saltext-virt's).

Reads a JSON spec on stdin, prints one JSON line. Loader set-up (grains, module loading) is outside
the timed part; peak memory is VmHWM of this process before and after the timed calls.

modes:
  call      __salt__[func](*args, **kwargs) ``reps`` times through the Salt loader (module_dirs)
  init      VM creation ``reps`` times: impl salt-virt / saltext-virt (virt.init via the loader) or
            raw (libvirt-python floor: qemu-img + defineXML + create); each VM is removed untimed.
            With ``serve``: set up, print ``{"ready": true}``, then one VM creation per ``{"name": ...}``
            line read from stdin, one JSON answer line each, until EOF (the caller interleaves processes)
  clone     saltvirt.storage.images.clone(src, dest, overlay=...) ``reps`` times (our venv only)
  rawquery  the raw libvirt-python floor of virt.full_info (bulk APIs) ``reps`` times
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def vm_hwm_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def vm_rss_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def _serve_event_bus(opts, ready):
    import asyncio

    import salt.transport
    import tornado.ioloop

    asyncio.set_event_loop(asyncio.new_event_loop())
    io_loop = tornado.ioloop.IOLoop.current()
    pub = salt.transport.ipc_publish_server("minion", opts)
    io_loop.add_callback(lambda: asyncio.ensure_future(pub.publisher(pub.publish_payload, io_loop=io_loop)))
    io_loop.add_callback(ready.set)
    io_loop.start()


def start_event_bus(opts, where=True):
    """The minion's local event bus (what a running salt-minion has): without it every ``event.send``
    spins ~1 s trying to connect before giving up. ``where``: ``"process"`` serves it from a child
    process, as a salt-minion does (its bus lives in the daemon, a job runs in a process of its own);
    otherwise from a thread of this process (the bus's own work then shares this process's GIL)."""
    import multiprocessing
    import threading

    if where == "process":
        ctx = multiprocessing.get_context("fork")  # before any thread of this process is started
        ready = ctx.Event()
        ctx.Process(target=_serve_event_bus, args=(opts, ready), daemon=True, name="event-bus").start()
    else:
        ready = threading.Event()
        threading.Thread(target=_serve_event_bus, args=(opts, ready), daemon=True, name="event-bus").start()
    if not ready.wait(30):
        raise SystemExit("the minion event bus did not start")
    deadline = time.monotonic() + 10
    while not any(n.endswith("_pull.ipc") for n in os.listdir(opts["sock_dir"])) and time.monotonic() < deadline:
        time.sleep(0.01)


def minion_mods(spec, workdir):
    """``__salt__`` as a minion would have it, with ``module_dirs`` and ``virt:`` config (no daemon)."""
    import salt.config
    import salt.loader

    opts = salt.config.minion_config(None)
    opts.update(
        {
            "id": "bench-minion",
            "master": "salt-master.bench",
            "file_client": "local",
            # a minion's cachedir outlives its jobs: the caller may give one shared by its processes
            "cachedir": spec.get("cachedir") or os.path.join(workdir, "cache"),
            "pki_dir": os.path.join(workdir, "pki"),
            "sock_dir": os.path.join(workdir, "sock"),
            "module_dirs": spec["module_dirs"],
            "virt": spec.get("virt", {}),
        }
    )
    os.makedirs(opts["sock_dir"], exist_ok=True)
    if spec.get("event_bus"):
        start_event_bus(opts, spec["event_bus"])
    opts["grains"] = salt.loader.grains(opts)
    utils = salt.loader.utils(opts)
    mods = salt.loader.minion_mods(opts, utils=utils)
    func = spec.get("func")
    if func and func not in mods:
        raise SystemExit(f"{func} did not load from {spec['module_dirs']}: {mods.missing_fun_string(func)}")
    return mods


def summarize(value):
    """Enough of a result to check both implementations saw the same thing (not the whole answer)."""
    if isinstance(value, dict) and "vm_info" in value:
        vms = value["vm_info"]
        return {"vms": len(vms), "with_graphics": sum(1 for v in vms.values() if v.get("graphics"))}
    if isinstance(value, dict):
        return {"keys": len(value)}
    if isinstance(value, (list, tuple)):
        return {"items": len(value)}
    return {"value": repr(value)[:200]}


def raw_full_info(uri, keepalive=False):
    """The floor of a fleet query of one host: plain libvirt-python with its bulk APIs (one listAllDomains,
    one getAllDomainStats-style call, two filtered listAllDomains for autostart/persistent), one XMLDesc
    per domain parsed with ElementTree for what any tool must report (vCPUs, memory, disks, NICs,
    graphics), and the host's getInfo. ``keepalive``: with libvirt's keepalive as salt-virt opens its
    connections (the default event loop in a thread, 5 s x 5: a hung libvirtd fails the call)."""
    import threading
    import xml.etree.ElementTree as ET

    import libvirt

    if keepalive:
        libvirt.virEventRegisterDefaultImpl()

        def loop():
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=loop, daemon=True).start()
    conn = libvirt.open(uri)
    if keepalive:
        conn.setKeepAlive(5, 5)
    try:
        want = libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_BLOCK
        doms = conn.listAllDomains(0)
        stats = conn.domainListGetStats(doms, want) if doms else []
        auto = {d.UUIDString() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_AUTOSTART)}
        pers = {d.UUIDString() for d in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_PERSISTENT)}
        node = conn.getInfo()
        vms = {}
        for dom, st in stats:
            root = ET.fromstring(dom.XMLDesc(0))
            uuid = dom.UUIDString()
            vms[dom.name()] = {
                "state": st.get("state.state"),
                "cputime": st.get("cpu.time"),
                "cpu": int(root.findtext("vcpu") or 0),
                "mem": int(root.findtext("memory") or 0) // 1024,
                "disks": {
                    (d.find("target").get("dev") if d.find("target") is not None else None): {
                        "file": d.find("source").get("file") if d.find("source") is not None else None,
                        "capacity": st.get(f"block.{i}.capacity"),
                    }
                    for i, d in enumerate(root.iter("disk"))
                },
                "nics": [
                    {"mac": n.find("mac").get("address") if n.find("mac") is not None else None, "type": n.get("type")}
                    for n in root.iter("interface")
                ],
                "graphics": [g.attrib for g in root.iter("graphics")],
                "autostart": uuid in auto,
                "persistent": uuid in pers,
            }
        return {"host": {"cpus": node[2], "mem": node[1]}, "vm_info": vms}
    finally:
        conn.close()


def mode_rawquery(spec, workdir):
    """The raw libvirt floor of ``virt.full_info``, ``reps`` times, timed as mode_call times a call."""
    hwm0, rss0 = vm_hwm_kib(), vm_rss_kib()
    times, cpu, result = [], [], None
    for _ in range(spec.get("reps", 1)):
        c0, t0 = time.process_time(), time.perf_counter()
        result = raw_full_info(spec["uri"], spec.get("keepalive", False))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {
        "times": times,
        "cpu": cpu,
        "hwm_before_kib": hwm0,
        "rss_before_kib": rss0,
        "hwm_after_kib": vm_hwm_kib(),
        "result": summarize(result),
    }


def mode_call(spec, workdir):
    mods = minion_mods(spec, workdir)
    func = mods[spec["func"]]
    for _ in range(spec.get("warmup", 0)):
        func(*spec.get("args", []), **spec.get("kwargs", {}))
    hwm0, rss0 = vm_hwm_kib(), vm_rss_kib()
    times, cpu, result = [], [], None
    for _ in range(spec.get("reps", 1)):
        c0, t0 = time.process_time(), time.perf_counter()
        result = func(*spec.get("args", []), **spec.get("kwargs", {}))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # this process only: the test driver runs in it, libvirtd does not
    return {
        "times": times,
        "cpu": cpu,
        "hwm_before_kib": hwm0,
        "rss_before_kib": rss0,
        "hwm_after_kib": vm_hwm_kib(),
        "result": summarize(result),
    }


RAW_XML = """<domain type="qemu"><name>{name}</name><memory unit="MiB">{mem}</memory>\
<currentMemory unit="MiB">{mem}</currentMemory><vcpu>{cpu}</vcpu><os><type arch="x86_64">hvm</type>\
<kernel>{kernel}</kernel><initrd>{initrd}</initrd><cmdline>{cmdline}</cmdline></os><features><acpi /><apic />\
</features><on_poweroff>destroy</on_poweroff><on_reboot>restart</on_reboot><on_crash>destroy</on_crash>\
<devices><disk type="file" device="disk"><driver name="qemu" type="{fmt}" cache="none" /><source file="{disk}" />\
<target dev="vda" bus="virtio" /></disk><interface type="bridge"><source bridge="br0" /><model type="virtio" />\
</interface><serial type="pty"><log file="/var/log/libvirt/qemu/{name}-serial.log" append="on" />\
<target port="0" /></serial><console type="pty"><target type="serial" port="0" /></console></devices></domain>"""


def raw_init(spec, name):
    """The floor: what any tool must do at least (clone the disk, define, start), with plain libvirt-python."""
    import libvirt

    guest, images_dir = spec["guest"], spec["images_dir"]
    vm_dir = os.path.join(images_dir, name)
    os.makedirs(vm_dir)
    if spec["overlay"]:
        disk, fmt = os.path.join(vm_dir, "system.qcow2"), "qcow2"
        subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", guest["qcow2"], "-F", "qcow2", disk], check=True
        )
    else:
        disk, fmt = os.path.join(vm_dir, f"system.{spec['image_format']}"), spec["image_format"]
        shutil.copyfile(guest[spec["image_format"]], disk)
    conn = libvirt.open(spec["uri"])
    try:
        dom = conn.defineXML(
            RAW_XML.format(
                name=name,
                mem=256,
                cpu=1,
                disk=disk,
                fmt=fmt,
                kernel=guest["kernel"],
                initrd=guest["initrd"],
                cmdline=guest["cmdline"],
            )
        )
        if spec.get("start", True):
            dom.create()
    finally:
        conn.close()


def init_call(spec, mods, name):
    guest = spec["guest"]
    boot = {"kernel": guest["kernel"], "initrd": guest["initrd"], "cmdline": guest["cmdline"]}
    image = guest["qcow2"] if spec["overlay"] else guest[spec["image_format"]]
    if spec["impl"] == "salt-virt":
        kwargs = {
            "image": image,
            "enable_qcow": spec["overlay"],
            "boot": boot,
            "seed": spec.get("seed", False),
            "start": spec.get("start", True),
        }
        if spec.get("vtype"):
            kwargs["vtype"] = spec["vtype"]
        return mods["virt.init"](name, 1, 256, **kwargs)
    # saltext-virt: the same shape said its way (disk from an image, overlay_image for a qcow2 overlay)
    disk = {
        "name": "system",
        "image": image,
        "format": "qcow2" if spec["overlay"] else spec["image_format"],
        "overlay_image": spec["overlay"],
    }
    return mods["virt.init"](
        name,
        1,
        256,
        hypervisor="qemu",
        disks=[disk],
        boot=boot,
        seed=False,
        start=spec.get("start", True),
        interfaces=[{"name": "eth0", "type": "bridge", "source": "br0", "model": "virtio"}],
    )


def remove_vm(uri, name, images_dir):
    """Untimed clean-up after one init, whatever created it (libvirt + files under images_dir)."""
    import libvirt

    conn = libvirt.open(uri)
    try:
        with contextlib.suppress(libvirt.libvirtError):
            dom = conn.lookupByName(name)
            if dom.isActive():
                dom.destroy()
            dom.undefine()
    finally:
        conn.close()
    for entry in os.listdir(images_dir):
        if entry == name or entry.startswith(f"{name}_") or entry.startswith(f"{name}."):
            path = os.path.join(images_dir, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def mode_init(spec, workdir):
    mods = None
    if spec["impl"] != "raw":
        mods = minion_mods(dict(spec, func="virt.init"), workdir)
    hwm0 = vm_hwm_kib()
    if spec.get("serve"):
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            print(json.dumps(one_init(spec, mods, json.loads(line)["name"]), default=str), flush=True)
        return {"served": True, "hwm_before_kib": hwm0, "hwm_after_kib": vm_hwm_kib()}
    times, errors, results = [], [], []
    for i in range(spec.get("reps", 1)):
        one = one_init(spec, mods, f"{spec['prefix']}{i}")
        if "error" in one:
            errors.append(one["error"])
        else:
            times.append(one["time"])
            results.append(one["result"])
    return {
        "times": times,
        "errors": errors,
        "results": results[:2],
        "hwm_before_kib": hwm0,
        "hwm_after_kib": vm_hwm_kib(),
    }


def one_init(spec, mods, name):
    """One timed VM creation, the VM removed after it (untimed): ``{time, result}`` or ``{error}``."""
    t0 = time.perf_counter()
    try:
        if spec["impl"] == "raw":
            raw_init(spec, name)
            ret = True
        else:
            ret = init_call(spec, mods, name)
        elapsed = time.perf_counter() - t0
        if isinstance(ret, dict):
            ret = {k: ret.get(k) for k in ("started", "seed", "type")}
        return {"time": elapsed, "result": ret}
    except Exception as exc:  # noqa: BLE001 - the competitor's failures are data here
        return {"error": f"{type(exc).__name__}: {exc}"[:1500]}
    finally:
        remove_vm(spec["uri"], name, spec["images_dir"])


def qemu_img_info(path):
    out = subprocess.run(
        ["qemu-img", "info", "-U", "--backing-chain", "--output=json", path], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout)


def mode_clone(spec, workdir):
    sys.path.insert(0, spec["utils_path"])
    from saltvirt.storage import images

    times, fsyncs, chain = [], [], None
    for i in range(spec.get("reps", 1)):
        dest = os.path.join(spec["dest_dir"], f"clone{i}.{spec['fmt']}")
        t0 = time.perf_counter()
        images.clone(spec["src"], dest, overlay=spec["overlay"], fmt=spec["fmt"])
        times.append(time.perf_counter() - t0)
        if spec.get("fsync"):
            t0 = time.perf_counter()
            fd = os.open(dest, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsyncs.append(time.perf_counter() - t0)
        if chain is None:
            info = qemu_img_info(dest)
            chain = {
                "depth": len(info) - 1,
                "format": info[0]["format"],
                "backing": info[0].get("backing-filename"),
                "actual_size": info[0].get("actual-size"),
            }
        os.unlink(dest)
    return {"times": times, "fsync_times": fsyncs, "chain": chain}


def main():
    spec = json.loads(sys.stdin.readline())  # one line (serve mode: the calls follow it)
    workdir = tempfile.mkdtemp(prefix="svbench-w")
    try:
        modes = {"init": mode_init, "call": mode_call, "clone": mode_clone, "rawquery": mode_rawquery}
        out = modes[spec["mode"]](spec, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["ok"] = True
    out["python"] = sys.executable
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
