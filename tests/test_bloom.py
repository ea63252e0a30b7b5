"""kmem.bloom: commons-collections shapes and hashing, filters, and the `.bloom` sidecar."""
import math
import os
import random
import struct
import tempfile
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
# Index loops from mmh3 and the published algorithm, independent of kmem; tests/test_bloom_java.py
# checks kmem against the commons-collections jar itself.
from bloom_reference import MASK64, commons_indices
from bloom_reference import pid_hash as reference_hash

from kmem import bloom
from kmem.bloom import BloomFilter, Shape
from kmem.errors import CorruptSnapshotError, IllegalStateError, InvalidArgumentError

INT64 = st.integers(-(2**63), 2**63 - 1)


def test_murmur_halves_match_mmh3_for_random_ids():
    rng = random.Random(5)
    ids = [0, 1, -1, 2**63 - 1, -(2**63)] + [rng.randrange(-(2**63), 2**63) for _ in range(3000)]
    for pid in ids:
        assert bloom.pid_hash(pid) == reference_hash(pid)


@pytest.mark.parametrize("m,k", [(9585059, 7), (1, 1), (1, 5), (2, 9), (3, 3), (3, 10), (7, 7), (7, 20),
                                 (64, 17), (1000, 1), (2**31 - 1, 13)])
def test_indices_match_reference_for_random_ids(m, k):
    shape = Shape.from_km(k, m)
    rng = random.Random(m * 31 + k)
    for _ in range(2000):
        pid = rng.randrange(-(2**63), 2**63)
        assert bloom.indices(shape, pid) == commons_indices(m, k, pid)


def test_enhanced_double_hasher_vector_from_commons():
    # commons-collections 4.5.0's EnhancedDoubleHasherTest: EnhancedDoubleHasher(1, 1), Shape.fromKM(17, 72).
    # (4.5.0-M1's loop, which kmem 0.1 ran, gave 1, 0, 71, 71, 1, 6, ...)
    assert bloom.hasher_indices(Shape.from_km(17, 72), 1, 1) == [
        1, 0, 0, 2, 7, 16, 30, 50, 5, 40, 12, 66, 59, 64, 10, 42, 17]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 64, 1024])
def test_one_bit_filters_never_leave_the_bitmap(k):
    # commons 4.5.0 sends m = 1 indices out of range from the fourth on; kmem keeps every index 0.
    shape = Shape.from_km(k, 1)
    ids = np.random.default_rng(k).integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)
    assert all(bloom.indices(shape, int(pid)) == [0] * k for pid in ids)
    bf = BloomFilter(shape)
    bf.add_many(ids)
    assert bf.as_bitmap_array().tolist() == [1]


def test_hasher_takes_java_longs_as_unsigned():
    shape = Shape.from_km(5, 1001)
    assert bloom.hasher_indices(shape, -1, -7) == bloom.hasher_indices(shape, 2**64 - 1, 2**64 - 7)


# --- Shape ---------------------------------------------------------------------------------------------

def test_shape_factories_match_commons_test_values():
    # Values from commons-collections' shape tests (computed there with hur.st's calculator).
    s = Shape.from_nm(5, 24)
    assert (s.number_of_bits, s.number_of_hash_functions) == (24, 3)
    assert s.probability(5) == pytest.approx(0.100375138, abs=1e-6)
    assert Shape.from_nmk(5, 24, 4).probability(5) == pytest.approx(0.102194782, abs=1e-6)
    s = Shape.from_pmk(0.1, 24, 3)
    assert (s.number_of_bits, s.number_of_hash_functions) == (24, 3)
    s = Shape.from_np(5, 0.1)
    assert (s.number_of_bits, s.number_of_hash_functions) == (24, 3)


@pytest.mark.parametrize("n,p", [(1_000_000, 0.01), (1000, 0.001), (7, 0.5), (123_456, 1e-6)])
def test_from_np_follows_the_formulas(n, p):
    s = Shape.from_np(n, p)
    m = math.ceil(n * math.log(p) / math.log(1 / 2 ** math.log(2)))
    assert s.number_of_bits == m
    assert s.number_of_hash_functions == max(1, math.floor(math.log(2) * m / n + 0.5))
    assert s.probability(n) == pytest.approx(p, rel=0.2)


