"""Quix Streams against ``kmem broker``: a stateful application keeps its state in RocksDB and in a changelog
topic it creates with ``cleanup.policy=compact``; with its state directory gone it restores the state from
that changelog, compacted meanwhile by the broker's log cleaner."""
import json
import shutil

import pytest

quixstreams = pytest.importorskip("quixstreams")

import confluent_kafka  # noqa: E402  (a dependency of quixstreams)

from kmem.broker import Broker  # noqa: E402


def produce(broker, words):
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})
    for word in words:
        producer.produce("words", key=word, value=json.dumps(word))
    assert producer.flush(10) == 0


def count_words(broker, state_dir, outputs):
    """Run a Quix application counting each word (RocksDB state, a changelog topic written at each commit,
    every 10 records) until it has produced ``outputs`` counts; returns them as ``[(word, count)]``."""
    app = quixstreams.Application(broker_address=broker.bootstrap_servers, consumer_group="counter",
                                  auto_offset_reset="earliest", state_dir=str(state_dir), commit_every=10,
                                  consumer_poll_timeout=0.1)
    words = app.dataframe(app.topic("words", key_deserializer="str", value_deserializer="json"))

    def count(word, state):
        state.set("count", state.get("count", 0) + 1)
        return {"word": word, "count": state.get("count")}

    words = words.apply(count, stateful=True)
    return [(row["word"], row["count"]) for row in app.run(count=outputs, timeout=15)]


def test_a_stateful_application_restores_its_counts_from_its_compacted_changelog(tmp_path):
    settings = {"log.cleaner.dedupe.buffer.size": str(24 * 10_000), "group.initial.rebalance.delay.ms": "0"}
    with Broker(tmp_path / "logs", properties=settings) as broker:
        broker.logs.create_topic("words", 1)
        first = ["apple", "pear", "apple", "plum"] * 25 + ["pear"]
        produce(broker, first)
        counts = count_words(broker, tmp_path / "state", len(first))
        assert dict(counts) == {"apple": 50, "pear": 26, "plum": 25}

        changelog = next(name for name in broker.logs.topics() if name.startswith("changelog__counter"))
        assert broker.logs.topics()[changelog].configs["cleanup.policy"] == "compact"
        partition = broker.logs.get_partition(changelog, 0)
        partition.roll()                        # everything the application wrote is now cleanable
        before = partition.size_in_bytes
        broker.logs.cleaner.clean(changelog, 0)
        assert partition.size_in_bytes < before / 3 and partition.log_end_offset > 3 * 10   # a commit: 3 words

        shutil.rmtree(tmp_path / "state")       # the local state is lost: the changelog restores it
        produce(broker, ["plum", "apple", "kiwi"])
        assert count_words(broker, tmp_path / "state", 3) == [("plum", 26), ("apple", 51), ("kiwi", 1)]
