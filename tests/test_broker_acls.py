"""ACLs on the wire: CreateAcls, DescribeAcls and DeleteAcls at every version Kafka 3.9 serves (SECURITY_DISABLED
without an authorizer), and the checks each API makes, at Kafka's level and with Kafka's errors, for principals
authenticated with SASL/PLAIN."""
import logging

import pytest

from broker_helpers import RawConnection
from kmem.broker import Broker
from kmem.broker.apis.authorized import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from kmem.broker.codes import ErrorCode
from kmem.broker.security.authorizer import Operation, PatternType, Permission, ResourceType
from kmem.records import build_records
from kmem.protocol import ApiKey, decode_response, encode_request, message_class

USERS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret", "carol": "carol-secret"}
JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required " + \
    " ".join(f'user_{name}="{password}"' for name, password in USERS.items()) + ";"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PROPERTIES = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
              "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS, "group.initial.rebalance.delay.ms": 0,
              "authorizer.class.name": AUTHORIZER, "super.users": "User:admin"}
TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, \
    ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def request_class(api_key):
    return message_class(api_key, "Request")


class Client:
    """A raw connection authenticated as ``user`` with SASL/PLAIN (handshake v1, SaslAuthenticate v2)."""

    def __init__(self, bootstrap, user):
        self.raw = RawConnection(bootstrap)
        self.correlation_id = 0
        assert self.call(ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
        token = f"\0{user}\0{USERS[user]}".encode()
        assert self.call(ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=token).error_code == 0

    def call(self, api_key, version, **fields):
        self.correlation_id += 1
        self.raw.send_frame(bytes(encode_request(request_class(api_key)(**fields), version, self.correlation_id,
                                                 client_id="acl-test")))
        payload = self.raw.receive_frame()
        assert payload is not None, "the broker closed the connection"
        return decode_response(payload, api_key, version)[1]

    def close(self):
        self.raw.close()


def creation(resource_type, name, principal, operation, permission=ALLOW, pattern=LITERAL, host="*"):
    return request_class(ApiKey.CREATE_ACLS).AclCreation(
        resource_type=resource_type, resource_name=name, resource_pattern_type=pattern, principal=principal,
        host=host, operation=operation, permission_type=permission)


def acl_filter(resource_type=ResourceType.ANY, name=None, pattern=PatternType.ANY, principal=None,
               operation=Operation.ANY, permission=Permission.ANY):
    return dict(resource_type_filter=resource_type, resource_name_filter=name, pattern_type_filter=pattern,
                principal_filter=principal, host_filter=None, operation=operation, permission_type=permission)


def delete_filter(**fields):
    return request_class(ApiKey.DELETE_ACLS).DeleteAclsFilter(**acl_filter(**fields))


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path, properties=PROPERTIES) as running:
        yield running


@pytest.fixture
def connect(broker):
    clients = []

    def client(user):
        clients.append(Client(broker.bootstrap_servers, user))
        return clients[-1]
    yield client
    for c in clients:
        c.close()


def create_acls(client, *creations, version=3):
    return [(r.error_code, r.error_message) for r in client.call(ApiKey.CREATE_ACLS, version,
                                                                  creations=list(creations)).results]


