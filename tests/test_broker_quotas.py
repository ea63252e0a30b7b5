"""Client quotas: KIP-55's precedence and Kafka's sampled rate (unit), DescribeClientQuotas and AlterClientQuotas
on the wire (KIP-546) with their errors, persistence and authorization, and KIP-219's throttling of a real producer."""
import json
import signal
import socket
import statistics
import threading
import time

import pytest

from broker_helpers import RawConnection, produce_raw, start_broker_process, wait_for
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.broker.quotas import (QUOTAS_FILE, ClientQuotaManager, ClientQuotaStore, ControllerMutationQuotaManager,
                                SampledRate, ThrottlingQuotaExceeded)
from kmem.protocol import ApiKey, decode_response, encode_request, message_class
from kmem.records import build_records
from test_broker_acls import PROPERTIES as ACL_PROPERTIES
from test_broker_acls import Client as SaslClient

Alter = message_class(ApiKey.ALTER_CLIENT_QUOTAS, "Request")
Describe = message_class(ApiKey.DESCRIBE_CLIENT_QUOTAS, "Request")
EXACT, DEFAULT, SPECIFIED = 0, 1, 2


def entry(entity, **ops):
    """An AlterClientQuotas entry: ``entity`` as {type: name or None}, each op a value or None (remove)."""
    return Alter.EntryData(entity=[Alter.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()],
                           ops=[Alter.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None)
                                for k, v in ops.items()])


class Raw:
    def __init__(self, bootstrap):
        self.raw = RawConnection(bootstrap)
        self.correlation_id = 0

    def call(self, api_key, version, request):
        self.correlation_id += 1
        self.raw.send_frame(bytes(encode_request(request, version, self.correlation_id, client_id="quota-test")))
        payload = self.raw.receive_frame()
        assert payload is not None, "the broker closed the connection"
        return decode_response(payload, api_key, version)[1]

    def alter(self, *entries, version=1, validate_only=False):
        response = self.call(ApiKey.ALTER_CLIENT_QUOTAS, version, Alter(entries=list(entries),
                                                                          validate_only=validate_only))
        return [(e.error_code, e.error_message) for e in response.entries]

    def describe(self, *components, strict=False, version=1):
        response = self.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, version, Describe(components=[
            Describe.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components], strict=strict))
        if response.error_code:
            return response.error_code
        return {tuple(sorted((e.entity_type, e.entity_name) for e in item.entity)):
                {v.key: v.value for v in item.values} for item in response.entries}


@pytest.fixture
def raw(tmp_path):
    with Broker(tmp_path) as broker:
        connection = Raw(broker.bootstrap_servers)
        yield connection
        connection.raw.close()


# -- unit: precedence and rate

LEVELS = [({"user": "alice", "client-id": "app"}, ("alice", "app")),
          ({"user": "alice", "client-id": None}, ("alice", "app")),
          ({"user": "alice"}, ("alice", "")),
          ({"user": None, "client-id": "app"}, ("alice", "app")),
          ({"user": None, "client-id": None}, ("alice", "app")),
          ({"user": None}, ("alice", "")),
          ({"client-id": "app"}, ("", "app")),
          ({"client-id": None}, ("", "app"))]


def test_the_eight_levels_of_kip_55_in_their_order(tmp_path):
    store = ClientQuotaStore(tmp_path)
    # every level set, each to its own value: removing the most specific one each time reveals the next
    store.alter([(list(entity.items()), [("producer_byte_rate", 1000 + i, False)])
                 for i, (entity, _) in enumerate(LEVELS)])
    for i, (entity, tags) in enumerate(LEVELS):
        assert store.resolve("alice", "app", "producer_byte_rate") == (1000 + i, tags)
        store.alter([(list(entity.items()), [("producer_byte_rate", 0, True)])])
    assert store.resolve("alice", "app", "producer_byte_rate") == (None, None)


def test_an_ips_connection_rate_is_its_own_however_written_else_the_default_ips(tmp_path):
    store = ClientQuotaStore(tmp_path)
    assert store.connection_rate("127.0.0.1") is None
    store.alter([([("ip", "0:0:0:0:0:0:0:1")], [("connection_creation_rate", 5, False)]),
                 ([("ip", None)], [("connection_creation_rate", 50, False)])])
    assert store.connection_rate("::1") == 5 and store.connection_rate("127.0.0.1") == 50
    store.alter([([("ip", None)], [("connection_creation_rate", 0, True)])])
    assert store.connection_rate("127.0.0.1") is None and store.connection_rate("::1") == 5


