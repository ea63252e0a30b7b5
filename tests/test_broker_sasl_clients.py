"""confluent-kafka (librdkafka), kafka-python and aiokafka over SASL_PLAINTEXT with PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512, and over SASL_SSL: each produces and consumes in a group, and each is refused a wrong password
with the error its own API reports. SCRAM users come from ``kmem scram`` and survive a restart; kcat
authenticates as a user kafka-python's admin client created (KIP-554). confluent-kafka re-authenticates
(KIP-368) while it produces and consumes."""
import asyncio
import contextlib
import logging
import shutil
import subprocess
import time
import uuid

import pytest

from broker_helpers import kafka_python_knows_partitions, wait_for
from network_helpers import make_tls_contexts
from kmem.broker import Broker
from kmem.cli import main as kmem_main

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";'
RECORDS = 5
# KIP-368: clients stream for three sessions' time, re-authenticating each busy connection twice or more; sessions
# of 2.5 s leave a client's re-authentication (at 85-95% of the session) time to finish on a loaded machine
REAUTH_MS = 2500
STREAM_SECONDS = 8


def sasl_properties(protocol):
    return {"listeners": f"{protocol}://127.0.0.1:0", "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            f"listener.name.{protocol.lower()}.plain.sasl.jaas.config": PLAIN_JAAS,
            "group.initial.rebalance.delay.ms": 0}


def add_users(log_dir):
    for mechanism in MECHANISMS[1:]:
        assert kmem_main(["scram", "--log-dir", str(log_dir),
                          "--add-scram", f"{mechanism}=[name=alice,password=alice-secret]"]) == 0


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("sasl-clients")
    add_users(log_dir)
    with Broker(log_dir, properties=sasl_properties("SASL_PLAINTEXT")) as running:
        yield running


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sasl-ssl")
    make_tls_contexts(str(directory))
    add_users(directory / "logs")
    properties = {**sasl_properties("SASL_SSL"), "ssl.keystore.location": str(directory / "bundle.pem")}
    (directory / "bundle.pem").write_bytes((directory / "cert.pem").read_bytes() + (directory / "key.pem").read_bytes())
    with Broker(directory / "logs", properties=properties) as running:
        yield running, str(directory / "cert.pem")


@contextlib.contextmanager
def reauth_broker(log_dir):
    """A SASL_PLAINTEXT broker whose sessions last ``REAUTH_MS`` (``connections.max.reauth.ms``), with a topic
    "stream"."""
    add_users(log_dir)
    properties = {**sasl_properties("SASL_PLAINTEXT"), "connections.max.reauth.ms": REAUTH_MS}
    with Broker(log_dir, properties=properties) as broker:
        broker.logs.create_topic("stream", 1)
        yield broker


def assert_reauthenticated(broker):
    """The clients' connections re-authenticated, each in time: none refused, none closed past its session."""
    counts = broker.server.metrics()
    assert counts["expired-connections-killed-count"] == 0
    assert counts["failed-reauthentication-total"] == 0
    assert counts["successful-reauthentication-total"] >= STREAM_SECONDS * 1000 // REAUTH_MS


def confluent_config(protocol, mechanism, password, ca=None):
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": "alice",
            "sasl.password": password, **({"ssl.ca.location": ca} if ca else {})}


def python_config(protocol, mechanism, password, ca=None):
    """kafka-python's and aiokafka's names (they share them)."""
    config = {"security_protocol": protocol, "sasl_mechanism": mechanism, "sasl_plain_username": "alice",
              "sasl_plain_password": password}
    if ca:
        import ssl
        config["ssl_context"] = ssl.create_default_context(cafile=ca)
    return config


def round_trip_confluent(bootstrap, topic, config):
    from confluent_kafka import Consumer, Producer
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    for i in range(RECORDS):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest", **config})
    consumer.subscribe([topic])
    seen = []
    try:
        def all_read():
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                seen.append(message.value())
            return len(seen) == RECORDS
        wait_for(all_read, "every record in the group")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen


