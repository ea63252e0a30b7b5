"""kmem.broker storage: configuration, the log directory's files, appends and reads, indexes, rolls,
retention, ListOffsets and topics."""
import dataclasses
import errno
import itertools
import json
import os
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioDefaultBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder as AioLegacyBuilder
from kafka.record.default_records import DefaultRecordBatchBuilder as KpDefaultBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder as KpLegacyBuilder

from kmem.broker import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, BrokerConfig, ErrorCode, LogError, LogManager,
    OffsetAndTimestamp,
)
from kmem import _core
from broker_helpers import wait_for
from records_samples import MINIMAL_RECORD, read_aiokafka, read_kafka_python, v2_batch_of
from kmem.broker.log import checkpoints, validator
from kmem.broker.log import index as index_module
from kmem.broker.log import segment as segment_module
from kmem.broker.log.index import CorruptIndexError
from kmem.errors import ConfigError, IllegalStateError, InvalidArgumentError
from kmem.records import MemoryRecords, RecordsBuilder, TimestampType, codecs

NOW = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def now_ms():
    return time.time_ns() // 1_000_000


def batch(values, magic=2, codec="none", timestamp=None, **fields):
    builder = RecordsBuilder(magic, codec, **fields)
    stamp = now_ms() if timestamp is None else timestamp
    for i, value in enumerate(values):
        builder.append(value, key=b"k%d" % i, timestamp=stamp + i if magic else -1)
    return builder.build()


def open_manager(path, clock=None, **settings):
    return LogManager(path, BrokerConfig.from_properties(producer_ledger_ids=100, **settings), clock_ms=clock)


@pytest.fixture
def manager(tmp_path):
    opened = open_manager(tmp_path / "logs")
    yield opened
    opened.close()


def read_all(partition_log, offset=0):
    """Every record from ``offset`` on, fetch after fetch (a fetch reads from one segment, as Kafka's)."""
    found = []
    while (fetched := partition_log.read(offset, 1 << 30)).records is not None:
        with fetched.records as records:
            found += [(r.offset, r.timestamp, r.key, r.value) for r in records.records()]
        offset = found[-1][0] + 1
    return found


# --- configuration --------------------------------------------------------------------------------------

def test_config_defaults_are_kafkas():
    config = BrokerConfig.from_properties()
    topic = config.topic_config()
    assert (config.num_partitions, config.auto_create_topics_enable) == (1, True)
    assert config.producer_id_expiration_ms == 86_400_000
    assert (topic.segment_bytes, topic.segment_ms, topic.retention_ms, topic.retention_bytes) == (
        1 << 30, 7 * 86_400_000, 7 * 86_400_000, -1)
    assert (topic.max_message_bytes, topic.message_timestamp_type, topic.message_downconversion_enable) == (
        1048588, "CreateTime", True)
    assert (topic.index_interval_bytes, topic.segment_index_bytes) == (4096, 10 << 20)


def test_config_names_strings_and_precedence():
    config = BrokerConfig.from_properties({"log.retention.hours": "1", "log.retention.minutes": "5",
                                           "log.roll.hours": 2, "auto.create.topics.enable": "false"},
                                          log_segment_bytes="4096")
    assert config.retention_ms == 300_000          # minutes over hours, as Kafka
    assert config.segment_ms == 7_200_000
    assert config.auto_create_topics_enable is False
    assert config.topic_config().segment_bytes == 4096
    assert BrokerConfig.from_properties({"log.retention.ms": -1, "log.retention.hours": 1}).retention_ms == -1
    topic = config.topic_config({"retention.ms": "10", "message.timestamp.type": "LogAppendTime"})
    assert topic.retention_ms == 10 and topic.log_append_time
    assert topic.properties()["segment.bytes"] == 4096


@pytest.mark.parametrize("properties", [
    {"log.segment.bytes": 13}, {"log.segment.bytes": 2**31}, {"num.partitions": 0}, {"num.partitions": "x"},
    {"num.partitions": True}, {"log.message.timestamp.type": "Now"}, {"no.such.setting": 1},
    {"log.message.downconversion.enable": "yes"}, {"compression.type": "brotli"}, {"log.retention.ms": -2},
    {"producer.id.expiration.ms": 0}, {"producer.id.expiration.check.interval.ms": 0},
    {"log.cleanup.policy": "compaction"}, {"log.cleanup.policy": ""}, {"min.insync.replicas": 2},
])
def test_config_rejects_bad_values(properties):
    with pytest.raises(ConfigError) as raised:
        BrokerConfig.from_properties(properties)
    assert next(iter(properties)) in str(raised.value)


def test_topic_config_rejects_unknown_and_bad_values():
    with pytest.raises(ConfigError, match="cleanup.polizy"):
        BrokerConfig().topic_config({"cleanup.polizy": "delete"})
    with pytest.raises(ConfigError, match="segment.ms"):
        BrokerConfig().topic_config({"segment.ms": 0})



def test_topics_and_partition_counts_follow_topics_created_grown_reconfigured_and_deleted(tmp_path):
    def described(manager):
        return {name: (info.partitions, dict(info.configs)) for name, info in manager.topics().items()}

    with open_manager(tmp_path / "logs") as manager:
        assert manager.partition_count("orders") == 0 and described(manager) == {}
        first_id = manager.create_topic("orders", 2, {"retention.ms": 1000})
        assert manager.partition_count("orders") == 2 and manager.topic_name(first_id) == "orders"
        assert described(manager) == {"orders": (2, {"retention.ms": 1000})}
        manager.add_partitions("orders", 5)
        manager.set_topic_configs("orders", {"cleanup.policy": "compact"})
        assert manager.partition_count("orders") == 5
        assert described(manager) == {"orders": (5, {"cleanup.policy": "compact"})}
        with pytest.raises(TypeError):
            manager.topics()["orders"].configs["retention.ms"] = 1        # shared: read-only
        manager.topics().pop("orders")                                    # the mapping itself is the caller's
        manager.delete_topic("orders")
        assert manager.partition_count("orders") == 0 and described(manager) == {}
        second_id = manager.create_topic("orders", 3)
        assert manager.partition_count("orders") == 3 and described(manager) == {"orders": (3, {})}
        assert manager.topic_name(first_id) is None and manager.topic_name(second_id) == "orders"
        for name in (f"absent-{i}" for i in range(1000)):      # names asked of absent topics are not kept
            assert manager.partition_count(name) == 0
        assert len(manager._partition_counts) == 1

# --- the log directory's files ----------------------------------------------------------------------------

def test_create_topic_syncs_each_new_directory_once_after_its_files(tmp_path, monkeypatch):
    """Both checkpoint files' data are synced, then each partition directory once (the renames of both,
    and the segment files), then the log directory (the new partition directories)."""
    path = tmp_path / "logs"
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
    with open_manager(path) as manager:
        monkeypatch.setattr(os, "fsync", fsync)
        manager.create_topic("orders", 2)
        monkeypatch.undo()
    for partition in ("orders-0", "orders-1"):
        directory = str(path / partition)
        mine = [p for p in synced if p.startswith(directory)]
        assert mine == [f"{directory}/partition.metadata.tmp", f"{directory}/leader-epoch-checkpoint.tmp", directory]
        assert set(os.listdir(directory)) >= {"partition.metadata", "leader-epoch-checkpoint", "00000000000000000000.log"}
    assert synced[-1] == str(path) and synced.count(str(path)) == 1


def test_log_directory_files_are_kafkas(tmp_path):
    path = tmp_path / "logs"
    with open_manager(path) as manager:
        topic_id = manager.create_topic("orders", 2, {"retention.ms": 1000})
        assert manager.get_partition("orders", 0).append(batch([b"a", b"b"])).error_code == ErrorCode.NONE
    assert len(checkpoints.uuid_bytes(topic_id)) == 16 and len(topic_id) == 22
    assert (path / "orders-0" / "partition.metadata").read_bytes() == f"version: 0\ntopic_id: {topic_id}".encode()
    assert (path / "orders-0" / "leader-epoch-checkpoint").read_bytes() == b"0\n1\n0 0\n"
    assert (path / "recovery-point-offset-checkpoint").read_bytes() == b"0\n2\norders 0 2\norders 1 0\n"
    # Kafka lists only logs that start above their first segment's base offset
    assert (path / "log-start-offset-checkpoint").read_bytes() == b"0\n0\n"
    assert (path / "replication-offset-checkpoint").read_bytes() == b"0\n2\norders 0 2\norders 1 0\n"
    assert (path / ".kafka_cleanshutdown").read_bytes() == b'{"version":0,"brokerEpoch":-1}'
    lines = (path / "meta.properties").read_text().splitlines()
    assert lines[0] == "#" and lines[1].startswith("#")
    properties = dict(line.split("=", 1) for line in lines[2:])
    assert properties["version"] == "1" and properties["node.id"] == "1"
    assert len(checkpoints.uuid_bytes(properties["cluster.id"])) == 16
    assert sorted(os.listdir(path / "orders-1")) >= ["00000000000000000000.index", "00000000000000000000.log",
                                                      "00000000000000000000.timeindex"]
    with open_manager(path) as manager:
        assert manager.topics()["orders"].topic_id == topic_id
        assert manager.topics()["orders"].partitions == 2
        assert manager.get_partition("orders", 0).config.retention_ms == 1000
        assert manager.had_clean_shutdown and not (path / ".kafka_cleanshutdown").exists()
        assert manager.cluster_id == properties["cluster.id"]


def test_one_manager_per_log_directory(tmp_path):
    with open_manager(tmp_path):
        with pytest.raises(IllegalStateError, match="in use"):
            open_manager(tmp_path)
    open_manager(tmp_path).close()


