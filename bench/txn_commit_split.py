"""Where a transactional commit's time goes (``.venv/bin/python bench/txn_commit_split.py``): the commit p50 of
``bench_transactions.py``'s row of 100 records (librdkafka, 1 KiB records, one partition, ``linger.ms`` 5) on the
mock cluster and on kmem broker as it is, then on kmem brokers with a part of the transaction coordinator taken
out, each in a process of its own, in one run (``KMEM_BENCH_SPLIT_ROUNDS`` rounds, default 2):

- ``no state writes``: AddPartitionsToTxn and EndTxn write nothing to ``__transaction_state`` (the record's making
  and the append skipped, answered as written);
- ``no verification``: ``transaction.partition.verification.enable=false`` (KIP-890's check of the Produce);
- ``no coordinator``: AddPartitionsToTxn and EndTxn answered NONE at once, without the coordinator, and no
  verification: what is left is the network thread, the dispatch, the Produce and the client;
- ``markers later``: the network thread sleeps 0.2 ms before the work an EndTxn response leaves (the markers and
  CompleteCommit), leaving the machine's cores to the client meanwhile (a network thread that sleeps serves no
  one: an experiment only);
- ``markers first``: that work is done before EndTxn is answered, where Kafka answers first (an experiment: it
  is on the client's path in either order when they share the machine's cores).

``no coordinator`` is kmem's floor for a commit whatever its coordinator costs; each other row against ``as it
is`` is what that part costs a commit. Those brokers are broken on purpose (nothing they write can be read back as a
transaction): never use them but to measure.

Below each round, each kmem broker's own time for the three requests of a commit: the mean of Kafka's
``RequestMetrics`` ``LocalTimeMs`` (the handler's, from the request's dequeue to its response made) for
AddPartitionsToTxn, Produce and EndTxn, in µs, over the run's requests.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

from peers import CHILD_ENV, MockCluster

ROUNDS = int(os.environ.get("KMEM_BENCH_SPLIT_ROUNDS", "2"))
TRANSACTIONS, RECORDS, RECORD_SIZE, WARM = 300, 100, 1024, 30
VARIANTS = ("as it is", "no state writes", "no verification", "no coordinator", "markers later",
            "markers first")

BROKER = """
import sys
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.broker.txn.coordinator import TransactionCoordinator
from kmem.metrics import REQUEST_TIMES
from kmem.protocol import ApiKey
variant, properties = sys.argv[2], {}
if variant == "no state writes":
    TransactionCoordinator._append = lambda self, partition, entries: ErrorCode.NONE
if variant in ("no verification", "no coordinator"):
    properties["transaction.partition.verification.enable"] = "false"
if variant == "no coordinator":
    TransactionCoordinator.add_partitions = lambda self, *args: ErrorCode.NONE
    TransactionCoordinator.end_transaction = lambda self, *args, **kwargs: ErrorCode.NONE
if variant == "markers later":
    import time
    from kmem.network.server import _Processor
    run_after_responses = _Processor._run_after_responses
    _Processor._run_after_responses = lambda self: (time.sleep(0.0002), run_after_responses(self))
if variant == "markers first":
    end_txn = TransactionCoordinator.end_txn
    def end_txn_after_markers(self, header, request, write_markers=None):
        work = []
        response = end_txn(self, header, request, write_markers=work.append)
        for job in work:
            job()
        return response
    TransactionCoordinator.end_txn = end_txn_after_markers
with Broker(sys.argv[1], port=0, properties=properties) as broker:
    broker.logs.create_topic("t", 1)
    print(broker.bootstrap_servers, flush=True)
    sys.stdin.read()
    times = broker.server.handler.request_times.totals()        # by API key: [requests, TotalTimeMs, ...]
    local = REQUEST_TIMES.index("LocalTimeMs") + 1
    print(" ".join(f"{ApiKey(key).name}={times[key][local] / times[key][0] / 1e3:.0f}" for key in
                   (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.PRODUCE, ApiKey.END_TXN)), flush=True)
"""


def commit_p50(bootstrap):
    """The median ``commit_transaction()`` in ms, after ``WARM`` transactions."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "split", "linger.ms": 5})
    producer.init_transactions(30)
    value, commits = os.urandom(RECORD_SIZE), []
    for _ in range(TRANSACTIONS):
        producer.begin_transaction()
        for _ in range(RECORDS):
            producer.produce("t", value, partition=0)
        started = time.perf_counter()
        producer.commit_transaction(30)
        commits.append(time.perf_counter() - started)
    return statistics.median(commits[WARM:]) * 1000


def kmem_p50(variant):
    """``(commit p50 ms, the broker's mean LocalTimeMs of the commit's requests in µs, as printed)``."""
    with tempfile.TemporaryDirectory() as directory:
        child = subprocess.Popen([sys.executable, "-c", BROKER, directory, variant], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
        try:
            p50 = commit_p50(child.stdout.readline().strip())
        finally:
            child.stdin.close()
            request_times = child.stdout.readline().strip()
            child.wait(60)
        return p50, request_times


def mock_p50():
    from peers import create_topics

    with MockCluster() as mock:
        create_topics(mock.bootstrap, ["t"])
        return commit_p50(mock.bootstrap)


def main():
    print(f"commit_transaction() p50, ms, {RECORDS} records of {RECORD_SIZE} B a transaction (x the mock's):")
    for _ in range(ROUNDS):
        mock = mock_p50()
        kmem = {variant: kmem_p50(variant) for variant in VARIANTS}
        print(f"mock {mock:.3f}", *(f"| {variant} {p50:.3f} ({p50 / mock:.2f}x)" for variant, (p50, _) in
                                     kmem.items()), flush=True)
        for variant, (_, request_times) in kmem.items():
            print(f"  {variant}: the broker's LocalTimeMs, µs: {request_times}", flush=True)


if __name__ == "__main__":
    main()
