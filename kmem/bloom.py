"""Bloom filters over producer ids, bit-compatible with commons-collections 4.5.0 (KIP-1044).

A ``Shape`` is (m bits, k hash functions) with commons-collections' factories and estimates. A producer id
is hashed as its 8 big-endian bytes with MurmurHash3_x64_128 (seed 0) and the two halves drive 4.5.0's
``EnhancedDoubleHasher`` (not the 4.5.0-M1 loop kmem 0.1 ran), so a filter built here and one built in
Java from the same ids have the same bits. ``indices(shape, pid)`` gives the k indices of one id for
checking other implementations.

A ``BloomFilter`` lives on the heap or over a memory-mapped ``.bloom`` sidecar (read-only, not loaded
into memory, holding no file descriptor; writable while ``build_in`` builds one). The sidecar is
``numberOfBits i32 | numberOfHashFunctions i32 | ceil(m/64) longs``, big-endian as Java's DataOutputStream
writes it; the filter keeps that layout in memory too, so writing a file copies bytes. Hashing and bit loops
run in the compiled core; batch calls release the GIL.

Threads: queries may run concurrently; adds to one filter need the caller's lock (as in Java).
"""
import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from kmem import _core
from kmem.durable import replaced_atomically
from kmem.errors import CorruptSnapshotError, IllegalStateError, InvalidArgumentError

LN_2 = math.log(2.0)
DENOMINATOR = -LN_2 * LN_2      # ln(1 / 2^ln 2), as commons computes m
MAX_INT = 2**31 - 1             # Java's int: m and k are ints in commons-collections
MAX_HASH_FUNCTIONS = _core.BLOOM_MAX_HASHES    # kmem's own limit on k (stack buffer in the core)
SIDECAR_SUFFIX = ".bloom"
_HEADER = struct.Struct(">ii")


def _java_round(x):
    """Java's Math.round for a non-negative double: round half up."""
    r = math.floor(x)
    return r + 1 if x - r >= 0.5 else r


