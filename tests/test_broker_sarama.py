"""Sarama (Go, Shopify/sarama 1.22 as Debian packages it) against the broker: it produces at a protocol
version and codec, sync and async, and reads back at the same version, and a modern client reads what it
wrote. At 0.10 Sarama sends magic 1 message sets and its LZ4 frames are pierrec/lz4's (4 MiB blocks, a
content checksum); below 0.10 it refuses lz4 itself. The Produce request it sent at 0.10 with lz4 is kept
as bytes (records_samples.SARAMA_LZ4_PRODUCE), so that case is tested without Go too."""
import pytest
import xxhash
from kafka.protocol.producer import ProduceResponse

from broker_helpers import RawConnection, consume_to_end, fetch_raw, stored_batches
from go_probes import build_probe
from kmem.broker import Broker
from kmem.records import codecs
from records_samples import SARAMA_LZ4_PRODUCE, SARAMA_LZ4_TOPIC, SARAMA_LZ4_VALUE, read_kafka_python

QUICK = {"fetch.wait.max.ms": 10}       # librdkafka's reads of a topic's end answered without waiting


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("sarama") / "logs") as running:
        yield running


@pytest.fixture(scope="module")
def sarama():
    return build_probe("sarama_probe.go")


def lz4_header_checksums(records):
    """(as written, over FLG and BD as the LZ4 frame format says, over the magic too as Kafka < 0.10 wrote
    it: KAFKA-3160) of the LZ4 frame in a fetched wrapper message."""
    start = records.index(codecs.LZ4_MAGIC)
    written = records[start + 6]
    return written, xxhash.xxh32_intdigest(records[start + 4:start + 6]) >> 8 & 0xFF, \
        xxhash.xxh32_intdigest(records[start:start + 6]) >> 8 & 0xFF


def test_sarama_lz4_produce_request_is_stored_and_read_at_every_magic(broker):
    """The bytes Sarama sent at 0.10 with lz4: its one block starts with bytes that also read as a size,
    which the broker once took for one (CORRUPT_MESSAGE, "Message contents does not match its CRC")."""
    broker.logs.create_topic(SARAMA_LZ4_TOPIC)
    with RawConnection(broker.bootstrap_servers) as connection:
        connection.send_frame(SARAMA_LZ4_PRODUCE)
        response = ProduceResponse.decode(connection.receive_frame(), version=2, header=True)
    answer = response.responses[0].partition_responses[0]
    assert (answer.error_code, answer.base_offset) == (0, 0)
    assert stored_batches(broker.log_dir, SARAMA_LZ4_TOPIC, 0) == [(2, -1, codecs.LZ4, [SARAMA_LZ4_VALUE])]

    # Fetch v2 and v3 down-convert to magic 1, whose frames carry the right header checksum; v0 and v1 to
    # magic 0, whose frames carry the one Kafka before 0.10 wrote, which old readers expect (KAFKA-3160)
    for version, magic in [(1, 0), (2, 1)]:
        with RawConnection(broker.bootstrap_servers) as connection:
            fetched = fetch_raw(connection, SARAMA_LZ4_TOPIC, version)
        assert fetched.error_code == 0
        records = fetched.records
        assert records[16] == magic
        assert [row[3] for row in read_kafka_python(records)] == [SARAMA_LZ4_VALUE]
        written, standard, broken = lz4_header_checksums(records)
        assert written == (broken if magic == 0 else standard) and standard != broken
    assert [value for *_, value in consume_to_end(broker.bootstrap_servers, SARAMA_LZ4_TOPIC, **QUICK)] == \
        [SARAMA_LZ4_VALUE]


@pytest.mark.parametrize("version, codec", [
    ("0.10.0.0", "lz4"), ("0.10.2.0", "lz4"),          # magic 1 message sets in pierrec/lz4 frames (issue 42)
    ("0.8.2.0", "gzip"), ("0.11.0.0", "lz4"), ("2.0.0", "snappy"),
])
def test_sarama_produces_and_reads_back(broker, sarama, version, codec):
    topic = f"sarama-{version}-{codec}"
    broker.logs.create_topic(topic)
    # one record alone (the set that failed), then five in one request, sync and async
    assert sarama("produce", broker.bootstrap_servers, topic, version, codec, "sync", 1) == {"offsets": [0]}
    for mode, offsets in [("sync", [1, 2, 3, 4, 5]), ("async", [6, 7, 8, 9, 10])]:
        assert sarama("produce", broker.bootstrap_servers, topic, version, codec, mode, 5) == {"offsets": offsets}
    values = [f"{topic}-sync-0"] + [f"{topic}-{mode}-{i}" for mode in ("sync", "async") for i in range(5)]

    assert sarama("consume", broker.bootstrap_servers, topic, version, len(values)) == \
        {"values": values, "offsets": list(range(len(values)))}
    assert [value.decode() for *_, value in consume_to_end(broker.bootstrap_servers, topic, **QUICK)] == values
    batches = stored_batches(broker.log_dir, topic, 0)
    assert {(magic, compression) for magic, _, compression, _ in batches} == {(2, codecs.codec_id(codec))}
