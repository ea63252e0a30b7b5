"""Log compaction (``kmem.broker.log.cleaner``): passes over a partition, the swap, recovery, the policy."""
import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from kmem.broker.codes import ErrorCode
from kmem.broker.log import LogManager
from kmem._core import OffsetMap
from kmem.broker.log.cleaner import DELETE_HORIZON_FLAG, LogCleaningError, complete_interrupted_swaps
from kmem.broker.log.config import BrokerConfig
from kmem.errors import ConfigError
from kmem.records import RecordsBuilder, build_records

NOW = 1_700_000_000_000
DAY = 86_400_000


def open_manager(path, **settings):
    settings.setdefault("log_cleaner_dedupe_buffer_size", 24 * 10_000)
    return LogManager(path, BrokerConfig.from_properties(producer_ledger_ids=100, **settings), clock_ms=lambda: NOW)


@pytest.fixture
def manager(tmp_path):
    opened = open_manager(tmp_path / "logs")
    yield opened
    opened.close()


def compacted(manager, name="t", **configs):
    manager.create_topic(name, 1, {"cleanup.policy": "compact", "segment.bytes": 1000, **configs})
    return manager.get_partition(name, 0)


def put(partition_log, key, value, timestamp=NOW - DAY, **batch_fields):
    builder = RecordsBuilder(2, "none", **batch_fields)
    builder.append(value, key=key, timestamp=timestamp)
    result = partition_log.append(builder.build(), now_ms=NOW)
    assert result.error_code == ErrorCode.NONE, result
    return result


def read_log(partition_log):
    """``[(offset, key, value)]`` of every record, fetch after fetch, and the batches' attributes."""
    found, offset = [], partition_log.log_start_offset
    while (fetched := partition_log.read(offset, 1 << 20)).records is not None:
        with fetched.records as records:
            for batch in records.batches():
                found += [(r.offset, r.key, r.value) for r in batch]
                offset = batch.next_offset
    return found


def latest(writes):
    """The latest (offset, key, value) of each key of ``writes`` ([(offset, key, value)]), in offset order."""
    last = {}
    for offset, key, value in writes:
        last[key] = (offset, key, value)
    return sorted(last.values())


def write_updates(partition_log, count, keys, tombstone_every=0, seed=1):
    rng = random.Random(seed)
    writes = []
    for i in range(count):
        key = b"key-%d" % rng.randrange(keys)
        value = None if tombstone_every and i % tombstone_every == tombstone_every - 1 else b"value-%d" % i
        writes.append((put(partition_log, key, value).base_offset, key, value))
    return writes


def dirty_end(partition_log):
    return partition_log.active.base_offset


# --- a pass -----------------------------------------------------------------------------------------------

def test_a_pass_keeps_the_latest_record_of_each_key_with_its_offset(manager):
    partition_log = compacted(manager)
    writes = write_updates(partition_log, 300, keys=20)
    before = partition_log.size_in_bytes
    end = dirty_end(partition_log)
    manager.cleaner.clean("t", 0, now_ms=NOW)
    cleaned = [w for w in writes if w[0] < end]
    expected = latest(cleaned) + [w for w in writes if w[0] >= end]
    assert read_log(partition_log) == expected
    assert partition_log.size_in_bytes < before / 3
    assert manager.cleaner.first_dirty_offset("t", 0) == end
    with open(os.path.join(manager.log_dir, "cleaner-offset-checkpoint")) as file:
        assert file.read() == f"0\n1\nt 0 {end}\n"