def test_checkpoints_refuse_malformed_files(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(b"0\n2\nt 0 5\n")
    with pytest.raises(checkpoints.CorruptCheckpointError, match="expected 2 entries"):
        checkpoints.read_offset_checkpoint(path)
    path.write_bytes(b"0\n1\nt zero 5\n")
    with pytest.raises(checkpoints.CorruptCheckpointError, match="line 3"):
        checkpoints.read_offset_checkpoint(path)
    path.write_bytes(b"1\n0\n")
    with pytest.raises(checkpoints.CorruptCheckpointError, match="version"):
        checkpoints.read_offset_checkpoint(path)


def test_meta_properties_of_another_node_is_refused(tmp_path):
    open_manager(tmp_path).close()
    with pytest.raises(IllegalStateError, match="node 1, not node 2"):
        open_manager(tmp_path, node_id=2)


def test_topics_create_delete_and_names(manager, tmp_path):
    manager.create_topic("a.b_c-1", 3)
    assert sorted(manager.topics()) == ["a.b_c-1"]
    assert manager.get_partition("a.b_c-1", 2) is not None and manager.get_partition("a.b_c-1", 3) is None
    with pytest.raises(LogError) as raised:
        manager.create_topic("a.b_c-1")
    assert raised.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
    for bad in ("", ".", "..", "x" * 250, "spaces no", "slash/"):
        with pytest.raises(LogError) as raised:
            manager.create_topic(bad)
        assert raised.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    with pytest.raises(LogError) as raised:
        manager.create_topic("p", 0)
    assert raised.value.code == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(LogError) as raised:
        manager.create_topic("c", 1, {"segment.bytes": 1})
    assert raised.value.code == ErrorCode.INVALID_CONFIG
    manager.delete_topic("a.b_c-1")
    assert manager.topics() == {}
    assert not [n for n in os.listdir(manager.log_dir) if n.startswith("a.b_c-1")]
    with pytest.raises(LogError) as raised:
        manager.delete_topic("a.b_c-1")
    assert raised.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_producer_ids_are_never_reissued(tmp_path):
    issued = []
    for _ in range(3):
        with open_manager(tmp_path) as manager:
            issued += [manager.allocate_producer_id() for _ in range(5)]
    manager = open_manager(tmp_path)
    issued += [manager.allocate_producer_id() for _ in range(1200)]
    del manager                 # not closed: as after a crash
    with open_manager(tmp_path) as manager:
        issued.append(manager.allocate_producer_id())
    assert len(set(issued)) == len(issued)
    assert issued[:5] == [0, 1, 2, 3, 4] and issued[5] == 1000
    assert (tmp_path / "kmem-producer-id-block").read_bytes() == f"0\n{issued[-1] // 1000 * 1000 + 1000}\n".encode()


# --- appends and reads ----------------------------------------------------------------------------------

def _peer_build(default_builder, legacy_builder, magic, codec, values, timestamp):
    codec_id = CODECS.index(codec)
    if magic == 2:
        builder = default_builder(2, codec_id, 0, -1, -1, -1, 1 << 30)
        for i, value in enumerate(values):
            builder.append(i, timestamp + i, b"k%d" % i, value, [])
    else:
        builder = legacy_builder(magic, codec_id, 1 << 30)
        for i, value in enumerate(values):
            builder.append(i, None if magic == 0 else timestamp + i, b"k%d" % i, value)
    return bytes(builder.build())


BUILDERS = {
    "kmem": lambda magic, codec, values, timestamp: batch(values, magic, codec, timestamp),
    "kafka-python": lambda *a: _peer_build(KpDefaultBuilder, KpLegacyBuilder, *a),
    "aiokafka": lambda *a: _peer_build(AioDefaultBuilder, AioLegacyBuilder, *a),
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("magic, codec", [(magic, codec) for magic in (0, 1, 2) for codec in CODECS
                                          if codec != "zstd" or magic == 2])     # zstd exists only in magic 2
def test_round_trip_every_magic_and_codec(manager, builder, magic, codec):
    if builder == "aiokafka" and magic == 0 and codec == "lz4":
        pytest.skip("aiokafka refuses to write lz4 for magic 0")
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    stamp = now_ms()
    expected, sent_codecs = [], []
    for round_ in range(3):
        values = [b"r%d-%d" % (round_, i) * (round_ + 1) for i in range(4)]
        data = BUILDERS[builder](magic, codec, values, stamp)
        sent_codecs.append(next(iter(MemoryRecords(data))).compression)   # small batches go uncompressed
        result = partition_log.append(data)
        assert result.error_code == ErrorCode.NONE, result
        assert (result.base_offset, result.last_offset) == (4 * round_, 4 * round_ + 3)
        expected += [(4 * round_ + i, stamp + i if magic else -1, b"k%d" % i, v) for i, v in enumerate(values)]
    assert read_all(partition_log) == expected
    with partition_log.read(0, 1 << 20).records as records:     # what the clients' own readers see
        stored_bytes = records.read(0, records.size_in_bytes)
    for reader in (read_kafka_python, read_aiokafka):
        assert [(o, t, k, v) for o, t, k, v, _ in reader(stored_bytes)] == expected, reader
    fetched = partition_log.read(5, 1 << 20)
    with fetched.records as records:
        stored = list(records)
    assert {b.magic for b in stored} == {2}, "v0/v1 input is stored as magic 2"
    assert [b.compression for b in stored] == sent_codecs[1:], "the producer's codec is kept"
    assert all(b.is_valid() and b.partition_leader_epoch == 0 for b in stored)
    assert stored[0].base_offset == 4 and fetched.high_watermark == 12 == fetched.last_stable_offset


def test_append_writes_the_request_buffer_without_changing_it(manager):
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    data = bytearray(batch([b"x" * 100, b"y"]))
    before = bytes(data)
    partition_log.append(batch([b"first"]))
    partition_log.append(memoryview(data))
    assert bytes(data) == before
    with partition_log.read(1, 1 << 20).records as records:
        stored = records.read(0, records.size_in_bytes)
    # Only the base offset and the partition leader epoch were set (neither is covered by the CRC).
    assert stored[16:] == before[16:] and struct.unpack_from(">qii", stored) == (1, len(before) - 12, 0)


def test_log_append_time_topic(manager):
    clock_now = now_ms()
    manager.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime"})
    partition_log = manager.get_partition("t", 0)
    for magic in (2, 1, 0):
        result = partition_log.append(batch([b"a", b"b"], magic, "gzip", timestamp=5), now_ms=clock_now + magic)
        assert result.log_append_time == clock_now + magic
    with partition_log.read(0, 1 << 20).records as records:
        stored = list(records)
    assert all(b.timestamp_type == TimestampType.LOG_APPEND_TIME and b.is_valid() for b in stored)
    assert [r[1] for r in read_all(partition_log)] == [clock_now + 2] * 2 + [clock_now + 1] * 2 + [clock_now] * 2


def test_append_errors_carry_kafkas_codes(manager):
    manager.create_topic("t", 1, {"max.message.bytes": 200})
    partition_log = manager.get_partition("t", 0)
    good = batch([b"v"])
    corrupt = bytearray(good)
    corrupt[-1] ^= 1
    based = bytearray(good)
    struct.pack_into(">q", based, 0, 7)
    count_mismatch = bytearray(batch([b"v", b"w"]))
    struct.pack_into(">i", count_mismatch, 57, 3)
    struct.pack_into(">I", count_mismatch, 17, _core.crc32c(memoryview(count_mismatch)[21:]))
    cases = {
        ErrorCode.CORRUPT_MESSAGE: [bytes(corrupt), b"\x00" * 8 + b"\x00\x00\x00\x01" + b"\x00" * 20],
        ErrorCode.MESSAGE_TOO_LARGE: [batch([b"x" * 300])],
        ErrorCode.INVALID_RECORD: [bytes(based), b"", good[:-1], good + batch([b"old"], magic=1),
                                   batch([b"a"], codec="gzip") * 2, bytes(count_mismatch),
                                   batch([b"seq"], producer_id=1, producer_epoch=0, base_sequence=-1)],
    }
    for code, inputs in cases.items():
        for data in inputs:
            result = partition_log.append(data)
            assert result.error_code == code, (code, data[:20])
            assert result.base_offset == -1 and result.error_message
    assert partition_log.log_end_offset == 0 and read_all(partition_log) == []
    assert partition_log.append(good + good[:-3]).last_offset == 0, "a truncated trailing batch is dropped"


def test_records_that_do_not_parse_are_invalid(manager):
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    for codec in ("none", "gzip"):
        # One record declared (count and last offset delta agree), two in the body, a valid CRC.
        data = bytearray(batch([b"a", b"b"], codec=codec))
        struct.pack_into(">i", data, 23, 0)
        struct.pack_into(">i", data, 57, 1)
        struct.pack_into(">I", data, 17, _core.crc32c(memoryview(data)[21:]))
        result = partition_log.append(bytes(data))
        assert result.error_code == ErrorCode.INVALID_RECORD and "record structure" in result.error_message
    assert partition_log.log_end_offset == 0


def test_records_of_any_bytes_like_form_append_as_their_bytes_say(manager):
    """The core's append reads bytes and flat byte memoryviews itself and leaves every other form (another
    format, ``MemoryRecords``, a bytearray) to the validator: each appends the same; a strided view or a released
    one is refused, as before."""
    manager.create_topic("t", 1, {"compression.type": "producer"})
    partition_log = manager.get_partition("t", 0)
    data = batch([b"a", b"b"], timestamp=NOW)
    forms = [data, memoryview(data), memoryview(bytearray(data)), bytearray(data), memoryview(data).cast("c"),
             memoryview(bytearray(data)).cast("H") if len(data) % 2 == 0 else memoryview(data).cast("b"),
             MemoryRecords(data)]
    results = []
    for form in forms:
        result = partition_log.append(form)
        assert result.error_code == ErrorCode.NONE, (type(form), result)
        results.append((result.base_offset, result.last_offset))
    assert results == [(2 * i, 2 * i + 1) for i in range(len(forms))]
    assert [(offset, value) for offset, _, _, value in read_all(partition_log)] == \
        [(offset, b"ab"[offset % 2:offset % 2 + 1]) for offset in range(2 * len(forms))]
    doubled = bytearray(len(data) * 2)
    doubled[::2] = data
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        partition_log.append(memoryview(doubled)[::2])
    released = memoryview(data)
    released.release()
    with pytest.raises(ValueError):
        partition_log.append(released)
    assert partition_log.log_end_offset == 2 * len(forms)


def test_bad_arguments_raise_kmem_errors(manager):
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    with pytest.raises(InvalidArgumentError, match="bytes-like"):
        partition_log.append(12)
    with pytest.raises(InvalidArgumentError, match="origin"):
        partition_log.append(batch([b"v"]), origin="leader")
    with pytest.raises(InvalidArgumentError, match="fetch_offset"):
        partition_log.read("0", 100)
    with pytest.raises(InvalidArgumentError, match="isolation"):
        partition_log.read(0, 100, isolation=7)
    with pytest.raises(InvalidArgumentError, match="timestamp"):
        partition_log.offset_for_timestamp(None)


def test_topic_ids_and_interrupted_deletions(tmp_path):
    with open_manager(tmp_path) as manager:
        topic_id = manager.create_topic("t")
        assert manager.topic_name(topic_id) == "t" and manager.topic_name("AAAAAAAAAAAAAAAAAAAAAA") is None
    leftover = tmp_path / "gone-0.0123456789abcdef0123456789abcdef-delete"
    leftover.mkdir()
    (leftover / "00000000000000000000.log").write_bytes(b"x")
    with open_manager(tmp_path) as manager:
        assert not leftover.exists() and sorted(manager.topics()) == ["t"]


def test_record_list_too_large(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=1000) as manager:
        manager.create_topic("t")
        result = manager.get_partition("t", 0).append(batch([b"x" * 400, b"y" * 400, b"z" * 400]))
        assert result.error_code == ErrorCode.RECORD_LIST_TOO_LARGE


def test_read_bounds_and_min_one_message(manager):
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    for i in range(10):
        partition_log.append(batch([b"v%d" % i * 50]))
    first_size = partition_log.read(0, 1).records.size_in_bytes
    assert first_size > 1                               # the first batch whole, though larger than max_bytes
    assert partition_log.read(0, 1, min_one_message=False).records.size_in_bytes == 1
    assert partition_log.read(0, first_size * 3).records.size_in_bytes == first_size * 3
    assert [r[0] for r in read_all(partition_log, 7)] == [7, 8, 9]
    assert partition_log.read(10, 100).records is None
    assert partition_log.read(10, 100).error_code == ErrorCode.NONE
    for offset in (11, -1):
        fetched = partition_log.read(offset, 100)
        assert fetched.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and fetched.records is None
        assert (fetched.high_watermark, fetched.log_start_offset) == (10, 0)


def test_a_read_shorter_than_copy_below_comes_as_the_same_bytes(tmp_path):
    """``copy_below``: a slice shorter than it is read at once as ``bytes`` (no descriptor), equal to the slice a
    ``FileRecords`` gives, from the active segment and from an older one; one as long goes as ``FileRecords``."""
    with open_manager(tmp_path, log_segment_bytes=2000) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(30):
            partition_log.append(batch([b"v%d" % i * 40]))
        assert len(partition_log.segments) > 2
        for offset in (0, 12, 29):                       # older segments, then the active one
            for max_bytes in (1, 300, 1 << 20):
                with partition_log.read(offset, max_bytes).records as records:
                    stored = records.read(0, records.size_in_bytes)
                copied = partition_log.read(offset, max_bytes, copy_below=len(stored) + 1)
                assert isinstance(copied.records, bytes) and copied.records == stored
                kept = partition_log.read(offset, max_bytes, copy_below=len(stored)).records
                assert not isinstance(kept, bytes) and kept.size_in_bytes == len(stored)
                kept.close()
        assert partition_log.read(30, 100, copy_below=1 << 20).records is None
        with pytest.raises(InvalidArgumentError, match="copy_below"):
            partition_log.read(0, 100, copy_below=None)
        # bounds past int64 bound nothing (or everything), and nothing is copied below 0 bytes
        with partition_log.read(29, 1 << 20).records as records:
            tail = records.read(0, records.size_in_bytes)
        assert partition_log.read(29, 2**64, copy_below=2**64).records == tail
        for copy_below in (-1, -2**64):
            with partition_log.read(29, 1 << 20, copy_below=copy_below).records as records:
                assert records.read(0, records.size_in_bytes) == tail
        assert partition_log.read(29, -2**64, min_one_message=False).records is None
        assert partition_log.read(29, -2**64, copy_below=1 << 20).records == tail       # the first batch whole


def test_listeners_are_told_of_appends(manager):
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    seen = []
    partition_log.add_listener(lambda log: seen.append(log.log_end_offset))
    partition_log.append(batch([b"a", b"b"]))
    partition_log.append(b"")                  # refused: no wake-up
    assert seen == [2]


# --- rebuilding batches: recompression (compression.type) and up-conversion ---------------------------

REBUILT_SOURCES = [(2, codec) for codec in CODECS] + [(magic, codec) for magic in (0, 1) for codec in CODECS[:4]]


def _client_batch(magic, codec, producer_id):
    """Records of every shape: null and empty keys and values, headers (v2), timestamps out of order; v2
    with an idempotent (odd ids: transactional) producer's fields."""
    fields = {}
    if magic == 2:
        fields = {"producer_id": producer_id, "producer_epoch": 3, "base_sequence": 5,
                  "transactional": producer_id % 2 == 1}
    builder = RecordsBuilder(magic, codec, **fields)
    for i in range(40):
        builder.append(None if i % 9 == 4 else b"value %d " % i * (i % 5), key=None if i % 3 == 0 else b"k%d" % i,
                       timestamp=NOW + (i * 37) % 50 if magic else -1,
                       headers=[("h", b"%d" % i), ("null", None)] if magic == 2 and i % 2 else ())
    return builder.build()


def _rebuilt_by_builder(sources, codec, base_offset, **fields):
    """The batch Kafka's way of rebuilding makes of ``sources`` (every record appended to a new batch)."""
    first = next(iter(MemoryRecords(sources[0])))
    if first.magic == 2 and first.producer_id >= 0:
        fields.update(producer_id=first.producer_id, producer_epoch=first.producer_epoch,
                      base_sequence=first.base_sequence, transactional=first.is_transactional)
    builder = RecordsBuilder(2, codec, base_offset=base_offset, partition_leader_epoch=0, **fields)
    for source in sources:
        for record in MemoryRecords(source).records():
            builder.append(record.value, key=record.key, timestamp=max(record.timestamp, -1), headers=record.headers)
    (rebuilt,) = MemoryRecords(builder.build())
    return rebuilt


def _assert_same_batch(stored, expected):
    header = ("magic", "attributes", "base_offset", "last_offset", "base_timestamp", "max_timestamp", "producer_id",
              "producer_epoch", "base_sequence", "records_count", "partition_leader_epoch")
    assert [getattr(stored, f) for f in header] == [getattr(expected, f) for f in header]
    assert stored.is_valid() and list(stored) == list(expected)
    codec = stored.compression
    if codec in (codecs.NONE, codecs.SNAPPY, codecs.LZ4):        # the same blocks: the same bytes
        assert bytes(stored.buffer) == bytes(expected.buffer)
    else:       # gzip and zstd compress a stream: other bytes, the same records section
        assert bytes(codecs.decompress(codec, stored.buffer[61:], 2)) == \
            bytes(codecs.decompress(codec, expected.buffer[61:], 2))


@pytest.mark.parametrize("topic_codec", ["uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_rebuilt_batches_hold_the_same_records_as_before(manager, topic_codec):
    manager.create_topic("t", 1, {"compression.type": topic_codec})
    partition_log = manager.get_partition("t", 0)
    target = codecs.codec_id("none" if topic_codec == "uncompressed" else topic_codec)
    requests = [[_client_batch(magic, codec, producer_id)]
                for producer_id, (magic, codec) in enumerate(REBUILT_SOURCES)]
    if target != codecs.NONE:       # uncompressed batches, rebuilt as one
        requests.append([batch([b"a", b"b"]), batch([b"c"], timestamp=NOW - 5)])
    for sources in requests:
        result = partition_log.append(b"".join(sources))
        assert result.error_code == ErrorCode.NONE, result
        with partition_log.read(result.base_offset, 1 << 20).records as records:
            (stored,) = records
            _assert_same_batch(stored, _rebuilt_by_builder(sources, target, result.base_offset))
    assert partition_log.log_end_offset == 40 * len(REBUILT_SOURCES) + (3 if target != codecs.NONE else 0)


def test_rebuilt_batch_on_a_log_append_time_topic(manager):
    manager.create_topic("t", 1, {"compression.type": "lz4", "message.timestamp.type": "LogAppendTime"})
    partition_log = manager.get_partition("t", 0)
    sources = [_client_batch(2, "gzip", 1)]
    result = partition_log.append(sources[0], now_ms=NOW + 1000)
    with partition_log.read(0, 1 << 20).records as records:
        (stored,) = records
        _assert_same_batch(stored, _rebuilt_by_builder(sources, codecs.LZ4, 0, log_append_time=NOW + 1000,
                                                       timestamp_type=TimestampType.LOG_APPEND_TIME))
    assert result.log_append_time == NOW + 1000 == stored.max_timestamp


def _with_crc(data):
    data = bytearray(data)
    struct.pack_into(">I", data, 17, _core.crc32c(memoryview(data)[21:]))
    return bytes(data)


def test_rebuilding_refuses_bad_records_with_kafkas_codes(manager):
    manager.create_topic("t", 1, {"compression.type": "lz4"})
    manager.create_topic("p", 1)        # compression.type=producer: v0/v1 keep their codec
    gzip_batch = batch([b"a", b"b"], codec="gzip")
    garbled = _with_crc(gzip_batch[:70] + bytes(len(gzip_batch) - 80) + gzip_batch[-10:])
    empty_gzip = v2_batch_of(b"", 2, codecs.GZIP)          # two records declared
    wrapper = bytearray(batch([b"a"], magic=1, codec="gzip"))
    unknown_codec = wrapper[:17] + b"\x05" + wrapper[18:]          # codec 5 names none
    inner = _core.encode_legacy_entries(1, codecs.GZIP, [(0, 1, None, b"")])     # compressed inside compressed
    nested = _core.encode_legacy_entries(1, codecs.GZIP, [(0, 1, None, codecs.compress(codecs.GZIP, inner, 1))])
    hollow = _core.encode_legacy_entries(1, codecs.GZIP, [(0, 1, None, codecs.compress(codecs.GZIP, b"", 1))])
    bomb = v2_batch_of(_core.encode_v2_records([(0, 0, None, bytes(codecs.MAX_DECOMPRESSED_BYTES), [])]), 1,
                       codecs.ZSTD)
    cases = [("t", garbled, ErrorCode.INVALID_RECORD, "cannot decompress"),
             ("t", empty_gzip, ErrorCode.INVALID_RECORD, "count does not match"),
             ("t", bomb, ErrorCode.CORRUPT_MESSAGE, "exceeds the limit"),
             ("p", bomb, ErrorCode.CORRUPT_MESSAGE, "exceeds the limit"),      # checked in place: the same code
             ("p", _with_crc_legacy(unknown_codec), ErrorCode.CORRUPT_MESSAGE, "unknown compression codec 5"),
             ("t", nested, ErrorCode.CORRUPT_MESSAGE, "nested"),
             ("t", hollow, ErrorCode.CORRUPT_MESSAGE, "no inner messages")]
    for topic, data, code, message in cases:
        partition_log = manager.get_partition(topic, 0)
        result = partition_log.append(data)
        assert (result.error_code, partition_log.log_end_offset) == (code, 0), (topic, message, result)
        assert message in result.error_message


def _with_crc_legacy(entry):
    entry = bytearray(entry)
    struct.pack_into(">I", entry, 12, zlib.crc32(memoryview(entry)[16:]))
    return bytes(entry)


# A child interpreter appends one batch and reports its peak RSS during the append (native allocations
# of zlib and zstd included, which tracemalloc does not see) over its RSS before: the kernel's high-water
# mark (VmHWM), reset just before. (ru_maxrss would not do: a child's starts at its parent's RSS.)
APPEND_MEASURED = """
import json, sys, tempfile
from kmem.broker import BrokerConfig, LogManager

def memory(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))

path, compression = sys.argv[1:]
data = open(path, "rb").read()
with tempfile.TemporaryDirectory() as directory:
    manager = LogManager(directory, BrokerConfig.from_properties())
    manager.create_topic("t", 1, {"compression.type": compression})
    partition_log = manager.get_partition("t", 0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")       # resets VmHWM to the RSS now
    before = memory("VmRSS")
    result = partition_log.append(data)
    print(json.dumps({"code": int(result.error_code), "message": result.error_message,
                      "growth": memory("VmHWM") - before, "end": partition_log.log_end_offset}))
    manager.close()
"""


def _append_measured(tmp_path, data, compression):
    path = tmp_path / "batch"
    path.write_bytes(data)
    child = subprocess.run([sys.executable, "-c", APPEND_MEASURED, str(path), compression], capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def _hostile_batches(topic_codec):
    """(name, batch, decompressed input the rebuild holds) of tiny batches expanding to millions of records,
    in codecs other than ``topic_codec`` (a batch of the topic's codec is not rebuilt)."""
    many = 2_000_000
    batches = [(f"{codecs.codec_name(codec)}, 2 M empty records",
                v2_batch_of(MINIMAL_RECORD * many, many, codec),
                4 * len(MINIMAL_RECORD) * many if codec == codecs.ZSTD else 2 * codecs.CHUNK_BYTES)
               for codec in (codecs.ZSTD, codecs.GZIP, codecs.LZ4) if codecs.codec_name(codec) != topic_codec]
    empty_v1 = _core.encode_legacy_entries(1, 0, [(0, 1, None, b"")])
    many = 1_900_000        # 65 MB once inflated
    wrapper = _core.encode_legacy_entries(1, codecs.GZIP, [(many - 1, 1, None,
                                                            codecs.compress(codecs.GZIP, empty_v1 * many, 1))])
    return batches + [("v1 gzip wrapper, 1.9 M empty messages", wrapper, 2 * codecs.CHUNK_BYTES)]


@pytest.mark.parametrize("topic_codec", ["gzip", "lz4"])
def test_rebuilding_hostile_batches_stays_in_its_memory_bound(tmp_path, topic_codec):
    """Tiny batches of millions of records rebuilt in another codec exceed max.message.bytes once rebuilt:
    refused as soon as the output does, within the bound validator.py states (2.25 x max.message.bytes, the
    decompressed input held (zstd comes whole, in a buffer grown 4x at a time) and the overhead). They used to
    cost 0.5-1.2 GB of Python objects."""
    limit = BrokerConfig.from_properties().topic_config().max_message_bytes
    for name, data, held in _hostile_batches(topic_codec):
        assert len(data) < 400_000, name
        measured = _append_measured(tmp_path, data, topic_codec)
        assert (measured["code"], measured["end"]) == (ErrorCode.MESSAGE_TOO_LARGE, 0), (name, measured)
        assert measured["growth"] < 9 * limit // 4 + held + validator.REBUILD_OVERHEAD_BYTES, (name, measured)
    # fewer records fit once rebuilt: accepted, within the same bound
    many = 200_000
    data = v2_batch_of(MINIMAL_RECORD * many, many, codecs.ZSTD)
    measured = _append_measured(tmp_path, data, topic_codec)
    assert (measured["code"], measured["end"]) == (ErrorCode.NONE, many), measured
    held = 4 * len(MINIMAL_RECORD) * many
    assert measured["growth"] < 9 * limit // 4 + held + validator.REBUILD_OVERHEAD_BYTES, measured


@pytest.mark.parametrize("codec", [codecs.GZIP, codecs.ZSTD])
def test_rebuilding_one_record_as_large_as_the_decompression_limit_stays_in_its_memory_bound(tmp_path, codec):
    """One record of MAX_DECOMPRESSED_BYTES in a few KB: CORRUPT_MESSAGE once the limit is passed, and a
    little less is rebuilt (a value of zeros compresses under max.message.bytes), both within the worst
    case validator.py states (the record as read and as rewritten, beside the input held)."""
    limit = BrokerConfig.from_properties().topic_config().max_message_bytes
    bound = 9 * limit // 4 + 3 * codecs.MAX_DECOMPRESSED_BYTES + validator.REBUILD_OVERHEAD_BYTES
    for size, code in [(codecs.MAX_DECOMPRESSED_BYTES, ErrorCode.CORRUPT_MESSAGE),
                       (codecs.MAX_DECOMPRESSED_BYTES - (4 << 20), ErrorCode.NONE)]:
        data = v2_batch_of(_core.encode_v2_records([(0, 0, None, bytes(size), [])]), 1, codec)
        assert len(data) < 100_000
        measured = _append_measured(tmp_path, data, "lz4")
        assert (measured["code"], measured["end"]) == (code, 1 if code == ErrorCode.NONE else 0), measured
        assert code == ErrorCode.NONE or "exceeds the limit" in measured["message"]
        assert measured["growth"] < bound, measured


# --- indexes ------------------------------------------------------------------------------------------

def test_index_files_have_kafkas_layout(tmp_path):
    with open_manager(tmp_path, log_index_interval_bytes=0) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        sizes, lasts, stamps = [], [], [NOW + 50, NOW + 10, NOW + 70, NOW + 70, NOW + 90]
        for i, stamp in enumerate(stamps):
            data = batch([b"v"] * (i + 1), timestamp=stamp - i)
            result = partition_log.append(data)
            sizes.append(len(data))
            lasts.append(result.last_offset)
        directory = partition_log.directory
        assert os.path.getsize(os.path.join(directory, "00000000000000000000.index")) == 10 << 20   # preallocated
        assert os.path.getsize(os.path.join(directory, "00000000000000000000.timeindex")) == (10 << 20) // 12 * 12
    positions = [sum(sizes[:i]) for i in range(len(sizes))]
    # Kafka's LogSegment.append: an entry once more than index.interval.bytes were appended since the last
    # one, mapping the append's last offset to where it began; the time index takes the largest timestamp
    # so far whenever it grew, and once more when the segment closes.
    expected_index = b"".join(struct.pack(">ii", lasts[i], positions[i]) for i in range(1, 5))
    max_so_far = [(NOW + 50, lasts[0]), (NOW + 50, lasts[0]), (NOW + 70, lasts[2]), (NOW + 70, lasts[2]),
                  (NOW + 90, lasts[4])]
    expected_time = b"".join(struct.pack(">qi", *max_so_far[i]) for i in (1, 2, 4))
    with open(os.path.join(directory, "00000000000000000000.index"), "rb") as f:
        assert f.read() == expected_index
    with open(os.path.join(directory, "00000000000000000000.timeindex"), "rb") as f:
        assert f.read() == expected_time


def test_offset_lookup_uses_the_index(tmp_path):
    with open_manager(tmp_path, log_index_interval_bytes=100) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(200):
            partition_log.append(batch([b"%d" % i * 20]))
        index = partition_log.active.offset_index
        assert index.entries > 20
        offset, position = index.lookup(150)
        assert offset <= 150 and position > 0
        assert [r[3] for r in read_all(partition_log, 150)][:2] == [b"150" * 20, b"151" * 20]



@pytest.mark.parametrize("layout, field, width", [(">ii", 0, 4), (">ii", 1, 4), (">qi", 0, 8), (">qi", 1, 4)])
def test_core_index_search_agrees_with_a_scan(tmp_path, layout, field, width):
    """``_core.index_floor`` against the last row at or below each key, found by reading every row: keys below
    the first row, between rows, on rows and past the last, with negative fields too. Up to 1,024 rows are read
    at once and searched in memory; larger indexes are first narrowed one row at a time."""
    import bisect
    import random
    entry = struct.Struct(layout)
    at = struct.calcsize(layout[:1 + field])                # the field's byte position
    rng = random.Random(field * 10 + width)
    for count in (0, 1, 2, 7, 682, 683, 1000, 1024, 1025, 5000):
        keys = sorted(rng.sample(range(-(1 << 30), 1 << 30), count))
        rows = [(k, rng.randrange(1 << 20)) if field == 0 else (rng.randrange(1 << 20), k) for k in keys]
        path = tmp_path / f"{count}.index"
        path.write_bytes(b"".join(entry.pack(*row) for row in rows))
        near = keys[:50] + keys[-50:] + rng.sample(keys, min(count, 100))
        probes = [-(1 << 31), (1 << 31) - 1] + [k + d for k in near for d in (-1, 0, 1)]
        for key in probes:
            expected = bisect.bisect_right(keys, key) - 1
            found, row = _core.index_floor(os.fsencode(path), count, entry.size, at, width, key)
            assert found == expected
            assert row == (None if expected < 0 else entry.pack(*rows[expected]))


def test_core_index_search_refuses_what_it_cannot_read(tmp_path):
    path = tmp_path / "short.index"
    path.write_bytes(struct.pack(">ii", 1, 0) * 3)
    # an index shorter than its entries (cut outside the broker) is named, never read past
    assert _core.index_floor(os.fsencode(path), 1000, 8, 0, 4, 500)[0] == -2
    assert _core.index_floor(os.fsencode(path), 100_000, 8, 0, 4, 500)[0] == -2      # past a window's rows
    assert _core.index_floor(os.fsencode(path), 3, 8, 0, 4, 500)[0] == 2
    with pytest.raises(FileNotFoundError):
        _core.index_floor(os.fsencode(tmp_path / "gone.index"), 3, 8, 0, 4, 1)
    for bad in [(8, 6, 4), (8, 0, 2), (0, 0, 4), (100, 0, 4), (8, -1, 4)]:
        with pytest.raises(ValueError):
            _core.index_floor(os.fsencode(path), 3, *bad, 1)


def test_core_write_at_writes_an_existing_file_in_place(tmp_path):
    """``_core.write_at``, an index entry's write: in place in a file that exists (a preallocated index), past
    its end too; a missing file or a directory is the OSError ``os.open`` would raise, and nothing is made."""
    path = tmp_path / "0.index"
    path.write_bytes(bytes(16))
    _core.write_at(os.fsencode(path), struct.pack(">ii", 5, 70), 8)
    _core.write_at(os.fsencode(path), b"", 0)
    assert path.read_bytes() == bytes(8) + struct.pack(">ii", 5, 70)
    _core.write_at(os.fsencode(path), memoryview(b"tail"), 20)
    assert path.read_bytes() == bytes(8) + struct.pack(">ii", 5, 70) + bytes(4) + b"tail"
    with pytest.raises(FileNotFoundError) as gone:
        _core.write_at(os.fsencode(tmp_path / "gone.index"), b"x", 0)
    assert gone.value.filename == str(tmp_path / "gone.index")
    assert not (tmp_path / "gone.index").exists()
    with pytest.raises(IsADirectoryError):
        _core.write_at(os.fsencode(tmp_path), b"x", 0)


def test_core_append_segment_writes_every_piece_then_the_index_entries(tmp_path):
    """``_core.append_segment``, an append's writes: pieces of any size (empty ones, views, more than one
    ``pwritev`` takes) in order at the position, then the index entries; a failure cuts the segment back to
    where the append began and names the file it could not write."""
    log, index = tmp_path / "0.log", tmp_path / "0.index"
    log.write_bytes(b"head")
    index.write_bytes(bytes(16))
    pieces = [bytearray(b"%05d" % i) if i % 3 else memoryview(b"..%05d.." % i)[2:7] for i in range(2500)]
    pieces[7:7] = [b"", memoryview(b"")]
    with open(log, "r+b") as f:
        fd = f.fileno()
        entry = struct.pack(">ii", 3, 4)
        assert _core.append_segment(fd, pieces, 4, [(os.fsencode(index), entry, 8)]) == 2500 * 5
        assert log.read_bytes() == b"head" + b"".join(b"%05d" % i for i in range(2500))
        assert index.read_bytes() == bytes(8) + entry
        assert _core.append_segment(fd, [b"more"], 4 + 2500 * 5) == 4
        written = log.read_bytes()
        with pytest.raises(FileNotFoundError) as gone:         # the batch is written, its index entry is not
            _core.append_segment(fd, [b"refused"], len(written), [(os.fsencode(tmp_path / "gone.index"), entry, 0)])
        assert gone.value.filename == str(tmp_path / "gone.index")
        assert log.read_bytes() == written
    with open(log, "rb") as f, pytest.raises(OSError) as refused:     # a read-only descriptor
        _core.append_segment(f.fileno(), [b"x"], 0)
    assert refused.value.errno == errno.EBADF and log.read_bytes() == written
    with pytest.raises(TypeError):
        _core.append_segment(0, [b"x"], 0, [("a str path", b"e", 0)])


def test_a_segment_append_is_the_cores_and_changes_nothing_when_it_refuses(tmp_path):
    """``LogSegment.append`` is the compiled core's (``_core.SegmentCore``: the write and the index entries in one
    call). An append it refuses (an offset outside the segment, a full index, an offset not above the last
    indexed one) raises ``CorruptIndexError`` naming the file, with the segment, its files and its indexes as
    they were."""
    from kmem import errors
    assert segment_module.LogSegment.append is _core.SegmentCore.append
    assert CorruptIndexError is errors.CorruptIndexError
    config = dataclasses.replace(BrokerConfig.from_properties().topic_config(), index_interval_bytes=0,
                                 segment_index_bytes=36)        # four offset entries, three time entries
    segment = segment_module.LogSegment(str(tmp_path), 100, config, active=True, now_ms=0)
    assert isinstance(segment.offset_index, _core.OffsetIndexCore)
    assert isinstance(segment.time_index, _core.TimeIndexCore)
    offsets, times = segment.offset_index, segment.time_index

    def state():
        return (segment.size, segment.next_offset, segment.max_timestamp_so_far, segment.offset_of_max_timestamp,
                segment.bytes_since_last_index_entry, os.path.getsize(segment.log_path),
                offsets.entries, offsets.lookup(10**6), times.entries, times.last_entry)

    for last, stamp in ((100, 5), (101, 3), (102, 9)):
        segment.append(last, stamp, last, [b"batch-%d" % last])
    assert state() == (27, 103, 9, 102, 9, 27, 2, (102, 18), 2, (9, 102))     # no entry for the first append
    before = state()
    for last, path, fault in ((99, segment.log_path, "does not fit this segment"),
                              (100 + 2**31, segment.log_path, "does not fit this segment"),
                              (102, offsets.path, "is not above the last indexed offset 102")):
        with pytest.raises(CorruptIndexError, match=fault) as refused:
            segment.append(last, 10, last, [b"refused"])
        assert str(refused.value).startswith(f"{path}: ")
        assert state() == before
    segment.append(103, 4, 103, [b"batch-103"])           # an offset entry; the largest timestamp did not grow
    assert (offsets.entries, times.entries) == (3, 2)
    segment.append(104, 11, 104, [b"batch-104"])
    assert (offsets.entries, times.entries, offsets.is_full, times.is_full) == (4, 3, True, True)
    before = state()
    with pytest.raises(CorruptIndexError, match="full index"):
        segment.append(104, 11, 104, [b"refused"])
    assert state() == before
    with pytest.raises(ValueError):
        offsets.appended(b"short", True)
    offsets.trim_to_valid_size()        # the entries held, written
    segment.close()
    with open(offsets.path, "rb") as f:
        assert f.read() == b"".join(struct.pack(">ii", last - 100, position) for last, position in
                                    ((101, 9), (102, 18), (103, 27), (104, 36)))


def test_a_failed_write_gives_back_the_blocks_reserved_ahead_and_reserves_again_later(tmp_path, monkeypatch):
    """A write that fails (the file cut back to where the append began frees the blocks reserved past it) forgets
    the reservation, so the next append past ``RESERVE_FROM_BYTES`` reserves again."""
    skip_unless_blocks_can_be_reserved(tmp_path)
    monkeypatch.setattr(segment_module, "RESERVE_FROM_BYTES", 1000)
    config = dataclasses.replace(BrokerConfig.from_properties().topic_config(), segment_bytes=1 << 20)
    segment = segment_module.LogSegment(str(tmp_path), 0, config, active=True, now_ms=0)
    try:
        segment._reserve_at = 1000
        segment.append(0, 1, 0, [bytes(1500)])
        assert segment._reserved_to == 3000 and segment._reserve_at == 3000     # as much again as it holds
        writable, segment._fd = segment._fd, os.open(segment.log_path, os.O_RDONLY)
        try:
            with pytest.raises(OSError):
                segment.append(1, 1, 1, [bytes(2000)])
        finally:
            os.close(segment._fd)
            segment._fd = writable
        assert (segment.size, segment._reserved_to, segment._reserve_at) == (1500, 0, 1500)
        segment.append(1, 1, 1, [bytes(100)])               # past the end it failed at: reserves again
        assert segment._reserved_to == 3200 and segment.size == 1600
    finally:
        segment.close()


def one_record_batches(manager, count):
    """Partition t-0 of ``manager`` (``log_index_interval_bytes=0``) holding ``count`` one-record batches: an
    offset index entry for each but the first, written to the file."""
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    for i in range(count):
        partition_log.append(batch([b"%d" % i]))
    partition_log.active.offset_index.write_pending()
    return partition_log


def test_an_index_cut_short_outside_the_broker_is_a_corrupt_index(tmp_path):
    with open_manager(tmp_path, log_index_interval_bytes=0) as manager:
        index = one_record_batches(manager, 20).active.offset_index
        assert index.lookup(10)[0] == 10
        os.truncate(index.path, 8 * 5)
        with pytest.raises(CorruptIndexError, match="shorter than its 19 entries"):
            index.lookup(10)


def test_a_lookup_at_the_tail_reads_no_file_and_a_shrunk_index_forgets_its_tail(tmp_path):
    with open_manager(tmp_path, log_index_interval_bytes=0) as manager:
        index = one_record_batches(manager, 10).active.offset_index
        at_tail = index.lookup(1000)
        os.rename(index.path, index.path + ".away")
        try:
            assert index.lookup(1000) == at_tail == (9, index.lookup(9)[1])
            with pytest.raises(FileNotFoundError):
                index.lookup(5)
        finally:
            os.rename(index.path + ".away", index.path)
        index.resize(4 * 8)                  # keeps four entries: the last is read again
        assert index.entries == 4 and index.lookup(1000)[0] == 4 == index.last_offset      # offsets 1-4


def _appended_with_held_entries(path, count, pending_bytes, monkeypatch):
    """An open log of ``count`` batches with an offset and a time index entry for each but the first, each index
    holding up to ``pending_bytes`` of entries before it writes them."""
    monkeypatch.setattr(index_module, "PENDING_BYTES", pending_bytes)
    manager = open_manager(path, log_index_interval_bytes=0)
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    for i in range(count):
        assert partition_log.append(batch([b"v%d" % i] * (1 + i % 3), timestamp=1_000 + 10 * i)).error_code == 0
    return manager, partition_log


def _entries_in_file(index, size):
    data = open(index.path, "rb").read(index.entries * size)
    return sum(data[at:at + size] != bytes(size) for at in range(0, len(data), size))


def test_index_entries_held_in_memory_answer_as_entries_written_at_once(tmp_path, monkeypatch):
    """Entries an index holds (``PENDING_BYTES``) answer every lookup as entries written with each append, are
    written when they fill, and a closed log leaves the same index files."""
    found = {}
    for pending in (0, index_module.PENDING_BYTES):
        manager, partition_log = _appended_with_held_entries(tmp_path / str(pending), 300, pending, monkeypatch)
        segment = partition_log.active
        offsets, times = segment.offset_index, segment.time_index
        assert offsets.entries == times.entries == 299
        in_file = _entries_in_file(offsets, 8), _entries_in_file(times, 12)
        if pending:
            assert all(0 < n < 299 for n in in_file), in_file       # written as they filled, the rest held
        else:
            assert in_file == (299, 299)
        found[pending] = (
            [offsets.lookup(offset) for offset in range(-1, 900)],
            [offsets.fetch_upper_bound_offset(position) for position in range(0, segment.size + 20, 7)],
            [times.lookup(stamp) for stamp in range(990, 4_100, 3)],
            [(head.position, head.size, head.last_offset) if head else None
             for head in map(segment.translate_offset, range(0, 900, 11))])
        manager.close()
        found[pending] += tuple(open(path, "rb").read() for path in (offsets.path, times.path))
    assert found[0] == found[index_module.PENDING_BYTES]
    assert len(found[0][-2]) == 299 * 8 and len(found[0][-1]) == 299 * 12


def test_held_index_entries_are_answered_from_memory_and_written_before_a_flush(tmp_path, monkeypatch):
    manager, partition_log = _appended_with_held_entries(tmp_path, 200, index_module.PENDING_BYTES, monkeypatch)
    with manager:
        offsets = partition_log.active.offset_index
        written = _entries_in_file(offsets, 8)
        assert 0 < written < offsets.entries == 199
        # entry k is batch k + 1's last offset; batch i holds 1 + i % 3 records
        last_offsets = list(itertools.accumulate(1 + i % 3 for i in range(200)))
        first_held = last_offsets[written + 1] - 1
        expected = [offsets.lookup(offset) for offset in range(500)]
        os.rename(offsets.path, offsets.path + ".away")
        try:
            held_range = range(first_held, offsets.last_offset)             # below the tail, above the file
            assert [offsets.lookup(offset) for offset in held_range] == [expected[o] for o in held_range]
            with pytest.raises(FileNotFoundError):
                offsets.lookup(first_held - 1)
        finally:
            os.rename(offsets.path + ".away", offsets.path)
        partition_log.flush()
        assert _entries_in_file(offsets, 8) == offsets.entries
        assert _entries_in_file(partition_log.active.time_index, 12) == partition_log.active.time_index.entries
        assert [offsets.lookup(offset) for offset in range(500)] == expected


KILLED_WITH_HELD_ENTRIES = """
import os, signal, sys
from kmem.broker import BrokerConfig, LogManager
from kmem.records import RecordsBuilder
manager = LogManager(sys.argv[1], BrokerConfig.from_properties(producer_ledger_ids=100, log_index_interval_bytes=0))
manager.create_topic("t")
partition_log = manager.get_partition("t", 0)
for i in range(300):
    builder = RecordsBuilder(2, "none")
    builder.append(b"v%d" % i, timestamp=1_000 + i)
    assert partition_log.append(builder.build()).error_code == 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_log_killed_with_index_entries_held_reads_every_offset_after_its_recovery(tmp_path):
    child = subprocess.run([sys.executable, "-c", KILLED_WITH_HELD_ENTRIES, str(tmp_path)], capture_output=True,
                           timeout=120)
    assert child.returncode == -9, child.stderr
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        assert partition_log.log_end_offset == 300
        for offset in range(300):
            with partition_log.read(offset, 1).records as records:
                assert [(r.offset, r.value) for r in records.records()] == [(offset, b"v%d" % offset)]
        assert partition_log.offset_for_timestamp(1_150)[0] == 150


def blocks_past_end(path):
    """Bytes of the blocks a file holds past the 4 KiB block its data ends in."""
    stat = os.stat(path)
    return stat.st_blocks * 512 - -(-stat.st_size // 4096) * 4096


def skip_unless_blocks_can_be_reserved(directory):
    disk = os.statvfs(directory)
    if disk.f_bavail * disk.f_frsize < segment_module.RESERVE_HEADROOM_BYTES + (64 << 20):
        pytest.skip("too little free space here for the active segment to reserve blocks")
    probe = os.path.join(directory, "probe")
    with open(probe, "wb") as f:
        error = _core.reserve_blocks(f.fileno(), 0, 1 << 20)
    os.unlink(probe)
    if error:
        pytest.skip(f"this file system reserves no blocks past a file's end: {os.strerror(error)}")


def test_core_reserve_blocks_allocates_past_the_end_and_keeps_the_size(tmp_path):
    skip_unless_blocks_can_be_reserved(tmp_path)
    path = tmp_path / "0.log"
    path.write_bytes(b"x" * 100)
    with open(path, "r+b") as f:
        assert _core.reserve_blocks(f.fileno(), 4096, 1 << 20) == 0
        assert os.path.getsize(path) == 100 and blocks_past_end(path) >= 1 << 20
        assert path.read_bytes() == b"x" * 100
        for offset, length in ((-1, 10), (0, 0), (0, -5)):
            with pytest.raises(ValueError):
                _core.reserve_blocks(f.fileno(), offset, length)
    with open(path, "rb") as f:             # not written through: an errno, never an exception
        assert _core.reserve_blocks(f.fileno(), 0, 4096) == errno.EBADF


def test_an_active_segment_reserves_blocks_ahead_and_frees_them_when_it_rolls(tmp_path):
    """Past ``RESERVE_FROM_BYTES`` the active segment holds blocks past its end, never more than it holds nor
    ``RESERVE_AHEAD_BYTES``, its file's size always its data's; rolled, those blocks are freed and the file keeps
    its modification time (Kafka's retention of segments without timestamps goes by it)."""
    skip_unless_blocks_can_be_reserved(tmp_path)
    value = os.urandom(100_000)
    with open_manager(tmp_path / "logs") as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        segment = partition_log.active
        past_end = []
        for _ in range(60):
            assert partition_log.append(batch([value])).error_code == ErrorCode.NONE
            assert os.path.getsize(segment.log_path) == segment.size
            past_end.append(blocks_past_end(segment.log_path))
            assert past_end[-1] <= min(segment.size, segment_module.RESERVE_AHEAD_BYTES) + (64 << 10)
        assert max(past_end[:10]) < 64 << 10 and max(past_end[10:]) >= 1 << 20
        os.utime(segment.log_path, ns=(10**18, 10**18))
        size = segment.size
        partition_log.roll()
        assert blocks_past_end(segment.log_path) < 64 << 10 and os.path.getsize(segment.log_path) == size
        assert os.stat(segment.log_path).st_mtime_ns == 10**18
        assert partition_log.append(batch([value])).error_code == ErrorCode.NONE
        assert blocks_past_end(partition_log.active.log_path) < 64 << 10
        assert [r[3] for r in read_all(partition_log)] == [value] * 61


@pytest.mark.parametrize("failure", [errno.EOPNOTSUPP, errno.ENOSPC], ids=["unsupported", "no-space"])
def test_a_failed_reservation_fails_no_append_and_keeps_no_block(tmp_path, monkeypatch, failure):
    """A file system without reservations, or one that reserves part and runs out (ext4 keeps the part): the
    appends go on, nothing stays reserved past the end, and a later append past what it asked tries again."""
    asked = []

    def failing(fd, offset, length):
        asked.append((offset, length))
        if failure == errno.ENOSPC:
            reserve_blocks(fd, offset, length // 2)
        return failure
    reserve_blocks = _core.reserve_blocks
    monkeypatch.setattr(_core, "reserve_blocks", failing)
    monkeypatch.setattr(segment_module, "RESERVE_HEADROOM_BYTES", 0)       # asked whatever the disk's room
    value = os.urandom(100_000)
    with open_manager(tmp_path / "logs") as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for _ in range(30):
            assert partition_log.append(batch([value])).error_code == ErrorCode.NONE
            assert blocks_past_end(partition_log.active.log_path) < 64 << 10
        assert len(asked) == 2 and asked[0][0] + asked[0][1] > 1 << 20 and asked[1][0] >= asked[0][0] + asked[0][1]
        assert [r[3] for r in read_all(partition_log)] == [value] * 30


def test_a_segment_the_broker_does_not_own_reserves_nothing(tmp_path, monkeypatch):
    """Freeing reserved blocks must keep the file's modification time, which only its owner may set."""
    value = os.urandom(100_000)
    with open_manager(tmp_path / "logs") as manager:
        manager.create_topic("t")
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 1)
        partition_log = manager.get_partition("t", 0)
        assert partition_log.append(batch([value])).error_code == ErrorCode.NONE
        partition_log.roll()                    # a segment opened by another user
        for _ in range(20):
            assert partition_log.append(batch([value])).error_code == ErrorCode.NONE
            assert blocks_past_end(partition_log.active.log_path) < 64 << 10


def test_a_segment_whose_file_cannot_be_read_raises_that_error_and_keeps_no_descriptor(tmp_path, monkeypatch):
    def unreadable(fd):
        raise OSError(errno.EIO, "injected")
    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fstat", unreadable)
    with pytest.raises(OSError) as raised:
        segment_module.LogSegment(str(tmp_path), 0, BrokerConfig.from_properties().topic_config(), active=True,
                                  now_ms=0)
    monkeypatch.undo()
    assert raised.value.errno == errno.EIO and len(os.listdir("/proc/self/fd")) == before


KILLED_WITH_BLOCKS_RESERVED = """
import os, signal, sys
from kmem.broker import BrokerConfig, LogManager
from kmem.records import RecordsBuilder
manager = LogManager(sys.argv[1], BrokerConfig.from_properties(producer_ledger_ids=100))
manager.create_topic("t")
partition_log = manager.get_partition("t", 0)
for i in range(30):
    builder = RecordsBuilder(2, "none")
    builder.append(b"%099999d" % i)
    assert partition_log.append(builder.build()).error_code == 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_blocks_a_killed_broker_left_reserved_are_freed_when_its_log_opens(tmp_path):
    skip_unless_blocks_can_be_reserved(tmp_path)
    child = subprocess.run([sys.executable, "-c", KILLED_WITH_BLOCKS_RESERVED, str(tmp_path)], capture_output=True,
                           timeout=120)
    assert child.returncode == -9, child.stderr
    log = os.path.join(tmp_path, "t-0", "00000000000000000000.log")
    assert blocks_past_end(log) >= 1 << 20
    modified = os.stat(log).st_mtime_ns
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        assert blocks_past_end(log) < 64 << 10 and os.stat(log).st_mtime_ns == modified
        assert [r[3] for r in read_all(partition_log)] == [b"%099999d" % i for i in range(30)]


def test_a_reader_at_the_tail_scans_from_the_last_append_without_an_index_search(tmp_path, monkeypatch):
    """Offsets of the last append (three batches in one append) are found by a scan from where it began, with no
    index search; earlier offsets search the index; after recovery (which rebuilds the indexes) the index is
    searched again. Every offset is found where the segment's heads say."""
    with open_manager(tmp_path, log_index_interval_bytes=100) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(6):
            partition_log.append(batch([b"v%d" % i * 30]))
        last_append = partition_log.active.size
        partition_log.append(b"".join(bytes(batch([b"w%d" % i * 30, b"x"])) for i in range(3)))
        segment = partition_log.active
        heads = list(segment.heads())
        assert len(heads) == 9 and heads[6].position == last_append

        def found(offset):
            head = segment.translate_offset(offset)
            return head and head.position
        expected = {offset: next((h.position for h in heads if h.last_offset >= offset), None)
                    for offset in range(partition_log.log_end_offset + 2)}
        with open(segment.log_path, "rb") as f:
            data = f.read()
        # the slice at the tail, in memory: from the last append's first batch to the end
        assert segment.fetch_slice(heads[6].last_offset, segment.size, 1 << 20, True, 1 << 20) == \
            (last_append, len(data) - last_append, data[last_append:])
        searched = []
        real_lookup = segment.offset_index.lookup
        monkeypatch.setattr(segment.offset_index, "lookup", lambda offset: searched.append(offset) or real_lookup(
            offset))
        assert {offset: found(offset) for offset in expected} == expected
        assert searched == list(range(heads[5].last_offset + 1))
        segment.recover()
        searched.clear()
        assert {offset: found(offset) for offset in expected} == expected
        assert searched == list(expected)


@pytest.mark.parametrize("value_bytes", [1, 1500], ids=["small", "across-windows"])
def test_core_batch_scan_agrees_with_the_segment_heads(tmp_path, value_bytes):
    """``_core.first_batch_reaching`` against ``LogSegment.heads``: v2, v1 and v0 batches, every offset, and a
    damaged length that ends the scan as it ends ``heads``. The scan reads the file a window at a time: small
    batches lie in one window, large ones (up to 50 KB) cross windows and end them at every kind of place."""
    from kmem.broker.log.segment import HEAD_READ
    with open_manager(tmp_path, log_index_interval_bytes=1 << 20) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(12):
            partition_log.append(batch([b"x" * (i * value_bytes)] * (1 + i % 3),
                                       magic=(2, 1, 0)[i % 3] if i < 9 else 2))
        segment = partition_log.active
        heads = list(segment.heads())
        with open(segment.log_path, "rb") as f:
            data = f.read()
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            for offset in range(-1, partition_log.log_end_offset + 2):
                expected = next((h for h in heads if h.last_offset >= offset), None)
                found = _core.first_batch_reaching(fd, 0, segment.size, offset, HEAD_READ)
                assert (found and found[0]) == (expected and expected.position)
                assert found is None or found[1] == data[found[0]:found[0] + HEAD_READ]
                # a fetch's slice from that batch: bounded by max bytes (the batch whole for the first one) and
                # the end position, in memory below copy_below (from the scan's window or a read of its own)
                for max_bytes, min_one, copy_below, max_end in itertools.product(
                        (0, 30, 5000, 1 << 20), (True, False), (0, 100, 9000, 1 << 20),
                        (segment.size, segment.size - 7, expected.position if expected else 0)):
                    sliced = _core.fetch_slice(fd, 0, segment.size, offset, max_end, max_bytes, min_one, copy_below)
                    if expected is None:
                        assert sliced is None
                        continue
                    size = min(max_end - expected.position, max(max_bytes, expected.size) if min_one else max_bytes)
                    at = expected.position
                    assert sliced == (at, size, data[at:at + size] if 0 < size < copy_below else None)
                if expected is not None:
                    assert segment.translate_offset(offset).last_offset == expected.last_offset
                # from a later position, and with an end that cuts the batch found
                if expected is not None and expected.position:
                    assert _core.first_batch_reaching(fd, 0, expected.position + expected.size - 1, offset,
                                                      HEAD_READ) is None
                    later = next(h for h in heads if h.position > 0)
                    found = _core.first_batch_reaching(fd, later.position, segment.size, offset, HEAD_READ)
                    assert (found and found[0]) == max(expected.position, later.position)
        finally:
            os.close(fd)
        with open(segment.log_path, "r+b") as f:           # the fifth batch's length below any batch's
            f.seek(heads[4].position + 8)
            f.write(struct.pack(">i", 3))
        assert segment.translate_offset(heads[3].last_offset).position == heads[3].position
        assert segment.translate_offset(heads[4].last_offset) is None
        assert [h.position for h in segment.heads()] == [h.position for h in heads[:4]]
        with pytest.raises(ValueError):
            _core.first_batch_reaching(0, 0, 1, 0, 20)
        with pytest.raises(ValueError, match="copy below"):
            _core.fetch_slice(0, 0, 1, 0, 1, 1, True, -1)
        # a file cut inside a batch's head (outside the broker) ends the scan instead of returning a partial head
        os.truncate(segment.log_path, heads[2].position + 30)
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            assert _core.first_batch_reaching(fd, 0, segment.size, heads[2].last_offset, HEAD_READ) is None
            assert _core.fetch_slice(fd, 0, segment.size, heads[2].last_offset, segment.size, 1 << 20, True,
                                     1 << 20) is None
            assert _core.first_batch_reaching(fd, 0, segment.size, heads[1].last_offset, HEAD_READ)[0] == \
                heads[1].position
        finally:
            os.close(fd)
        # ...and a file cut inside a batch's records, its head whole: the batches past the cut are not there
        os.truncate(segment.log_path, heads[1].position + HEAD_READ)
        fd = os.open(segment.log_path, os.O_RDONLY)
        try:
            for offset in (heads[1].last_offset + 1, partition_log.log_end_offset):
                assert _core.first_batch_reaching(fd, 0, segment.size, offset, HEAD_READ) is None
                assert _core.fetch_slice(fd, 0, segment.size, offset, segment.size, 1 << 20, True, 1 << 20) is None
            # a slice asked of the cut batch holds what the file still has of it, nothing past the file's end
            at, size, data = _core.fetch_slice(fd, 0, heads[1].position + heads[1].size, heads[1].last_offset,
                                               segment.size, 1 << 20, True, 1 << 20)
            assert (at, size) == (heads[1].position, segment.size - heads[1].position)
            with open(segment.log_path, "rb") as f:
                assert data == f.read()[heads[1].position:] and len(data) == HEAD_READ
            assert _core.first_batch_reaching(fd, 0, segment.size, heads[1].last_offset, HEAD_READ)[0] == \
                heads[1].position
        finally:
            os.close(fd)

# --- rolling and retention ------------------------------------------------------------------------------

def test_roll_by_size(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=1000) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        sizes = [len(batch([b"x" * 200]))] * 12
        for _ in sizes:
            partition_log.append(batch([b"x" * 200]))
        segments = partition_log.segments
        assert len(segments) == 4 and all(s.size <= 1000 for s in segments)
        assert [s.base_offset for s in segments] == [0, 3, 6, 9]
        directory = partition_log.directory
        # A rolled segment's indexes are trimmed and a producer snapshot is taken, as at every Kafka roll.
        assert os.path.getsize(os.path.join(directory, "00000000000000000003.index")) == 0
        # ...and the segments before the new one are flushed on the log manager's flusher thread
        wait_for(lambda: partition_log.recovery_point == 9, "the recovery point at the last roll")
        assert [r[0] for r in read_all(partition_log, 2)] == list(range(2, 12))


def test_older_segments_hold_no_file_descriptors(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=600) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        partition_log.append(batch([b"x" * 200]))
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(60):
            partition_log.append(batch([b"x" * 200]))
        assert len(partition_log.segments) == 31
        # (a roll's flush holds descriptors of the files it syncs until it is done)
        wait_for(lambda: partition_log.recovery_point == partition_log.active.base_offset, "the last roll's flush")
        assert len(os.listdir("/proc/self/fd")) <= before + 1
        assert len(read_all(partition_log)) == 61


def test_roll_by_time_follows_the_first_batch_timestamp(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t", 1, {"segment.ms": 1000})
        partition_log = manager.get_partition("t", 0)
        partition_log.append(batch([b"a"], timestamp=NOW))
        partition_log.append(batch([b"b"], timestamp=NOW + 1000))
        assert len(partition_log.segments) == 1
        partition_log.append(batch([b"c"], timestamp=NOW + 1001))
        assert [s.base_offset for s in partition_log.segments] == [0, 2]


def test_roll_by_time_after_a_reopen_reads_the_first_batch_and_timestamps_at_int64s_ends_roll_as_numbers_say(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t", 1, {"segment.ms": 1000})
        manager.get_partition("t", 0).append(batch([b"a"], timestamp=NOW))
    with open_manager(tmp_path) as manager:         # the segment's first timestamp is read back from its batch
        partition_log = manager.get_partition("t", 0)
        assert partition_log.active.rolling_based_timestamp is None
        partition_log.append(batch([b"b"], timestamp=NOW + 999))
        assert len(partition_log.segments) == 1 and partition_log.active.rolling_based_timestamp == NOW
        partition_log.append(batch([b"c"], timestamp=NOW + 1001))
        assert [s.base_offset for s in partition_log.segments] == [0, 2]
        # the distance from the segment's first timestamp is taken whole, past int64's range (a client's
        # batch may say any time when the topic bounds none)

        def stamped(value, timestamp):
            data = bytearray(batch([value]))
            struct.pack_into(">qq", data, 27, timestamp, timestamp)        # base and max timestamp
            struct.pack_into(">I", data, 17, _core.crc32c(memoryview(data)[21:]))
            return data
        for value, timestamp, bases in [(b"d", -(1 << 63) + 10, [0, 2]), (b"e", (1 << 63) - 10, [0, 2, 4]),
                                        (b"f", -(1 << 63) + 10, [0, 2, 4])]:
            assert partition_log.append(stamped(value, timestamp)).error_code == ErrorCode.NONE
            assert [s.base_offset for s in partition_log.segments] == bases


def test_roll_by_time_without_timestamps_uses_the_clock(tmp_path):
    clock = [NOW]
    with open_manager(tmp_path, clock=lambda: clock[0]) as manager:
        manager.create_topic("t", 1, {"segment.ms": 1000})
        partition_log = manager.get_partition("t", 0)
        partition_log.append(batch([b"a"], magic=0))
        clock[0] += 1000
        partition_log.append(batch([b"b"], magic=0))
        assert len(partition_log.segments) == 1, "the converted batch carries timestamp -1: the segment age counts"
        clock[0] += 1
        partition_log.append(batch([b"c"], magic=0))
        assert [s.base_offset for s in partition_log.segments] == [0, 2]


def test_retention_by_time(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=600) as manager:
        manager.create_topic("t", 1, {"retention.ms": 10_000})
        partition_log = manager.get_partition("t", 0)
        for i in range(9):
            partition_log.append(batch([b"x" * 200], timestamp=NOW + i * 1000))
        assert [s.base_offset for s in partition_log.segments] == [0, 2, 4, 6, 8]
        assert manager.maintain(NOW + 13_500) == 2       # segments whose newest record is older than 10 s
        assert partition_log.log_start_offset == 4
        assert [r[0] for r in read_all(partition_log, 4)][0] == 4
        assert partition_log.read(3, 100).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert partition_log.offset_for_timestamp(EARLIEST_TIMESTAMP) == OffsetAndTimestamp(4, -1)
        assert not os.path.exists(os.path.join(partition_log.directory, "00000000000000000000.log"))
        # Every segment expired: Kafka rolls first, so the log keeps an empty active segment at its end.
        assert manager.maintain(NOW + 100_000) == 3
        assert [s.base_offset for s in partition_log.segments] == [9]
        assert partition_log.log_start_offset == 9 == partition_log.log_end_offset
    assert (tmp_path / "log-start-offset-checkpoint").read_bytes() == b"0\n0\n"     # 9: the first segment's base
    with open_manager(tmp_path) as manager:
        assert manager.get_partition("t", 0).log_start_offset == 9
        partition_log = manager.get_partition("t", 0)
        for i in range(3):
            partition_log.append(batch([b"x"], timestamp=now_ms()))
        assert partition_log.delete_records_before(10) == 10
        assert [s.base_offset for s in partition_log.segments] == [9]      # the log starts inside its segment
        manager.checkpoint()
        assert (tmp_path / "log-start-offset-checkpoint").read_bytes() == b"0\n1\nt 0 10\n"
    with open_manager(tmp_path) as manager:
        assert manager.get_partition("t", 0).log_start_offset == 10


def test_retention_by_size(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=600) as manager:
        manager.create_topic("t", 1, {"retention.bytes": 900})
        partition_log = manager.get_partition("t", 0)
        for i in range(9):
            partition_log.append(batch([b"x" * 200], timestamp=now_ms()))
        sizes = [s.size for s in partition_log.segments]
        assert len(sizes) == 5
        # Kafka deletes the oldest segments while what is left stays at or above retention.bytes.
        assert manager.maintain() == 2
        assert sum(s.size for s in partition_log.segments) == sum(sizes[2:])
        assert sum(sizes[2:]) >= 900 > sum(sizes[3:])
        assert partition_log.log_start_offset == 4


# --- ListOffsets ----------------------------------------------------------------------------------------

def test_offset_for_timestamp(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=400, log_index_interval_bytes=50) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        stamps = [NOW + 10 * i for i in range(20)]
        stamps[7] = NOW + 10_000                        # the largest timestamp, out of order
        for stamp in stamps:
            partition_log.append(batch([b"x" * 40], timestamp=stamp))
        assert len(partition_log.segments) > 3
        assert partition_log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
        assert partition_log.offset_for_timestamp(LATEST_TIMESTAMP) == (20, -1)
        assert partition_log.offset_for_timestamp(MAX_TIMESTAMP) == (7, NOW + 10_000)
        for target in (NOW, NOW + 55, NOW + 130, NOW + 190):
            expected = next(i for i, s in enumerate(stamps) if s >= target)
            assert partition_log.offset_for_timestamp(target) == (expected, stamps[expected])
        assert partition_log.offset_for_timestamp(NOW + 10_001) is None


def test_large_batches_are_written_without_a_copy(manager):
    manager.create_topic("t", 1, {"max.message.bytes": 32 << 20})
    partition_log = manager.get_partition("t", 0)
    builder = RecordsBuilder(2, "none")
    for i in range(8):
        builder.append(bytes(1 << 20), timestamp=now_ms())
    data = bytearray(builder.build())
    partition_log.append(batch([b"warm-up"]))
    tracemalloc.start()
    try:
        result = partition_log.append(memoryview(data))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.error_code == ErrorCode.NONE
    assert peak < 256 << 10, peak                   # the 8 MiB batch went from the buffer to the file
    with partition_log.read(1, 64).records as records:
        assert records.size_in_bytes == len(data)


def test_concurrent_appends_and_reads(manager):
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    errors = []

    def producer(n):
        try:
            for i in range(100):
                assert partition_log.append(batch([b"%d-%d" % (n, i)] * 2)).error_code == ErrorCode.NONE
        except Exception as e:          # reported to the main thread
            errors.append(e)

    def consumer():
        try:
            offset = 0
            while offset < 800:
                fetched = partition_log.read(offset, 1 << 16)
                if fetched.records is not None:
                    with fetched.records as records:
                        offset = max(b.last_offset for b in records) + 1
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)] + [threading.Thread(target=consumer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    stored = read_all(partition_log)
    assert [r[0] for r in stored] == list(range(800))
    assert sorted(r[3] for r in stored[::2]) == sorted(b"%d-%d" % (n, i) for n in range(4) for i in range(100))
