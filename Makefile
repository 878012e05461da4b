# Each target builds its own virtualenv from pyproject.toml's extras (test + docs + ecosystem).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-long test-fast bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,docs,ecosystem]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m spmdtyped demo
	$(PY) examples/_main_job.py

# A second interpreter with mypy 1.x: the plugin's typing tests also run under it, so the
# supported range (mypy>=1.15,<3) is tested at both major versions.
MYPY1 := $(VENV)-mypy1/bin/python
$(MYPY1):
	$(PYTHON) -m venv $(VENV)-mypy1
	$(MYPY1) -m pip install -q 'mypy==1.20.2'

# Two pytest-xdist workers (the CI machine has 2 cores), the tests of a costly module fixture
# on one of them (tests/conftest.py), and the 25 slowest tests listed at the end. `test` leaves
# out the long sweeps and oracles (marked `slow` in tests/conftest.py); `test-long` runs them;
# CI runs both.
JOBS ?= 2
test: $(STAMP) $(MYPY1)
	SPMDTYPED_MYPY_PYTHONS=$(abspath $(MYPY1)) $(PY) -m pytest -q -n $(JOBS) --dist loadgroup --durations=25 -m "not slow" tests

test-long: $(STAMP) $(MYPY1)
	SPMDTYPED_MYPY_PYTHONS=$(abspath $(MYPY1)) $(PY) -m pytest -q -n $(JOBS) --dist loadgroup --durations=25 -m slow tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -x -n $(JOBS) --dist loadgroup tests -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/run.py

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

clean:
	rm -rf $(VENV) $(VENV)-mypy1 .venv312 .venv312-mypy1 build dist .pytest_cache .mypy_cache