def test_the_cleaned_log_is_read_again_after_a_restart_and_small_segments_are_regrouped(tmp_path):
    manager = open_manager(tmp_path)
    partition_log = compacted(manager)
    write_updates(partition_log, 300, keys=5)
    read = len(partition_log.segments) - 1
    manager.cleaner.clean("t", 0, now_ms=NOW)
    first_pass_end = manager.cleaner.first_dirty_offset("t", 0)
    # a group takes in segments while what it wrote plus the next one's size fits segment.bytes (1000 bytes)
    assert read > 20 and len([s for s in partition_log.segments if s.base_offset < first_pass_end]) <= 2
    writes = write_updates(partition_log, 100, keys=5, seed=2)
    manager.cleaner.clean("t", 0, now_ms=NOW)          # regroups the segments the first pass made small
    expected = read_log(partition_log)
    assert len([s for s in partition_log.segments if s.base_offset < first_pass_end]) == 1
    assert all(s.size <= 1000 for s in partition_log.segments)
    manager.close()
    manager = open_manager(tmp_path)
    try:
        assert read_log(manager.get_partition("t", 0)) == expected
        assert expected[-1] == writes[-1]
        assert manager.cleaner.first_dirty_offset("t", 0) > 0
    finally:
        manager.close()


def test_a_group_of_segments_stops_where_the_cleaned_indexes_would_be_full(manager):
    # an index entry for each batch, 10 entries an index: every segment rolled with a full index
    partition_log = compacted(manager, **{"segment.index.bytes": 80, "index.interval.bytes": 0,
                                          "segment.bytes": 100_000})
    writes = write_updates(partition_log, 300, keys=200)
    end = dirty_end(partition_log)
    manager.cleaner.clean("t", 0, now_ms=NOW)
    assert read_log(partition_log) == latest([w for w in writes if w[0] < end]) + [w for w in writes if w[0] >= end]
    assert manager.cleaner.first_dirty_offset("t", 0) == end


def test_cleaned_segments_are_filled_with_segments_whose_records_partly_stay(manager):
    partition_log = compacted(manager, **{"index.interval.bytes": 0})        # an index entry for each batch
    # Two records in three update one key: a third of each segment stays (a group took in one segment when
    # what it wrote plus the next one's size passed segment.bytes: as many cleaned segments as read). Then
    # segments of which nothing stays, each followed by segments of which everything stays: a group tries
    # the next segment as if it kept as much as the previous one did, and takes it back when it does not fit.
    keys = [b"hot" if i % 3 else b"key-%d" % i for i in range(300)]
    for part in range(3):
        keys += [b"cold"] * 24 + [b"part-%d-%d" % (part, i) for i in range(24)]
    writes = [(put(partition_log, key, b"value-%d" % i, timestamp=NOW - DAY + i).base_offset, key, b"value-%d" % i)
              for i, key in enumerate(keys)]
    end = dirty_end(partition_log)
    read = len(partition_log.segments) - 1
    stats = manager.cleaner.clean("t", 0, now_ms=NOW)
    expected = latest([w for w in writes if w[0] < end])
    assert read_log(partition_log) == expected + [w for w in writes if w[0] >= end]
    cleaned = [s for s in partition_log.segments if s.base_offset < end]
    assert read >= 30 and len(cleaned) <= read // 2
    assert all(s.size <= 1000 for s in cleaned)
    # what a segment wrote before it was taken back is gone from the file and its indexes
    assert all(a.next_offset <= b.base_offset for a, b in zip(cleaned, cleaned[1:]))
    assert all(s.offset_index.last_offset < s.next_offset and s.time_index.last_entry[1] < s.next_offset
               for s in cleaned)
    for offset, key, value in expected:                 # the cleaned offset indexes find every record
        with partition_log.read(offset, 1).records as records:
            assert [(r.key, r.value) for r in next(records.batches()) if r.offset == offset] == [(key, value)]
    # a segment tried and taken back is counted once, in the group that keeps it
    assert (stats.records_read, stats.records_kept) == (len([w for w in writes if w[0] < end]), len(expected))


