#!/usr/bin/env bash
# One prepared GPU check for the attention backends (issue 6), for a CUDA machine:
#   1. records the environment, installs what is missing (best effort: the machine may be
#      offline, then missing optional parts are skipped, never fatal except torch+CUDA);
#   2. runs tests/kernels/test_gpu.py (Triton backend, then FlashInfer backend, vs torch_native)
#      in their own pytest processes, with TRITON_INTERPRET unset;
#   3. runs benchmarks/bench_decode_attention.py (python -m benchmarks.bench_decode_attention) (batch 64, context 2048).
# Logs go to $OUT when set (e.g. the device tool's output folder), else to
# benchmarks/results/gpu_check_<timestamp>/.  Exit status: 0 all tests passed, 1 a test
# failed or timed out, 3 no usable torch/CUDA.
#
#   bash benchmarks/gpu_check.sh                     # from the repository root or anywhere
#   PYTHON=/path/python TEST_TIMEOUT=300 bash benchmarks/gpu_check.sh
#
# Time budget (defaults): triton tests 300 s, flashinfer tests 300 s (flashinfer may
# JIT-compile its kernels on first use, minutes per configuration, unless a prebuilt
# jit-cache is installed), benchmark 180 s.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/benchmarks/results/gpu_check_$(date +%Y%m%d_%H%M%S)}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
log() { echo "[gpu_check] $*" | tee -a "$SUMMARY"; }
have() { (cd /tmp && "$PY" -c "import $1" >/dev/null 2>&1); }
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@" >>"$OUT/install.log" 2>&1; }
unset TRITON_INTERPRET  # tests/kernels/test_kernels.py's interpreter mode must not leak in here

{
  date
  nvidia-smi || true
  "$PY" -V
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|triton|flashinfer|pytest)' || true
} >"$OUT/env.txt" 2>&1

# --- 1. dependencies ---------------------------------------------------------------
if ! have torch; then
  log "torch missing: pip install torch"
  pip_install torch || { log "FATAL: torch is not installed and could not be installed"; exit 3; }
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  log "FATAL: torch sees no CUDA device (see env.txt)"; exit 3
fi
have triton || { log "triton missing: pip install triton"; pip_install "triton>=3.0" || log "triton unavailable: Triton tests will skip"; }
have pytest || { log "pytest missing: pip install pytest"; pip_install "pytest>=8" || { log "FATAL: no pytest"; exit 3; }; }
have flashinfer || { log "flashinfer missing: pip install flashinfer-python"; pip_install flashinfer-python || log "flashinfer unavailable: its tests and benchmark row will skip"; }
# radixserve must be importable with its kernels as radixserve.kernels (pyproject
# package-dir mapping): editable install without deps; offline fallback: an import shim.
if ! have radixserve.kernels; then
  log "radixserve not installed: pip install --no-deps --no-build-isolation -e ."
  if ! pip_install --no-deps --no-build-isolation -e "$ROOT" || ! have radixserve.kernels; then
    log "editable install failed (see install.log): using an import shim"
    mkdir -p "$OUT/_shim"
    cat >"$OUT/_shim/sitecustomize.py" <<EOF
import importlib.abc, importlib.util, sys
class _KernelsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "radixserve.kernels":
            return importlib.util.spec_from_file_location(
                name, "$ROOT/kernels/__init__.py", submodule_search_locations=["$ROOT/kernels"])
        return None
sys.meta_path.insert(0, _KernelsFinder())
EOF
    export PYTHONPATH="$OUT/_shim:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
"$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|triton|flashinfer|pytest|radixserve)' >>"$OUT/env.txt" || true

# --- 2. tests ----------------------------------------------------------------------
status=0
run_tests() {  # name, -k expression, timeout seconds
  local name=$1 expr=$2 limit=$3 rc
  timeout "$limit" "$PY" -m pytest tests/kernels/test_gpu.py -m gpu -k "$expr" -v -rs -p no:cacheprovider \
    --junitxml="$OUT/test_gpu_$name.xml" >"$OUT/test_gpu_$name.log" 2>&1
  rc=$?
  log "tests/kernels/test_gpu.py -k $expr: rc=$rc ($(tail -n 1 "$OUT/test_gpu_$name.log"))"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || status=1  # 5: nothing collected
}
run_tests triton "triton" "${TEST_TIMEOUT:-300}"
run_tests flashinfer "flashinfer" "${FLASHINFER_TEST_TIMEOUT:-${TEST_TIMEOUT:-300}}"
# end-to-end generation on CUDA, greedy against HF transformers
timeout "${TEST_TIMEOUT:-300}" "$PY" -m pytest tests/kernels/test_gpu_e2e.py -v -rs -p no:cacheprovider \
  >"$OUT/test_gpu_e2e.log" 2>&1
rc=$?
log "tests/kernels/test_gpu_e2e.py: rc=$rc ($(tail -n 1 "$OUT/test_gpu_e2e.log"))"
[ "$rc" -eq 0 ] || status=1

# --- 3. benchmark ------------------------------------------------------------------
timeout "${BENCH_TIMEOUT:-180}" "$PY" -m benchmarks.bench_decode_attention --batch 64 --context 2048 \
  --json "$OUT/bench_decode_attention.json" >"$OUT/bench_decode_attention.txt" 2>&1
log "bench_decode_attention: rc=$?"
cat "$OUT/bench_decode_attention.txt" | tee -a "$SUMMARY"

log "done: status=$status, logs in $OUT"
exit $status
