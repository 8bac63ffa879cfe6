// The VM's screen in the browser (docs/topics/console.md, "The VM's console"): noVNC's RFB client (vendored,
// console/vendor/novnc) on QEMU's VNC websocket, opened with a one-time ticket.
//
// Security: the VNC password never crosses salt-api or the master's event bus in clear. This tab makes an
// RSA-OAEP key pair (WebCrypto; the private key cannot be exported) and sends only the public key to
// salt-run virt.console; the VM's hypervisor sets a fresh password on the console (valid for seconds, spent at
// its first use) and answers it encrypted to that key. It is decrypted here, handed to noVNC and forgotten.
// A tenant gets tickets for its own VMs only: the runner decides, as for every other action.
import RFB from "./vendor/novnc/core/rfb.js";

const vnc = { rfb: null };

function b64(buf) {
  return btoa(String.fromCharCode(...new Uint8Array(buf)));
}

function unb64(text) {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

function vncStatus(text, phase) {
  const s = $("vnc-status");
  s.textContent = text;
  s.dataset.state = phase; // connecting, connected, disconnected, refused: what the tests wait for
  s.className = phase === "refused" ? "error" : "";
}

// one ticket: {vm, host, port, tls, valid_until, password (decrypted)}; the key pair lives in this call only
async function ticket(name) {
  const keys = await crypto.subtle.generateKey(
    { name: "RSA-OAEP", modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: "SHA-256" },
    false,
    ["encrypt", "decrypt"],
  );
  const pubkey = b64(await crypto.subtle.exportKey("spki", keys.publicKey));
  const answer = await runner("virt.console", { name, pubkey });
  const t = answer.result;
  if (!t || typeof t !== "object" || !t.password) throw new Error(typeof t === "string" ? t : "no ticket in the answer");
  const plain = await crypto.subtle.decrypt({ name: "RSA-OAEP" }, keys.privateKey, unb64(t.password));
  return { ...t, password: new TextDecoder().decode(plain) };
}

function closeConsole() {
  if (vnc.rfb) vnc.rfb.disconnect();
  vnc.rfb = null;
  $("vnc-screen").replaceChildren();
  $("vnc-view").hidden = true;
  $("vms-view").hidden = state.view !== "vms";
}

async function openConsole(vm) {
  closeConsole();
  $("vnc-title").textContent = `Console of ${vm.name}`;
  $("vnc-view").hidden = false;
  $("vms-view").hidden = true;
  vncStatus("asking for a ticket…", "connecting");
  let t;
  try {
    t = await ticket(vm.name);
  } catch (e) {
    vncStatus(`no console: ${e.message}`, "refused");
    return;
  }
  const host = t.host.includes(":") ? `[${t.host}]` : t.host;
  const url = `${t.tls ? "wss" : "ws"}://${host}:${t.port}/`;
  vncStatus(`connecting to ${vm.name}${t.tls ? "" : " (plain websocket: not encrypted)"}…`, "connecting");
  const rfb = new RFB($("vnc-screen"), url, { credentials: { password: t.password } });
  t.password = null;
  rfb.scaleViewport = true;
  rfb.addEventListener("connect", () => vncStatus(`connected to ${vm.name}`, "connected"));
  rfb.addEventListener("securityfailure", (e) => vncStatus(`refused: ${e.detail.reason || "authentication failed"}`, "refused"));
  rfb.addEventListener("credentialsrequired", () => {
    vncStatus("refused: the ticket was not accepted", "refused");
    rfb.disconnect();
  });
  rfb.addEventListener("disconnect", (e) => {
    if ($("vnc-status").dataset.state !== "refused") vncStatus(e.detail.clean ? "disconnected" : "connection lost", "disconnected");
  });
  vnc.rfb = rfb;
}

// the hook console.js offers: one more button per VM row
rowHooks.push((actions, vm) => {
  const b = el("button", "Console");
  b.type = "button";
  b.dataset.action = "virt.console";
  b.addEventListener("click", () => openConsole(vm));
  actions.append(b);
});

document.addEventListener("DOMContentLoaded", () => {
  $("vnc-close").addEventListener("click", closeConsole);
  $("logout").addEventListener("click", closeConsole);
  for (const tab of document.querySelectorAll("nav .tab")) tab.addEventListener("click", closeConsole);
});
