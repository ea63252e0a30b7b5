"""kmem's consumer and tools over SASL (PLAIN, SCRAM-SHA-256/512) on SASL_PLAINTEXT and SASL_SSL listeners: each
reads what confluent-kafka wrote, in a group, and a wrong password, a mechanism the broker does not enable or a
broker that does not hold the user's credential is refused with one clear error. The SCRAM client is checked
against RFC 7677's exchange, which nobody here wrote."""
import base64
import time
import uuid

import pytest
from confluent_kafka import Producer

from kmem.admin.commands import client_config, CommandError
from kmem.broker import Broker
from kmem.broker.security import scram
from kmem.cli import main as kmem_main
from kmem.consumer import Consumer
from kmem.consumer import sasl as client_sasl
from kmem.consumer.sasl import SaslClientSettings
from kmem.errors import ConfigError, SaslAuthenticationError
from kmem.records import build_records
from network_helpers import make_tls_contexts
from test_broker_sasl_clients import STREAM_SECONDS, assert_reauthenticated, reauth_broker

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
JAAS_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
RECORDS = 7


def start(log_dir, protocol, mechanisms=MECHANISMS, **extra):
    for mechanism in MECHANISMS[1:]:
        assert kmem_main(["scram", "--log-dir", str(log_dir),
                          "--add-scram", f"{mechanism}=[name=alice,password=alice-secret]"]) == 0
    properties = {"listeners": f"{protocol}://127.0.0.1:0", "sasl.enabled.mechanisms": ",".join(mechanisms),
                  f"listener.name.{protocol.lower()}.plain.sasl.jaas.config": PLAIN_JAAS,
                  "group.initial.rebalance.delay.ms": 0, **extra}
    return Broker(log_dir, properties=properties)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with start(tmp_path_factory.mktemp("sasl-consumer"), "SASL_PLAINTEXT") as running:
        yield running


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sasl-ssl-consumer")
    make_tls_contexts(str(directory))
    (directory / "bundle.pem").write_bytes((directory / "cert.pem").read_bytes() + (directory / "key.pem").read_bytes())
    with start(directory / "logs", "SASL_SSL", **{"ssl.keystore.location": str(directory / "bundle.pem")}) as running:
        yield running, str(directory / "cert.pem")


def produced(bootstrap, mechanism, ca=None):
    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL" if ca else "SASL_PLAINTEXT",
                         "sasl.mechanism": mechanism, "sasl.username": "alice", "sasl.password": "alice-secret",
                         **({"ssl.ca.location": ca} if ca else {})})
    for i in range(RECORDS):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    return topic


def jaas(mechanism, password):
    return f'{JAAS_MODULES[mechanism]} required username="alice" password="{password}";'


def read_all(consumer, topic):
    consumer.subscribe([topic])
    values = []
    for _ in range(300):
        values += [record.value for record in consumer.poll(100)]
        if len(values) >= RECORDS:
            break
    return values


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_consumer_reads_in_a_group_over_sasl_plaintext(broker, mechanism):
    topic = produced(broker.bootstrap_servers, mechanism)
    with Consumer.from_properties({"bootstrap.servers": broker.bootstrap_servers, "group.id": topic,
                                   "auto.offset.reset": "earliest", "security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanism": mechanism,
                                   "sasl.jaas.config": jaas(mechanism, "alice-secret")}) as consumer:
        assert sorted(read_all(consumer, topic)) == [b"%d" % i for i in range(RECORDS)]
        consumer.commit()
        [partition] = consumer.assignment()
        assert consumer.committed(partition) == RECORDS


def test_the_consumer_reads_over_sasl_ssl_with_librdkafkas_credential_names(tls_broker):
    broker, ca = tls_broker
    topic = produced(broker.bootstrap_servers, "SCRAM-SHA-512", ca)
    with Consumer.from_properties({"bootstrap.servers": broker.bootstrap_servers, "group.id": topic,
                                   "auto.offset.reset": "earliest", "security.protocol": "SASL_SSL",
                                   "ssl.truststore.location": ca, "sasl.mechanism": "SCRAM-SHA-512",
                                   "sasl.username": "alice", "sasl.password": "alice-secret"}) as consumer:
        assert sorted(read_all(consumer, topic)) == [b"%d" % i for i in range(RECORDS)]