def _check_int(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer: {value!r}")
    if value < low:
        raise InvalidArgumentError(f"{name} must be greater than {low - 1}: {value}")
    if value > MAX_INT:
        raise InvalidArgumentError(f"{name} must fit a Java int (at most {MAX_INT}): {value}")
    return value


def _check_probability(p):
    if not (isinstance(p, (int, float)) and 0.0 < p < 1.0):     # written so NaN fails too
        raise InvalidArgumentError(f"Probability must be greater than 0 and less than 1: {p!r}")


def _check_calculated_probability(shape, n):
    p = shape.probability(n)
    if p >= 1.0:
        raise InvalidArgumentError(f"Calculated probability is greater than or equal to 1: {p}")
    return shape


def _hash_functions_for(n, m):
    k = _java_round(LN_2 * m / n)
    if k < 1:
        raise InvalidArgumentError(f"Filter too small: Calculated number of hash functions ({k}) was less than 1")
    return k


@dataclass(frozen=True)
class Shape:
    """m bits and k hash functions; build it with the ``from_*`` factories as in commons-collections."""

    number_of_bits: int
    number_of_hash_functions: int

    def __post_init__(self):
        _check_int("Number of bits", self.number_of_bits)
        _check_int("Number of hash functions", self.number_of_hash_functions)
        if self.number_of_hash_functions > MAX_HASH_FUNCTIONS:
            raise InvalidArgumentError(
                f"kmem supports at most {MAX_HASH_FUNCTIONS} hash functions: {self.number_of_hash_functions}")

    @classmethod
    def from_km(cls, k, m):
        return cls(m, k)

    @classmethod
    def from_nm(cls, n, m):
        _check_int("Number of items", n)
        _check_int("Number of bits", m)
        return _check_calculated_probability(cls(m, _hash_functions_for(n, m)), n)

    @classmethod
    def from_nmk(cls, n, m, k):
        _check_int("Number of items", n)
        return _check_calculated_probability(cls(m, k), n)

    @classmethod
    def from_np(cls, n, p):
        _check_int("Number of items", n)
        _check_probability(p)
        m = math.ceil(n * math.log(p) / DENOMINATOR)
        if m > MAX_INT:
            raise InvalidArgumentError(f"Resulting filter has more than {MAX_INT} bits: {m}")
        return _check_calculated_probability(cls(m, _hash_functions_for(n, m)), n)

    @classmethod
    def from_pmk(cls, p, m, k):
        _check_probability(p)
        shape = cls(m, k)
        n = math.ceil(m / (-k / math.log(-math.expm1(math.log(p) / k))))
        return _check_calculated_probability(shape, min(n, MAX_INT))

    def probability(self, n):
        """False-positive probability after n items: (1 - e^(-kn/m))^k."""
        if n < 0:
            raise InvalidArgumentError(f"Number of items must be greater than or equal to 0: {n}")
        if n == 0:
            return 0.0
        k = self.number_of_hash_functions
        return math.pow(-math.expm1(-1.0 * k * n / self.number_of_bits), k)

    def estimate_max_n(self):
        """The number of items at which the filter is "full" for its false-positive rate: m ln 2 / k."""
        return self.number_of_bits * LN_2 / self.number_of_hash_functions

    def estimate_n(self, cardinality):
        """Items estimated from the number of set bits: -(m/k) ln(1 - c/m); inf at c = m, nan above."""
        m = self.number_of_bits
        if cardinality >= m:
            return math.inf if cardinality == m else math.nan
        return -(m / self.number_of_hash_functions) * math.log1p(-cardinality / m)

    @property
    def bitmap_bytes(self):
        """Bytes of the bitmap: ceil(m / 64) longs."""
        return ((self.number_of_bits + 63) >> 6) << 3

    def __str__(self):
        return f"Shape[k={self.number_of_hash_functions} m={self.number_of_bits}]"


def pid_hash(pid):
    """(h1, h2): MurmurHash3_x64_128 of the 8 big-endian bytes of ``pid``, seed 0, unsigned halves."""
    return _core.murmur3_pid(pid)


def hasher_indices(shape, initial, increment):
    """The k indices of commons' ``EnhancedDoubleHasher(initial, increment)`` (unsigned 64-bit values)."""
    mask = (1 << 64) - 1
    return _core.bloom_hasher_indices(initial & mask, increment & mask,
                                      shape.number_of_bits, shape.number_of_hash_functions)


def indices(shape, pid):
    """The k bit indices of producer id ``pid`` under ``shape``, in the order commons emits them."""
    return hasher_indices(shape, *pid_hash(pid))


def _as_keys(ids):
    """A contiguous uint64 view of producer ids given as any integer array-like."""
    array = np.asarray(ids)
    if array.dtype == np.uint64 or array.dtype == np.int64:
        return np.ascontiguousarray(array).reshape(-1).view(np.uint64)
    if array.dtype.kind in "iu" or array.size == 0:
        return array.astype(np.int64).reshape(-1).view(np.uint64)
    raise InvalidArgumentError(f"producer ids must be an integer array, not {array.dtype}")


class BloomFilter(_core.BloomBits):
    """A Bloom filter of producer ids with a commons-collections ``Shape``.

    ``add(pid)`` / ``pid in bf`` per id; ``add_many(ids)`` / ``contains_many(ids)`` over numpy integer
    arrays. ``BloomFilter.open(path)`` maps a sidecar read-only; ``read(path)`` loads it; ``write(path)``
    stores one.
    """

    def __init__(self, shape, _bitmap=None, _mapping=None, _path=None):
        self.shape = shape
        self.path = _path
        self._bitmap = np.zeros(shape.bitmap_bytes, np.uint8) if _bitmap is None else _bitmap
        self._mapping = _mapping
        self._attach(self._bitmap, shape.number_of_bits, shape.number_of_hash_functions)

    # add(pid), `pid in bf` and cardinality() come from the compiled core.

    def add_many(self, ids):
        """Add every producer id of an integer array."""
        self._add_keys(_as_keys(ids))

    def contains_many(self, ids):
        """A bool array: whether each id may be in the filter (no false negatives)."""
        keys = _as_keys(ids)
        out = np.empty(len(keys), np.bool_)
        self._contains_keys(keys, out.view(np.uint8))
        return out

    def merge(self, other):
        """Add all of ``other``'s ids (a filter of the same shape) to this one."""
        if not isinstance(other, BloomFilter) or other.shape != self.shape:
            raise InvalidArgumentError(f"cannot merge {other!r} into a filter of shape {self.shape}")
        self._merge_bits(other)

    def estimate_n(self):
        """The estimated number of ids added, rounded as commons does; IllegalStateError when full."""
        n = self.shape.estimate_n(self.cardinality())
        if math.isinf(n):
            raise IllegalStateError("The estimated N for the filter is infinite")
        return _java_round(n)

    def is_saturated(self):
        """True once the false-positive rate has reached the shape's: estimate_n >= estimate_max_n.

        -(m/k) ln(1 - c/m) >= m ln 2 / k exactly when c >= m/2; the integer form is used so that
        rounding in the logarithms cannot move the boundary. The ledger flushes its active file here.
        """
        return 2 * self.cardinality() >= self.shape.number_of_bits

    def is_full(self):
        """Every bit set (commons' isFull)."""
        return self.cardinality() == self.shape.number_of_bits

    def copy(self):
        """A writable heap copy (also of a memory-mapped filter)."""
        self._check_open()
        return BloomFilter(self.shape, np.array(self._bitmap, copy=True))

    def clear(self):
        self._check_open()
        if not self._bitmap.flags.writeable:
            raise IllegalStateError("the filter is read-only (a memory-mapped sidecar)")
        self._bitmap.fill(0)

    def as_bitmap_array(self):
        """The bitmap as commons' long[] (int64, native order): bit i in word i >> 6 at bit i & 63."""
        self._check_open()
        return self._bitmap.view(">i8").astype(np.int64)

    def _check_open(self):
        if self._bitmap is None:
            raise IllegalStateError("the filter is closed")

    # --- the .bloom sidecar -------------------------------------------------------------------------

    def to_bytes(self):
        """The sidecar bytes: m, k, then the bitmap longs, big-endian."""
        self._check_open()
        return _HEADER.pack(self.shape.number_of_bits, self.shape.number_of_hash_functions) + self._bitmap.tobytes()

    def write(self, path, *, fsync=False):
        """Write the sidecar to ``path`` atomically (temporary file, then rename).

        With ``fsync`` the file and its directory are synced before returning, so it survives power loss.
        """
        self._check_open()
        with replaced_atomically(path, fsync) as f:
            f.write(_HEADER.pack(self.shape.number_of_bits, self.shape.number_of_hash_functions))
            f.write(memoryview(self._bitmap))

    @classmethod
    def from_bytes(cls, data, path="<bytes>"):
        """A heap filter from sidecar bytes; CorruptSnapshotError names ``path`` when they are bad."""
        shape = _sidecar_shape(data, path)
        bitmap = np.frombuffer(data, np.uint8, count=shape.bitmap_bytes, offset=_HEADER.size).copy()
        return cls(shape, bitmap, _path=path)

    @classmethod
    def read(cls, path):
        """Load a sidecar file into the heap."""
        path = os.fspath(path)
        with open(path, "rb") as f:
            return cls.from_bytes(f.read(), path)

    @classmethod
    def open(cls, path):
        """Map a sidecar file read-only: queries test bits in the file's pages, nothing is loaded.

        The mapping holds no file descriptor (``_core.FileMapping``); ``close()`` (or the ``with`` block)
        unmaps it.
        """
        path = os.fspath(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEADER.size:
                raise CorruptSnapshotError(f"{path}: Bloom sidecar truncated ({size} bytes, header needs 8)")
            mapping = _core.FileMapping(f.fileno())
        try:
            with memoryview(mapping) as data:
                shape = _sidecar_shape(data, path)
            bitmap = np.frombuffer(mapping, np.uint8, count=shape.bitmap_bytes, offset=_HEADER.size)
            return cls(shape, bitmap, mapping, path)
        except BaseException:
            mapping.close()
            raise

    @classmethod
    def build_in(cls, file, shape):
        """An empty filter of ``shape`` kept in ``file`` (an empty file, opened by name for writing) instead
        of the heap: the sidecar's header is written and the bitmap's blocks reserved, then mapped writable,
        so a full disk is an OSError here, never SIGBUS at a later add. ``close()`` unmaps it, leaving a
        sidecar of the ids added (for a snapshot merged from millions of ids, counted only at the end)."""
        if not isinstance(shape, Shape):
            raise InvalidArgumentError(f"shape must be a kmem.bloom.Shape: {shape!r}")
        file.write(_HEADER.pack(shape.number_of_bits, shape.number_of_hash_functions))
        file.flush()
        size = _HEADER.size + shape.bitmap_bytes
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(file.fileno(), 0, size)
        else:
            os.ftruncate(file.fileno(), size)
        with open(file.name, "r+b") as readable:        # a shared writable mapping needs read access too
            mapping = _core.FileMapping(readable.fileno(), size, writable=True)
        bitmap = np.frombuffer(mapping, np.uint8, count=shape.bitmap_bytes, offset=_HEADER.size)
        return cls(shape, bitmap, mapping, file.name)

    def close(self):
        """Release the memory map of an opened sidecar (a no-op for heap filters' memory).

        IllegalStateError while another thread's query runs over the bits: close once it is done.
        """
        self._detach()
        self._bitmap = None
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        where = f" mapped from {self.path}" if self._mapping is not None else ""
        return f"BloomFilter({self.shape}{where})"


def _sidecar_shape(data, path):
    """Validate sidecar bytes (header, exact length, no bits beyond m) and return their shape."""
    if len(data) < _HEADER.size:
        raise CorruptSnapshotError(f"{path}: Bloom sidecar truncated ({len(data)} bytes, header needs 8)")
    m, k = _HEADER.unpack_from(data, 0)
    if m < 1 or k < 1:
        raise CorruptSnapshotError(f"{path}: Bloom sidecar has an impossible shape m={m} k={k}")
    if k > MAX_HASH_FUNCTIONS:
        raise CorruptSnapshotError(
            f"{path}: Bloom sidecar uses k={k} hash functions, kmem supports {MAX_HASH_FUNCTIONS}")
    shape = Shape(m, k)
    expected = _HEADER.size + shape.bitmap_bytes
    if len(data) != expected:
        raise CorruptSnapshotError(
            f"{path}: Bloom sidecar of {len(data)} bytes, expected {expected} for m={m} (truncated or foreign)")
    spare_bits = shape.bitmap_bytes * 8 - m
    if spare_bits:
        last = int.from_bytes(data[expected - 8:expected], "big")
        if last >> (64 - spare_bits):
            raise CorruptSnapshotError(f"{path}: Bloom sidecar has bits set beyond numberOfBits={m}")
    return shape


