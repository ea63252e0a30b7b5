"""Transactional produce with confluent-kafka (librdkafka): kmem broker vs librdkafka's mock cluster in the
same run (``.venv/bin/pytest bench/bench_transactions.py -s``).

For transactions of 10, 100 and 1,000 records of 1 KiB (one partition, ``linger.ms`` 5, librdkafka's
defaults otherwise), on each broker, ``KMEM_BENCH_TXN_RECORDS`` (default 10,000) records and at least 50
transactions, ``KMEM_BENCH_TXN_ROUNDS`` (default 3) times, the four runs below taking turns so that a busy
moment of the machine falls on all of them; MB/s are the median round's, percentiles over every round's calls:

- transactional: ``begin_transaction()``, the records, ``commit_transaction()``: MB/s of record values, and
  p50/p99 of ``commit_transaction()`` as an application calls it, right after its records (librdkafka first
  delivers them, AddPartitionsToTxn then Produce, and then sends EndTxn);
- the same after ``flush()``: p50/p99 of ``commit_transaction()`` when the records are in, i.e. EndTxn alone
  (Kafka answers it once PrepareCommit is written and writes the markers after);
- non-transactional, idempotent (acks=all), the same records: streamed (``flush()`` once, at the end), and
  flushed after every group of as many records as a transaction holds (the ratio to this one is what a
  transaction costs beyond having its records written).

Each producer is warmed up (connected, its producer id and metadata known, one transaction committed)
before the clock. Printed per row: each broker's figures, the transactional MB/s over each non-transactional
one (``vs stream``, ``vs flushed``), and kmem's MB/s and commit p50 over the mock's.

The mock cluster keeps its data in memory, in C; kmem writes its log directory (the records, the markers and
``__transaction_state``) to disk.
"""
import os
import time

import pytest

from peers import BrokerProcess, MockCluster, create_topics

RECORDS = int(os.environ.get("KMEM_BENCH_TXN_RECORDS", "10000"))
ROUNDS = int(os.environ.get("KMEM_BENCH_TXN_ROUNDS", "3"))
MIN_TRANSACTIONS = 50
RECORD_SIZE = 1024
SIZES = [10, 100, 1000]
# queue.buffering.max.messages: room for every record of a streamed run (librdkafka's default, 100,000, would
# stall the stream in BufferError waits)
PRODUCER = {"linger.ms": 5, "queue.buffering.max.messages": 1_000_000}

rows = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\nTransactions of 1 KiB records, one partition (MB/s of record values; commit_transaction() ms):")
    print(f"{'txn':>5} {'broker':>6} {'txns':>5} {'txn MB/s':>8} {'commit p50':>10} {'p99':>6} {'EndTxn p50':>10} "
          f"{'p99':>6} {'stream':>7} {'flushed':>7} {'vs stream':>9} {'vs flushed':>10}")
    by_broker = {(row["broker"], row["size"]): row for row in rows}
    for row in rows:
        print(f"{row['size']:>5} {row['broker']:>6} {row['transactions']:>5} {row['txn']:>8.1f} "
              f"{row['commit'][0]:>10.2f} {row['commit'][1]:>6.2f} "
              f"{row['end_txn'][0]:>10.2f} {row['end_txn'][1]:>6.2f} {row['stream']:>7.1f} {row['flushed']:>7.1f} "
              f"{row['txn'] / row['stream']:>9.2f} {row['txn'] / row['flushed']:>10.2f}")
    for size in SIZES:
        kmem, mock = by_broker.get(("kmem", size)), by_broker.get(("mock", size))
        if kmem and mock:
            print(f"transactions of {size}: kmem's transactional MB/s {kmem['txn'] / mock['txn']:.2f}x the mock's, "
                  f"commit p50 {kmem['commit'][0] / mock['commit'][0]:.2f}x, EndTxn p50 "
                  f"{kmem['end_txn'][0] / mock['end_txn'][0]:.2f}x")


def produce(producer, topic, payload, count):
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, payload, partition=0)
                break
            except BufferError:
                producer.poll(0.005)


def percentiles(samples):
    """(p50, p99) in ms."""
    samples = sorted(samples)
    return samples[len(samples) // 2] * 1000, samples[min(int(len(samples) * 0.99), len(samples) - 1)] * 1000


class Transactional:
    """A transactional producer, warmed up; ``run()`` times ``transactions`` transactions of ``size`` records."""

    def __init__(self, bootstrap, topic, flush_first):
        import confluent_kafka

        self.topic, self.flush_first = topic, flush_first
        self.producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": topic,
                                                  **PRODUCER})
        self.producer.init_transactions(30)
        self.payload = os.urandom(RECORD_SIZE)
        self.producer.begin_transaction()
        produce(self.producer, topic, self.payload, 1)
        self.producer.commit_transaction(30)
        self.commits = []           # seconds per commit_transaction() call

    def run(self, size, transactions):
        """MB/s."""
        producer = self.producer
        started = time.perf_counter()
        for _ in range(transactions):
            producer.begin_transaction()
            produce(producer, self.topic, self.payload, size)
            if self.flush_first:
                assert producer.flush(30) == 0
            called = time.perf_counter()
            producer.commit_transaction(30)
            self.commits.append(time.perf_counter() - called)
        return transactions * size * RECORD_SIZE / 1e6 / (time.perf_counter() - started)


class Idempotent:
    """The same records without transactions; ``flush_every``: a ``flush()`` after each ``size`` records, else
    one at the end."""

    def __init__(self, bootstrap, topic, flush_every):
        import confluent_kafka

        self.topic, self.flush_every = topic, flush_every
        self.producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                                  **PRODUCER})
        self.payload = os.urandom(RECORD_SIZE)
        produce(self.producer, topic, self.payload, 1)
        assert self.producer.flush(30) == 0

    def run(self, size, transactions):
        """MB/s."""
        producer = self.producer
        started = time.perf_counter()
        if self.flush_every:
            for _ in range(transactions):
                produce(producer, self.topic, self.payload, size)
                assert producer.flush(30) == 0
        else:
            produce(producer, self.topic, self.payload, transactions * size)
            assert producer.flush(120) == 0
        return transactions * size * RECORD_SIZE / 1e6 / (time.perf_counter() - started)


def peers():
    yield lambda tmp: BrokerProcess(tmp / "kmem")
    yield lambda tmp: MockCluster()


@pytest.mark.parametrize("size", SIZES)
def test_transactions(tmp_path, size):
    transactions = max(RECORDS // size, MIN_TRANSACTIONS)
    for start in peers():
        with start(tmp_path) as broker:
            topics = {name: f"txn-{size}-{name}" for name in ("txn", "end-txn", "stream", "flushed")}
            create_topics(broker.bootstrap, list(topics.values()))
            runs = {"txn": Transactional(broker.bootstrap, topics["txn"], False),
                    "end-txn": Transactional(broker.bootstrap, topics["end-txn"], True),
                    "stream": Idempotent(broker.bootstrap, topics["stream"], False),
                    "flushed": Idempotent(broker.bootstrap, topics["flushed"], True)}
            rates = {name: [] for name in runs}
            for _ in range(ROUNDS):
                for name, run in runs.items():
                    rates[name].append(run.run(size, transactions))
            median = {name: sorted(values)[len(values) // 2] for name, values in rates.items()}
            rows.append({"broker": broker.name, "size": size, "transactions": transactions * ROUNDS,
                         "txn": median["txn"], "commit": percentiles(runs["txn"].commits),
                         "end_txn": percentiles(runs["end-txn"].commits), "stream": median["stream"],
                         "flushed": median["flushed"]})
