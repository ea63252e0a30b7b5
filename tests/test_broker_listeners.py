"""Several listeners on one broker (Kafka's ``listeners``, ``listener.security.protocol.map``,
``advertised.listeners``): a PLAINTEXT listener beside a SASL_SSL one, each with its own settings under
``listener.name.<name>.``, each advertising its own endpoint in Metadata, FindCoordinator and DescribeCluster;
real clients on both; the configurations Kafka refuses, refused at start."""
import socket
import ssl
import uuid

import pytest
from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from broker_helpers import RawConnection, start_broker_process, wait_for
from network_helpers import make_tls_contexts
from kmem.broker import Broker
from kmem.errors import ConfigError, InvalidArgumentError

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
SASL_CLIENT = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
               "sasl.password": "alice-secret"}


def two_listeners(directory):
    """PLAINTEXT on 127.0.0.1 and SASL_SSL (PLAIN) advertised as localhost, each on a free port; the TLS and
    SASL settings carry the SASL_SSL listener's prefix only. Returns (properties, the CA file)."""
    make_tls_contexts(str(directory))
    keystore = directory / "bundle.pem"
    keystore.write_bytes((directory / "cert.pem").read_bytes() + (directory / "key.pem").read_bytes())
    properties = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                  "advertised.listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://localhost:0",
                  "listener.name.sasl_ssl.ssl.keystore.location": str(keystore),
                  "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN",
                  "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
                  "group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 1}
    return properties, str(directory / "cert.pem")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("listeners")
    properties, ca = two_listeners(directory)
    with Broker(directory / "logs", properties=properties) as running:
        yield running, ca


def endpoints(broker):
    plaintext_port = broker.server.addresses["PLAINTEXT"][1]
    sasl_ssl_port = broker.server.addresses["SASL_SSL"][1]
    assert plaintext_port != sasl_ssl_port
    return ("127.0.0.1", plaintext_port), ("localhost", sasl_ssl_port)


def raw_sasl_ssl(broker, ca):
    """A raw connection to the SASL_SSL listener, through TLS and authenticated as alice (PLAIN)."""
    connection = RawConnection(broker.bootstrap_servers_of("SASL_SSL"))
    connection.sock = ssl.create_default_context(cafile=ca).wrap_socket(connection.sock, server_hostname="localhost")
    assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 0
    answer = connection.request(SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"), SaslAuthenticateResponse,
                                1, correlation_id=2)
    assert answer.error_code == 0
    return connection


def advertised_endpoints(connection):
    """(host, port) of the broker in Metadata, FindCoordinator and DescribeCluster answered on ``connection``."""
    metadata = connection.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), MetadataResponse, 1,
                                  correlation_id=10)
    coordinator = connection.request(FindCoordinatorRequest(key="group"), FindCoordinatorResponse, 0,
                                     correlation_id=11)
    cluster = connection.request(DescribeClusterRequest(), DescribeClusterResponse, 0, correlation_id=12)
    assert coordinator.error_code == cluster.error_code == 0
    return [(metadata.brokers[0].host, metadata.brokers[0].port), (coordinator.host, coordinator.port),
            (cluster.brokers[0].host, cluster.brokers[0].port)]


def test_each_listener_answers_with_its_own_advertised_endpoint(broker):
    broker, ca = broker
    plaintext, sasl_ssl = endpoints(broker)
    with RawConnection(broker.bootstrap_servers_of("PLAINTEXT")) as connection:
        assert advertised_endpoints(connection) == [plaintext] * 3
    with raw_sasl_ssl(broker, ca) as connection:
        assert advertised_endpoints(connection) == [sasl_ssl] * 3
    assert broker.bootstrap_servers == broker.bootstrap_servers_of("PLAINTEXT") == "127.0.0.1:%d" % plaintext[1]
    with pytest.raises(InvalidArgumentError, match="no listener 'SSL': the broker serves PLAINTEXT, SASL_SSL"):
        broker.endpoint("SSL")


def test_the_sasl_ssl_listener_authenticates_and_the_plaintext_one_does_not(broker):
    broker, ca = broker
    with raw_sasl_ssl(broker, ca):
        pass
    with RawConnection(broker.bootstrap_servers_of("PLAINTEXT")) as connection:
        # a handshake on a listener without SASL reaches the broker: ILLEGAL_SASL_STATE, as Kafka answers
        assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse, 1).error_code == 34


