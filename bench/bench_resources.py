"""VMs as Salt Resources (issue #37) at fleet size: a real salt-master + 10 hypervisor minions, each with 100
test-driver domains (1,000 ``virt_vm`` resources), the type declared for all 10 in the master's pillar as
docs/topics/resources.md says (``resources: {virt_vm: {}}``), the resource type loaded from the minions'
extension_modules as ``saltutil.sync_all`` puts it (tests/support/saltd.py ``presync``).

Each domain is running and carries salt-virt metadata: group ``g0``..``g9`` (index mod 10: a group is 10 % of the
fleet) and, every other one, a tenant, so ``T@virt_vm and G@group:g3`` selects a known 100.

One cycle per repetition, side by side on the same daemons (the pillar switched, nothing restarted):

  none declared  ``salt '*' test.ping`` (the baseline: 10 minions)
  declare        pillar on + ``salt -L <hypers> saltutil.refresh_pillar``: until the master holds all 1,000
  declared       ``salt -C 'T@virt_vm and G@group:g3' test.ping`` (100), ``salt -C 'T@virt_vm' test.ping``
                 (1,000), ``salt '*' test.ping`` (1,010), ``salt -C 'T@virt_vm:<uuid>' test.ping`` (1)
  re-register    ``salt -L <hypers> saltutil.refresh_resources``: until all 1,000 are registered again
  undeclare      pillar off + ``saltutil.refresh_pillar``: until the master holds none

"Registered" is read from the master's ``resource_grains`` cache bank (one file per resource, written by
``AESFuncs._register_resources`` after the mmap registry): every ``virt_vm:*`` entry present and written since
the command. Master CPU: utime + stime of every process in the master's session (request server, MWorkers,
publisher, maintenance...) from /proc/<pid>/stat before the command and when it is done; the minions' the
same. Control commands name the hypervisors with ``-L`` (a wildcard would run them on every resource too).

    $VENV/bin/python bench/bench_resources.py [--quick] [--reps 5] [--spy DIR]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_fleet
import common
import nodexml

sys.path.insert(0, str(common.ROOT / "_utils"))
from saltvirt.xml.domain.metadata import METADATA_NS

FULL = {"minions": 10, "domains": 100, "reps": 5, "warmup": 1}
QUICK = {"minions": 1, "domains": 10, "reps": 1, "warmup": 0}
GROUPS = 10  # VM i is in group g<i mod 10>
GROUP = "g3"
TYPE = "virt_vm"
BANK = "resource_grains"
CLK = os.sysconf("SC_CLK_TCK")
PY_SPY = os.environ.get("PY_SPY", "/var/tmp/spy/bin/py-spy")


def vm_uuid(host, index):
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"salt-virt-resbench-{host}-{index}"))


def write_node(directory, host, count):
    """A test-driver node file of ``count`` running domains of host ``host`` with group (all) and tenant
    (every other) metadata, as ``salt-run virt.init`` writes them; returns its ``test:///`` URI."""
    disks = os.path.join(directory, "disks")
    template = nodexml._disk_template(disks)
    node = ET.fromstring(
        "<node><cpu><mhz>2400</mhz><active>64</active><max>64</max><nodes>1</nodes><sockets>1</sockets>"
        "<cores>64</cores><threads>1</threads></cpu><memory>536870912</memory></node>"
    )
    ET.register_namespace("sv", METADATA_NS)
    for i in range(count):
        path = os.path.join(disks, f"{host}vm{i:05d}.qcow2")
        if not os.path.exists(path):
            os.link(template, path)
        dom = nodexml.domain(i, path, running=True, prefix=f"{host}vm")
        dom.find("uuid").text = vm_uuid(host, i)
        meta = ET.SubElement(ET.SubElement(dom, "metadata"), f"{{{METADATA_NS}}}vm")
        if i % 2 == 0:
            ET.SubElement(meta, f"{{{METADATA_NS}}}owner", tenant=f"t{i % 4 // 2}", creator="bench")
        ET.SubElement(meta, f"{{{METADATA_NS}}}group").text = f"g{i % GROUPS}"
        node.append(dom)
    path = os.path.join(directory, f"node-{host}.xml")
    ET.ElementTree(node).write(path, encoding="unicode")
    return f"test://{path}"


