"""KIP-467: a batch refused for some of its records names each of them, by its index in the batch, as Kafka's
``LogValidator`` does (``RecordValidationException``): keyless records to a compacted topic (INVALID_RECORD) and
timestamps out of KIP-937's bounds or a producer's LogAppendTime (INVALID_TIMESTAMP). Produce v8+ answers
``record_errors`` and Kafka's ``error_message``; librdkafka then fails the named records with INVALID_RECORD
(whatever the answer's code, as Kafka's Java producer does) and the others of the batch with
``_INVALID_DIFFERENT_RECORD``."""
import struct
import time

import pytest
from confluent_kafka import KafkaError, Producer
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker_helpers import TIMEOUT, RawConnection
from kmem import _core
from kmem.broker import Broker, ErrorCode
from kmem.broker.log import LogManager
from kmem.broker.log.validator import MAX_RECORD_ERRORS
from kmem.records import RecordsBuilder, TimestampType

NOW = 1_700_000_000_000
HOUR_MS = 3_600_000
KEYLESS = "Compacted topic cannot accept message without key"
BOUNDS = {"message.timestamp.before.max.ms": "60000", "message.timestamp.after.max.ms": "60000"}


def batch_of(keys, timestamps=None, magic=2, codec="none"):
    builder = RecordsBuilder(magic, codec)
    for index, key in enumerate(keys):
        builder.append(b"value-%d" % index, key=key, timestamp=NOW if timestamps is None else timestamps[index])
    return builder.build()


def keys_missing_at(count, missing):
    return [None if index in missing else b"key-%d" % index for index in range(count)]


def kafkas_summary(record_errors):
    """Kafka's ``processRecordErrors`` message for INVALID_RECORD."""
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in record_errors[:3])
    return (f"One or more records have been rejected due to {len(record_errors)} record errors in total, and only "
            f"showing the first three errors at most: [{shown}]")


@pytest.fixture
def logs(tmp_path):
    with LogManager(tmp_path) as manager:
        yield manager


@pytest.mark.parametrize("magic, codec, topic_codec", [
    (2, "none", "producer"), (2, "gzip", "producer"),         # written in place
    (2, "none", "lz4"), (1, "gzip", "producer"), (0, "snappy", "producer"),        # rebuilt
])
def test_every_keyless_record_of_a_batch_is_named_by_its_index(logs, magic, codec, topic_codec):
    logs.create_topic("t", 1, {"cleanup.policy": "compact", "compression.type": topic_codec})
    partition = logs.get_partition("t", 0)
    result = partition.append(batch_of(keys_missing_at(12, {2, 5, 7, 11}), magic=magic, codec=codec), now_ms=NOW)
    expected = tuple((index, KEYLESS) for index in (2, 5, 7, 11))
    assert (result.error_code, result.record_errors) == (ErrorCode.INVALID_RECORD, expected)
    assert result.error_message == kafkas_summary(expected)
    assert partition.log_end_offset == 0


@pytest.mark.parametrize("magic", [2, 1])
def test_a_batch_of_many_keyless_records_names_a_bounded_number(logs, magic):
    logs.create_topic("t", 1, {"cleanup.policy": "compact"})
    count = MAX_RECORD_ERRORS + 1000
    result = logs.get_partition("t", 0).append(batch_of([None] * count, magic=magic, codec="gzip"), now_ms=NOW)
    assert result.error_code == ErrorCode.INVALID_RECORD
    assert result.record_errors == tuple((index, KEYLESS) for index in range(MAX_RECORD_ERRORS))


def test_uncompressed_v0_v1_messages_are_batches_of_one(logs):
    # Kafka validates each uncompressed message as a batch of its own and stops at the first refused
    logs.create_topic("t", 1, {"cleanup.policy": "compact"})
    result = logs.get_partition("t", 0).append(batch_of(keys_missing_at(6, {3, 4}), magic=1), now_ms=NOW)
    assert (result.error_code, result.record_errors) == (ErrorCode.INVALID_RECORD, ((0, KEYLESS),))


