"""Client metrics (KIP-714, ``kmem.broker.telemetry``): with ``metrics.port`` set the broker advertises
GetTelemetrySubscriptions and PushTelemetry, librdkafka and Apache's Java client (kafka-clients 3.9.1) push their
metrics and the Prometheus endpoint shows them per client (the Java client's test is in test_broker_java_client.py,
beside its probe); subscriptions are configured as
``kafka-client-metrics`` configures them (IncrementalAlterConfigs on CLIENT_METRICS resources); a push Kafka
refuses is refused with Kafka's error code, a hostile payload included, and the connection stays open."""
import uuid

import pytest
from confluent_kafka import Producer

from broker_helpers import RawConnection, wait_for
from kmem.broker import Broker
from kmem.broker.codes import ErrorCode
from kmem.broker.telemetry import CLIENT_METRICS_RESOURCE, MAX_DECOMPRESSED_BYTES, MAX_SERIES
from kmem.protocol import ApiKey, messages
from kmem.records.codecs import GZIP, ZSTD, compress
from test_broker_metrics import scrape, value

pytest.importorskip("prometheus_client")
metrics_pb2 = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2")
common_pb2 = pytest.importorskip("opentelemetry.proto.common.v1.common_pb2")

SET, DELETE = 0, 1


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path, properties={"metrics.port": 0, "client.metrics.default.interval.ms": 500}) as running:
        yield running


def client_samples(text, client_id):
    """The lines of a scrape labelled with ``client_id``."""
    return [line for line in text.splitlines() if f'client_id="{client_id}"' in line]


def subscribe(raw, name, **configs):
    """IncrementalAlterConfigs SET of ``configs`` (Kafka's names, ``_`` for ``.``) on subscription ``name``, as
    ``kafka-client-metrics --alter`` sends it; the resource's error code and message."""
    Request = messages.IncrementalAlterConfigsRequest
    request = Request(validate_only=False, resources=[Request.AlterConfigsResource(
        resource_type=CLIENT_METRICS_RESOURCE, resource_name=name, configs=[
            Request.AlterableConfig(name=key.replace("_", "."), config_operation=SET, value=text)
            for key, text in configs.items()])])
    [result] = raw.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, request).responses
    return result.error_code, result.error_message


def get_subscriptions(raw, instance_id=uuid.UUID(int=0), client_id="raw"):
    return raw.call(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0,
                    messages.GetTelemetrySubscriptionsRequest(client_instance_id=instance_id), client_id=client_id)


def push(raw, subscription, payload, compression=0, terminating=False, instance_id=None):
    request = messages.PushTelemetryRequest(
        client_instance_id=instance_id or subscription.client_instance_id, subscription_id=subscription.subscription_id,
        terminating=terminating, compression_type=compression, metrics=payload)
    return raw.call(ApiKey.PUSH_TELEMETRY, 0, request).error_code


def push_when_due(raw, subscription, payload, compression=0):
    """``push``, sent again while it comes too soon after the last (THROTTLING_QUOTA_EXCEEDED)."""
    return wait_for(lambda: (code := push(raw, subscription, payload, compression))
                    != ErrorCode.THROTTLING_QUOTA_EXCEEDED and [code], "a push an interval after the last")[0]


def otlp(name="org.apache.kafka.client.test.requests", value=7, monotonic=True, nodes=1):
    """An OTLP MetricsData of one sum with a point per ``node.id`` attribute (0 to ``nodes`` - 1)."""
    data = metrics_pb2.MetricsData()
    metric = data.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = name
    metric.sum.is_monotonic = monotonic
    metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    for node in range(nodes):
        point = metric.sum.data_points.add()
        point.as_int = value
        point.attributes.append(common_pb2.KeyValue(key="node.id", value=common_pb2.AnyValue(string_value=str(node))))
    return data.SerializeToString()


