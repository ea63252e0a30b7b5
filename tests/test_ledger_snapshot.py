"""Kafka producer-state snapshot files: byte layout, Kafka's error cases, searching mapped entries."""
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmem import _core
from kmem.errors import CorruptSnapshotError, InvalidArgumentError
from snapshot_files import crc32c_reference, kafka_snapshot, random_entries, with_crc

from kmem.ledger import (
    ENTRY_DTYPE, ProducerEntry, Snapshot, read_snapshot, snapshot_name, snapshot_offset, verify_snapshot,
    write_snapshot,
)
from kmem.ledger.snapshot import entries_array


def test_crc_reference_check_value():
    assert crc32c_reference(b"123456789") == 0xE3069283


def test_names():
    assert snapshot_name(1234) == "00000000000000001234.snapshot"
    assert snapshot_offset("/x/00000000000000001234.snapshot") == 1234
    assert snapshot_offset("00000000000000001234.snapshot.bloom") is None
    assert snapshot_offset("1234.snapshot") is None
    with pytest.raises(InvalidArgumentError):
        snapshot_name(-1)


def test_written_file_layout_field_by_field(tmp_path):
    entries = random_entries(50, seed=1)
    path = tmp_path / snapshot_name(99)
    stats = write_snapshot(path, entries)
    data = path.read_bytes()
    assert len(data) == 10 + 46 * 50
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count) == (1, 50)
    assert crc == crc32c_reference(data[6:]) == stats.crc
    rows = [ProducerEntry(*struct.unpack_from(">qhiqiqiq", data, 10 + 46 * i)) for i in range(50)]
    assert rows == sorted(entries)           # kmem's files are sorted by producer id
    assert stats.max_timestamp == max(e.timestamp for e in entries)
    assert stats.open_transactions == any(e.current_txn_first_offset != -1 for e in entries)


def test_reads_kafka_written_unsorted_file(tmp_path):
    entries = random_entries(300, seed=2)
    path = tmp_path / snapshot_name(7)
    path.write_bytes(kafka_snapshot(entries))
    assert read_snapshot(path) == entries                # file order kept
    snap = Snapshot(path)
    assert not snap.sorted
    assert os.path.exists(str(path) + ".order")          # the sorted row order kmem built beside it
    assert path.read_bytes() == kafka_snapshot(entries)  # Kafka's file is not changed
    for e in entries:
        assert snap.find(e.producer_id) == e
    assert snap.find(2**50) is None
    again = Snapshot(path)                               # reuses the order file
    assert all(again.find(e.producer_id) == e for e in entries[:20])


def test_damaged_order_file_is_rebuilt(tmp_path):
    entries = random_entries(100, seed=3)
    path = tmp_path / snapshot_name(7)
    path.write_bytes(kafka_snapshot(entries))
    Snapshot(path)
    order = str(path) + ".order"
    with open(order, "r+b") as f:
        f.write(struct.pack("<I", 10_000))               # a row outside the file
    snap = Snapshot(path)
    assert all(snap.find(e.producer_id) == e for e in entries)


def test_kafka_error_cases_name_the_file(tmp_path):
    entries = random_entries(5)
    path = tmp_path / snapshot_name(3)
    path.write_bytes(kafka_snapshot(entries, version=2))
    for load in (read_snapshot, verify_snapshot, Snapshot):
        with pytest.raises(CorruptSnapshotError, match="unknown file version") as info:
            load(path)
        assert str(path) in str(info.value)
    data = bytearray(kafka_snapshot(entries))
    data[20] ^= 0x40
    path.write_bytes(bytes(data))
    for load in (read_snapshot, verify_snapshot, Snapshot):
        with pytest.raises(CorruptSnapshotError, match="CRC is no longer valid") as info:
            load(path)
        assert str(path) in str(info.value)
    for cut in (0, 5, 10 + 46 * 2 + 7):
        path.write_bytes(kafka_snapshot(entries)[:cut])
        with pytest.raises(CorruptSnapshotError, match="truncated"):
            verify_snapshot(path)


def test_empty_snapshot(tmp_path):
    path = tmp_path / snapshot_name(0)
    write_snapshot(path, [])
    assert path.read_bytes() == kafka_snapshot([])
    assert Snapshot(path).find(1) is None


