"""The ledger's compiled parts: LedgerCore's read path against a Python model, LedgerLock, the flush's
id order and snapshot writer, and the searches' bounds."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from snapshot_files import crc32c_reference, kafka_snapshot
from thread_helpers import run_racing, switching_often

from kmem import _core
from kmem.bloom import BloomFilter, Shape
from kmem.errors import IllegalStateError, InvalidArgumentError
from kmem.ledger import ENTRY_DTYPE, PidLedger, ProducerEntry, snapshot_name, write_snapshot
from kmem.ledger.snapshot import kafka_view

NOW = 1_700_000_000_000
DAY = 86_400_000
INT64 = st.integers(-2**63, 2**63 - 1)


class Clock:
    def __init__(self, now=NOW):
        self.now = now

    def __call__(self):
        return self.now


def expired(entry, now, expiration=DAY):
    """Kafka's rule in Python integers: no open transaction and producer_id_expiration_ms past its timestamp."""
    return entry.current_txn_first_offset < 0 and now - entry.timestamp >= expiration


# --- LedgerCore.read (active table, sealing tables, Bloom filters, snapshot preads, expiry) vs a model -----

ENTRIES = st.builds(
    ProducerEntry, st.integers(-40, 40), st.integers(-2**15, 2**15 - 1), st.integers(-2**31, 2**31 - 1),
    st.one_of(st.just(-1), st.integers(0, 2**63 - 1)), st.integers(-2**31, 2**31 - 1),
    st.one_of(INT64, st.integers(NOW - 2 * DAY, NOW + DAY)), st.integers(-2**31, 2**31 - 1),
    st.one_of(st.just(-1), st.integers(0, 2**63 - 1)))


class CompiledReadModel(RuleBasedStateMachine):
    """Any mix of updates (any field values), flushes, clock moves, reopens and read-only opens: read()
    in the core answers as a dict of newest entries with Kafka's expiry rule, and as read_many (Python)."""

    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="kmem-ledger-core-")
        self.clock = Clock()
        self.ledger = self.open()
        self.model = {}

    def open(self, read_only=False):
        return PidLedger(self.directory, Shape.from_np(12, 0.01), clock_ms=self.clock, read_only=read_only)

    def forget_expired(self):
        """A flush writes no expired producer (Kafka's removeExpiredProducers): gone even if the clock goes back."""
        self.model = {pid: e for pid, e in self.model.items() if not expired(e, self.clock.now)}

    @rule(e=ENTRIES)
    def update(self, e):
        if self.ledger.read_only:
            with pytest.raises(IllegalStateError, match="read-only"):
                self.ledger.update(e)
            return
        flushes = self.ledger._sequence
        self.ledger.update(e)
        if self.ledger._sequence != flushes:        # the active file was full: flushed before the update
            self.forget_expired()
        self.model[e.producer_id] = kafka_view(e)

    @rule()
    def flush(self):
        if not self.ledger.read_only and self.ledger.flush() is not None:
            self.forget_expired()

    @rule(step=st.one_of(st.integers(0, 2 * DAY), st.sampled_from([2**62, -2**62, 2**70])))
    def move_clock(self, step):
        self.clock.now += step          # past int64 too: Python's arithmetic then decides

    @rule(read_only=st.booleans())
    def reopen(self, read_only):
        self.ledger.close()
        self.ledger = self.open(read_only)

    @rule(pid=st.integers(-45, 45))
    def read(self, pid):
        want = self.model.get(pid)
        if want is not None and expired(want, self.clock.now):
            want = None
        got = self.ledger.read(pid)
        assert got == want
        assert got is None or type(got) is ProducerEntry
        if -2**63 <= self.clock.now < 2**63:             # read_many's clock arithmetic is numpy's int64
            found, rows = self.ledger.read_many([pid])
            assert (ProducerEntry(*rows.tolist()[0]) if found[0] else None) == want

    def teardown(self):
        self.ledger.close()
        shutil.rmtree(self.directory, ignore_errors=True)


TestCompiledReadModel = CompiledReadModel.TestCase
TestCompiledReadModel.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