@pytest.mark.parametrize("mechanism, message", [
    ("PLAIN", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-256", "Authentication failed during authentication due to invalid credentials with SASL mechanism "
                      "SCRAM-SHA-256")])
def test_poll_raises_the_brokers_refusal_of_a_wrong_password(broker, mechanism, message):
    with Consumer.from_properties({"bootstrap.servers": broker.bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanism": mechanism, "sasl.username": "alice",
                                   "sasl.password": "wrong"}) as consumer:
        consumer.assign([("any", 0)])
        with pytest.raises(SaslAuthenticationError) as raised:
            for _ in range(100):
                consumer.poll(100)
        assert message in str(raised.value) and "'alice'" in str(raised.value) and "wrong" not in str(raised.value)


def test_a_mechanism_the_broker_does_not_enable_names_those_it_does(tmp_path):
    with start(tmp_path, "SASL_PLAINTEXT", mechanisms=("PLAIN",)) as plain_only, \
            Consumer.from_properties({"bootstrap.servers": plain_only.bootstrap_servers,
                                      "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                                      "sasl.username": "alice", "sasl.password": "alice-secret"}) as consumer:
        consumer.assign([("any", 0)])
        with pytest.raises(SaslAuthenticationError, match="SASL mechanism SCRAM-SHA-256 is not enabled on the "
                                                          r"broker at 127\.0\.0\.1:\d+ \(it has PLAIN\)"):
            for _ in range(100):
                consumer.poll(100)


@pytest.mark.parametrize("config, message", [
    ({}, "sasl.mechanism = 'GSSAPI': kmem's clients speak PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (GSSAPI is Kafka "
         "default)"),
    ({"sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism = 'OAUTHBEARER': kmem's clients speak"),
    ({"sasl.mechanism": "PLAIN"}, "sasl.mechanism=PLAIN needs a user: set sasl.jaas.config"),
    ({"sasl.mechanism": "PLAIN", "sasl.username": "alice"}, "sasl.mechanism=PLAIN needs a user"),
    ({"sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": jaas("PLAIN", "s3cret")},
     "sasl.jaas.config has no org.apache.kafka.common.security.scram.ScramLoginModule entry"),
    ({"sasl.mechanism": "PLAIN", "sasl.jaas.config": 'PlainLoginModule required password="s3cret"'},
     "sasl.jaas.config: the JAAS login module PlainLoginModule must end with ';'"),
])
def test_sasl_settings_refused_in_one_line_without_the_password(config, message):
    with pytest.raises(ConfigError) as raised:
        Consumer.from_properties({"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_PLAINTEXT", **config})
    assert message in str(raised.value) and "s3cret" not in str(raised.value)


def test_the_scram_client_matches_rfc_7677(monkeypatch):
    """RFC 7677 section 3: user "user", password "pencil", the client's nonce as in the RFC."""
    monkeypatch.setattr(client_sasl.secrets, "token_urlsafe", lambda _: "rOprNGfwEbeRWgbNEkqO")
    exchange = SaslClientSettings("SCRAM-SHA-256", "user", "pencil").exchange()
    assert exchange.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert exchange.evaluate(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,"
                             b"i=4096") == \
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    assert exchange.evaluate(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None


@pytest.mark.parametrize("server_first, server_final, message", [
    (None, b"v=" + base64.b64encode(b"\0" * 32), "the broker's signature does not match"),
    (None, b"e=other-error", "the broker refused: other-error"),
    (b"r=someone-elses-nonce,s=AAAA,i=4096", None, "the broker's nonce does not extend the client's"),
    (b"r={nonce}x,s=AAAA,i=1024", None, "the broker asks for 1024 iterations, fewer than the minimum 4096"),
    (b"not scram", None, "is not a SCRAM server-first message"),
])
def test_the_scram_client_refuses_a_broker_that_does_not_hold_the_credential(server_first, server_final, message):
    exchange = SaslClientSettings("SCRAM-SHA-256", "alice", "alice-secret").exchange()
    server = scram.ScramServer("SCRAM-SHA-256", {"alice": scram.credential_from_password("SCRAM-SHA-256",
                                                                                        "alice-secret")}.get)
    real_first = server.evaluate(exchange.first())
    nonce = real_first.split(b",")[0][2:]
    with pytest.raises(SaslAuthenticationError, match=message):
        final = exchange.evaluate(server_first.replace(b"{nonce}", nonce) if server_first else real_first)
        server.evaluate(final)
        exchange.evaluate(server_final)


def test_the_tools_list_topics_over_sasl_and_refuse_a_wrong_password(broker, tmp_path, capsys):
    topic = produced(broker.bootstrap_servers, "PLAIN")
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                      f"sasl.jaas.config={jaas('SCRAM-SHA-512', 'alice-secret')}\n")
    assert kmem_main(["topics", "--bootstrap-server", broker.bootstrap_servers, "--command-config", str(config),
                      "--list"]) == 0
    assert topic in capsys.readouterr().out.split()
    config.write_text(config.read_text().replace("alice-secret", "wrong"))
    assert kmem_main(["topics", "--bootstrap-server", broker.bootstrap_servers, "--command-config", str(config),
                      "--list"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "wrong" not in err
    assert err.startswith("kmem topics: error: authentication as 'alice' with SCRAM-SHA-512 at ")
    assert err.rstrip().endswith("invalid credentials with SASL mechanism SCRAM-SHA-512: check the user and "
                                 "password of --command-config")


@pytest.mark.parametrize("properties, message", [
    ("security.protocol=SASL_SSL\n", "sasl.mechanism = 'GSSAPI'"),
    ("security.protocol=sasl_plaintext\n", "sasl.mechanism = 'GSSAPI'"),      # Kafka's names in any case
    ("security.protocol=KERBEROS\n", "security.protocol must be one of"),
    ("sasl.kerberos.service.name=kafka\n", "unknown client security properties: sasl.kerberos.service.name"),
    ("security.protocol=SSL\nssl.truststore.location=/nonexistent.pem\n", "cannot load the TLS files"),
])
def test_security_settings_the_tools_cannot_honour_are_refused(tmp_path, properties, message):
    config = tmp_path / "client.properties"
    config.write_text(properties)
    with pytest.raises(CommandError, match=message) as raised:
        client_config(str(config))
    assert raised.value.exit_code == 2


def test_the_consumer_re_authenticates_in_time_while_it_reads_a_stream(tmp_path):
    """KIP-368: with connections.max.reauth.ms the broker's sessions end; kmem's consumer (the broker's only
    client here: the records are appended in-process) authenticates again on the same connections before they
    do, and reads every record appended meanwhile."""
    with reauth_broker(tmp_path) as broker:
        partition = broker.logs.get_partition("stream", 0)
        with Consumer.from_properties({"bootstrap.servers": broker.bootstrap_servers, "group.id": "stream",
                                       "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100,
                                       "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                                       "sasl.jaas.config": jaas("SCRAM-SHA-512", "alice-secret")}) as consumer:
            consumer.subscribe(["stream"])
            appended, read, end = 0, [], time.monotonic() + STREAM_SECONDS
            while time.monotonic() < end:
                assert partition.append(build_records([b"%d" % appended])).error_code == 0
                appended += 1
                read += [record.value for record in consumer.poll(20)]
            deadline = time.monotonic() + 30
            while len(read) < appended and time.monotonic() < deadline:
                read += [record.value for record in consumer.poll(100)]
        assert read == [b"%d" % i for i in range(appended)]
        assert_reauthenticated(broker)
