# Each target builds its own virtualenv from pyproject.toml's extras (test + docs).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m spmdtyped demo
	$(PY) examples/_main_job.py

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -x tests -m "not slow"

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

clean:
	rm -rf $(VENV) .venv312 build dist .pytest_cache .mypy_cache
