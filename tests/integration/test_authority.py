"""Issue 34 item 1, end to end: a guest's root answers for the hypervisor, and the runner does not believe it.

A real salt-master behind salt-api (``file`` eauth), one real hypervisor (``fhv1``: a namespaced libvirtd,
VMs defined from a blank catalog image, no guest OS), two tenants, and ``tenant-vm-evil``: an accepted
minion that is no hypervisor, running tests/support/forger.py with its own config and key. The forger
reads every publication and answers first in ``fhv1``'s name, through a batch ``_minion_event``
(``salt/job/<jid>/ret/fhv1``) and through its own ``_return`` with ``resource_id: fhv1``.

    alice  tenant acme: quota 2 vCPUs, has a1 (2 vCPUs)
    bob    tenant beta: has b1 (started, then paused)
    carol  operator

The forger says b1 is acme's and nothing else exists, confirms any ready nonce, and records a planted VM.
Each test checks that the forgeries of that very call reached the master's bus both ways (salt-factories'
listener of the master's events), then libvirt itself, then the runner's answer: a pass means the product
ignored them."""

import collections
import concurrent.futures
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import libvirt
import pytest

from tests.support import lab, saltapi
from tests.support.paths import ROOT
from tests.support.saltd import hypervisor_minion_config, started_minions

HV = "fhv1"
EVIL = "tenant-vm-evil"
TINY = "forge-tiny.qcow2"
USERS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
WAIT = 180  # seconds: bounds of every wait below (a loaded 2-core machine), never a pause


def until(what, probe, bound=WAIT, every=0.2):
    """``probe()``'s first truthy value, looked for until ``bound`` seconds have passed."""
    deadline = time.monotonic() + bound
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            assert got, f"waited {bound} s for {what}"
            return got
        time.sleep(every)


@pytest.fixture(scope="module")
def hv(lab_dir, fabric):
    hyper = lab.Hypervisor(lab_dir, 23, fabric).start()  # 23: used by no other module
    yield hyper
    hyper.stop()


@pytest.fixture(scope="module")
def cloud(salt_factories, state_tree, hv, lab_dir, tmp_path_factory):
    """The master behind salt-api, its hypervisor and the tenants' VMs, made before any forgery."""
    image = pathlib.Path(state_tree) / "images" / TINY
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True)
    checksum = "sha256:" + hashlib.sha256(image.read_bytes()).hexdigest()
    users = {
        "alice": saltapi.User(USERS["alice"], [saltapi.RUNNER_VIRT]),
        "bob": saltapi.User(USERS["bob"], [saltapi.RUNNER_VIRT]),
        "carol": saltapi.User(USERS["carol"], ["@runner"]),
    }
    virt = {
        # job checks start after 10 s without an answer (the forger answers those too); generous bounds
        "hypervisors": {"tgt": [HV], "tgt_type": "list", "timeout": 10, "gather_job_timeout": 10}
        | {"down_after": 120, "max_wait": 300},
        "operators": ["carol"],
        "tenants": {
            "acme": {"members": ["alice"], "quota": {"vcpus": 2}, "images": ["tiny"]},
            "beta": {"members": ["bob"], "images": ["tiny"]},
        },
        "catalog": {"tiny": {"source": f"salt://images/{TINY}", "checksum": checksum, "min_size": 16}},
    }
    workdir = tmp_path_factory.mktemp("forge-api")
    try:
        with saltapi.started(salt_factories, "forge-master", state_tree, users, workdir, virt=virt) as api:
            config = hypervisor_minion_config(hv, pathlib.Path(lab_dir) / f"{HV}-images")
            with started_minions(api.master, {HV: config}):
                ret = api.master.salt_cli(timeout=180).run("test.ping", minion_tgt=HV)
                assert ret.returncode == 0, ret
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    made = [pool.submit(init, api, "bob", "b1", start=True), pool.submit(init, api, "alice", "a1", 2)]
                    assert all(f.result().get("host") == HV for f in made), [f.result() for f in made]
                pause(hv, "b1")
                yield {"api": api, "master": api.master, "hv": hv}
    finally:
        image.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def forger(cloud, tmp_path_factory):
    """tests/support/forger.py as ``tenant-vm-evil`` (own config, own key: auto_accept signs it in), once it
    forges answers to what the runner publishes."""
    evil = cloud["master"].salt_minion_daemon(EVIL, overrides={"log_level_logfile": "info"})  # config only
    work = tmp_path_factory.mktemp("forger")
    log, out = work / "forged.jsonl", work / "forger.out"
    cmd = [sys.executable, "-m", "tests.support.forger", "--config-dir", str(evil.config_dir), "--log", str(log)]
    cmd += ["--tenant", "acme", "--creator", "alice", "--victim", "b1"]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    forged = Log(log)
    try:
        until("the forger to sign in", lambda: proc.poll() is not None or forged.entries(ready=True))
        assert proc.poll() is None, out.read_text()
        assert (pathlib.Path(cloud["master"].config["pki_dir"]) / "minions" / EVIL).is_file()  # accepted
        # its subscription reaches the publisher a moment after sign-in: publish until it forges
        until("a first forgery", lambda: runner(cloud["api"], "carol", "virt.list") and forged.entries(), every=0)
        yield forged
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert not forged.entries(error=True), forged.entries(error=True)  # it never failed to forge