def test_estimates():
    s = Shape.from_np(1000, 0.01)
    m, k = s.number_of_bits, s.number_of_hash_functions
    assert s.probability(0) == 0
    assert s.estimate_max_n() == pytest.approx(m * math.log(2) / k)
    assert s.estimate_n(0) == 0
    assert s.estimate_n(m) == math.inf
    assert math.isnan(s.estimate_n(m + 1))
    c = m // 3
    assert s.estimate_n(c) == pytest.approx(-(m / k) * math.log(1 - c / m))
    # estimate_n(c) reaches estimate_max_n() at c = m / 2 (is_saturated uses that exact integer form)
    assert s.estimate_n(m / 2) == pytest.approx(s.estimate_max_n(), rel=1e-12)
    assert s.estimate_n(m // 2 + 1) > s.estimate_max_n() > s.estimate_n(m // 2 - 1)


@pytest.mark.parametrize("call", [
    lambda: Shape.from_nm(0, 24), lambda: Shape.from_nmk(0, 24, 5), lambda: Shape.from_np(0, 0.02),
    lambda: Shape.from_nm(5, 0), lambda: Shape.from_nmk(5, 0, 7), lambda: Shape.from_pmk(0.035, 0, 7),
    lambda: Shape.from_nmk(5, 26, 0), lambda: Shape.from_pmk(0.35, 26, 0), lambda: Shape.from_km(0, 10),
    lambda: Shape.from_nmk(4000, 8, 1),                  # calculated probability >= 1
    lambda: Shape.from_np(10, 0.0), lambda: Shape.from_np(10, 1.0), lambda: Shape.from_np(10, float("nan")),
    lambda: Shape.from_np(2**31 - 1, 0.1),               # more than Integer.MAX_VALUE bits
    lambda: Shape.from_nm(1000, 10),                     # k rounds to 0: filter too small
    lambda: Shape.from_km(2, 2**31),                     # m does not fit a Java int
    lambda: Shape.from_km(1.5, 10),
    lambda: Shape.from_np(10, 0.1).probability(-1),
])
def test_invalid_shapes_are_rejected_as_commons_rejects_them(call):
    with pytest.raises(InvalidArgumentError):
        call()


# --- filters -------------------------------------------------------------------------------------------

def test_bits_are_the_indices_in_commons_bitmap_layout():
    shape = Shape.from_np(100, 0.01)
    bf = BloomFilter(shape)
    pids = [3, -3, 2**62, -(2**63)]
    for pid in pids:
        bf.add(pid)
    expected = np.zeros((shape.number_of_bits + 63) // 64, np.uint64)
    for pid in pids:
        for i in commons_indices(shape.number_of_bits, shape.number_of_hash_functions, pid):
            expected[i >> 6] |= np.uint64(1) << np.uint64(i & 63)
    assert np.array_equal(bf.as_bitmap_array().view(np.uint64), expected)
    assert bf.cardinality() == sum(int(w).bit_count() for w in expected)


@settings(max_examples=60, deadline=None)
@given(st.lists(INT64, max_size=300), st.integers(1, 5000), st.integers(1, 12))
def test_no_false_negatives(pids, m, k):
    bf = BloomFilter(Shape.from_km(k, m))
    batch = BloomFilter(Shape.from_km(k, m))
    for pid in pids:
        bf.add(pid)
    batch.add_many(np.array(pids, np.int64))
    assert all(pid in bf for pid in pids)
    assert bf.contains_many(np.array(pids, np.int64)).all()
    assert np.array_equal(bf.as_bitmap_array(), batch.as_bitmap_array())


def test_false_positive_rate_is_the_shapes():
    n = 1_000_000
    shape = Shape.from_np(n, 0.01)
    rng = np.random.default_rng(11)
    ids = rng.integers(-(2**63), 2**63 - 1, 2 * n, dtype=np.int64, endpoint=True)
    ids = np.unique(ids)[: 2 * n - 1000]
    rng.shuffle(ids)
    present, absent = ids[:n], ids[n:2 * n - 1000]
    bf = BloomFilter(shape)
    bf.add_many(present)
    assert bf.contains_many(present).all()
    rate = bf.contains_many(absent).mean()
    assert rate == pytest.approx(shape.probability(n), rel=0.10)


def test_batch_accepts_int64_uint64_and_other_integer_arrays():
    bf = BloomFilter(Shape.from_np(1000, 0.01))
    bf.add_many(np.array([-1, 5], np.int64))
    assert bf.contains_many(np.array([2**64 - 1, 5], np.uint64)).all()     # same 64 bits as -1
    assert bf.contains_many(np.array([5], np.int32)).all()
    assert bf.contains_many([-1, 5]).tolist() == [True, True]
    assert bf.contains_many(np.array([], np.int64)).shape == (0,)
    assert bf.contains_many(np.arange(0, 20, dtype=np.int64)[::4]).dtype == np.bool_
    with pytest.raises(InvalidArgumentError):
        bf.add_many(np.array([1.5]))


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, "7", None, 1.0])
def test_bad_single_ids_are_rejected(bad):
    bf = BloomFilter(Shape.from_np(10, 0.1))
    with pytest.raises(InvalidArgumentError):
        bf.add(bad)
    with pytest.raises(InvalidArgumentError):
        bad in bf    # noqa: B015