class ResStack(bench_fleet.Stack):
    """bench_fleet's master + minions, with a pillar root (the declaration, in ``master_extra``) and the resource
    type in each minion's extension_modules (a minion puts its root_dir before a configured extension_modules,
    so the default place, ``<root_dir>/var/cache/salt/minion/extmods``, is a link to one staged copy)."""

    def __init__(self, *args, extmods, **kwargs):
        super().__init__(*args, **kwargs)
        self.extmods = extmods

    def configure(self):
        super().configure()
        for d in self.minion_confs:
            cache = os.path.join(d, "var", "cache", "salt", "minion")
            os.makedirs(cache, exist_ok=True)
            os.symlink(self.extmods, os.path.join(cache, "extmods"))


def proc_cpu(pid):
    """(utime + stime + cutime + cstime) seconds of ``pid``, and its command line; (0, '') once gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return 0.0, ""
    return sum(int(f) for f in fields[11:15]) / CLK, cmd


def kind(cmd):
    """A process's kind from its title (Salt sets ``... MWorker-2`` & co. with setproctitle)."""
    last = cmd.split()[-1] if cmd else "?"
    return re.sub(r"[-_]?\d+$", "", os.path.basename(last)) or "?"


def snapshot(leaders):
    """{pid: (cpu_s, kind)} of every process in the sessions of ``leaders``."""
    out = {}
    for leader in leaders:
        for pid in bench_fleet.session_pids(leader):
            cpu, cmd = proc_cpu(pid)
            out[pid] = (cpu, kind(cmd))
    return out


def cpu_delta(before, after):
    """(total seconds, {kind: seconds}) spent between two snapshots (a process that ended is lost: the
    master's are long-lived)."""
    by_kind = {}
    for pid, (cpu, k) in after.items():
        d = cpu - before.get(pid, (0.0, k))[0]
        by_kind[k] = by_kind.get(k, 0.0) + d
    return sum(by_kind.values()), by_kind


def bank_state(bank_dir, since_ns):
    """(entries, entries written since ``since_ns``) of the ``virt_vm:`` resource grains bank."""
    total = fresh = 0
    try:
        with os.scandir(bank_dir) as it:
            for entry in it:
                if entry.name.startswith(TYPE + ":") and entry.name.endswith(".p"):
                    total += 1
                    try:
                        if entry.stat().st_mtime_ns >= since_ns:
                            fresh += 1
                    except OSError:
                        pass
    except FileNotFoundError:
        pass
    return total, fresh


