"""The log cleaner's key map and record filter in the compiled core (``_offset_map.pxi``)."""
import struct
import tracemalloc

import mmh3
import pytest

from kmem import _core
from kmem.errors import CorruptRecordError
from kmem.records import MemoryRecords, build_records


def _section(records, base_offset=0):
    data = build_records(records, base_offset=base_offset)
    batch = next(iter(MemoryRecords(data)))
    return batch, bytes(batch.buffer[61:])


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100])
def test_the_hash_is_murmur3_x64_128(length):
    data = bytes(range(7, 7 + length))
    assert _core.murmur3_128(data) == mmh3.hash_bytes(data)


def test_the_hash_agrees_with_the_bloom_filters_producer_id_hash():
    h1, h2 = _core.murmur3_pid(123456789)
    assert _core.murmur3_128(struct.pack(">q", 123456789)) == struct.pack("<QQ", h1, h2)


def test_put_and_get_keep_the_latest_offset_per_key():
    offset_map = _core.OffsetMap(24 * 100)
    assert (offset_map.slots, offset_map.memory) == (100, 2400)
    for offset, key in enumerate([b"a", b"b", b"a", b"", b"c", b"b"]):
        offset_map.put(key, offset)
    assert [offset_map.get(k) for k in (b"a", b"b", b"c", b"", b"d")] == [2, 5, 4, 3, -1]
    assert offset_map.size == 4
    offset_map.clear()
    assert (offset_map.size, offset_map.get(b"a"), offset_map.latest_offset) == (0, -1, -1)


def test_a_full_map_refuses_a_new_key_but_updates_a_known_one():
    offset_map = _core.OffsetMap(24 * 3 + 23)        # 3 slots: the odd bytes are not used
    for i in range(3):
        offset_map.put(b"k%d" % i, i)
    with pytest.raises(OverflowError):
        offset_map.put(b"new", 9)
    offset_map.put(b"k1", 10)
    assert [offset_map.get(b"k%d" % i) for i in range(3)] + [offset_map.get(b"new")] == [0, 10, 2, -1]


def test_a_map_smaller_than_a_slot_is_refused():
    with pytest.raises(ValueError, match="at least 24 bytes"):
        _core.OffsetMap(23)


