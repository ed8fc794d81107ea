// ctxkit view: renders the JSON blob of the page (vanilla JS, no network). A step's tokens and a
// compaction's views are rendered only when opened, so long episodes load fast.
"use strict";
const T0 = performance.now();
const D = JSON.parse(document.getElementById("ctxkit-data").textContent);
const SEG = D.segments, STR = D.strings, MSG = D.messages, CODES = D.codes;
const HOWS = ["verbatim", "masked", "truncated", "summary", "retrieved", "pinned", "scaffold", "generation_prompt"];
const $main = document.getElementById("main"), $nav = document.getElementById("nav");

function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
function el(tag, cls, html) { const e = document.createElement(tag); if (cls) e.className = cls; if (html != null) e.innerHTML = html; return e; }
function fmt(x, d) { if (x == null) return "–"; if (typeof x !== "number") return esc(x); return Number.isInteger(x) ? x.toLocaleString("en") : x.toFixed(d == null ? 3 : d); }
function evAnchor(ei, id) { return "ev-" + ei + "-" + id; }
function evLink(ei, id) { return '<a class="evlink" data-ep="' + ei + '" data-ev="' + esc(id) + '" href="#ep-' + ei + '/' + esc(id) + '">' + esc(id) + "</a>"; }
function kv(obj) {
  const keys = Object.keys(obj || {});
  if (!keys.length) return "<i>none recorded</i>";
  return '<table class="kv">' + keys.map(k => "<tr><td>" + esc(k) + "</td><td>" + esc(typeof obj[k] === "object" ? JSON.stringify(obj[k]) : fmt(obj[k], 4)) + "</td></tr>").join("") + "</table>";
}
function legend() {
  return '<div class="legend">' + HOWS.map(h => '<span class="p-' + h + '">' + h.replace("_", " ") + "</span>").join("") +
    '<span class="loss">loss-bearing</span><span class="special">special</span></div>';
}

