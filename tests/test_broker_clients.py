"""``kmem.broker.Broker`` with the three Python Kafka clients, none written here: each creates a topic
with its admin API, produces idempotently with every codec it supports, consumes from the beginning
(assigned partitions, no group), lists offsets (earliest, latest, by timestamp) and deletes the topic.
What the clients see is checked against what the broker wrote to its log directory."""
import asyncio
import time

import pytest

from broker_helpers import stored_batches, wait_for
from kmem.broker import Broker

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PER_CODEC = 6
BASE_TS = 1_700_000_000_000


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs") as running:
        yield running


def value(codec, i):
    # compressible: kafka-python sends a batch uncompressed when compression does not make it smaller
    return f"{codec}-{i}-".encode() + b"." * 200


def expected_values():
    return sorted(value(codec, i) for codec in CODECS for i in range(PER_CODEC))


def check_log(broker, topic):
    """Every record is stored once, in an idempotent (producer id >= 0) magic-2 batch of its codec."""
    seen = []
    for partition in (0, 1):
        for magic, producer_id, compression, values in stored_batches(broker.log_dir, topic, partition):
            assert magic == 2 and producer_id >= 0
            codec = values[0].split(b"-")[0].decode()
            assert compression == CODEC_IDS[codec]
            seen.extend(values)
    assert sorted(seen) == expected_values()


def timestamp_of(codec_index, i):
    return BASE_TS + 1000 * codec_index + i


def test_kafka_python(broker):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    bootstrap = broker.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic("kp", 2, 1)])
    assert broker.logs.topics()["kp"].partitions == 2
    for c, codec in enumerate(CODECS):
        producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                 compression_type=None if codec == "none" else codec)
        for i in range(PER_CODEC):
            producer.send("kp", value(codec, i), partition=i % 2, timestamp_ms=timestamp_of(c, i))
        producer.flush()
        producer.close()
    check_log(broker, "kp")

    partitions = [TopicPartition("kp", 0), TopicPartition("kp", 1)]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign(partitions)
    received = []

    def poll():
        for records in consumer.poll(200).values():
            received.extend(r.value for r in records)
        return len(received) >= len(CODECS) * PER_CODEC
    wait_for(poll, "kafka-python to consume every record")
    assert sorted(received) == expected_values()
    assert consumer.beginning_offsets(partitions) == {tp: 0 for tp in partitions}
    assert consumer.end_offsets(partitions) == {tp: len(CODECS) * PER_CODEC // 2 for tp in partitions}
    # the third codec's records start at offset 2 * PER_CODEC / 2 in each partition
    found = consumer.offsets_for_times({partitions[0]: timestamp_of(2, 0)})
    assert (found[partitions[0]].offset, found[partitions[0]].timestamp) == (PER_CODEC, timestamp_of(2, 0))
    consumer.close()

    admin.delete_topics(["kp"])
    assert "kp" not in broker.logs.topics()
    admin.close()


def test_confluent_kafka(broker):
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("ck", 2, 1)]).values():
        future.result(30)
    assert broker.logs.topics()["ck"].partitions == 2
    for c, codec in enumerate(CODECS):
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                             "compression.codec": codec, "linger.ms": 5})
        for i in range(PER_CODEC):
            producer.produce("ck", value(codec, i), partition=i % 2, timestamp=timestamp_of(c, i))
        assert producer.flush(30) == 0
    check_log(broker, "ck")

    # librdkafka wants a group id even to assign partitions (the broker answers FindCoordinator with
    # COORDINATOR_NOT_AVAILABLE: no offsets are committed)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([confluent_kafka.TopicPartition("ck", p, confluent_kafka.OFFSET_BEGINNING) for p in (0, 1)])
    received = []

    def poll():
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            received.append(message.value())
        return len(received) >= len(CODECS) * PER_CODEC
    wait_for(poll, "confluent-kafka to consume every record")
    assert sorted(received) == expected_values()
    assert consumer.get_watermark_offsets(confluent_kafka.TopicPartition("ck", 1), timeout=10) == (0, 15)
    found, = consumer.offsets_for_times([confluent_kafka.TopicPartition("ck", 0, timestamp_of(3, 0))], timeout=10)
    assert found.offset == 3 * PER_CODEC // 2
    consumer.close()

    for future in admin.delete_topics(["ck"]).values():
        future.result(30)
    assert "ck" not in broker.logs.topics()


def test_aiokafka(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.structs import TopicPartition

    bootstrap = broker.bootstrap_servers

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic("ak", 2, 1)])
        assert broker.logs.topics()["ak"].partitions == 2
        for c, codec in enumerate(CODECS):
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                        compression_type=None if codec == "none" else codec)
            await producer.start()
            sent = [await producer.send("ak", value(codec, i), partition=i % 2,
                                        timestamp_ms=timestamp_of(c, i)) for i in range(PER_CODEC)]
            await asyncio.gather(*sent)
            await producer.stop()
        check_log(broker, "ak")

        partitions = [TopicPartition("ak", 0), TopicPartition("ak", 1)]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        consumer.assign(partitions)
        received = []
        deadline = time.monotonic() + 30
        while len(received) < len(CODECS) * PER_CODEC and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                received.extend(r.value for r in records)
        assert sorted(received) == expected_values()
        assert await consumer.beginning_offsets(partitions) == {tp: 0 for tp in partitions}
        assert await consumer.end_offsets(partitions) == {tp: 15 for tp in partitions}
        found = await consumer.offsets_for_times({partitions[1]: timestamp_of(4, 0)})
        assert found[partitions[1]].offset == 4 * PER_CODEC // 2
        await consumer.stop()

        await admin.delete_topics(["ak"])
        await admin.close()
    asyncio.run(run())
    assert "ak" not in broker.logs.topics()


@pytest.mark.slow
def test_pipeline_report_counts_what_clients_produced(tmp_path):
    """The loop closes: ``kmem pipeline report`` (Spark) over the broker's log directory. Slow: a Spark
    JVM starts (about 100 s on a loaded 2-core machine)."""
    import json
    import subprocess
    import sys

    from kafka import KafkaProducer

    pytest.importorskip("pyspark")
    log_dir = tmp_path / "logs"
    with Broker(log_dir, num_partitions=2) as broker:
        for producer_index in range(3):
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, enable_idempotence=True)
            for i in range(10):
                producer.send("looped", f"{producer_index}-{i}".encode(), partition=i % 2)
            producer.flush()
            producer.close()
    result = subprocess.run([sys.executable, "-m", "kmem.cli", "pipeline", "report", str(log_dir), "--output",
                             str(tmp_path / "report"), "--no-progress", "--master", "local[1]"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["totals"]["records"] == 30
    assert report["corrupt_segments"] == []
    assert {(p["topic"], p["partition"], p["records"], p["producer_ids"]) for p in report["partitions"]} == {
        ("looped", 0, 15, 3), ("looped", 1, 15, 3)}