def test_librdkafka_pushes_its_metrics_and_the_endpoint_shows_them_per_client(broker):
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "client.id": "rdkafka-telemetry"})
    producer.produce("pushed", b"v")
    assert producer.flush(30) == 0
    text = wait_for(lambda: (text := scrape(broker)) and client_samples(text, "rdkafka-telemetry") and text,
                    "librdkafka's pushed metrics on the endpoint")
    sent = [line for line in client_samples(text, "rdkafka-telemetry")
            if line.startswith("org_apache_kafka_producer_connection_creation_total")]
    assert len(sent) == 1 and sent[0].endswith(" 1.0") and 'client_instance_id="' in sent[0]
    del producer


def test_not_advertised_without_a_receiver(tmp_path):
    with Broker(tmp_path) as broker, RawConnection(broker.bootstrap_servers) as raw:
        versions = raw.call(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
            client_software_name="raw", client_software_version="1"))
        advertised = {api.api_key for api in versions.api_keys}
        assert ApiKey.PUSH_TELEMETRY not in advertised and ApiKey.GET_TELEMETRY_SUBSCRIPTIONS not in advertised
        assert ApiKey.LIST_CLIENT_METRICS_RESOURCES in advertised


def test_subscriptions_are_configured_matched_and_persisted(tmp_path):
    with Broker(tmp_path, properties={"metrics.port": 0}) as broker, \
            RawConnection(broker.bootstrap_servers) as raw:
        assert subscribe(raw, "raw-clients", metrics="org.apache.kafka.client.test,org.apache.kafka.producer.",
                         interval_ms="1000", match="client_id=ra.*") == (ErrorCode.NONE, None)
        assert subscribe(raw, "others", metrics="org.apache.kafka.consumer.", interval_ms="2000",
                         match="client_id=other") == (ErrorCode.NONE, None)
        mine = get_subscriptions(raw)
        assert mine.error_code == ErrorCode.NONE and mine.client_instance_id != uuid.UUID(int=0)
        assert (mine.requested_metrics, mine.push_interval_ms) == (
            ["org.apache.kafka.client.test", "org.apache.kafka.producer."], 1000)
        assert mine.accepted_compression_types == [ZSTD, 3, GZIP, 2] and not mine.delta_temporality
        unmatched = get_subscriptions(raw, client_id="someone")          # the default subscription
        assert (unmatched.requested_metrics, unmatched.push_interval_ms) == (["*"], 60_000)
        for bad in ({"interval_ms": "50"}, {"match": "client_colour=red"}, {"match": "client_id=("},
                    {"no_such": "x"}):
            code, message = subscribe(raw, "bad", **bad)
            assert code == ErrorCode.INVALID_CONFIG and message, bad
        listed = raw.call(ApiKey.LIST_CLIENT_METRICS_RESOURCES, 0, messages.ListClientMetricsResourcesRequest())
        assert [r.name for r in listed.client_metrics_resources] == ["others", "raw-clients"]
        Request = messages.DescribeConfigsRequest
        [described] = raw.call(ApiKey.DESCRIBE_CONFIGS, 4, Request(resources=[Request.DescribeConfigsResource(
            resource_type=CLIENT_METRICS_RESOURCE, resource_name="others", configuration_keys=None)],
            include_synonyms=False, include_documentation=False)).results
        assert {c.name: c.value for c in described.configs} == {
            "metrics": "org.apache.kafka.consumer.", "interval.ms": "2000", "match": "client_id=other"}
        # a changed subscription: the client's id is no longer its subscription, it asks again
        assert subscribe(raw, "raw-clients", interval_ms="3000") == (ErrorCode.NONE, None)
        assert push(raw, mine, otlp()) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
        again = get_subscriptions(raw, mine.client_instance_id)
        assert again.error_code == ErrorCode.NONE and again.push_interval_ms == 3000
        assert again.subscription_id != mine.subscription_id
    with Broker(tmp_path, properties={"metrics.port": 0}) as broker, \
            RawConnection(broker.bootstrap_servers) as raw:
        listed = raw.call(ApiKey.LIST_CLIENT_METRICS_RESOURCES, 0, messages.ListClientMetricsResourcesRequest())
        assert [r.name for r in listed.client_metrics_resources] == ["others", "raw-clients"]
        Request = messages.IncrementalAlterConfigsRequest
        deleted = raw.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, Request(validate_only=False, resources=[
            Request.AlterConfigsResource(resource_type=CLIENT_METRICS_RESOURCE, resource_name="others", configs=[
                Request.AlterableConfig(name=name, config_operation=DELETE, value=None)
                for name in ("metrics", "interval.ms", "match")])]))
        assert deleted.responses[0].error_code == ErrorCode.NONE
        listed = raw.call(ApiKey.LIST_CLIENT_METRICS_RESOURCES, 0, messages.ListClientMetricsResourcesRequest())
        assert [r.name for r in listed.client_metrics_resources] == ["raw-clients"]