def test_fetching_from_an_offset_that_was_cleaned_away_gets_the_next_record(manager):
    partition_log = compacted(manager)
    write_updates(partition_log, 200, keys=3)
    manager.cleaner.clean("t", 0, now_ms=NOW)
    kept = [offset for offset, _, _ in read_log(partition_log)]
    gap = next(o for o in range(kept[0], kept[-1]) if o not in kept)
    fetched = partition_log.read(gap, 1 << 20)
    with fetched.records as records:
        assert next(iter(next(records.batches()))).offset == min(o for o in kept if o > gap)


def test_tombstones_stay_for_delete_retention_ms_after_the_clean_that_kept_them(manager):
    partition_log = compacted(manager, **{"delete.retention.ms": 1000})
    put(partition_log, b"a", b"1")
    put(partition_log, b"b", b"2")
    put(partition_log, b"a", None)
    for i in range(40):
        put(partition_log, b"filler-%d" % (i % 4), b"x" * 50)
    manager.cleaner.clean("t", 0, now_ms=NOW)
    assert (2, b"a", None) in read_log(partition_log)
    fetched = partition_log.read(2, 1 << 20)
    with fetched.records as records:
        batch = next(records.batches())
        assert batch.attributes & DELETE_HORIZON_FLAG and batch.base_timestamp == NOW + 1000
        assert next(iter(batch)).timestamp == NOW - DAY           # the record's own timestamp is kept
    for now in (NOW + 999, NOW + 1000):     # a pass needs new dirty records: more fillers
        for i in range(20):
            put(partition_log, b"filler-%d" % (i % 4), b"y" * 50)
        manager.cleaner.clean("t", 0, now_ms=now)
        if now == NOW + 999:                # within the horizon: kept
            assert (2, b"a", None) in read_log(partition_log)
    records = read_log(partition_log)
    assert all(key != b"a" for _, key, _ in records)
    assert (1, b"b", b"2") in records


def test_more_keys_than_the_map_holds_takes_several_passes_with_the_same_result(tmp_path):
    manager = open_manager(tmp_path, log_cleaner_dedupe_buffer_size=24 * 50)
    try:
        partition_log = compacted(manager)
        writes = write_updates(partition_log, 400, keys=120, tombstone_every=0)
        end = dirty_end(partition_log)
        passes = 0
        while manager.cleaner.first_dirty_offset("t", 0) < end:
            manager.cleaner.clean("t", 0, now_ms=NOW)
            passes += 1
        assert passes >= 3
        assert manager.cleaner._cleaner.offset_map is None          # each pass's map is freed after it
        expected = latest([w for w in writes if w[0] < end]) + [w for w in writes if w[0] >= end]
        assert read_log(partition_log) == expected
    finally:
        manager.close()


def test_an_idempotent_producers_retry_after_cleaning_is_still_recognised(manager):
    partition_log = compacted(manager)
    first = put(partition_log, b"k", b"v0", producer_id=7, producer_epoch=0, base_sequence=0)
    for i in range(60):             # the producer's batch is superseded by later records of its key
        put(partition_log, b"k", b"v%d" % (i + 1))
    manager.cleaner.clean("t", 0, now_ms=NOW)
    assert (first.base_offset, b"k", b"v0") not in read_log(partition_log)
    retry = RecordsBuilder(2, "none", producer_id=7, producer_epoch=0, base_sequence=0)
    retry.append(b"v0", key=b"k", timestamp=NOW - DAY)
    result = partition_log.append(retry.build(), now_ms=NOW)
    assert result.duplicate and result.base_offset == first.base_offset
    fetched = partition_log.read(first.base_offset, 1 << 20)
    with fetched.records as records:        # kept as an empty batch: the producer's last sequence
        batch = next(records.batches())
        assert (batch.base_offset, batch.records_count, batch.producer_id) == (first.base_offset, 0, 7)