def test_duplicate_ids_and_bad_values_are_rejected(tmp_path):
    e = random_entries(2)
    with pytest.raises(InvalidArgumentError, match="twice"):
        write_snapshot(tmp_path / "a", [e[0], e[1], e[0]])
    with pytest.raises(InvalidArgumentError):
        write_snapshot(tmp_path / "b", [e[0]._replace(epoch=2**15)])
    with pytest.raises(InvalidArgumentError):
        ProducerEntry(1, 2**16, 0, 0, 0, 0, 0).pack()


def test_foreign_arrays_out_of_range_are_refused_not_wrapped():
    fields = [(name, "<i8") for name in ENTRY_DTYPE.names]
    ok = np.zeros(2, [*fields[:1], ("epoch", "<i4"), *fields[2:]])
    ok["epoch"] = [1, 32767]
    assert list(entries_array(ok)["epoch"]) == [1, 32767]
    for name, dtype, value in [("epoch", "<i4", 40000), ("last_sequence", "<u8", 2**32 + 5),
                               ("offset_delta", "<i8", 2**31), ("last_offset", "<f8", 1.5)]:
        array = np.zeros(1, [(n, dtype if n == name else t) for n, t in fields])
        array[name] = value
        with pytest.raises(InvalidArgumentError, match=name):
            entries_array(array)


def mapped_paths():
    with open("/proc/self/maps") as maps:
        return [line.split(maxsplit=5)[5].strip() for line in maps if len(line.split(maxsplit=5)) == 6]


def test_snapshots_hold_a_descriptor_only_for_a_sorted_file_searched_until_closed(tmp_path):
    entries = random_entries(300, seed=9)
    write_snapshot(tmp_path / "s", entries)
    (tmp_path / "k").write_bytes(kafka_snapshot(entries))          # Kafka's order: searched mapped
    Snapshot(tmp_path / "k").close()                                # writes its row order (k.order)
    before = len(os.listdir("/proc/self/fd"))
    searched_by_read, mapped = Snapshot(tmp_path / "s"), Snapshot(tmp_path / "k")
    assert len(os.listdir("/proc/self/fd")) == before
    assert str(tmp_path / "s") not in mapped_paths()                # read with pread, not mapped
    assert str(tmp_path / "k") in mapped_paths() and str(tmp_path / "k.order") in mapped_paths()
    for snapshot, kept in ((searched_by_read, 1), (mapped, 0)):    # the sorted file's, for its next search
        assert all(snapshot.find(e.producer_id) == e for e in entries)
        found, rows = snapshot.find_many(np.array([e.producer_id for e in entries], np.int64))
        assert found.all() and [ProducerEntry(*row) for row in rows.tolist()] == entries
        assert sorted(ProducerEntry(*row) for row in snapshot.entries().tolist()) == sorted(entries)
        assert len(os.listdir("/proc/self/fd")) == before + kept
        snapshot.close()
        assert len(os.listdir("/proc/self/fd")) == before
    assert str(tmp_path / "k") not in mapped_paths() and str(tmp_path / "k.order") not in mapped_paths()


def test_a_retired_snapshot_deleted_under_a_reader_finds_nothing(tmp_path):
    entries = random_entries(300, seed=10)
    write_snapshot(tmp_path / "s", entries)
    snapshot = Snapshot(tmp_path / "s")
    os.unlink(tmp_path / "s")
    with pytest.raises(FileNotFoundError):             # deleted by someone else: not hidden
        snapshot.find(entries[0].producer_id)
    snapshot.retire()                                  # deleted by retention: its entries had expired
    assert snapshot.find(entries[0].producer_id) is None
    found, rows = snapshot.find_many(np.array([e.producer_id for e in entries], np.int64))
    assert not found.any() and len(rows) == 0
    snapshot.close()


