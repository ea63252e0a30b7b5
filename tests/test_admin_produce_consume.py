"""``kmem produce`` and ``kmem consume`` (kmem.admin) against kmem broker and librdkafka's mock cluster, an
independent broker, with confluent-kafka on the other end: what one writes the other reads, keys where Java's
partitioner puts them, Kafka's console-consumer format, groups, read_committed, one-line errors and exit codes."""
import io
import os
import signal
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker_helpers import wait_for
from mock_cluster import MockCluster
from test_admin_tools import kmem, kmem_broker, kmem_server, one_error_line, topics  # noqa: F401 (fixtures)

EVERY_FIELD = ["print.timestamp=true", "print.partition=true", "print.offset=true", "print.headers=true",
               "print.key=true"]


@pytest.fixture(scope="module")
def mock_cluster():
    cluster = MockCluster()
    yield cluster
    cluster.close()


@pytest.fixture(params=["kmem", "mock"])
def broker(request, capsys):
    """``(bootstrap, create_topic(name, partitions))`` of kmem broker or librdkafka's mock cluster (which serves
    no CreateTopics: its own API makes them)."""
    if request.param == "kmem":
        bootstrap = request.getfixturevalue("kmem_broker")
        return bootstrap, lambda name, partitions: topics(capsys, bootstrap, "--create", "--topic", name,
                                                          "--partitions", partitions)
    cluster = request.getfixturevalue("mock_cluster")
    return cluster.bootstrap, cluster.create_topic


def produce(capsys, monkeypatch, bootstrap, lines, *args):
    """``kmem produce`` with ``lines`` (bytes) on stdin: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    return kmem(capsys, "produce", bootstrap, *args)


def consume(capsys, bootstrap, *args):
    return kmem(capsys, "consume", bootstrap, *args)


def properties(*pairs):
    return [arg for pair in pairs for arg in ("--property", pair)]


def read_all(bootstrap, topic, count, **config):
    """``count`` messages of ``topic`` as confluent-kafka reads them: [(partition, offset, key, value, headers)]."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, **config})
    consumer.subscribe([topic])
    read = []
    try:
        def enough():
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                read.append((message.partition(), message.offset(), message.key(), message.value(),
                             message.headers() or []))
            return len(read) >= count
        wait_for(enough, f"{count} messages of {topic}")
    finally:
        consumer.close()
    return sorted(read)


def test_produced_lines_are_what_a_client_reads_with_keys_where_javas_partitioner_puts_them(
        capsys, monkeypatch, broker):
    bootstrap, create_topic = broker
    topic = "lines"
    create_topic(topic, 3)
    lines = b"trace:1,span:\tuser-1=login\n\tuser-2=logout\r\n\tNULL=no key\n\tuser-1=NULL\n"
    assert produce(capsys, monkeypatch, bootstrap, lines, "--topic", topic, *properties(
        "parse.key=true", "key.separator==", "parse.headers=true", "null.marker=NULL")) == (0, "", "")
    # where Java's default partitioner (murmur2) puts each key, which librdkafka's murmur2_random also does
    java_partitioner = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    placed = {}
    for key in (b"user-1", b"user-2"):
        java_partitioner.produce(topic, b"placement", key=key, on_delivery=lambda error, message: placed.__setitem__(
            message.key(), message.partition()))
    assert java_partitioner.flush(30) == 0
    read = read_all(bootstrap, topic, 6)
    messages = {(key, value): (partition, headers)
                for partition, _, key, value, headers in read if value != b"placement"}
    assert messages == {(b"user-1", b"login"): (placed[b"user-1"], [("trace", b"1"), ("span", b"")]),
                        (b"user-2", b"logout"): (placed[b"user-2"], []),
                        (None, b"no key"): (messages[(None, b"no key")][0], []),
                        (b"user-1", None): (placed[b"user-1"], [])}