class Log:
    """The forger's JSON lines."""

    def __init__(self, path):
        self.path = path

    def entries(self, since=0, fun=None, ready=False, error=False):
        if not self.path.exists():
            return []
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        if ready or error:
            return [e for e in lines if ("ready" if ready else "error") in e]
        return [e for e in lines if "via" in e and e["t"] >= since and fun in (None, e["fun"])]


def runner(api, user, fun, **kwargs):
    status, body = api.client(user).runner(fun, timeout=900, **kwargs)
    assert status == 200, (fun, status, body)
    return body


def init(api, user, name, cpu=1, start=False):
    """A VM of the blank catalog image, defined (started with ``start``), never seeded."""
    return runner(api, user, "virt.init", name=name, cpu=cpu, mem=64, image="tiny", seed=False, start=start)


def pause(hv, name):
    """Paused, not shut off: it stays active for stop/purge to act on, and costs no CPU (a blank disk's
    VM would spin in its firmware's boot attempts under TCG)."""
    conn = libvirt.open(hv.uri)
    try:
        conn.lookupByName(name).suspend()
    finally:
        conn.close()


def domain(hv, name):
    """What libvirt says of VM ``name`` (None when it is not defined): state, domain id (a new one once
    restarted), vCPUs, disk files (inode, size)."""
    conn = libvirt.open(hv.uri)
    try:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            return None
        root = ET.fromstring(dom.XMLDesc(0))
        files = [s.get("file") for s in root.findall("devices/disk/source") if s.get("file")]
        disks = {}
        for path in files:
            st = os.stat(path) if os.path.exists(path) else None
            disks[path] = (st.st_ino, st.st_size) if st else None
        return {"state": dom.state()[0], "id": dom.ID(), "vcpus": int(root.findtext("vcpu")), "disks": disks}
    finally:
        conn.close()


def names(hv):
    conn = libvirt.open(hv.uri)
    try:
        return sorted(d.name() for d in conn.listAllDomains(0))
    finally:
        conn.close()


def answered(event_listener, cloud, forged, since, fun):
    """Wait until the forger's answers to ``fun`` since ``since`` are on the master's bus both ways (the batch
    event; the remapped ``_return``, which carries ``cmd``), and every publication it answered since then
    has fhv1's own answer there too (a third ``ret`` event): from then on libvirt shows all that the call
    made the hypervisor do, whichever answer the runner took. Returns the jids of the ``fun`` forgeries."""
    pattern = [(cloud["master"].id, f"salt/job/*/ret/{HV}")]

    def seen():
        entries = [e for e in forged.entries(since) if not e["failed"]]
        rets = collections.defaultdict(list)
        for ev in event_listener.get_events(pattern, after_time=since):
            rets[ev.tag.split("/")[2]].append(ev.data)
        for e in entries:
            got = rets[e["jid"]]
            way = [d for d in got if d.get("return") == e["return"] and ("cmd" in d) == (e["via"] == "return")]
            if not way or len(got) < 3:
                return None
        return {e["jid"] for e in entries if e["fun"] == fun}

    return until(f"forged {fun} answers and fhv1's own on the master's bus", seen)