def test_numpy_entries_in_any_byte_order(tmp_path):
    entries = random_entries(20, seed=5)
    native = np.array([tuple(e) for e in entries], ENTRY_DTYPE.newbyteorder("="))
    write_snapshot(tmp_path / "n", native)
    write_snapshot(tmp_path / "t", entries)
    assert (tmp_path / "n").read_bytes() == (tmp_path / "t").read_bytes()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_snapshot_reader(tmp_path_factory, data):
    entries = random_entries(data.draw(st.integers(0, 6)), seed=data.draw(st.integers(0, 99)))
    raw = bytearray(kafka_snapshot(entries))
    for _ in range(data.draw(st.integers(0, 3))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    blob = bytes(raw[:data.draw(st.integers(0, len(raw)))]) + data.draw(st.binary(max_size=50))
    path = tmp_path_factory.mktemp("fuzz") / snapshot_name(1)
    path.write_bytes(blob)
    try:
        got = read_snapshot(path)
        snap = Snapshot(path)
    except (CorruptSnapshotError, InvalidArgumentError):
        return
    assert blob == kafka_snapshot(got)
    for e in got:
        assert snap.find(e.producer_id) == e


def test_core_search_finds_present_and_absent_ids():
    rng = np.random.default_rng(9)
    ids = np.unique(rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64))
    array = np.zeros(len(ids), ENTRY_DTYPE)
    array["producer_id"] = ids
    data = np.frombuffer(b"\0" * 10 + array.tobytes(), np.uint8)
    assert _core.snapshot_sorted(data, len(ids))
    for row in rng.integers(0, len(ids), 500):
        assert _core.snapshot_search(data, len(ids), int(ids[row])) == row
    for pid in rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64):
        if pid not in ids:
            assert _core.snapshot_search(data, len(ids), int(pid)) == -1
    with pytest.raises(ValueError):
        _core.snapshot_search(data, len(ids) + 1, 5)            # more entries than bytes
    with pytest.raises(ValueError):
        _core.snapshot_search(data, 3, 5, np.array([0, 1, 99], np.uint32))


@pytest.mark.parametrize("n", [1, 127, 128, 129, 1000])
def test_sorted_snapshot_lookups_across_stride_edges(tmp_path, n):
    entries = random_entries(n, seed=n)
    path = tmp_path / snapshot_name(n)
    write_snapshot(path, entries)
    snap = Snapshot(path)
    assert snap.sorted
    for e in entries:
        assert snap.find(e.producer_id) == e
    ids = sorted(e.producer_id for e in entries)
    for pid in (ids[0] - 1, ids[-1] + 1, -(2**63), 2**63 - 1):
        assert snap.find(pid) is None
    gaps = [a + 1 for a, b in zip(ids, ids[1:]) if b - a > 1][:50]
    assert all(snap.find(pid) is None for pid in gaps)


def test_core_sorted_snapshot_find_reads_one_stride(tmp_path):
    ids = np.arange(0, 3000, 3, dtype=np.int64)
    array = np.zeros(len(ids), ENTRY_DTYPE)
    array["producer_id"] = ids
    array["last_offset"] = ids
    array["last_offset"][5] = -7                          # no batch: built as Kafka reads it
    array["last_sequence"] = 4
    array["current_txn_first_offset"] = -1
    array["current_txn_first_offset"][6] = -3
    path = tmp_path / "s"
    write_snapshot(path, array)
    data = np.frombuffer(path.read_bytes(), np.uint8)
    fences = _core.snapshot_fences(data, len(ids), 128)
    assert fences.tolist() == ids[::128].tolist()
    with open(path, "rb") as f:
        def find(pid):
            return _core.sorted_snapshot_find(f.fileno(), len(ids), fences, 128, pid, ProducerEntry)
        assert find(int(ids[130])) == ProducerEntry(int(ids[130]), 0, 4, int(ids[130]), 0, 0, 0, -1)
        assert find(int(ids[5])) == ProducerEntry(int(ids[5]), 0, -1, -1, 0, 0, 0, -1)
        assert find(int(ids[6])).current_txn_first_offset == -1
        assert [find(p) for p in (-1, int(ids[128]) - 1, int(ids[-1]) + 1)] == [None, None, None]
        assert _core.sorted_snapshot_find(f.fileno(), len(ids) + 200, _core.snapshot_fences(
            np.concatenate([data, np.zeros(200 * 46, np.uint8)]), len(ids) + 200, 128), 128, 2**62, ProducerEntry) \
            is False                                      # the file is shorter than its stride: reported
        with pytest.raises(ValueError):
            _core.sorted_snapshot_find(f.fileno(), len(ids), fences[:-1], 128, 5, ProducerEntry)
        with pytest.raises(ValueError):
            _core.sorted_snapshot_find(f.fileno(), len(ids), fences, 129, 5, ProducerEntry)


