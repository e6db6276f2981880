"""The descriptions around the code, kept true: every package docstring names every module and
subpackage of its package, and the README's layout table names every package.

A name counts when it stands in code style: ``name``, ``name.py``, ``name/`` or ``name.Attr``
(in the README's table, `name/` or `radixserve/name/`).  Each check is a function over a folder so
that a planted package shows it fails when a module is added without its line.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("radixserve", "frontend_lang", "kernels")


def packages(root: Path) -> list[Path]:
    """Every package folder (one holding ``__init__.py``) below ``root``, ``root`` included."""
    return sorted(p.parent for p in root.rglob("__init__.py") if "__pycache__" not in p.parts)


def members(pkg: Path) -> list[str]:
    """The package's own modules and subpackages, by name."""
    mods = [p.stem for p in pkg.glob("*.py") if p.name != "__init__.py"]
    subs = [p.name for p in pkg.iterdir() if (p / "__init__.py").is_file()]
    return sorted(mods + subs)


def _named(name: str, text: str) -> bool:
    return re.search(rf"``{re.escape(name)}(``|\.py``|/|\.[A-Za-z_]\w*)", text) is not None


def unnamed_members(pkg: Path) -> list[str]:
    """The members of ``pkg`` its ``__init__`` docstring does not name (all of them if it has none)."""
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    return [m for m in members(pkg) if not _named(m, doc)]


def docstring_gaps(root: Path) -> dict[str, list[str]]:
    out = {}
    for pkg in packages(root):
        missing = unnamed_members(pkg)
        if missing:
            out[pkg.relative_to(root.parent).as_posix()] = missing
    return out


def layout_rows(readme: str) -> dict[str, str]:
    """The README's "Layout" table: first cell (a path) -> the row's description."""
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def layout_gaps(repo: Path, readme: str) -> list[str]:
    """Packages of ``radixserve/`` and ``frontend_lang/`` the layout table does not name: a
    first-level package needs its own row (`radixserve/x/`); a package below it needs its name,
    as `y/`, in the row of the first-level package it sits in."""
    rows = layout_rows(readme)
    missing = []
    for root in ("radixserve", "frontend_lang"):
        for pkg in packages(repo / root):
            rel = pkg.relative_to(repo).parts
            if len(rel) == 1:
                continue
            top = f"{rel[0]}/{rel[1]}/"
            if len(rel) == 2:
                if top not in rows and not (rel[0] == "frontend_lang" and "frontend_lang/" in rows
                                            and f"`{rel[1]}/`" in rows["frontend_lang/"]):
                    missing.append(top)
            elif f"`{'/'.join(rel[2:])}/`" not in rows.get(top, "") and f"`{rel[-1]}/`" not in rows.get(top, ""):
                missing.append("/".join(rel) + "/")
    return missing


# ---------------------------------------------------------------------------- the tests
def test_every_package_docstring_names_every_module():
    gaps = {k: v for root in ROOTS for k, v in docstring_gaps(REPO / root).items()}
    assert not gaps, "package docstrings that do not name these modules:\n" + "\n".join(
        f"  {pkg}/__init__.py: {', '.join(names)}" for pkg, names in sorted(gaps.items()))


def test_the_readme_layout_names_every_package():
    gaps = layout_gaps(REPO, (REPO / "README.md").read_text())
    assert not gaps, f"README.md's Layout table does not name: {gaps}"


def test_a_module_added_without_its_line_fails(tmp_path):
    pkg = tmp_path / "radixserve" / "alpha"
    (pkg / "inner").mkdir(parents=True)
    (tmp_path / "radixserve" / "__init__.py").write_text('"""The root: ``alpha`` does things."""\n')
    (pkg / "__init__.py").write_text('"""Alpha: ``one`` reads, ``inner/`` writes."""\n')
    (pkg / "inner" / "__init__.py").write_text('"""Inner: nothing yet."""\n')
    (pkg / "one.py").write_text("")
    assert docstring_gaps(tmp_path / "radixserve") == {}
    (pkg / "two.py").write_text("")  # a module without its line
    (pkg / "inner" / "three.py").write_text("")
    assert docstring_gaps(tmp_path / "radixserve") == {"radixserve/alpha": ["two"], "radixserve/alpha/inner": ["three"]}
    # prose that merely contains the word does not count
    (pkg / "__init__.py").write_text('"""Alpha: ``one`` reads, ``inner/`` writes; two of them."""\n')
    assert unnamed_members(pkg) == ["two"]


def test_a_package_added_without_its_row_fails(tmp_path):
    for d in ("radixserve/alpha/inner", "radixserve/beta", "frontend_lang"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "radixserve" / "__init__.py").write_text("")
    (tmp_path / "radixserve" / "alpha" / "__init__.py").write_text("")
    readme = ("# x\n## Layout\n\n| folder | what |\n|---|---|\n| `radixserve/alpha/` | a; `inner/` b |\n"
              "| `frontend_lang/` | the DSL |\n\n## Tests\n")
    assert layout_gaps(tmp_path, readme) == ["radixserve/beta/"]
    assert layout_gaps(tmp_path, readme.replace("`inner/` b", "b")) == ["radixserve/alpha/inner/", "radixserve/beta/"]