def round_trip_kafka_python(bootstrap, topic, config):
    from kafka import KafkaConsumer, KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
    sent = [producer.send(topic, b"%d" % i) for i in range(RECORDS)]
    for future in sent:
        future.get(30)          # raises what the broker answered, if it refused
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=topic, auto_offset_reset="earliest", **config)
    kafka_python_knows_partitions(consumer, [topic])
    seen = []
    try:
        def all_read():
            for records in consumer.poll(200).values():
                seen.extend(record.value for record in records)
            return len(seen) == RECORDS
        wait_for(all_read, "every record in the group")
        consumer.commit()
    finally:
        consumer.close()
    return seen


def round_trip_aiokafka(bootstrap, topic, config):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
        await producer.start()
        try:
            for i in range(RECORDS):
                await producer.send_and_wait(topic, b"%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=topic, auto_offset_reset="earliest",
                                    **config)
        await consumer.start()
        seen = []
        try:
            async with asyncio.timeout(30):
                while len(seen) < RECORDS:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        seen.extend(record.value for record in records)
            await consumer.commit()
        finally:
            await consumer.stop()
        return seen
    return asyncio.run(run())


ROUND_TRIPS = {"confluent-kafka": (round_trip_confluent, confluent_config),
               "kafka-python": (round_trip_kafka_python, python_config),
               "aiokafka": (round_trip_aiokafka, python_config)}


