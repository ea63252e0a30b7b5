"""kmem broker's SASL against Apache's Java clients (kafka-clients 3.9.1, see tests/test_broker_java_client.py):
the AdminClient creates and describes SCRAM users (KIP-554), then a producer, a consumer in a group and the
AdminClient authenticate as them over SASL_PLAINTEXT and SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512,
are refused a wrong password with SaslAuthenticationException, and the users still work after a restart.

The probe's clients take their settings from a client properties file (``@FILE`` for BOOTSTRAP), written here as
a production client configuration is."""
import pathlib
import re

import pytest

from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, start_probe, wheel_jar
from network_helpers import make_tls_contexts
from kmem.broker import Broker
from kmem.pytest_plugin import start_sasl_broker

RUNTIME_JARS = ("lz4-java.jar", "snappy-java.jar", "zstd-jni.jar", "slf4j-api.jar")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                 "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                 "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
ADMIN_JAAS = f'{LOGIN_MODULES["PLAIN"]} required user_admin="admin-secret";'
RECORDS = 5


def sasl_properties(protocol):
    return {"listeners": f"{protocol}://127.0.0.1:0", "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            f"listener.name.{protocol.lower()}.plain.sasl.jaas.config": ADMIN_JAAS,
            "group.initial.rebalance.delay.ms": 0, "num.partitions": 1}


def client_file(directory, broker, mechanism, user, password, truststore=None):
    """A Java client's properties file for ``broker`` as ``user``; its path as the probe's ``@FILE``."""
    protocol = "SASL_SSL" if truststore else "SASL_PLAINTEXT"
    settings = {"bootstrap.servers": broker.bootstrap_servers, "security.protocol": protocol,
                "sasl.mechanism": mechanism,
                "sasl.jaas.config": f'{LOGIN_MODULES[mechanism]} required username="{user}" password="{password}";'}
    if truststore:
        settings.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": truststore})
    path = directory / f"{protocol}-{mechanism}-{user}-{password}.properties"
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    return f"@{path}"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), *map(wheel_jar, RUNTIME_JARS)]
    running = start_probe(tmp_path_factory.mktemp("java-sasl-probe"), "KafkaClientProbe.java", classpath)
    yield running
    running.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """``(the PEM keystore of a SASL_SSL listener, the PEM truststore of its certificate)``."""
    directory = tmp_path_factory.mktemp("java-sasl-tls")
    make_tls_contexts(str(directory))
    keystore = directory / "keystore.pem"
    keystore.write_bytes((directory / "cert.pem").read_bytes() + (directory / "key.pem").read_bytes())
    return str(keystore), str(directory / "cert.pem")


def round_trip(probe, bootstrap, topic):
    assert probe("produce", bootstrap, topic, "none", RECORDS) == {"offsets": list(range(RECORDS))}
    assert probe("group-read", bootstrap, topic, f"group-{topic}", RECORDS) == {
        "values": [f"none-{i}" for i in range(RECORDS)]}
    assert topic in probe("list-topics", bootstrap)["topics"]


def refused(probe, bootstrap):
    for answer in (probe("list-topics", bootstrap), probe("produce", bootstrap, "refused", "none", 1)):
        assert answer["error"] == "SaslAuthenticationException", answer


def test_the_admin_client_creates_scram_users_who_then_produce_consume_and_survive_a_restart(
        probe, tmp_path, tls):
    keystore, truststore = tls
    tls_properties = {**sasl_properties("SASL_SSL"), "ssl.keystore.location": keystore}
    with Broker(tmp_path / "logs", properties=sasl_properties("SASL_PLAINTEXT")) as broker:
        admin = client_file(tmp_path, broker, "PLAIN", "admin", "admin-secret")
        assert probe("scram-describe", admin, "carol")["carol"]["error"] == "ResourceNotFoundException"
        assert probe("scram-upsert", admin, "carol", "SCRAM-SHA-256", 8192, "carol-256") == {}
        assert probe("scram-upsert", admin, "carol", "SCRAM-SHA-512", 4096, "carol-512") == {}
        too_few = probe("scram-upsert", admin, "dave", "SCRAM-SHA-256", 1000, "dave-secret")
        assert too_few["error"] == "UnacceptableCredentialException"
        assert probe("scram-describe", admin, "carol") == {
            "carol": [["SCRAM-SHA-256", 8192], ["SCRAM-SHA-512", 4096]]}
        users = {"PLAIN": ("admin", "admin-secret"), "SCRAM-SHA-256": ("carol", "carol-256"),
                 "SCRAM-SHA-512": ("carol", "carol-512")}
        for mechanism, (user, password) in users.items():
            round_trip(probe, client_file(tmp_path, broker, mechanism, user, password), f"plaintext-{mechanism}")
            refused(probe, client_file(tmp_path, broker, mechanism, user, "wrong"))
    with Broker(tmp_path / "logs", properties=tls_properties) as broker:      # restarted, on a SASL_SSL listener
        for mechanism, (user, password) in users.items():
            round_trip(probe, client_file(tmp_path, broker, mechanism, user, password, truststore),
                       f"ssl-{mechanism}")
            refused(probe, client_file(tmp_path, broker, mechanism, user, "wrong", truststore))
        assert probe("scram-describe", client_file(tmp_path, broker, "SCRAM-SHA-512", "carol", "carol-512",
                                                   truststore), "carol")["carol"][1] == ["SCRAM-SHA-512", 4096]


def documented_java_configurations():
    """The ```properties blocks of docs/security.md: the Java client's settings per mechanism."""
    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    return [dict(line.split("=", 1) for line in block.strip().splitlines())
            for block in re.findall(r"^```properties\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)]


def test_the_documented_java_client_configurations_run(probe, tmp_path, tls):
    """Each block, as written but for the broker's address and the truststore's path, produces, consumes in a
    group and lists topics, against a broker from the pytest plugin's start_sasl_broker."""
    keystore, truststore = tls
    configurations = documented_java_configurations()
    assert {(c["security.protocol"], c["sasl.mechanism"]) for c in configurations} == {
        ("SASL_PLAINTEXT", "PLAIN"), ("SASL_PLAINTEXT", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512")}
    for number, configuration in enumerate(configurations):
        ssl = configuration["security.protocol"] == "SASL_SSL"
        broker = start_sasl_broker(tmp_path / f"logs-{number}", {"alice": "alice-secret"},
                                   keystore=keystore if ssl else None)
        try:
            settings = {**configuration, "bootstrap.servers": broker.bootstrap_servers,
                        **({"ssl.truststore.location": truststore} if ssl else {})}
            path = tmp_path / f"client-{number}.properties"
            path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
            round_trip(probe, f"@{path}", f"documented-{number}")
        finally:
            broker.close()
