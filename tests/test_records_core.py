"""The compiled records core applies decisions it is given and holds none: down-conversion's rules are
a table built in kmem.records.convert; results are named; records are rewritten a slice at a time as
a builder would write them; its parts build in any include order."""
import pathlib
import shutil
import subprocess
import sys

import pytest
from records_samples import read_kmem, scenario_batches

from kmem import _core
from kmem.errors import CorruptRecordError
from kmem.records import (MemoryRecords, RecordsBuilder, TimestampType, build_control_batch, build_records, codecs,
                          convert)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_down_conversion_rules_are_a_python_table():
    action = convert.entry_action
    assert action(2, codecs.NONE, True, 1) == "skip"         # control batches are dropped below v2
    assert action(2, codecs.NONE, True, 2) == "copy"
    assert action(2, codecs.ZSTD, False, 0) == "stop"        # refused by down_convert
    assert action(1, codecs.GZIP, False, 1) == "copy"        # at or below the target: copied unread
    assert action(2, codecs.LZ4, False, 1) == "stop"         # needs a codec: converted in Python
    assert action(2, codecs.NONE, False, 0) == "convert"
    table = convert.ACTION_TABLES[1]
    assert len(table) == _core.ACTION_TABLE_SIZE
    assert table[(2 * 8 + codecs.NONE) * 2 + 1] == _core.ENTRY_ACTIONS["skip"]


def test_core_run_follows_the_table_it_is_given():
    data = scenario_batches("none") + build_control_batch(1, 30, 7, 0, 5)
    every = {name: bytes([code]) * _core.ACTION_TABLE_SIZE for name, code in _core.ENTRY_ACTIONS.items()}
    copied = _core.run_down_conversion(data, 0, actions=every["copy"], to_magic=1, first_offset=0)
    assert bytes(copied.output) == data and copied.stop == len(data) and copied.records == 0
    skipped = _core.run_down_conversion(data, 0, actions=every["skip"], to_magic=1, first_offset=0)
    assert skipped.output == b"" and skipped.stop == len(data)
    stopped = _core.run_down_conversion(data, 0, actions=every["stop"], to_magic=1, first_offset=0)
    assert stopped.output == b"" and stopped.stop == 0
    converted = _core.run_down_conversion(data, 0, actions=every["convert"], to_magic=1, first_offset=11)
    assert (converted.stop, converted.records) == (len(data), 6 + 1)    # offsets 11.. and the marker
    assert [row[0] for row in read_kmem(converted.output)] == [11, 15, 16, 17, 22, 24, 30]
    with pytest.raises(ValueError, match="actions must hold"):
        _core.run_down_conversion(data, 0, actions=b"\1", to_magic=1, first_offset=0)


def test_core_results_are_named():
    section = _core.encode_v2_records([(0, 0, None, b"a", []), (2, 1, b"k", b"b", [])])
    converted = _core.convert_v2_section(section, count=2, base_offset=10, base_timestamp=100, log_append=False,
                                         log_append_time=-1, to_magic=1, relative=True)
    assert (converted.records, converted.last_offset, converted.max_timestamp) == (2, 12, 101)
    inner = _core.encode_legacy_entries(1, 0, [(0, 5, None, b"a"), (4, 6, None, b"b"), (2, 7, None, b"c")])
    scan = _core.scan_legacy_entries(inner)
    assert (scan.count, scan.first, scan.last, scan.lowest, scan.highest) == (3, 0, 2, 0, 4)
    legacy = _core.convert_legacy_section(inner, absolute_base=100, to_magic=0)
    assert (legacy.records, legacy.last_offset) == (3, 102)


def _rewritten(rewriter, section, piece, slice_records=None):
    """Every slice ``rewriter`` writes from ``section`` given ``piece`` bytes at a time (the section
    started by the caller), joined; checks that each call stops at a slice, a piece's end or the end."""
    slices, pending = [], bytearray()

    def drain(final):
        pos = 0
        while True:
            pos, read, records = rewriter.rewrite(pending, pos, final=final)
            slices.append(records)
            if slice_records is not None:
                assert read <= slice_records
            if not read:
                del pending[:pos]
                return

    for i in range(0, len(section), piece):
        pending += section[i:i + piece]
        drain(False)
    drain(True)
    assert not pending
    return b"".join(slices)


def _sample_v2_batch():
    builder = RecordsBuilder(2, "none", base_offset=0)
    for i in range(300):
        builder.append(None if i % 11 == 1 else bytes(range(i % 256)) * (i % 3), key=None if i % 7 == 0 else b"k%d" % i,
                       timestamp=1_700_000_000_000 + (i * 7919) % 1000 - 500,
                       headers=[("h%d" % j, None if j % 2 else b"v" * j) for j in range(i % 4)])
    return builder.build()


def _rebuilt_by_builder(batch):
    """The records section Kafka's way of rebuilding (records appended one by one to a new batch) makes."""
    builder = RecordsBuilder(2, "none")
    for record in batch:
        builder.append(record.value, key=record.key, timestamp=max(record.timestamp, -1), headers=record.headers)
    return builder.build()[61:]


