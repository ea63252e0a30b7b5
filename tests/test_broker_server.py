"""``kmem broker`` as a server: the command line and its signals, a SIGKILL during an idempotent produce,
hostile clients, and the protocol details real clients rely on (ApiVersions fallback, acks=0, long
polling, KIP-74 limits, producer ids never reissued). Raw requests are built and decoded with
kafka-python's codec (``kafka.protocol``), which nobody here wrote."""
import os
import pathlib
import signal
import struct
import threading
import time
import uuid
import zlib

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_helpers import RawConnection, produce_raw, start_broker_process, stored_batches, wait_for
from network_helpers import free_port
from kmem.broker import Broker
from kmem.broker.apis.handlers import protocol_uuid
from kmem.errors import ConfigError
from kmem.records import FileRecords, MemoryRecords, build_records, log_segments

NONE, UNKNOWN_SERVER_ERROR, INVALID_RECORD = 0, -1, 87
INVALID_REQUEST, UNSUPPORTED_VERSION, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID = 42, 35, 53, 100
UNSUPPORTED_COMPRESSION_TYPE = 76


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", num_partitions=1) as running:
        yield running


def produce_records(broker, topic, values, partition=0, codec="none"):
    """Records written through the storage layer (what a producer would have sent)."""
    if broker.logs.get_partition(topic, partition) is None:
        broker.logs.create_topic(topic, partition + 1)
    data = build_records(values, magic=2, compression=codec)
    result = broker.logs.get_partition(topic, partition).append(data)
    assert result.error_code == 0, result


def fetch(connection, version, topic, offset=0, partition_max_bytes=1 << 20, max_bytes=1 << 30, max_wait_ms=0,
          min_bytes=0):
    partition = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset,
                                                       partition_max_bytes=partition_max_bytes)
    request = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                           topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])])
    return connection.request(request, FetchResponse, version).responses[0].partitions[0]


# --- the command line -------------------------------------------------------------------------------

def test_cli_serves_clients_and_shuts_down_cleanly_on_sigterm(tmp_path):
    from kafka import KafkaProducer

    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, "--override", "num.partitions=2")
    try:
        producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        for i in range(10):
            producer.send("cli", str(i).encode(), partition=i % 2)
        producer.flush()
        producer.close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    assert os.path.exists(log_dir / ".kafka_cleanshutdown")
    recovery_points = (log_dir / "recovery-point-offset-checkpoint").read_text().split("\n")
    assert sorted(recovery_points[2:4]) == ["cli 0 5", "cli 1 5"]


def test_cli_rejects_an_unknown_override(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "kmem.cli", "broker", "--log-dir", str(tmp_path), "--port", "0",
                             "--override", "no.such.setting=1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "no.such.setting" in result.stderr


def test_settings_take_kafka_names_and_keywords(tmp_path):
    broker = Broker(tmp_path, properties={"num.partitions": "3", "queued.max.request.bytes": str(200 << 20)},
                    log_segment_bytes=1 << 20, advertised_listeners="PLAINTEXT://kafka.example:9000")
    assert broker.settings.storage.num_partitions == 3
    assert broker.settings.storage.log_segment_bytes == 1 << 20
    assert broker.settings.network.queued_max_request_bytes == 200 << 20
    advertised = broker.settings.listeners[0].advertised
    assert (advertised.host, advertised.port) == ("kafka.example", 9000)
    with pytest.raises(ConfigError, match="log.segment.bytes"):
        Broker(tmp_path, log_segment_bytes="big")
    with pytest.raises(ConfigError, match="unknown broker setting 'colour'"):
        Broker(tmp_path, colour="blue")


def test_metadata_advertises_the_configured_listener(tmp_path):
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    with Broker(tmp_path, advertised_listeners="PLAINTEXT://kafka.example:0", node_id=7) as broker:
        port = broker.server.address[1]
        with RawConnection(f"127.0.0.1:{port}") as connection:
            response = connection.request(MetadataRequest(topics=None), MetadataResponse, 12)
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(7, "kafka.example", port)]
    assert response.controller_id == 7


# --- SIGKILL during an idempotent produce -----------------------------------------------------------