def test_consume_prints_kafkas_console_consumer_format(capsys, broker):
    bootstrap, create_topic = broker
    topic = "formatted"
    create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"first", key=b"k", partition=1, timestamp=1_700_000_000_000,
                     headers=[("h1", b"a"), ("h2", None)])
    producer.produce(topic, None, partition=1, timestamp=1_700_000_000_001)
    assert producer.flush(30) == 0

    code, out, err = consume(capsys, bootstrap, "--topic", topic, "--from-beginning", "--max-messages", 2,
                             *properties(*EVERY_FIELD))
    assert (code, err) == (0, "Processed a total of 2 messages\n")
    assert out == ("CreateTime:1700000000000\tPartition:1\tOffset:0\th1:a,h2:null\tk\tfirst\n"
                   "CreateTime:1700000000001\tPartition:1\tOffset:1\tNO_HEADERS\tnull\tnull\n")
    code, out, _ = consume(capsys, bootstrap, "--topic", topic, "--partition", 1, "--offset", 1, "--max-messages", 1,
                           *properties("print.offset=true", "key.separator= | ", "null.literal=-"))
    assert (code, out) == (0, "Offset:1 | -\n")
    # nothing more came within --timeout-ms: what there was, then the end
    code, out, err = consume(capsys, bootstrap, "--topic", topic, "--partition", 1, "--offset", "earliest",
                             "--timeout-ms", 500)
    assert (code, out, err) == (0, "first\nnull\n", "Processed a total of 2 messages\n")


def test_consume_from_a_timestamp_starts_each_partition_at_its_first_message_since(capsys, kmem_broker):
    topic = "timed"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic, "--partitions", 2)[0] == 0
    producer = Producer({"bootstrap.servers": kmem_broker})
    for partition, timestamps in ((0, (1000, 2000, 3000)), (1, (1500, 1600))):
        for timestamp in timestamps:
            producer.produce(topic, b"%d@%d" % (partition, timestamp), partition=partition, timestamp=timestamp)
    assert producer.flush(30) == 0
    code, out, err = consume(capsys, kmem_broker, "--topic", topic, "--from-timestamp", 1600, "--timeout-ms", 500)
    assert (code, sorted(out.splitlines()), err) == (0, ["0@2000", "0@3000", "1@1600"],
                                                      "Processed a total of 3 messages\n")
    # a partition whose messages are all older starts at its end; a time may be a date and time (here UTC)
    code, out, _ = consume(capsys, kmem_broker, "--topic", topic, "--partition", 1, "--from-timestamp",
                           "1970-01-01T00:00:02+00:00", "--timeout-ms", 500)
    assert (code, out) == (0, "")
    code, out, _ = consume(capsys, kmem_broker, "--topic", topic, "--partition", 0, "--from-timestamp",
                           "1970-01-01T00:00:02+00:00", "--max-messages", 1)
    assert (code, out) == (0, "0@2000\n")


def test_a_group_resumes_after_the_messages_it_printed(capsys, monkeypatch, kmem_broker):
    # kmem broker only: librdkafka's mock cluster takes two minutes to let the second member join
    bootstrap, topic, group = kmem_broker, "shared", "printing-group"
    assert topics(capsys, bootstrap, "--create", "--topic", topic)[0] == 0
    lines = b"".join(b"message %d\n" % n for n in range(5))
    assert produce(capsys, monkeypatch, bootstrap, lines, "--topic", topic)[0] == 0
    code, out, _ = consume(capsys, bootstrap, "--topic", topic, "--group", group, "--from-beginning",
                           "--max-messages", 2)
    assert (code, out) == (0, "message 0\nmessage 1\n")
    code, out, _ = consume(capsys, bootstrap, "--topic", topic, "--group", group, "--max-messages", 3)
    assert (code, out) == (0, "message 2\nmessage 3\nmessage 4\n")
    committed = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        assert committed.committed([TopicPartition(topic, 0)], timeout=30)[0].offset == 5
    finally:
        committed.close()


