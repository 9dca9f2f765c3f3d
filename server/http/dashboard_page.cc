// The dashboard's one page (docs/operations.md "Dashboard"): markup, style and script together, served by
// tallyd itself (no CDN, nothing fetched from elsewhere). Hash routes: #/jobs, #/job/ID, #/workers,
// #/compare, #/follows, #/follow/ID (each metric of a follow drawn against the step, inline SVG). It asks /api/session first (never a 401, so a first load logs no error), then polls the
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
figure{margin:8px 0;background:#fff;display:inline-block;padding:4px}figcaption{font-weight:600}
</style></head><body>
<header><strong>Tally</strong><a href="#/jobs" id="nav-jobs">Jobs</a><a href="#/workers" id="nav-workers">Workers</a>
<a href="#/compare" id="nav-compare">Compare</a><a href="#/follow" id="nav-follows">Follows</a><span style="flex:1"></span>
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
// The page's [data-file] links download FILES + that name (with the token: a plain link would not send it).
function downloads(files) {
  document.querySelectorAll("[data-file]").forEach(a => a.onclick = async (ev) => {
    ev.preventDefault();
    const blob = await (await api(files + a.dataset.file, true)).blob();
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob); link.download = a.dataset.file; link.click();
  });
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
    downloads(`/api/jobs/${encodeURIComponent(id)}/files/`);
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
// Follows: each metric of a follow against the checkpoint's step, its 95 % interval as a band, each point
// coloured by the decision (the same figure as the follow's curve.html, drawn from /api/follows/ID; a field
// left out of the JSON is 0, "NaN" is no interval).
const fstate = (f) => (f.state || "FOLLOW_STATE_UNSPECIFIED").replace("FOLLOW_STATE_", "").toLowerCase();
const colour = {"best": "#1a7f37", "worse": "#cf222e", "failed": "#cf222e", "not better": "#0969da"};
async function follows() {
  const list = await api("/api/follows");
  $("#main").innerHTML = `<table id="follows-table"><thead><tr><th>Follow</th><th>State</th><th>Owner</th><th>Folder</th>
    <th>Checkpoints</th><th>Best step</th><th>Created</th></tr></thead><tbody>${(list.follows || []).map(f =>
    `<tr data-follow="${esc(f.follow_id)}"><td><a href="#/follow/${encodeURIComponent(f.follow_id)}">${esc(f.follow_id)}</a></td>
    <td>${fstate(f)}</td><td>${esc(f.owner)}</td><td>${esc((f.spec || {}).folder)}</td><td>${(f.checkpoints || []).length}</td>
    <td>${n(f.best_step) >= 0 ? n(f.best_step) : "—"}</td><td>${new Date(n(f.created_unix) * 1000).toLocaleString()}</td></tr>`).join("")
    || "<tr><td colspan=7 class=muted>no follows</td></tr>"}</tbody></table>`;
}
function curveSvg(points, name) {
  const pts = points.filter(p => finite(p.mean)).map(p => ({...p, lo: finite(p.lo) ? Number(p.lo) : null,
                                                              hi: finite(p.hi) ? Number(p.hi) : null, mean: Number(p.mean)}));
  if (!pts.length) return "";
  const ys = pts.flatMap(p => [p.mean, p.lo, p.hi].filter(v => v !== null));
  let x0 = pts[0].step, x1 = pts[pts.length - 1].step, y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1e-6;
  const w = 640, h = 220, pad = 36, X = (x) => pad + (w - 2 * pad) * (x - x0) / (x1 - x0);
  const Y = (y) => h - pad + (2 * pad - h) * (y - y0) / (y1 - y0), xy = (x, y) => X(x).toFixed(1) + "," + Y(y).toFixed(1);
  const banded = pts.filter(p => p.lo !== null && p.hi !== null);
  const band = banded.map(p => xy(p.step, p.hi)).concat(banded.slice().reverse().map(p => xy(p.step, p.lo))).join(" ");
  return `<figure class="curve" data-metric="${esc(name)}"><figcaption>${esc(name)} against the step (band: 95% interval)</figcaption>
    <svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}">
    <polygon class="band" points="${band}" fill="#0969da" fill-opacity="0.15"/>
    <polyline points="${pts.map(p => xy(p.step, p.mean)).join(" ")}" fill="none" stroke="#0969da" stroke-width="1.5"/>
    ${pts.map(p => `<circle data-step="${p.step}" data-mean="${p.mean}" data-lo="${p.lo === null ? "" : p.lo}"
      data-hi="${p.hi === null ? "" : p.hi}" cx="${X(p.step).toFixed(1)}" cy="${Y(p.mean).toFixed(1)}" r="3.5"
      fill="${colour[p.state] || "#8c959f"}"><title>step ${p.step}: ${p.mean.toFixed(4)} (${esc(p.state)})</title></circle>`).join("")}
    <text x="2" y="${(Y(y1) - 4).toFixed(0)}" font-size="11">${y1.toFixed(4)}</text>
    <text x="2" y="${(Y(y0) + 12).toFixed(0)}" font-size="11">${y0.toFixed(4)}</text>
    <text x="${pad}" y="${h - 6}" font-size="11">step ${x0}</text>
    <text x="${w - pad}" y="${h - 6}" font-size="11" text-anchor="end">step ${x1}</text></svg></figure>`;
}
async function follow(id) {
  const f = await api("/api/follows/" + encodeURIComponent(id));
  const cks = (f.checkpoints || []).slice().sort((a, b) => n(a.step) - n(b.step));
  const names = [...new Set(cks.flatMap(c => (c.metrics || []).map(m => m.name)))];
  const curves = names.map(name => curveSvg(cks.flatMap(c => (c.metrics || []).filter(m => m.name === name).map(m =>
    ({step: n(c.step), state: c.state, mean: m.mean ?? 0, lo: m.lo ?? 0, hi: m.hi ?? 0}))), name)).join("");
  const race = (c) => n(c.race_rows) ? `${n(c.race_rows)} rows, [${num(c.race_lo)}, ${num(c.race_hi)}]` : "";
  const scroll = window.scrollY;
  $("#main").innerHTML = `<h2>Follow <code>${esc(f.follow_id)}</code> ${fstate(f)}</h2>
    <p>${esc((f.spec || {}).folder)} &middot; best step ${n(f.best_step) >= 0 ? n(f.best_step) : "none yet"}
    ${f.best_job ? `(<a href="#/job/${encodeURIComponent(f.best_job)}">${esc(f.best_job)}</a>)` : ""}</p>
    ${f.error ? `<p class=err>${esc(f.error)}</p>` : ""}<div id="curves">${curves || "<p class=muted>no checkpoint evaluated yet</p>"}</div>
    <h3>Checkpoints</h3><table id="checkpoints-table"><tr><th>Step</th><th>Checkpoint</th><th>State</th><th>Job</th><th>Rows</th>
    <th>Race against the best (mean difference, 95%)</th>${names.map(m => `<th>${esc(m)}</th>`).join("")}<th>Reason</th></tr>
    ${cks.map(c => `<tr data-step="${n(c.step)}"><td>${n(c.step)}</td><td>${esc(c.name)}</td><td>${esc(c.state)}</td>
      <td>${c.job_id ? `<a href="#/job/${encodeURIComponent(c.job_id)}">${esc(c.job_id)}</a>` : ""}</td>
      <td>${n(c.rows_evaluated)}/${n(c.rows_total)}</td><td>${race(c)}</td>${names.map(name => {
        const m = (c.metrics || []).find(x => x.name === name);
        return `<td>${m ? est(m.mean, m.lo, m.hi, 4) : ""}</td>`; }).join("")}<td>${esc(c.reason || c.hook)}</td></tr>`).join("")}</table>
    <h3>Files</h3><p>${["curve.csv", "curve.json", "curve.html"].map(x => `<a href="#" data-file="${x}">${x}</a>`).join(" &middot; ")}</p>`;
  window.scrollTo(0, scroll);
  downloads(`/api/follows/${encodeURIComponent(id)}/files/`);
  if (fstate(f) !== "following") clearInterval(timer);  // A finished follow does not change.
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
  else if (h.startsWith("#/follow/")) fn = () => follow(decodeURIComponent(h.slice(9)));
  else if (h.startsWith("#/follow")) fn = follows;
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