// ---------------------------------------------------------------- tokens
function tokText(t) { return esc(t).replace(/\n/g, '<span class="nl">↵</span>\n'); }
function segsOf(ep, i) {  // a context's [segment, message] references: `keep` of the previous replayed step's, then `add`
  if (!ep._segs) ep._segs = [];
  if (ep._segs[i]) return ep._segs[i];
  let full = [];
  for (let k = i - 1; k >= 0; k--) if (ep.steps[k].context) { full = segsOf(ep, k); break; }
  const c = ep.steps[i].context;
  return (ep._segs[i] = full.slice(0, c.keep).concat(c.add));
}
function renderTokens(ep, segs, markOnly) {
  const specials = new Set(ep.specials);
  const out = [];
  let idx = 0;
  for (const [sid, mi] of segs) {
    const s = SEG[sid];
    let cls0 = markOnly && !markOnly.has(sid) ? " diff-only" : "";
    if (mi >= 0) {
      const m = MSG[mi];
      const evs = m[2].length ? m[2][0] : "";
      out.push('<a class="msgstart evlink" data-ep="' + ep._i + '" data-ev="' + esc(evs) + '" href="#ep-' + ep._i + "/" + esc(evs) +
        '" title="' + esc(m[0]) + " · " + esc(m[1]) + " · events " + esc(m[2].join(", ")) + '">' + esc(m[0]) + " · " + esc(m[1]) + "</a>");
    }
    out.push('<span class="seg' + cls0 + '" data-seg="' + sid + '">');
    for (let k = 0; k < s.ids.length; k++, idx++) {
      const how = CODES[s.c[k]], id = s.ids[k];
      let cls = "tok p-" + how;
      if (s.l[k] === "1") cls += " loss";
      if (specials.has(id)) cls += " special";
      out.push('<span class="' + cls + '" title="#' + idx + " · id " + id + " · " + how + (s.l[k] === "1" ? " · loss" : "") + '">' + tokText(s.t[k]) + "</span>");
    }
    out.push("</span>");
  }
  return out.join("");
}
function budgetBar(ep, ctx) {
  const budget = ep.budget, reserved = ep.reserved || 0;
  if (!budget) return '<div class="meta">' + fmt(ctx.n) + " tokens (no budget recorded)</div>";
  const pct = x => (100 * x / budget).toFixed(2) + "%";
  const used = ctx.n - ctx.pinned;
  return '<div class="budget" title="used ' + ctx.n + " (pinned block " + ctx.pinned + "), reserved " + reserved + ", budget " + budget + '">' +
    '<div class="b-used" style="width:' + pct(Math.min(used, budget)) + '"></div><div class="b-pinned" style="width:' + pct(ctx.pinned) + '"></div>' +
    '<div class="b-free"></div><div class="b-reserved" style="width:' + pct(reserved) + '"></div></div>' +
    '<div class="meta">used ' + fmt(ctx.n) + " of " + fmt(budget) + " tokens (pinned block " + fmt(ctx.pinned) + ", reserved for the response " +
    fmt(reserved) + ") · " + fmt(ctx.loss) + " loss-bearing · hash <code>" + esc(ctx.hash.slice(0, 16)) + "</code></div>";
}
function heat(lp) { const p = Math.exp(lp); return "hsl(" + Math.round(120 * p) + ",75%,82%)"; }
function sampled(step) {
  const s = step.sampled;
  const parts = s.ids.map((id, k) => {
    const lp = s.lp ? s.lp[k] : null;
    const style = lp == null ? "" : ' style="background:' + heat(lp) + '"';
    return '<span class="tok stok"' + style + ' title="#' + k + " · id " + id + (lp == null ? "" : " · logprob " + lp.toFixed(4) + " · p " + Math.exp(lp).toFixed(4)) + '">' + tokText(s.t[k]) + "</span>";
  });
  return '<div class="samp">' + parts.join("") + "</div>";
}
function renderStep(ep, step, box) {
  const h = [];
  if (!step.ok) {
    h.push('<div class="banner replay-failed">replay failed at step ' + step.index + ": " + esc(step.problem) + "<br>The context is not shown: nothing shown here would be what the policy saw.</div>");
  } else {
    const ctx = step.context;
    h.push(budgetBar(ep, ctx));
    if (step.split) h.push('<div class="banner split">a new training sample starts here: ' + esc(step.split) + "</div>");
    if (ctx.drifts && ctx.drifts.length) h.push('<div class="meta drifts">drifts: ' + ctx.drifts.map(d => "message " + d[0] + " at token " + d[1] + " (" + esc(d[2]) + ")").join(" · ") + "</div>");
    h.push(legend());
    h.push('<div class="tokens">' + renderTokens(ep, segsOf(ep, step.index)) + "</div>");
  }
  h.push("<h4>sampled tokens (" + step.sampled.ids.length + ", log-probs: " + esc(step.logprob_kind || "none") + ", finish " + esc(step.finish_reason || "–") + ")</h4>");
  h.push(sampled(step));
  h.push('<div class="cols"><div><h4>sampling config</h4>' + kv(step.sampling) + "</div><div><h4>timings (s)</h4>" + kv(step.timings) +
    "</div><div><h4>policy</h4>" + kv({ policy_version: step.policy_version, recorded_hash: step.expected_hash.slice(0, 16) }) + "</div></div>");
  box.innerHTML = h.join("");
}

// ---------------------------------------------------------------- compactions
function vmsgs(ep, msgs, touched) {
  return msgs.map(v => {
    const m = MSG[v[0]].concat([v[1], v[2]]);
    let x = "";
    if (touched) { for (const id of m[2]) if (touched[id]) { x = touched[id]; break; } }
    const calls = m[4].length ? '<div class="vtext">' + esc(m[4].join("\n")) + "</div>" : "";
    return '<div class="vmsg h-' + m[1] + (x ? " x-" + x : "") + '"><b>' + esc(m[0]) + "</b> · " + esc(m[1]) + (x ? '<span class="xtag">' + x + "</span>" : "") +
      " · " + m[2].map(id => evLink(ep._i, id)).join(", ") + '<div class="vtext">' + esc(STR[m[3]]) + "</div>" + calls + "</div>";
  }).join("");
}
function renderCompaction(ep, c, box) {
  if (c.error) { box.innerHTML = '<div class="banner replay-failed">this compaction cannot be applied: ' + esc(c.error) + "</div>"; return; }
  box.innerHTML = '<div class="meta">compressor <code>' + esc(c.compressor) + "</code> · " + esc(JSON.stringify(c.details)) + "</div>" +
    '<div class="cols compaction-cols"><div class="before"><h4>before (' + c.before.length + " messages)</h4>" + vmsgs(ep, c.before, c.touched) +
    '</div><div class="after"><h4>after (' + c.after.length + " messages)</h4>" + vmsgs(ep, c.after, null) + "</div></div>";
}