def committed(broker, group):
    """The group's committed offset of partition 0 of the topic of the same name, read from the coordinator."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                         **confluent_config("SASL_PLAINTEXT", "PLAIN", "alice-secret")})
    try:
        return consumer.committed([TopicPartition(group, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_produce_and_consume_in_a_group_over_sasl_plaintext(broker, client, mechanism):
    round_trip, config = ROUND_TRIPS[client]
    topic = f"{client}-{mechanism}-{uuid.uuid4().hex[:6]}"
    seen = round_trip(broker.bootstrap_servers, topic, config("SASL_PLAINTEXT", mechanism, "alice-secret"))
    assert sorted(seen) == [b"%d" % i for i in range(RECORDS)]
    assert committed(broker, topic) == RECORDS


@pytest.mark.parametrize("client", CLIENTS)
def test_produce_and_consume_over_sasl_ssl(tls_broker, client):
    broker, ca = tls_broker
    round_trip, config = ROUND_TRIPS[client]
    topic = f"{client}-ssl-{uuid.uuid4().hex[:6]}"
    seen = round_trip(broker.bootstrap_servers, topic, config("SASL_SSL", "SCRAM-SHA-512", "alice-secret", ca))
    assert sorted(seen) == [b"%d" % i for i in range(RECORDS)]


def admin_confluent(bootstrap, topic, config):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    admin.create_topics([NewTopic(topic, 2, 1)], request_timeout=30)[topic].result(30)
    return {name: len(meta.partitions) for name, meta in admin.list_topics(timeout=30).topics.items()}


def admin_kafka_python(bootstrap, topic, config):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **config)
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])
        return {meta["name"]: len(meta["partitions"]) for meta in admin.describe_topics([topic])}
    finally:
        admin.close()


def admin_aiokafka(bootstrap, topic, config):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **config)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 2, 1)])
            return {meta["topic"]: len(meta["partitions"]) for meta in await admin.describe_topics([topic])}
        finally:
            await admin.close()
    return asyncio.run(run())


ADMINS = {"confluent-kafka": (admin_confluent, confluent_config), "kafka-python": (admin_kafka_python, python_config),
          "aiokafka": (admin_aiokafka, python_config)}


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_each_clients_admin_api_creates_and_describes_a_topic_over_sasl(broker, tls_broker, client, mechanism,
                                                                        protocol):
    admin, config = ADMINS[client]
    served, ca = (broker, None) if protocol == "SASL_PLAINTEXT" else tls_broker
    topic = f"admin-{client}-{mechanism}-{uuid.uuid4().hex[:6]}"
    assert admin(served.bootstrap_servers, topic, config(protocol, mechanism, "alice-secret", ca))[topic] == 2
    assert served.logs.partition_count(topic) == 2


@pytest.mark.parametrize("mechanism, message", [
    ("PLAIN", "Authentication failed: Invalid username or password"),
    ("SCRAM-SHA-256", "Authentication failed during authentication due to invalid credentials with SASL mechanism "
                      "SCRAM-SHA-256")])
def test_confluent_kafka_refused_a_wrong_password(broker, mechanism, message):
    from confluent_kafka import KafkaError, Producer
    errors = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "error_cb": errors.append,
                         **confluent_config("SASL_PLAINTEXT", mechanism, "wrong")})
    wait_for(lambda: producer.poll(0.1) is not None and errors, "librdkafka's error callback")
    assert errors[0].code() == KafkaError._AUTHENTICATION and message in errors[0].str()


def test_confluent_kafka_re_authenticates_while_it_produces_and_consumes_in_a_group(tmp_path):
    from confluent_kafka import Consumer, Producer
    errors, acked, read = [], set(), set()
    with reauth_broker(tmp_path) as broker:
        config = {"bootstrap.servers": broker.bootstrap_servers, "error_cb": errors.append,
                  **confluent_config("SASL_PLAINTEXT", "SCRAM-SHA-512", "alice-secret")}

        def delivered(error, message):
            if error is not None:
                errors.append(error)
            else:
                acked.add(message.value())
        producer = Producer({**config, "acks": "all"})
        consumer = Consumer({**config, "group.id": "stream", "auto.offset.reset": "earliest"})
        consumer.subscribe(["stream"])

        def read_some(timeout):
            message = consumer.poll(timeout)
            if message is not None:
                if message.error():
                    errors.append(message.error())
                else:
                    read.add(message.value())
        try:
            sent, end = 0, time.monotonic() + STREAM_SECONDS
            while time.monotonic() < end:
                producer.produce("stream", b"%d" % sent, partition=0, on_delivery=delivered)
                sent += 1
                producer.poll(0)
                read_some(0.02)
            assert producer.flush(30) == 0
            wait_for(lambda: read_some(0.1) or read >= acked, "every acknowledged record read")
            consumer.commit(asynchronous=False)
        finally:
            consumer.close()
        assert not errors
        assert len(acked) == sent and read == acked
        assert_reauthenticated(broker)


def test_kafka_python_refused_a_wrong_password(broker, caplog):
    """kafka-python is refused, and when it reads the broker's answer it reports it as its own error. The broker
    answers, then closes (as Kafka does); kafka-python 3.0 drops what it read when the same read loop meets the
    close (KafkaTCPTransport._sock_recv), so on a busy machine every try may end "socket disconnected" with the
    answer unread: the refusal is checked on the broker's side too, and the message whenever kafka-python read it."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError
    failed_before = broker.server.metrics()["failed-authentication-total"]
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, bootstrap_timeout_ms=2000,
                         **python_config("SASL_PLAINTEXT", "SCRAM-SHA-512", "wrong"))
    assert broker.server.metrics()["failed-authentication-total"] > failed_before
    if "SaslAuthenticationFailedError" in caplog.text:
        assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in caplog.text


def test_aiokafka_refused_a_wrong_password(broker, caplog):
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    async def start():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers,
                                    **python_config("SASL_PLAINTEXT", "PLAIN", "wrong"))
        try:
            await producer.start()
        finally:
            await producer.stop()
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        asyncio.run(start())
    assert "SaslAuthenticationFailed: Authentication failed: Invalid username or password" in caplog.text


def test_scram_users_added_with_the_cli_survive_a_restart(tmp_path):
    add_users(tmp_path)
    config = confluent_config("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice-secret")
    for attempt in range(2):
        with Broker(tmp_path, properties=sasl_properties("SASL_PLAINTEXT")) as broker:
            from confluent_kafka import Producer
            producer = Producer({"bootstrap.servers": broker.bootstrap_servers, **config})
            producer.produce("restarted", b"%d" % attempt)
            assert producer.flush(30) == 0
    assert "alice-secret" not in (tmp_path / "scram-credentials.json").read_text()


