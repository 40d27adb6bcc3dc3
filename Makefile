# The README's two commands are `make run` and `make test`; both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run demo test test-fast fuzz lint bench chart docs docs-ref system-deps clean

# `make test` runs the whole suite on this many pytest-xdist workers. Most of a test's time is
# spent waiting on daemons, sockets and deadlines, not on the CPU, so a 2-core machine keeps
# more workers than cores busy (figures: docs/development/testing.md). Override with
# `make test TEST_WORKERS=1`; a bare `pytest` runs everything in one process.
TEST_WORKERS ?= 4

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || (apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV))
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# `make run` needs only what the daemon imports; test and lint tools come with `make test`/`make lint`.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/egress-gateway serve --policy policies/default.yaml

# The README's Quickstart: the gateway beside a local origin and DNS server, five requests
# allowed and refused, and the audit lines they left; no internet needed.
demo: $(RUN_STAMP)
	$(BIN)/python scripts/demo.py

system-deps:
	scripts/install-system-deps.sh

PYTEST := PATH="$(CURDIR)/.tools/bin:$$PATH" $(BIN)/python -m pytest

# Every test, no selection: .ci/run calls this. First all but the tests marked `serial`, spread
# over the workers a whole file at a time (tests/harness/parallel.py: a module's shared daemons
# are built once; the network-namespace files run one after another); then the `serial` ones
# (bursts of concurrent calls, event-loop latency bounds) alone on a quiet machine. Both parts
# always run; the target fails if either does.
test: $(STAMP) system-deps
	scripts/install-helm.sh
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not serial" || failed=1; \
	$(PYTEST) -m serial || failed=1; \
	test -z "$$failed"

# The unit tests but the few marked slow, for the edit-test loop: no daemon, no network, seconds.
# Never a substitute for `make test`.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -m "not slow" -n 2 -q

# The property tests (tests/unit/test_*_property.py) with EGRESS_FUZZ_SCALE times their examples
# (tests/harness/fuzz.py): `make test` runs each with its own small, bounded count.
FUZZ_SCALE ?= 50
fuzz: $(STAMP)
	EGRESS_FUZZ_SCALE=$(FUZZ_SCALE) $(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 tests/unit/test_*_property.py

lint: $(STAMP)
	$(BIN)/ruff check gateway tests bench scripts
	$(BIN)/ruff format --check gateway tests bench scripts
	$(BIN)/mypy --strict gateway tests bench scripts

chart: $(STAMP)
	scripts/install-helm.sh
	$(PYTEST) tests/chart

# pip 23's resolver stops on readability-lxml's lxml[html-clean] (the extra named twice once
# normalised); pip 24 and later resolve it.
bench: $(STAMP)
	$(BIN)/python -m pip install -q --upgrade 'pip>=24'
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python bench/extract.py --pages ../shared/fixtures/pages --snippets ../shared/fixtures/snippet-pages

# The reference tables generated from the code (settings, CLI, error codes, metrics, audit
# fields); tests/docs/test_generated_reference.py fails until the committed pages match.
docs-ref: $(STAMP)
	$(BIN)/python scripts/gen_docs_ref.py

# The documentation site (optional, not part of `make test`): zensical reads mkdocs.yml and the
# Markdown under docs/, and writes site/. Pinned so the site builds the same everywhere.
ZENSICAL_VERSION := 0.1.1
docs: $(STAMP)
	$(BIN)/python -m pip install -q 'zensical==$(ZENSICAL_VERSION)'
	$(BIN)/zensical build --clean

clean:
	rm -rf $(VENV) .tools site
