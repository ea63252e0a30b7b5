"""Hundreds of transactional producers at once (confluent-kafka, spread over processes) against one broker:
the coordinator serves them all without an error, and read_committed sees exactly the committed records,
once each, while read_uncommitted also sees the aborted ones (their markers in the log between them).

Each producer commits and aborts transactions that span every partition of the topic, so the markers of
many transactions are written by the broker's network threads at once, and the coordinator's lock, its
``__transaction_state`` partitions and the partitions' last stable offsets are shared by all of them."""
import multiprocessing

from broker_helpers import TIMEOUT, consume_to_end
from kmem.broker import Broker

PROCESSES = 4
PRODUCERS_PER_PROCESS = 50          # 200 transactional producers
TRANSACTIONS = 4                    # each producer's; every third is aborted
PARTITIONS = 4


def run_producers(bootstrap, process, results):
    """One process's producers, taking turns: ``results`` gets (committed values, aborted values, errors)."""
    import confluent_kafka

    producers = [confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                           "transactional.id": f"load-{process}-{index}"})
                 for index in range(PRODUCERS_PER_PROCESS)]
    committed, aborted, errors = [], [], []
    try:
        for producer in producers:
            producer.init_transactions(TIMEOUT)
        for number in range(TRANSACTIONS):
            for index, producer in enumerate(producers):
                values = [f"{process}-{index}-{number}-{p}" for p in range(PARTITIONS)]
                producer.begin_transaction()
                for partition, value in enumerate(values):
                    producer.produce("load", value.encode(), partition=partition)
                if (index + number) % 3 == 2:
                    producer.flush(TIMEOUT)         # in the log before the abort (else librdkafka drops them)
                    producer.abort_transaction(TIMEOUT)
                    aborted.extend(values)
                else:
                    producer.commit_transaction(TIMEOUT)
                    committed.extend(values)
    except Exception as e:          # reported to the test, which fails with it
        errors.append(repr(e))
    finally:
        for producer in producers:
            producer.flush(TIMEOUT)
    results.put((committed, aborted, errors))


def test_hundreds_of_transactional_producers_at_once(tmp_path):
    with Broker(tmp_path, num_partitions=PARTITIONS) as broker:
        broker.logs.create_topic("load", PARTITIONS)
        context = multiprocessing.get_context("spawn")       # no fork of this process's threads
        results = context.Queue()
        processes = [context.Process(target=run_producers, args=(broker.bootstrap_servers, n, results))
                     for n in range(PROCESSES)]
        for process in processes:
            process.start()
        try:
            outcomes = [results.get(timeout=8 * TIMEOUT) for _ in processes]
        finally:
            for process in processes:
                process.join(TIMEOUT)
                if process.is_alive():
                    process.kill()
        assert [errors for _, _, errors in outcomes if errors] == []
        committed = sorted(value for values, _, _ in outcomes for value in values)
        aborted = sorted(value for _, values, _ in outcomes for value in values)
        assert len(committed) + len(aborted) == PROCESSES * PRODUCERS_PER_PROCESS * TRANSACTIONS * PARTITIONS
        assert aborted
        read = sorted(value.decode() for *_, value in consume_to_end(broker.bootstrap_servers, "load", PARTITIONS))
        assert read == committed            # each once, none aborted, and up to the end: no transaction left open
        everything = consume_to_end(broker.bootstrap_servers, "load", PARTITIONS, isolation="read_uncommitted")
        assert sorted(value.decode() for *_, value in everything) == sorted(committed + aborted)
