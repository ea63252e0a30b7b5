"""Real clients (confluent-kafka, kafka-python, aiokafka, Apache's Java clients) against a broker with ACLs, over
SASL_PLAINTEXT with PLAIN: alice produces to the ``orders-`` topics (and transactionally as ``orders-tx``), bob
consumes ``orders-eu`` in group ``billing``, admin is a super user who manages the ACLs with kafka-python's and
the Java AdminClient. Each client sees what Kafka would show it: allowed work succeeds, each denied action fails
with its API's error, and Metadata lists bob only the topics he may describe. The ACLs survive a SIGKILL of
``kmem broker``. The Java test (tests/java/AclProbe.java) is skipped without a JDK or the jars' wheel."""
import signal
import uuid

import pytest

from broker_helpers import kafka_python_knows_partitions, start_broker_process, wait_for
from kmem.broker import Broker

USERS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required " + \
    " ".join(f'user_{name}="{password}"' for name, password in USERS.items()) + ";"
PROPERTIES = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
              "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS, "group.initial.rebalance.delay.ms": 0,
              "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
              "super.users": "User:admin"}


def python_config(user):
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": user,
            "sasl_plain_password": USERS[user]}


def confluent_config(bootstrap, user, **extra):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user], **extra}


def role_bindings():
    from kafka.admin import ACL, ACLOperation, ACLPermissionType, ResourcePattern, ResourceType
    from kafka.admin import ACLResourcePatternType as Pattern

    def allow(user, operation, resource_type, name, pattern=Pattern.LITERAL):
        return ACL(f"User:{user}", "*", operation, ACLPermissionType.ALLOW,
                   ResourcePattern(resource_type, name, pattern))
    return [allow("alice", ACLOperation.WRITE, ResourceType.TOPIC, "orders-", Pattern.PREFIXED),
            allow("alice", ACLOperation.WRITE, ResourceType.TRANSACTIONAL_ID, "orders-tx"),
            allow("bob", ACLOperation.READ, ResourceType.TOPIC, "orders-eu"),
            allow("bob", ACLOperation.READ, ResourceType.GROUP, "billing")]


def admin_client(bootstrap):
    from kafka import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=bootstrap, **python_config("admin"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from kafka.admin import NewTopic
    with Broker(tmp_path_factory.mktemp("acl-clients"), properties=PROPERTIES) as running:
        admin = admin_client(running.bootstrap_servers)
        try:
            result = admin.create_acls(role_bindings())
            assert result["failed"] == [] and len(result["succeeded"]) == 4
            admin.create_topics([NewTopic(name, 1, 1) for name in ("orders-eu", "orders-us", "secret")])
        finally:
            admin.close()
        yield running


def test_kafka_python_admin_lists_and_deletes_acls(broker):
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ResourcePatternFilter, ResourceType
    from kafka.admin import ACLResourcePatternType as Pattern
    admin = admin_client(broker.bootstrap_servers)
    try:
        everything = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                               ResourcePatternFilter(ResourceType.ANY, None, Pattern.ANY))
        listed, error = admin.describe_acls(everything)
        assert error.errno == 0
        assert {(a.principal, a.resource_pattern.resource_name) for a in listed} >= {
            ("User:alice", "orders-"), ("User:alice", "orders-tx"), ("User:bob", "orders-eu"), ("User:bob", "billing")}
        extra = ACLFilter("User:carol", "*", ACLOperation.ANY, ACLPermissionType.ANY,
                          ResourcePatternFilter(ResourceType.ANY, None, Pattern.ANY))
        from kafka.admin import ACL, ResourcePattern
        assert admin.create_acls([ACL("User:carol", "*", ACLOperation.READ, ACLPermissionType.DENY,
                                      ResourcePattern(ResourceType.TOPIC, "*", Pattern.LITERAL))])["failed"] == []
        [(_, deleted, error)] = admin.delete_acls([extra])
        assert error.errno == 0 and [(a.principal, a.permission_type) for a in deleted] == \
            [("User:carol", ACLPermissionType.DENY)]
    finally:
        admin.close()


