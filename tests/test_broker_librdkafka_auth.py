"""librdkafka's own authorization tests (its test suite's 0115-producer_auth and 0119-consumer_auth), their
scenarios run with confluent-kafka against kmem broker configured as librdkafka's test cluster is: an authorizer
that allows everyone where no ACL is found, plaintext clients (``User:ANONYMOUS``), ACLs added as
``kafka-acls.sh`` adds them (CreateAcls) once the topic exists."""
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                   ResourcePatternType, ResourceType)
import pytest

from kmem.broker import Broker
from test_broker_acls import AUTHORIZER

PARTITIONS = 3


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    with Broker(str(tmp_path_factory.mktemp("broker")), properties={
            "authorizer.class.name": AUTHORIZER, "allow.everyone.if.no.acl.found": "true",
            "group.initial.rebalance.delay.ms": 0}) as broker:
        yield broker.bootstrap_servers


def topic_acl(topic, operation, permission):
    """``kafka-acls.sh --add --<permission>-principal 'User:*' --operation <operation> --<permission>-host '*'
    --topic <topic>``."""
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:*", "*", operation, permission)


def create_topic(admin, topic):
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


def add_acls(admin, *acls):
    for future in admin.create_acls(list(acls)).values():
        future.result(30)


@pytest.mark.parametrize("topic_known", [True, False])
def test_0115_producer_auth(bootstrap, topic_known):
    """Produce to a topic every user is denied: each message in flight fails with TOPIC_AUTHORIZATION_FAILED in its
    delivery report, and produce() after that fails at once with the same error."""
    topic = f"0115-unauthorized-{topic_known}"
    reports = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 20_000})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topic(admin, topic)
    expected = KafkaError.NO_ERROR
    if topic_known:     # a first message, so the producer knows the topic's metadata
        producer.produce(topic, b"0", on_delivery=lambda err, msg: reports.append((expected, err)))
        producer.flush(30)
    add_acls(admin, topic_acl(topic, AclOperation.ALL, AclPermissionType.DENY))
    expected = KafkaError.TOPIC_AUTHORIZATION_FAILED
    producer.produce(topic, b"1", on_delivery=lambda err, msg: reports.append((expected, err)))
    producer.produce(topic, b"2", partition=0, on_delivery=lambda err, msg: reports.append((expected, err)))
    assert producer.flush(30) == 0
    assert len(reports) == (3 if topic_known else 2)
    assert all((err.code() if err else KafkaError.NO_ERROR) == wanted for wanted, err in reports), reports
    for partition in (-1, 0):
        with pytest.raises(KafkaException) as refused:
            producer.produce(topic, b"3", partition=partition)
        assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert producer.flush(30) == 0


def test_0119_consumer_auth(bootstrap):
    """A consumer allowed to describe the topic but denied reading it sees exactly one TOPIC_AUTHORIZATION_FAILED
    per partition over 15 s, and no message."""
    topic = "0119-unauthorized-fetch"
    admin, producer = AdminClient({"bootstrap.servers": bootstrap}), Producer({"bootstrap.servers": bootstrap})
    create_topic(admin, topic)
    for i in range(1000):
        producer.produce(topic, b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    add_acls(admin, topic_acl(topic, AclOperation.DESCRIBE, AclPermissionType.ALLOW),
             topic_acl(topic, AclOperation.READ, AclPermissionType.DENY))
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
                              "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    errors = []
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is not None, f"did not expect a message: {message.value()}"
            assert message.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, message.error()
            errors.append(message.partition())
            assert len(errors) <= PARTITIONS, errors
    finally:
        consumer.close()
    assert sorted(errors) == list(range(PARTITIONS))
