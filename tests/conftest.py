"""Shared test setup. The first thing checked: the compiled core is the one under test."""
import importlib.machinery
import os

import pytest

# Child interpreters (crash tests, servers in subprocesses, Spark's Python workers) started with -c or -m
# would put the working directory first on sys.path; run from a checkout, that is the uncompiled source
# tree instead of the kmem under test.
os.environ["PYTHONSAFEPATH"] = "1"


def pytest_sessionstart(session):
    import kmem._core as core

    if not core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        pytest.exit(f"kmem._core is not the compiled extension ({core.__file__}): build it first", returncode=3)