// ---------------------------------------------------------------- episode
function brief(e) {
  const txt = x => (typeof x === "string" ? x : JSON.stringify(x || "")).slice(0, 140);
  switch (e.kind) {
    case "message": return e.role + ": " + txt(e.content);
    case "step": return (e.tool_calls || []).map(c => c.function ? c.function.name : c.name).join(", ") + " " + txt(e.content);
    case "tool_result": return (e.name || e.tool_call_id) + " [" + e.status + "] " + txt(e.content);
    case "pin": return txt(e.text);
    case "unpin": return e.pin_id;
    case "compaction": return e.compressor + ", " + (e.edits || []).length + " edit(s)";
    case "state_snapshot": return e.adapter + " " + e.name;
    case "episode_end": return e.outcome + " / " + e.cause + " · reward " + e.reward + " (" + e.reward_kind + ")";
    case "episode_start": return e.episode_id;
  }
  return "";
}
function showFailed(ep) {  // a log that could not be read: its error, nothing else
  $main.innerHTML = '<div class="failed-episode"><h2>' + esc(ep.label) + '</h2><div class="banner replay-failed">this log could not be read: ' +
    esc(ep.load_error) + "<br>Nothing of this episode is shown; the other episodes on this page are.</div></div>";
}
function showEpisode(ei, evId) {
  const ep = D.episodes[ei];
  ep._i = ei;
  if (ep.load_error) { showFailed(ep); return; }
  const steps = {}; for (const s of ep.steps) steps[s.id] = s;
  $main.innerHTML = "";
  const head = el("div");
  const end = ep.end ? '<b>' + esc(ep.end.outcome) + "</b> / " + esc(ep.end.cause) + " · reward " + fmt(ep.end.reward) + " (" + esc(ep.end.reward_kind) + ")" : "<i>no episode end</i>";
  const nok = ep.steps.filter(s => s.ok).length;
  head.innerHTML = "<h2>" + esc(ep.label) + "</h2><div class=\"meta\">episode <code>" + esc(ep.episode_id) + "</code> · " + ep.events.length + " events · " +
    ep.steps.length + ' steps (<span class="' + (nok === ep.steps.length ? "ok" : "bad") + '">' + nok + " replay ok</span>) · end: " + end +
    "<br>tokenizer <code>" + esc(ep.tokenizer || "?") + "</code> · template <code>" + esc(ep.template || "?") + "</code> · compressor <code>" +
    esc(JSON.stringify(ep.compressor)) + "</code> · budget " + fmt(ep.budget) + "</div>" +
    (ep.setup_error ? '<div class="banner replay-failed">replay failed for the whole episode: ' + esc(ep.setup_error) + "</div>" : "");
  $main.appendChild(head);
  const tl = el("div", "timeline");
  const frag = document.createDocumentFragment();
  for (const e of ep.events) {
    const box = el("details", "ev ev-" + e.kind + (e.kind === "step" ? " step" : "") + (e.kind === "compaction" ? " compaction" : ""));
    box.id = evAnchor(ei, e.id);
    const st = e.kind === "step" ? steps[e.id] : null;
    let label = '<span class="seq">#' + e.seq + '</span><span class="kind">' + e.kind + (st ? " " + st.index : "") + "</span>";
    if (st) label += st.ok ? ' <span class="ok">✓</span> ' + fmt(st.context.n) + " tok · " : ' <span class="bad">replay failed</span> ';
    box.innerHTML = "<summary>" + label + '<span class="brief">' + esc(brief(e)) + "</span></summary>";
    box.addEventListener("toggle", () => {
      if (!box.open || box.dataset.done) return;
      box.dataset.done = "1";
      const body = el("div", "body");
      if (st) { body.className += " stepbody"; renderStep(ep, st, body); }
      if (e.kind === "compaction" && ep.compactions[e.id]) renderCompaction(ep, ep.compactions[e.id], body);
      const raw = el("details", "raw", "<summary>raw event</summary>");
      raw.appendChild(el("pre", "json", esc(JSON.stringify(e, null, 1))));
      body.appendChild(raw);
      box.appendChild(body);
    });
    frag.appendChild(box);
  }
  tl.appendChild(frag);
  $main.appendChild(tl);
  if (evId) openEvent(ei, evId);
}
function openEvent(ei, id) {
  const box = document.getElementById(evAnchor(ei, id));
  if (!box) return;
  box.open = true;
  box.dispatchEvent(new Event("toggle"));
  const raw = box.querySelector("details.raw"); if (raw) raw.open = true;
  document.querySelectorAll(".ev.target").forEach(x => x.classList.remove("target"));
  box.classList.add("target");
  box.scrollIntoView({ block: "start" });
}