def test_compressed_batches_are_filtered_and_keep_their_codec(manager):
    partition_log = compacted(manager)
    data = build_records([{"key": b"k%d" % (i % 3), "value": b"v%d" % i, "timestamp": NOW} for i in range(9)],
                         compression="gzip")
    assert partition_log.append(data, now_ms=NOW).error_code == ErrorCode.NONE
    for i in range(30):
        put(partition_log, b"other-%d" % (i % 2), b"x" * 60)
    put(partition_log, b"k0", b"newest")
    manager.cleaner.clean("t", 0, now_ms=NOW)
    records = read_log(partition_log)
    assert [(o, k, v) for o, k, v in records if k in (b"k1", b"k2")] == [(7, b"k1", b"v7"), (8, b"k2", b"v8")]
    fetched = partition_log.read(7, 1 << 20)
    with fetched.records as records:
        batch = next(records.batches())
        assert batch.compression == 1 and (batch.base_offset, batch.last_offset) == (0, 8)
        batch.ensure_valid()


def test_records_younger_than_min_compaction_lag_are_not_cleaned(manager):
    partition_log = compacted(manager, **{"min.compaction.lag.ms": DAY})
    for i in range(100):
        put(partition_log, b"k", b"v%d" % i, timestamp=NOW - 1000)
    before = read_log(partition_log)
    manager.cleaner.clean("t", 0, now_ms=NOW)
    assert read_log(partition_log) == before
    manager.cleaner.clean("t", 0, now_ms=NOW + DAY)
    assert len(read_log(partition_log)) < len(before)


def test_the_filthiest_log_above_its_ratio_is_cleaned_first(manager):
    quiet = compacted(manager, "quiet")
    busy = compacted(manager, "busy")
    for i in range(60):
        put(quiet, b"k%d" % i, b"x" * 40)       # every key once: nothing to gain, but dirty all the same
        put(busy, b"k", b"x" * 40)
    assert manager.cleaner.clean_filthiest(now_ms=NOW)[0] in {("busy", 0), ("quiet", 0)}
    assert manager.cleaner.clean_filthiest(now_ms=NOW)[0] in {("busy", 0), ("quiet", 0)}
    assert manager.cleaner.clean_filthiest(now_ms=NOW) is None          # nothing dirty is left
    assert manager.cleaner.metrics["max-dirty-percent"] == 0


def test_max_compaction_lag_forces_a_clean_below_the_dirty_ratio(manager):
    partition_log = compacted(manager, **{"min.cleanable.dirty.ratio": "0.99", "max.compaction.lag.ms": 1000})
    for i in range(60):
        put(partition_log, b"k%d" % i, b"x" * 40, timestamp=NOW - 5000)
    partition_log.roll()
    manager.cleaner.clean("t", 0, now_ms=NOW)          # all clean now, and all kept
    for i in range(20):
        put(partition_log, b"k", b"y" * 40, timestamp=NOW)
    assert manager.cleaner.clean_filthiest(now_ms=NOW) is None                 # below 0.99, not overdue
    assert manager.cleaner.clean_filthiest(now_ms=NOW + 5000)[0] == ("t", 0)   # overdue (KIP-354)


def test_each_clean_is_logged_and_measured_by_kafkas_cleaner_metrics(manager, caplog):
    caplog.set_level("INFO", logger="kmem.broker.log.cleaner")
    partition_log = compacted(manager, **{"max.compaction.lag.ms": 1000})
    write_updates(partition_log, 300, keys=20)                  # written a day ago
    assert set(manager.cleaner.metrics.values()) == {0}
    before, rewritten = partition_log.size_in_bytes, partition_log.size_in_bytes - partition_log.active.size
    key, stats = manager.cleaner.clean_filthiest(now_ms=NOW)
    after = partition_log.size_in_bytes
    assert key == ("t", 0) and stats.bytes_read == stats.map_bytes_read == rewritten
    metrics = manager.cleaner.metrics
    assert metrics["max-dirty-percent"] == 100                  # nothing was clean before the pass
    assert metrics["max-compaction-delay-secs"] == (DAY - 1000) // 1000
    assert metrics["cleaner-recopy-percent"] == int(100 * stats.bytes_written / rewritten) < 50
    assert metrics["max-clean-time-secs"] == int(stats.elapsed_secs)
    assert f"cleaned t-0: {before} to {after} bytes" in caplog.text and after < before