def described(client, version=3, **filter_fields):
    response = client.call(ApiKey.DESCRIBE_ACLS, version, **acl_filter(**filter_fields))
    assert response.error_code == 0, response.error_message
    return {(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation, a.permission_type)
            for r in response.resources for a in r.acls}


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_create_describe_delete_at_every_version(connect, version):
    admin = connect("admin")
    pattern = PREFIXED if version else LITERAL
    assert create_acls(admin, creation(TOPIC, "orders-", "User:alice", Operation.WRITE, pattern=pattern),
                       creation(GROUP, "billing", "User:bob", Operation.READ), version=version) == [(0, None)] * 2
    expected = {(TOPIC, "orders-", pattern, "User:alice", "*", Operation.WRITE, ALLOW),
                (GROUP, "billing", LITERAL, "User:bob", "*", Operation.READ, ALLOW)}
    assert described(admin, version, pattern=PatternType.ANY if version else LITERAL) == expected
    assert described(admin, version, resource_type=GROUP, pattern=PatternType.ANY if version else LITERAL) == \
        {(GROUP, "billing", LITERAL, "User:bob", "*", Operation.READ, ALLOW)}
    response = admin.call(ApiKey.DELETE_ACLS, version, filters=[
        delete_filter(resource_type=GROUP, pattern=PatternType.ANY if version else LITERAL),
        delete_filter(resource_type=ResourceType.USER, pattern=PatternType.ANY if version else LITERAL)])
    assert [(r.error_code, [(m.resource_type, m.resource_name, m.principal) for m in r.matching_acls])
            for r in response.filter_results] == [(0, [(GROUP, "billing", "User:bob")]), (0, [])]
    assert described(admin, version, pattern=PatternType.ANY if version else LITERAL) == \
        {(TOPIC, "orders-", pattern, "User:alice", "*", Operation.WRITE, ALLOW)}


def test_match_filters_find_what_applies_to_a_name(connect):
    admin = connect("admin")
    create_acls(admin, creation(TOPIC, "orders-eu", "User:bob", Operation.READ),
                creation(TOPIC, "orders-", "User:alice", Operation.WRITE, pattern=PREFIXED),
                creation(TOPIC, "*", "User:carol", Operation.DESCRIBE),
                creation(TOPIC, "other", "User:bob", Operation.READ))
    assert {acl[1] for acl in described(admin, name="orders-eu", pattern=PatternType.MATCH)} == \
        {"orders-eu", "orders-", "*"}
    assert {acl[1] for acl in described(admin, name="orders-eu")} == {"orders-eu"}
    assert {acl[1] for acl in described(admin, principal="User:bob")} == {"orders-eu", "other"}


def test_invalid_creations_fail_alone_as_kafka(connect):
    admin = connect("admin")
    results = create_acls(admin, creation(TOPIC, "t", "User:alice", Operation.ANY),
                          creation(TOPIC, "t", "User:alice", Operation.READ, pattern=PatternType.MATCH),
                          creation(TOPIC, "t", "", Operation.READ),
                          creation(ResourceType.ANY, "t", "User:alice", Operation.READ),
                          creation(TOPIC, "", "User:alice", Operation.READ),
                          creation(CLUSTER, "c", "User:alice", Operation.ALTER),
                          creation(TOPIC, "t", "User:alice", 99),
                          creation(TOPIC, "t", "User:alice", Operation.READ))
    assert [code for code, _ in results] == [ErrorCode.INVALID_REQUEST] * 7 + [0]
    assert results[0][1] == "Invalid operation ANY" and results[1][1] == "Invalid patternType MATCH"
    assert described(admin) == {(TOPIC, "t", LITERAL, "User:alice", "*", Operation.READ, ALLOW)}
    response = admin.call(ApiKey.DELETE_ACLS, 3, filters=[delete_filter(operation=Operation.UNKNOWN)])
    assert response.filter_results[0].error_code == ErrorCode.INVALID_REQUEST
    response = admin.call(ApiKey.DESCRIBE_ACLS, 3, **acl_filter(resource_type=ResourceType.UNKNOWN))
    assert (response.error_code, response.error_message) == (ErrorCode.INVALID_REQUEST, "Unknown patternFilter.")


