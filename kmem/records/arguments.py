"""Checks of the records API's arguments: each failure is an ``InvalidArgumentError`` naming the argument.

Kafka's wire types bound the integers: offsets and timestamps are int64, sequences and epochs of
partition leaders int32, producer epochs int16.
"""
from collections.abc import Mapping

from kmem.errors import InvalidArgumentError

INT16 = (-(1 << 15), (1 << 15) - 1)
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)


def check_int(name, value, low, high):
    """``value`` when it is an int (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be in [{low}, {high}], not {value}")
    return value


def check_long(name, value):
    return check_int(name, value, *INT64)


def check_choice(name, value, choices):
    """``value`` when it is an int (not a bool) among ``choices``."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(str, choices))}, not {value!r}")
    return value


def check_bool(name, value):
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, not {value!r}")
    return value


def check_limit(name, value):
    """A byte limit: a positive int that fits in memory sizes (``Py_ssize_t``)."""
    return check_int(name, value, 1, (1 << 63) - 1)


def check_mapping(name, value):
    if value is not None and not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must be a mapping or None, not {type(value).__name__}")
    return value


def byte_view(name, data):
    """A flat read-only unsigned-byte memoryview of a bytes-like ``data``, without copying."""
    try:
        view = data if isinstance(data, memoryview) else memoryview(data)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be a bytes-like object, not {type(data).__name__}") from None
    if not view.c_contiguous:
        raise InvalidArgumentError(f"{name} must be a contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly()


def check_optional_bytes(name, value):
    """``value`` when it is None or bytes-like (a key, value or header value)."""
    if value is not None:
        byte_view(name, value)
    return value