def test_sigkill_during_idempotent_produce_keeps_every_acknowledged_record_once(tmp_path):
    import confluent_kafka

    log_dir = tmp_path / "logs"
    port = free_port()
    process, bootstrap = start_broker_process(log_dir, "--override", "log.segment.bytes=1500000", port=port)
    acknowledged, errors = [], []

    def delivered(error, message):
        (errors if error else acknowledged).append(error or message.value())

    # batches below 1 MB (librdkafka's default message.max.bytes) fit the 1.5 MB segments
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                         "linger.ms": 2, "message.timeout.ms": 60000})
    producer.produce("crash", b"first", callback=delivered)   # auto-creates the topic
    assert producer.flush(30) == 0
    total = 20000
    try:
        for i in range(total):
            producer.produce("crash", f"{i:08d}".encode() + b"." * 100, callback=delivered)
            producer.poll(0)
            if i == total // 2:
                wait_for(lambda: producer.poll(0.05) is not None and len(acknowledged) > total // 4,
                         "a quarter of the records acknowledged", timeout=120)
                process.kill()              # SIGKILL: no checkpoints, no clean-shutdown marker
                process.wait()
                process, _ = start_broker_process(log_dir, port=port)
        assert producer.flush(60) == 0
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert errors == []
    assert len(acknowledged) == total + 1
    stored = [value for batch in stored_batches(str(log_dir), "crash", 0) for value in batch[3]]
    assert len(stored) == len(set(stored)), "a record was stored twice"
    assert sorted(stored) == sorted(acknowledged)
    # Kafka's recovery rules: every batch valid, offsets contiguous from 0 across the segments
    next_offset = 0
    for _, path in log_segments(str(log_dir / "crash-0")):
        with FileRecords(path) as records:
            for batch in records.batches():
                assert batch.is_valid() and batch.base_offset == next_offset
                next_offset = batch.last_offset + 1


# --- hostile clients --------------------------------------------------------------------------------

def closed_by_broker(connection):
    connection.sock.settimeout(10)
    try:
        return connection.receive_frame() is None
    except ConnectionResetError:
        return True


def api_versions_ok(broker, connection=None):
    own = connection is None
    connection = connection or RawConnection(broker.bootstrap_servers)
    try:
        response = connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3)
        return response.error_code == 0
    finally:
        if own:
            connection.close()


@pytest.mark.parametrize("payload", [
    b"\x00\x12",                                                     # shorter than any request header
    struct.pack(">hhih", 1234, 0, 7, -1),                            # unknown API key
    struct.pack(">hhih", 0, 99, 7, -1),                              # Produce v99
    struct.pack(">hhih", 11, 0, 7, -1) + b"\x00\x01g\x00",            # JoinGroup cut short
    struct.pack(">hhih", 3, 1, 7, 5) + b"abc",                       # client id cut short
    struct.pack(">hhih", 0, 7, 7, -1) + os.urandom(64),              # garbage Produce body
], ids=["short", "unknown-api", "unknown-version", "cut-join-group", "cut-header", "garbage-body"])
def test_hostile_requests_close_their_connection_only(broker, payload):
    with RawConnection(broker.bootstrap_servers) as healthy, RawConnection(broker.bootstrap_servers) as hostile:
        hostile.send_frame(payload)
        assert closed_by_broker(hostile)
        assert api_versions_ok(broker, healthy)
    assert api_versions_ok(broker)


def test_oversized_and_negative_frames_close_the_connection(tmp_path):
    with Broker(tmp_path, socket_request_max_bytes=1 << 20) as broker:
        for prefix in (struct.pack(">i", 64 << 20), struct.pack(">i", -5)):
            with RawConnection(broker.bootstrap_servers) as hostile:
                hostile.sock.sendall(prefix + b"x" * 100)
                assert closed_by_broker(hostile)
        assert api_versions_ok(broker)


def test_a_half_request_left_hanging_disturbs_no_one(broker):
    with RawConnection(broker.bootstrap_servers) as half:
        half.sock.sendall(struct.pack(">i", 1000) + b"\x00\x12\x00\x00")
        assert api_versions_ok(broker)
    assert api_versions_ok(broker)