@pytest.mark.parametrize("magic, codec", [(2, "none"), (2, "zstd"), (1, "gzip")])
def test_every_record_out_of_the_timestamp_bounds_is_named(logs, magic, codec):
    logs.create_topic("t", 1, BOUNDS)
    # the first record is on time, and one record is older than it: only the records tell
    timestamps = [NOW, NOW - HOUR_MS, NOW + 60_000, NOW + 60_001, -1, NOW - 60_000]
    result = logs.get_partition("t", 0).append(batch_of([b"k"] * 6, timestamps, magic, codec), now_ms=NOW)
    window = f"The timestamp should be within [{NOW - 60_000}, {NOW + 60_000}]"
    assert result.error_code == ErrorCode.INVALID_TIMESTAMP
    assert result.record_errors == (
        (1, f"Timestamp {NOW - HOUR_MS} of message with offset 1 is out of range. {window}"),
        (3, f"Timestamp {NOW + 60_001} of message with offset 3 is out of range. {window}"))
    assert result.error_message == "One or more records have been rejected due to invalid timestamp"
    assert logs.get_partition("t", 0).log_end_offset == 0


def test_keyless_and_untimely_records_together_are_invalid_timestamp(logs):
    logs.create_topic("t", 1, {"cleanup.policy": "compact", **BOUNDS})
    # a record without a key is named for its key, even when its timestamp is out of bounds too
    result = logs.get_partition("t", 0).append(batch_of([b"k", None, None, b"k"], [NOW, NOW - HOUR_MS, NOW,
                                                                                   NOW + HOUR_MS]), now_ms=NOW)
    assert result.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [(index, message.split(" of message")[0]) for index, message in result.record_errors] == [
        (1, KEYLESS), (2, KEYLESS), (3, f"Timestamp {NOW + HOUR_MS}")]


@pytest.mark.parametrize("topic_type, batch_time, magic, refused", [
    ("LogAppendTime", NOW, 2, True), ("LogAppendTime", NOW, 1, True),
    ("CreateTime", -1, 2, True),                   # a LogAppendTime batch without a time
    ("CreateTime", NOW, 2, False), ("CreateTime", NOW - HOUR_MS, 2, False),       # its time checked as any
])
def test_a_producer_may_not_set_log_append_time(logs, topic_type, batch_time, magic, refused):
    logs.create_topic("t", 1, {"message.timestamp.type": topic_type})
    builder = RecordsBuilder(magic, "gzip", TimestampType.LOG_APPEND_TIME, log_append_time=batch_time)
    for index in range(3):
        builder.append(b"v", key=b"k")
    result = logs.get_partition("t", 0).append(builder.build(), now_ms=NOW)
    if not refused:
        assert (result.error_code, result.record_errors) == (ErrorCode.NONE, ())
        return
    assert result.error_code == ErrorCode.INVALID_TIMESTAMP
    assert result.record_errors == tuple((index, f"Invalid timestamp type in message with offset {index}. Producer "
                                                 "should not set timestamp type to LogAppendTime.") for index in range(3))
    assert logs.get_partition("t", 0).log_end_offset == 0


def test_a_batch_whose_max_timestamp_alone_is_out_of_bounds_names_no_record(logs):
    # Kafka would set the max timestamp from the records; kmem keeps the batch as it came, so refuses it
    logs.create_topic("t", 1, BOUNDS)
    data = bytearray(batch_of([b"k"], [NOW]))
    struct.pack_into(">q", data, 35, NOW + HOUR_MS)         # max timestamp
    struct.pack_into(">I", data, 17, _core.crc32c(memoryview(data)[21:]))
    result = logs.get_partition("t", 0).append(bytes(data), now_ms=NOW)
    assert (result.error_code, result.record_errors) == (ErrorCode.INVALID_TIMESTAMP, ())
    assert f"max timestamp {NOW + HOUR_MS}" in result.error_message


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs") as running:
        yield running


