"use strict";
/* Icicle chart of the radix tree: one row per depth, each node as wide as the tokens in its
 * subtree (its KV slots), children under their parent, biggest first; colour = hit count
 * (log scale), orange outline = locked by a running request, violet = a salted namespace.
 * renderIcicle(container, tree, {onSelect, selectedId}) redraws from a /cache/tree reply. */
const ICICLE_ROW = 26;
const SVG_NS = "http://www.w3.org/2000/svg";

function fmtInt(n) { return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"); }

function fmtAge(s) {
  if (s === null || s === undefined) return "—";
  if (s < 1) return "just now";
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function visibleText(s) {
  // one line: newlines and tabs as symbols, runs of spaces shortened; blank text as ␣
  const t = s.replace(/\r?\n/g, "⏎").replace(/\t/g, "⇥").replace(/ {2,}/g, " ");
  if (!t) return "(empty)";
  return t.trim() ? t.trimStart() : t.replace(/ /g, "␣");
}

function nodeLabel(n) {
  if (n.depth === 0) return `root · ${fmtInt(n.subtree_tokens)} tokens`;
  if (typeof n.text === "string") return visibleText(n.text);
  const below = n.subtree_tokens - n.tokens;
  return `${fmtInt(n.tokens)} tok` + (below > 0 ? ` · ${fmtInt(below)} below` : "");
}

function heat(t, salted) {
  // light -> dark along blue (shared) or violet (salted namespaces)
  const from = salted ? [237, 228, 255] : [219, 231, 255];
  const mid = salted ? [124, 58, 237] : [37, 99, 235];
  const to = salted ? [59, 7, 100] : [11, 42, 111];
  const [a, b, u] = t < 0.5 ? [from, mid, t * 2] : [mid, to, (t - 0.5) * 2];
  return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * u)).join(",")})`;
}

function svgEl(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

function icicleTooltip(n) {
  const lines = [
    n.depth === 0 ? "root" : `node #${n.id} · depth ${n.depth}`,
    `edge ${fmtInt(n.tokens)} tokens after ${fmtInt(n.prefix_tokens)} · subtree ${fmtInt(n.subtree_tokens)} tokens in ${fmtInt(n.subtree_nodes)} nodes`,
    `hits ${fmtInt(n.hit_count)} · last access ${fmtAge(n.last_access_s)} · locks ${n.lock_count ?? "—"}`,
  ];
  if (n.namespace) lines.push(`namespace ${n.namespace} (text hidden)`);
  if (n.tiers && n.tiers.length) lines.push(`KV in ${n.tiers.join(" + ")}`);
  if (n.omitted_children) lines.push(`+${n.omitted_children} children not shown (${fmtInt(n.omitted_tokens)} tokens)`);
  return lines;
}

function renderIcicle(container, tree, opts) {
  const root = tree.root;
  container.textContent = "";
  if (!root.subtree_tokens) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = tree.cache === "none" ? "The radix cache is disabled (--disable-radix-cache): nothing is shared."
      : "The cache is empty.";
    container.appendChild(empty);
    return;
  }
  let maxHits = 1, maxDepth = 0;
  (function scan(n) {
    if (n.depth > 0) maxHits = Math.max(maxHits, n.hit_count);
    maxDepth = Math.max(maxDepth, n.depth);
    n.children.forEach(scan);
  })(root);
  const W = container.clientWidth || 1000, H = (maxDepth + 1) * ICICLE_ROW;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, height: H, role: "img" }, container);
  const scale = W / root.subtree_tokens;
  const tip = document.getElementById("tooltip");
  (function draw(n, x) {
    const w = n.subtree_tokens * scale, y = n.depth * ICICLE_ROW;
    if (w < 0.5) return;
    const t = n.depth === 0 ? 0.35 : Math.log1p(n.hit_count) / Math.log1p(maxHits);
    const rect = svgEl("rect", { x: x.toFixed(2), y, width: Math.max(w, 1).toFixed(2), height: ICICLE_ROW - 1,
                                 fill: n.depth === 0 ? "#c7d2e0" : heat(t, !!n.namespace), "data-id": n.id }, svg);
    rect.classList.add("node");
    if (n.lock_count) rect.classList.add("locked");
    if (n.tiers && n.depth > 0 && !n.tiers.includes("pool")) rect.classList.add("offloaded");
    if (opts.selectedId === n.id) rect.classList.add("selected");
    rect.addEventListener("mousemove", (ev) => showTip(tip, ev, n));
    rect.addEventListener("mouseleave", () => { tip.hidden = true; });
    rect.addEventListener("click", () => opts.onSelect && opts.onSelect(n.id));
    if (w > 36) {
      const label = nodeLabel(n), chars = Math.floor((w - 8) / 6.7);
      const txt = svgEl("text", { x: (x + 4).toFixed(2), y: y + 17, fill: t > 0.45 ? "#ffffff" : "#1b2430" }, svg);
      txt.textContent = label.length > chars ? label.slice(0, Math.max(1, chars - 1)) + "…" : label;
    }
    let cx = x;
    for (const c of n.children) { draw(c, cx); cx += c.subtree_tokens * scale; }
    if (n.omitted_tokens * scale >= 2) {
      svgEl("rect", { x: cx.toFixed(2), y: y + ICICLE_ROW, width: (n.omitted_tokens * scale).toFixed(2),
                      height: ICICLE_ROW - 1, fill: "#e5e7eb" }, svg).classList.add("omitted");
    }
  })(root, 0);
}

function showTip(tip, ev, n) {
  tip.textContent = "";
  for (const line of icicleTooltip(n)) {
    const d = document.createElement("div");
    d.textContent = line;
    tip.appendChild(d);
  }
  if (typeof n.text === "string") {
    const d = document.createElement("div");
    d.className = "tt-text";
    d.textContent = n.text + (n.text_truncated ? "…" : "");
    tip.appendChild(d);
  }
  tip.hidden = false;
  const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  tip.style.left = `${x}px`;
  tip.style.top = `${ev.clientY + 14}px`;
}

window.renderIcicle = renderIcicle;
window.inspectorFmt = { fmtInt, fmtAge, nodeLabel };
