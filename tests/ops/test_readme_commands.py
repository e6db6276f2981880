"""The README's fresh-machine commands say what they do: CI runs the README's test command,
``make test`` prints its slowest tests, and whatever the target does beyond running pytest
(system packages through apt-get, its duration, the faster target) is written beside it; the browser
comes without apt's recommended packages, and torch from a wheel index the user may name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make_targets(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """target -> (prerequisites, recipe lines) of a plain Makefile (no includes, no patterns)."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            out[current][1].append(line.strip())
            continue
        m = re.match(r"^([A-Za-z0-9_.$()/-]+)\s*:(?!=)\s*(.*)$", line)
        current = None
        if m and not line.startswith("."):
            current = m.group(1)
            out[current] = (m.group(2).split(), [])
    return out


def recipe_closure(targets: dict, name: str) -> list[str]:
    """Every recipe line ``make name`` may run (its prerequisites' first)."""
    seen, lines = set(), []

    def visit(t: str) -> None:
        if t in seen or t not in targets:
            return
        seen.add(t)
        for dep in targets[t][0]:
            visit(dep)
        lines.extend(targets[t][1])

    visit(name)
    return lines


def fresh_machine_section() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## Fresh machine\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "README.md has a 'Fresh machine' section"
    return m.group(1)


def test_ci_runs_the_readme_test_command():
    section = fresh_machine_section()
    assert re.search(r"^make test\b", section, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\s*$", ci, re.M), ".ci/run runs the README's test command"


def test_make_test_prints_its_slowest_tests():
    targets = make_targets((ROOT / "Makefile").read_text())
    for name in ("test", "test-fast"):
        pytest_lines = [ln for ln in targets[name][1] if "pytest" in ln]
        assert pytest_lines and all("--durations=25" in ln for ln in pytest_lines), (name, pytest_lines)


def test_readme_says_what_make_test_does():
    targets = make_targets((ROOT / "Makefile").read_text())
    section = fresh_machine_section()
    recipe = "\n".join(recipe_closure(targets, "test"))
    if "apt-get" in recipe:  # system packages: the README must say so, and which
        assert "apt-get" in section and "chromium" in section, "make test installs Debian packages"
    assert re.search(r"about \d+ minutes", section), "the README gives make test's duration"
    assert "make test-fast" in section and "test-fast" in targets
    assert "--durations=25" in section


def test_makefile_parser_on_a_sample():
    sample = "a: b c\n\techo a\nb:\n\tapt-get install x\nc:\n\techo c\nX := 1\n"
    targets = make_targets(sample)
    assert targets["a"] == (["b", "c"], ["echo a"])
    assert recipe_closure(targets, "a") == ["apt-get install x", "echo c", "echo a"]
    assert "X" not in targets


def make_dry_run(*args: str) -> str:
    """What ``make -n -B ARGS`` would run (nothing is run)."""
    import shutil
    import subprocess

    if not shutil.which("make"):
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_torch_comes_from_the_default_index_unless_an_index_is_named():
    """``TORCH_INDEX_URL`` (empty by default) picks PyTorch's wheel index for torch, the default index
    being the fallback when that install fails; the README says how."""
    stamp = ".venv/.installed"
    plain = [ln for ln in make_dry_run(stamp).splitlines() if "torch==" in ln]
    assert len(plain) == 1 and "--index-url" not in plain[0] and re.search(r"pip install -q torch==[\d.]+$", plain[0])
    url = "https://download.pytorch.org/whl/cpu"
    (named,) = [ln for ln in make_dry_run(stamp, f"TORCH_INDEX_URL={url}").splitlines() if "torch==" in ln]
    first, _, fallback = named.partition(" || ")
    assert f"--index-url {url} torch==" in first and fallback.strip() == plain[0].strip()
    assert f"TORCH_INDEX_URL={url}" in fresh_machine_section()


def test_the_browser_is_installed_without_recommended_packages():
    (line,) = [ln for ln in make_dry_run("browser").splitlines() if "apt-get install" in ln]
    assert "--no-install-recommends" in line and "chromium" in line
