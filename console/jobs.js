// salt-virt's web console: long work (create, snapshot, backup, restore) as salt-api runner_async jobs, each
// followed with `virt.job` (the runner answers only the caller's own virt job, read from what the master
// itself writes: docs/topics/console.md, "Live updates"). The page is never held by a long call, and the
// jobs list shows each job's state: running (for how long), done, or its error. No progress lines: the
// master publishes those on its event bus only, which any minion can write to and which salt-api streams
// to any token (console.md). Uses console.js's runner(), post(), el() and $().
"use strict";

const JOB_POLL_MS = 2000;
const JOB_POLL_SLOW_MS = 5000; // after a minute: a backup or a TCG boot takes minutes
const jobs = { list: [], timer: null };

// the data of a runner answer, or throws with its error text (as console.js's runner() does)
function answerOf(data) {
  if (data && typeof data === "object" && "outputter" in data && "data" in data) data = data.data;
  if (data && typeof data === "object" && typeof data.error === "string") throw new Error(data.error);
  if (typeof data === "string") throw new Error(data);
  return data;
}

// one summary line of a runner function's answer (the full answer goes to the page that asked)
function summary(fun, data) {
  if (!data || typeof data !== "object") return "done";
  if (fun === "virt.init") return `created on ${data.host || "?"}`;
  if (fun === "virt.backup") {
    const failed = Object.entries(data.failed || {});
    if (failed.length) throw new Error(failed.map(([vm, why]) => `${vm}: ${why}`).join("; "));
    return `made ${Object.keys(data.made || {}).length}`;
  }
  return "done";
}

// start `fun` as a runner_async job of the logged-in user; resolves with its data once it ends (rejects with
// its error). `label` names it in the jobs list.
async function runAsync(fun, kwarg, label) {
  const body = await post(API, [{ client: "runner_async", fun, kwarg }], state.session.token).catch((e) => {
    if (e.status === 401) logout("your session ended: log in again");
    throw e;
  });
  const started = body && Array.isArray(body.return) ? body.return[0] : null;
  if (!started || !started.jid) throw new Error(typeof started === "string" ? started : "salt-api started no job");
  const job = { jid: started.jid, fun, label, since: Date.now(), state: "running", text: "" };
  jobs.list.unshift(job);
  jobs.list.length = Math.min(jobs.list.length, 10);
  renderJobs();
  liveSoon(); // live updates: the views refresh quickly while work runs (vm.js)
  return new Promise((resolve, reject) => {
    job.done = (err, data) => (err ? reject(err) : resolve(data));
    pollJobs();
  });
}

async function pollJobs() {
  if (jobs.polling) return; // one loop at a time: a job started meanwhile is seen at its next turn
  clearTimeout(jobs.timer);
  const running = jobs.list.filter((j) => j.state === "running");
  if (!running.length || !state.session) return;
  jobs.polling = true;
  try {
    await pollOnce(running);
  } finally {
    jobs.polling = false;
  }
  renderJobs();
  const old = running.every((j) => Date.now() - j.since > 60000);
  if (jobs.list.some((j) => j.state === "running")) jobs.timer = setTimeout(pollJobs, old ? JOB_POLL_SLOW_MS : JOB_POLL_MS);
}

async function pollOnce(running) {
  for (const job of running) {
    let ans;
    try {
      ans = await runner("virt.job", { jid: job.jid });
    } catch (e) {
      finish(job, "failed", e.message, e);
      continue;
    }
    if (ans.state !== "finished") continue;
    try {
      const data = answerOf(ans.return);
      finish(job, "done", summary(job.fun, data), null, data);
    } catch (e) {
      finish(job, "failed", e.message, e);
    }
  }
}

function finish(job, how, text, err, data) {
  job.state = how;
  job.text = text;
  job.ended = Date.now();
  if (job.done) job.done(err, data);
  liveSoon();
}

function elapsed(ms) {
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")}`;
}

// one line per job, kept and updated in place (its running time ticks every second)
function renderJobs() {
  const box = $("jobs");
  box.replaceChildren(
    ...jobs.list.map((j) => {
      const li = j.li || (j.li = el("li"));
      li.className = `job-${j.state}`;
      li.dataset.jid = j.jid;
      li.dataset.state = j.state;
      const took = elapsed((j.ended || Date.now()) - j.since);
      li.textContent = `${j.label}: ${j.state} ${took}${j.text && j.text !== "done" ? " — " + j.text : ""}`;
      return li;
    }),
  );
  box.hidden = !jobs.list.length;
}

function clearJobs() {
  clearTimeout(jobs.timer);
  jobs.list = [];
  renderJobs();
}

document.addEventListener("DOMContentLoaded", () => {
  setInterval(() => {
    if (jobs.list.some((j) => j.state === "running")) renderJobs(); // the running time ticks
  }, 1000);
});
