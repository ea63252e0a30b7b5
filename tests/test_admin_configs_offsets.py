"""``kmem configs`` and ``kmem offsets`` (kmem.admin) against kmem broker and librdkafka's mock cluster, an
independent broker: kafka-configs' and kafka-get-offsets' output, what a client then sees, one-line errors and
exit codes."""

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient as ConfluentAdmin, ConfigResource, ConfigSource

from mock_cluster import MockCluster
from test_admin_tools import kmem, kmem_broker, kmem_server, one_error_line, topics  # noqa: F401 (fixtures)


def configs(capsys, bootstrap, *args):
    return kmem(capsys, "configs", bootstrap, *args)


def offsets(capsys, bootstrap, *args):
    return kmem(capsys, "offsets", bootstrap, *args)


def described_by_librdkafka(bootstrap, topic):
    """``{name: value}`` of the topic's configs set on it, as librdkafka's admin client reads them."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = ConfluentAdmin({"bootstrap.servers": bootstrap})      # kept until the answer is in
    entries = admin.describe_configs([resource])[resource].result(30)
    return {name: entry.value for name, entry in entries.items()
            if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}


def test_alter_and_describe_a_topics_configs(capsys, kmem_broker):
    assert topics(capsys, kmem_broker, "--create", "--topic", "configured")[0] == 0
    assert configs(capsys, kmem_broker, "--entity-type", "topics", "--entity-name", "configured", "--alter",
                   "--add-config", "retention.ms=60000,cleanup.policy=[compact,delete]") == \
        (0, "Completed updating config for topic configured.\n", "")
    code, out, err = configs(capsys, kmem_broker, "--entity-type", "topics", "--entity-name", "configured",
                             "--describe")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "Dynamic configs for topic configured are:",
        "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,"
        "delete, DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "  retention.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=60000, "
        "DEFAULT_CONFIG:log.retention.ms=604800000}"]
    assert described_by_librdkafka(kmem_broker, "configured") == {"cleanup.policy": "compact,delete",
                                                                  "retention.ms": "60000"}

    assert configs(capsys, kmem_broker, "--entity-type", "topics", "--entity-name", "configured", "--alter",
                   "--delete-config", "retention.ms")[0] == 0
    assert described_by_librdkafka(kmem_broker, "configured") == {"cleanup.policy": "compact,delete"}
    code, out, _ = configs(capsys, kmem_broker, "--entity-type", "topics", "--entity-name", "configured",
                           "--describe", "--all")
    assert code == 0 and out.splitlines()[0] == "All configs for topic configured are:"
    assert "  retention.ms=604800000 sensitive=false synonyms={DEFAULT_CONFIG:log.retention.ms=604800000}" in \
        out.splitlines()


def test_describe_a_broker_and_every_broker(capsys, kmem_broker):
    code, out, _ = configs(capsys, kmem_broker, "--entity-type", "brokers", "--entity-name", "0", "--describe",
                           "--all")
    assert code == 0 and out.splitlines()[0] == "All configs for broker 0 are:"
    assert any(line.startswith("  num.partitions=") for line in out.splitlines())
    assert configs(capsys, kmem_broker, "--entity-type", "brokers", "--describe") == \
        (0, "Dynamic configs for broker 0 are:\n", "")


def test_client_metrics_subscriptions_are_made_described_listed_and_deleted(capsys, kmem_broker):
    """KIP-714's subscriptions, as kafka-configs --entity-type client-metrics (and kafka-client-metrics) set them."""
    def client_metrics(*args):
        return configs(capsys, kmem_broker, "--entity-type", "client-metrics", *args)
    assert client_metrics("--entity-name", "producers", "--alter", "--add-config",
                          "metrics=[org.apache.kafka.producer.,org.apache.kafka.client.],interval.ms=1000,"
                          "match=[client_software_name=apache-kafka-java]") == \
        (0, "Completed updating config for client-metric producers.\n", "")
    code, out, err = client_metrics("--describe")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "Dynamic configs for client-metric producers are:",
        "  interval.ms=1000 sensitive=false synonyms={}",
        "  match=client_software_name=apache-kafka-java sensitive=false synonyms={}",
        "  metrics=org.apache.kafka.producer.,org.apache.kafka.client. sensitive=false synonyms={}"]
    code, out, err = client_metrics("--entity-name", "producers", "--alter", "--add-config", "interval.ms=5")
    assert code == 1 and one_error_line(err, "configs").startswith(
        "kmem configs: error: cannot alter the configs of client-metric producers: interval.ms 5 is not between "
        "100 and 3600000")
    assert client_metrics("--entity-name", "producers", "--alter", "--delete-config", "metrics,interval.ms,match")[0] \
        == 0
    assert client_metrics("--describe") == (0, "", "")


@pytest.mark.parametrize("args, message", [
    (["--entity-name", "no-such-topic", "--describe"], "topic 'no-such-topic' does not exist: kmem topics --list "
                                                       "shows the topics"),
    (["--entity-name", "no-such-topic", "--alter", "--add-config", "retention.ms=1"],
     "topic 'no-such-topic' does not exist: kmem topics --list shows the topics"),
    (["--entity-name", "configs-refused", "--alter", "--add-config", "no.such.config=1"],
     "cannot alter the configs of topic configs-refused: unknown topic config 'no.such.config': INVALID_CONFIG"),
])
def test_what_the_broker_refuses_is_one_line_and_exit_1(capsys, kmem_broker, args, message):
    assert topics(capsys, kmem_broker, "--create", "--topic", "configs-refused", "--if-not-exists")[0] == 0
    code, out, err = configs(capsys, kmem_broker, "--entity-type", "topics", *args)
    assert code == 1 and out == ""
    assert one_error_line(err, "configs") == f"kmem configs: error: {message}"