def test_the_cli_refuses_a_log_directory_in_use(tmp_path, capsys):
    with Broker(tmp_path, properties=sasl_properties("SASL_PLAINTEXT")):
        assert kmem_main(["scram", "--log-dir", str(tmp_path), "--add-scram",
                          "SCRAM-SHA-256=[name=bob,password=bob-secret]"]) == 2
    assert "in use by a running broker" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["SCRAM-SHA-1=[name=bob,password=bob-secret]",
                                   "SCRAM-SHA-256=[name=bob,password=bob-secret,iterations=10]",
                                   "SCRAM-SHA-256=[name=bob,pasword=bob-secret]"])
def test_the_cli_refuses_a_bad_credential_in_one_line_without_the_password(tmp_path, capsys, value):
    assert kmem_main(["scram", "--log-dir", str(tmp_path / "logs"), "--add-scram", value]) == 2
    error = capsys.readouterr().err
    assert error.startswith("kmem scram: ") and error.count("\n") == 1 and "bob-secret" not in error
    assert not (tmp_path / "logs").exists()


def test_kmem_broker_from_a_kafka_server_properties_logs_the_principal_never_a_password(tmp_path):
    from confluent_kafka import Producer
    from broker_helpers import start_broker_process
    config = tmp_path / "server.properties"
    config.write_text("listeners=SASL_PLAINTEXT://127.0.0.1:9092\n"
                      "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256\n"
                      "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                      "org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
                      "    user_alice=\"alice-secret\";\n")
    add_users(tmp_path / "logs")
    process, bootstrap = start_broker_process(tmp_path / "logs", "--config", str(config), port=0)
    try:
        for mechanism, password in (("PLAIN", "alice-secret"), ("SCRAM-SHA-256", "alice-secret"),
                                    ("PLAIN", "wrong-secret")):
            errors = []
            producer = Producer({"bootstrap.servers": bootstrap, "error_cb": errors.append,
                                 **confluent_config("SASL_PLAINTEXT", mechanism, password)})
            producer.produce("logged", b"x")
            wait_for(lambda: producer.flush(0.1) == 0 or errors, "the record or an error")
            assert bool(errors) == (password == "wrong-secret")
        wait_for(lambda: "SASL authentication failed" in "".join(process.log_lines), "the failure's log line")
    finally:
        process.terminate()
        process.wait(30)
    log = "".join(process.log_lines)
    assert "authenticated as User:alice (PLAIN)" in log and "authenticated as User:alice (SCRAM-SHA-256)" in log
    assert "alice-secret" not in log and "wrong-secret" not in log


def kcat(bootstrap, password, *args, stdin=None):
    """kcat (librdkafka's command line tool) as user kate with SCRAM-SHA-256."""
    return subprocess.run(["kcat", "-b", bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                           "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=kate",
                           "-X", f"sasl.password={password}", *args],
                          input=stdin, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="no kcat")
def test_kcat_as_a_user_kafka_pythons_admin_client_created(broker):
    """kafka-python's KafkaAdminClient creates the user (AlterUserScramCredentials, KIP-554); kcat produces and
    consumes in a group as that user, and is refused a wrong password with librdkafka's message."""
    from kafka import KafkaAdminClient
    from kafka.admin import UserScramCredentialUpsertion
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers,
                             **python_config("SASL_PLAINTEXT", "SCRAM-SHA-512", "alice-secret"))
    try:
        assert admin.alter_user_scram_credentials([UserScramCredentialUpsertion("kate", "SCRAM-SHA-256",
                                                                                "kate-secret")]) == {"kate": None}
    finally:
        admin.close()
    topic = f"kcat-{uuid.uuid4().hex[:6]}"
    produced = kcat(broker.bootstrap_servers, "kate-secret", "-P", "-t", topic, stdin="".join(
        f"{i}\n" for i in range(RECORDS)))
    assert produced.returncode == 0, produced.stderr
    consumed = kcat(broker.bootstrap_servers, "kate-secret", "-G", topic, "-X", "auto.offset.reset=earliest",
                    "-c", str(RECORDS), "-e", topic)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == [str(i) for i in range(RECORDS)]
    refused = kcat(broker.bootstrap_servers, "wrong", "-L")
    assert refused.returncode != 0
    assert ("Authentication failed during authentication due to invalid credentials with SASL mechanism "
            "SCRAM-SHA-256") in refused.stderr