def test_kafka_python_clients_see_what_kafka_would(broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import (GroupAuthorizationFailedError, TopicAuthorizationFailedError,
                              TransactionalIdAuthorizationFailedError)
    bootstrap = broker.bootstrap_servers
    producer = KafkaProducer(bootstrap_servers=bootstrap, **python_config("alice"))
    try:
        producer.send("orders-eu", b"from alice").get(timeout=30)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("secret", b"no").get(timeout=30)
    finally:
        producer.close()
    transactional = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="orders-tx", **python_config("bob"))
    try:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            transactional.init_transactions()
    finally:
        transactional.close(timeout=5)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="billing", auto_offset_reset="earliest",
                             **python_config("bob"))
    try:
        assert consumer.topics() == {"orders-eu"}
        consumer.subscribe(["orders-eu"])
        kafka_python_knows_partitions(consumer, ["orders-eu"])
        seen = []
        wait_for(lambda: seen.extend(r.value for rs in consumer.poll(200).values() for r in rs) or seen,
                 "bob's records")
        assert b"from alice" in seen
        consumer.commit()
    finally:
        consumer.close()
    outsider = KafkaConsumer("orders-eu", bootstrap_servers=bootstrap, group_id="other", **python_config("bob"))
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            for _ in range(100):
                outsider.poll(200)
    finally:
        outsider.close()


def test_confluent_kafka_clients_see_what_kafka_would(broker):
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
    bootstrap = broker.bootstrap_servers
    reports = []
    producer = Producer(confluent_config(bootstrap, "alice"))
    producer.produce("orders-us", b"from alice", on_delivery=lambda error, message: reports.append(error))
    producer.produce("secret", b"no", on_delivery=lambda error, message: reports.append(error))
    assert producer.flush(30) == 0
    assert sorted((e.code() if e else 0) for e in reports) == [0, KafkaError.TOPIC_AUTHORIZATION_FAILED]

    transactional = Producer(confluent_config(bootstrap, "alice", **{"transactional.id": "orders-tx"}))
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce("orders-eu", b"in a transaction")
    transactional.commit_transaction(30)
    intruder = Producer(confluent_config(bootstrap, "bob", **{"transactional.id": "orders-tx"}))
    with pytest.raises(KafkaException) as refused:
        intruder.init_transactions(30)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    consumer = Consumer(confluent_config(bootstrap, "bob", **{"group.id": "billing", "auto.offset.reset": "earliest",
                                                              "isolation.level": "read_committed"}))
    try:
        assert set(consumer.list_topics(timeout=10).topics) == {"orders-eu"}
        consumer.subscribe(["orders-eu"])
        seen = []

        def read():
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                seen.append(message.value())
            return b"in a transaction" in seen
        wait_for(read, "the committed transaction's record")
    finally:
        consumer.close()
    outsider = Consumer(confluent_config(bootstrap, "bob", **{"group.id": "other-" + uuid.uuid4().hex[:6]}))
    try:
        outsider.subscribe(["orders-eu"])
        errors = []

        def refused_group():
            message = outsider.poll(0.2)
            if message is not None and message.error():
                errors.append(message.error().code())
            return KafkaError.GROUP_AUTHORIZATION_FAILED in errors
        wait_for(refused_group, "GROUP_AUTHORIZATION_FAILED")
    finally:
        outsider.close()


def test_acls_survive_sigkill(tmp_path):
    from kafka import KafkaProducer
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, NewTopic, ResourcePatternFilter, ResourceType
    from kafka.admin import ACLResourcePatternType as Pattern
    from kafka.errors import TopicAuthorizationFailedError
    properties = tmp_path / "server.properties"
    properties.write_text("".join(f"{name}={value}\n" for name, value in PROPERTIES.items()))
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, "--config", str(properties))
    try:
        admin = admin_client(bootstrap)
        try:
            assert admin.create_acls(role_bindings())["failed"] == []
        finally:
            admin.close()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    process, bootstrap = start_broker_process(log_dir, "--config", str(properties))
    try:
        admin = admin_client(bootstrap)
        try:
            listed, _ = admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                      ResourcePatternFilter(ResourceType.ANY, None, Pattern.ANY)))
            assert len(listed) == 4
            admin.create_topics([NewTopic("orders-eu", 1, 1)])
        finally:
            admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, **python_config("alice"))
        try:
            producer.send("orders-eu", b"allowed").get(timeout=30)
            with pytest.raises(TopicAuthorizationFailedError):
                producer.send("secret", b"no").get(timeout=30)
        finally:
            producer.close()
    finally:
        process.terminate()
        process.wait()