def test_a_level_applies_only_to_its_own_key_and_names(tmp_path):
    store = ClientQuotaStore(tmp_path)
    store.alter([([("user", "alice")], [("consumer_byte_rate", 50, False)]),
                 ([("client-id", None)], [("producer_byte_rate", 70, False)])])
    assert store.resolve("alice", "app", "consumer_byte_rate") == (50, ("alice", ""))
    assert store.resolve("alice", "app", "producer_byte_rate") == (70, ("", "app"))
    assert store.resolve("bob", "app", "consumer_byte_rate") == (None, None)


def test_sampled_rate_is_kafkas_rate_over_its_windows():
    rate = SampledRate(samples=11, window=1.0)
    rate.record(1000, now=100.0)
    # one sample: the window counts as the 10 full windows Kafka's Rate.windowSize assumes at least
    assert rate.measure(100.5) == pytest.approx(1000 / 10.5)
    for t in range(1, 20):
        rate.record(1000, now=100.0 + t)
    # 11 samples, begun at 109 s..119 s (the older ones reused): 11 kB over the 10.5 s since the oldest began
    assert rate.measure(119.5) == pytest.approx(11_000 / 10.5)
    # 11 s after the last record every sample has expired
    assert rate.measure(131.0) == 0


def test_throttle_time_is_kafkas_quota_utils_throttle_time(tmp_path):
    store = ClientQuotaStore(tmp_path)
    store.alter([([("user", "alice")], [("producer_byte_rate", 1000, False)])])
    now = [50.0]
    manager = ClientQuotaManager(store, "producer_byte_rate", clock=lambda: now[0])
    assert manager.record("User:alice", "app", 5000) == 0            # 5000 / 10 s = 500/s: within
    # 20000 more: 25000 / 10 s = 2500/s, (2500 - 1000) / 1000 * 10 s = 15 s
    assert manager.record("User:alice", "app", 20_000) == 15_000
    assert manager.record("User:bob", "app", 10**9) == 0             # no quota: never throttled


def test_rates_of_clients_gone_are_dropped(tmp_path):
    store = ClientQuotaStore(tmp_path)
    store.alter([([("client-id", None)], [("producer_byte_rate", 1000, False)])])
    now = [0.0]
    manager = ClientQuotaManager(store, "producer_byte_rate", clock=lambda: now[0])
    for i in range(20_000):             # a new client id every 10 ms: each rate idle 11 s later
        now[0] = i / 100
        manager.record("User:ANONYMOUS", f"client-{i}", 10)
    assert len(manager._states) < 2 * 1100 + 1024


# -- the wire

def test_alter_then_describe_with_kafkas_filters(raw):
    assert raw.alter(entry({"user": "alice"}, producer_byte_rate=1024, consumer_byte_rate=2048),
                     entry({"user": "alice", "client-id": "app"}, request_percentage=12.5),
                     entry({"user": None}, producer_byte_rate=500),
                     entry({"client-id": None}, controller_mutation_rate=3.5),
                     entry({"ip": "10.0.0.1"}, connection_creation_rate=10)) == [(0, None)] * 5
    alice, alice_app = (("user", "alice"),), (("client-id", "app"), ("user", "alice"))
    assert raw.describe() == {alice: {"producer_byte_rate": 1024, "consumer_byte_rate": 2048},
                              alice_app: {"request_percentage": 12.5}, (("user", None),): {"producer_byte_rate": 500},
                              (("client-id", None),): {"controller_mutation_rate": 3.5},
                              (("ip", "10.0.0.1"),): {"connection_creation_rate": 10}}
    assert set(raw.describe(("user", EXACT, "alice"))) == {alice, alice_app}
    assert set(raw.describe(("user", EXACT, "alice"), strict=True)) == {alice}
    assert set(raw.describe(("user", DEFAULT, None))) == {(("user", None),)}
    assert set(raw.describe(("user", SPECIFIED, None), strict=True)) == {alice, (("user", None),)}
    assert set(raw.describe(("user", SPECIFIED, None), ("client-id", SPECIFIED, None))) == {alice_app}
    assert raw.describe(strict=True) == {}
    # removing a key, then the last key, removes the entity
    assert raw.alter(entry({"user": "alice"}, consumer_byte_rate=None)) == [(0, None)]
    assert raw.alter(entry({"user": "alice"}, producer_byte_rate=None)) == [(0, None)]
    assert set(raw.describe(("user", EXACT, "alice"), strict=True)) == set()
    # validate_only changes nothing; version 0 is served too
    assert raw.alter(entry({"user": "carol"}, producer_byte_rate=1), validate_only=True, version=0) == [(0, None)]
    assert raw.describe(("user", EXACT, "carol"), version=0) == {}


