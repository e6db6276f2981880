"use strict";
/* Collapsible list of the radix tree (the icicle's details): one row per node with its
 * preview (or token count), namespace, tokens, subtree tokens, hits, last access and locks.
 * renderTreeView(container, tree, state) redraws; `state.expanded` (key -> bool) keeps what
 * the operator opened or closed across refreshes (node ids are per reply, so rows are keyed
 * by their path of labels and sizes). */
function treeRowKey(parentKey, n) {
  return `${parentKey}/${n.namespace || ""}:${n.prefix_tokens}:${typeof n.text === "string" ? n.text.slice(0, 32) : n.tokens}`;
}

function renderTreeView(container, tree, state) {
  const { fmtInt, fmtAge, nodeLabel } = window.inspectorFmt;
  const frag = document.createDocumentFragment();
  const cell = (row, cls, text) => {
    const s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    row.appendChild(s);
    return s;
  };

  function addRow(n, key) {
    const row = document.createElement("div");
    row.className = "tree-row";
    row.dataset.id = n.id;
    if (state.selectedId === n.id) row.classList.add("selected");
    const name = cell(row, "c-name", "");
    name.style.paddingLeft = `${n.depth * 16}px`;
    const open = isOpen(n, key);
    const twist = cell(name, "twist", n.children.length ? (open ? "▾" : "▸") : "");
    if (n.children.length) {
      twist.addEventListener("click", () => { state.expanded[key] = !open; state.redraw(); });
    }
    if (n.namespace) cell(name, "ns", `ns ${n.namespace}`).title = "salted namespace: text never shown";
    if (n.tiers && n.depth > 0 && !n.tiers.includes("pool")) cell(name, "ns", n.tiers.join("+")).title = "KV outside the pool";
    const label = cell(name, "label", nodeLabel(n) + (n.text_truncated ? "…" : ""));
    if (typeof n.text !== "string" && n.depth > 0) label.classList.add("anon");
    if (typeof n.text === "string") label.title = n.text;
    cell(row, "c-num", fmtInt(n.tokens));
    cell(row, "c-num", fmtInt(n.subtree_tokens));
    cell(row, "c-num", fmtInt(n.hit_count));
    cell(row, "c-num", fmtAge(n.last_access_s));
    cell(row, "c-num", n.lock_count === null ? "—" : String(n.lock_count));
    row.addEventListener("click", (ev) => { if (ev.target !== twist) state.onSelect(n.id); });
    frag.appendChild(row);
    if (open) {
      for (const c of n.children) addRow(c, treeRowKey(key, c));
      if (n.omitted_children) {
        const more = document.createElement("div");
        more.className = "tree-row";
        const m = cell(more, "c-name more", `+${fmtInt(n.omitted_children)} more children · ${fmtInt(n.omitted_tokens)} tokens`);
        m.style.paddingLeft = `${(n.depth + 1) * 16 + 20}px`;
        frag.appendChild(more);
      }
    }
  }

  function isOpen(n, key) {
    if (key in state.expanded) return state.expanded[key];
    return n.depth < 3;
  }

  addRow(tree.root, "root");
  container.textContent = "";
  container.appendChild(frag);
  const sel = container.querySelector(".tree-row.selected");
  if (sel && state.scrollToSelected) { sel.scrollIntoView({ block: "nearest" }); state.scrollToSelected = false; }
}

window.renderTreeView = renderTreeView;
