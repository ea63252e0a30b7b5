"""kmem.bloom against the real commons-collections 4.5.0 and commons-codec jars, in the Spark JVM.

tests/java/CommonsBloomProbe.java is compiled inside that JVM (its javac tool) and called through py4j once
per shape for all ids: hashes, index order, bitmaps and membership both ways are commons' own answers.
"""
import os

import numpy as np
import pytest
from pyspark.errors import IllegalArgumentException

from kmem import bloom
from kmem.bloom import BloomFilter, Shape


PROBE_SOURCE = os.path.join(os.path.dirname(__file__), "java", "CommonsBloomProbe.java")
COLLECTIONS_JAR = "commons-collections4-4.5.0.jar"

IDS = np.concatenate([
    np.array([0, 1, -1, 2**63 - 1, -(2**63)], np.int64),
    np.random.default_rng(1044).integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64, endpoint=True),
])
KEYS = IDS.astype(">i8").tobytes()     # kmem's key: the id's 8 big-endian bytes

SHAPES = [
    Shape.from_np(3000, 0.01),      # the ledger's kind of shape
    Shape.from_km(3, 1000),         # issue 12's example: commons gives [539, 881, 224] for id 0
    Shape.from_km(17, 72),
    Shape.from_km(1, 64),
    Shape.from_km(5, 1 << 20),      # far from full with all the ids
    Shape.from_km(7, 7),            # k = m: commons' k >= m loop
    Shape.from_km(20, 7),           # k > m: the counter restarts every m indices
    Shape.from_km(9, 2),
    Shape.from_km(3, 1),            # m = 1 is in range in commons up to k = 3
]
HUGE = Shape.from_km(13, 2**31 - 1)     # indices only: commons' bitmap would be 256 MiB


def class_jar(jvm, name):
    """The path of the jar the JVM loaded class ``name`` from."""
    location = jvm.java.lang.Class.forName(name).getProtectionDomain().getCodeSource().getLocation()
    return jvm.java.io.File(location.toURI()).getPath()


@pytest.fixture(scope="module")
def probe(spark, tmp_path_factory):
    jvm = spark._jvm
    gateway = spark.sparkContext._gateway
    collections = class_jar(jvm, "org.apache.commons.collections4.bloomfilter.EnhancedDoubleHasher")
    codec = class_jar(jvm, "org.apache.commons.codec.digest.MurmurHash3")
    assert os.path.basename(collections) == COLLECTIONS_JAR, collections
    compiler = jvm.java.util.spi.ToolProvider.findFirst("javac")
    if not compiler.isPresent():
        pytest.skip("the Spark JVM is a JRE: no Java compiler for the commons probe")
    classes = tmp_path_factory.mktemp("probe")
    args = ["-d", str(classes), "-cp", os.pathsep.join([collections, codec]), PROBE_SOURCE]
    java_args = gateway.new_array(jvm.java.lang.String, len(args))
    for i, arg in enumerate(args):
        java_args[i] = arg
    diagnostics = jvm.java.io.StringWriter()
    printer = jvm.java.io.PrintWriter(diagnostics)
    assert compiler.get().run(printer, printer, java_args) == 0, diagnostics.toString()
    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(classes)).toURI().toURL()
    loader = jvm.java.net.URLClassLoader(urls, jvm.java.lang.Thread.currentThread().getContextClassLoader())
    probe_class = loader.loadClass("CommonsBloomProbe")
    return probe_class.getDeclaredConstructor(gateway.new_array(jvm.java.lang.Class, 0)).newInstance(
        gateway.new_array(jvm.java.lang.Object, 0))


def java_indices(probe, shape):
    k, m = shape.number_of_hash_functions, shape.number_of_bits
    return np.frombuffer(bytes(probe.indices(k, m, KEYS)), ">i4").reshape(len(IDS), k)


def kmem_indices(shape):
    return np.array([bloom.indices(shape, int(pid)) for pid in IDS], np.int64)


def test_murmur_halves_are_commons_codecs(probe):
    java = np.frombuffer(bytes(probe.hashes(KEYS)), ">u8").reshape(len(IDS), 2)
    assert java.tolist() == [list(bloom.pid_hash(int(pid))) for pid in IDS]


@pytest.mark.parametrize("shape", SHAPES + [HUGE], ids=str)
def test_indices_are_commons_in_order(probe, shape):
    assert np.array_equal(kmem_indices(shape), java_indices(probe, shape))


def test_issue_example_and_commons_test_vector():
    # commons 4.5.0 for id 0 in Shape.fromKM(3, 1000) (found by the test above), and its own
    # EnhancedDoubleHasherTest vector for EnhancedDoubleHasher(1, 1) over Shape.fromKM(17, 72).
    assert bloom.indices(Shape.from_km(3, 1000), 0) == [539, 881, 224]
    assert bloom.hasher_indices(Shape.from_km(17, 72), 1, 1) == [
        1, 0, 0, 2, 7, 16, 30, 50, 5, 40, 12, 66, 59, 64, 10, 42, 17]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bitmaps_and_membership_both_ways(probe, shape, tmp_path):
    k, m = shape.number_of_hash_functions, shape.number_of_bits
    ids = IDS[:max(1, min(len(IDS), int(shape.estimate_max_n())))]     # about half the bits set
    keys = KEYS[:8 * len(ids)]
    ours = BloomFilter(shape)
    ours.add_many(ids)
    theirs = bytes(probe.bitmap(k, m, keys))
    assert np.array_equal(ours.as_bitmap_array(), np.frombuffer(theirs, ">i8"))

    # Java's filter, stored as a sidecar, read by kmem: every id is found.
    path = tmp_path / "00000000000000000000.snapshot.bloom"
    path.write_bytes(m.to_bytes(4, "big") + k.to_bytes(4, "big") + theirs)
    with BloomFilter.open(path) as mapped:
        assert mapped.contains_many(ids).all()
        assert all(int(pid) in mapped for pid in ids[:200])

    # kmem's filter, loaded into a SimpleBloomFilter: commons finds every id.
    found = np.frombuffer(bytes(probe.contains(k, m, ours.to_bytes()[8:], keys)), np.uint8)
    assert found.all()


def test_one_bit_filters_stay_in_range_where_commons_does_not(probe):
    # For m = 1 commons' counter starts at m and never restarts: from the fourth index on it leaves the
    # bitmap (its filters throw). kmem agrees on the indices commons keeps in range and sets only bit 0.
    shape = Shape.from_km(6, 1)
    java, ours = java_indices(probe, shape), kmem_indices(shape)
    assert java.max() >= 1                       # commons' out-of-range indices
    with pytest.raises(IllegalArgumentException, match="range"):       # and its filters refuse them
        probe.bitmap(6, 1, KEYS[:8])
    assert np.array_equal(ours[:, :3], java[:, :3])
    assert not ours.any()
    bf = BloomFilter(shape)
    bf.add_many(IDS)
    assert bf.as_bitmap_array().tolist() == [1]
