# Everything runs inside .venv, created on first use, so a fresh machine needs only python3 (with venv),
# a C compiler and the zlib headers.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=
# Most tests wait on brokers, clients and subprocesses rather than on the CPU, so `make test` runs test files
# in worker processes (pytest-xdist), a file's tests in one worker so its module fixtures start once.
# PARALLEL= runs them in this process.
TEST_WORKERS ?= 3
PARALLEL ?= -n $(TEST_WORKERS) --dist loadfile

# kmem is compiled once per change of its sources: into one wheel, which every target installs
# (pip installs a wheel file as it is; given the source directory it would compile again).
WHEEL_DIR := build/wheel
WHEEL_BUILT := $(WHEEL_DIR)/.built
INSTALLED := $(VENV)/.kmem-wheel-installed
SOURCES := $(wildcard kmem/*.py kmem/*/*.py kmem/*.pyx kmem/*.pxi kmem/*.pyi kmem/py.typed) \
	setup.py pyproject.toml MANIFEST.in README.md
WHEEL := $$(ls $(WHEEL_DIR)/kmem-*.whl)

# tests/test_broker_quixstreams.py runs its Quix Streams application in a virtualenv of its own, holding
# quixstreams alone (the application needs no kmem): quixstreams caps confluent-kafka below the version the
# test extra holds. The test finds it through KMEM_QUIX_PYTHON.
QUIX_VENV ?= .venv-quix
QUIX_STREAMS ?= quixstreams==3.28.1
QUIX_INSTALLED := $(QUIX_VENV)/.installed-$(QUIX_STREAMS)
QUIX_ENV := KMEM_QUIX_PYTHON=$(abspath $(QUIX_VENV))/bin/python

.PHONY: test test-slow quick dev bench asan run docs wheel sdist clean

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

$(QUIX_INSTALLED):
	$(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/python -m pip --disable-pip-version-check -q install "$(QUIX_STREAMS)"
	touch $@

# The suite runs against kmem built as a wheel and installed into the venv (not the source tree),
# so a missing build step or package file fails here rather than for users.
test: $(INSTALLED) $(QUIX_INSTALLED)
	$(PIP) install "$(WHEEL)[test]"
	$(QUIX_ENV) $(VENV)/bin/pytest -m "not slow" $(PARALLEL) $(PYTEST_ARGS)

test-slow: $(INSTALLED)
	$(PIP) install "$(WHEEL)[test]"
	$(VENV)/bin/pytest -m slow $(PYTEST_ARGS)

# Developer loop: build the extension in place and test the source tree.
dev: $(PY) $(QUIX_INSTALLED)
	rm -f $(INSTALLED)
	$(PIP) install -e ".[test,bench]" --no-build-isolation

quick: dev
	$(QUIX_ENV) $(VENV)/bin/pytest -x -q -m "not slow" $(PYTEST_ARGS)

bench: $(INSTALLED)
	$(PIP) install "$(WHEEL)[test,bench]"
	$(VENV)/bin/pytest bench --benchmark-columns=min,median,mean,ops,rounds --benchmark-sort=name $(PYTEST_ARGS)

# The compiled codecs' and records' fuzz tests under AddressSanitizer: the extension built with
# -fsanitize=address in a copy of the sources (build/asan), run with libasan preloaded (Python is not built
# with it, so leaks are not checked).
ASAN_TESTS ?= tests/test_protocol_compiled.py tests/test_records_fuzz.py
asan: $(PY)
	rm -rf build/asan && mkdir -p build/asan && git ls-files | tar -cf - -T - | tar -xf - -C build/asan
	cd build/asan && CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g" LDFLAGS="-fsanitize=address" \
		$(abspath $(PY)) setup.py build_ext --inplace
	cd build/asan && LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=. \
		$(abspath $(PY)) -m pytest -q -p no:cacheprovider $(ASAN_TESTS)

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