def test_api_versions_too_new_gets_the_v0_fallback_with_unsupported_version(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        connection.send_frame(struct.pack(">hhih", 18, 9, 42, -1) + b"\x00")
        correlation_id, error_code, count = struct.unpack_from(">ihi", connection.receive_frame())
        assert (correlation_id, error_code, count) == (42, UNSUPPORTED_VERSION, 1)
        assert api_versions_ok(broker, connection)      # the client retries on the same connection


def test_api_versions_advertise_exactly_what_is_served(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(ApiVersionsRequest(), ApiVersionsResponse, 0)
    versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert versions == {18: (0, 4), 3: (0, 12), 0: (0, 11), 1: (0, 17), 2: (0, 9), 22: (0, 5), 19: (0, 7),
                        20: (0, 6), 10: (0, 6), 11: (0, 9), 14: (0, 5), 12: (0, 4), 13: (0, 5), 8: (0, 9),
                        9: (0, 9), 16: (0, 5), 15: (0, 5), 21: (0, 2), 32: (0, 4), 33: (0, 2), 37: (0, 3),
                        42: (0, 2), 44: (0, 1), 47: (0, 0), 60: (0, 1), 23: (0, 4), 24: (0, 5), 25: (0, 4),
                        26: (0, 4), 65: (0, 0), 66: (0, 1), 28: (0, 4), 27: (0, 1), 61: (0, 0), 17: (0, 1), 36: (0, 2),
                        29: (0, 3), 30: (0, 3), 31: (0, 3), 50: (0, 0), 51: (0, 0), 48: (0, 1), 49: (0, 1),
                        35: (0, 4), 75: (0, 0), 68: (0, 1), 69: (0, 0), 74: (0, 0)}


def test_acks_zero_gets_no_response(broker):
    broker.logs.create_topic("quiet")
    records = build_records([b"fire-and-forget"], magic=2)
    data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    request = ProduceRequest(acks=0, timeout_ms=1000,
                             topic_data=[ProduceRequest.TopicProduceData(name="quiet", partition_data=[data])])
    request.with_header(correlation_id=1, client_id="raw")
    with RawConnection(broker.bootstrap_servers) as connection:
        connection.send_frame(request.encode(version=7, header=True))
        # the next frame on this connection answers the next request: nothing came for the produce
        assert connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3, correlation_id=2).error_code == 0
    assert broker.logs.get_partition("quiet", 0).log_end_offset == 1


def test_produce_v3_and_later_carries_exactly_one_batch_a_partition(broker):
    """Kafka's ``ProduceRequest.validateRecords``: two batches in one partition of Produce v3+ are
    INVALID_RECORD (nothing appended); older versions are not checked."""
    broker.logs.create_topic("t")
    with RawConnection(broker.bootstrap_servers) as connection:
        two = build_records([b"a"], magic=2) + build_records([b"b"], magic=2)
        refused = produce_raw(connection, "t", two, version=9)
        assert (refused.error_code, refused.base_offset) == (INVALID_RECORD, -1)
        assert broker.logs.get_partition("t", 0).log_end_offset == 0
        assert produce_raw(connection, "t", build_records([b"a"], magic=2), version=9).error_code == NONE
        legacy = build_records([b"b"], magic=1) + build_records([b"c"], magic=1)
        assert produce_raw(connection, "t", legacy, version=2).error_code == NONE
    assert broker.logs.get_partition("t", 0).log_end_offset == 3



def legacy_message(value, attributes, magic=1):
    """One magic 0/1 message at offset 0 with the given attributes (codec bits) over ``value`` as it is."""
    body = bytes([magic, attributes]) + (struct.pack(">q", 0) if magic else b"") + struct.pack(">i", -1) \
        + struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def test_zstd_below_produce_v7_is_refused_in_every_message_format(broker):
    """Kafka's ``ProduceRequest.validateRecords``: zstd needs Produce v7, whichever magic claims it (a magic
    0/1 message's codec bits included): UNSUPPORTED_COMPRESSION_TYPE, nothing appended."""
    broker.logs.create_topic("old-zstd")
    with RawConnection(broker.bootstrap_servers) as connection:
        for magic in (0, 1):
            refused = produce_raw(connection, "old-zstd", legacy_message(b"not zstd", 4, magic), version=2)
            assert (refused.error_code, refused.base_offset) == (UNSUPPORTED_COMPRESSION_TYPE, -1)
        zstd_batch = build_records([b"z"], magic=2, compression="zstd")
        assert produce_raw(connection, "old-zstd", zstd_batch, version=6).error_code == UNSUPPORTED_COMPRESSION_TYPE
        assert broker.logs.get_partition("old-zstd", 0).log_end_offset == 0
        assert produce_raw(connection, "old-zstd", zstd_batch, version=7).error_code == NONE
        assert produce_raw(connection, "old-zstd", legacy_message(b"plain", 0), version=2).error_code == NONE
    assert broker.logs.get_partition("old-zstd", 0).log_end_offset == 2

def hand_built_batch(value, transactional, producer_id):
    """A v2 batch built by kafka-python's own builder, transactional or not."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                        producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
    return bytes(builder.build())


def test_transactional_batches_without_a_transactional_id_are_refused_whole_and_read_committed_fetches_go_on(broker):
    """A Produce with a transactional batch and no transactional id is TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    as a whole, as Kafka answers it: nothing is appended, no open transaction holds the last stable offset
    back."""
    broker.logs.create_topic("t", 2)
    producer_id = init_producer_id(broker)
    Topic, Partition = ProduceRequest.TopicProduceData, ProduceRequest.TopicProduceData.PartitionProduceData
    request = ProduceRequest(transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
        Topic(name="t", partition_data=[Partition(index=1, records=hand_built_batch(b"plain", False, producer_id)),
                                        Partition(index=0, records=hand_built_batch(b"txn", True, producer_id))])])
    with RawConnection(broker.bootstrap_servers) as connection:
        answered = connection.request(request, ProduceResponse, 9).responses[0].partition_responses
        assert [(p.index, p.error_code, p.base_offset) for p in answered] == \
            [(1, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1), (0, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)]
        assert [broker.logs.get_partition("t", p).log_end_offset for p in (0, 1)] == [0, 0]

        assert produce_raw(connection, "t", hand_built_batch(b"after", False, -1)).error_code == 0
        fetched = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=1,
                               topics=[FetchRequest.FetchTopic(topic="t", partitions=[
                                   FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                                                          partition_max_bytes=1 << 20)])])
        partition = connection.request(fetched, FetchResponse, 11).responses[0].partitions[0]
    assert (partition.error_code, partition.high_watermark, partition.last_stable_offset) == (0, 1, 1)
    assert [record.value for batch in MemoryRecords(partition.records).batches() for record in batch] == [b"after"]


@pytest.mark.parametrize("version", [10, 11])
def test_metadata_v10_and_v11_asking_by_topic_id_is_invalid_request_for_every_topic(broker, version):
    """Topic ids are served from Metadata v12 (a null name cannot be answered before): Kafka refuses such a
    request as a whole, INVALID_REQUEST for every topic asked, and creates nothing."""
    broker.logs.create_topic("named", 1)
    by_id = uuid.uuid4()
    topics = [MetadataRequest.MetadataRequestTopic(name="named"), MetadataRequest.MetadataRequestTopic(name="new"),
              MetadataRequest.MetadataRequestTopic(name=None, topic_id=by_id)]
    with RawConnection(broker.bootstrap_servers) as connection:
        refused = connection.request(MetadataRequest(topics=topics, allow_auto_topic_creation=True), MetadataResponse,
                                     version)
        assert [(t.error_code, t.name, t.topic_id, t.partitions) for t in refused.topics] == [
            (INVALID_REQUEST, "named", None, []), (INVALID_REQUEST, "new", None, []),     # None: the zero uuid
            (INVALID_REQUEST, "", by_id, [])]
        assert "new" not in broker.logs.topics()
        served = connection.request(MetadataRequest(topics=topics[2:], allow_auto_topic_creation=False),
                                    MetadataResponse, 12, correlation_id=2)       # the connection goes on
        assert [(t.error_code, t.topic_id) for t in served.topics] == [(UNKNOWN_TOPIC_ID, by_id)]


@pytest.mark.parametrize("name", ["", "other", None])
def test_metadata_v12_by_topic_id_uses_the_id_whatever_the_name(broker, name):
    """The Java AdminClient's describeTopics(TopicCollection.ofTopicIds(...)) sends each id with name "": Kafka
    answers by the id whenever it is not zero, UNKNOWN_TOPIC_ID for an unknown one, and creates no topic."""
    broker.logs.create_topic("named", 2)
    known, unknown = protocol_uuid(broker.logs.topics()["named"].topic_id), uuid.uuid4()
    topics = [MetadataRequest.MetadataRequestTopic(name=name, topic_id=known),
              MetadataRequest.MetadataRequestTopic(name=name, topic_id=unknown)]
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(MetadataRequest(topics=topics, allow_auto_topic_creation=True),
                                      MetadataResponse, 12)
    assert [(t.error_code, t.name, t.topic_id, len(t.partitions)) for t in response.topics] == [
        (0, "named", known, 2), (UNKNOWN_TOPIC_ID, None, unknown, 0)]
    assert set(broker.logs.topics()) == {"named"}


@pytest.mark.parametrize("version", [4, 11, 13])
def test_a_fetch_at_an_unknown_isolation_level_is_unknown_server_error(broker, version):
    """Kafka's ``IsolationLevel.forId`` refuses the level while a consumer's partitions are read: the answer
    is ``FetchRequest.getErrorResponse``'s; a follower's level is not read (``FetchIsolation.of``)."""
    produce_records(broker, "t", [b"x"])
    topic_id = protocol_uuid(broker.logs.topics()["t"].topic_id)
    with RawConnection(broker.bootstrap_servers) as connection:
        for replica_id, isolation_level in ((-1, 2), (-1, -1), (1, 2)):
            request = FetchRequest(replica_id=replica_id, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                   isolation_level=isolation_level, topics=[
                                       FetchRequest.FetchTopic(topic="t", topic_id=topic_id, partitions=[
                                           FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                                                                  partition_max_bytes=1 << 20)])])
            answer = connection.request(request, FetchResponse, version)
            partitions = [(p.error_code, bool(p.records)) for t in answer.responses for p in t.partitions]
            if replica_id >= 0:
                assert partitions == [(NONE, True)]
            elif version < 13:
                assert partitions == [(UNKNOWN_SERVER_ERROR, False)]
            else:
                assert (answer.error_code, partitions) == (UNKNOWN_SERVER_ERROR, [])
            if version >= 7:
                assert answer.error_code == (NONE if replica_id >= 0 else UNKNOWN_SERVER_ERROR)


# --- producer ids, long polling, KIP-74 -------------------------------------------------------------

def init_producer_id(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        response = connection.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1),
                                      InitProducerIdResponse, 4)
    assert response.error_code == 0
    return response.producer_id


def test_producer_ids_are_never_reissued_across_restarts(tmp_path):
    issued = []
    for _ in range(3):
        with Broker(tmp_path) as broker:
            issued += [init_producer_id(broker) for _ in range(3)]
    assert len(set(issued)) == len(issued)


def test_a_long_poll_is_woken_by_a_produce(broker):
    produce_records(broker, "poll", [b"old"])
    results = []
    with RawConnection(broker.bootstrap_servers) as connection:
        waiter = threading.Thread(target=lambda: results.append(
            (fetch(connection, 11, "poll", offset=1, max_wait_ms=60_000, min_bytes=1), time.monotonic())))
        waiter.start()
        wait_for(lambda: len(broker.handlers.fetch_purgatory) == 1, "the fetch to be parked")
        produced_at = time.monotonic()
        produce_records(broker, "poll", [b"new"])
        waiter.join(60)
    partition, answered_at = results[0]
    assert partition.error_code == 0 and partition.records
    assert answered_at - produced_at < 30       # woken, not answered at max_wait_ms


def test_a_long_poll_without_data_answers_empty_after_max_wait(broker):
    produce_records(broker, "idle", [b"only"])
    with RawConnection(broker.bootstrap_servers) as connection:
        started = time.monotonic()
        partition = fetch(connection, 11, "idle", offset=1, max_wait_ms=300, min_bytes=1)
        waited = time.monotonic() - started
    assert partition.error_code == 0 and not partition.records and partition.high_watermark == 1
    assert waited >= 0.29                   # parked until its deadline, not answered at once


def test_fetch_v3_returns_the_first_batch_whole_and_v2_does_not(broker):
    big = [b"x" * 5000]
    produce_records(broker, "big", big)
    produce_records(broker, "big", big)
    with RawConnection(broker.bootstrap_servers) as connection:
        v4 = fetch(connection, 4, "big", partition_max_bytes=100, max_bytes=100)
        v3 = fetch(connection, 3, "big", partition_max_bytes=100, max_bytes=100)
        v2 = fetch(connection, 2, "big", partition_max_bytes=100)
    assert 5000 < len(v4.records) < 10000           # KIP-74: the first batch whole, the second left out
    assert 5000 < len(v3.records) < 10000
    # before v3 the limit is hard: 100 bytes hold no whole batch, and converting a partial batch gives
    # nothing (Kafka's LazyDownConversionRecords of a slice without a complete batch is empty)
    assert v2.records == b""


def test_down_conversion_disabled_answers_unsupported_version(tmp_path):
    with Broker(tmp_path, log_message_downconversion_enable=False) as broker:
        produce_records(broker, "new", [b"a"])
        with RawConnection(broker.bootstrap_servers) as connection:
            assert fetch(connection, 3, "new").error_code == UNSUPPORTED_VERSION
            assert fetch(connection, 4, "new").error_code == 0


def test_zstd_batches_go_to_fetch_v4_and_later_as_stored_unless_the_topic_is_zstd(broker):
    """Kafka's KafkaApis decides by the topic's compression.type, not by the batches: a `producer` topic's
    zstd batches go to Fetch v4-9 as they are (a Sarama client at v4 reads them); only down-conversion to
    magic 0/1 (v0-3) cannot hold them."""
    produce_records(broker, "z", [b"a" * 100], codec="gzip")
    produce_records(broker, "z", [b"b" * 100], codec="zstd")
    stored = (pathlib.Path(broker.logs.log_dir) / "z-0" / "00000000000000000000.log").read_bytes()
    gzip_size = 12 + struct.unpack_from(">i", stored, 8)[0]
    with RawConnection(broker.bootstrap_servers) as connection:
        for version in (4, 9, 10):
            whole = fetch(connection, version, "z")
            assert (whole.error_code, whole.records) == (0, stored)
            zstd_first = fetch(connection, version, "z", offset=1)
            assert (zstd_first.error_code, zstd_first.records) == (0, stored[gzip_size:])
        assert fetch(connection, 3, "z", offset=1).error_code == UNSUPPORTED_COMPRESSION_TYPE


@pytest.mark.parametrize("version", [0, 3, 4, 9])
def test_a_zstd_topic_below_fetch_v10_is_unsupported_compression_type_whatever_it_holds(broker, version):
    broker.logs.create_topic("zt", 1, {"compression.type": "gzip"})
    produce_records(broker, "zt", [b"a" * 100])                      # stored gzip
    broker.logs.set_topic_configs("zt", {"compression.type": "zstd"})
    with RawConnection(broker.bootstrap_servers) as connection:
        for offset in (0, 1):                                         # data, or nothing yet to read
            refused = fetch(connection, version, "zt", offset=offset)
            assert (refused.error_code, refused.high_watermark, refused.records) == (UNSUPPORTED_COMPRESSION_TYPE,
                                                                                    -1, b"")
        assert fetch(connection, 10, "zt").records                   # the gzip batch, as stored


# --- a retried batch after a restart; TLS ------------------------------------------------------------

@pytest.mark.parametrize("stop", ["clean", "sigkill"])
def test_a_retried_last_batch_is_recognised_after_a_restart(tmp_path, stop):
    log_dir = tmp_path / "logs"
    port = free_port()
    process, bootstrap = start_broker_process(log_dir, port=port)
    try:
        with RawConnection(bootstrap) as connection:
            from kafka.protocol.metadata import MetadataRequest, MetadataResponse
            topic = MetadataRequest.MetadataRequestTopic(name="retry")
            created = connection.request(MetadataRequest(topics=[topic], allow_auto_topic_creation=True),
                                         MetadataResponse, 4)
            assert created.topics[0].error_code == 0        # auto-created
            response = connection.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1),
                                          InitProducerIdResponse, 4)
            producer_id = response.producer_id
            now = int(time.time() * 1000)        # producer state expires producer.id.expiration.ms after it
            batches = [build_records([{"value": f"{seq}".encode(), "timestamp": now}], producer_id=producer_id,
                                     producer_epoch=0, base_sequence=seq) for seq in range(3)]
            first = [produce_raw(connection, "retry", batch) for batch in batches]
            assert [(r.error_code, r.base_offset) for r in first] == [(0, 0), (0, 1), (0, 2)]
    finally:
        if stop == "clean":
            process.send_signal(signal.SIGTERM)
        else:
            process.kill()
        process.wait(30)
    process, bootstrap = start_broker_process(log_dir, port=port)
    try:
        with RawConnection(bootstrap) as connection:
            retried = produce_raw(connection, "retry", batches[-1])
            assert (retried.error_code, retried.base_offset) == (0, first[-1].base_offset)
            out_of_order = produce_raw(connection, "retry", build_records(
                [{"value": b"gap", "timestamp": now}], producer_id=producer_id, producer_epoch=0, base_sequence=7))
            assert out_of_order.error_code == 45        # OUT_OF_ORDER_SEQUENCE_NUMBER
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    stored = [v for batch in stored_batches(str(log_dir), "retry", 0) for v in batch[3]]
    assert stored.count(b"2") == 1


def test_tls_listener_from_a_pem_keystore(tmp_path):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from network_helpers import make_tls_contexts

    make_tls_contexts(str(tmp_path))
    keystore = tmp_path / "keystore.pem"
    keystore.write_bytes((tmp_path / "cert.pem").read_bytes() + (tmp_path / "key.pem").read_bytes())
    with Broker(tmp_path / "logs", ssl_keystore_location=str(keystore)) as broker:
        tls = {"security_protocol": "SSL", "ssl_cafile": str(tmp_path / "cert.pem")}
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, **tls)
        for i in range(5):
            producer.send("secret", str(i).encode(), partition=0)
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest", **tls)
        consumer.assign([TopicPartition("secret", 0)])
        received = []

        def poll():
            for records in consumer.poll(200).values():
                received.extend(r.value for r in records)
            return len(received) >= 5
        wait_for(poll, "records over TLS")
        consumer.close()
    assert received == [str(i).encode() for i in range(5)]


def test_create_and_delete_topics_errors(tmp_path):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    with Broker(tmp_path, auto_create_topics_enable=False) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("checked", 3, 1)], validate_only=True)["checked"].result(30)
        assert "checked" not in broker.logs.topics()
        failures = {   # INVALID_REPLICATION_FACTOR, INVALID_TOPIC_EXCEPTION, INVALID_CONFIG
            "replicated": (NewTopic("replicated", 1, 3), 38),
            "bad/name": (NewTopic("bad/name", 1, 1), 17),
            "bad-config": (NewTopic("bad-config", 1, 1, config={"retention.ms": "soon"}), 40),
        }
        for name, (topic, code) in failures.items():
            with pytest.raises(KafkaException) as error:
                admin.create_topics([topic])[name].result(30)
            assert error.value.args[0].code() == code
        with pytest.raises(KafkaException) as error:
            admin.delete_topics(["never-created"])["never-created"].result(30)
        assert error.value.args[0].code() == 3
        assert broker.logs.topics() == {}


def test_api_versions_entries_are_made_again_when_what_is_served_changes(broker):
    """The entries are made once per ``served``, each response a list of its own."""
    handlers = broker.handlers
    first = handlers.api_versions(None, ApiVersionsRequest())
    first.api_keys.pop()
    first.throttle_time_ms = 100
    second = handlers.api_versions(None, ApiVersionsRequest())
    assert len(second.api_keys) == len(handlers.served) == len(first.api_keys) + 1
    assert second.throttle_time_ms == 0
    served = handlers.served
    try:
        handlers.served = {key: span for key, span in served.items() if key != 18}
        assert 18 not in {entry.api_key for entry in handlers.api_versions(None, ApiVersionsRequest()).api_keys}
    finally:
        handlers.served = served
    assert 18 in {entry.api_key for entry in handlers.api_versions(None, ApiVersionsRequest()).api_keys}
