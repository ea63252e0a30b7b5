"""kmem: bounded-memory building blocks for Kafka-protocol services.

The compiled core (``kmem._core``) is required: there is no pure-Python fallback, so a failed build
shows up as an ImportError here rather than as a silently slow library.
"""
import os

try:
    from kmem import _core  # noqa: F401  (fail at import when the extension did not build)
except ImportError as exc:
    _here = os.path.dirname(os.path.abspath(__file__))
    _hint = ("; this is an unbuilt source tree (Python started inside a kmem checkout imports it before "
             "the installed kmem): run from another directory, or build in place with "
             "`python setup.py build_ext --inplace`") if os.path.exists(os.path.join(_here, "_core.pyx")) else ""
    raise ImportError(f"kmem's compiled core kmem._core is missing from {_here}{_hint}") from exc

__version__ = "0.1.0"