@pytest.mark.parametrize("bad, message", [
    (entry({"user": "alice"}, bogus_rate=1), "Invalid configuration key bogus_rate"),
    (entry({"user": "alice"}, producer_byte_rate=-1), "non-negative"),
    (entry({"user": "alice"}, producer_byte_rate=float("nan")), "non-negative"),
    (entry({"user": "alice"}, producer_byte_rate=1.5), "must be a Long value"),
    (entry({"user": "alice"}, consumer_byte_rate=1e300), "must be a Long value"),
    (entry({"group": "g"}, producer_byte_rate=1), "Unhandled client quota entity type: group"),
    (entry({}, producer_byte_rate=1), "Invalid empty client quota entity"),
    (entry({"user": ""}, producer_byte_rate=1), "Empty user not supported"),
    (entry({"ip": "10.0.0.1", "user": "alice"}, connection_creation_rate=1), "Invalid empty client quota entity"),
    (entry({"ip": "10.0.0.1"}, producer_byte_rate=1), "Invalid configuration key producer_byte_rate"),
    (entry({"user": "alice"}, connection_creation_rate=1), "Invalid configuration key connection_creation_rate"),
    (entry({"ip": "not an ip"}, connection_creation_rate=1), "is not a valid IP"),
])
def test_an_entry_kafka_refuses_fails_alone_with_invalid_request(raw, bad, message):
    results = raw.alter(bad, entry({"user": "dave"}, producer_byte_rate=100))
    assert results[0][0] == ErrorCode.INVALID_REQUEST and message in results[0][1]
    assert results[1] == (0, None)
    assert raw.describe() == {(("user", "dave"),): {"producer_byte_rate": 100}}


@pytest.mark.parametrize("components, code", [
    ([("user", EXACT, "a"), ("user", DEFAULT, None)], ErrorCode.INVALID_REQUEST),
    ([("group", EXACT, "a")], ErrorCode.UNSUPPORTED_VERSION),
    ([("user", EXACT, None)], ErrorCode.INVALID_REQUEST),
    ([("user", DEFAULT, "a")], ErrorCode.INVALID_REQUEST),
    ([("user", 7, None)], ErrorCode.INVALID_REQUEST),
    ([("ip", SPECIFIED, None), ("user", SPECIFIED, None)], ErrorCode.INVALID_REQUEST),
])
def test_a_filter_kafka_refuses_gets_its_error(raw, components, code):
    assert raw.describe(*components) == code


def test_quotas_survive_restart_and_sigkill(tmp_path):
    process, bootstrap = start_broker_process(tmp_path)
    try:
        raw = Raw(bootstrap)
        assert raw.alter(entry({"user": "alice", "client-id": None}, producer_byte_rate=4096)) == [(0, None)]
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        process.kill()
    with Broker(tmp_path) as broker:
        assert Raw(broker.bootstrap_servers).describe() == {
            (("client-id", None), ("user", "alice")): {"producer_byte_rate": 4096}}
    with open(tmp_path / QUOTAS_FILE) as file:
        assert json.load(file)["quotas"][0]["values"] == {"producer_byte_rate": 4096}


def test_with_an_authorizer_describe_and_alter_need_the_cluster_configs(tmp_path):
    with Broker(tmp_path, properties=ACL_PROPERTIES) as broker:
        bob, admin = SaslClient(broker.bootstrap_servers, "bob"), SaslClient(broker.bootstrap_servers, "admin")
        try:
            request = Alter(entries=[entry({"user": "bob"}, producer_byte_rate=1)], validate_only=False)
            denied = bob.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, **vars_of(request))
            assert [e.error_code for e in denied.entries] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
            assert bob.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, components=[], strict=False).error_code == \
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            allowed = admin.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, **vars_of(request))
            assert [e.error_code for e in allowed.entries] == [0]
            described = admin.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, components=[], strict=False)
            assert described.error_code == 0 and len(described.entries) == 1
        finally:
            bob.close()
            admin.close()