def test_merge_copy_clear_estimate_and_saturation():
    shape = Shape.from_np(1000, 0.01)
    a, b = BloomFilter(shape), BloomFilter(shape)
    a.add_many(np.arange(0, 300))
    b.add_many(np.arange(300, 600))
    c = a.copy()
    c.merge(b)
    assert c.contains_many(np.arange(600)).all()
    assert a.contains_many(np.arange(300, 600)).mean() < 0.1          # the copy did not share bits
    assert abs(c.estimate_n() - 600) < 30
    assert not c.is_saturated()
    c.add_many(np.arange(600, 1100))        # past estimate_max_n() = m ln 2 / k ~ 949 ids
    assert c.is_saturated()
    assert c.cardinality() >= shape.number_of_bits / 2
    c.clear()
    assert c.cardinality() == 0 and 5 not in c
    with pytest.raises(InvalidArgumentError):
        c.merge(BloomFilter(Shape.from_np(1000, 0.02)))
    full = BloomFilter(Shape.from_km(1, 3))
    full.add_many(np.arange(100))
    assert full.is_full()
    with pytest.raises(IllegalStateError):
        full.estimate_n()


def test_batch_calls_release_the_gil():
    bf = BloomFilter(Shape.from_np(2_000_000, 0.01))
    ids = np.arange(2_000_000, dtype=np.int64)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        before = len(ticks)
        for _ in range(5):
            bf.add_many(ids)
        during = len(ticks) - before
    finally:
        stop.set()
        t.join()
    assert during > 100


# --- the .bloom sidecar --------------------------------------------------------------------------------

def test_sidecar_layout_field_by_field(tmp_path):
    shape = Shape.from_km(3, 130)
    bf = BloomFilter(shape)
    pids = [1, 2, 3, -99]
    for pid in pids:
        bf.add(pid)
    path = tmp_path / "00000000000000000042.snapshot.bloom"
    bf.write(path)
    data = path.read_bytes()
    assert len(data) == 4 + 4 + 3 * 8
    assert struct.unpack_from(">i", data, 0) == (130,)
    assert struct.unpack_from(">i", data, 4) == (3,)
    longs = struct.unpack_from(">3q", data, 8)
    expected = [0, 0, 0]
    for pid in pids:
        for i in commons_indices(130, 3, pid):
            expected[i >> 6] |= 1 << (i & 63)
    assert [v & MASK64 for v in longs] == expected
    assert bf.to_bytes() == data


def test_round_trip_read_and_mmap(tmp_path):
    shape = Shape.from_np(10_000, 0.01)
    bf = BloomFilter(shape)
    ids = np.random.default_rng(3).integers(-(2**63), 2**63 - 1, 10_000, dtype=np.int64)
    bf.add_many(ids)
    path = tmp_path / "f.bloom"
    bf.write(path, fsync=True)

    loaded = BloomFilter.read(path)
    assert loaded.shape == shape
    assert np.array_equal(loaded.as_bitmap_array(), bf.as_bitmap_array())
    loaded.add(12345)                                  # heap copy is writable

    with BloomFilter.open(path) as mapped:
        assert mapped.shape == shape
        assert mapped.contains_many(ids).all()
        assert all(int(pid) in mapped for pid in ids[:100])
        assert mapped.cardinality() == bf.cardinality()
        with pytest.raises(IllegalStateError):
            mapped.add(1)
        with pytest.raises(IllegalStateError):
            mapped.add_many(ids[:3])
        with pytest.raises(IllegalStateError):
            mapped.clear()
        heap = mapped.copy()
        heap.add(1)
    with pytest.raises(IllegalStateError):
        1 in mapped     # noqa: B015
    assert 1 in heap


