# The two commands the README promises (both work on a fresh machine):
#   make demo   simulate batchsched beside five baselines on the embedded default cluster and workload
#   make test   install what the tests need, build or reuse the control plane, run every test
#   make chaos  the chaos suite (tests/chaos) with its long variants (marker chaos_long), which make test leaves out
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test chaos demo install binaries

$(PY):
	$(PYTHON) -m venv $(VENV)

# install: the runtime dependencies at requirements.lock's versions (the
# image's), the test tools at requirements-test.lock's: a release upstream
# changes neither what the tests run on nor whether they pass.
install: $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet --constraint requirements.lock --constraint requirements-test.lock -e '.[test]'  # (setuptools warns of editable installs)
	$(PY) -m compileall -q batchsched  # bytecode, as a wheel's install writes: starts need not compile from source

binaries:
	$(PYTHON) e2e/localcluster.py build

test: install binaries
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

chaos: install binaries
	$(PY) -m pytest -q -p no:cacheprovider -m 'e2e or chaos_long' tests/chaos $(PYTEST_ARGS)

demo: install
	$(PY) -m batchsched simulate