// ---------------------------------------------------------------- runs
function episodeIndex(label) { return D.episodes.findIndex(e => e.label === label); }
function showRun(ri) {
  const r = D.runs[ri];
  const h = ["<h2>run " + esc(r.name) + "</h2><div class=\"meta\">" + esc(r.path) + " · " + r.n_episodes + " episodes · baseline <code>" + esc(r.baseline) + "</code></div>"];
  h.push('<table class="grid run-grid"><tr><th>arm \\ task</th>' + r.tasks.map(t => "<th>" + esc(t) + "</th>").join("") + "<th>all tasks</th></tr>");
  for (const a of r.arms) {
    h.push("<tr><th>" + esc(a) + "</th>");
    for (const t of r.tasks) {
      const c = r.cells[a + "\t" + t];
      if (!c) { h.push("<td>–</td>"); continue; }
      const eps = c.episodes.map(id => { const i = episodeIndex(id); return i < 0 ? esc(id) : '<a class="cell-ep' + (D.episodes[i].load_error ? " bad" : "") + '" href="#ep-' + i + '"' + (D.episodes[i].load_error ? ' title="could not be read"' : "") + ">" + esc(id.split("/").pop()) + "</a>"; }).join(" ");
      h.push('<td class="cell">quality <b>' + fmt(c.quality) + "</b><br>ends " + esc(Object.entries(c.ends).map(([k, v]) => k + " ×" + v).join(", ")) +
        "<br>prompt tokens " + fmt(Math.round(c.prompt_tokens)) + "<br>wall " + fmt(c.wall_s, 2) + " s<br>" + eps + "</td>");
    }
    const p = r.per_arm[a];
    h.push("<td>quality <b>" + fmt(p.quality) + "</b><br>completion " + fmt(p.completion) + " · truncated " + fmt(p.truncated) + "<br>violations " + fmt(p.violations) +
      "<br>prompt tokens " + fmt(Math.round(p.prompt_tokens_mean)) + "<br>wall " + fmt(p.wall_s, 2) + " s (build " + fmt(p.build_s, 2) + " s)</td></tr>");
  }
  h.push("</table>");
  const diffArms = Object.keys(r.diffs);
  if (diffArms.length) {
    const labels = Object.keys(r.diffs[diffArms[0]]);
    h.push("<h3>difference from " + esc(r.baseline) + " (paired bootstrap, mean [low, high])</h3><table class=\"grid\"><tr><th>arm</th>" + labels.map(l => "<th>" + esc(l) + "</th>").join("") + "</tr>");
    for (const a of diffArms) h.push("<tr><th>" + esc(a) + "</th>" + labels.map(l => { const c = r.diffs[a][l]; return "<td>" + fmt(c.mean_diff) + " [" + fmt(c.low) + ", " + fmt(c.high) + "]</td>"; }).join("") + "</tr>");
    h.push("</table>");
  }
  h.push('<p><a href="#diff-' + ri + '">compare two arms\' contexts side by side →</a></p><h3>plots</h3>');
  h.push(r.plots.map(p => '<img class="plot" alt="' + esc(p.name) + '" src="' + p.src + '">').join(""));
  $main.innerHTML = h.join("");
}
function showDiff(ri, sel) {
  const r = D.runs[ri];
  sel = sel || {};
  const a = sel.a || r.arms[0], b = sel.b || r.arms[Math.min(1, r.arms.length - 1)];
  const keys = []; for (const t of r.tasks) { const ca = r.cells[a + "\t" + t], cb = r.cells[b + "\t" + t]; if (ca && cb) for (const id of ca.episodes) { const k = id.split("/").pop(); if (cb.episodes.some(x => x.split("/").pop() === k)) keys.push(k); } }
  const key = sel.key && keys.includes(sel.key) ? sel.key : keys[0];
  const ia = episodeIndex(a + "/" + key), ib = episodeIndex(b + "/" + key);
  const ea = D.episodes[ia], eb = D.episodes[ib];
  const nsteps = ea && eb ? Math.min(ea.steps.length, eb.steps.length) : 0;
  const step = Math.min(sel.step || 0, Math.max(0, nsteps - 1));
  const opt = (xs, cur) => xs.map(x => '<option' + (x == cur ? " selected" : "") + ">" + esc(x) + "</option>").join("");
  const h = ["<h2>arm diff · " + esc(r.name) + '</h2><div class="ctl">' +
    '<label>arm A <select id="dA">' + opt(r.arms, a) + '</select></label><label>arm B <select id="dB">' + opt(r.arms, b) + "</select></label>" +
    '<label>task-seed <select id="dK">' + opt(keys, key) + '</select></label><label>step <select id="dS">' + opt([...Array(nsteps).keys()], step) + "</select></label></div>"];
  h.push('<div class="meta">same task, seed and step under two arms; blocks outlined in orange are in one context only (each side opens at its first)</div>' + legend());
  const col = (ep, i, other) => {
    if (!ep) return "<div><i>no episode</i></div>";
    ep._i = i;
    const st = ep.steps[step];
    if (!st) return "<div><i>no step " + step + "</i></div>";
    if (!st.ok) return '<div><div class="banner replay-failed">replay failed at step ' + step + ": " + esc(st.problem) + "</div></div>";
    const os = other && other.steps[step] && other.steps[step].ok ? new Set(segsOf(other, step).map(x => x[0])) : new Set();
    return '<div class="diffcol"><h4><a href="#ep-' + i + "/" + esc(st.id) + '">' + esc(ep.label) + "</a> · " + fmt(st.context.n) + " tokens</h4>" + budgetBar(ep, st.context) +
      '<div class="tokens">' + renderTokens(ep, segsOf(ep, step), os) + "</div></div>";
  };
  h.push('<div class="cols">' + col(ea, ia, eb) + col(eb, ib, ea) + "</div>");
  $main.innerHTML = h.join("");
  for (const box of $main.querySelectorAll(".diffcol .tokens")) {  // open each side at its first difference
    const first = box.querySelector(".diff-only");
    if (first) box.scrollTop = Math.max(0, first.offsetTop - 40);
  }
  for (const id of ["dA", "dB", "dK", "dS"]) document.getElementById(id).addEventListener("change", () => showDiff(ri, {
    a: document.getElementById("dA").value, b: document.getElementById("dB").value, key: document.getElementById("dK").value, step: +document.getElementById("dS").value }));
}