def test_read_uses_the_wall_clock_unless_one_is_given(tmp_path):
    now = time.time_ns() // 1_000_000
    with PidLedger(tmp_path, producer_id_expiration_ms=DAY) as ledger:
        fresh = ProducerEntry(1, 0, 0, 5, 0, now, 0, -1)
        old = ProducerEntry(2, 0, 0, 5, 0, now - DAY - 60_000, 0, -1)
        ledger.update(fresh)
        ledger.update(old)
        assert (ledger.read(1), ledger.read(2)) == (fresh, None)
        ledger.flush()
        assert (ledger.read(1), ledger.read(2)) == (fresh, None)    # from the snapshot, same rule


def test_read_checks_ids_and_a_clock_that_is_not_an_int(tmp_path):
    clock = Clock(float(NOW + DAY))
    with PidLedger(tmp_path, clock_ms=clock) as ledger:
        ledger.update(ProducerEntry(1, 0, 0, 5, 0, NOW, 0, -1))
        assert ledger.read(1) is None                              # a float clock: Python arithmetic
        clock.now = NOW + DAY - 0.5
        assert ledger.read(np.int32(1)).producer_id == 1           # numpy integers are ids
        for bad in (2**63, -2**63 - 1, 1.0, "1", None, True):
            with pytest.raises(InvalidArgumentError, match="64-bit"):
                ledger.read(bad)


def test_readers_see_each_acknowledged_update_through_flushes(tmp_path):
    # Writers bump versions (last_offset) while a flusher seals active files: a read never returns a
    # version older than one whose update returned before the read began, nor misses an id.
    ledger = PidLedger(tmp_path, Shape.from_np(300, 0.01), clock_ms=Clock())
    acknowledged = np.zeros(400, np.int64)
    for pid in range(400):
        ledger.update(ProducerEntry(pid, 0, 0, 0, 0, NOW, 0, -1))
    done = threading.Event()
    errors = []

    def writer(first):
        try:
            for version in range(1, 60):
                for pid in range(first, 400, 2):
                    ledger.update(ProducerEntry(pid, 0, 0, version, 0, NOW, 0, -1))
                    acknowledged[pid] = version
        except Exception as e:     # noqa: BLE001 - surface any error from the thread
            errors.append(e)

    def reader(seed):
        rng = np.random.default_rng(seed)
        try:
            while not done.is_set():
                for pid in rng.integers(0, 400, 100).tolist():
                    floor = int(acknowledged[pid])
                    got = ledger.read(pid)
                    assert got is not None and got.last_offset >= floor, (pid, got, floor)
        except Exception as e:     # noqa: BLE001
            errors.append(e)

    def flusher():
        while not done.is_set():
            ledger.flush()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    others = [threading.Thread(target=reader, args=(i,)) for i in range(2)] + [threading.Thread(target=flusher)]
    with switching_often(1e-5):
        try:
            for t in threads + others:
                t.start()
            for t in threads:
                t.join()
        finally:
            done.set()
            for t in others:
                t.join()
    assert errors == []
    assert ledger._sequence > 3                 # active files flushed (by the flusher or when full)
    assert [ledger.read(pid).last_offset for pid in range(400)] == [59] * 400
    ledger.close()


# --- LedgerLock -------------------------------------------------------------------------------------------

def test_ledger_lock_is_a_mutex_with_lock_semantics():
    lock = _core.LedgerLock()
    assert lock.acquire() and lock.locked()
    assert not lock.acquire(blocking=False)
    taken = []
    other = threading.Thread(target=lambda: taken.append(lock.acquire(blocking=False)))
    other.start()
    other.join()
    assert taken == [False]
    refused = []

    def release_elsewhere():
        try:
            lock.release()
        except IllegalStateError as e:
            refused.append(str(e))

    stranger = threading.Thread(target=release_elsewhere)     # only the holder releases it
    stranger.start()
    stranger.join()
    assert refused and "does not hold" in refused[0] and lock.locked()
    lock.release()
    with pytest.raises(IllegalStateError, match="does not hold"):
        lock.release()
    assert not lock.locked()
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_ledger_lock_waiting_lets_the_holder_run():
    # A waiter blocks with the GIL released: the holder, which needs the GIL to finish, gets it.
    lock, counter = _core.LedgerLock(), [0]

    def work():
        for _ in range(20_000):
            with lock:
                value = counter[0]
                counter[0] = value + 1

    run_racing(work, work, work, work)
    assert counter[0] == 80_000


