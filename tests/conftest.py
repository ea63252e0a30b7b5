"""Shared test setup. The first thing checked: the compiled core is the one under test."""
import importlib.machinery

import pytest


def pytest_sessionstart(session):
    import kmem._core as core

    if not core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        pytest.exit(f"kmem._core is not the compiled extension ({core.__file__}): build it first", returncode=3)