// ---------------------------------------------------------------- navigation
function buildNav() {
  const h = [];
  D.runs.forEach((r, i) => { h.push("<h3>run " + esc(r.name) + '</h3><a href="#run-' + i + '">arms × tasks grid</a><a href="#diff-' + i + '">arm diff</a>'); });
  h.push("<h3>episodes (" + D.episodes.length + ")</h3>");
  D.episodes.forEach((e, i) => {
    if (e.load_error) { h.push('<a class="failed-ep" href="#ep-' + i + '">' + esc(e.label) + ' <small><span class="bad">could not be read</span></small></a>'); return; }
    const bad = e.setup_error || e.steps.some(s => !s.ok);
    h.push('<a href="#ep-' + i + '">' + esc(e.label) + " <small>" + e.steps.length + " steps" + (e.end ? " · " + esc(e.end.outcome) : "") + (bad ? ' · <span class="bad">replay failed</span>' : "") + "</small></a>");
  });
  $nav.innerHTML = h.join("");
}
function route() {
  const h = decodeURIComponent(location.hash.slice(1));
  let m;
  if ((m = /^run-(\d+)$/.exec(h))) showRun(+m[1]);
  else if ((m = /^diff-(\d+)$/.exec(h))) showDiff(+m[1]);
  else if ((m = /^ep-(\d+)(?:\/(.+))?$/.exec(h))) {
    const cur = $main.dataset.ep;
    if (cur === m[1] && m[2]) openEvent(+m[1], m[2]); else showEpisode(+m[1], m[2]);
    $main.dataset.ep = m[1];
    return;
  } else if (D.runs.length) showRun(0);
  else if (D.episodes.length) {  // the first episode that could be read (the nav lists those that could not)
    const first = Math.max(0, D.episodes.findIndex(e => !e.load_error));
    showEpisode(first); $main.dataset.ep = String(first); return;
  }
  else $main.innerHTML = "<p>nothing to show</p>";
  delete $main.dataset.ep;
}
buildNav();
route();
window.addEventListener("hashchange", route);
const N_FAILED = D.episodes.filter(e => e.load_error).length;
document.getElementById("where").textContent = D.episodes.length + " episode(s)" + (N_FAILED ? " (" + N_FAILED + " could not be read)" : "") + ", " + D.runs.length + " run(s)";
window.ctxkitReadyMs = performance.now() - T0;
document.body.dataset.ready = "1";