CLOSE_DURING_QUERY = """
import sys, threading
import numpy as np
from kmem.bloom import BloomFilter, Shape
from kmem.errors import IllegalStateError
BloomFilter(Shape.from_km(7, 1 << 20)).write(sys.argv[1])
mapped = BloomFilter.open(sys.argv[1])
keys = np.arange(2_000_000, dtype=np.int64)
started, stop = threading.Event(), threading.Event()
def query():
    while not stop.is_set():
        mapped.contains_many(keys)
        started.set()
thread = threading.Thread(target=query)
thread.start()
started.wait()
refused = 0
while True:
    try:
        mapped.close()
        break
    except IllegalStateError:
        refused += 1
        stop.set()
thread.join()
try:
    mapped.contains_many(keys)
except IllegalStateError:
    print(refused, "closed")
"""


def test_close_during_a_query_is_refused_not_a_crash(tmp_path):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", CLOSE_DURING_QUERY, str(tmp_path / "f.bloom")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]      # was SIGSEGV: the map went under a GIL-free loop
    refused, state = done.stdout.split()
    assert int(refused) >= 1 and state == "closed"        # refused while the query ran, closed after it


def sidecar_bytes(m=100, k=3, pids=(1, 2)):
    bf = BloomFilter(Shape.from_km(k, m))
    for pid in pids:
        bf.add(pid)
    return bf.to_bytes()


@pytest.mark.parametrize("data,message", [
    (b"", "truncated"),
    (b"\x00\x00\x00\x64\x00\x00", "truncated"),
    (sidecar_bytes()[:-1], "expected"),
    (sidecar_bytes() + b"\x00", "expected"),
    (struct.pack(">ii", 0, 3), "impossible shape"),
    (struct.pack(">ii", 64, -1) + bytes(8), "impossible shape"),
    (struct.pack(">ii", 64, 5000) + bytes(8), "hash functions"),
    (struct.pack(">ii", 10, 2) + struct.pack(">q", 1 << 10), "beyond"),
])
def test_corrupt_sidecars_raise_naming_the_file(tmp_path, data, message):
    path = tmp_path / "00000000000000000007.snapshot.bloom"
    path.write_bytes(data)
    for load in (BloomFilter.read, BloomFilter.open):
        with pytest.raises(CorruptSnapshotError, match=message) as info:
            load(path)
        assert str(path) in str(info.value)


HEADER_INTS = st.one_of(st.sampled_from([0, 1, 63, 64, 65, 1024, 1025, 2**31 - 1, -1, -(2**31)]),
                       st.integers(-(2**31), 2**31 - 1))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_sidecar_readers(data):
    """Mutated sidecars, through all three readers: a filter or CorruptSnapshotError, memory bounded."""
    pids = data.draw(st.lists(INT64, max_size=10))
    raw = bytearray(sidecar_bytes(m=data.draw(st.integers(1, 300)), k=data.draw(st.integers(1, 8)), pids=pids))
    if data.draw(st.booleans()):                     # a header field replaced, e.g. m claiming 2^31 bits
        struct.pack_into(">i", raw, data.draw(st.sampled_from([0, 4])), data.draw(HEADER_INTS))
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    blob = bytes(raw[:cut]) + data.draw(st.binary(max_size=4))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "00000000000000000009.snapshot.bloom")
        with open(path, "wb") as f:
            f.write(blob)
        readers = [lambda: BloomFilter.from_bytes(blob, path), lambda: BloomFilter.read(path),
                   lambda: BloomFilter.open(path)]
        for load in readers:
            tracemalloc.start()
            try:
                with load() as bf:
                    assert bf.to_bytes() == blob
                    bf.contains_many(np.array(pids + [0], np.int64))
                    assert 0 <= bf.cardinality() <= bf.shape.number_of_bits
            except CorruptSnapshotError as e:
                assert path in str(e)
            finally:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            assert peak < 64 * 1024 + 4 * len(blob)      # nothing sized by the header's claims
