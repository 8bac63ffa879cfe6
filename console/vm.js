// salt-virt's web console: one VM's page (open it from its name in the VM list) — its facts, disks, NICs
// and addresses, snapshots (take, revert, delete), backups (back up now, restore), the actions of the list
// plus reboot, and what this tab saw happen to it; and the live updates of the list and the page.
//
// Every call is the runner call a tenant makes with salt-run (virt.vm_info, virt.snapshots, virt.snapshot,
// virt.revert_snapshot, virt.delete_snapshot, virt.backups, virt.backup, virt.restore, virt.start, ...), so
// ownership and quotas apply unchanged. Live updates poll the runner's signed answers while the tab is
// visible: every 3 s while work runs or after an action, every 15 s otherwise (docs/topics/console.md,
// "Live updates": never salt-api's event stream). Uses console.js's and jobs.js's functions.
"use strict";

const LIVE_FAST_MS = 3000;
const LIVE_SLOW_MS = 15000;
const LIVE_FAST_FOR_MS = 60000;
const page = { name: null, vm: null, log: [], seen: null, fastUntil: 0, last: 0, busy: false };

// live updates ---------------------------------------------------------------------------------------
function liveSoon() {
  page.fastUntil = Date.now() + LIVE_FAST_FOR_MS;
}

async function liveTick() {
  if (document.hidden || !state.session || page.busy || (state.view === "usage" && !page.name)) return; // quotas: console.js's own timer
  const fast = Date.now() < page.fastUntil || jobs.list.some((j) => j.state === "running");
  if (Date.now() - page.last < (fast ? LIVE_FAST_MS : LIVE_SLOW_MS) - 500) return;
  page.busy = true;
  page.last = Date.now();
  try {
    if (page.name) await loadVm();
    else await refresh();
  } finally {
    page.busy = false;
  }
}

// console.js's views re-render only when what they show changed: a refresh every few seconds must not replace
// the rows under the user's pointer (a click on a button being replaced is lost)
const drawn = {};

function onlyWhenChanged(name, render, key) {
  return function (...args) {
    const now = JSON.stringify([key(), ...args]);
    if (drawn[name] === now) return;
    drawn[name] = now;
    render(...args);
  };
}

function forgetDrawn() {
  for (const name of Object.keys(drawn)) delete drawn[name];
}

// the page -------------------------------------------------------------------------------------------
function openVm(name) {
  page.name = name;
  page.vm = null;
  page.seen = null;
  page.log = [];
  for (const v of document.querySelectorAll("main > .view")) v.hidden = true;
  $("vm-view").hidden = false;
  $("vm-title").textContent = name;
  for (const id of ["vm-facts", "vm-disks", "vm-nics", "vm-snapshots", "vm-backups", "vm-log"]) {
    const box = $(id);
    (box.tBodies ? box.tBodies[0] : box).replaceChildren();
  }
  $("vm-result").textContent = "";
  loadVm();
  loadSnapshots();
  loadBackups();
}

function closeVm() {
  page.name = null;
  $("vm-view").hidden = true;
}

function note(text, bad) {
  page.log.unshift({ at: new Date(), text, bad });
  page.log.length = Math.min(page.log.length, 50);
  $("vm-log").replaceChildren(
    ...page.log.map((e) => el("li", `${e.at.toLocaleTimeString()} ${e.text}`, e.bad ? "error" : undefined)),
  );
}

async function loadVm() {
  const name = page.name;
  let ans;
  try {
    ans = await runner("virt.vm_info", { name });
  } catch (e) {
    if (name === page.name) note(`virt.vm_info: ${e.message}`, true);
    return;
  }
  if (name !== page.name) return;
  const [host, a] = Object.entries(ans || {})[0] || [];
  const vm = a && a.vm_info && a.vm_info[name];
  if (!vm) return;
  if (page.seen && page.seen !== vm.state) note(`state: ${page.seen} → ${vm.state}`);
  if (!page.seen) note(`state: ${vm.state} on ${host}`);
  page.seen = vm.state;
  page.vm = { ...vm, host };
  renderVm(page.vm);
}

function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.append(c instanceof Node ? c : el("td", c ?? ""));
  return tr;
}

function mib(bytes) {
  return typeof bytes === "number" ? String(Math.round(bytes / 1048576)) : "";
}

function renderVm(vm) {
  const facts = [
    ["State", vm.state],
    ["Host", vm.host],
    ["Tenant", (vm.owner && vm.owner.tenant) || ""],
    ["vCPUs", vm.cpu],
    ["Memory (MiB)", vm.mem],
    ["Autostart", vm.autostart ? "yes" : "no"],
    ["Anti-affinity group", vm.group || ""],
    ["Addresses", ipsOf(vm).join(" ")],
  ];
  $("vm-facts").tBodies[0].replaceChildren(
    ...facts.map(([k, v]) => {
      const tr = row([el("th", k), v]);
      tr.dataset.key = k;
      return tr;
    }),
  );
  $("vm-facts").dataset.state = vm.state;
  $("vm-disks").tBodies[0].replaceChildren(
    ...Object.entries(vm.disks || {}).map(([target, d]) =>
      row([target, d.device, d.format, d.pool ? `${d.pool}/${d.volume}` : d.file, mib(d.virtual_size), mib(d.allocation)]),
    ),
  );
  $("vm-nics").tBodies[0].replaceChildren(
    ...Object.values(vm.nics || {}).map((n) =>
      row([n.mac, n.source_name, n.model, (n.ips || []).map((i) => i.address + (i.source ? ` (${i.source})` : "")).join(" ")]),
    ),
  );
}

