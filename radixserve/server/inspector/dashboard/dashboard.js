"use strict";
/* The cache inspector page: polls /cache/stats every second and /cache/tree every 3 s, keeps
 * the history for the charts in the page, and sends the admin key (from the URL fragment
 * #key=..., which browsers never send to the server, or from the form) as a bearer header.
 * The key is kept in sessionStorage for this tab only and never written anywhere else. */
(function () {
  const KEY_STORE = "radixserve-inspector-key";
  const STATS_MS = 1000, TREE_MS = 3000;
  const $ = (id) => document.getElementById(id);
  const { fmtInt } = window.inspectorFmt;
  const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);

  // ---------------------------------------------------------------- the key
  const frag = new URLSearchParams(location.hash.slice(1));
  if (frag.get("key")) {
    sessionStorage.setItem(KEY_STORE, frag.get("key"));
    history.replaceState(null, "", location.pathname + location.search);
  }
  let needKey = false;
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY_STORE, $("key-input").value.trim());
    $("key-input").value = "";
    $("key-form").hidden = true;
    needKey = false;
    pollStats(); pollTree();
  });

  async function getJSON(path) {
    const key = sessionStorage.getItem(KEY_STORE);
    const r = await fetch(path, { headers: key ? { Authorization: `Bearer ${key}` } : {}, cache: "no-store" });
    if (r.status === 401 || r.status === 403) {
      needKey = true;
      $("key-form").hidden = false;
      const body = await r.json().catch(() => null);
      throw new Error(body?.error?.message || `HTTP ${r.status}`);
    }
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json();
  }

  function setStatus(ok, text) {
    $("status-dot").className = "dot " + (ok ? "live" : "down");
    $("status-text").textContent = text;
    $("error").hidden = ok;
    if (!ok) $("error").textContent = text;
  }

  // ---------------------------------------------------------------- stats
  const charts = {
    hit: new TimeChart($("chart-hit"), { yMax: 100, format: (v) => `${Math.round(v)}%`, series: [
      { name: "5 s", color: "#94a3b8" }, { name: "1 min", color: "#2563eb" },
      { name: "since start", color: "#16a34a" }] }),
    kv: new TimeChart($("chart-kv"), { stacked: true, format: (v) => fmtInt(Math.round(v)), series: [
      { name: "requests", color: "#f59e0b" }, { name: "cache", color: "#2563eb" }] }),
    req: new TimeChart($("chart-req"), { minTop: 4, format: (v) => String(Math.round(v)), series: [
      { name: "running", color: "#16a34a" }, { name: "queued", color: "#d97706" }] }),
  };
  const history5s = [];  // [timeMs, cached_tokens, prompt_tokens] since start, for the short window

  function shortRate(now, all) {
    history5s.push([now, all.cached_tokens, all.prompt_tokens]);
    while (history5s.length > 2 && history5s[1][0] <= now - 5000) history5s.shift();
    const [, c0, p0] = history5s[0];
    const dp = all.prompt_tokens - p0;
    return dp > 0 ? (all.cached_tokens - c0) / dp : null;
  }

  function showStats(s) {
    const now = Date.now(), w = s.windows, kv = s.kv;
    $("hit-rate-value").textContent = pct(w.last_1m.hit_rate ?? null);
    $("hit-rate-sub").textContent =
      `5 min ${pct(w.last_5m.hit_rate)} · since start ${pct(w.since_start.hit_rate)} · ` +
      `${fmtInt(w.last_1m.cached_tokens)} of ${fmtInt(w.last_1m.prompt_tokens)} prompt tokens cached (1 min)` +
      (s.tiers ? ` · loaded from host ${fmtInt(s.tiers.host.hit_tokens)}, disk ${fmtInt(s.tiers.disk.hit_tokens)} tokens` +
                 ` (host ${fmtInt(s.tiers.host.tokens)} / ${fmtInt(s.tiers.host.slots)} tokens held)` : "");
    $("kv-value").textContent = pct(kv.used_fraction);
    $("kv-bar-held").style.width = `${(100 * kv.held_slots) / Math.max(1, kv.num_slots)}%`;
    $("kv-bar-cache").style.width = `${(100 * kv.cached_slots) / Math.max(1, kv.num_slots)}%`;
    $("kv-sub").textContent = `${fmtInt(kv.num_slots - kv.free_slots)} / ${fmtInt(kv.num_slots)} slots · ` +
      `cache ${fmtInt(kv.cached_slots)} · requests ${fmtInt(kv.held_slots)}`;
    $("tree-value").textContent = fmtInt(s.tree.tokens);
    $("tree-sub").textContent = `${fmtInt(s.tree.nodes)} nodes · ${fmtInt(s.tree.protected_tokens)} locked · ` +
      `${fmtInt(s.tree.evictable_tokens)} evictable`;
    $("req-value").textContent = `${s.requests.running} running`;
    $("req-sub").textContent = `${s.requests.waiting} queued · ${s.requests.in_flight} in flight at the server · ` +
      `${fmtInt(w.last_1m.requests)} admitted in 1 min`;
    $("evict-value").textContent = `${fmtInt(w.since_start.evicted_nodes)} nodes`;
    $("evict-sub").textContent = `${fmtInt(w.since_start.evicted_tokens)} tokens · last 1 min: ` +
      `${fmtInt(w.last_1m.evicted_nodes)} nodes, ${fmtInt(w.last_1m.evicted_tokens)} tokens`;
    const p = (v) => (v === null || v === undefined ? null : 100 * v);
    charts.hit.push(now, [p(shortRate(now, w.since_start)), p(w.last_1m.hit_rate), p(w.since_start.hit_rate)]);
    charts.kv.yMax = kv.num_slots;
    charts.kv.push(now, [kv.held_slots, kv.cached_slots]);
    charts.req.push(now, [s.requests.running, s.requests.waiting]);
    setStatus(true, `live · ${s.cache === "none" ? "radix cache disabled · " : ""}updated ${new Date(now).toLocaleTimeString([], { hour12: false })}`);
  }

  async function pollStats() {
    clearTimeout(pollStats.timer);
    try {
      if (!needKey) showStats(await getJSON("/cache/stats"));
    } catch (e) {
      setStatus(false, `stats: ${e.message}`);
    }
    pollStats.timer = setTimeout(pollStats, STATS_MS);
  }

  // ---------------------------------------------------------------- tree
  const view = { expanded: {}, selectedId: null, scrollToSelected: false, tree: null };
  view.redraw = () => { if (view.tree) drawTree(view.tree); };
  view.onSelect = (id) => {
    view.selectedId = id;
    view.scrollToSelected = true;
    openPathTo(view.tree.root, "root", id);
    view.redraw();
  };

  function openPathTo(n, key, id) {
    if (n.id === id) return true;
    for (const c of n.children) {
      if (openPathTo(c, treeRowKey(key, c), id)) { view.expanded[key] = true; return true; }
    }
    return false;
  }

  function drawTree(tree) {
    renderIcicle($("icicle"), tree, { selectedId: view.selectedId, onSelect: view.onSelect });
    renderTreeView($("tree-view"), tree, view);
    $("tree-caption").textContent = `top ${fmtInt(tree.returned_nodes)} of ${fmtInt(tree.tree_nodes)} nodes by size · ` +
      `depth ≤ ${tree.max_depth}` + (tree.scan_complete ? "" : ` · sizes from the first ${fmtInt(tree.scanned_nodes)} nodes`);
    $("privacy-note").textContent = tree.text_preview
      ? "Text previews are on (--cache-inspector-text). Salted namespaces (per-key cache_salt) never show text."
      : "Text previews are off: prompts are private. Start the server with --cache-inspector-text to show them.";
  }

  async function pollTree() {
    clearTimeout(pollTree.timer);
    try {
      if (!needKey && !$("opt-pause").checked) {
        const q = `max_depth=${$("opt-depth").value}&max_nodes=${$("opt-nodes").value}`;
        view.tree = await getJSON(`/cache/tree?${q}`);
        drawTree(view.tree);
      }
    } catch (e) {
      setStatus(false, `tree: ${e.message}`);
    }
    pollTree.timer = setTimeout(pollTree, TREE_MS);
  }

  for (const id of ["opt-depth", "opt-nodes"]) $(id).addEventListener("change", pollTree);
  window.addEventListener("resize", () => view.redraw());
  pollStats();
  pollTree();
})();