def test_read_committed_leaves_out_an_aborted_transaction(capsys, kmem_broker):
    topic = "transactional"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic)[0] == 0
    producer = Producer({"bootstrap.servers": kmem_broker, "transactional.id": "console-txn"})
    producer.init_transactions(30)
    for value, commit in ((b"aborted", False), (b"committed", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        assert producer.flush(30) == 0      # written before the abort, which would otherwise purge it unsent
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    args = ["--topic", topic, "--from-beginning", "--timeout-ms", 1000]
    assert consume(capsys, kmem_broker, *args, "--isolation-level", "read_committed")[1] == "committed\n"
    assert consume(capsys, kmem_broker, *args)[1] == "aborted\ncommitted\n"


def test_rate_spaces_the_messages_out(capsys, monkeypatch, kmem_broker):
    topic = "paced"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic)[0] == 0
    lines = b"".join(b"%d\n" % n for n in range(6))
    assert produce(capsys, monkeypatch, kmem_broker, lines, "--topic", topic, "--rate", 20) == (0, "", "")
    code, out, _ = consume(capsys, kmem_broker, "--topic", topic, "--from-beginning", "--max-messages", 6,
                           *properties("print.timestamp=true"))
    stamps = [int(line.split("\t")[0].removeprefix("CreateTime:")) for line in out.splitlines()]
    # the 6th message goes no sooner than 5 / 20 s after the first (each is stamped as it is sent)
    assert code == 0 and stamps[-1] - stamps[0] >= 250


def test_a_line_that_does_not_parse_is_one_line_after_the_lines_before_it_were_sent(capsys, monkeypatch, kmem_broker):
    topic = "half-parsed"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic)[0] == 0
    code, out, err = produce(capsys, monkeypatch, kmem_broker, b"a\tgood\nno separator\n", "--topic", topic,
                             *properties("parse.key=true"))
    assert code == 1 and out == ""
    assert one_error_line(err, "produce") == (
        "kmem produce: error: No key separator found on line number 2: 'no separator' (--property "
        "ignore.error=true takes such a line as a value)")
    assert consume(capsys, kmem_broker, "--topic", topic, "--from-beginning", "--max-messages", 1,
                   "--timeout-ms", 10000)[1] == "good\n"
    assert produce(capsys, monkeypatch, kmem_broker, b"k\tv2\n", "--topic", topic, *properties(
        "parse.headers=true"))[2] == ("kmem produce: error: No header key separator found in pair 'k' on line "
                                      "number 1\n")


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_an_unknown_topic_or_partition_is_one_line_and_exit_1(capsys, monkeypatch, kmem_broker, command):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n")))
    code, out, err = kmem(capsys, command, kmem_broker, "--topic", "no-such-topic", "--max-messages" if command ==
                          "consume" else "--rate", 1)
    assert code == 1 and out == ""
    assert one_error_line(err, command).startswith(f"kmem {command}: error: topic 'no-such-topic' does not exist: ")
    assert topics(capsys, kmem_broker, "--create", "--topic", "one-partition", "--if-not-exists")[0] == 0
    code, _, err = kmem(capsys, command, kmem_broker, "--topic", "one-partition", "--partition", 3)
    assert code == 1 and one_error_line(err, command) == \
        f"kmem {command}: error: topic 'one-partition' has no partition 3: it has 1"