async function loadSnapshots() {
  const name = page.name;
  try {
    const ans = await runner("virt.snapshots", { name });
    if (name !== page.name) return;
    $("vm-snapshots").tBodies[0].replaceChildren(
      ...(ans.snapshots || []).map((s) => {
        const tr = row([s.name, s.created ?? "", s.state, s.current ? "yes" : ""]);
        tr.dataset.snapshot = s.name;
        const td = el("td");
        td.append(
          button("Revert", "virt.revert_snapshot", () => snapAct("virt.revert_snapshot", s.name)),
          button("Delete", "virt.delete_snapshot", () => snapAct("virt.delete_snapshot", s.name)),
        );
        tr.append(td);
        return tr;
      }),
    );
  } catch (e) {
    if (name === page.name) unavailable("vm-snapshots", `virt.snapshots: ${e.message}`);
  }
}

async function loadBackups() {
  const name = page.name;
  try {
    const ans = await runner("virt.backups", { name });
    if (name !== page.name) return;
    $("vm-backups").tBodies[0].replaceChildren(
      ...(ans.backups || []).map((b) => {
        const tr = row([b.id, b.type, b.finished || "", mib(b.size)]);
        tr.dataset.backup = b.id;
        const td = el("td");
        td.append(button("Restore", "virt.restore", () => restore(b.id)));
        tr.append(td);
        return tr;
      }),
    );
  } catch (e) {
    if (name === page.name) unavailable("vm-backups", `virt.backups: ${e.message}`); // e.g. no backup directory
  }
}

// a list the runner could not give: its error as the table's one row
function unavailable(id, text) {
  const td = el("td", text, "error");
  td.colSpan = $(id).tHead.rows[0].cells.length;
  $(id).tBodies[0].replaceChildren(row([td]));
}

function button(label, fun, onclick) {
  const b = el("button", label);
  b.type = "button";
  b.dataset.action = fun;
  b.addEventListener("click", onclick);
  return b;
}

// actions: the runner calls a tenant makes ----------------------------------------------------------------
async function vmAct(fun) {
  const name = page.name;
  if (fun === "virt.purge" && !window.confirm(`Purge ${name}? Its disks and its minion key are deleted.`)) return;
  note(`${fun}…`);
  liveSoon();
  try {
    await runner(fun, { name });
    note(`${fun}: done`);
  } catch (e) {
    note(`${fun}: ${e.message}`, true);
    return;
  }
  if (fun === "virt.purge") {
    closeVm();
    show("vms");
    return;
  }
  await loadVm();
}

// long work: a runner_async job (jobs.js), its answer as text
async function longAct(fun, kwarg, done) {
  const name = page.name;
  note(`${fun} started`);
  try {
    const data = await runAsync(fun, kwarg, `${fun} ${name}`);
    if (name !== page.name) return;
    note(`${fun}: ${summary(fun, data)}`);
    $("vm-result").className = "";
    $("vm-result").textContent = `${fun} ${name}: ${JSON.stringify(data, null, 2)}`;
  } catch (e) {
    if (name !== page.name) return;
    note(`${fun}: ${e.message}`, true);
    $("vm-result").className = "error";
    $("vm-result").textContent = `${fun} ${name}: ${e.message}`;
  }
  if (name === page.name) await done();
}

function snapAct(fun, snapshot) {
  const question =
    fun === "virt.revert_snapshot"
      ? `Revert ${page.name} to snapshot ${snapshot}? What it wrote since is lost.`
      : `Delete snapshot ${snapshot} of ${page.name}?`;
  if (!window.confirm(question)) return;
  longAct(fun, { name: page.name, snapshot }, async () => {
    await loadSnapshots();
    await loadVm();
  });
}

function takeSnapshot(ev) {
  ev.preventDefault();
  const snapshot = $("snapshot-name").value.trim();
  const kwarg = { name: page.name };
  if (snapshot) kwarg.snapshot = snapshot;
  $("snapshot-name").value = "";
  longAct("virt.snapshot", kwarg, loadSnapshots);
}

function backupNow() {
  longAct("virt.backup", { name: page.name }, loadBackups);
}

function restore(id) {
  if (!window.confirm(`Restore ${page.name} from backup ${id}? The VM must be stopped; its disks are replaced.`)) return;
  longAct("virt.restore", { name: page.name, id }, loadVm);
}

// wiring -------------------------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  renderVms = onlyWhenChanged("vms", renderVms, () => [state.vms, state.sort, $("filter").value]);
  renderHosts = onlyWhenChanged("hosts", renderHosts, () => state.hosts);
  renderUsage = onlyWhenChanged("usage", renderUsage, () => null);
  // the VM list: a VM's name opens its page (event delegation: the rows are re-rendered by console.js)
  $("vms").tBodies[0].addEventListener("click", (ev) => {
    const td = ev.target.closest("td[data-key='name']");
    if (td) openVm(td.closest("tr").dataset.vm);
    if (ev.target.closest("button")) liveSoon();
  });
  for (const tab of document.querySelectorAll("nav .tab")) tab.addEventListener("click", closeVm);
  $("vm-back").addEventListener("click", () => {
    closeVm();
    show("vms");
  });
  for (const b of document.querySelectorAll("#vm-actions button[data-action]")) {
    b.addEventListener("click", () => vmAct(b.dataset.action));
  }
  $("snapshot-form").addEventListener("submit", takeSnapshot);
  $("backup-now").addEventListener("click", backupNow);
  $("login-form").addEventListener("submit", () => {
    closeVm();
    clearJobs();
    forgetDrawn(); // logout() emptied the tables: the next answer is drawn whatever it is
  });
  $("logout").addEventListener("click", () => {
    closeVm();
    clearJobs();
    forgetDrawn();
  });
  document.addEventListener("visibilitychange", () => {
    page.last = 0; // back in view: refresh at once
    liveTick();
  });
  setInterval(liveTick, 1000);
});