def test_the_key_maps_use_and_the_uncleanable_partitions_are_kafkas_cleaner_metrics(tmp_path):
    manager = open_manager(tmp_path, log_cleaner_dedupe_buffer_size=24 * 50)
    try:
        partition_log = compacted(manager)
        write_updates(partition_log, 100, keys=20)
        stats = manager.cleaner.clean("t", 0, now_ms=NOW)
        assert stats.map_utilization == 20 / OffsetMap(24 * 50).slots
        assert manager.cleaner.metrics["max-buffer-utilization-percent"] == int(100 * stats.map_utilization) > 0
        assert manager.cleaner.metrics["uncleanable-partitions-count"] == 0
        crowded = compacted(manager, "crowded")
        builder = RecordsBuilder(2, "none")
        for i in range(60):                                     # more keys in one batch than the map holds
            builder.append(b"v", key=b"k%d" % i, timestamp=NOW - DAY)
        assert crowded.append(builder.build(), now_ms=NOW).error_code == ErrorCode.NONE
        write_updates(crowded, 60, keys=2)                      # rolls the batch's segment
        with pytest.raises(LogCleaningError):
            manager.cleaner.clean("crowded", 0, now_ms=NOW)
        assert manager.cleaner.metrics["uncleanable-partitions-count"] == 1
    finally:
        manager.close()


def test_a_retention_or_delete_records_meanwhile_drops_the_pass(manager):
    partition_log = compacted(manager)
    write_updates(partition_log, 100, keys=4)
    segments, _, _ = partition_log.cleanable_segments()
    partition_log.delete_records_before(segments[1].base_offset)
    assert not partition_log.replace_segments(segments[:2], segments[0].base_offset)
    manager.cleaner.clean("t", 0, now_ms=NOW)          # a pass over what is left works
    assert not [n for n in os.listdir(partition_log.directory) if n.endswith((".cleaned", ".swap", ".deleted"))]


# --- the policy -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, stored", [("compact", "compact"), ("delete,compact", "compact,delete"),
                                            ("Compact, Delete", "compact,delete"), ("delete", "delete")])
def test_cleanup_policies_are_accepted(policy, stored):
    config = BrokerConfig.from_properties({"log.cleanup.policy": policy})
    assert config.topic_config().cleanup_policy == stored
    assert config.topic_config({"cleanup.policy": policy}).compact == ("compact" in stored)


@pytest.mark.parametrize("policy", ["", "compaction", "compact,forever"])
def test_unknown_cleanup_policies_are_refused(policy):
    with pytest.raises(ConfigError):
        BrokerConfig.from_properties().topic_config({"cleanup.policy": policy})


def test_a_record_without_a_key_to_a_compacted_topic_is_invalid_record(manager):
    partition_log = compacted(manager)
    for codec in ("none", "lz4"):
        data = build_records([{"key": b"k", "value": b"1"}, {"value": b"no key"}], compression=codec)
        result = partition_log.append(data, now_ms=NOW)
        assert result.error_code == ErrorCode.INVALID_RECORD
        assert "without key" in result.error_message
    assert partition_log.log_end_offset == 0


def test_retention_leaves_a_compact_only_topic_alone(manager):
    partition_log = compacted(manager, **{"retention.ms": 1})
    write_updates(partition_log, 100, keys=4)
    segments = len(partition_log.segments)
    assert manager.maintain(now_ms=NOW + DAY) == 0
    assert len(partition_log.segments) == segments


# --- recovery ---------------------------------------------------------------------------------------------

