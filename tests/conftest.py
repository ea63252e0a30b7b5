"""Shared test setup. The first thing checked: the compiled core is the one under test."""
import importlib.machinery
import os

import pytest

import filesystem_helpers

# Child interpreters (crash tests, servers in subprocesses, Spark's Python workers) started with -c or -m
# would put the working directory first on sys.path; run from a checkout, that is the uncompiled source
# tree instead of the kmem under test.
os.environ["PYTHONSAFEPATH"] = "1"


def pytest_sessionstart(session):
    import kmem._core as core

    if not core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        pytest.exit(f"kmem._core is not the compiled extension ({core.__file__}): build it first", returncode=3)


@pytest.fixture(scope="session")
def spark():
    """The one Spark session of the test run (embedded local[2]), shared by every test that needs it."""
    pytest.importorskip("pyspark")
    from kmem.spark import get_session

    session = get_session("local[2]", app_name="kmem-tests", conf={"spark.ui.enabled": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def small_filesystem(tmp_path):
    """``make(size)``: a ``filesystem_helpers.SmallFilesystem`` of ``size`` (e.g. "16m") under the test's directory."""
    made = []

    def make(size):
        made.append(filesystem_helpers.SmallFilesystem(str(tmp_path / f"fs{len(made)}"), size))
        return made[-1]
    yield make
    for filesystem in made:
        filesystem.unmount()
