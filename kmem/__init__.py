"""kmem: bounded-memory building blocks for Kafka-protocol services.

The compiled core (``kmem._core``) is required: there is no pure-Python fallback, so a failed build
shows up as an ImportError here rather than as a silently slow library.
"""
from kmem import _core  # noqa: F401  (fail at import when the extension did not build)

__version__ = "0.1.0"
