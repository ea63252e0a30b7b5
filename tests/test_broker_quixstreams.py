"""Quix Streams against ``kmem broker``: a stateful application keeps its state in RocksDB and in a changelog
topic it creates with ``cleanup.policy=compact``; with its state directory gone it restores the state from
that changelog, compacted meanwhile by the broker's log cleaner.

With ``processing_guarantee="exactly-once"`` each checkpoint is a Kafka transaction (KIP-98) holding the
application's output, its changelog records and its consumer offsets (TxnOffsetCommit, KIP-447): read
read_committed, the output holds one record per input record and the group's committed offset is the
input's end. SIGKILLed in a transaction, then again as it commits one (the broker kills it when its EndTxn
arrives), and restarted each time under the same ``transactional.id`` (which fences the killed producer and
aborts its transaction), the last time with its state directory gone, it still outputs each word's counts
1, 2, ... n once. The state then comes back from the changelog, which holds the aborted records of the
commit cut by the kill; Quix skips them twice over (it reads read_committed, and it skips a changelog record
whose header says it was written past the committed offset), so the restore alone would not notice a
broker that served aborted records: the output does.

quixstreams 3.28 caps confluent-kafka below 2.13, older than the test extra's, so the application
(``quix_word_count.py``) runs in an interpreter of its own: ``$KMEM_QUIX_PYTHON``, else
``.venv-quix/bin/python`` at the top of the checkout, the virtualenv ``make test`` and ``make dev`` make
with quixstreams alone. The test skips when neither is there (pytest run by hand without it)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess

import confluent_kafka
import pytest

from broker_helpers import TIMEOUT, consume_to_end, wait_for
from kmem.broker import Broker, ErrorCode

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


def application(python, broker, state_dir, outputs, *options):
    """The command line and environment (quixstreams alone: no PYTHONPATH) that run the application."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return [python, str(APPLICATION), broker.bootstrap_servers, str(state_dir), str(outputs), *options], env


def count_words(python, broker, state_dir, outputs, *options):
    """Run the application until it has produced ``outputs`` counts (with ``options``: see quix_word_count.py);
    returns them as ``[(word, count)]``."""
    command, env = application(python, broker, state_dir, outputs, *options)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
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


EXACTLY_ONCE = ("--guarantee", "exactly-once", "--output", "counts")


def read_topic(bootstrap, topic, isolation):
    """Every ``(key, value)`` of partition 0 of ``topic`` up to its end for a consumer at ``isolation`` (the
    last stable offset for read_committed), in offset order."""
    return [(key, value) for _, _, key, value in consume_to_end(bootstrap, topic, isolation=isolation)]


def read_counts(broker, isolation):
    """The ``(word, count)`` records of the application's output topic ``counts``."""
    return [(key.decode(), json.loads(value)["count"]) for key, value in read_topic(broker.bootstrap_servers,
                                                                                       "counts", isolation)]


def committed_offset(group):
    """The offset the application's group ``counter`` committed on ``words``; negative for none. ``group``: a
    consumer of that group id: read_committed, it waits for offsets pending in a transaction (KIP-447's
    require_stable), read_uncommitted it gets the last offsets committed."""
    partition, = group.committed([confluent_kafka.TopicPartition("words", 0)], timeout=TIMEOUT)
    return partition.offset


def group_consumer(broker, isolation="read_committed"):
    return confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "counter",
                                     "isolation.level": isolation})


def test_an_exactly_once_application_commits_its_output_and_offsets_in_transactions(tmp_path):
    python = quix_python()
    with Broker(tmp_path / "logs", properties={"group.initial.rebalance.delay.ms": "0"}) as broker:
        broker.logs.create_topic("words", 1)
        words = ["apple", "pear", "apple", "plum"] * 25 + ["pear"]
        produce(broker, words)
        counts = count_words(python, broker, tmp_path / "state", len(words), *EXACTLY_ONCE)
        assert dict(counts) == {"apple": 50, "pear": 26, "plum": 25}

        assert read_counts(broker, "read_committed") == counts      # one record per input record, in order
        group = group_consumer(broker)
        try:
            assert committed_offset(group) == len(words)
        finally:
            group.close()


