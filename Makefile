# The README's two commands are `make demo` and `make test`; both set up .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.eventspec-installed

.PHONY: demo test test-all test-stress test-gpu lint proto proto-check bench docs results clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU PyTorch, explicitly: it refuses (clearly) a build that would pull CUDA.
	$(PY) tools/install_cpu_torch.py
	$(PY) -m pip install -q -e '.[edge,cloud,dev]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/eventspec demo

# Extra pytest arguments, e.g. `make test PYTEST_ARGS='-x tests/unit'` (default: none).
PYTEST_ARGS ?=
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q -m ''

# The installed names (eventspec.shared, .edge, .cloud, .demoworld) as a folder of links
# to the top-level folders: for mypy, and for PYTHONPATH on a machine without the venv
# (the GPU machine: PYTHONPATH=$(TREE)).
TREE := .eventspec-tree
$(TREE)/eventspec:
	mkdir -p $@
	ln -sfn ../../shared $@/shared
	ln -sfn ../../edge $@/edge
	ln -sfn ../../cloud $@/cloud
	ln -sfn ../../tools/demoworld $@/demoworld

# `make test` STRESS_RUNS times (5) on a fresh clone of HEAD under two busy loops.
test-stress:
	tools/test_stress.sh

# On a CUDA machine, with its own PyTorch (no venv): the static engine's graphs, padding,
# fused kernels, verify steps and the server on it. GPU_OUT is the JSON summary
# (default benchmarks/results/test-gpu-<device>.json); GPU_ARGS go to pytest.
GPU_PY ?= python3
GPU_OUT ?=
GPU_ARGS ?=
test-gpu: $(TREE)/eventspec
	PYTHONPATH=$(CURDIR)/$(TREE)$${PYTHONPATH:+:$$PYTHONPATH} \
		$(GPU_PY) tools/test_gpu.py $(if $(GPU_OUT),--out $(GPU_OUT)) $(GPU_ARGS)

# On a CUDA machine: the real servers as processes at their defaults over the full-size
# random models (benchmarks/gpu_gate.py); run before a change to the engine, warm-up,
# calibration, scheduler or edge drafter lands. Writes benchmarks/results/gpu-gate-*.json.
gpu-gate: $(TREE)/eventspec
	PYTHONPATH=$(CURDIR)/$(TREE):$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
		$(GPU_PY) -m benchmarks.gpu_gate --phase cloud --load
	PYTHONPATH=$(CURDIR)/$(TREE):$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
		$(GPU_PY) -m benchmarks.gpu_gate --phase edge

lint: $(STAMP) $(TREE)/eventspec
	$(PY) -m ruff check .
	MYPYPATH=$(TREE) $(PY) -m mypy -p eventspec.shared -p eventspec.edge -p eventspec.cloud \
		-p eventspec.demoworld
	$(VENV)/bin/lint-imports

proto: $(STAMP)
	$(PY) tools/gen_protos.py

proto-check: $(STAMP)
	$(PY) tools/gen_protos.py --check

# The docs site (config tools/mkdocs.yml, output .docs-site/), built strict: a broken link
# or anchor, or a page left out of the navigation, fails. First, the results pages must be
# what their JSON renders to (`make results` re-renders them after a new run), and
# docs/layout.md what the code draws (`python tools/layout_doc.py` redraws it).
docs: $(STAMP)
	$(PY) tools/render_results.py --check
	$(PY) tools/layout_doc.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build -q -f tools/mkdocs.yml

results: $(STAMP)
	$(PY) tools/render_results.py

# Speculative vs target-only in one process, then the end-to-end rehearsal (real
# processes, delay proxies, the oracle drafter: a few minutes on 2 cores).
bench: $(STAMP)
	$(PY) -m benchmarks.bench_speculation
	$(PY) -m benchmarks.bench_e2e

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .docs-site