@pytest.mark.parametrize("spacing", ["even", "clustered"])
def test_sorted_snapshot_find_guesses_the_row_and_falls_back_to_the_stride(tmp_path, spacing):
    # Evenly spread ids are found in the window read around the interpolated row; clustered ones (a few
    # huge gaps inside a stride) miss the window and are found by reading the whole stride.
    rng = np.random.default_rng(7)
    steps = np.full(2000, 1000) if spacing == "even" else np.where(rng.random(2000) < 0.02, 10**12, 1)
    ids = np.cumsum(steps).astype(np.int64)
    array = np.zeros(len(ids), ENTRY_DTYPE)
    array["producer_id"] = ids
    array["last_offset"] = np.arange(len(ids))
    array["current_txn_first_offset"] = -1
    path = tmp_path / snapshot_name(9)
    write_snapshot(path, array)
    snap = Snapshot(path)
    assert [snap.find(int(p)).last_offset for p in ids] == list(range(len(ids)))
    assert all(snap.find(int(p) + 1) is None for p in ids[:-1] if p + 1 not in ids)
    os.truncate(path, 10 + 46 * 100)
    with pytest.raises(CorruptSnapshotError, match="shrank"):   # the window's read is checked too
        snap.find(int(ids[300]))
    snap.close()


# --- reading as Kafka 3.9's ProducerStateManager.readSnapshot does ---------------------------------------

def test_bytes_after_the_entries_are_read_when_the_crc_covers_them(tmp_path):
    entries = random_entries(200, seed=31)
    path = tmp_path / snapshot_name(9)
    path.write_bytes(kafka_snapshot(entries, trailing=b"\x00written after the entries"))
    assert read_snapshot(path) == entries                  # Kafka parses the entries and ignores the rest
    assert verify_snapshot(path).count == 200
    snap = Snapshot(path)
    assert all(snap.find(e.producer_id) == e for e in entries)
    snap.close()
    write_snapshot(tmp_path / "sorted", entries)          # a sorted file (searched with pread) too
    sorted_path = tmp_path / snapshot_name(10)
    sorted_path.write_bytes(with_crc((tmp_path / "sorted").read_bytes() + b"tail"))
    snap = Snapshot(sorted_path)
    assert snap.sorted and all(snap.find(e.producer_id) == e for e in entries)
    snap.close()
    # Kafka's CRC covers [6, end of file): bytes appended after the CRC was computed fail it.
    path.write_bytes(kafka_snapshot(entries) + b"appended later")
    for load in (read_snapshot, verify_snapshot, Snapshot):
        with pytest.raises(CorruptSnapshotError, match="CRC is no longer valid"):
            load(path)


def test_truncation_and_a_negative_count_say_what_is_wrong(tmp_path):
    path = tmp_path / snapshot_name(3)
    path.write_bytes(kafka_snapshot(random_entries(3))[:-1])
    for load in (read_snapshot, verify_snapshot, Snapshot):
        with pytest.raises(CorruptSnapshotError, match=r"truncated: 147 bytes cannot hold its 3 entries \(148 bytes\)"):
            load(path)
    path.write_bytes(with_crc(struct.pack(">hIi", 1, 0, -2) + b"\0" * 92))
    for load in (read_snapshot, verify_snapshot, Snapshot):
        with pytest.raises(CorruptSnapshotError, match="entry count -2 is negative"):
            load(path)


def test_an_entry_without_a_batch_reads_as_kafka_reads_it(tmp_path):
    stored = [ProducerEntry(1, 3, 17, -1, 4, 1000, 2, -1),        # last_offset -1: no batch metadata
              ProducerEntry(2, 3, 17, -9, 4, 1000, 2, 55),
              ProducerEntry(3, 3, 17, 80, 4, 1000, 2, -5)]        # below -1: no open transaction
    kafka = [ProducerEntry(1, 3, -1, -1, 0, 1000, 2, -1),
             ProducerEntry(2, 3, -1, -1, 0, 1000, 2, 55),
             ProducerEntry(3, 3, 17, 80, 4, 1000, 2, -1)]
    path = tmp_path / snapshot_name(81)
    path.write_bytes(kafka_snapshot(stored[::-1]))
    assert read_snapshot(path) == kafka[::-1]
    assert verify_snapshot(path).open_transactions                 # entry 2's transaction
    snap = Snapshot(path)
    assert [snap.find(e.producer_id) for e in kafka] == kafka
    assert sorted(ProducerEntry(*row) for row in snap.entries().tolist()) == kafka
    snap.close()
    only_bad_txn = tmp_path / "only"
    only_bad_txn.write_bytes(kafka_snapshot(stored[2:]))
    assert not verify_snapshot(only_bad_txn).open_transactions


