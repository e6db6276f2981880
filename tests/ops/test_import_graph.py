"""No import loop inside ``radixserve/`` and ``frontend_lang/``, between modules or packages.

Every module is parsed with ``ast``; every ``import``/``from ... import`` counts, at module
level and inside functions alike (a lazy import that closes a loop is still a loop), and so
do imports under ``if TYPE_CHECKING``.  Importing a submodule implicitly runs its parent
package's ``__init__``; that implicit edge is not counted, so a package ``__init__`` may
import its own submodules.  ``from pkg import name`` points at ``pkg.name`` when that is a
module, else at ``pkg``.

Packages: a module belongs to the first-level package it sits in (``radixserve.scheduler``
for ``radixserve/scheduler/kv_manager.py``); a module directly in a root (``radixserve.config``)
is a unit of its own.  An edge between two units is a dependency of one package on another;
a cycle among units (``radixserve.scheduler`` -> ``radixserve.constrained`` -> ...
-> ``radixserve.scheduler``) fails even when no module-level loop closes it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("radixserve", "frontend_lang")

Graph = dict[str, set[str]]


# ---------------------------------------------------------------------------- discovery
def package_dirs(repo: Path) -> dict[str, Path]:
    """Root package name -> folder: the roots, plus pyproject's ``package-dir`` mappings under
    them (``radixserve.kernels`` lives in ``kernels/``)."""
    dirs = {root: repo / root for root in ROOTS}
    pyproject = repo / "pyproject.toml"
    if pyproject.exists():
        for name, folder in _package_dir_table(pyproject.read_text()).items():
            if name.split(".")[0] in ROOTS:
                dirs[name] = repo / folder
    return dirs


def _package_dir_table(text: str) -> dict[str, str]:
    """``[tool.setuptools.package-dir]`` of a pyproject.toml (tomllib is Python >= 3.11)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the table is flat "name" = "folder" lines
        m = re.search(r"^\[tool\.setuptools\.package-dir\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
        return dict(re.findall(r'^\s*"([^"]+)"\s*=\s*"([^"]*)"', m.group(1), re.M)) if m else {}
    return tomllib.loads(text).get("tool", {}).get("setuptools", {}).get("package-dir", {})


def discover(dirs: dict[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every .py file below the given package folders."""
    mods: dict[str, Path] = {}
    for pkg, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` starts with."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in mods:
            return cand
    return None


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Known modules that ``module`` imports anywhere in its file."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                if not is_pkg:
                    base_parts = base_parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for t in targets:
            hit = _resolve(t, mods)
            if hit is not None and hit != module:
                out.add(hit)
    return out


def module_graph(repo: Path = REPO) -> tuple[Graph, set[str]]:
    """(module -> the modules it imports, the first-level packages)."""
    mods = discover(package_dirs(repo))
    graph = {m: imports_of(m, p, mods) for m, p in mods.items()}
    packages = {m for m, p in mods.items() if p.name == "__init__.py" and m.count(".") == 1}
    return graph, packages


def unit_of(module: str, packages: set[str]) -> str:
    """The first-level package a module belongs to, or the module itself at a root."""
    pkg = ".".join(module.split(".")[:2])
    return pkg if pkg in packages else module


def package_graph(graph: Graph, packages: set[str]) -> Graph:
    """Edges between units (see the module docstring); edges inside a unit are dropped."""
    out: Graph = {}
    for m, deps in graph.items():
        u = unit_of(m, packages)
        out.setdefault(u, set()).update(unit_of(d, packages) for d in deps)
        out[u].discard(u)
    return out


# ---------------------------------------------------------------------------- cycles
def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle (as a closed path ``[a, b, ..., a]``) per strongly connected component
    with more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sccs: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))
    return [_cycle_in(graph, comp) for comp in sccs]


def _cycle_in(graph: Graph, comp: list[str]) -> list[str]:
    """A closed path through ``comp[0]`` inside the component (breadth-first: a shortest one)."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for d in sorted(graph.get(node, ())):
                if d == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if d in members and d not in prev:
                    prev[d] = node
                    nxt_frontier.append(d)
        frontier = nxt_frontier
    raise AssertionError(f"no cycle through {start} in {comp}")  # pragma: no cover


def _describe(cycles: list[list[str]]) -> str:
    return "\n".join("  " + " -> ".join(c) for c in cycles)


# ---------------------------------------------------------------------------- the tests
def test_no_import_cycle_between_modules():
    graph, _ = module_graph()
    cycles = find_cycles(graph)
    assert not cycles, f"import cycles between modules:\n{_describe(cycles)}"


def test_no_import_cycle_between_packages():
    graph, packages = module_graph()
    assert {"radixserve.scheduler", "radixserve.constrained", "frontend_lang.backend"} <= packages
    cycles = [c for c in find_cycles(package_graph(graph, packages)) if packages & set(c)]
    assert not cycles, f"import cycles between packages:\n{_describe(cycles)}"  # (root-module loops: above)


def test_the_walk_sees_every_module_and_lazy_imports():
    graph, packages = module_graph()
    files = [p for d in package_dirs(REPO).values() for p in d.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) == len(graph) and len(graph) > 90
    assert {"radixserve.kernels", "radixserve.request", "frontend_lang.backend"} <= set(graph)
    assert "radixserve.kernels" in packages
    # the registry imports the backends inside its factory function: those edges count
    assert "radixserve.attention.triton_backend" in graph["radixserve.attention.registry"]


def test_cycle_finder_on_a_synthetic_graph():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert find_cycles(g) == [["a", "b", "c", "a"], ["e", "f", "e"]]


@pytest.mark.parametrize("lazy", [False, True])
def test_a_planted_loop_fails(tmp_path, lazy):
    """Two modules of a throwaway package importing each other (one lazily, inside a
    function) form a module cycle; two packages importing each other form a package cycle."""
    pkg = tmp_path / "radixserve"
    (pkg / "alpha").mkdir(parents=True)
    (pkg / "beta").mkdir()
    (tmp_path / "frontend_lang").mkdir()
    for init in (pkg, pkg / "alpha", pkg / "beta", tmp_path / "frontend_lang"):
        (init / "__init__.py").write_text("")
    (pkg / "alpha" / "one.py").write_text("from radixserve.beta import two\n")
    body = "def f():\n    from ..alpha import one\n" if lazy else "from radixserve.alpha.one import *\n"
    (pkg / "beta" / "two.py").write_text(body)
    (pkg / "alpha" / "three.py").write_text("import radixserve.beta\n")  # the package __init__
    graph, packages = module_graph(tmp_path)
    assert packages == {"radixserve.alpha", "radixserve.beta"}
    assert find_cycles(graph) == [["radixserve.alpha.one", "radixserve.beta.two", "radixserve.alpha.one"]]
    (pkg / "beta" / "two.py").write_text("import radixserve.alpha.three\n")  # no module loop now
    graph, packages = module_graph(tmp_path)
    assert find_cycles(graph) == []
    assert find_cycles(package_graph(graph, packages)) == [["radixserve.alpha", "radixserve.beta", "radixserve.alpha"]]


# The layers of docs/ARCHITECTURE.md ("Layout"), lowest first: a module may import only its
# own unit (package or top-level module) and the units of lower layers.
LAYERS: list[set[str]] = [
    {"radixserve.lora_config", "radixserve.chat_template"},
    {"radixserve.config", "radixserve.sampling_params", "radixserve.request", "radixserve.tokenizer", "radixserve.validation",
     "radixserve.utils", "radixserve.proc", "radixserve.embedding"},
    {"radixserve.lora", "radixserve.reasoning"},
    {"radixserve.ipc"},
    {"radixserve.output_state", "radixserve.metrics"},
    {"radixserve.mem_cache"},
    {"radixserve.constrained"},
    {"radixserve.tools"},
    {"radixserve.request_builder"},
    {"radixserve.kernels"},
    {"radixserve.attention"},
    {"radixserve.parallel"},
    {"radixserve.model"},
    {"radixserve.speculative"},
    {"radixserve.worker"},
    {"radixserve.scheduler"},
    {"radixserve.detokenizer"},
    {"radixserve.engine"},
    {"radixserve.server"},
    {"radixserve.router"},
    {"radixserve.cli"},
    {"radixserve"},  # the package's __init__ (exports Engine)
    {"frontend_lang"},
]


def _unit(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "radixserve" else parts[0]


def layering_violations(graph: Graph) -> list[str]:
    level = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    bad = []
    for mod, deps in graph.items():
        u = _unit(mod)
        for d in deps:
            du = _unit(d)
            if du != u and level[du] >= level[u]:
                bad.append(f"{mod} -> {d}")
    return sorted(bad)


def test_every_unit_has_a_layer():
    graph, _ = module_graph()
    level = {u for layer in LAYERS for u in layer}
    assert {_unit(m) for m in graph} <= level, sorted({_unit(m) for m in graph} - level)


def test_imports_point_down_the_documented_layers():
    graph, _ = module_graph()
    bad = layering_violations(graph)
    assert not bad, "imports that point up (or across) the layers of docs/ARCHITECTURE.md:\n  " + "\n  ".join(bad)


def test_layering_check_catches_an_upward_import():
    graph = {"radixserve.mem_cache.kv_pool": {"radixserve.scheduler.req"}, "radixserve.scheduler.req": set()}
    assert layering_violations(graph) == ["radixserve.mem_cache.kv_pool -> radixserve.scheduler.req"]


def test_the_dsl_and_the_engine_do_not_depend_on_the_http_server():
    """frontend_lang (in-process or over HTTP) and the Engine use the tool-calling package,
    not the HTTP server's modules: the server is one client of the layers below it."""
    graph, _ = module_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                 if m.split(".")[0] == "frontend_lang" or m.startswith("radixserve.engine")
                 if d.startswith("radixserve.server"))
    assert not bad, bad


def test_the_kernels_folder_is_not_a_top_level_module(tmp_path):
    """Outside the repository, ``kernels`` is not this project's folder: that name belongs to Hugging
    Face's ``kernels`` package, which transformers imports when it is installed; ours is only
    ``radixserve.kernels``."""
    import os
    import subprocess
    import sys

    # every finder asked on its own, so a mapping that an installed ``kernels`` would hide still shows
    code = ("import sys, radixserve.kernels as k; print(k.__file__)\n"
            "for f in sys.meta_path:\n"
            "    s = f.find_spec('kernels', None) if hasattr(f, 'find_spec') else None\n"
            "    print(s.origin if s is not None and s.origin else '')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    ours, *found = out.stdout.splitlines()
    assert Path(ours).resolve().parent == REPO / "kernels"
    assert not any(f and Path(f).resolve().is_relative_to(REPO / "kernels") for f in found), found


def test_constraints_become_grammars_without_the_runtime():
    """``constrained/schema`` (constraints -> grammar sources, checked in the HTTP server's process)
    never imports ``constrained/runtime`` (compiled grammars, the scheduler's side)."""
    graph, _ = module_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in graph.items() if m.startswith("radixserve.constrained.schema")
                 for d in deps if d.startswith("radixserve.constrained.runtime"))
    assert not bad, bad


def test_a_family_is_registered_in_one_place():
    """Each family module of ``model/arch`` registers its classes itself; nothing else lists them
    (the registry finds them by importing the package)."""
    src = (REPO / "radixserve" / "model" / "registry.py").read_text()
    arch = REPO / "radixserve" / "model" / "arch"
    for path in arch.glob("*.py"):
        if path.name == "__init__.py":
            continue
        assert "@register(" in path.read_text(), f"{path.name} registers nothing"
        assert path.stem not in src, f"registry.py names {path.stem}: families are found by importing arch/"


def test_model_and_constrained_stay_small_packages():
    """``model/`` and ``constrained/`` are split by job: no folder of theirs holds more than 12 modules."""
    for root in ("model", "constrained"):
        for init in (REPO / "radixserve" / root).rglob("__init__.py"):
            mods = [p for p in init.parent.glob("*.py") if p.name != "__init__.py"]
            assert len(mods) <= 12, f"{init.parent.relative_to(REPO)} holds {len(mods)} modules: split it by job"