@pytest.fixture(scope="module")
def b1_before(cloud, forger):
    """b1 as libvirt has it before any tenant tries anything: paused, 1 vCPU, its disks."""
    facts = domain(cloud["hv"], "b1")
    assert facts and facts["state"] == libvirt.VIR_DOMAIN_PAUSED and facts["vcpus"] == 1, facts
    assert facts["disks"] and all(facts["disks"].values()), facts
    return facts


# ---------------------------------------------------------------------------------------------------
def test_the_forger_answers_for_the_hypervisor_and_is_not_believed(cloud, forger, event_listener):
    """Its answers to the operator's ``virt.list`` (``virt.vm_state``: "nothing here") reach the master's
    bus in fhv1's name, both ways; the answer the operator gets is fhv1's."""
    since = time.time()
    seen = runner(cloud["api"], "carol", "virt.list")
    assert answered(event_listener, cloud, forger, since, "virt.vm_state")
    assert seen == {HV: {"status": "up", "vms": {"a1": "shutoff", "b1": "paused"}}}, seen
    # a virt.answer publication carries the runner's nonce: the forger used it, signed with its own key
    lies = [e["return"] for e in forger.entries(since, "virt.vm_state")]
    assert all(isinstance(a, dict) and a.get("id") == HV and a.get("nonce") for a in lies), lies


def test_a_tenant_cannot_stop_another_tenants_vm(cloud, forger, event_listener, b1_before):
    since = time.time()
    ret = runner(cloud["api"], "alice", "virt.stop", name="b1")
    assert answered(event_listener, cloud, forger, since, "virt.full_info")  # "b1 is acme's"
    assert domain(cloud["hv"], "b1") == b1_before  # still paused, the same process, the same disks
    assert ret.get("error") == "no VM named b1 in tenant acme", ret


def test_a_tenant_cannot_update_another_tenants_vm(cloud, forger, event_listener, b1_before):
    since = time.time()
    ret = runner(cloud["api"], "alice", "virt.update", name="b1", cpu=2)
    assert answered(event_listener, cloud, forger, since, "virt.full_info")
    assert domain(cloud["hv"], "b1") == b1_before  # 1 vCPU
    assert ret.get("error") == "no VM named b1 in tenant acme", ret


def test_a_tenant_cannot_purge_another_tenants_vm(cloud, forger, event_listener, b1_before):
    since = time.time()
    ret = runner(cloud["api"], "alice", "virt.purge", name="b1")
    assert answered(event_listener, cloud, forger, since, "virt.full_info")
    assert domain(cloud["hv"], "b1") == b1_before  # defined, paused, its disk files the same
    assert ret.get("error") == "no VM named b1 in tenant acme", ret


def test_the_quota_counts_every_vm_of_the_tenant(cloud, forger, event_listener):
    """The forged snapshot hides a1 (and shows b1 as acme's, 0 vCPUs): acme would have 2 vCPUs free."""
    since = time.time()
    ret = init(cloud["api"], "alice", "a3")
    assert answered(event_listener, cloud, forger, since, "virt.full_info")
    assert names(cloud["hv"]) == ["a1", "b1"]
    assert ret.get("error", "").startswith("tenant acme: 2 of 2 vCPUs used, asked 1"), ret


def test_a_forged_ready_confirmation_provisions_nothing(cloud, forger, event_listener):
    """``virt.provision_assigned`` for a ready event any minion could fire: fhv1 is asked whether it sent the
    nonce (``assign.confirm_ready``); the forger says yes, fhv1 says no."""
    since = time.time()
    ret = runner(cloud["api"], "carol", "virt.provision_assigned", host=HV, ready_nonce="0f" * 16)
    assert answered(event_listener, cloud, forger, since, "virt.ready_confirm")
    assert ret.get("error", "").startswith(f"{HV} did not confirm that it sent this ready event"), ret


def test_the_recovery_record_is_the_hypervisors_own(cloud, forger, event_listener):
    """``virt.record`` keeps what fhv1 runs, not the forger's record (a VM with /etc/shadow as its disk that
    ``virt.recover`` would define elsewhere)."""
    since = time.time()
    ret = runner(cloud["api"], "carol", "virt.record")
    assert answered(event_listener, cloud, forger, since, "virt.recovery_record")
    assert ret[HV]["status"] == "recorded" and ret[HV]["vms"] == ["a1", "b1"], ret