def test_only_alter_on_the_cluster_changes_acls_and_describe_lists_them(connect):
    admin, alice = connect("admin"), connect("alice")
    assert create_acls(alice, creation(TOPIC, "t", "User:alice", Operation.ALL)) == \
        [(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")]
    assert alice.call(ApiKey.DESCRIBE_ACLS, 3, **acl_filter()).error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert alice.call(ApiKey.DELETE_ACLS, 3, filters=[delete_filter()]).filter_results[0].error_code == \
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    create_acls(admin, creation(CLUSTER, "kafka-cluster", "User:alice", Operation.ALTER))
    assert create_acls(alice, creation(TOPIC, "t", "User:alice", Operation.ALL)) == [(0, None)]
    assert len(described(alice)) == 2                   # ALTER implies DESCRIBE


def test_without_an_authorizer_the_acl_apis_answer_security_disabled(tmp_path):
    with Broker(tmp_path) as broker, RawConnection(broker.bootstrap_servers) as raw:
        def call(api_key, **fields):
            raw.send_frame(bytes(encode_request(request_class(api_key)(**fields), 3, 1)))
            return decode_response(raw.receive_frame(), api_key, 3)[1]
        response = call(ApiKey.DESCRIBE_ACLS, **acl_filter())
        assert (response.error_code, response.error_message) == (ErrorCode.SECURITY_DISABLED,
                                                                 "No Authorizer is configured on the broker")
        assert call(ApiKey.CREATE_ACLS, creations=[creation(TOPIC, "t", "User:a", Operation.READ)]).results[0] \
            .error_code == ErrorCode.SECURITY_DISABLED
        assert call(ApiKey.DELETE_ACLS, filters=[delete_filter()]).filter_results[0].error_code == \
            ErrorCode.SECURITY_DISABLED
        # listed as Kafka lists them, with or without an authorizer
        assert {(k.api_key, k.min_version, k.max_version) for k in call(ApiKey.API_VERSIONS).api_keys} >= \
            {(29, 0, 3), (30, 0, 3), (31, 0, 3)}


# -- the checks of the APIs

ROLES = (creation(TOPIC, "orders-", "User:alice", Operation.WRITE, pattern=PREFIXED),
         creation(TXN, "orders-tx", "User:alice", Operation.WRITE),
         creation(TOPIC, "orders-eu", "User:bob", Operation.READ),
         creation(GROUP, "billing", "User:bob", Operation.READ))


@pytest.fixture
def roles(broker, connect):
    admin = connect("admin")
    assert create_acls(admin, *ROLES) == [(0, None)] * len(ROLES)
    Topic = request_class(ApiKey.CREATE_TOPICS).CreatableTopic
    response = admin.call(ApiKey.CREATE_TOPICS, 7, timeout_ms=5000, topics=[
        Topic(name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])
        for name in ("orders-eu", "orders-us", "secret")])
    assert [t.error_code for t in response.topics] == [0, 0, 0]
    return admin


def metadata(client, topics, version=12, **fields):
    Topic = request_class(ApiKey.METADATA).MetadataRequestTopic
    names = None if topics is None else [Topic(name=name) for name in topics]
    response = client.call(ApiKey.METADATA, version, topics=names, **fields)
    return {t.name: t.error_code for t in response.topics}, response


def test_metadata_lists_only_describable_topics(roles, connect):
    bob, alice = connect("bob"), connect("alice")
    assert metadata(bob, None)[0] == {"orders-eu": 0}
    assert metadata(alice, None)[0] == {"orders-eu": 0, "orders-us": 0}
    assert metadata(roles, None)[0] == {"orders-eu": 0, "orders-us": 0, "secret": 0}
    topics, _ = metadata(bob, ["orders-eu", "secret", "nowhere"], allow_auto_topic_creation=False)
    assert topics == {"orders-eu": 0, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                      "nowhere": ErrorCode.TOPIC_AUTHORIZATION_FAILED}


def test_metadata_auto_creation_needs_create(roles, connect, broker):
    alice = connect("alice")
    # alice may DESCRIBE orders-new (WRITE implies it) but not CREATE it
    assert metadata(alice, ["orders-new"], allow_auto_topic_creation=True)[0] == \
        {"orders-new": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert "orders-new" not in broker.logs.topics()
    create_acls(roles, creation(TOPIC, "orders-", "User:alice", Operation.CREATE, pattern=PREFIXED))
    assert metadata(alice, ["orders-new"], allow_auto_topic_creation=True)[0] == {"orders-new": 0}


def test_metadata_authorized_operations(roles, connect):
    bob = connect("bob")
    _, response = metadata(bob, ["orders-eu"], version=10, include_cluster_authorized_operations=True,
                           include_topic_authorized_operations=True)
    assert response.topics[0].topic_authorized_operations == (1 << Operation.READ) | (1 << Operation.DESCRIBE)
    assert response.cluster_authorized_operations == 0
    _, response = metadata(roles, ["orders-eu"], version=10, include_cluster_authorized_operations=True,
                           include_topic_authorized_operations=True)
    assert response.topics[0].topic_authorized_operations == TOPIC_OPERATIONS        # a super user: all of them
    assert response.cluster_authorized_operations == CLUSTER_OPERATIONS


def produce(client, topics, transactional_id=None):
    Request = request_class(ApiKey.PRODUCE)
    batch = {} if transactional_id is None else {"producer_id": 1, "producer_epoch": 0, "base_sequence": 0,
                                                 "transactional": True}
    records = bytes(build_records([b"value"], **batch))
    response = client.call(ApiKey.PRODUCE, 9, transactional_id=transactional_id, acks=-1, timeout_ms=5000,
                           topic_data=[Request.TopicProduceData(name=name, partition_data=[
                               Request.PartitionProduceData(index=0, records=records)]) for name in topics])
    return {t.name: t.partition_responses[0].error_code for t in response.responses}


def test_produce_needs_write_per_topic(roles, connect, caplog):
    alice, bob = connect("alice"), connect("bob")
    assert produce(alice, ["orders-eu", "orders-us"]) == {"orders-eu": 0, "orders-us": 0}
    with caplog.at_level(logging.INFO, logger="kmem.authorizer"):
        assert produce(alice, ["orders-eu", "secret"]) == {"orders-eu": 0,
                                                           "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert produce(bob, ["orders-eu"]) == {"orders-eu": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert "Principal = User:bob is Denied operation = WRITE from host = 127.0.0.1 on resource = " \
           "Topic:LITERAL:orders-eu for request = Produce with resourceRefCount = 1 based on rule DefaultDeny" \
           in caplog.messages
    assert produce(alice, ["orders-eu"], transactional_id="other-tx") == \
        {"orders-eu": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    # transactional batches without a transactional id are refused the same way, as Kafka
    Request = request_class(ApiKey.PRODUCE)
    records = bytes(build_records([b"value"], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True))
    response = alice.call(ApiKey.PRODUCE, 9, transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
        Request.TopicProduceData(name="orders-eu", partition_data=[Request.PartitionProduceData(
            index=0, records=records)])])
    assert response.responses[0].partition_responses[0].error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_a_denied_produce_with_acks_0_closes_the_connection(roles, connect, broker):
    """As Kafka: the allowed topics are appended, then the connection closes (the producer learns of the error)."""
    alice = connect("alice")
    Request = request_class(ApiKey.PRODUCE)
    records = bytes(build_records([b"unacknowledged"]))
    alice.raw.send_frame(bytes(encode_request(request_class(ApiKey.PRODUCE)(
        acks=0, timeout_ms=5000, transactional_id=None, topic_data=[
            Request.TopicProduceData(name=name, partition_data=[Request.PartitionProduceData(index=0, records=records)])
            for name in ("orders-eu", "secret")]), 9, 99)))
    assert alice.raw.receive_frame() is None
    assert broker.logs.get_partition("orders-eu", 0).log_end_offset == 1
    assert broker.logs.get_partition("secret", 0).log_end_offset == 0


def fetch(client, topics, version=12, replica_id=-1):
    Request = request_class(ApiKey.FETCH)
    response = client.call(ApiKey.FETCH, version, replica_id=replica_id, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                           isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                           topics=[Request.FetchTopic(topic=name, partitions=[Request.FetchPartition(
                               partition=0, fetch_offset=0, partition_max_bytes=1 << 20, current_leader_epoch=-1,
                               log_start_offset=-1, last_fetched_epoch=-1)]) for name in topics])
    return {t.topic: t.partitions[0].error_code for t in response.responses}


def test_fetch_list_offsets_and_epochs_check_per_topic(roles, connect):
    bob = connect("bob")
    assert produce(roles, ["orders-eu", "secret"]) == {"orders-eu": 0, "secret": 0}
    assert fetch(bob, ["orders-eu", "secret"]) == {"orders-eu": 0, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert fetch(bob, ["secret"]) == {"secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    # a follower's fetch needs CLUSTER_ACTION, whatever it may READ
    assert fetch(bob, ["orders-eu"], replica_id=1) == {"orders-eu": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    Request = request_class(ApiKey.LIST_OFFSETS)
    response = bob.call(ApiKey.LIST_OFFSETS, 7, replica_id=-1, isolation_level=0, topics=[
        Request.ListOffsetsTopic(name=name, partitions=[Request.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1)]) for name in ("orders-eu", "secret")])
    assert {t.name: t.partitions[0].error_code for t in response.topics} == \
        {"orders-eu": 0, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    Request = request_class(ApiKey.OFFSET_FOR_LEADER_EPOCH)
    response = bob.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, replica_id=-1, topics=[
        Request.OffsetForLeaderTopic(topic=name, partitions=[Request.OffsetForLeaderPartition(
            partition=0, current_leader_epoch=-1, leader_epoch=0)]) for name in ("orders-eu", "secret")])
    assert {t.topic: t.partitions[0].error_code for t in response.topics} == \
        {"orders-eu": 0, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}


def test_group_apis_check_the_group_and_the_topics(roles, connect):
    bob, alice = connect("bob"), connect("alice")
    assert bob.call(ApiKey.FIND_COORDINATOR, 3, key="billing", key_type=0).error_code == 0
    assert alice.call(ApiKey.FIND_COORDINATOR, 3, key="billing", key_type=0).error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    coordinators = bob.call(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=["billing", "other"]).coordinators
    assert {c.key: c.error_code for c in coordinators} == {"billing": 0, "other": ErrorCode.GROUP_AUTHORIZATION_FAILED}
    join = dict(session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="", protocol_type="consumer",
                protocols=[request_class(ApiKey.JOIN_GROUP).JoinGroupRequestProtocol(name="range", metadata=b"")])
    assert alice.call(ApiKey.JOIN_GROUP, 5, group_id="billing", **join).error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert bob.call(ApiKey.HEARTBEAT, 3, group_id="other", generation_id=1, member_id="m").error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    Commit = request_class(ApiKey.OFFSET_COMMIT)
    topics = [Commit.OffsetCommitRequestTopic(name=name, partitions=[Commit.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=0, committed_metadata="")]) for name in ("orders-eu", "secret")]
    response = bob.call(ApiKey.OFFSET_COMMIT, 7, group_id="billing", generation_id_or_member_epoch=-1, member_id="",
                        topics=topics)
    assert {t.name: t.partitions[0].error_code for t in response.topics} == \
        {"orders-eu": 0, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    response = alice.call(ApiKey.OFFSET_COMMIT, 7, group_id="billing", generation_id_or_member_epoch=-1,
                          member_id="", topics=topics)
    assert {t.partitions[0].error_code for t in response.topics} == {ErrorCode.GROUP_AUTHORIZATION_FAILED}
    fetched = bob.call(ApiKey.OFFSET_FETCH, 7, group_id="billing", topics=None)
    assert (fetched.error_code, [t.name for t in fetched.topics]) == (0, ["orders-eu"])
    assert alice.call(ApiKey.OFFSET_FETCH, 7, group_id="billing", topics=None).error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    described = bob.call(ApiKey.DESCRIBE_GROUPS, 5, groups=["billing", "other"], include_authorized_operations=True)
    assert {(g.group_id, g.error_code, g.authorized_operations) for g in described.groups} == {
        ("billing", 0, (1 << Operation.READ) | (1 << Operation.DESCRIBE)),
        ("other", ErrorCode.GROUP_AUTHORIZATION_FAILED, -2**31)}
    assert [g.group_id for g in bob.call(ApiKey.LIST_GROUPS, 4, states_filter=[]).groups] == ["billing"]
    assert alice.call(ApiKey.LIST_GROUPS, 4, states_filter=[]).groups == []
    assert [g.group_id for g in roles.call(ApiKey.LIST_GROUPS, 4, states_filter=[]).groups] == ["billing"]
    deleted = bob.call(ApiKey.DELETE_GROUPS, 2, groups_names=["billing"]).results
    assert [(r.group_id, r.error_code) for r in deleted] == [("billing", ErrorCode.GROUP_AUTHORIZATION_FAILED)]


def test_consumer_group_apis_check_the_group_and_the_topics(roles, connect):
    bob, alice = connect("bob"), connect("alice")
    join = dict(member_id="m", member_epoch=0, rebalance_timeout_ms=1000, topic_partitions=[])
    Heartbeat = ApiKey.CONSUMER_GROUP_HEARTBEAT
    assert alice.call(Heartbeat, 1, group_id="billing", subscribed_topic_names=["orders-eu"], **join).error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert bob.call(Heartbeat, 1, group_id="billing", subscribed_topic_names=["orders-eu", "secret"],
                    **join).error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    joined = bob.call(Heartbeat, 1, group_id="billing", subscribed_topic_names=["orders-eu"], **join)
    assert (joined.error_code, joined.member_epoch) == (0, 1)
    described = bob.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, group_ids=["billing", "other"],
                         include_authorized_operations=True).groups
    assert {(g.group_id, g.error_code, g.authorized_operations) for g in described} == {
        ("billing", 0, (1 << Operation.READ) | (1 << Operation.DESCRIBE)),
        ("other", ErrorCode.GROUP_AUTHORIZATION_FAILED, -2**31)}


def test_producer_ids_and_transactions(roles, connect):
    alice, bob = connect("alice"), connect("bob")
    assert alice.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id=None, transaction_timeout_ms=-1).error_code == 0
    assert bob.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id=None, transaction_timeout_ms=-1).error_code == \
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED                   # no WRITE on any topic, no IDEMPOTENT_WRITE
    assert bob.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id="orders-tx", transaction_timeout_ms=60000) \
        .error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert bob.call(ApiKey.FIND_COORDINATOR, 3, key="orders-tx", key_type=1).error_code == \
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    ids = alice.call(ApiKey.INIT_PRODUCER_ID, 4, transactional_id="orders-tx", transaction_timeout_ms=60000)
    assert ids.error_code == 0
    Add = request_class(ApiKey.ADD_PARTITIONS_TO_TXN)
    response = alice.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="orders-tx",
                          v3_and_below_producer_id=ids.producer_id, v3_and_below_producer_epoch=ids.producer_epoch,
                          v3_and_below_topics=[Add.AddPartitionsToTxnTopic(name=name, partitions=[0])
                                               for name in ("orders-eu", "secret")])
    assert {t.name: t.results_by_partition[0].partition_error_code for t in response.results_by_topic_v3_and_below} \
        == {"orders-eu": ErrorCode.OPERATION_NOT_ATTEMPTED, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert alice.call(ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id="orders-tx", producer_id=ids.producer_id,
                      producer_epoch=ids.producer_epoch, group_id="billing").error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert bob.call(ApiKey.END_TXN, 3, transactional_id="orders-tx", producer_id=ids.producer_id,
                    producer_epoch=ids.producer_epoch, committed=False).error_code == \
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    response = alice.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, v3_and_below_transactional_id="orders-tx",
                          v3_and_below_producer_id=ids.producer_id, v3_and_below_producer_epoch=ids.producer_epoch,
                          v3_and_below_topics=[Add.AddPartitionsToTxnTopic(name="orders-us", partitions=[0])])
    assert response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    # a transaction's partitions are described only to who may DESCRIBE their topics
    create_acls(roles, creation(TXN, "orders-tx", "User:bob", Operation.DESCRIBE))
    for client, topics in ((roles, ["orders-us"]), (bob, [])):
        [state] = client.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=["orders-tx"]).transaction_states
        assert (state.error_code, [t.topic for t in state.topics]) == (0, topics)