def test_leftover_cleaned_and_deleted_files_are_removed_at_load(tmp_path):
    manager = open_manager(tmp_path)
    partition_log = compacted(manager)
    writes = write_updates(partition_log, 100, keys=4)
    directory = partition_log.directory
    manager.close()
    for name in ("00000000000000000000.log.cleaned", "00000000000000000000.index.cleaned",
                 "00000000000000000010.log.deleted"):
        with open(os.path.join(directory, name), "wb") as file:
            file.write(b"\0" * 100)
    manager = open_manager(tmp_path)
    try:
        assert read_log(manager.get_partition("t", 0)) == writes
        assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".deleted"))]
    finally:
        manager.close()


def test_a_swap_file_replaces_the_segments_it_covers(tmp_path):
    manager = open_manager(tmp_path)
    partition_log = compacted(manager)
    write_updates(partition_log, 100, keys=4)
    directory = partition_log.directory
    segments, _, _ = partition_log.cleanable_segments()
    first, second = segments[0], segments[1]
    manager.close()
    # a swap of the first two segments, interrupted after the old first segment was renamed .deleted
    stem = os.path.join(directory, "%020d" % first.base_offset)
    with open(stem + ".log", "rb") as a, open(os.path.join(directory, "%020d.log" % second.base_offset), "rb") as b:
        joined = a.read() + b.read()
    os.rename(stem + ".log", stem + ".log.deleted")
    with open(stem + ".log.swap", "wb") as file:
        file.write(joined)
    assert complete_interrupted_swaps(directory) == [first.base_offset]
    assert not os.path.exists(os.path.join(directory, "%020d.log" % second.base_offset))
    manager = open_manager(tmp_path)
    try:
        assert len(read_log(manager.get_partition("t", 0))) == 100
    finally:
        manager.close()


CRASHING_CLEANER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    import test_broker_compaction as t
    calls, kill_at = [0], int(sys.argv[3])

    def counted(call):
        def wrapper(*args, **kwargs):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return call(*args, **kwargs)
        return wrapper
    manager = t.open_manager(sys.argv[1])
    for name in ("rename", "unlink", "pwrite", "fsync"):       # the file operations of a pass
        setattr(os, name, counted(getattr(os, name)))
    for _ in range(3):
        manager.cleaner._first_dirty.clear()        # every pass rewrites the whole log again
        manager.cleaner.clean("t", 0, now_ms=t.NOW)
    print(calls[0])
""")


@pytest.mark.parametrize("kill_at", [1, 2, 4, 7, 11, 16, 23, 31, 40, 52, 67, 85, 110, 140, 180])
def test_sigkill_at_any_point_of_a_clean_keeps_the_latest_record_of_every_key(tmp_path, kill_at):
    manager = open_manager(tmp_path / "logs")
    partition_log = compacted(manager, **{"segment.bytes": 400})
    writes = write_updates(partition_log, 150, keys=7, tombstone_every=9, seed=kill_at)
    manager.close()
    process = subprocess.run([sys.executable, "-c", CRASHING_CLEANER, str(tmp_path / "logs"),
                              os.path.dirname(__file__), str(kill_at)], capture_output=True, text=True)
    assert process.returncode == -signal.SIGKILL, (process.stdout, process.stderr[-2000:])
    manager = open_manager(tmp_path / "logs")
    try:
        partition_log = manager.get_partition("t", 0)
        assert not [n for n in os.listdir(partition_log.directory) if n.endswith((".cleaned", ".swap", ".deleted"))]
        records = read_log(partition_log)
        assert set(records) <= set(writes)                  # nothing made up, offsets kept
        assert [o for o, _, _ in records] == sorted({o for o, _, _ in records})
        newest = {key: (offset, value) for offset, key, value in writes}
        survivors = {key: (offset, value) for offset, key, value in records}
        # every key keeps its newest record (a tombstone may have gone, once past its horizon: not here)
        assert survivors == newest
        assert partition_log.log_end_offset == writes[-1][0] + 1
    finally:
        manager.close()
