"""The pytest plugin (``kmem.pytest_plugin``) as a project using it runs it: pytest in a child process on
test files written here, with the three Python clients, its ini option and its marker; and what loading
it costs a pytest run that does not use it."""
import json
import os
import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent

CLIENT_TESTS = '''
import asyncio
import json
import os

import pytest


def record(**facts):
    with open(os.environ["FACTS"], "a") as file:
        file.write(json.dumps(facts) + "\\n")


def test_kafka_python(kafka_broker, kafka_topic):
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    producer.send(kafka_topic, b"from kafka-python").get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(kafka_topic, bootstrap_servers=kafka_broker.bootstrap_servers,
                             auto_offset_reset="earliest", consumer_timeout_ms=10000)
    assert [r.value for r in consumer] == [b"from kafka-python"]
    consumer.close()
    record(test="kafka-python", bootstrap=kafka_broker.bootstrap_servers, topic=kafka_topic,
           partitions=kafka_broker.logs.topics()[kafka_topic].partitions)


def test_aiokafka(kafka_broker, kafka_topic):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def round_trip():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
        await producer.start()
        await producer.send_and_wait(kafka_topic, b"from aiokafka")
        await producer.stop()
        consumer = AIOKafkaConsumer(kafka_topic, bootstrap_servers=kafka_broker.bootstrap_servers,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), 30)
        finally:
            await consumer.stop()
        return message.value
    assert asyncio.run(round_trip()) == b"from aiokafka"
    record(test="aiokafka", bootstrap=kafka_broker.bootstrap_servers, topic=kafka_topic)


def test_confluent_kafka_in_a_group(kafka_broker, kafka_topic):
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    producer.produce(kafka_topic, b"from confluent-kafka")
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": "g",
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe([kafka_topic])
    message = None
    for _ in range(60):
        message = consumer.poll(1)
        if message is not None:
            break
    consumer.close()
    assert message is not None and message.error() is None and message.value() == b"from confluent-kafka"
    record(test="confluent-kafka", bootstrap=kafka_broker.bootstrap_servers, topic=kafka_topic)


@pytest.mark.kafka_broker(num_partitions=3)
def test_a_marked_test_gets_its_own_broker(kafka_broker, kafka_topic_factory):
    topic = kafka_topic_factory(configs={"retention.ms": "60000"})
    record(test="marked", bootstrap=kafka_broker.bootstrap_servers, log_dir=kafka_broker.log_dir,
           partitions=kafka_broker.settings.storage.num_partitions,
           segment_bytes=kafka_broker.settings.storage.log_segment_bytes,
           topic_partitions=kafka_broker.logs.topics()[topic].partitions)


@pytest.mark.kafka_broker({"listeners": "PLAINTEXT://127.0.0.1:9092,LOCAL://127.0.0.1:9093",
                           "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,LOCAL:PLAINTEXT"})
def test_a_marked_broker_with_two_listeners(kafka_broker):
    record(test="two listeners", bootstrap=kafka_broker.bootstrap_servers,
           local=kafka_broker.bootstrap_servers_of("LOCAL"))
'''


def plugin_args(pytestconfig):
    """Loaded by its entry point when kmem is installed; a source tree on PYTHONPATH names it."""
    return [] if pytestconfig.pluginmanager.has_plugin("kmem") else ["-p", "kmem.pytest_plugin"]


def run_pytest(pytestconfig, tmp_path, test_source, ini="", env=None):
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + ini)
    (tmp_path / "test_project.py").write_text(test_source)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args(pytestconfig),
                           "--basetemp", str(tmp_path / "base"), "test_project.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, PYTHONSAFEPATH="1", **(env or {})))


def test_the_three_clients_share_one_broker_and_a_marked_test_gets_its_own(pytestconfig, tmp_path):
    facts = tmp_path / "facts.jsonl"
    result = run_pytest(pytestconfig, tmp_path, CLIENT_TESTS,
                        ini="kafka_broker_settings =\n    num.partitions=2\n    log.segment.bytes=1048576\n",
                        env={"FACTS": str(facts)})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "5 passed" in result.stdout
    seen = {fact["test"]: fact for fact in map(json.loads, facts.read_text().splitlines())}
    shared = {seen[name]["bootstrap"] for name in ("kafka-python", "aiokafka", "confluent-kafka")}
    assert len(shared) == 1 and shared.pop().startswith("127.0.0.1:")
    assert seen["kafka-python"]["partitions"] == 2              # the ini option's num.partitions
    assert len({seen[name]["topic"] for name in ("kafka-python", "aiokafka", "confluent-kafka")}) == 3
    assert seen["kafka-python"]["topic"].startswith("test_kafka_python-")
    marked = seen["marked"]
    assert marked["bootstrap"] != seen["aiokafka"]["bootstrap"]
    assert (marked["partitions"], marked["segment_bytes"]) == (3, 1 << 20)     # the marker's over the ini's
    assert marked["topic_partitions"] == 3
    # several listeners in a marker: each on a free port, the first one's address is bootstrap_servers
    two = seen["two listeners"]
    assert two["bootstrap"] != two["local"] and all(two[key].startswith("127.0.0.1:") for key in ("bootstrap", "local"))
    assert not {two["bootstrap"], two["local"]} & {"127.0.0.1:9092", "127.0.0.1:9093"}
    # each broker stopped cleanly: the marked one after its test, the shared one at the session's end
    shutdown_markers = sorted((tmp_path / "base").rglob(".kafka_cleanshutdown"))
    assert len(shutdown_markers) == 3 and pathlib.Path(marked["log_dir"]) / ".kafka_cleanshutdown" in shutdown_markers