def test_aiokafka_clients_see_what_kafka_would(broker):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, **python_config("alice"))
        await producer.start()
        try:
            await producer.send_and_wait("orders-eu", b"from aiokafka")
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait("secret", b"no")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("orders-eu", bootstrap_servers=broker.bootstrap_servers, group_id="elsewhere",
                                    **python_config("bob"))
        try:
            with pytest.raises(GroupAuthorizationFailedError):     # aiokafka joins its group in start()
                await consumer.start()
        finally:
            await consumer.stop()
    asyncio.run(run())


@pytest.fixture(scope="module")
def java(tmp_path_factory):
    from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, start_probe, wheel_jar
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), wheel_jar("slf4j-api.jar")]
    running = start_probe(tmp_path_factory.mktemp("acl-probe"), "AclProbe.java", classpath)
    yield running
    running.close()


def test_java_admin_client_and_clients(broker, java):
    """Apache's AdminClient creates (literal, prefixed, wildcard, DENY), lists and deletes ACLs; its producer and
    consumer get the exceptions Kafka gives them."""
    bootstrap = broker.bootstrap_servers
    for binding in ("TOPIC audit- PREFIXED User:dave READ ALLOW", "TOPIC * LITERAL User:dave DESCRIBE ALLOW",
                    "TOPIC audit-secret LITERAL User:dave READ DENY"):
        assert java("create", "admin", bootstrap, *binding.split()) == "ok"
    assert {line for line in java("describe", "admin", bootstrap) if "User:dave" in line} == {
        "TOPIC:PREFIXED:audit-:User:dave:*:READ:ALLOW", "TOPIC:LITERAL:*:User:dave:*:DESCRIBE:ALLOW",
        "TOPIC:LITERAL:audit-secret:User:dave:*:READ:DENY"}
    assert len(java("delete", "admin", bootstrap, "User:dave")) == 3
    assert not [line for line in java("describe", "admin", bootstrap) if "User:dave" in line]
    assert java("create", "bob", bootstrap, "TOPIC", "t", "LITERAL", "User:bob", "ALL", "ALLOW")["error"] == \
        "ClusterAuthorizationException"

    assert java("produce", "alice", bootstrap, "orders-eu") == "ok"
    assert java("produce", "alice", bootstrap, "secret")["error"] == "TopicAuthorizationException"
    assert java("transactional", "alice", bootstrap, "orders-tx") == "ok"
    assert java("transactional", "bob", bootstrap, "orders-tx")["error"] == "TransactionalIdAuthorizationException"
    assert java("consume", "bob", bootstrap, "orders-eu", "billing") == "ok"
    assert java("consume", "bob", bootstrap, "orders-eu", "other")["error"] == "GroupAuthorizationException"


def test_java_admin_client_alters_and_describes_client_quotas_kept_after_sigkill(tmp_path, java):
    """Apache's AdminClient sets, lists and removes client quotas (KIP-546), with the default entity; bob, who may
    not alter the cluster's configs, is refused; the quotas hold after a SIGKILL and a restart."""
    properties = tmp_path / "server.properties"
    properties.write_text("".join(f"{name}={value}\n" for name, value in PROPERTIES.items()))
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, "--config", str(properties))
    try:
        assert java("quota-alter", "admin", bootstrap, "user", "alice", "producer_byte_rate", "1048576") == "ok"
        assert java("quota-alter", "admin", bootstrap, "client-id", "<default>", "consumer_byte_rate", "2048") == "ok"
        assert java("quota-alter", "admin", bootstrap, "user", "bob", "request_percentage", "25.5") == "ok"
        assert java("quota-alter", "admin", bootstrap, "user", "bob", "request_percentage", "remove") == "ok"
        assert java("quota-alter", "admin", bootstrap, "user", "alice", "no_such_key", "1")["error"] == \
            "InvalidRequestException"
        assert java("quota-alter", "bob", bootstrap, "user", "bob", "producer_byte_rate", "1")["error"] == \
            "ClusterAuthorizationException"
        assert java("quota-describe", "bob", bootstrap)["error"] == "ClusterAuthorizationException"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    process, bootstrap = start_broker_process(log_dir, "--config", str(properties))
    try:
        assert java("quota-describe", "admin", bootstrap) == [
            "client-id=<default>:consumer_byte_rate=2048.0", "user=alice:producer_byte_rate=1048576.0"]
    finally:
        process.kill()
        process.wait()