def test_confluent_kafka_produces_on_plaintext_and_consumes_in_a_group_over_sasl_ssl(broker):
    from confluent_kafka import Consumer, Producer

    broker, ca = broker
    plaintext, sasl_ssl = endpoints(broker)
    topic = f"two-listeners-{uuid.uuid4().hex[:6]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers_of("PLAINTEXT")})
    for i in range(5):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    seen_by_producer = producer.list_topics(timeout=10).brokers[0]
    assert (seen_by_producer.host, seen_by_producer.port) == plaintext
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers_of("SASL_SSL"), "group.id": topic,
                         "auto.offset.reset": "earliest", "ssl.ca.location": ca, **SASL_CLIENT})
    consumer.subscribe([topic])
    seen = []
    try:
        def all_read():
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                seen.append(message.value())
            return len(seen) == 5
        wait_for(all_read, "every record, in a group over SASL_SSL")
        consumer.commit(asynchronous=False)
        seen_by_consumer = consumer.list_topics(timeout=10).brokers[0]
        assert (seen_by_consumer.host, seen_by_consumer.port) == sasl_ssl
    finally:
        consumer.close()
    assert seen == [b"%d" % i for i in range(5)]
    assert broker.coordinator.groups[topic].offsets        # committed through the coordinator found over SASL_SSL


def test_kmem_broker_logs_where_each_listener_listens(tmp_path):
    properties, _ = two_listeners(tmp_path)
    config = tmp_path / "server.properties"
    config.write_text("".join(f"{name}={value}\n" for name, value in properties.items()))
    process, address = start_broker_process(tmp_path / "logs", "--config", config, port=None)
    try:
        listening = wait_for(lambda: (found := [line for line in process.log_lines if "listening on" in line])[1:]
                             and found, "a line for each listener")
        assert "PLAINTEXT listener (PLAINTEXT): listening on " + address in listening[0]
        assert "SASL_SSL listener (SASL_SSL): listening on 127.0.0.1:" in listening[1]
        assert not listening[1].strip().endswith(address)
    finally:
        process.terminate()
        assert process.wait(30) == 0


@pytest.mark.parametrize("properties, message", [
    ({"listeners": "PLAINTEXT://:9092,SASL_SSL://:9093", "advertised.listeners": "EXTERNAL://gateway:9093"},
     "advertised.listeners names EXTERNAL, not a listener kmem broker serves (PLAINTEXT, SASL_SSL)"),
    ({"listeners": "PLAINTEXT://:9092,plaintext://:9093"}, "Each listener must have a different name"),
    ({"listeners": "PLAINTEXT://:9092,SSL://:9092"}, "Each listener must have a different port"),
    ({"listeners": "PLAINTEXT://:9092,INTERNAL://:9093"},
     "listener INTERNAL has no security protocol in listener.security.protocol.map"),
    ({"listeners": "PLAINTEXT://:9092,SASL_SSL://:9093", "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN"},
     "listener SASL_SSL://:9093 is SASL_SSL: set ssl.keystore.location"),
    ({"listeners": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9093", "sasl.enabled.mechanisms": "PLAIN",
      "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "GSSAPI"},
     "listener.name.sasl_plaintext.sasl.enabled.mechanisms = 'GSSAPI'"),
    ({"listeners": "PLAINTEXT://:9092,EXTERNAL://:9093", "inter.broker.listener.name": "INTERNAL",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT"},
     "inter.broker.listener.name must be a listener name defined in advertised.listeners"),
    ({"listeners": "PLAINTEXT://:9092", "inter.broker.listener.name": "PLAINTEXT",
      "security.inter.broker.protocol": "PLAINTEXT"}, "Only one of inter.broker.listener.name and"),
    ({"listeners": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9093", "sasl.enabled.mechanisms": "SCRAM-SHA-256",
      "listener.name.sasl_plaintext.max.connection.creation.rate": "0"},
     "listener.name.sasl_plaintext.max.connection.creation.rate must be an integer >= 1"),
    ({"max.connections.per.ip": "0"}, "max.connections.per.ip can be set to zero only if "
                                      "max.connections.per.ip.overrides property is set."),
    ({"max.connections.per.ip.overrides": "127.0.0.1=3"}, "max.connections.per.ip.overrides must be host:count"),
    ({"max.connections.per.ip.overrides": "no-such-host.invalid:3"},
     "max.connections.per.ip.overrides contains invalid addresses : no-such-host.invalid"),
])
def test_configurations_kafka_refuses_are_refused_at_start_in_one_line(tmp_path, properties, message):
    with pytest.raises(ConfigError) as refused:
        Broker(tmp_path, properties={"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,"
                                     "SASL_PLAINTEXT:SASL_PLAINTEXT", **properties})
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_host_and_port_replace_one_listener_and_port_0_puts_several_on_free_ports(tmp_path):
    two = {"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093"}
    with pytest.raises(ConfigError, match="host and port .* replace the address of one listener"):
        Broker(tmp_path, 9094, properties=two)
    with pytest.raises(ConfigError, match="host and port .* replace the address of one listener"):
        Broker(tmp_path, host="0.0.0.0", properties=two)
    settings = Broker(tmp_path, 0, properties=two, ssl_context=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)).settings
    assert [(served.name, served.protocol, served.listener.port) for served in settings.listeners] == [
        ("PLAINTEXT", "PLAINTEXT", 0), ("SSL", "SSL", 0)]
    assert settings.listeners[0].ssl_context is None and settings.listeners[1].ssl_context is not None
    # Kafka's default inter-broker listener: the one named after security.inter.broker.protocol
    assert settings.inter_broker_listener == "PLAINTEXT"


def test_per_listener_connection_limits_are_read_under_the_listener_prefix(tmp_path):
    settings = Broker(tmp_path, properties={
        "listeners": "PLAINTEXT://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "plaintext", "max.connections": "100",
        "listener.name.external.max.connections": "10", "listener.name.external.max.connection.creation.rate": "5",
        "max.connections.per.ip": "7", "max.connections.per.ip.overrides": "127.0.0.1:20"}).settings
    plaintext, external = settings.listeners
    assert (plaintext.max_connections, plaintext.max_connection_creation_rate) == (None, None)
    assert (external.max_connections, external.max_connection_creation_rate) == (10, 5)
    assert (settings.network.max_connections, settings.network.max_connections_per_ip) == (100, 7)
    assert settings.inter_broker_listener == "PLAINTEXT"


def metadata_answered(connection, wait=10.0):
    """True when a Metadata request on ``connection`` is answered within ``wait`` seconds (False: the broker has
    not accepted the connection yet)."""
    connection.sock.settimeout(wait)
    try:
        return connection.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), MetadataResponse, 1,
                                  correlation_id=20).brokers[0].port > 0
    except (TimeoutError, socket.timeout):
        return False