# --- the flush: id order and the snapshot writer ----------------------------------------------------------

def entries_with_ids(ids):
    array = np.zeros(len(ids), ENTRY_DTYPE)
    array["producer_id"] = ids
    array["last_offset"] = np.arange(len(ids))
    array["timestamp"] = np.arange(len(ids)) * 7 - 3
    array["current_txn_first_offset"] = -1
    return array


@settings(max_examples=200, deadline=None)
@given(st.lists(INT64, max_size=300), st.sampled_from(["as given", "sorted", "reversed", "high bytes shared"]))
def test_entries_id_order_is_a_stable_sort_and_finds_duplicates(ids, arrangement):
    ids = np.array(ids, np.int64)
    if arrangement == "sorted":
        ids = np.sort(ids)
    elif arrangement == "reversed":
        ids = np.sort(ids)[::-1]
    elif arrangement == "high bytes shared":
        ids = (ids & 0xFFFF) + (7 << 40)
    order, duplicate = _core.entries_id_order(entries_with_ids(ids).view(np.uint8))
    assert order.dtype == np.uint32
    assert order.tolist() == np.argsort(ids, kind="stable").tolist()
    repeated = np.unique(ids, return_counts=True)
    assert duplicate == (None if (repeated[1] < 2).all() else int(repeated[0][repeated[1] > 1].min()))


def test_entries_id_order_refuses_partial_entries():
    with pytest.raises(ValueError, match="whole entries"):
        _core.entries_id_order(np.zeros(47, np.uint8))
    order, duplicate = _core.entries_id_order(np.zeros(0, np.uint8))
    assert len(order) == 0 and duplicate is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(INT64, INT64, st.one_of(st.just(-1), INT64)), max_size=60, unique_by=lambda t: t[0]),
       st.booleans())
def test_write_snapshot_body_is_kafkas_layout_and_its_stats(tmp_path_factory, rows, sort):
    entries = [ProducerEntry(pid, 1, 2, 3, 4, timestamp, 5, txn) for pid, timestamp, txn in rows]
    array = np.array(entries, ENTRY_DTYPE) if entries else np.zeros(0, ENTRY_DTYPE)
    order = np.argsort(array["producer_id"], kind="stable").astype(np.uint32) if sort else None
    in_file = sorted(entries) if sort else entries
    path = tmp_path_factory.mktemp("body") / "s"
    with open(path, "wb") as f:
        f.write(b"\0" * 6)
        f.flush()
        crc, max_timestamp, open_transaction = _core.write_snapshot_body(f.fileno(), array.view(np.uint8), order)
    expected = kafka_snapshot(in_file)
    assert path.read_bytes()[6:] == expected[6:]
    assert crc == crc32c_reference(expected[6:])
    assert _core.write_snapshot_body(-1, array.view(np.uint8), order)[0] == crc    # -1: computed only
    assert max_timestamp == (max(t for _, t, _ in rows) if rows else None)
    assert open_transaction == any(txn >= 0 for _, _, txn in rows)