@pytest.mark.parametrize("version", range(12))
def test_produce_v8_and_later_answer_the_record_errors(broker, version):
    broker.logs.create_topic("t", 1, {"cleanup.policy": "compact"})
    records = batch_of(keys_missing_at(5, {1, 4}), magic=2 if version >= 3 else 1, codec="gzip")
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    request = ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[ProduceRequest.TopicProduceData(
        name="t", partition_data=[data])])
    request.with_header(correlation_id=7, client_id="raw")
    with RawConnection(broker.bootstrap_servers) as connection:
        connection.send_frame(request.encode(version=version, header=True))
        payload = connection.receive_frame()
    response = ProduceResponse.decode(payload, version=version, header=True)
    (answer,) = response.responses[0].partition_responses
    assert answer.error_code == ErrorCode.INVALID_RECORD
    if version >= 8:
        expected = [(1, KEYLESS), (4, KEYLESS)]
        assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == expected
        assert answer.error_message == kafkas_summary(expected)
    else:       # the answer holds nothing past the fields of its version
        just_the_code = ProduceResponse(throttle_time_ms=0, responses=[ProduceResponse.TopicProduceResponse(
            name="t", partition_responses=[ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                index=0, error_code=ErrorCode.INVALID_RECORD, base_offset=-1, log_append_time_ms=-1,
                log_start_offset=0)])])
        assert payload == struct.pack(">i", 7) + just_the_code.encode(version=version)


def produce(broker, records, **config):
    """Produce ``[(key, value, timestamp)]`` (0: now) to partition 0 of "t" in one batch with confluent-kafka;
    returns each one's delivery error (None when written)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 1000,
                         "batch.num.messages": len(records), **config})
    reports = [None] * len(records)

    def deliver(index):
        return lambda error, message: reports.__setitem__(index, (error,))
    for index, (key, value, timestamp) in enumerate(records):
        producer.produce("t", key=key, value=value, partition=0, timestamp=timestamp, on_delivery=deliver(index))
    assert producer.flush(TIMEOUT) == 0
    return [error for (error,) in reports]


def test_librdkafka_fails_the_keyless_records_alone_with_invalid_record(broker):
    broker.logs.create_topic("t", 1, {"cleanup.policy": "compact"})
    keyless = set(range(3, 100, 10))
    errors = produce(broker, [(None if i in keyless else b"k%d" % i, b"v%d" % i, 0) for i in range(100)])
    assert [i for i, e in enumerate(errors) if e.code() == KafkaError.INVALID_RECORD] == sorted(keyless)
    assert all(e.code() == KafkaError._INVALID_DIFFERENT_RECORD for i, e in enumerate(errors) if i not in keyless)
    assert broker.logs.get_partition("t", 0).log_end_offset == 0
    # the application sends the others again, as they were
    assert produce(broker, [(b"k%d" % i, b"v%d" % i, 0) for i in range(100) if i not in keyless]) == [None] * 90


def test_librdkafka_fails_the_untimely_records_alone(broker):
    broker.logs.create_topic("t", 1, BOUNDS)
    now = time.time_ns() // 1_000_000
    stale = set(range(5, 100, 10))         # older than the batch's first record: only the records tell
    errors = produce(broker, [(b"k", b"v%d" % i, now - HOUR_MS if i in stale else 0) for i in range(100)])
    # the answer is INVALID_TIMESTAMP; librdkafka fails each record it names with INVALID_RECORD
    assert [i for i, e in enumerate(errors) if e.code() == KafkaError.INVALID_RECORD] == sorted(stale)
    assert all(e.code() == KafkaError._INVALID_DIFFERENT_RECORD for i, e in enumerate(errors) if i not in stale)
    assert broker.logs.get_partition("t", 0).log_end_offset == 0
