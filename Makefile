# Everything runs inside .venv, created on first use, so a fresh machine needs only python3 and a C compiler.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

.PHONY: test test-slow quick dev bench run wheel sdist clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel "Cython>=3.0.10"

# The suite runs against kmem built as a wheel and installed into the venv (not the source tree),
# so a missing build step or package file fails here rather than for users.
test: $(PY)
	$(PIP) install --force-reinstall --no-deps .
	$(PIP) install ".[test]"
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(PY)
	$(PIP) install ".[test]"
	$(VENV)/bin/pytest -m slow $(PYTEST_ARGS)

# Developer loop: build the extension in place and test the source tree.
dev: $(PY)
	$(PIP) install -e ".[test,bench]" --no-build-isolation

quick: dev
	$(VENV)/bin/pytest -x -q -m "not slow" $(PYTEST_ARGS)

bench: $(PY)
	$(PIP) install --force-reinstall --no-deps .
	$(PIP) install ".[test,bench]"
	$(VENV)/bin/pytest bench --benchmark-columns=min,median,mean,ops,rounds --benchmark-sort=name $(PYTEST_ARGS)

# The main job: a generated Kafka log directory through every Spark job on embedded local Spark.
run: $(PY)
	$(PIP) install --force-reinstall --no-deps .
	$(PIP) install ".[spark]"
	$(VENV)/bin/kmem pipeline demo --output out/demo

wheel: $(PY)
	$(PIP) wheel --no-deps -w dist .

sdist: $(PY)
	$(PIP) install build
	$(PY) -m build --sdist

clean:
	rm -rf build dist *.egg-info kmem/_core.c kmem/*.so kmem/*.html .pytest_cache .benchmarks
