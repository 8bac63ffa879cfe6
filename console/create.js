// salt-virt's web console: "New VM" — a form with the arguments a tenant may pass to `salt-run virt.init`
// (name, a catalog image, cpu, mem, and from its tenant's lists: a NIC/disk profile, a network, a data disk
// in one of its pools, a hypervisor; start, seed, VNC, guest agent, an anti-affinity group, what to wait
// for), sent as that runner call (runner_async, followed in the jobs list: jobs.js). Its answer or error is
// shown as text. The lists come from `virt.catalog`, which gives a tenant member its tenant's only; the
// runner checks every argument again (quotas, ownership, catalog), so the form decides nothing.
// Uses console.js's and jobs.js's functions.
"use strict";

const create = { catalog: null };

async function loadCatalog() {
  const cat = await runner("virt.catalog");
  create.catalog = cat;
  const image = $("new-image");
  image.replaceChildren(
    ...Object.entries(cat.images || {}).map(([name, e]) => {
      const o = el("option", `${name} (${e.format}${e.min_size ? `, ${e.min_size} MiB` : ""})`);
      o.value = name;
      return o;
    }),
  );
  options("new-profile", cat.profiles, "the image's");
  options("new-network", cat.networks, "none");
  options("new-pool", cat.pools, "none");
  $("new-disk-row").hidden = !(cat.pools || []).length;
  $("new-network-row").hidden = !(cat.networks || []).length;
  hostOptions();
}

function options(id, values, none) {
  const first = el("option", none);
  first.value = "";
  $(id).replaceChildren(
    first,
    ...(values || []).map((v) => {
      const o = el("option", v);
      o.value = v;
      return o;
    }),
  );
}

// the hypervisors the fleet view shows that the tenant's globs allow (the runner checks again)
function hostOptions() {
  const globs = (create.catalog && create.catalog.hypervisors) || ["*"];
  const re = globs.map((g) => new RegExp("^" + g.replace(/[.+^${}()|\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") + "$"));
  const keep = $("new-host").value;
  options(
    "new-host",
    state.hosts.map((h) => h.name).filter((n) => re.some((r) => r.test(n))),
    "best placement",
  );
  $("new-host").value = keep;
}

// the runner call's keyword arguments, exactly as `salt-run virt.init NAME CPU MEM image=... key=value` takes them
function initArgs() {
  const kwarg = {
    name: $("new-name").value.trim(),
    cpu: Number($("new-cpu").value),
    mem: Number($("new-mem").value),
    image: $("new-image").value,
    start: $("new-start").checked,
    seed: $("new-seed").checked,
  };
  if ($("new-vnc").checked) kwarg.enable_vnc = true;
  if (!$("new-agent").checked) kwarg.guest_agent = false;
  const profile = $("new-profile").value;
  if (profile) Object.assign(kwarg, { nic: profile, disk: profile });
  const network = $("new-network").value;
  if (network) kwarg.interfaces = [{ name: "eth0", network }];
  const size = Number($("new-disk-size").value);
  if (size > 0 && $("new-pool").value) kwarg.disks = [{ name: "data", size, pool: $("new-pool").value }];
  if ($("new-host").value) kwarg.host = $("new-host").value;
  const group = $("new-group").value.trim();
  if (group) kwarg.group = group;
  if ($("new-wait").value) kwarg.wait = $("new-wait").value;
  return kwarg;
}

async function submitCreate(ev) {
  ev.preventDefault();
  const out = $("new-result");
  const kwarg = initArgs();
  out.className = "";
  out.textContent = `virt.init ${kwarg.name}: running…`;
  $("new-submit").disabled = true;
  try {
    const data = await runAsync("virt.init", kwarg, `virt.init ${kwarg.name}`);
    out.textContent = `virt.init ${kwarg.name}: ${JSON.stringify(data, null, 2)}`;
    refresh();
  } catch (e) {
    out.className = "error";
    out.textContent = `virt.init ${kwarg.name}: ${e.message}`;
  } finally {
    $("new-submit").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("create-form").addEventListener("submit", submitCreate);
  $("create").addEventListener("toggle", () => {
    if (!$("create").open) return;
    hostOptions();
    if (!create.catalog) loadCatalog().catch((e) => setStatus(`virt.catalog: ${e.message}`, true));
  });
  $("login-form").addEventListener("submit", () => {
    create.catalog = null; // another user may log in: its own catalog
    $("create").open = false;
    $("new-result").textContent = "";
  });
});