def test_connection_limits_apply_per_listener_with_kafkas_default_inter_broker_listener_exempt(tmp_path):
    properties = {"listeners": "PLAINTEXT://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
                  "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
                  "max.connections": "1", "listener.name.plaintext.max.connections": "2"}
    with Broker(tmp_path, properties=properties) as broker:
        local, external = broker.bootstrap_servers_of("PLAINTEXT"), broker.bootstrap_servers_of("EXTERNAL")
        with RawConnection(external) as first:
            assert metadata_answered(first)
            # PLAINTEXT is Kafka's default inter-broker listener (security.inter.broker.protocol): served past the
            # broker-wide max.connections, within its own listener limit; the other listener's least recently
            # used connection is closed to make room, as Kafka does
            tools = [RawConnection(local), RawConnection(local)]
            assert all(metadata_answered(connection) for connection in tools)
            assert first.receive_frame() is None
            with RawConnection(local) as waiting, RawConnection(external) as waiting_outside:
                assert not metadata_answered(waiting, 0.5) and not metadata_answered(waiting_outside, 0.1)
                tools.pop().close()
                assert metadata_answered(waiting)
                assert broker.server.quotas.count("EXTERNAL") == 0
                for connection in tools:
                    connection.close()


def test_a_failed_authentication_frees_its_connection_slot(tmp_path):
    properties = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
                  "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS, "max.connections.per.ip": "1"}
    with Broker(tmp_path, properties=properties) as broker:
        for password in (b"wrong", b"alice-secret"):
            with RawConnection(broker.bootstrap_servers) as connection:
                assert connection.request(SaslHandshakeRequest(mechanism="PLAIN"), SaslHandshakeResponse,
                                          1).error_code == 0
                answer = connection.request(SaslAuthenticateRequest(auth_bytes=b"\0alice\0" + password),
                                            SaslAuthenticateResponse, 1, correlation_id=2)
                assert answer.error_code == (58 if password == b"wrong" else 0)
                assert connection.receive_frame() is None if password == b"wrong" else metadata_answered(connection)
            wait_for(lambda: broker.server.quotas.total == 0, "the slot freed")