def test_a_session_that_asks_for_no_broker_starts_none_and_imports_no_broker(pytestconfig, tmp_path):
    result = run_pytest(pytestconfig, tmp_path, '''
import sys
import threading


def test_nothing_of_the_broker_is_there():
    assert "kmem.pytest_plugin" in sys.modules
    assert [name for name in sys.modules if name.startswith("kmem.")] == ["kmem._core", "kmem.pytest_plugin"]
    assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("kmem")]
''')
    assert result.returncode == 0, result.stdout[-4000:]
    assert not (tmp_path / "base").exists() or not list((tmp_path / "base").rglob("meta.properties"))


def test_a_bad_ini_line_is_a_usage_error(pytestconfig, tmp_path):
    result = run_pytest(pytestconfig, tmp_path, "def test_it(kafka_broker):\n    pass\n",
                        ini="kafka_broker_settings = num.partitions\n")
    assert result.returncode != 0
    assert "kafka_broker_settings: expected name=value, not 'num.partitions'" in result.stdout + result.stderr


def test_importing_the_plugin_imports_only_pytest_and_kmems_core():
    script = ("import sys; before = set(sys.modules); import kmem.pytest_plugin; "
              "print(sorted(m for m in set(sys.modules) - before if not m.startswith(('_pytest', 'pytest', 'pluggy', "
              "'iniconfig', 'packaging', 'py', 'exceptiongroup', 'tomli'))))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONSAFEPATH="1"))
    assert result.returncode == 0, result.stderr
    new = eval(result.stdout)
    assert {"kmem", "kmem._core", "kmem.pytest_plugin"} <= set(new)
    assert not [name for name in new if name.startswith("kmem.") and name not in ("kmem._core", "kmem.pytest_plugin")]
    assert not [name for name in new if name.split(".")[0] in ("numpy", "kafka", "pyspark", "cramjam", "asyncio")]


def test_the_package_declares_the_plugin_as_a_pytest11_entry_point():
    from importlib.metadata import PackageNotFoundError, distribution

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"kmem": "kmem.pytest_plugin"}
    try:
        installed = distribution("kmem")
    except PackageNotFoundError:
        return
    built = json.loads(installed.read_text("direct_url.json") or "{}").get("archive_info") is not None
    if built:           # installed from a wheel (make test): pytest loads the plugin by its entry point
        assert [ep.value for ep in installed.entry_points if ep.group == "pytest11"] == ["kmem.pytest_plugin"]


SASL_TESTS = '''
import pytest
from confluent_kafka import KafkaError, Producer

USERS = {"alice": 'alice "quoted" \\\\ secret', "bob": "bob-secret"}


def produce(broker, config):
    """The errors librdkafka reports, once the record is delivered or an error came."""
    errors = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "error_cb": errors.append,
                         "message.timeout.ms": 10000, **config})
    producer.produce("sasl", b"x")
    while producer.flush(0.1) and not errors:
        pass
    return errors


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_production_client_configuration(kafka_sasl_broker_factory, mechanism):
    broker = kafka_sasl_broker_factory(USERS)
    config = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism}
    for user, password in USERS.items():
        assert produce(broker, {**config, "sasl.username": user, "sasl.password": password}) == []
    errors = produce(broker, {**config, "sasl.username": "alice", "sasl.password": "wrong"})
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION


def test_only_the_mechanisms_asked(kafka_sasl_broker_factory):
    broker = kafka_sasl_broker_factory({"carol": "carol-secret"}, ["SCRAM-SHA-512"])
    assert broker.settings.listeners[0].sasl.enabled_mechanisms == ("SCRAM-SHA-512",)
    assert broker.scram_credentials.describe("carol") == [("SCRAM-SHA-512", 4096)]
'''


def test_the_sasl_broker_factory_serves_its_users_to_a_production_client_configuration(pytestconfig, tmp_path):
    result = run_pytest(pytestconfig, tmp_path, SASL_TESTS)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "4 passed" in result.stdout
    assert len(sorted((tmp_path / "base").rglob(".kafka_cleanshutdown"))) == 4     # each stopped after its test


def test_start_sasl_broker_serves_sasl_ssl_with_a_keystore(tmp_path):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from network_helpers import make_tls_contexts
    from kmem.pytest_plugin import start_sasl_broker
    _, client_context = make_tls_contexts(str(tmp_path))
    keystore = tmp_path / "keystore.pem"
    keystore.write_bytes((tmp_path / "cert.pem").read_bytes() + (tmp_path / "key.pem").read_bytes())
    broker = start_sasl_broker(tmp_path / "logs", {"alice": "alice-secret"}, keystore=keystore)
    try:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_SSL",
                                 ssl_context=client_context, sasl_mechanism="SCRAM-SHA-256",
                                 sasl_plain_username="alice", sasl_plain_password="alice-secret")
        admin.create_topics([NewTopic("secured", 1, 1)])
        admin.close()
        assert "secured" in broker.logs.topics()
    finally:
        broker.close()