def test_admin_apis(roles, connect, broker):
    alice = connect("alice")
    Topic = request_class(ApiKey.CREATE_TOPICS).CreatableTopic
    response = alice.call(ApiKey.CREATE_TOPICS, 7, timeout_ms=5000, topics=[
        Topic(name="orders-x", num_partitions=1, replication_factor=1, assignments=[], configs=[])])
    assert response.topics[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    create_acls(roles, creation(TOPIC, "orders-x", "User:alice", Operation.CREATE))
    created = alice.call(ApiKey.CREATE_TOPICS, 7, timeout_ms=5000, topics=[
        Topic(name="orders-x", num_partitions=1, replication_factor=1, assignments=[], configs=[])]).topics[0]
    assert (created.error_code, created.topic_config_error_code, created.configs) == \
        (0, ErrorCode.TOPIC_AUTHORIZATION_FAILED, [])             # no DESCRIBE_CONFIGS on it
    created = roles.call(ApiKey.CREATE_TOPICS, 7, timeout_ms=5000, topics=[
        Topic(name="orders-y", num_partitions=1, replication_factor=1, assignments=[], configs=[])]).topics[0]
    assert (created.error_code, created.topic_config_error_code) == (0, 0) and created.configs
    response = alice.call(ApiKey.DELETE_TOPICS, 5, topic_names=["orders-us"], timeout_ms=5000)
    assert response.responses[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert "orders-us" in broker.logs.topics()
    Resource = request_class(ApiKey.DESCRIBE_CONFIGS).DescribeConfigsResource
    response = alice.call(ApiKey.DESCRIBE_CONFIGS, 4, resources=[
        Resource(resource_type=2, resource_name="orders-us", configuration_keys=None),
        Resource(resource_type=4, resource_name="0", configuration_keys=None)])
    assert [r.error_code for r in response.results] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                        ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    Delete = request_class(ApiKey.DELETE_RECORDS)
    response = alice.call(ApiKey.DELETE_RECORDS, 2, timeout_ms=5000, topics=[Delete.DeleteRecordsTopic(
        name="orders-us", partitions=[Delete.DeleteRecordsPartition(partition_index=0, offset=0)])])
    assert response.topics[0].partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    cluster = alice.call(ApiKey.DESCRIBE_CLUSTER, 1, include_cluster_authorized_operations=True)
    assert cluster.cluster_authorized_operations == 0


def test_the_other_apis_answer_their_authorization_errors(roles, connect):
    bob = connect("bob")
    Commit = request_class(ApiKey.TXN_OFFSET_COMMIT)
    response = bob.call(ApiKey.TXN_OFFSET_COMMIT, 3, transactional_id="orders-tx", group_id="billing", producer_id=1,
                        producer_epoch=0, generation_id=-1, member_id="", topics=[
                            Commit.TxnOffsetCommitRequestTopic(name="orders-eu", partitions=[
                                Commit.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=0)])])
    assert response.topics[0].partitions[0].error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    Delete = request_class(ApiKey.OFFSET_DELETE)
    assert bob.call(ApiKey.OFFSET_DELETE, 0, group_id="billing", topics=[Delete.OffsetDeleteRequestTopic(
        name="orders-eu", partitions=[Delete.OffsetDeleteRequestPartition(partition_index=0)])]).error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    states = bob.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=["orders-tx"]).transaction_states
    assert [(s.transactional_id, s.error_code) for s in states] == \
        [("orders-tx", ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]
    assert bob.call(ApiKey.LIST_TRANSACTIONS, 1, state_filters=[], producer_id_filters=[]).transaction_states == []
    Producers = request_class(ApiKey.DESCRIBE_PRODUCERS)
    topics = bob.call(ApiKey.DESCRIBE_PRODUCERS, 0, topics=[Producers.TopicRequest(
        name=name, partition_indexes=[0]) for name in ("orders-eu", "secret")]).topics
    assert {t.name: t.partitions[0].error_code for t in topics} == \
        {"orders-eu": 0, "secret": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    Partitions = request_class(ApiKey.CREATE_PARTITIONS)
    results = bob.call(ApiKey.CREATE_PARTITIONS, 3, timeout_ms=5000, validate_only=False, topics=[
        Partitions.CreatePartitionsTopic(name="orders-eu", count=2, assignments=None)]).results
    assert [(r.name, r.error_code) for r in results] == [("orders-eu", ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    Alter = request_class(ApiKey.INCREMENTAL_ALTER_CONFIGS)
    responses = bob.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, validate_only=False, resources=[
        Alter.AlterConfigsResource(resource_type=2, resource_name="orders-eu", configs=[Alter.AlterableConfig(
            name="retention.ms", config_operation=0, value="1000")])]).responses
    assert [r.error_code for r in responses] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
    Alter = request_class(ApiKey.ALTER_CONFIGS)
    responses = bob.call(ApiKey.ALTER_CONFIGS, 2, validate_only=False, resources=[Alter.AlterConfigsResource(
        resource_type=2, resource_name="orders-eu", configs=[])]).responses
    assert [r.error_code for r in responses] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]


def test_only_the_cluster_describe_and_alter_acls_open_the_scram_user_apis(roles, connect, broker):
    """KIP-554's APIs check the cluster as KafkaApis does: DESCRIBE to list users, ALTER to change them; a user
    not allowed changes nothing."""
    Alter = request_class(ApiKey.ALTER_USER_SCRAM_CREDENTIALS)
    upsertion = Alter.ScramCredentialUpsertion(name="carol", mechanism=1, iterations=4096, salt=b"s" * 16,
                                               salted_password=b"p" * 32)
    bob = connect("bob")
    results = bob.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, deletions=[], upsertions=[upsertion]).results
    assert [(r.user, r.error_code) for r in results] == [("carol", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)]
    described = bob.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=None)
    assert described.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert broker.scram_credentials.describe("carol") == []
    assert create_acls(roles, creation(CLUSTER, "kafka-cluster", "User:bob", Operation.ALTER)) == [(0, None)]
    results = bob.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, deletions=[], upsertions=[upsertion]).results
    assert [(r.user, r.error_code) for r in results] == [("carol", 0)]
    described = bob.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, users=None)     # ALTER implies DESCRIBE
    assert described.error_code == 0 and [r.user for r in described.results] == ["carol"]


def test_an_unauthorized_find_coordinator_creates_no_internal_topic(broker, connect):
    bob = connect("bob")
    assert bob.call(ApiKey.FIND_COORDINATOR, 3, key="billing", key_type=0).error_code == \
        ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert bob.call(ApiKey.FIND_COORDINATOR, 3, key="orders-tx", key_type=1).error_code == \
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert not {"__consumer_offsets", "__transaction_state"} & set(broker.logs.topics())


@pytest.mark.parametrize("address, java", [("127.0.0.1", "127.0.0.1"), ("::1", "0:0:0:0:0:0:0:1"),
                                           ("fe80::1%lo", "fe80:0:0:0:0:0:0:1"), ("::ffff:10.0.0.7", "10.0.0.7"),
                                           ("2001:db8::a:0", "2001:db8:0:0:0:0:a:0")])
def test_acl_hosts_match_the_address_as_java_writes_it(address, java):
    """Kafka matches an ACL's host against ``InetAddress.getHostAddress()``: kmem writes the client's the same."""
    from kmem.broker.apis.dispatch import java_host_address
    assert java_host_address(address) == java
