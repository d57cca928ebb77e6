# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
# Where that torch comes from. Empty: the configured index (the CPU wheel on these machines).
# Elsewhere the public registry's torch is the multi-GB CUDA build: pass the CPU wheel index,
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (used for the torch install alone; everything else still comes from the configured index).
TORCH_INDEX ?=
TORCH_FROM  := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) )
# The real MDS reader that tests/export/test_export_mds.py reads every export with (mosaicml-streaming,
# in a child process), installed beside the venv, never into it: --no-deps, since its declared
# requirements (transformers<5, numpy<2.2, torchvision, cloud SDKs) would pull the venv back; the
# modules its reading path imports are these (pillow: its encodings import PIL) plus numpy, torch,
# xxhash and tqdm from the venv.
MDS_READER      := $(VENV)/mds-reader
MDS_READER_PKGS := mosaicml-streaming==0.13.0 catalogue==2.0.10 Brotli==1.2.1 python-snappy==0.7.3 \
                   cramjam==2.14.0 zstd==1.5.7.2 pillow==13.0.0

.PHONY: demo lint test test-fast bench clean

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; v = sys.version.split()[0]; sys.exit(0 if sys.version_info >= (3, 11) else f"raypack needs Python >= 3.11 (stdlib tomllib); $(PYTHON) is {v}: run make PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_FROM)"$(TORCH_PIN)"   # the CPU build first; the [torch] range keeps it
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e ".[test]"  # setuptools' box, noise
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(MDS_READER) $(MDS_READER_PKGS)
	touch $(STAMP)

## Generate a small sharded sample corpus and pack it with an embedded local Ray.
demo: $(STAMP)
	$(PY) -m raypack.sample --output build/sample --shards 8 --docs-per-shard 2000 --context-length 512
	$(VENV)/bin/raypack pack --config configs/tiny.toml --input build/sample --output build/packed --overwrite

## Lint (ruff, configured in pyproject.toml), then run the whole test suite on TEST_WORKERS pytest-xdist
## workers (default 2: each has its own session Ray, so more workers than cores only adds contention).
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS)

lint: $(STAMP)
	$(VENV)/bin/ruff check raypack tests bench jobs

## The inner loop: the suite without the tests marked slow (Ray subprocesses, faults, S3 server).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"

bench: $(STAMP)
	$(PY) bench/bench_core.py
	$(PY) bench/bench_masks.py
	$(PY) bench/bench_collate.py

clean:
	rm -rf build $(VENV)