def vars_of(request):
    return {"entries": request.entries, "validate_only": request.validate_only}


# -- throttling a real producer (KIP-219)

QUOTA = 200_000


def test_producer_held_to_its_byte_rate_and_told_of_the_throttle(tmp_path):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    # 3 windows of 1 s: the burst a fresh rate lets through (Kafka's Rate counts at least 2 windows) is over
    # after 2 s, so 9 s show the steady rate (with the default 11 windows, the first 10 s are that burst's)
    with Broker(tmp_path, properties={"quota.window.num": 3}) as broker:
        raw = Raw(broker.bootstrap_servers)
        assert raw.alter(entry({"client-id": "throttled"}, producer_byte_rate=QUOTA)) == [(0, None)]
        throttles = []
        producer = confluent_kafka.Producer({
            "bootstrap.servers": broker.bootstrap_servers, "client.id": "throttled", "linger.ms": 5,
            "statistics.interval.ms": 500, "batch.size": 16384,
            "queue.buffering.max.messages": 100,      # little backlog: the producer waits for its acks
            "stats_cb": lambda stats: throttles.append(
                max(b["throttle"]["max"] for b in json.loads(stats)["brokers"].values()))})
        acked = []
        stop = threading.Event()
        latencies = []

        def unthrottled():      # another client on the same broker keeps its latency
            other = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers, "client.id": "free",
                                              "linger.ms": 0})
            while not stop.is_set():
                started = time.monotonic()
                done = []
                other.produce("free", b"x" * 100, on_delivery=lambda err, msg: done.append(err))
                other.flush(5)
                assert done == [None]
                latencies.append(time.monotonic() - started)
                time.sleep(0.05)
        checker = threading.Thread(target=unthrottled)
        checker.start()
        value = b"v" * 1000
        started = time.monotonic()
        try:
            while time.monotonic() - started < 9:
                try:
                    producer.produce("quota-topic", value, on_delivery=lambda err, msg: acked.append(
                        (time.monotonic(), len(msg.value())) if err is None else None))
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
        finally:
            stop.set()
            checker.join()
        producer.flush(30)
        producer.poll(1)
        # the steady state, from 3 s on: the values acknowledged (a little under the bytes of the requests the
        # broker counts) over the time from the first to the last of them
        steady = [(t, size) for t, size in acked if t - started >= 3]
        elapsed = steady[-1][0] - steady[0][0]
        rate = sum(size for _, size in steady[1:]) / elapsed
        assert QUOTA * 0.9 <= rate <= QUOTA * 1.1, rate
        print(f"rate {rate:.0f} B/s over {elapsed:.1f} s, throttle max {max(throttles)} ms")
        assert max(throttles) > 0
        assert statistics.median(latencies) < 0.5, latencies


def test_throttled_connection_is_muted_after_its_response(tmp_path):
    """The Produce response comes at once with throttle_time_ms; the connection's next request waits for the end
    of the throttle, another connection's does not."""
    with Broker(tmp_path, properties={"auto.create.topics.enable": True}) as broker:
        raw, other = Raw(broker.bootstrap_servers), Raw(broker.bootstrap_servers)
        assert raw.alter(entry({"client-id": "raw"}, producer_byte_rate=2000)) == [(0, None)]
        Metadata = message_class(ApiKey.METADATA, "Request")
        raw.call(ApiKey.METADATA, 4, Metadata(topics=[Metadata.MetadataRequestTopic(name="t")],
                                              allow_auto_topic_creation=True))
        wait_for(lambda: broker.logs.get_partition("t", 0) is not None, "the topic")
        started = time.monotonic()
        partition = produce_raw(raw.raw, "t", bytes(build_records([b"x" * 23_000])))
        answered = time.monotonic()
        # about 23 kB in a rate of 10 windows of 1 s, over 2000 B/s: (2300 - 2000) / 2000 * 10 s = 1.5 s
        assert partition.error_code == 0
        throttle_ms = raw.raw.last_throttle_time_ms
        assert 1400 <= throttle_ms <= 1700 and answered - started < 1
        versions = message_class(ApiKey.API_VERSIONS, "Request")(client_software_name="t",
                                                                 client_software_version="1")
        other.call(ApiKey.API_VERSIONS, 3, versions)
        assert time.monotonic() - answered < 1
        raw.call(ApiKey.API_VERSIONS, 3, versions)
        assert time.monotonic() - started >= throttle_ms / 1000 * 0.95


