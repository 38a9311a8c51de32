# The README's two commands are `make demo` and `make test`; both set up .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.eventspec-installed

.PHONY: demo test test-all lint proto proto-check bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU PyTorch, explicitly: it refuses (clearly) a build that would pull CUDA.
	$(PY) tools/install_cpu_torch.py
	$(PY) -m pip install -q -e '.[edge,cloud,dev]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/eventspec demo

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy shared edge cloud
	$(VENV)/bin/lint-imports

proto: $(STAMP)
	$(PY) tools/gen_protos.py

proto-check: $(STAMP)
	$(PY) tools/gen_protos.py --check

bench: $(STAMP)
	$(PY) benchmarks/bench_speculation.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
