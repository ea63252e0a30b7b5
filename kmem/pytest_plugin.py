"""kmem as a pytest plugin: a real Kafka broker for tests, without a JVM or Docker.

Installed with kmem (the ``pytest11`` entry point ``kmem``), so any test of the environment can ask for:

- ``kafka_broker``: a running ``kmem.broker.Broker``; ``kafka_broker.bootstrap_servers`` is its
  ``"127.0.0.1:PORT"`` (with several ``listeners``, each on a free port: the first one's, and
  ``bootstrap_servers_of(name)`` another's). Tests share one broker per session (``kafka_broker_session``, started on first
  use on a free port with a temporary log directory, stopped when the session ends); a test marked
  ``@pytest.mark.kafka_broker(**settings)`` gets a broker of its own with those settings instead.
- ``kafka_topic``: a topic created for the test alone, named after it, with the broker's
  ``num.partitions``; ``kafka_topic_factory(partitions=None, configs=None)`` creates more.
- ``kafka_sasl_broker_factory``: ``make(users, mechanisms=..., keystore=None, properties=None, **keywords)``
  starts a broker of the test's own with a SASL listener (SASL_PLAINTEXT, or SASL_SSL with a PEM ``keystore``)
  and ``users`` (``{name: password}``) for each of ``mechanisms`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), so a
  test runs its production client configuration; stopped after the test.

Settings take Kafka's names: the ini option ``kafka_broker_settings`` (one ``name=value`` a line) for
every broker, a marker's keywords (snake_case) or dict (dotted names) on top for its test.
``TEST_DEFAULTS`` apply first: consumer groups start at once (Kafka's test harness does the same) and
``__consumer_offsets`` has one partition, so a group's first request does not create fifty.

Importing this module imports only pytest: loaded into every pytest run of the environment, it starts
nothing and imports nothing more (``kmem.broker`` included) until a test asks for a fixture.
"""
import itertools
import os
import re

import pytest

TEST_DEFAULTS = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 1}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
MARKER = "kafka_broker"
SETTINGS_INI = "kafka_broker_settings"
_topic_numbers = itertools.count()


def pytest_addoption(parser):
    parser.addini(SETTINGS_INI, type="linelist", default=[],
                  help="settings of the kafka_broker fixture's broker (kmem): one name=value a line, Kafka's names")


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARKER}(settings=None, **keywords): the test gets a kmem broker of its "
                                       "own with these settings (Kafka's names: a dict of dotted names, or "
                                       "snake_case keywords)")


def _ini_settings(config):
    settings = {}
    for line in config.getini(SETTINGS_INI):
        name, sep, value = line.partition("=")
        if not sep:
            raise pytest.UsageError(f"{SETTINGS_INI}: expected name=value, not {line!r}")
        settings[name.strip()] = value.strip()
    return settings


def start_broker(log_dir, properties=None, **keywords):
    """A started ``Broker`` on ``log_dir`` and a free port of 127.0.0.1, with ``TEST_DEFAULTS`` under
    ``properties`` (dotted names) and ``keywords`` (snake_case): what the fixtures run. Close it."""
    from kmem.broker import Broker

    return Broker(log_dir, 0, properties={**TEST_DEFAULTS, **(properties or {})}, **keywords).start()


def _jaas_quoted(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def start_sasl_broker(log_dir, users, mechanisms=SASL_MECHANISMS, *, keystore=None, properties=None, **keywords):
    """A started ``Broker`` (as ``start_broker``) whose listener is SASL_PLAINTEXT, or SASL_SSL with ``keystore`` (a
    PEM file: the certificate chain and the private key), serving ``mechanisms``; each of ``users``
    (``{name: password}``) is a PLAIN user (``sasl.jaas.config``) and has a SCRAM credential (in the log directory)
    for each SCRAM mechanism. ``properties`` (dotted names) go on top. Close it."""
    from kmem.broker.security import SCRAM_MECHANISMS, ScramCredentialStore, credential_from_password

    protocol = "SASL_SSL" if keystore else "SASL_PLAINTEXT"
    settings = {"listeners": f"{protocol}://127.0.0.1:0", "sasl.enabled.mechanisms": ",".join(mechanisms)}
    if "PLAIN" in mechanisms:
        entries = " ".join(f"user_{name}={_jaas_quoted(password)}" for name, password in users.items())
        settings[f"listener.name.{protocol.lower()}.plain.sasl.jaas.config"] = \
            f"{PLAIN_LOGIN_MODULE} required {entries};"
    if keystore:
        settings["ssl.keystore.location"] = os.fspath(keystore)
    scram = [(mechanism, name, credential_from_password(mechanism, password))
             for mechanism in mechanisms if mechanism in SCRAM_MECHANISMS for name, password in users.items()]
    if scram:
        ScramCredentialStore(log_dir).alter(upsertions=scram)
    return start_broker(log_dir, {**settings, **(properties or {})}, **keywords)


@pytest.fixture(scope="session")
def kafka_broker_session(tmp_path_factory, pytestconfig):
    """The broker the tests of a session share (see the module docstring), for fixtures of any scope."""
    broker = start_broker(tmp_path_factory.mktemp("kafka-broker"), _ini_settings(pytestconfig))
    yield broker
    broker.close()


@pytest.fixture
def kafka_broker(request):
    """A running broker for the test: the session's, or its own when the test is marked ``kafka_broker``."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return request.getfixturevalue("kafka_broker_session")
    properties = dict(_ini_settings(request.config))
    for settings in marker.args:
        properties.update(settings)
    broker = start_broker(request.getfixturevalue("tmp_path") / "kafka-broker", properties, **marker.kwargs)
    request.addfinalizer(broker.close)
    return broker


@pytest.fixture
def kafka_sasl_broker_factory(request, tmp_path_factory):
    """``make(users, mechanisms=SASL_MECHANISMS, keystore=None, properties=None, **keywords)``: a running broker of
    the test's own with a SASL listener and ``users`` (``{name: password}``), see ``start_sasl_broker``; the ini
    settings apply under ``properties``. Stopped after the test."""
    def make(users, mechanisms=SASL_MECHANISMS, *, keystore=None, properties=None, **keywords):
        properties = {**_ini_settings(request.config), **(properties or {})}
        broker = start_sasl_broker(tmp_path_factory.mktemp("kafka-sasl-broker"), users, mechanisms,
                                   keystore=keystore, properties=properties, **keywords)
        request.addfinalizer(broker.close)
        return broker
    return make


@pytest.fixture
def kafka_topic_factory(kafka_broker, request):
    """``make(partitions=None, configs=None)``: creates a new topic on ``kafka_broker`` and returns its
    name (the test's name and a number); ``configs`` are topic settings (``{"retention.ms": "1000"}``)."""
    stem = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:200] or "topic"

    def make(partitions=None, configs=None):
        name = f"{stem}-{next(_topic_numbers)}"
        kafka_broker.logs.create_topic(name, partitions, configs)
        return name
    return make


@pytest.fixture
def kafka_topic(kafka_topic_factory):
    """The name of a topic created for this test alone, with the broker's ``num.partitions``."""
    return kafka_topic_factory()
