"""``kmem transactions`` (kmem.admin, KIP-664) against kmem broker with confluent-kafka's transactional producer, and
against librdkafka's mock cluster, which serves none of its APIs: list, describe, and an abort that lets
read_committed consumers past a hanging transaction."""
import pytest
from confluent_kafka import Producer

from mock_cluster import MockCluster
from test_admin_tools import kmem, kmem_broker, kmem_server, one_error_line, topics  # noqa: F401 (fixtures)


def transactions(capsys, bootstrap, *args):
    return kmem(capsys, "transactions", bootstrap, *args)


def read_committed(capsys, bootstrap, topic):
    code, out, _ = kmem(capsys, "consume", bootstrap, "--topic", topic, "--from-beginning", "--isolation-level",
                        "read_committed", "--timeout-ms", 1000)
    assert code == 0
    return out.splitlines()


def test_list_describe_and_abort_a_hanging_transaction(capsys, kmem_broker):
    topic = "held-back"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic)[0] == 0
    hanging = Producer({"bootstrap.servers": kmem_broker, "transactional.id": "hanging-txn"})
    hanging.init_transactions(30)
    hanging.begin_transaction()
    hanging.produce(topic, b"never committed")
    assert hanging.flush(30) == 0
    plain = Producer({"bootstrap.servers": kmem_broker})
    plain.produce(topic, b"after it")
    assert plain.flush(30) == 0

    code, out, err = transactions(capsys, kmem_broker, "list")
    assert (code, err) == (0, "")
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    producer_id = next(row[2] for row in lines[1:] if row[0] == "hanging-txn")
    assert ["hanging-txn", "0", producer_id, "Ongoing"] in lines

    code, out, _ = transactions(capsys, kmem_broker, "describe", "--transactional-id", "hanging-txn")
    header, row = [line.split() for line in out.splitlines()]
    assert code == 0 and header == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                                    "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                                    "TransactionDurationMs", "TopicPartitions"]
    assert row[:6] + row[8:] == ["0", "hanging-txn", producer_id, "0", "Ongoing", "60000", f"{topic}-0"]
    assert int(row[6]) > 0 and int(row[7]) >= 0

    # the open transaction holds read_committed consumers back from the record after it
    assert read_committed(capsys, kmem_broker, topic) == []
    code, out, err = transactions(capsys, kmem_broker, "abort", "--topic", topic, "--partition", 0,
                                  "--start-offset", 1)
    assert code == 1 and one_error_line(err, "transactions") == (
        f"kmem transactions: error: Could not find any open transactions starting at offset 1 on partition {topic}-0")
    assert transactions(capsys, kmem_broker, "abort", "--topic", topic, "--partition", 0, "--start-offset", 0) == \
        (0, "", "")
    assert read_committed(capsys, kmem_broker, topic) == ["after it"]


def test_describe_an_unknown_transactional_id_is_one_line_and_exit_1(capsys, kmem_broker):
    code, out, err = transactions(capsys, kmem_broker, "describe", "--transactional-id", "no-such-txn")
    assert code == 1 and out == ""
    assert one_error_line(err, "transactions") == ("kmem transactions: error: transactional id 'no-such-txn' does "
                                                   "not exist: kmem transactions list shows the transactions")


@pytest.mark.parametrize("args, message", [
    (["describe"], "describe needs --transactional-id"),
    (["list", "--transactional-id", "x"], "--transactional-id applies to describe"),
    (["abort", "--topic", "t"], "abort needs --topic and --partition"),
    (["list", "--topic", "t"], "--topic, --partition, --start-offset, --producer-id, --producer-epoch and "
                               "--coordinator-epoch apply to abort"),
    (["abort", "--topic", "t", "--partition", "0"],
     "abort takes --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch"),
    (["abort", "--topic", "t", "--partition", "0", "--producer-id", "5"],
     "abort takes --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch"),
])
def test_bad_arguments_are_one_line_and_exit_2(capsys, args, message):
    code, out, err = transactions(capsys, "127.0.0.1:1", *args)
    assert code == 2 and out == ""
    assert one_error_line(err, "transactions") == f"kmem transactions: error: {message}"


def test_on_librdkafkas_mock_cluster_the_missing_api_is_named(capsys):
    cluster = MockCluster()
    try:
        code, out, err = transactions(capsys, cluster.bootstrap, "list")
    finally:
        cluster.close()
    assert code == 1 and out == ""
    assert one_error_line(err, "transactions").endswith("does not serve LIST_TRANSACTIONS: UNSUPPORTED_VERSION")