class Bench:
    def __init__(self, stack, workdir, expected, spy_dir=None):
        self.stack, self.expected, self.spy_dir = stack, expected, spy_dir
        self.pillar = os.path.join(workdir, "pillar")
        self.hypers = ",".join(stack.minion_ids)

    @property
    def bank(self):  # the master's cachedir under its root_dir (known once the stack is configured)
        return os.path.join(self.stack.conf, "var", "cache", "salt", "master", BANK)

    def master_leaders(self):
        return [self.stack.procs[0].pid]

    def minion_leaders(self):
        return [p.pid for p in self.stack.minion_procs]

    def declare(self, on):
        body = f"resources:\n  {TYPE}: {{}}\n" if on else "resources: {}\n"
        with open(os.path.join(self.pillar, "resources.sls"), "w") as fh:
            fh.write(body)

    def _cli(self, *args, timeout=600):
        """Run a salt CLI command: (wall, CLI CPU seconds, rc, stdout, stderr)."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [os.path.join(self.stack.bin, args[0]), "-c", self.stack.conf, *args[1:]], stdout=out, stderr=err
            )
            deadline = time.monotonic() + timeout
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                time.sleep(0.005)
            wall = time.perf_counter() - t0
            out.seek(0)
            err.seek(0)
            return wall, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status), out.read(), err.read()

    def _spy(self, label):
        """py-spy on the master's session while one command runs (``--spy``): collapsed stacks."""
        if not self.spy_dir:
            return None
        os.makedirs(self.spy_dir, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")
        return subprocess.Popen(
            [
                PY_SPY,
                "record",
                "--subprocesses",
                "--nonblocking",
                "-r",
                "50",
                "-f",
                "raw",
                "-o",
                os.path.join(self.spy_dir, f"{name}.txt"),
                "-p",
                str(self.master_leaders()[0]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def target(self, label, tgt, expect, compound=True, spy=False):
        """One ``salt`` test.ping: wall, CLI CPU, master and minions' CPU, answers counted."""
        args = ["salt"] + (["-C"] if compound else []) + [tgt, "test.ping", "--out=json", "--static", "-t", "300"]
        spy_proc = self._spy(label) if spy else None
        if spy_proc:
            time.sleep(1.0)  # py-spy attaches to every process of the session first
        m0, n0 = snapshot(self.master_leaders()), snapshot(self.minion_leaders())
        wall, cli_cpu, rc, out, err = self._cli(*args)
        m1, n1 = snapshot(self.master_leaders()), snapshot(self.minion_leaders())
        if spy_proc:
            spy_proc.terminate()
            spy_proc.wait(timeout=30)
        data = bench_fleet.last_json(out) or {}
        master, by_kind = cpu_delta(m0, m1)
        return {
            "label": label,
            "wall": wall,
            "cli_cpu": cli_cpu,
            "master_cpu": master,
            "master_by_kind": by_kind,
            "minions_cpu": cpu_delta(n0, n1)[0],
            "rc": rc,
            "answers": len(data),
            "true": sum(1 for v in data.values() if v is True),
            "expect": expect,
            "tail": (err or out)[-400:],
        }

    def registration(self, label, control, want_total, fresh, timeout=300):
        """Run ``salt -L <hypers> <control>`` and wait until the bank holds ``want_total`` virt_vm entries
        (all written since the command when ``fresh``): wall from the command's start, master CPU, minions'."""
        t0_ns = time.time_ns()
        m0, n0 = snapshot(self.master_leaders()), snapshot(self.minion_leaders())
        t0 = time.perf_counter()
        cli_wall, cli_cpu, rc, out, err = self._cli("salt", "-L", self.hypers, control, "--out=json", "--static")
        deadline = time.monotonic() + timeout
        while True:
            total, new = bank_state(self.bank, t0_ns)
            if total == want_total and (not fresh or new == want_total):
                break
            if time.monotonic() > deadline:
                return {
                    "label": label,
                    "error": f"after {timeout} s the bank holds {total} entries ({new} written since), want "
                    f"{want_total} (rc {rc}): {err[-300:]}",
                    "bank": total,
                    "fresh": new,
                }
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        m1, n1 = snapshot(self.master_leaders()), snapshot(self.minion_leaders())
        master, by_kind = cpu_delta(m0, m1)
        return {
            "label": label,
            "wall": wall,
            "cli_wall": cli_wall,
            "cli_cpu": cli_cpu,
            "master_cpu": master,
            "master_by_kind": by_kind,
            "minions_cpu": cpu_delta(n0, n1)[0],
            "rc": rc,
            "tail": (err or out)[-400:],
        }

    def idle(self, seconds=5.0):
        """The master's own CPU over ``seconds`` with nothing asked (its background loops)."""
        m0 = snapshot(self.master_leaders())
        time.sleep(seconds)
        return cpu_delta(m0, snapshot(self.master_leaders()))[0] / seconds


def cycle(b, one, spy=False):
    """One repetition: baseline, declare, the targets, re-register, undeclare."""
    n, m = b.expected, len(b.stack.minion_ids)
    rows = [b.target("salt '*' test.ping, nothing declared (baseline)", "*", m, compound=False, spy=spy)]
    b.declare(True)
    rows.append(b.registration("declare: refresh_pillar until all registered", "saltutil.refresh_pillar", n, True))
    rows += [
        b.target(
            f"salt -C 'T@{TYPE} and G@group:{GROUP}' test.ping", f"T@{TYPE} and G@group:{GROUP}", n // 10, spy=spy
        ),
        b.target(f"salt -C 'T@{TYPE}' test.ping", f"T@{TYPE}", n, spy=spy),
        b.target("salt '*' test.ping, resources registered", "*", n + m, compound=False, spy=spy),
        b.target(f"salt -C 'T@{TYPE}:<uuid>' test.ping (one VM)", f"T@{TYPE}:{one}", 1, spy=spy),
    ]
    rows.append(
        b.registration("re-register: refresh_resources until all written again", "saltutil.refresh_resources", n, True)
    )
    b.declare(False)
    rows.append(b.registration("undeclare: refresh_pillar until none registered", "saltutil.refresh_pillar", 0, False))
    return rows


ORDER = [
    "salt '*' test.ping, nothing declared (baseline)",
    f"salt -C 'T@{TYPE}:<uuid>' test.ping (one VM)",
    f"salt -C 'T@{TYPE} and G@group:{GROUP}' test.ping",
    f"salt -C 'T@{TYPE}' test.ping",
    "salt '*' test.ping, resources registered",
    "declare: refresh_pillar until all registered",
    "re-register: refresh_resources until all written again",
    "undeclare: refresh_pillar until none registered",
]


def render(rows, cfg):
    by = {}
    for r in rows:
        by.setdefault(r["label"], []).append(r)
    stat = lambda rs, key: common.fmt_stat(common.summary([r.get(key) for r in rs]))  # noqa: E731
    table_rows = []
    for label in ORDER:
        rs = [r for r in by.get(label, []) if "error" not in r]
        if not rs:
            continue
        answers = (
            f"{rs[0]['expect']} expected: {min(r['true'] for r in rs)}–{max(r['true'] for r in rs)} True"
            if "expect" in rs[0]
            else "—"
        )
        table_rows.append(
            [label, answers, stat(rs, "wall"), stat(rs, "master_cpu"), stat(rs, "cli_cpu"), stat(rs, "minions_cpu")]
        )
    kinds_rows = []
    for label in ORDER:
        rs = [r for r in by.get(label, []) if "error" not in r]
        if not rs:
            continue
        kinds = sorted({k for r in rs for k in r["master_by_kind"]})
        med = {k: common.summary([r["master_by_kind"].get(k, 0.0) for r in rs])["median"] for k in kinds}
        parts = [f"{k} {common.fmt_s(v)}" for k, v in sorted(med.items(), key=lambda kv: -kv[1]) if v >= 0.005]
        kinds_rows.append([label, ", ".join(parts) or "—"])
    n_total = cfg["minions"] * cfg["domains"]
    return [
        f"{cfg['minions']} hypervisor minions x {cfg['domains']} test-driver domains ({n_total} `{TYPE}` resources), "
        "median (min–max, n); master CPU = utime + stime of every master process; registration rows: wall from "
        "the command's start until the master's resource_grains bank holds the expected entries\n\n"
        + common.table(
            ["command", "answers", "wall", "master CPU", "salt CLI CPU", "10 minions' CPU"],
            table_rows,
        ),
        "Master CPU by process (median per command; Salt's process titles)\n\n"
        + common.table(["command", "master CPU by process"], kinds_rows),
    ]


def partial(rows):
    """The counted rows so far, to ``$BENCH_JSON_DIR/resources.partial.json``."""
    out_dir = os.environ.get("BENCH_JSON_DIR")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "resources.partial.json"), "w") as fh:
            json.dump(rows, fh, indent=1, default=str)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 minion x 10 domains, one cycle (the smoke test's size)")
    ap.add_argument("--minions", type=int)
    ap.add_argument("--domains", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--warmup", type=int, help="cycles run first and not counted")
    ap.add_argument("--spy", metavar="DIR", help="after the counted cycles, one more under py-spy (raw stacks to DIR)")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("minions", "domains", "reps", "warmup"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    facts = common.machine_facts()
    load0 = common.loadavg()
    workdir = tempfile.mkdtemp(prefix="svr", dir="/tmp")  # short: unix socket paths < 107 bytes
    os.chmod(workdir, 0o755)
    errors, rows, idle = [], [], None
    try:
        hosts = [f"hyper{i:02d}" for i in range(cfg["minions"])]
        nodes = [write_node(os.path.join(workdir, "nodes"), h, cfg["domains"]) for h in hosts]
        pillar = os.path.join(workdir, "pillar")
        os.makedirs(pillar)
        with open(os.path.join(pillar, "top.sls"), "w") as fh:
            fh.write("base:\n  'hyper*':\n    - resources\n")
        # the resource type and the library where saltutil.sync_all puts them (one copy, shared read-only)
        extmods = os.path.join(workdir, "extmods")
        shutil.copytree(common.ROOT / "_resources", os.path.join(extmods, "resources"))
        shutil.copytree(common.ROOT / "_utils", os.path.join(extmods, "utils"))
        import compileall

        compileall.compile_dir(extmods, quiet=2)
        master_extra = {"pillar_roots": {"base": [pillar]}}
        if args.quick:
            master_extra.update(bench_fleet.QUICK_MASTER)
        stack = ResStack(
            "salt-virt",
            str(common.OUR_VENV),
            os.path.join(workdir, "st"),
            nodes,
            [str(common.ROOT / "_runners")],
            [str(common.ROOT / "_modules")],
            master_extra,
            extmods=extmods,
        )
        b = Bench(stack, workdir, cfg["minions"] * cfg["domains"], spy_dir=args.spy)
        b.declare(False)
        log(f"resources: starting salt-master + {cfg['minions']} minions")
        t0 = time.perf_counter()
        try:
            stack.start()
            log(f"resources: all minions answer after {time.perf_counter() - t0:.1f}s")
            time.sleep(2)
            idle = b.idle(3.0 if args.quick else 10.0)
            one = vm_uuid(hosts[-1], 7)
            for rep in range(cfg["warmup"] + cfg["reps"]):
                counted = rep >= cfg["warmup"]
                log(f"resources: cycle {rep + 1}/{cfg['warmup'] + cfg['reps']}{'' if counted else ' (warm-up)'}")
                got = cycle(b, one)
                for r in got:
                    if "error" in r or (
                        r.get("expect") is not None and (r["answers"], r["true"]) != (r["expect"],) * 2
                    ):
                        errors.append(f"{r['label']}: {r.get('error') or r}")
                    log(f"  {r['label']}: {r.get('wall', 0):.2f}s master {r.get('master_cpu', 0):.2f} CPU-s")
                if counted:
                    rows += got
                    partial(rows)  # a run cut short keeps what it measured
            if args.spy:
                log("resources: one more cycle under py-spy")
                try:
                    cycle(b, one, spy=True)
                except Exception as exc:  # noqa: BLE001 - a diagnostic: never loses the counted figures
                    errors.append(f"py-spy cycle: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported with what was measured
            errors.append(f"salt-virt: {exc}")
        finally:
            stack.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "title": f"Resources (issue #37): {cfg['minions'] * cfg['domains']} VMs over {cfg['minions']} hypervisors",
        "tables": render(rows, cfg) if rows else [],
        "rows": rows,
        "idle_master_cpu_per_s": idle,
        "cfg": cfg,
        "notes": [
            f"date: {facts['date']}; machine: {facts['cpus']} CPUs ({facts['cpu_model']}), {facts['mem_gib']} GiB",
            f"load average before/after: {load0} / {common.loadavg()}",
            f"idle master CPU: {idle if idle is None else f'{idle * 1000:.1f} ms per second'}",
            f"reps {cfg['reps']} (after {cfg['warmup']} warm-up cycle(s))",
        ]
        + [f"ERROR {e}" for e in errors],
    }
    common.emit("resources", result)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