def start_application(python, broker, state_dir, output_dir, *options):
    """The application as a child process (stdout and stderr to files in ``output_dir``), to be killed."""
    command, env = application(python, broker, state_dir, 0, *options)
    output_dir.mkdir(exist_ok=True)
    with open(output_dir / "stdout", "w") as stdout, open(output_dir / "stderr", "w") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env)
    process.stderr_path = output_dir / "stderr"
    return process


def running(process):
    assert process.poll() is None, process.stderr_path.read_text()[-4000:]
    return True


def kill_at_commit(monkeypatch, broker, process, commits):
    """Make the broker SIGKILL ``process`` when the EndTxn of its ``commits``-th commit arrives, before handling
    it: that transaction stays open with all of its output, changelog and offsets, until another producer of
    the transactional id fences it (and aborts it)."""
    end_transaction = broker.transactions.end_transaction
    arrived = []

    def end_or_kill(transactional_id, producer_id, epoch, commit, write_markers=None):
        arrived.append(commit)
        if commit and arrived.count(True) == commits:
            process.kill()
            process.wait(TIMEOUT)
            return ErrorCode.CONCURRENT_TRANSACTIONS    # for nobody: the client is gone
        return end_transaction(transactional_id, producer_id, epoch, commit, write_markers)
    monkeypatch.setattr(broker.transactions, "end_transaction", end_or_kill)


def test_an_exactly_once_application_killed_mid_stream_counts_every_word_once(tmp_path, monkeypatch):
    """SIGKILLed in a transaction, then as it commits one, then restarted with its state directory gone (the
    state comes back from the changelog), the application still outputs each word's counts 1, 2, ... n
    exactly once: read_committed shows none of the killed transactions' records."""
    python = quix_python()
    commit_every = 50
    options = (*EXACTLY_ONCE, "--commit-every", str(commit_every), "--delay", "0.01")
    with Broker(tmp_path / "logs", properties={"group.initial.rebalance.delay.ms": "0"}) as broker:
        broker.logs.create_topic("words", 1)
        words = ["apple", "pear", "apple", "plum", "fig"] * 80
        produce(broker, words)
        group = group_consumer(broker)
        try:
            # killed in a transaction: one is committed and the next has output in the log, less than half of
            # it, so the application is at least commit_every / 2 records (of 10 ms each) away from committing
            first = start_application(python, broker, tmp_path / "state", tmp_path / "first", *options)

            def open_output():
                log = broker.logs.get_partition("counts", 0)
                return log.log_end_offset - log.last_stable_offset
            wait_for(lambda: running(first) and committed_offset(group) >= commit_every and
                     0 < open_output() <= commit_every // 2, "a commit, then output of the next transaction")
            first.kill()
            assert first.wait(TIMEOUT) == -signal.SIGKILL

            # restarted on its state directory: it commits once more and is killed as it commits the next
            second = start_application(python, broker, tmp_path / "state", tmp_path / "second", *options)
            kill_at_commit(monkeypatch, broker, second, 2)
            wait_for(lambda: second.poll() is not None, "the restarted application killed at its second commit")
            assert second.returncode == -signal.SIGKILL, second.stderr_path.read_text()[-4000:]

            # restarted without its state directory: restores it from the changelog and counts the rest
            shutil.rmtree(tmp_path / "state")
            last_commit = group_consumer(broker, "read_uncommitted")
            try:
                rest = len(words) - committed_offset(last_commit)
            finally:
                last_commit.close()
            outputs = count_words(python, broker, tmp_path / "state", rest, *options)

            committed = read_counts(broker, "read_committed")
            assert committed[-rest:] == outputs
            for word in set(words):
                assert [count for w, count in committed if w == word] == list(range(1, words.count(word) + 1))
            assert len(committed) == len(words)
            assert committed_offset(group) == len(words)
        finally:
            group.close()

        # the killed instances did leave records, aborted: the open transaction's output (at least one record),
        # and the whole transaction killed at its commit (output, and changelog the restore skipped)
        assert len(read_counts(broker, "read_uncommitted")) >= len(committed) + commit_every + 1
        changelog = next(name for name in broker.logs.topics() if name.startswith("changelog__counter"))
        assert len(read_topic(broker.bootstrap_servers, changelog, "read_uncommitted")) > \
            len(read_topic(broker.bootstrap_servers, changelog, "read_committed"))