def test_rewriter_writes_what_a_builder_of_the_records_writes_in_any_pieces_and_slices():
    data = _sample_v2_batch()
    (batch,) = MemoryRecords(data)
    expected = _rebuilt_by_builder(batch)
    for slice_bytes, piece in [(1, 1), (100, 13), (4096, 1000), (1 << 20, len(data))]:
        rewriter = _core.RecordsRewriter(slice_bytes)
        rewriter.start_v2(count=300, base_timestamp=batch.base_timestamp, log_append=False, log_append_time=-1)
        assert _rewritten(rewriter, data[61:], piece, 1 if slice_bytes == 1 else None) == expected
        assert (rewriter.records, rewriter.section_records) == (300, 300)
        assert (rewriter.first_timestamp, rewriter.max_timestamp) == (batch.base_timestamp, batch.max_timestamp)


def test_rewriter_continues_the_batch_across_sections_of_every_kind():
    # a LogAppendTime v2 batch, v1 inner messages (one of them v0), then a v2 batch with a timestamp below -1
    lat = bytearray(build_records([b"a", b"b"], timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=900))
    inner = _core.encode_legacy_entries(1, 0, [(0, 50, b"k", b"c"), (1, 60, None, None)]) \
        + _core.encode_legacy_entries(0, 0, [(2, -1, None, b"d")])
    odd = build_records([{"value": b"e", "timestamp": 70}])
    rewriter = _core.RecordsRewriter(1 << 16)
    rewriter.start_v2(count=2, base_timestamp=0, log_append=True, log_append_time=900)
    section = _rewritten(rewriter, lat[61:], 5)
    rewriter.start_legacy(log_append=False, log_append_time=-1)
    section += _rewritten(rewriter, inner, 7)
    assert rewriter.section_records == 3
    rewriter.start_v2(count=1, base_timestamp=-80, log_append=False, log_append_time=-1)   # 70 - 80 = -10
    section += _rewritten(rewriter, odd[61:], 3)
    rebuilt = RecordsBuilder(2, "none")
    for value, key, timestamp in [(b"a", None, 900), (b"b", None, 900), (b"c", b"k", 50), (None, None, 60),
                                  (b"d", None, -1), (b"e", None, -1)]:
        rebuilt.append(value, key=key, timestamp=timestamp)
    assert section == rebuilt.build()[61:]
    assert (rewriter.records, rewriter.first_timestamp, rewriter.max_timestamp) == (6, 900, 900)


def test_rewriter_holds_back_a_record_split_at_the_end_and_refuses_bad_sections():
    section = _core.encode_v2_records([(0, 0, None, b"x" * 1000, []), (1, 0, None, b"y", [])])
    rewriter = _core.RecordsRewriter(100)         # a record larger than a slice has a slice of its own
    rewriter.start_v2(count=2, base_timestamp=5, log_append=False, log_append_time=-1)
    assert rewriter.rewrite(section[:500], 0, final=False) == (0, 0, bytearray())
    end, read, records = rewriter.rewrite(section, 0, final=False)
    assert (read, len(records)) == (1, end) and end > 1000
    cases = [  # (records, count, final, error)
        (section[:500], 2, True, "ends before the lengths it declares"),
        (section, 3, True, "count does not match"),
        (section, 1, False, "count does not match"),         # more records than the count: at once
        (b"\x08\x00\x00\x00\x0a", 1, False, "invalid key length"),     # 5 bytes of key in a 4-byte record
    ]
    for data, count, final, error in cases:
        rewriter = _core.RecordsRewriter(1 << 16)
        rewriter.start_v2(count=count, base_timestamp=0, log_append=False, log_append_time=-1)
        pos, read = 0, 1
        with pytest.raises(CorruptRecordError, match=error) as raised:
            while read:
                pos, read, _ = rewriter.rewrite(data, pos, final=final, base=1000)
        assert raised.value.offset >= 1000
    rewriter = _core.RecordsRewriter(1 << 16)
    rewriter.start_legacy(log_append=False, log_append_time=-1)
    with pytest.raises(CorruptRecordError, match="nested"):
        rewriter.rewrite(_core.encode_legacy_entries(1, codecs.GZIP, [(0, 1, None, b"")]), 0, final=True)
    rewriter.start_v2(count=1, base_timestamp=-3, log_append=False, log_append_time=-1)
    rewriter.rewrite(_core.encode_v2_records([(0, 0, None, None, [])]), 0, final=True)    # the base timestamp: -1
    rewriter.start_v2(count=1, base_timestamp=(1 << 63) - 1, log_append=False, log_append_time=-1)
    with pytest.raises(CorruptRecordError, match="invalid timestamp"):      # its delta from -1 is past int64
        rewriter.rewrite(_core.encode_v2_records([(0, 0, None, None, [])]), 0, final=True)


@pytest.mark.slow
def test_core_parts_compile_in_any_include_order(tmp_path):
    for part in [ROOT / "kmem" / "_core.pxd", *(ROOT / "kmem").glob("_*.pxi")]:
        shutil.copy(part, tmp_path)
    source = (ROOT / "kmem" / "_core.pyx").read_text().splitlines()
    includes = [line for line in source if line.startswith("include ")]
    (tmp_path / "_core.pyx").write_text("\n".join([line for line in source if not line.startswith("include ")]
                                                  + includes[::-1]) + "\n")
    result = subprocess.run([sys.executable, "-m", "cython", "-3", "_core.pyx"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