@pytest.mark.parametrize("command, args, message", [
    ("produce", ["--property", "parse.key"], "--property takes KEY=VALUE with KEY one of parse.key, key.separator, "
                                             "parse.headers, headers.delimiter, headers.separator, "
                                             "headers.key.separator, null.marker, ignore.error, not 'parse.key'"),
    ("produce", ["--property", "parse.key=yes"], "--property parse.key takes true or false, not 'yes'"),
    ("produce", ["--rate", "0"], "--rate takes a number of messages a second above 0"),
    ("produce", ["--partition", "-1"], "--partition takes a partition number, not '-1'"),
    ("consume", ["--offset", "5"], "--offset needs --partition (the partition it is an offset of)"),
    ("consume", ["--partition", "0", "--offset", "5x"], "--offset takes earliest, latest or an offset, not '5x'"),
    ("consume", ["--partition", "0", "--offset", "1", "--from-beginning"],
     "--offset and --from-beginning exclude each other"),
    ("consume", ["--group", "g", "--partition", "0"],
     "--group and --partition exclude each other: a group assigns its members the partitions"),
    ("consume", ["--max-messages", "many"], "--max-messages takes a number of messages, not 'many'"),
    ("consume", ["--from-timestamp", "yesterday"], "--from-timestamp takes milliseconds since the epoch or "
                                                   "YYYY-MM-DDTHH:mm:SS.sss with an optional time zone (Z, +01:00), "
                                                   "not 'yesterday'"),
    ("consume", ["--from-timestamp", "5", "--group", "g"], "--from-timestamp and --group exclude each other: "
                                                          "kmem groups --reset-offsets --to-datetime moves a group"),
    ("consume", ["--from-timestamp", "5", "--from-beginning"], "--from-timestamp and --from-beginning exclude each "
                                                              "other"),
    ("consume", ["--property", "print.colour=true"], "--property takes KEY=VALUE with KEY one of print.timestamp, "
                                                     "print.partition, print.offset, print.headers, print.key, "
                                                     "print.value, key.separator, line.separator, headers.separator, "
                                                     "headers.key.separator, null.literal, not 'print.colour=true'"),
])
def test_bad_arguments_are_one_line_and_exit_2_with_nothing_sent(capsys, command, args, message):
    code, out, err = kmem(capsys, command, "127.0.0.1:1", "--topic", "t", *args)
    assert code == 2 and out == ""
    assert one_error_line(err, command) == f"kmem {command}: error: {message}"


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_no_broker_is_one_line_and_exit_3(capsys, monkeypatch, command):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n")))
    code, out, err = kmem(capsys, command, "127.0.0.1:1", "--topic", "t")
    assert code == 3 and out == ""
    assert one_error_line(err, command).endswith("check --bootstrap-server and that the broker is running")


@pytest.mark.parametrize("command, options", [
    ("produce", ["--topic", "--property", "parse.key", "--rate", "--partition", "--command-config"]),
    ("consume", ["--topic", "--from-beginning", "--from-timestamp", "--offset", "--group", "--max-messages",
                 "--timeout-ms",
                 "--isolation-level", "print.headers", "--command-config"]),
    ("configs", ["--entity-type", "--entity-name", "--entity-default", "--describe", "--alter", "--add-config",
                 "--delete-config", "--all", "--command-config"]),
    ("offsets", ["--topic", "--partitions", "--time", "--exclude-internal-topics", "--command-config"]),
])
def test_help_describes_every_option_and_the_exit_codes(tmp_path, command, options):
    result = subprocess.run([sys.executable, "-m", "kmem.cli", command, "--help"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60, env=dict(os.environ, PYTHONSAFEPATH="1"))
    assert result.returncode == 0
    for text in [*options, "exit codes:", "3  no broker reachable"]:
        assert text in result.stdout, text


def test_ctrl_c_ends_the_input_and_what_was_typed_is_produced(capsys, kmem_broker, tmp_path):
    topic = "typed"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic)[0] == 0
    producer = subprocess.Popen([sys.executable, "-m", "kmem.cli", "produce", "--bootstrap-server", kmem_broker,
                                 "--topic", topic], stdin=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                                env=dict(os.environ, PYTHONSAFEPATH="1"))
    try:
        producer.stdin.write(b"typed in\n")
        producer.stdin.flush()
        wait_for(lambda: kmem(capsys, "offsets", kmem_broker, "--topic", topic)[1] == f"{topic}:0:1\n",
                 "the typed line produced")
        producer.send_signal(signal.SIGINT)
        assert producer.wait(60) == 0
        assert producer.stderr.read() == b""
    finally:
        producer.kill()
        producer.stdin.close()
        producer.stderr.close()
