"""The native CPU kernels (``kernels/cpu/*.cpp``: paged attention, fused norm/rotary/SiLU ops,
the int8 decode linear, the blocked int4/int8 linear (and its float32 form), greedy sampling's row argmax, multi-LoRA's
segmented products),
compiled on first use into one library, ``torch.ops.radixserve_cpu``.

``load()`` builds the C++ sources with the system compiler (``$CXX``, else ``c++``; one object per
source, compiled in parallel, then one link) against the
installed torch, with ``-O3 -march=native`` for the machine at hand (``$RADIXSERVE_CPU_MARCH``
overrides ``native``: ``x86-64-v3`` builds the AVX2 code, which runs on any newer CPU), into
``$RADIXSERVE_CACHE/kernels/<hash>/`` (the hash covers the source, the compile command, the torch
version, the compiler and the CPU), and loads it as ``torch.ops.radixserve_cpu``; later starts load the
cached library.  It logs the "kernels" start-up stage (``radixserve.proc.stages``): a line as the
compile starts, one every few seconds with the sources done, one at its end; one line when it loads
the cached library.  It returns False, and logs one warning,
when there is no compiler, the build fails or ``RADIXSERVE_CPU_KERNEL=off``; the caller then
uses the torch_native backend.  Nothing here needs triton, ninja or pybind11.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Optional

import torch

from radixserve.kernels.kv_formats import KV_FORMATS  # noqa: F401 - the native ops' kv_format codes
from radixserve.proc import stages

logger = logging.getLogger(__name__)

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu")
SOURCES = tuple(os.path.join(SOURCE_DIR, name) for name in ("paged_attention.cpp", "fused_ops.cpp", "int8_linear.cpp",
                                                                    "blocked_linear.cpp", "blocked_exact.cpp", "argmax.cpp",
                                                                    "layer_stack.cpp", "kv_store.cpp", "lora_sgmv.cpp"))
HEADERS = tuple(os.path.join(SOURCE_DIR, name) for name in ("common.h", "vec.h", "acts_i16.h", "attn_softmax.h",
                                                                    "attn_mods.h", "attn_prefetch.h", "attn_bf16.h", "attn_avx2.h",
                                                                    "blocked_isa.h", "blocked_amx.h", "amx_tiles.h",
                                                                    "kv_packed.h"))
_lock = threading.Lock()
_state: dict[str, object] = {}


def _cache_dir() -> str:
    root = os.environ.get("RADIXSERVE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "radixserve"))
    return os.path.join(root, "kernels")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4096]
    except OSError:
        return ""


def _compile_flags() -> list[str]:
    tdir = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    march = os.environ.get("RADIXSERVE_CPU_MARCH", "native")  # e.g. x86-64-v3: test the AVX2 code on any CPU
    return ["-O3", f"-march={march}", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-trapping-math", "-fopenmp",
            "-std=c++17", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", os.path.join(tdir, "include")]


def _link_flags() -> list[str]:
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    return ["-shared", "-fopenmp", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))  # the CPUs this process may run on
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _compile(cxx: str, out: str) -> None:
    """Each source to an object, as many at once as there are CPUs, then one link into ``out``.
    Most of a source's time is parsing torch's headers (hence the sources include the ATen core
    headers, not ``ATen/ATen.h``): 59 s as one command on the 2-core development machine, 20 s
    this way."""
    objs = [f"{out}.{i}.o" for i in range(len(SOURCES))]
    flags = _compile_flags()
    workers = min(len(SOURCES), _cpus())
    try:
        with stages.stage("kernels", f"compiling {len(SOURCES)} C++ sources of {SOURCE_DIR} with {cxx}, {workers} at "
                          "a time, once per machine", total=len(SOURCES) + 1, unit="steps") as progress:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_run, [cxx, *flags, "-c", src, "-o", obj]): src
                           for src, obj in zip(SOURCES, objs)}
                for f in as_completed(futures):
                    f.result()
                    progress.step(os.path.basename(futures[f]))
            progress.working_on("linking")
            _run([cxx, *objs, "-o", out, *_link_flags()])
            progress.step()
            progress.result(f"into {os.path.dirname(out)}")
    finally:
        for obj in objs:
            if os.path.exists(obj):
                os.remove(obj)


def _build() -> str:
    """The path of the compiled library (building it if the cache has none); raises on failure."""
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r} not found; set CXX)")
    source = b""
    for path in SOURCES + HEADERS:
        with open(path, "rb") as f:
            source += f.read()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    # the flags name torch's folder, which differs in each virtual environment (a clean clone's
    # fresh one each CI run): the key names the torch build (version and commit) instead, so every
    # environment with the same torch, sources, flags, compiler and CPU loads the same library
    flags = " ".join(_compile_flags() + _link_flags()).replace(os.path.dirname(torch.__file__), "<torch>")
    key = hashlib.sha1(b"\0".join([source, torch.__version__.encode(), str(torch.version.git_version).encode(),
                                   version.encode(), flags.encode(), _cpu_model().encode()])).hexdigest()[:16]
    _state["key"] = key
    out_dir = os.path.join(_cache_dir(), key)
    lib = os.path.join(out_dir, "radixserve_cpu.so")
    if os.path.exists(lib):
        stages.note("kernels", f"cached ({lib})")
        return lib
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{lib}.{os.getpid()}.tmp"
    _compile(cxx, tmp)
    os.replace(tmp, lib)
    return lib


def load() -> bool:
    """True when ``torch.ops.radixserve_cpu`` is usable (built and loaded once per process)."""
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        if os.environ.get("RADIXSERVE_CPU_KERNEL", "").lower() in ("0", "off", "false"):
            logger.warning("cpu kernels: disabled by RADIXSERVE_CPU_KERNEL; using torch_native and torch ops")
            _state["ok"] = False
            return False
        try:
            lib = _build()
            if not hasattr(torch.ops.radixserve_cpu, "paged_attention"):
                torch.ops.load_library(lib)
            _state["ok"] = True
        except Exception as e:  # any build or load failure falls back; never crash the server
            logger.warning("cpu kernels unavailable, using torch_native and torch ops: %s", e)
            _state["ok"] = False
            _state["error"] = str(e)
        return bool(_state["ok"])


def build_key() -> str:
    """The hash naming the loaded library's build (sources, flags, compiler, CPU, torch), or ""
    when none loaded: caches of measured kernel speed are keyed on it."""
    return str(_state.get("key", "")) if load() else ""


def reset_for_tests() -> None:
    """Forget the load result so that a test can force a rebuild or a failure."""
    with _lock:
        _state.clear()


def paged_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, req_to_token: torch.Tensor,
                    plan, positions: torch.Tensor, scale: float, out: torch.Tensor,
                    parts: Optional[tuple[torch.Tensor, torch.Tensor]] = None, window: int = 0,
                    softcap: float = 0.0, kv_format: int = 0) -> torch.Tensor:
    """Run one layer's attention for ``plan`` (a ``radixserve.attention.cpu_plan.CpuAttnPlan``) into ``out``.
    ``parts``: fp32 (part_o [entries, H, D], part_lse [entries, H]) with the plan's dense
    entries filled by the caller (normalized output and log-sum-exp of the scaled scores).
    ``window``: a token at position p sees keys at positions > p - window only (0: no window);
    ``softcap``: scaled scores s become softcap * tanh(s / softcap) (0: none); ``kv_format``:
    ``KV_FORMATS`` of a pool of packed rows (``mem_cache/kv_quant.py``), 0 for a pool in q's dtype."""
    part_o, part_lse = parts if parts is not None else (None, None)
    torch.ops.radixserve_cpu.paged_attention(q, k_buf, v_buf, req_to_token, plan.tasks, plan.entry_tok, positions,
                                             plan.tok_ptr, plan.tok_entries, float(scale), out, part_o, part_lse,
                                             int(window), float(softcap), int(kv_format))
    return out