def test_memory_stays_the_buffer_whatever_the_number_of_keys():
    offset_map = _core.OffsetMap(1 << 20)
    # what this test's own calls keep: other threads of the process (earlier tests') are not counted
    here = [tracemalloc.Filter(True, __file__)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(here)
        for round_ in range(4):
            offset_map.clear()
            for i in range(int(offset_map.slots * 0.9)):
                offset_map.put(b"key-%d-%d" % (round_, i), i)
        after = tracemalloc.take_snapshot().filter_traces(here)
    finally:
        tracemalloc.stop()
    assert offset_map.size == int(offset_map.slots * 0.9)
    kept = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert kept < 64 << 10          # the slots are the C buffer made at construction: nothing per key


def test_put_records_maps_each_key_from_the_start_offset_and_skips_keyless_records():
    batch, section = _section([{"key": b"k%d" % (i % 3) if i != 4 else None, "value": b"v"} for i in range(8)],
                              base_offset=100)
    offset_map = _core.OffsetMap(24 * 16)
    mapped = offset_map.put_records(section, count=8, base_offset=100, base_timestamp=batch.base_timestamp,
                                    start_offset=102)
    assert mapped == 5
    assert [offset_map.get(b"k%d" % i) for i in range(3)] == [106, 107, 105]


def test_put_records_overflowing_the_map_raises():
    batch, section = _section([{"key": b"k%d" % i, "value": b"v"} for i in range(5)])
    offset_map = _core.OffsetMap(24 * 4)
    with pytest.raises(OverflowError):
        offset_map.put_records(section, count=5, base_offset=0, base_timestamp=batch.base_timestamp, start_offset=0)


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_damaged_section_is_a_corrupt_record_error(cut):
    batch, section = _section([{"key": b"key", "value": b"value %d" % i} for i in range(4)])
    offset_map = _core.OffsetMap(24 * 16)
    with pytest.raises(CorruptRecordError):
        offset_map.put_records(section[:-cut], count=4, base_offset=0, base_timestamp=0, start_offset=0)
    with pytest.raises(CorruptRecordError):
        _core.filter_v2_records(offset_map, section[:-cut], count=4, base_offset=0, base_timestamp=0,
                                retain_deletes=True)
    with pytest.raises(CorruptRecordError):         # a count larger than the records there
        _core.filter_v2_records(offset_map, section, count=5, base_offset=0, base_timestamp=0, retain_deletes=True)


def _decode(section, count, base_offset, base_timestamp):
    records, _ = _core.decode_v2_records(section, 0, count=count, max_objects=1000, max_record_objects=1000,
                                         base_offset=base_offset, base_timestamp=base_timestamp)
    return [(offset, timestamp, key, value) for offset, timestamp, key, value, _ in records]


def _filtered_batch(retain_deletes, new_base_timestamp=None):
    records = [{"key": b"a", "value": b"1", "timestamp": 1000}, {"key": None, "value": b"x", "timestamp": 1001},
               {"key": b"b", "value": b"2", "timestamp": 1002}, {"key": b"a", "value": None, "timestamp": 1003},
               {"key": b"c", "value": b"3", "timestamp": 1004}, {"key": b"b", "value": b"4", "timestamp": 1005}]
    batch, section = _section(records, base_offset=50)
    offset_map = _core.OffsetMap(24 * 16)
    offset_map.put_records(section[:], count=6, base_offset=50, base_timestamp=1000, start_offset=0)
    offset_map.update_latest_offset(54)         # offset 55 lies beyond what the map covers
    offset_map.put(b"c", 60)                    # superseded by a later segment
    kept = _core.filter_v2_records(offset_map, section, count=6, base_offset=50, base_timestamp=1000,
                                   retain_deletes=retain_deletes, new_base_timestamp=new_base_timestamp)
    return kept


def test_filter_keeps_the_latest_record_of_each_key_with_its_offset():
    kept = _filtered_batch(retain_deletes=True)
    assert _decode(kept.section, kept.count, 50, 1000) == [(53, 1003, b"a", None), (55, 1005, b"b", b"4")]
    assert (kept.max_timestamp, kept.offset_of_max_timestamp, kept.first_timestamp) == (1005, 55, 1003)
    assert kept.has_tombstones


def test_filter_drops_tombstones_past_their_horizon():
    kept = _filtered_batch(retain_deletes=False)
    assert _decode(kept.section, kept.count, 50, 1000) == [(55, 1005, b"b", b"4")]
    assert not kept.has_tombstones


def test_filter_rewrites_timestamp_deltas_against_a_new_base_timestamp():
    horizon = 1000 + 86_400_000
    kept = _filtered_batch(retain_deletes=True, new_base_timestamp=horizon)
    assert _decode(kept.section, kept.count, 50, horizon) == [(53, 1003, b"a", None), (55, 1005, b"b", b"4")]


def test_sections_of_many_records_are_mapped_and_filtered_record_by_record_in_order():
    # keys are hashed and their slots prefetched in groups: a key repeated inside a group or across groups
    # keeps its last offset, keyless records and records above the map's end are handled one by one
    keys = [None if i % 11 == 5 else b"k%d" % (i % 3 if i < 20 else i % 13) for i in range(70)]
    batch, section = _section([{"key": key, "value": None if i % 9 == 0 else b"v%d" % i}
                               for i, key in enumerate(keys)], base_offset=1000)
    offset_map = _core.OffsetMap(24 * 64)
    assert offset_map.put_records(section, count=70, base_offset=1000, base_timestamp=batch.base_timestamp,
                                  start_offset=1003) == sum(1 for i, k in enumerate(keys) if k and i >= 3)
    latest = {key: 1000 + i for i, key in enumerate(keys) if key and i >= 3}
    assert {key: offset_map.get(key) for key in latest} == latest
    offset_map.update_latest_offset(1060)
    kept = _core.filter_v2_records(offset_map, section, count=70, base_offset=1000,
                                   base_timestamp=batch.base_timestamp, retain_deletes=False)
    expected = [1000 + i for i, key in enumerate(keys)
                if 1000 + i > 1060 or key and latest.get(key) == 1000 + i and i % 9]
    assert [offset for offset, _, _, _ in _decode(kept.section, kept.count, 1000, batch.base_timestamp)] == expected


def _invalid(section, count=6, keyless=True, low=1000, high=1004, limit=100):
    return _core.invalid_records(section, count=count, keyless=keyless, base_timestamp=1000, low=low, high=high,
                                 limit=limit)


def test_invalid_records_are_the_keyless_ones_and_those_out_of_bounds_in_order():
    records = [{"key": b"a", "value": b"1", "timestamp": 1000}, {"key": None, "value": b"x", "timestamp": 1001},
               {"key": b"b", "value": b"2", "timestamp": 999}, {"key": b"c", "value": b"3", "timestamp": -1},
               {"key": None, "value": b"y", "timestamp": 1005}, {"key": b"d", "value": b"4", "timestamp": 1004}]
    _, section = _section(records)
    # (index, offset delta, timestamp, has a key); -1 is no timestamp, never out of bounds
    assert _invalid(section) == [(1, 1, 1001, False), (2, 2, 999, True), (4, 4, 1005, False)]
    assert _invalid(section, keyless=False) == [(2, 2, 999, True), (4, 4, 1005, False)]
    assert _invalid(section, limit=2) == [(1, 1, 1001, False), (2, 2, 999, True)]
    assert _invalid(section, keyless=False, low=-1 << 63, high=(1 << 63) - 1) == []
    with pytest.raises(CorruptRecordError):             # every record is parsed when none is refused
        _invalid(section[:-1], keyless=False, low=-1 << 63, high=(1 << 63) - 1)
    with pytest.raises(CorruptRecordError):
        _invalid(section, count=7)
    with pytest.raises(ValueError):
        _invalid(section, limit=0)
