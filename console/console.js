// salt-virt's web console: a static page served by salt-api (rest_cherrypy app/static), talking only to
// salt-api's /login, /logout and / (runner client). docs/topics/console.md.
//
// Security: the salt-api token lives in sessionStorage only (this tab; gone when it closes), is sent as
// the X-Auth-Token header and never as a cookie (every request says credentials: "omit", so the session
// cookie /login sets is never stored: another site's page cannot ride on it). The password is read from
// the form once and the field cleared. Data is rendered with textContent only, never as markup.
"use strict";

const KEY = "saltvirt.console";
const API = "/";
const REFRESH_MS = 30000;

const rowHooks = []; // more buttons per VM row: (actions cell, vm) => void (vnc.js adds "Console")
const state = { session: null, whoami: null, vms: [], hosts: [], sort: { key: "name", dir: 1 }, view: "vms" };

function $(id) {
  return document.getElementById(id);
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function loadSession() {
  try {
    const s = JSON.parse(sessionStorage.getItem(KEY) || "null");
    if (s && s.token && s.expire * 1000 > Date.now()) return s;
  } catch (e) {
    /* a damaged entry: log in again */
  }
  sessionStorage.removeItem(KEY);
  return null;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function post(path, body, token) {
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  if (token) headers["X-Auth-Token"] = token;
  const resp = await fetch(path, {
    method: "POST",
    credentials: "omit",
    cache: "no-store",
    headers,
    body: JSON.stringify(body),
  });
  if (!resp.ok) throw new ApiError(resp.status, resp.status === 401 ? "not logged in or wrong password" : `salt-api answered HTTP ${resp.status}`);
  return resp.json();
}

// one runner call as the logged-in user: its data (a runner's {outputter, data} unwrapped); a failure
// answer ({error, retcode}) raises with the runner's message
async function runner(fun, kwarg) {
  let body;
  try {
    body = await post(API, [{ client: "runner", fun, kwarg: kwarg || {} }], state.session.token);
  } catch (e) {
    if (e.status === 401) {
      logout("your session ended: log in again");
    }
    throw e;
  }
  let data = body && Array.isArray(body.return) ? body.return[0] : body;
  if (data && typeof data === "object" && "outputter" in data && "data" in data) data = data.data;
  if (data && typeof data === "object" && typeof data.error === "string") throw new Error(data.error);
  if (typeof data === "string") throw new Error(data); // Salt's own refusal text (e.g. an eauth denial)
  return data;
}

// login -------------------------------------------------------------------------------------------
async function login(ev) {
  ev.preventDefault();
  const pw = $("password");
  const creds = { username: $("username").value, password: pw.value, eauth: $("eauth").value };
  pw.value = "";
  $("login-error").textContent = "";
  try {
    const body = await post("/login", creds);
    const r = body.return[0];
    state.session = { token: r.token, expire: r.expire, user: r.user };
    sessionStorage.setItem(KEY, JSON.stringify(state.session));
    await enter();
  } catch (e) {
    $("login-error").textContent = e.status === 401 ? "Login refused: wrong user, password or authentication." : e.message;
  }
}

async function logout(message) {
  const s = state.session;
  state.session = null;
  sessionStorage.removeItem(KEY);
  if (s) post("/logout", {}, s.token).catch(() => {}); // revokes the token (best effort: it expires anyway)
  clearInterval(state.timer);
  $("app-view").hidden = true;
  $("logout").hidden = true;
  $("whoami").textContent = "";
  $("vms").tBodies[0].replaceChildren();
  $("hosts").tBodies[0].replaceChildren();
  $("usage").replaceChildren();
  $("login-view").hidden = false;
  $("login-error").textContent = typeof message === "string" ? message : "";
}

async function enter() {
  $("login-view").hidden = true;
  $("app-view").hidden = false;
  $("logout").hidden = false;
  const who = await runner("virt.whoami");
  state.whoami = who;
  $("whoami").textContent = `${who.user} — ${who.operator ? "operator" : "tenant " + who.tenant}`;
  show(state.view);
  clearInterval(state.timer);
  state.timer = setInterval(() => {
    if (!document.hidden) refresh();
  }, REFRESH_MS);
}

// data ---------------------------------------------------------------------------------------------
function ipsOf(vm) {
  const out = [];
  for (const nic of Object.values(vm.nics || {})) {
    for (const ip of nic.ips || []) out.push(ip.address);
  }
  return out;
}

async function refresh() {
  setStatus("loading…");
  try {
    const fleet = await runner("virt.query");
    const vms = [];
    const hosts = [];
    for (const [host, ans] of Object.entries(fleet || {})) {
      const a = ans || {};
      hosts.push({ name: host, status: a.status || "up", info: a.host || {}, error: a.error, maintenance: a.maintenance });
      for (const [name, vm] of Object.entries(a.vm_info || {})) {
        vms.push({
          name,
          host,
          tenant: (vm.owner && vm.owner.tenant) || "",
          state: vm.state || "",
          cpu: vm.cpu,
          mem: vm.mem,
          ips: ipsOf(vm).join(" "),
          uptime: vm.uptime ?? null,
        });
      }
    }
    state.vms = vms;
    state.hosts = hosts;
    renderVms();
    renderHosts();
    if (state.view === "usage") await refreshUsage();
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    setStatus(e.message, true);
  }
}

async function refreshUsage() {
  const usage = await runner("virt.usage");
  renderUsage(usage || {});
}

function setStatus(text, bad) {
  const s = $("status");
  s.textContent = text;
  s.className = bad ? "error" : "";
}

// views --------------------------------------------------------------------------------------------
function show(view) {
  state.view = view;
  for (const name of ["vms", "fleet", "usage"]) $(`${name}-view`).hidden = name !== view;
  for (const tab of document.querySelectorAll("nav .tab")) tab.classList.toggle("active", tab.dataset.view === view);
  refresh();
}

// seconds as the list shows them: 42s, 5m, 3h 07m, 2d 4h ("" when unknown: not running, or a remote libvirtd)
function duration(seconds) {
  if (typeof seconds !== "number") return "";
  const d = Math.floor(seconds / 86400);
  const h = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  return m ? `${m}m` : `${seconds}s`;
}

function compare(a, b) {
  const { key, dir } = state.sort;
  const x = a[key];
  const y = b[key];
  if (typeof x === "number" && typeof y === "number") return (x - y) * dir;
  return String(x ?? "").localeCompare(String(y ?? ""), undefined, { numeric: true }) * dir;
}

function renderVms() {
  const needle = $("filter").value.trim().toLowerCase();
  const rows = state.vms
    .filter((vm) => !needle || [vm.name, vm.tenant, vm.host, vm.state, vm.ips].some((v) => String(v).toLowerCase().includes(needle)))
    .sort(compare);
  const body = $("vms").tBodies[0];
  body.replaceChildren(
    ...rows.map((vm) => {
      const tr = el("tr");
      tr.dataset.vm = vm.name;
      for (const key of ["name", "tenant", "host", "state", "cpu", "mem", "ips", "uptime"]) {
        const text = key === "uptime" ? duration(vm.uptime) : vm[key];
        const td = el("td", text, key === "state" ? `state-${vm.state}` : undefined);
        td.dataset.key = key;
        tr.append(td);
      }
      const actions = el("td");
      for (const [fun, label] of [
        ["virt.start", "Start"],
        ["virt.stop", "Stop"],
        ["virt.reboot", "Reboot"],
        ["virt.force_off", "Force off"],
        ["virt.purge", "Purge"],
      ]) {
        const b = el("button", label);
        b.type = "button";
        b.dataset.action = fun;
        b.addEventListener("click", () => act(fun, vm));
        actions.append(b);
      }
      for (const hook of rowHooks) hook(actions, vm);
      tr.append(actions);
      return tr;
    }),
  );
  for (const th of $("vms").tHead.querySelectorAll("th[data-key]")) {
    th.classList.toggle("sorted-asc", th.dataset.key === state.sort.key && state.sort.dir > 0);
    th.classList.toggle("sorted-desc", th.dataset.key === state.sort.key && state.sort.dir < 0);
  }
}

function bar(used, total) {
  const b = el("span", null, "bar");
  const fill = el("span");
  const pct = total ? Math.min(100, Math.round((100 * used) / total)) : 0;
  fill.style.width = `${pct}%`; // CSSOM, not a style attribute: allowed by the page's CSP
  if (total && used >= total) b.classList.add("full");
  b.append(fill);
  return b;
}

function cell(used, total) {
  const td = el("td");
  if (used === undefined || used === null) return td;
  td.append(bar(used, total), document.createTextNode(total ? `${used} of ${total}` : String(used)));
  return td;
}

function renderHosts() {
  $("hosts").tBodies[0].replaceChildren(
    ...state.hosts
      .sort((a, b) => a.name.localeCompare(b.name))
      .map((h) => {
        const tr = el("tr");
        tr.dataset.host = h.name;
        const i = h.info;
        tr.append(
          el("td", h.name),
          el("td", h.error ? `${h.status}: ${h.error}` : h.status),
          el("td", h.maintenance ? `in maintenance (${h.maintenance})` : ""),
          cell(i.vcpus_used_by_vms, i.vcpus_total),
          cell(i.mem_used_by_vms, i.mem_total),
          el("td", i.vms_defined === undefined ? "" : `${i.vms_active} running of ${i.vms_defined}`),
          el("td", i.disk_free ?? ""),
        );
        return tr;
      }),
  );
}

function renderUsage(usage) {
  const box = $("usage");
  box.replaceChildren();
  for (const [tenant, u] of Object.entries(usage)) {
    if (tenant.startsWith("_")) {
      box.append(el("p", u, "note"));
      continue;
    }
    const div = el("div", null, "tenant");
    div.dataset.tenant = tenant;
    div.append(el("h3", tenant));
    const table = el("table");
    for (const [res, label] of [
      ["vcpus", "vCPUs"],
      ["mem", "Memory (MiB)"],
      ["disk", "Disk (MiB)"],
      ["vms", "VMs"],
    ]) {
      const q = u[res];
      if (!q) continue;
      const tr = el("tr");
      tr.append(el("th", label), cell(q.used, q.quota));
      if (!q.quota) tr.append(el("td", "no quota"));
      table.append(tr);
    }
    div.append(table);
    box.append(div);
  }
}

// actions: the runner calls a tenant makes with salt-run, so quotas and ownership apply unchanged ---------
async function act(fun, vm) {
  if (fun === "virt.purge" && !window.confirm(`Purge ${vm.name}? Its disks and its minion key are deleted.`)) return;
  setStatus(`${fun} ${vm.name}…`);
  try {
    await runner(fun, { name: vm.name });
    setStatus(`${fun} ${vm.name}: done`);
  } catch (e) {
    setStatus(`${fun} ${vm.name}: ${e.message}`, true);
    return;
  }
  await refresh();
}

// wiring --------------------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", () => logout());
  $("refresh").addEventListener("click", () => refresh());
  $("filter").addEventListener("input", renderVms);
  for (const tab of document.querySelectorAll("nav .tab")) tab.addEventListener("click", () => show(tab.dataset.view));
  for (const th of document.querySelectorAll("#vms th[data-key]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.key;
      state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : 1 };
      renderVms();
    });
  }
  state.session = loadSession();
  if (state.session) enter().catch((e) => setStatus(e.message, true));
});
