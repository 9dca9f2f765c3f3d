// The dashboard's one page (docs/operations.md "Dashboard"): markup, style and script together, served by
// tallyd itself (no CDN, nothing fetched from elsewhere). Hash routes: #/jobs, #/job/ID, #/workers,
// #/compare. It asks /api/session first (never a 401, so a first load logs no error), then polls the
// JSON API every 2 s; the token typed once is kept for the browser session (sessionStorage) and sent
// as "Authorization: Bearer". While the token box shows nothing is polled (typing is never wiped), and
// a refused token is said so.
#include "server/http/dashboard.h"

namespace tally {

const char* const kDashboardPage = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tally</title><link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfd8e3;text-decoration:none}header a.on{color:#fff;font-weight:600}
main{padding:16px}table{border-collapse:collapse;width:100%;background:#fff}
th,td{padding:5px 8px;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}.bar{background:#e3e6ea;height:10px;width:140px;border-radius:5px}
.bar>div{background:#3b82f6;height:10px;border-radius:5px}.state-succeeded{color:#15803d}
.state-failed{color:#b91c1c}.state-running{color:#1d4ed8}.state-cancelled{color:#6b7280}
.muted{color:#6b7280}.err{color:#b91c1c;margin:8px 0}pre{background:#fff;padding:8px;overflow:auto}
iframe{width:100%;height:70vh;border:1px solid #e3e6ea;background:#fff}input,select,button{font:inherit}
.filters{display:flex;gap:8px;margin-bottom:10px;flex-wrap:wrap}
</style></head><body>
<header><strong>Tally</strong><a href="#/jobs" id="nav-jobs">Jobs</a><a href="#/workers" id="nav-workers">Workers</a>
<a href="#/compare" id="nav-compare">Compare</a><span style="flex:1"></span>
<span id="who" class="muted"></span></header>
<main id="main"></main>
<script>
"use strict";
const $ = (s) => document.querySelector(s);
const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
let timer = null, pageToken = "", tokens = [""];
function token() { return sessionStorage.getItem("tally_token") || ""; }
async function api(path, raw) {
  const headers = token() ? {"Authorization": "Bearer " + token()} : {};
  const r = await fetch(path, {headers, cache: "no-store"});
  if (r.status === 401) {  // Revoked while the page was open (tokens file re-read): ask again, saying why.
    sessionStorage.removeItem("tally_token");
    askToken("tallyd no longer accepts that token: paste a valid one");
    throw new Error("a token is needed");
  }
  if (!r.ok) { let m = r.statusText; try { m = (await r.json()).error; } catch (e) {} throw new Error(m); }
  return raw ? r : r.json();
}
function askToken(message) {
  clearInterval(timer);
  timer = null;
  if (!$("#tok")) {  // Drawn once: what is typed stays.
    $("#main").innerHTML = `<h2>Token</h2><p>This tallyd needs a token (the file <code>tally token --out</code>
      wrote holds one). It is kept for this browser session only.</p><p id="tok-msg" class="err"></p>
      <input id="tok" type="password" size="60"> <button id="tok-ok">Use it</button>`;
    const use = () => { sessionStorage.setItem("tally_token", $("#tok").value.trim()); route(); };
    $("#tok-ok").onclick = use;
    $("#tok").onkeydown = (ev) => { if (ev.key === "Enter") use(); };
  }
  $("#tok-msg").textContent = message || "";
}
const n = (v) => Number(v || 0);
function state(j) { return (j.state || "JOB_STATE_UNSPECIFIED").replace("JOB_STATE_", "").toLowerCase(); }
// An estimate with its interval, or alone where there is none (NaN arrives as the string "NaN").
function est(mean, lo, hi, digits) {
  const ok = lo !== undefined && lo !== "NaN" && hi !== "NaN" && !isNaN(Number(lo));
  return n(mean).toFixed(digits) + (ok ? ` [${n(lo).toFixed(digits)}, ${n(hi).toFixed(digits)}]` : "");
}
function live(j) {
  return (j.live || []).filter(e => e.foreground).map(e =>
    `${n(e.class_id)}: ${est(e.dice_mean, e.dice_ci_low, e.dice_ci_high, 3)}`).join("<br>");
}
function progress(j) {
  const done = n(j.images_evaluated) + n(j.images_failed), total = n(j.images_planned) || n(j.images_total);
  const pct = total ? Math.min(100, 100 * done / total) : 100;
  return `<div class="bar" title="${done}/${total}"><div style="width:${pct.toFixed(1)}%"></div></div>
    <span class="muted">${done}/${total}${n(j.images_failed) ? ", " + n(j.images_failed) + " failed" : ""}</span>`;
}
function eta(j) { const e = n(j.eta_seconds); return state(j) === "running" && e > 0 ? Math.round(e) + " s" : ""; }
async function jobs() {
  const f = {state: $("#f-state") ? $("#f-state").value : "", label: $("#f-label") ? $("#f-label").value : "",
             owner: $("#f-owner") ? $("#f-owner").value : ""};
  const q = new URLSearchParams({limit: "50"});
  for (const k of ["state", "label", "owner"]) if (f[k]) q.set(k, f[k]);
  if (pageToken) q.set("page_token", pageToken);
  const page = await api("/api/jobs?" + q);
  if (!$("#jobs-table")) {
    $("#main").innerHTML = `<div class="filters"><select id="f-state"><option value="">any state</option>
      ${["queued","running","succeeded","failed","cancelled"].map(s => `<option>${s}</option>`).join("")}</select>
      <input id="f-label" placeholder="label KEY=VALUE"><input id="f-owner" placeholder="owner">
      <button id="f-go">Filter</button><button id="f-first">First page</button><button id="f-next">Next page</button></div>
      <table id="jobs-table"><thead><tr><th>Job</th><th>State</th><th>Owner</th><th>Labels</th><th>Progress</th>
      <th>Rows/s</th><th>ETA</th><th>Dice (live, 95%)</th><th>Name</th></tr></thead><tbody></tbody></table>`;
    $("#f-go").onclick = () => { pageToken = ""; jobs(); };
    $("#f-first").onclick = () => { pageToken = ""; jobs(); };
    $("#f-next").onclick = () => { if (page.next_page_token) { pageToken = page.next_page_token; jobs(); } };
    Object.assign(f, {});
  }
  $("#f-next").onclick = () => { if (page.next_page_token) { pageToken = page.next_page_token; jobs(); } };
  $("#jobs-table tbody").innerHTML = (page.jobs || []).map(j => `<tr data-job="${esc(j.job_id)}">
    <td><a href="#/job/${encodeURIComponent(j.job_id)}">${esc(j.job_id)}</a></td>
    <td class="state-${state(j)}">${state(j)}${j.sampled ? "<br><span class=muted>" + esc(j.sampled) + "</span>" : ""}</td>
    <td>${esc(j.owner)}</td><td>${Object.entries((j.spec || {}).labels || {}).map(([k, v]) => esc(k + "=" + v)).join("<br>")}</td>
    <td>${progress(j)}</td><td>${n(j.images_per_second).toFixed(1)}</td><td>${eta(j)}</td><td>${live(j)}</td>
    <td>${esc((j.spec || {}).name)}</td></tr>`).join("") || `<tr><td colspan=9 class=muted>no jobs</td></tr>`;
}
async function job(id) {
  const j = await api("/api/jobs/" + encodeURIComponent(id));
  const done = state(j) === "succeeded" || state(j) === "failed" || state(j) === "cancelled";
  let h = `<h2>Job <code>${esc(j.job_id)}</code> <span class="state-${state(j)}">${state(j)}</span></h2>
    ${progress(j)} <span class="muted">${n(j.images_per_second).toFixed(1)} rows/s ${eta(j) ? "ETA " + eta(j) : ""}</span>
    ${j.error ? `<p class=err>${esc(j.error)}</p>` : ""}${j.sampled ? `<p>${esc(j.sampled)}</p>` : ""}`;
  if ((j.live || []).length) {
    h += `<h3>Live estimates</h3><p class=muted>${esc(j.live_note)}</p><table><tr><th>Class</th><th>Rows</th>
      <th>Dice</th><th>IoU</th></tr>${j.live.map(e => `<tr><td>${n(e.class_id)}</td><td>${n(e.rows)}</td>
      <td>${est(e.dice_mean, e.dice_ci_low, e.dice_ci_high, 4)}</td>
      <td>${est(e.iou_mean, e.iou_ci_low, e.iou_ci_high, 4)}</td></tr>`).join("")}</table>`;
  }
  if (j.until_ci_note) h += `<p>${esc(j.until_ci_note)}</p>`;
  if (done && j.report_ready) {
    const report = await api(`/api/jobs/${encodeURIComponent(id)}/files/report.json`);
    const reasons = report.failure_reasons || [];
    h += `<h3>Failures by reason</h3>` + (reasons.length ? `<table><tr><th>Reason</th><th>Rows</th><th>Example</th></tr>
      ${reasons.map(r => `<tr><td>${esc(r.reason)}</td><td>${n(r.count)}</td><td>${esc(r.example)}</td></tr>`).join("")}</table>`
      : `<p class=muted>none</p>`);
    h += `<h3>Files</h3><p>${["report.json","per_image.csv","summary.md","report.html"].map(f =>
      `<a href="#" data-file="${f}">${f}</a>`).join(" &middot; ")}</p><h3>Report</h3><iframe id="report" sandbox></iframe>`;
  }
  h += `<h3>Parameters</h3><pre>${esc(JSON.stringify(j.spec, null, 2))}</pre>`;
  const scroll = window.scrollY;
  $("#main").innerHTML = h;
  window.scrollTo(0, scroll);
  if (done && j.report_ready) {
    clearInterval(timer);  // A finished job does not change.
    const html = await (await api(`/api/jobs/${encodeURIComponent(id)}/files/report.html`, true)).text();
    $("#report").srcdoc = html;
    document.querySelectorAll("[data-file]").forEach(a => a.onclick = async (ev) => {
      ev.preventDefault();
      const blob = await (await api(`/api/jobs/${encodeURIComponent(id)}/files/${a.dataset.file}`, true)).blob();
      const link = document.createElement("a");
      link.href = URL.createObjectURL(blob); link.download = a.dataset.file; link.click();
    });
  }
}
// Compare figures: "—" where there is none (JSON null, or NaN written as a string).
const finite = (v) => v !== null && v !== undefined && v !== "" && isFinite(Number(v));
const num = (v) => finite(v) ? Number(v).toFixed(4) : "—";
const interval = (v) => Array.isArray(v) && v.length === 2 && v.every(finite) ? `[${num(v[0])}, ${num(v[1])}]` : "—";
function pvalue(p) {
  if (!finite(p)) return "—";
  const x = Number(p);
  return x === 0 ? "0" : x < 1e-4 ? x.toExponential(2) : x.toPrecision(3);
}
function gib(b) { return (n(b) / 1073741824).toFixed(1); }
const models = {};  // Job id -> its model (the model a worker has loaded is its current job's).
async function modelOf(id) {
  if (!id) return "";
  if (!(id in models)) { try { models[id] = ((await api("/api/jobs/" + encodeURIComponent(id))).spec || {}).model || "(predictions)"; } catch (e) { models[id] = ""; } }
  return models[id];
}
async function workers() {
  const w = await api("/api/workers");
  for (const x of w.workers || []) x.model = await modelOf((x.gauges || {}).job_id);
  $("#main").innerHTML = `<table id="workers-table"><thead><tr><th>Worker</th><th>Host</th><th>Device</th><th>State</th>
    <th>Model loaded</th><th>Jobs</th><th>Rows/s</th><th>GPU memory (GiB)</th><th>Last seen</th></tr></thead><tbody>${(w.workers || []).map(x => {
    const g = x.gauges || {}, gpus = g.gpus || [];
    const st = x.state && x.state !== "serving" ? esc(x.state) + ": " + esc(x.reason) : ((x.jobs || []).length ? "busy" : "idle");
    return `<tr data-worker="${esc(x.name)}"><td>${esc(x.name)}</td><td>${esc(x.hostname)}</td><td>${esc(x.device)}</td><td>${st}</td>
      <td>${esc(x.model.split("/").pop())}</td><td>${(x.jobs || []).map(esc).join("<br>")}</td>
      <td>${n(g.images_per_second).toFixed(1)}</td><td>${gpus.map(u => gib(u.memory_used_bytes) + " / " +
      gib(u.memory_total_bytes)).join("<br>")}</td><td class="seen">${Math.max(0, Date.now() / 1000 - n(x.last_seen_unix)).toFixed(1)} s ago</td></tr>`;
  }).join("") || "<tr><td colspan=9 class=muted>no workers</td></tr>"}</tbody></table>`;
}
async function compare() {
  if (!$("#cmp-a")) {
    const done = await api("/api/jobs?state=succeeded&limit=200");
    const options = (done.jobs || []).map(j => `<option value="${esc(j.job_id)}">${esc((j.spec || {}).name || "")}
      ${esc((j.spec || {}).manifest || "")}</option>`).join("");
    $("#main").innerHTML = `<p class=muted>Two finished jobs of one manifest, paired by row: B - A.</p>
      <div class="filters"><input id="cmp-a" list="finished" placeholder="job A" size="30">
      <input id="cmp-b" list="finished" placeholder="job B" size="30"><datalist id="finished">${options}</datalist>
      <button id="cmp-go">Compare</button></div><div id="cmp-out"></div>`;
    $("#cmp-go").onclick = async () => {
      try {
        const c = await api("/api/compare?" + new URLSearchParams({a: $("#cmp-a").value.trim(), b: $("#cmp-b").value.trim()}));
        const rows = [], changed = [];
        for (const cls of c.classes || []) {
          for (const [m, s] of Object.entries(cls)) if (m !== "class" && s && typeof s === "object" && !Array.isArray(s))
            rows.push(`<tr><td>${esc(cls.class)}</td><td>${esc(m)}</td><td>${n(s.pairs)}</td><td>${num(s.mean_a)}</td>
              <td>${num(s.mean_b)}</td><td>${num(s.mean_diff)}</td><td>${interval(s.diff_ci95)}</td><td>${pvalue(s.wilcoxon_p)}</td>
              <td>${n(s.b_higher)}</td><td>${n(s.b_lower)}</td><td>${n(s.defined_only_a)}</td><td>${n(s.defined_only_b)}</td>
              <td>${num(s.own_mean_a)} (${n(s.own_images_a)})</td><td>${num(s.own_mean_b)} (${n(s.own_images_b)})</td></tr>`);
          if ((cls.most_changed || []).length) changed.push(`<h3>Class ${esc(cls.class)}: images whose Dice changed most</h3>
            <table class="cmp-changed"><tr><th>Row</th><th>Id</th><th>Dice A</th><th>Dice B</th><th>B - A</th></tr>
            ${cls.most_changed.map(x => `<tr><td>${n(x.index)}</td><td>${esc(x.id)}</td><td>${num(x.dice_a)}</td>
            <td>${num(x.dice_b)}</td><td>${finite(x.dice_a) && finite(x.dice_b) ? (n(x.dice_b) - n(x.dice_a)).toFixed(4) : "—"}</td></tr>`).join("")}</table>`);
        }
        $("#cmp-out").innerHTML = `<p>A <code>${esc(c.a)}</code>, B <code>${esc(c.b)}</code>: ${n(c.paired_images)} paired rows
          (${n(c.only_a)} only in A, ${n(c.only_b)} only in B)</p>
          <table id="cmp-table"><tr><th>Class</th><th>Metric</th><th>Pairs</th><th>Mean A</th><th>Mean B</th>
          <th>B - A</th><th>95% interval</th><th>Wilcoxon p</th><th>B higher</th><th>B lower</th><th>Defined in A only</th>
          <th>Defined in B only</th><th>A (own mean)</th><th>B (own mean)</th></tr>${rows.join("")}</table>${changed.join("")}
          <p class=muted>Pairs: images with a value in both runs. An image whose metric is defined in one run only
          (Dice 0 against undefined) is left out of the pairs and counted; each run's own mean is its report's.</p>`;
      } catch (e) { $("#cmp-out").innerHTML = `<p class=err>${esc(e.message)}</p>`; }
    };
  }
}
async function route() {
  clearInterval(timer);
  timer = null;
  let s;
  try { s = await api("/api/session"); } catch (e) { $("#main").innerHTML = `<p class=err>${esc(e.message)}</p>`; return; }
  if (s.tokens_required && !s.authenticated) {
    if (s.error) sessionStorage.removeItem("tally_token");
    askToken(s.error);
    return;
  }
  $("#who").textContent = s.name ? "token: " + s.name : "";
  const h = location.hash || "#/jobs";
  document.querySelectorAll("header a").forEach(a => a.classList.toggle("on", h.startsWith(a.getAttribute("href"))));
  $("#main").innerHTML = "";
  let fn;
  if (h.startsWith("#/job/")) fn = () => job(decodeURIComponent(h.slice(6)));
  else if (h.startsWith("#/workers")) fn = workers;
  else if (h.startsWith("#/compare")) fn = compare;
  else { pageToken = ""; fn = jobs; }
  const run = async () => { if ($("#tok")) return; try { await fn(); } catch (e) {
    if (!$("#tok")) $("#main").insertAdjacentHTML("afterbegin", `<p class=err>${esc(e.message)}</p>`); } };
  await run();
  if (fn !== compare) timer = setInterval(run, 2000);
}
window.addEventListener("hashchange", route);
route();
</script></body></html>
)html";

}  // namespace tally
