"""Quix Streams against ``kmem broker``: a stateful application keeps its state in RocksDB and in a changelog
topic it creates with ``cleanup.policy=compact``; with its state directory gone it restores the state from
that changelog, compacted meanwhile by the broker's log cleaner.

quixstreams 3.28 caps confluent-kafka below 2.13, older than the test extra's, so the application
(``quix_word_count.py``) runs in an interpreter of its own: ``$KMEM_QUIX_PYTHON``, else
``.venv-quix/bin/python`` at the top of the checkout, the virtualenv ``make test`` and ``make dev`` make
with quixstreams alone. The test skips when neither is there (pytest run by hand without it)."""
import json
import os
import pathlib
import shutil
import subprocess

import confluent_kafka
import pytest

from kmem.broker import Broker

ROOT = pathlib.Path(__file__).resolve().parents[1]
APPLICATION = pathlib.Path(__file__).with_name("quix_word_count.py")


def quix_python():
    """The interpreter holding quixstreams: ``$KMEM_QUIX_PYTHON`` (which must exist), else ``.venv-quix``."""
    configured = os.environ.get("KMEM_QUIX_PYTHON")
    if configured:
        assert os.access(configured, os.X_OK), f"KMEM_QUIX_PYTHON={configured} is not an interpreter"
        return configured
    default = ROOT / ".venv-quix" / "bin" / "python"
    if not default.exists():
        pytest.skip(f"no quixstreams interpreter: set KMEM_QUIX_PYTHON or run `make dev`, which makes {default}")
    return str(default)


def produce(broker, words):
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})
    for word in words:
        producer.produce("words", key=word, value=json.dumps(word))
    assert producer.flush(10) == 0


def count_words(python, broker, state_dir, outputs):
    """Run the application until it has produced ``outputs`` counts; returns them as ``[(word, count)]``."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}   # quixstreams alone
    done = subprocess.run([python, str(APPLICATION), broker.bootstrap_servers, str(state_dir), str(outputs)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return [tuple(pair) for pair in json.loads(done.stdout.splitlines()[-1])]


def test_a_stateful_application_restores_its_counts_from_its_compacted_changelog(tmp_path):
    python = quix_python()
    settings = {"log.cleaner.dedupe.buffer.size": str(24 * 10_000), "group.initial.rebalance.delay.ms": "0"}
    with Broker(tmp_path / "logs", properties=settings) as broker:
        broker.logs.create_topic("words", 1)
        first = ["apple", "pear", "apple", "plum"] * 25 + ["pear"]
        produce(broker, first)
        counts = count_words(python, broker, tmp_path / "state", len(first))
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
        assert count_words(python, broker, tmp_path / "state", 3) == [("plum", 26), ("apple", 51), ("kiwi", 1)]
