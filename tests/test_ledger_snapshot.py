"""Kafka producer-state snapshot files: byte layout, Kafka's error cases, searching mapped entries."""
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmem import _core
from kmem.errors import CorruptSnapshotError, InvalidArgumentError
from snapshot_files import crc32c_reference, kafka_snapshot, random_entries

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


def test_a_sorted_snapshot_holds_one_fd_and_closes_it(tmp_path):
    entries = random_entries(300, seed=9)
    write_snapshot(tmp_path / "s", entries)
    before = len(os.listdir("/proc/self/fd"))
    snapshot = Snapshot(tmp_path / "s")
    assert len(os.listdir("/proc/self/fd")) == before + 1        # searched with pread: no mapping kept
    assert all(snapshot.find(e.producer_id) == e for e in entries)
    assert [ProducerEntry(*row) for row in snapshot.entries().tolist()] == sorted(entries)
    snapshot.close()
    assert len(os.listdir("/proc/self/fd")) == before


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


def test_core_fence_and_block_search():
    ids = np.arange(0, 3000, 3, dtype=np.int64)
    array = np.zeros(len(ids), ENTRY_DTYPE)
    array["producer_id"] = ids
    data = np.frombuffer(b"\0" * 10 + array.tobytes(), np.uint8)
    fences = _core.snapshot_fences(data, len(ids), 128)
    assert fences.tolist() == ids[::128].tolist()
    assert _core.fence_block(fences, -1) == -1
    assert _core.fence_block(fences, 0) == 0
    assert _core.fence_block(fences, int(ids[128])) == 1
    assert _core.fence_block(fences, int(ids[128]) - 1) == 0
    assert _core.fence_block(np.empty(0, np.int64), 5) == -1
    block = array[128:256].tobytes()
    assert _core.block_search(block, int(ids[130])) == 2
    assert _core.block_search(block, int(ids[130]) + 1) == -1
    assert _core.block_search(block[:45], int(ids[128])) == -1          # no whole entry: nothing read