def test_ledger_expires_a_producer_whose_txn_offset_is_below_minus_one(tmp_path):
    from kmem.ledger import PidLedger
    path = tmp_path / snapshot_name(81)
    path.write_bytes(kafka_snapshot([ProducerEntry(3, 3, 17, 80, 4, 1000, 2, -5)]))
    now = [1000 + 10]
    with PidLedger(tmp_path, producer_id_expiration_ms=100, clock_ms=lambda: now[0]) as ledger:
        assert ledger.read(3) == ProducerEntry(3, 3, 17, 80, 4, 1000, 2, -1)
        now[0] = 1000 + 100
        assert ledger.read(3) is None                # it used to count as an open transaction forever
        with pytest.raises(InvalidArgumentError, match="current_txn_first_offset"):
            ledger.update(ProducerEntry(4, 0, 0, 5, 0, 1000, 0, -5))
        assert ledger.update(ProducerEntry(4, 0, 9, -1, 2, 1000, 0, -1)) == ProducerEntry(4, 0, -1, -1, 0, 1000, 0, -1)
        assert ledger.read(4) is None               # expired too (the clock is at 1100)
        ledger.update(ProducerEntry(4, 0, 9, -1, 2, 1100, 0, -1))
        assert ledger.read(4) == ProducerEntry(4, 0, -1, -1, 0, 1100, 0, -1)
        ledger.flush()                               # retention: the file of producer 3 goes
    assert not path.exists()


MUTATIONS = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("count"), st.sampled_from([-(2**31), -1, 0, 1, 2**20, 2**31 - 1]), st.just(0)),
    st.tuples(st.just("append"), st.integers(1, 200), st.integers(0, 255)),
)


def mutate(data, mutations, fix_crc):
    data = bytearray(data)
    for kind, at, value in mutations:
        if kind == "count":
            if len(data) >= 10:
                struct.pack_into(">i", data, 6, at)
        elif kind == "append":
            data += bytes([value]) * at
        elif not data:
            continue
        elif kind == "set":
            data[at % len(data)] = value
        elif kind == "flip":
            data[at % len(data)] ^= 1 << value
        elif kind == "cut":
            del data[at % len(data):]
        else:
            data.insert(at % (len(data) + 1), value)
    return with_crc(bytes(data)) if fix_crc else bytes(data)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 40), seed=st.integers(0, 99), mutations=st.lists(MUTATIONS, max_size=4),
       fix_crc=st.booleans(), sort=st.booleans(), read_only=st.booleans())
def test_fuzz_mutated_snapshots_give_kmem_errors_in_bounded_memory(tmp_path_factory, n, seed, mutations, fix_crc, sort,
                                                                   read_only):
    import logging
    import tracemalloc

    from kmem.bloom import Shape
    from kmem.ledger import PidLedger
    entries = random_entries(n, seed=seed)
    if sort:
        entries.sort()
    directory = tmp_path_factory.mktemp("mutated")
    path = directory / snapshot_name(77)
    path.write_bytes(mutate(kafka_snapshot(entries), mutations, fix_crc))
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("kmem.ledger").addHandler(handler)
    tracemalloc.start()
    try:
        try:
            got = read_snapshot(path)
        except CorruptSnapshotError:
            got = None
        for load in (verify_snapshot, Snapshot):
            try:
                opened = load(path)
            except CorruptSnapshotError:
                continue
            assert got is not None and opened.count == len(got)
            if isinstance(opened, Snapshot):
                assert all(opened.find(e.producer_id) == e for e in got)
                opened.close()
        with PidLedger(directory, Shape.from_np(200, 0.01), producer_id_expiration_ms=2**62,
                       read_only=read_only) as ledger:
            if got is not None and len({e.producer_id for e in got}) == len(got):
                assert all(ledger.read(e.producer_id) == (None if ledger.expired(e) else e) for e in got)
                found, rows = ledger.read_many([e.producer_id for e in got])
                assert [ProducerEntry(*r) if hit else None for hit, r in zip(found, rows.tolist())] \
                    == [None if ledger.expired(e) else e for e in got]
            else:
                assert any(snapshot_name(77) in w for w in warnings)      # skipped, with the reason
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        logging.getLogger("kmem.ledger").removeHandler(handler)
    # The file is at most a few KB; a count field claiming 2^31 entries must not be believed.
    assert peak < 4 * 2**20, peak


def test_a_snapshot_that_shrinks_while_open_is_reported(tmp_path):
    entries = random_entries(300, seed=61)
    path = tmp_path / snapshot_name(5)
    write_snapshot(path, entries)
    snap = Snapshot(path)
    os.truncate(path, 10 + 46 * 100)
    last = max(entries)
    with pytest.raises(CorruptSnapshotError, match="shrank"):
        snap.find(last.producer_id)
    snap.close()