def fetch_batch(connection, topic, offset, max_wait_ms=0):
    """A Fetch v11 of one batch (KIP-74: the first batch whole, then no more than 5000 bytes)."""
    from kafka.protocol.consumer import FetchRequest, FetchResponse
    partition = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=5000)
    return connection.request(FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=5000,
                                           topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])]),
                              FetchResponse, 11)


def test_a_fetch_over_consumer_byte_rate_is_answered_empty_with_its_throttle(tmp_path):
    """As Kafka's handleFetchRequest: the bytes a Fetch returns count; one that takes the rate over the quota is
    answered empty with throttle_time_ms (its bytes not counted) and the connection waits out the throttle."""
    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        broker.logs.create_topic("data")
        raw = Raw(broker.bootstrap_servers)
        for _ in range(3):
            assert produce_raw(raw.raw, "data", bytes(build_records([b"y" * 9000]))).error_code == 0
        assert raw.alter(entry({"client-id": "raw"}, consumer_byte_rate=10_000)) == [(0, None)]


        def fetch(offset):
            return fetch_batch(raw.raw, "data", offset)
        first = fetch(0)        # about 9.1 kB over at least 1 s: within 10 kB/s
        assert first.throttle_time_ms == 0 and len(first.responses[0].partitions[0].records) > 9000
        started = time.monotonic()
        throttled = fetch(1)    # 18.2 kB over 1 s: (18.2 - 10) / 10 x 1 s = 0.82 s
        assert 600 <= throttled.throttle_time_ms <= 1000 and throttled.responses == []
        fetch(1)
        # muted for the throttle: the next request is answered only after it
        assert time.monotonic() - started >= throttled.throttle_time_ms / 1000 * 0.95


def test_a_fetch_parked_in_the_purgatory_is_throttled_when_it_completes(tmp_path):
    """A long-polling Fetch waits in the purgatory as ever; the response it completes with counts, and one over
    the quota is answered empty with its throttle."""
    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        broker.logs.create_topic("later")
        raw, producer = Raw(broker.bootstrap_servers), Raw(broker.bootstrap_servers)
        assert raw.alter(entry({"client-id": "raw"}, consumer_byte_rate=10_000)) == [(0, None)]
        answers = []
        for offset in (0, 1):
            waiting = threading.Thread(target=lambda: answers.append(fetch_batch(raw.raw, "later", offset, 10_000)))
            waiting.start()
            wait_for(lambda: len(broker.handlers.fetch_purgatory) == 1, "the fetch to be parked")
            assert produce_raw(producer.raw, "later", bytes(build_records([b"z" * 9000]))).error_code == 0
            waiting.join(15)
        first, second = answers
        assert first.throttle_time_ms == 0 and len(first.responses[0].partitions[0].records) > 9000
        assert second.throttle_time_ms > 0 and second.responses == []


# -- request_percentage (KIP-124) and controller_mutation_rate (KIP-599)

def test_request_time_counts_in_percent_of_a_thread_and_throttles_at_most_a_window(tmp_path):
    store = ClientQuotaStore(tmp_path)
    store.alter([([("client-id", "app")], [("request_percentage", 10, False)])])
    now = [50.0]
    manager = ClientQuotaManager(store, "request_percentage", clock=lambda: now[0])
    # 0.5 s of handling in 10 windows of 1 s: 5 % of a thread, within 10 %
    assert manager.record_time("User:ANONYMOUS", "app", 500_000_000) == 0
    # 2 s more: 25 %, (25 - 10) / 10 x 10 s = 15 s, bounded to one window as Kafka's ClientRequestQuotaManager
    assert manager.record_time("User:ANONYMOUS", "app", 2_000_000_000) == 1000
    assert manager.record_time("User:ANONYMOUS", "other", 10**12) == 0