def test_write_snapshot_body_checks_its_arguments(tmp_path):
    raw = entries_with_ids([5, 1, 3]).view(np.uint8)
    with pytest.raises(ValueError, match="outside"):
        _core.write_snapshot_body(-1, raw, np.array([0, 1, 3], np.uint32))
    with pytest.raises(ValueError, match="one row per entry"):
        _core.write_snapshot_body(-1, raw, np.array([0, 1], np.uint32))
    with pytest.raises(ValueError, match="whole entries"):
        _core.write_snapshot_body(-1, raw[:-1])
    (tmp_path / "r").touch()
    read_only = os.open(tmp_path / "r", os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            _core.write_snapshot_body(read_only, raw)
    finally:
        os.close(read_only)


# --- the flush's merge: every producer of the sources in one snapshot, streamed -------------------------

@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc32c_combine_is_the_crc_of_the_concatenation(first, second):
    combined = _core.crc32c_combine(_core.crc32c(first), _core.crc32c(second), len(second))
    assert combined == crc32c_reference(first + second)


SOURCE = st.lists(st.tuples(st.integers(-30, 30), st.integers(NOW - 2 * DAY, NOW), st.sampled_from([-7, -1, 0, 5]),
                            st.sampled_from([-3, -1, 9])), max_size=25, unique_by=lambda t: t[0])


def merge_into(path, sources, expired_at, bloom, chunk, stride=4):
    """``SnapshotMerge`` fed ``sources`` (ENTRY_DTYPE arrays in id order, or with an id order) ``chunk``
    rows at a time; returns what ``finish`` does."""
    with open(path, "wb") as f:
        f.write(b"\0" * 6)
        f.flush()
        merge = _core.SnapshotMerge(f.fileno(), len(sources), bloom, expired_at, stride)
        runs = []
        for array, order in sources:
            if order is not None:                           # one run through the order
                runs.append(iter([(array.view(np.uint8), order)]))
            else:
                runs.append(iter([(array[i:i + chunk].view(np.uint8), None) for i in range(0, len(array), chunk)]))
        while (source := merge.run()) >= 0:
            merge.feed(source, *next(runs[source], (b"", None)))
        return merge.finish()


@settings(max_examples=80, deadline=None)
@given(st.lists(SOURCE, max_size=4), st.one_of(st.none(), st.integers(NOW - 2 * DAY, NOW)), st.integers(1, 5),
       st.lists(st.booleans(), min_size=4, max_size=4))
def test_snapshot_merge_writes_each_producers_newest_entry_as_kafka_reads_it(tmp_path_factory, sources, expired_at,
                                                                             chunk, ordered):
    arrays, newest = [], {}
    for rows, with_order in zip(sources, ordered):
        entries = [ProducerEntry(pid, len(arrays), 3, offset, 4, timestamp, 5, txn)
                   for pid, timestamp, offset, txn in rows]
        array = np.array(entries, ENTRY_DTYPE) if entries else np.zeros(0, ENTRY_DTYPE)
        if with_order:      # as it lies (a Kafka-ordered snapshot, the active file): read through its order
            arrays.append((array, np.argsort(array["producer_id"]).astype(np.uint32)))
        else:
            arrays.append((np.sort(array, order="producer_id"), None))
        for e in entries:
            newest.setdefault(e.producer_id, kafka_view(e))          # sources newest first: the first wins
    kept = sorted(e for e in newest.values()
                  if expired_at is None or e.current_txn_first_offset >= 0 or e.timestamp > expired_at)
    path = tmp_path_factory.mktemp("merge") / "s"
    bloom = BloomFilter(Shape.from_np(max(len(newest), 1), 0.01))
    count, crc, max_timestamp, open_transaction, fences = merge_into(path, arrays, expired_at, bloom, chunk)
    expected = kafka_snapshot(kept)
    assert path.read_bytes()[6:] == expected[6:] and crc == crc32c_reference(expected[6:]) and count == len(kept)
    assert max_timestamp == (max(e.timestamp for e in kept) if kept else None)
    assert open_transaction == any(e.current_txn_first_offset >= 0 for e in kept)
    assert fences.tolist() == [e.producer_id for e in kept[::4]]
    assert bloom.contains_many([e.producer_id for e in kept]).all()


def test_snapshot_merge_checks_its_sources_and_its_calls(tmp_path):
    bloom = BloomFilter(Shape.from_np(10, 0.01))
    unsorted = entries_with_ids([1, 5, 3])
    with pytest.raises(ValueError, match="increasing producer-id order"):
        merge_into(tmp_path / "a", [(unsorted, None)], None, bloom, 3)
    with pytest.raises(ValueError, match="increasing producer-id order"):       # also across runs
        merge_into(tmp_path / "b", [(entries_with_ids([1, 5, 3, 4]), None)], None, bloom, 2)
    with open(tmp_path / "c", "wb") as f:
        merge = _core.SnapshotMerge(f.fileno(), 2, bloom)
        with pytest.raises(ValueError, match="outside"):
            merge.feed(0, unsorted.view(np.uint8), np.array([0, 1, 3], np.uint32))
        with pytest.raises(ValueError, match="one row per entry"):
            merge.feed(0, unsorted.view(np.uint8), np.array([0, 1], np.uint32))
        with pytest.raises(ValueError, match="whole entries"):
            merge.feed(0, unsorted.view(np.uint8)[:-1])
        with pytest.raises(IndexError):
            merge.feed(2, b"")
        merge.feed(0, entries_with_ids([1, 2]).view(np.uint8))
        with pytest.raises(ValueError, match="not waiting"):        # its run is not used up yet
            merge.feed(0, b"")
        with pytest.raises(ValueError, match="has not ended"):
            merge.finish()
        assert merge.run() == 1
    with pytest.raises(IllegalStateError, match="read-only"):
        with BloomFilter.open(write_sidecar(tmp_path)) as mapped:
            _core.SnapshotMerge(-1, 1, mapped)
    read_only = os.open(tmp_path / "c", os.O_RDONLY)
    try:
        merge = _core.SnapshotMerge(read_only, 1, bloom)
        assert merge.run() == 0
        merge.feed(0, entries_with_ids([1]).view(np.uint8))
        assert merge.run() == 0
        merge.feed(0, b"")
        with pytest.raises(OSError, match="writing a snapshot failed"):
            merge.run()
    finally:
        os.close(read_only)


def write_sidecar(directory):
    path = directory / "x.bloom"
    BloomFilter(Shape.from_np(10, 0.01)).write(path)
    return path


# --- bounds of the searches and tables --------------------------------------------------------------------

def test_fenced_search_below_the_first_id_reads_nothing_before_the_entries(tmp_path):
    # The entries' header sits at the start of a page whose preceding page is inaccessible: a read of
    # "row -1" (46 bytes before the entries) crashes the child. The search once did that for an id below
    # the first fence.
    child = textwrap.dedent("""
        import ctypes, mmap, sys
        import numpy as np
        from kmem import _core
        from kmem.ledger.snapshot import ENTRY_DTYPE
        page = mmap.PAGESIZE
        area = mmap.mmap(-1, 8 * page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(area))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(base, page, 0) == 0          # PROT_NONE
        entries = np.zeros(300, ENTRY_DTYPE)
        entries["producer_id"] = np.arange(100, 400)
        data = memoryview(area)[page:]
        data[10:10 + entries.nbytes] = entries.tobytes()
        fences = _core.snapshot_fences(data, 300, 128)
        print(_core.snapshot_search(data, 300, 5, None, fences, 128), _core.snapshot_search(data, 300, 250, None, fences, 128))
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-1", "150"]


def test_a_row_table_keeps_its_identity_when_its_file_grows(tmp_path):
    small = bytearray(10 + 46 * 4)
    table = _core.RowTable(4)
    table.bind(small, True)
    for pid in (7, -3, 2**62):
        assert table.put(ProducerEntry(pid, 0, 0, pid & 0xFFFF, 0, 0, 0, -1)) >= 0
    large = bytearray(small) + bytearray(46 * 1000)
    table.bind(large, True)                      # new slots for 1004 rows; the three rows found again
    assert [table.find(pid) for pid in (7, -3, 2**62, 8)] == [0, 1, 2, -1]
    table.set_limit(1004)
    for pid in range(100, 1100):
        assert table.put(ProducerEntry(pid, 0, 0, 1, 0, 0, 0, -1)) >= 0
    assert table.size == 1003
    assert table.get(555, ProducerEntry).producer_id == 555
    with pytest.raises(TypeError, match="tuple class"):
        table.get(555, dict)


def test_sorted_snapshot_index_reads_through_its_kept_descriptor_and_refuses_use_after_close(tmp_path):
    path = tmp_path / snapshot_name(3)
    write_snapshot(path, [ProducerEntry(1, 0, 0, 2, 0, NOW, 0, -1)])
    data = np.frombuffer(path.read_bytes(), np.uint8)
    index = _core.SnapshotIndex(path, 1, _core.snapshot_fences(data, 1, 128), 128)
    assert index.find(1, ProducerEntry).last_offset == 2 and index.find(0, ProducerEntry) is None
    os.unlink(path)                                  # the descriptor kept since the search still reads the file
    assert index.find(1, ProducerEntry).last_offset == 2
    index.retire()                                   # deleted by retention: the descriptor goes, nothing is found
    assert index.find(1, ProducerEntry) is None
    assert index.find(0, ProducerEntry) is None      # below the first id: answered without the file
    write_snapshot(path, [ProducerEntry(1, 0, 0, 2, 0, NOW, 0, -1)])
    fresh = _core.SnapshotIndex(path, 1, _core.snapshot_fences(data, 1, 128), 128)
    limit = _core.open_snapshots()[1]
    _core.set_open_snapshots_limit(0)                # none kept: each search opens the file, gone for it too
    try:
        os.unlink(path)
        with pytest.raises(FileNotFoundError, match=snapshot_name(3)):
            fresh.find(1, ProducerEntry)
    finally:
        _core.set_open_snapshots_limit(limit)
    fresh.close()
    index.close()
    with pytest.raises(IllegalStateError, match="closed"):
        index.find(1, ProducerEntry)
    with pytest.raises(ValueError, match="NUL"):
        _core.SnapshotIndex(str(path) + "\0", 1, _core.snapshot_fences(data, 1, 128), 128)


class Holder:
    """A snapshot for ReadPath that holds ``pids`` and records which ids it was asked for."""

    def __init__(self, number, pids, asked):
        self.number, self.pids, self.asked = number, set(pids), asked

    def find(self, pid):
        self.asked.append(self.number)
        return ProducerEntry(pid, 0, 0, self.number, 0, NOW, 0, -1) if pid in self.pids else None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 9), st.lists(INT64, max_size=40)), max_size=12),
       st.lists(INT64, min_size=1, max_size=20))
def test_read_path_asks_the_snapshots_whose_filters_may_hold_the_id_newest_first(specs, queries):
    # Filters of mixed shapes (Kafka-adopted snapshots get their own): each is tested with its own
    # indices, and snapshots are asked in order until one holds the id.
    from kmem.bloom import BloomFilter
    asked, filters, snapshots = [], [], []
    for number, (m, k, pids) in enumerate(specs):
        bloom = BloomFilter(Shape.from_km(k, m))
        bloom.add_many(np.array(pids, np.int64))
        filters.append(bloom)
        snapshots.append(Holder(number, pids, asked))
    core = _core.LedgerCore(ProducerEntry, None, int, DAY, Clock())
    with core.lock:
        core.publish(None, _core.ReadPath((), filters, snapshots))
    for pid in queries + [p for _, _, pids in specs for p in pids[:3]]:
        asked.clear()
        holders = [n for n, (_, _, pids) in enumerate(specs) if pid in pids]
        maybe = [n for n, bloom in enumerate(filters) if pid in bloom]
        got = core.read(pid)
        assert got == (ProducerEntry(pid, 0, 0, holders[0], 0, NOW, 0, -1) if holders else None)
        assert asked == (maybe[:maybe.index(holders[0]) + 1] if holders else maybe)
    with pytest.raises(ValueError, match="one filter per snapshot"):
        _core.ReadPath((), filters, snapshots + [None])


def test_update_many_stores_entries_as_kafka_reads_them_and_names_the_first_refused(tmp_path):
    array = entries_with_ids([1, 2, 3])
    array["last_sequence"] = 7
    array["offset_delta"] = 4
    array["last_offset"][1] = -1                        # no batch: sequence -1, offset -1, delta 0
    with PidLedger(tmp_path, clock_ms=Clock(0)) as ledger:
        ledger.update_many(array)
        assert ledger.read(2) == ProducerEntry(2, 0, -1, -1, 0, 4, 0, -1)
        assert ledger.read(1) == ProducerEntry(1, 0, 7, 0, 4, -3, 0, -1)
        assert array["last_sequence"][1] == 7          # the caller's array is left as it was
        flushed = ledger.flush()
        assert ProducerEntry(2, 0, -1, -1, 0, 4, 0, -1) in [ProducerEntry(*r) for r in
                                                            np.frombuffer(open(flushed, "rb").read()[10:], ENTRY_DTYPE).tolist()]
        bad = entries_with_ids([4, 5, 6, 7])
        bad["current_txn_first_offset"][2] = -2
        bad["last_offset"][3] = -9
        with pytest.raises(InvalidArgumentError, match="last_offset must be at least -1: entry 3 has -9"):
            ledger.update_many(bad)
        bad["last_offset"][3] = 0
        with pytest.raises(InvalidArgumentError, match="current_txn_first_offset must be at least -1: entry 2"):
            ledger.update_many(bad)
        assert ledger.read(4) is None                  # nothing of a refused batch is written
    assert _core.entries_first_below(bad.view(np.uint8), 38, -1) == 2
    with pytest.raises(ValueError):
        _core.entries_first_below(bad.view(np.uint8), 40, -1)      # no int64 field fits there


def test_an_entry_class_with_its_own_len_runs_no_python_under_the_lock(tmp_path):
    # update checks an entry's size in C: a tuple subclass's __len__ (here one that reads the ledger,
    # which would wait forever for the lock update holds) is never called.
    with PidLedger(tmp_path, clock_ms=Clock()) as ledger:
        class Sneaky(tuple):
            def __len__(self):
                ledger.read(1)
                return 8

        stored = ledger.update(Sneaky((1, 0, 0, 5, 0, NOW, 0, -1)))
        assert stored == ProducerEntry(1, 0, 0, 5, 0, NOW, 0, -1)
        assert ledger.read(1) == stored


# --- FileMapping: a shared mapping that keeps no descriptor -------------------------------------------------

def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def test_a_file_mapping_keeps_no_descriptor_and_is_a_buffer(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 64)
    before = open_descriptors()
    with open(path, "r+b") as f:
        whole = _core.FileMapping(f.fileno())
        head = _core.FileMapping(f.fileno(), 4096, writable=True)
    assert open_descriptors() == before
    assert len(whole) == 16384 and len(head) == 4096 and not whole.writable and head.writable
    assert bytes(memoryview(whole)[250:258]) == bytes([250, 251, 252, 253, 254, 255, 0, 1])
    assert not np.frombuffer(whole, np.uint8).flags.writeable
    with pytest.raises(TypeError):
        memoryview(whole)[0] = 7
    with pytest.raises(BufferError):
        _core.RowTable(4).bind(whole, True)                 # asks for a writable buffer
    np.frombuffer(head, np.uint8)[:3] = [9, 8, 7]
    head.flush()
    assert path.read_bytes()[:4] == bytes([9, 8, 7, 3]) and memoryview(whole)[1] == 8   # one shared page
    os.unlink(path)
    assert memoryview(whole)[2] == 7                         # the mapping outlives the name
    head.close()
    whole.close()


def test_a_file_mapping_refuses_to_close_while_exported_and_any_use_after_close(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with open(path, "rb") as f:
        mapping = _core.FileMapping(f.fileno())
    rows = np.frombuffer(mapping, np.uint8)
    with pytest.raises(BufferError):
        mapping.close()
    assert rows[99] == ord("x") and not mapping.closed
    del rows
    mapping.close()
    mapping.close()                                          # twice: nothing more to do
    assert mapping.closed and "closed" in repr(mapping)
    for use in (lambda: memoryview(mapping), lambda: np.frombuffer(mapping, np.uint8), mapping.flush,
                lambda: mapping.madvise(0)):
        with pytest.raises(ValueError, match="closed"):
            use()


def test_a_file_mapping_checks_its_length_and_reports_system_errors(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    (tmp_path / "empty").write_bytes(b"")
    with open(path, "rb") as f, open(tmp_path / "empty", "rb") as empty:
        for length in (101, 0, -1):                          # past the end would be SIGBUS at the first load
            with pytest.raises(ValueError, match="cannot map"):
                _core.FileMapping(f.fileno(), length)
        with pytest.raises(ValueError, match="cannot map"):
            _core.FileMapping(empty.fileno())
        with pytest.raises(PermissionError):                 # opened read-only: no writable mapping
            _core.FileMapping(f.fileno(), writable=True)
        mapping = _core.FileMapping(f.fileno())
        closed = f.fileno()
    with pytest.raises(OSError):
        _core.FileMapping(closed)                            # a closed descriptor
    with pytest.raises(OSError):
        mapping.madvise(-1)                                  # no such advice
    assert len(memoryview(mapping)) == 100
    mapping.close()