def test_pushes_kafka_refuses_are_refused_with_its_error_codes(broker):
    with RawConnection(broker.bootstrap_servers) as raw:
        subscription = get_subscriptions(raw)
        assert get_subscriptions(raw, subscription.client_instance_id).error_code == \
            ErrorCode.THROTTLING_QUOTA_EXCEEDED             # asked again within its interval
        assert push(raw, subscription, compress(ZSTD, otlp(value=7), 2), compression=ZSTD) == ErrorCode.NONE
        wait_for(lambda: value(scrape(broker), "org_apache_kafka_client_test_requests_total", client_id="raw",
                               client_instance_id=str(subscription.client_instance_id), node_id="0") == 7,
                 "the pushed sum on the endpoint")
        assert push(raw, subscription, otlp()) == ErrorCode.THROTTLING_QUOTA_EXCEEDED      # pushed too soon
        wrong = messages.GetTelemetrySubscriptionsResponse(client_instance_id=subscription.client_instance_id,
                                                           subscription_id=subscription.subscription_id + 1)
        cases = [
            (wrong, otlp(), 0, ErrorCode.UNKNOWN_SUBSCRIPTION_ID),
            (subscription, otlp(), 7, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
            (subscription, b"x" * ((1 << 20) + 1), 0, ErrorCode.TELEMETRY_TOO_LARGE),
            # a zstd bomb: 1 KiB expanding past what a push may decompress to
            (subscription, compress(ZSTD, bytes(MAX_DECOMPRESSED_BYTES + 1), 2), ZSTD, ErrorCode.INVALID_RECORD),
            (subscription, b"\x28\xb5\x2f\xfd garbage", ZSTD, ErrorCode.INVALID_RECORD),
            (subscription, compress(GZIP, b"\x0a\xff\xff\xff\xff\x0f", 2), GZIP, ErrorCode.INVALID_RECORD),
        ]
        for answer, payload, compression, code in cases:
            assert push_when_due(raw, answer, payload, compression) == code, code
        assert push(raw, subscription, otlp(), instance_id=uuid.UUID(int=0)) == ErrorCode.INVALID_REQUEST
        # a push of more series than a client may show: the first MAX_SERIES are
        assert push_when_due(raw, subscription, compress(ZSTD, otlp(value=8, nodes=MAX_SERIES + 5), 2), ZSTD) \
            == ErrorCode.NONE
        shown = [line for line in scrape(broker).splitlines()
                 if line.startswith("org_apache_kafka_client_test_requests_total{")]
        assert len(shown) == MAX_SERIES and all(line.endswith(" 8.0") for line in shown)
        # a terminating push is taken at once; nothing is taken after it
        assert push(raw, subscription, otlp(value=9), terminating=True) == ErrorCode.NONE
        assert value(scrape(broker), "org_apache_kafka_client_test_requests_total", client_id="raw",
                     client_instance_id=str(subscription.client_instance_id), node_id="0") == 9
        assert push(raw, subscription, otlp(), terminating=True) == ErrorCode.INVALID_REQUEST