def test_a_strict_mutation_quota_refuses_once_the_bucket_is_below_zero_and_a_permissive_one_never(tmp_path):
    store = ClientQuotaStore(tmp_path)
    store.alter([([("user", "alice")], [("controller_mutation_rate", 2, False)])])
    now = [10.0]
    manager = ControllerMutationQuotaManager(store, samples=2, window_seconds=1, clock=lambda: now[0])
    strict = manager.quota_for("User:alice", "app", strict=True)
    strict.record(4)                        # the burst: 2/s x 2 windows of 1 s; the bucket is at 0
    assert strict.throttle_time_ms() == 0
    strict.record(3)                        # not below zero before: accepted, and 3 tokens short
    assert strict.throttle_time_ms() == 1500        # -(-3) / 2 per s
    with pytest.raises(ThrottlingQuotaExceeded):
        manager.quota_for("User:alice", "app", strict=True).record(1)
    permissive = manager.quota_for("User:alice", "app", strict=False)
    permissive.record(1)                    # accepted below zero, and throttled longer
    assert permissive.throttle_time_ms() == 2000
    now[0] += 0.5
    assert permissive.throttle_time_ms() == 1500    # the time since counts
    now[0] += 1.5                           # refilled to 0: strict accepts again
    manager.quota_for("User:alice", "app", strict=True).record(1)
    assert manager.quota_for("User:bob", "app", strict=True) is None


def create_topics(raw, version, *topics):
    """CreateTopics of ``(name, partitions)``: ``(throttle_time_ms, {name: error code})``."""
    Create = message_class(ApiKey.CREATE_TOPICS, "Request")
    response = raw.call(ApiKey.CREATE_TOPICS, version, Create(timeout_ms=5000, validate_only=False, topics=[
        Create.CreatableTopic(name=name, num_partitions=count, replication_factor=1, assignments=[], configs=[])
        for name, count in topics]))
    return response.throttle_time_ms, {t.name: t.error_code for t in response.topics}


def test_topic_mutations_over_controller_mutation_rate_are_refused_from_the_strict_versions(tmp_path):
    """KIP-599 on the wire: CreateTopics v6+, CreatePartitions v3+ and DeleteTopics v5+ refuse, topic by topic,
    with THROTTLING_QUOTA_EXCEEDED once the client's bucket is below zero; v5 of CreateTopics takes the topic and
    throttles. Each response carries the throttle and the connection waits it out."""
    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        raw = Raw(broker.bootstrap_servers)
        assert raw.alter(entry({"client-id": "quota-test"}, controller_mutation_rate=2)) == [(0, None)]
        # a burst of 2/s x 2 windows: 4 partitions at once, then a topic that takes the bucket below zero
        started = time.monotonic()
        assert create_topics(raw, 7, ("a", 4)) == (0, {"a": 0})
        throttle_ms, errors = create_topics(raw, 7, ("b", 2), ("c", 1))
        # 2 tokens short at 2/s, less what the bucket took back since the first mutation
        refilled_ms = (time.monotonic() - started) * 1000
        assert errors == {"b": 0, "c": ErrorCode.THROTTLING_QUOTA_EXCEEDED}
        assert 1000 - refilled_ms <= throttle_ms <= 1000
        # on other connections of the same client (each answer mutes its own), while the bucket is short: refused
        assert create_topics(Raw(broker.bootstrap_servers), 6, ("d", 1))[1] == {
            "d": ErrorCode.THROTTLING_QUOTA_EXCEEDED}
        Partitions = message_class(ApiKey.CREATE_PARTITIONS, "Request")
        response = Raw(broker.bootstrap_servers).call(ApiKey.CREATE_PARTITIONS, 3, Partitions(
            timeout_ms=5000, validate_only=False, topics=[Partitions.CreatePartitionsTopic(name="a", count=5, assignments=None)]))
        assert response.results[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED and response.throttle_time_ms
        Delete = message_class(ApiKey.DELETE_TOPICS, "Request")
        response = Raw(broker.bootstrap_servers).call(ApiKey.DELETE_TOPICS, 5, Delete(topic_names=["a"],
                                                                                         timeout_ms=5000))
        assert response.responses[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert "a" in broker.logs.topics() and "d" not in broker.logs.topics()
        # permissive below v6: taken, and throttled
        throttle_ms, errors = create_topics(Raw(broker.bootstrap_servers), 5, ("e", 1))
        assert errors == {"e": 0} and throttle_ms > 0
        # the first connection waits out its throttle; once the bucket is back the mutation passes
        wait_for(lambda: create_topics(raw, 7, ("f", 1))[1] == {"f": 0}, "the bucket to refill")
        assert time.monotonic() - started >= 0.9
        assert broker.logs.topics()["a"].partitions == 4


def test_requests_over_request_percentage_are_throttled(tmp_path):
    """KIP-124: the time the broker spends on a client's requests counts against its request_percentage; over it,
    responses carry a throttle of at most one window and the connection waits it out."""
    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        raw = Raw(broker.bootstrap_servers)
        assert raw.alter(entry({"client-id": "quota-test"}, request_percentage=0.0001)) == [(0, None)]
        Metadata = message_class(ApiKey.METADATA, "Request")
        throttles = []
        started = time.monotonic()
        for _ in range(3):
            throttles.append(raw.call(ApiKey.METADATA, 12, Metadata(topics=None)).throttle_time_ms)
        # 0.0001 % of a thread is 1 µs a second: every answer is throttled, each for at most the 1 s window
        assert all(0 < ms <= 1000 for ms in throttles), throttles
        assert time.monotonic() - started >= sum(throttles[:2]) / 1000 * 0.95
        # another client is not held
        other = RawConnection(broker.bootstrap_servers)
        other.send_frame(bytes(encode_request(Metadata(topics=None), 12, 1, client_id="free")))
        assert decode_response(other.receive_frame(), ApiKey.METADATA, 12)[1].throttle_time_ms == 0
        other.close()


def test_confluent_kafka_admin_is_throttled_by_the_mutation_quota(tmp_path):
    """librdkafka's AdminClient sends CreateTopics v4, below KIP-599's strict versions: its topics are created and it
    is told of the throttle (its throttle callback), as Kafka's permissive quota has it."""
    from confluent_kafka.admin import AdminClient, NewTopic
    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        assert Raw(broker.bootstrap_servers).alter(
            entry({"client-id": "admin-app"}, controller_mutation_rate=1)) == [(0, None)]
        throttles = []
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, "client.id": "admin-app",
                             "throttle_cb": lambda event: throttles.append(event.throttle_time)})
        admin.create_topics([NewTopic("wide", 20, 1)])["wide"].result(30)
        wait_for(lambda: admin.poll(0.1) is not None and throttles, "the throttle callback")
        # 20 partitions from a bucket of 2: 18 short at 1 a second
        assert 17 <= throttles[0] <= 18, throttles
        assert broker.logs.topics()["wide"].partitions == 20


