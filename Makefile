# Everything runs inside .venv, created on first use, so a fresh machine needs only python3 (with venv),
# a C compiler and the zlib headers.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

# kmem is compiled once per change of its sources: into one wheel, which every target installs
# (pip installs a wheel file as it is; given the source directory it would compile again).
WHEEL_DIR := build/wheel
WHEEL_BUILT := $(WHEEL_DIR)/.built
INSTALLED := $(VENV)/.kmem-wheel-installed
SOURCES := $(wildcard kmem/*.py kmem/*/*.py kmem/*.pyx kmem/*.pxi kmem/*.pyi kmem/py.typed) \
	setup.py pyproject.toml MANIFEST.in README.md
WHEEL := $$(ls $(WHEEL_DIR)/kmem-*.whl)

.PHONY: test test-slow quick dev bench run docs wheel sdist clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip setuptools wheel "Cython>=3.0.10"

$(WHEEL_BUILT): $(SOURCES) | $(PY)
	rm -rf $(WHEEL_DIR)
	$(PIP) wheel --no-deps -w $(WHEEL_DIR) .
	touch $@

$(INSTALLED): $(WHEEL_BUILT)
	$(PIP) install --force-reinstall --no-deps $(WHEEL_DIR)/kmem-*.whl
	touch $@

# The suite runs against kmem built as a wheel and installed into the venv (not the source tree),
# so a missing build step or package file fails here rather than for users.
test: $(INSTALLED)
	$(PIP) install "$(WHEEL)[test]"
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(INSTALLED)
	$(PIP) install "$(WHEEL)[test]"
	$(VENV)/bin/pytest -m slow $(PYTEST_ARGS)

# Developer loop: build the extension in place and test the source tree.
dev: $(PY)
	rm -f $(INSTALLED)
	$(PIP) install -e ".[test,bench]" --no-build-isolation

quick: dev
	$(VENV)/bin/pytest -x -q -m "not slow" $(PYTEST_ARGS)

bench: $(INSTALLED)
	$(PIP) install "$(WHEEL)[test,bench]"
	$(VENV)/bin/pytest bench --benchmark-columns=min,median,mean,ops,rounds --benchmark-sort=name $(PYTEST_ARGS)

# The main job: a generated Kafka log directory through every Spark job on embedded local Spark.
run: $(INSTALLED)
	$(PIP) install "$(WHEEL)[spark]"
	$(VENV)/bin/kmem pipeline demo --output out/demo

# The documentation site (docs/, mkdocs.yml) into site/: MkDocs with the Material theme, the API reference
# from the docstrings (mkdocstrings). The test suite builds it too and runs its examples.
docs: $(INSTALLED)
	$(PIP) install "$(WHEEL)[docs]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

wheel: $(WHEEL_BUILT)
	mkdir -p dist && cp $(WHEEL_DIR)/kmem-*.whl dist/

sdist: $(PY)
	$(PIP) install build
	$(PY) -m build --sdist

clean:
	rm -rf build dist site *.egg-info kmem/_core.c kmem/*.so kmem/*.html .pytest_cache .benchmarks $(INSTALLED)