@pytest.mark.parametrize("command, args, message", [
    ("configs", ["--entity-type", "topics", "--alter", "--entity-name", "t"],
     "--alter needs --add-config or --delete-config"),
    ("configs", ["--entity-type", "topics", "--alter", "--add-config", "a=1"],
     "--alter needs --entity-name (or, for brokers, --entity-default)"),
    ("configs", ["--entity-type", "topics", "--entity-name", "t", "--alter", "--add-config", "retention.ms"],
     "--add-config takes K1=V1,K2=V2 (a value with commas in [ ]), not 'retention.ms'"),
    ("configs", ["--entity-type", "topics", "--entity-name", "t", "--alter", "--add-config", "a=1",
                 "--delete-config", "a"], "a cannot be both added and deleted"),
    ("configs", ["--entity-type", "brokers", "--entity-name", "zero", "--describe"],
     "--entity-name of a broker is its id (a number), not 'zero'"),
    ("configs", ["--entity-type", "topics", "--entity-default", "--describe"],
     "--entity-default applies to --entity-type brokers, without --entity-name"),
    ("offsets", ["--time", "yesterday"], "--time takes -1 (latest), -2 (earliest), -3 (max-timestamp) or a "
                                         "timestamp in milliseconds, not 'yesterday'"),
    ("offsets", ["--partitions", "3-1"], "--partitions takes partition numbers and ranges such as 0,3-5, not '3-1'"),
    ("offsets", ["--topic", "("], "--topic '(' is not a regular expression: missing ), unterminated subpattern at "
                                  "position 0"),
])
def test_bad_arguments_are_one_line_and_exit_2_with_nothing_sent(capsys, command, args, message):
    code, out, err = kmem(capsys, command, "127.0.0.1:1", *args)
    assert code == 2 and out == ""
    assert one_error_line(err, command) == f"kmem {command}: error: {message}"


def test_configs_on_librdkafkas_mock_cluster_names_the_api_it_lacks(capsys):
    cluster = MockCluster()
    try:
        cluster.create_topic("mocked", 1)
        code, out, err = configs(capsys, cluster.bootstrap, "--entity-type", "topics", "--entity-name", "mocked",
                                 "--describe")
    finally:
        cluster.close()
    assert code == 1 and out == ""
    assert one_error_line(err, "configs").endswith("does not serve DESCRIBE_CONFIGS: UNSUPPORTED_VERSION")


def produce_stamped(bootstrap, topic, partitions, timestamps):
    producer = Producer({"bootstrap.servers": bootstrap})
    for timestamp in timestamps:
        for partition in range(partitions):
            producer.produce(topic, b"x", partition=partition, timestamp=timestamp)
            producer.flush(30)
    assert producer.flush(30) == 0


@pytest.fixture(params=["kmem", "mock"])
def offsets_topic(request, capsys):
    """A topic of 3 partitions with 3 records each (timestamps 1000, 2000, 3000 ms) on kmem broker or
    librdkafka's mock cluster: its bootstrap and name."""
    if request.param == "kmem":
        bootstrap = request.getfixturevalue("kmem_broker")
        assert topics(capsys, bootstrap, "--create", "--topic", "measured", "--partitions", 3, "--if-not-exists")[0] \
            == 0
        produce_stamped(bootstrap, "measured", 3, [1000, 2000, 3000])
        yield bootstrap, "measured"
        assert topics(capsys, bootstrap, "--delete", "--topic", "measured")[0] == 0
        return
    cluster = MockCluster()
    cluster.create_topic("measured", 3)
    produce_stamped(cluster.bootstrap, "measured", 3, [1000, 2000, 3000])
    yield cluster.bootstrap, "measured"
    cluster.close()


@pytest.mark.parametrize("args, expected", [
    ([], ["0:3", "1:3", "2:3"]),
    (["--time", "-2"], ["0:0", "1:0", "2:0"]),
    (["--time", "earliest", "--partitions", "0,2"], ["0:0", "2:0"]),
    (["--time", "1500", "--partitions", "1-2"], ["1:1", "2:1"]),
    (["--time", "9000"], []),
])
def test_get_offsets(capsys, offsets_topic, request, args, expected):
    bootstrap, topic = offsets_topic
    if "1500" in args and "mock" in request.node.callspec.id:
        pytest.skip("librdkafka's mock cluster answers ListOffsets by timestamp with no offset")
    code, out, err = offsets(capsys, bootstrap, "--topic", topic, *args)
    assert (code, err) == (0, "")
    assert out.splitlines() == [f"{topic}:{line}" for line in expected]


def test_get_offsets_of_no_topic_is_one_line_and_exit_1(capsys, kmem_broker):
    code, out, err = offsets(capsys, kmem_broker, "--topic", "no-such-.*")
    assert code == 1 and out == ""
    assert one_error_line(err, "offsets") == ("kmem offsets: error: Could not match any topic-partitions with the "
                                              "specified filters: kmem topics --list shows the topics")