def connect_from(bootstrap, source_ip):
    """A RawConnection to the broker from ``source_ip`` (any address of 127.0.0.0/8 is this machine's)."""
    host, port = bootstrap.rsplit(":", 1)
    connection = RawConnection.__new__(RawConnection)
    connection.sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source_ip, 0))
    return connection


def answered(connection):
    """Whether the broker answers an ApiVersions on ``connection`` (False: it closed the connection)."""
    versions = message_class(ApiKey.API_VERSIONS, "Request")(client_software_name="t", client_software_version="1")
    try:
        connection.send_frame(bytes(encode_request(versions, 3, 1, client_id="ip-test")))
        return connection.receive_frame() is not None
    except OSError:
        return False


def test_connections_over_an_ips_connection_creation_rate_are_closed_after_their_throttle(tmp_path):
    """KIP-612's IP quota, as Kafka's ConnectionQuotas: an address's connections per second over its own quota (or
    the default IP's) are not served and are closed after the throttle, not at once; other addresses, and the
    same address once its rate is back, connect as ever."""
    with Broker(tmp_path, properties={"quota.window.num": 2}) as broker:
        raw = Raw(broker.bootstrap_servers)
        assert raw.alter(entry({"ip": "127.0.0.1"}, connection_creation_rate=2),
                         entry({"ip": None}, connection_creation_rate=1000)) == [(0, None), (0, None)]
        # a rate over at least one full window of 1 s: 2 connections pass (the alter's own counted before it)
        served = [connect_from(broker.bootstrap_servers, "127.0.0.1") for _ in range(2)]
        throttled_at = time.monotonic()
        throttled = connect_from(broker.bootstrap_servers, "127.0.0.1")
        assert not answered(throttled)
        # held open for its throttle, (3 - 2) / 2 x 1 s, then closed
        assert time.monotonic() - throttled_at >= 0.4
        assert all(answered(c) for c in served)
        # another address has the default quota
        assert all(answered(connect_from(broker.bootstrap_servers, "127.0.0.2")) for _ in range(5))
        wait_for(lambda: answered(connect_from(broker.bootstrap_servers, "127.0.0.1")), "the rate to fall")
