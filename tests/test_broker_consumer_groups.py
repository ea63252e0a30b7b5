"""KIP-848 consumer groups on the coordinator (requests decoded as the broker hands them over): member and group
epochs, the target assignment of the ``uniform`` and ``range`` assignors, reconciliation in which a partition
moves only once its old owner revoked it, leaving (static members with epoch -2), session and revocation
timeouts on the timer, and Kafka's error codes; then the same over the wire (ApiVersions, versions 0 and 1)."""
import struct
import time
import uuid

import pytest

from broker_helpers import RawConnection, wait_for
from group_helpers import start_broker
from kmem.broker import LogManager
from kmem.broker.apis.handlers import protocol_uuid
from kmem.broker.codes import ErrorCode
from kmem.broker.group.assignors import AssignmentMember, range_, uniform
from kmem.broker.group.coordinator import GroupConfig, GroupCoordinator
from kmem.errors import ConfigError
from kmem.protocol import ApiKey, RequestHeader, decode_response, encode_request, messages

H = messages.ConsumerGroupHeartbeatRequest


@pytest.fixture
def logs(tmp_path):
    with LogManager(tmp_path) as manager:
        manager.create_topic("t", 4)
        yield manager


@pytest.fixture
def groups(logs):
    coordinator = GroupCoordinator(logs, GroupConfig(offsets_topic_partitions=3))
    yield Members(coordinator, logs)
    coordinator.close()


class Members:
    """Heartbeats of a group's members, remembering each member's latest epoch."""

    def __init__(self, coordinator, logs, group_id="g", version=1):
        self.coordinator = coordinator
        self.group_id = group_id
        self.version = version
        self.topic_id = protocol_uuid(logs.topics()["t"].topic_id)
        self.epochs = {}

    def send(self, member_id, epoch, owned=None, version=None, **fields):
        partitions = None if owned is None else \
            [H.TopicPartitions(topic_id=self.topic_id, partitions=sorted(owned))] if owned else []
        request = H(group_id=self.group_id, member_id=member_id, member_epoch=epoch, topic_partitions=partitions,
                    **fields)
        header = RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, self.version if version is None else version, 1, "c")
        return self.coordinator.consumer_group_heartbeat(header, request, client_host="/127.0.0.1")

    def join(self, member_id, version=None, **fields):
        fields.setdefault("subscribed_topic_names", ["t"])
        response = self.send(member_id, 0, owned=(), rebalance_timeout_ms=fields.pop("rebalance_timeout_ms", 30000),
                             version=version, **fields)
        if response.error_code == ErrorCode.NONE:
            self.epochs[response.member_id] = response.member_epoch
        return response

    def beat(self, member_id, owned, **fields):
        """A heartbeat owning ``owned``; returns (epoch, assignment or None)."""
        response = self.send(member_id, self.epochs[member_id], owned=owned, **fields)
        assert response.error_code == ErrorCode.NONE, response
        self.epochs[member_id] = response.member_epoch
        return response.member_epoch, assignment(response)

    def describe(self):
        request = messages.ConsumerGroupDescribeRequest(group_ids=[self.group_id], include_authorized_operations=False)
        return self.coordinator.consumer_group_describe(RequestHeader(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, "c"),
                                                        request).groups[0]


def assignment(response):
    if response.assignment is None:
        return None
    return {p for tp in response.assignment.topic_partitions for p in tp.partitions}


def test_a_partition_moves_only_after_its_owner_revoked_it(groups):
    first = groups.join("a")
    assert (first.member_epoch, assignment(first), first.heartbeat_interval_ms) == (1, {0, 1, 2, 3}, 5000)
    second = groups.join("b")
    # b waits at the new epoch: every partition of its target is still a's
    assert (second.member_epoch, assignment(second)) == (2, set())
    assert groups.describe().group_state == "Reconciling"
    epoch, told = groups.beat("a", {0, 1, 2, 3})
    assert epoch == 1 and len(told) == 2                          # a revokes two, at its epoch
    moving = {0, 1, 2, 3} - told
    assert groups.beat("b", set()) == (2, None)                   # not before a revoked them
    assert groups.beat("a", {0, 1, 2, 3}) == (1, None)            # a still owns them: nothing moves
    assert groups.beat("a", told) == (2, None)                    # revoked: a reaches the group's epoch
    assert groups.beat("b", set()) == (2, moving)
    assert groups.beat("b", moving) == (2, None)
    described = groups.describe()
    assert (described.group_state, described.group_epoch, described.assignment_epoch) == ("Stable", 2, 2)
    assert {m.member_id: set(m.assignment.topic_partitions[0].partitions) for m in described.members} == \
        {"a": told, "b": moving}


def test_epoch_errors_as_kafka_answers_them(groups):
    groups.join("a")
    future = groups.send("a", 7, owned={0, 1, 2, 3})
    assert future.error_code == ErrorCode.FENCED_MEMBER_EPOCH and future.member_id is None
    assert groups.send("nobody", 1, owned=()).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    groups.join("b")
    _, told = groups.beat("a", {0, 1, 2, 3})
    assert groups.beat("a", told) == (2, None)
    # the previous epoch is accepted with a subset of the assignment (its answer may have been lost)...
    assert groups.send("a", 1, owned=told).error_code == ErrorCode.NONE
    # ...not with a partition the member was not given
    assert groups.send("a", 1, owned={0, 1, 2, 3}).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert groups.send("a", 0, owned=()).error_code == ErrorCode.INVALID_REQUEST      # a join needs its fields


@pytest.mark.parametrize("fields, version, message", [
    ({"group_id": "", "member_id": "a", "member_epoch": 1}, 1, "GroupId"),
    ({"member_id": "", "member_epoch": 0, "rebalance_timeout_ms": 1, "subscribed_topic_names": ["t"],
      "topic_partitions": []}, 1, "MemberId"),
    ({"member_id": "a", "member_epoch": 0, "subscribed_topic_names": ["t"], "topic_partitions": []}, 1,
     "RebalanceTimeoutMs"),
    ({"member_id": "a", "member_epoch": 0, "rebalance_timeout_ms": 1, "subscribed_topic_names": ["t"]}, 1,
     "TopicPartitions"),
    ({"member_id": "a", "member_epoch": 0, "rebalance_timeout_ms": 1, "topic_partitions": []}, 1,
     "SubscribedTopicNames"),
    ({"member_id": "a", "member_epoch": -2}, 1, "InstanceId"),
    ({"member_id": "a", "member_epoch": -3}, 1, "MemberEpoch"),
    ({"member_id": "a", "member_epoch": 1, "instance_id": ""}, 1, "InstanceId"),
    ({"member_id": "", "member_epoch": 1}, 0, "MemberId"),
])
def test_invalid_requests(groups, fields, version, message):
    request = H(**{"group_id": "g", **fields})
    header = RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, 1, "c")
    response = groups.coordinator.consumer_group_heartbeat(header, request)
    assert response.error_code == ErrorCode.INVALID_REQUEST and message in response.error_message


def test_version_0_gets_a_member_id_from_the_coordinator(groups):
    response = groups.join("", version=0)
    assert response.error_code == ErrorCode.NONE and uuid.UUID(response.member_id)
    assert groups.describe().members[0].member_id == response.member_id


def test_assignors_regular_expressions_and_group_size(logs):
    coordinator = GroupCoordinator(logs, GroupConfig(offsets_topic_partitions=3, consumer_max_size=2,
                                                     consumer_assignors=("range",)))
    try:
        members = Members(coordinator, logs)
        refused = members.join("a", server_assignor="uniform")
        assert refused.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR and "range" in refused.error_message
        bad = members.join("a", subscribed_topic_names=None, subscribed_topic_regex="t(")
        assert bad.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
        assert members.join("a", subscribed_topic_names=None, subscribed_topic_regex="t|u").error_code == 0
        assert members.join("b").error_code == 0
        full = members.join("c")
        assert full.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
        assert members.describe().assignor_name == "range"
    finally:
        coordinator.close()


def test_leaving_frees_the_partitions(groups):
    groups.join("a")
    groups.join("b")
    _, told = groups.beat("a", {0, 1, 2, 3})
    groups.beat("a", told)
    left = groups.send("a", -1)
    assert (left.error_code, left.member_id, left.member_epoch) == (ErrorCode.NONE, "a", -1)
    assert groups.beat("b", set()) == (3, {0, 1, 2, 3})
    assert groups.send("a", -1).error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_keeps_its_partitions_over_a_restart(groups):
    groups.join("a", instance_id="i1")
    groups.join("b")
    _, told = groups.beat("a", {0, 1, 2, 3})
    groups.beat("a", told)
    _, rest = groups.beat("b", set())
    assert groups.join("a2", instance_id="i1").error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    assert groups.send("x", 2, instance_id="i1", owned=told).error_code == ErrorCode.FENCED_INSTANCE_ID
    gone = groups.send("a", -2, instance_id="i1")
    assert (gone.error_code, gone.member_epoch) == (ErrorCode.NONE, -2)
    assert groups.beat("b", rest) == (2, None)                    # nothing moves while it is away
    back = groups.join("a2", instance_id="i1")
    assert (back.error_code, assignment(back), back.member_epoch) == (ErrorCode.NONE, told, 2)
    assert {m.member_id for m in groups.describe().members} == {"a2", "b"}


def test_silent_members_are_fenced_by_the_timer(logs):
    coordinator = GroupCoordinator(logs, GroupConfig(offsets_topic_partitions=3, consumer_session_timeout_ms=300))
    try:
        members = Members(coordinator, logs)
        members.join("a", rebalance_timeout_ms=60000)
        members.join("b", rebalance_timeout_ms=60000)
        # b heartbeats; a, told to revoke, goes silent: its session ends, with no request arriving
        members.beat("a", {0, 1, 2, 3})

        def only_b_left():
            members.beat("b", set())
            return [m.member_id for m in members.describe().members] == ["b"]
        wait_for(only_b_left, "a fenced")
        described = members.describe()
        assert described.group_epoch == 3
        assert described.members[0].assignment.topic_partitions[0].partitions == [0, 1, 2, 3]
    finally:
        coordinator.close()


def test_a_member_that_does_not_revoke_in_its_rebalance_timeout_is_fenced(logs):
    coordinator = GroupCoordinator(logs, GroupConfig(offsets_topic_partitions=3))
    try:
        members = Members(coordinator, logs)
        members.join("a", rebalance_timeout_ms=200)
        members.join("b")
        members.beat("a", {0, 1, 2, 3})
        deadline = time.monotonic() + 10
        while members.send("a", 1, owned={0, 1, 2, 3}).error_code == ErrorCode.NONE:   # keeps them all
            assert time.monotonic() < deadline, "a was never fenced"
            time.sleep(0.05)
        assert members.send("a", 1, owned={0, 1, 2, 3}).error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert members.beat("b", set()) == (3, {0, 1, 2, 3})
    finally:
        coordinator.close()


def test_group_consumer_assignors_setting():
    assert GroupConfig.from_properties({"group.consumer.assignors": "range, uniform"}).consumer_assignors == \
        ("range", "uniform")
    kafka_names = "org.apache.kafka.coordinator.group.assignor.UniformAssignor"
    assert GroupConfig.from_properties({"group.consumer.assignors": kafka_names}).consumer_assignors == ("uniform",)
    with pytest.raises(ConfigError):
        GroupConfig.from_properties({"group.consumer.assignors": "sticky"})


# -- the assignors

T1, T2 = uuid.uuid4(), uuid.uuid4()


def member(*topics, **current):
    return AssignmentMember(frozenset(topics), {T1: frozenset(current["t1"])} if "t1" in current else {})


def test_uniform_is_balanced_and_sticky():
    first = uniform({"a": member(T1), "b": member(T1), "c": member(T1)}, {T1: 7})
    sizes = sorted(len(first[m][T1]) for m in first)
    assert sizes == [2, 2, 3] and set().union(*(first[m][T1] for m in first)) == set(range(7))
    kept = {m: AssignmentMember(frozenset({T1}), first[m]) for m in ("a", "b")}
    second = uniform({**kept, "d": member(T1)}, {T1: 7})       # c left, d joined
    for m in ("a", "b"):
        assert first[m][T1] <= second[m][T1]                   # nobody loses a partition it had
    assert sorted(len(second[m][T1]) for m in second) == [2, 2, 3]


def test_uniform_with_different_subscriptions():
    result = uniform({"a": member(T1), "b": member(T1, T2)}, {T1: 2, T2: 4})
    # b alone takes T2's four: a, the only other subscriber of T1, takes both of T1's
    assert result == {"a": {T1: frozenset({0, 1})}, "b": {T2: frozenset({0, 1, 2, 3})}}
    kept = uniform({"a": member(T1), "b": AssignmentMember(frozenset({T1, T2}), {T1: frozenset({0, 1})})},
                   {T1: 2, T2: 4})
    assert kept == result                    # b, far above a, gives up what it kept of T1


def test_range_gives_co_partitioned_ranges():
    result = range_({"b": member(T1, T2), "a": member(T1, T2), "c": member(T1)}, {T1: 5, T2: 4})
    assert result["a"] == {T1: frozenset({0, 1}), T2: frozenset({0, 1})}
    assert result["b"] == {T1: frozenset({2, 3}), T2: frozenset({2, 3})}
    assert result["c"] == {T1: frozenset({4})}


# -- over the wire

def test_over_the_wire(tmp_path):
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 2)
        with RawConnection(broker.bootstrap_servers) as connection:
            versions = connection.call(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
                client_software_name="t", client_software_version="1"))
            served = {v.api_key: (v.min_version, v.max_version) for v in versions.api_keys}
            assert served[ApiKey.CONSUMER_GROUP_HEARTBEAT] == (0, 1)
            assert served[ApiKey.CONSUMER_GROUP_DESCRIBE] == (0, 0)
            for version in (0, 1):
                joined = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, H(
                    group_id=f"g{version}", member_id="" if version == 0 else "m", member_epoch=0,
                    rebalance_timeout_ms=1000, subscribed_topic_names=["t"], topic_partitions=[]))
                assert joined.error_code == ErrorCode.NONE
                assert joined.assignment.topic_partitions[0].partitions == [0, 1]
            for request, error in [
                    (H(group_id="g1", member_id="m", member_epoch=5), ErrorCode.FENCED_MEMBER_EPOCH),
                    (H(group_id="g1", member_id="x", member_epoch=1), ErrorCode.UNKNOWN_MEMBER_ID),
                    (H(group_id="g1", member_id="m", member_epoch=-3), ErrorCode.INVALID_REQUEST),
                    (H(group_id="g1", member_id="n", member_epoch=0, rebalance_timeout_ms=1000,
                       subscribed_topic_names=["t"], topic_partitions=[], server_assignor="sticky"),
                     ErrorCode.UNSUPPORTED_ASSIGNOR)]:
                answer = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, request)
                assert (answer.error_code, answer.member_epoch) == (error, 0) and answer.error_message
            C = messages.OffsetCommitRequest
            stale = connection.call(ApiKey.OFFSET_COMMIT, 9, C(
                group_id="g1", generation_id_or_member_epoch=7, member_id="m", topics=[C.OffsetCommitRequestTopic(
                    name="t", partitions=[C.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])]))
            assert stale.topics[0].partitions[0].error_code == ErrorCode.STALE_MEMBER_EPOCH
            described = connection.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, messages.ConsumerGroupDescribeRequest(
                group_ids=["g1", "none"], include_authorized_operations=False))
            assert [(g.error_code, g.group_state) for g in described.groups] == \
                [(ErrorCode.NONE, "Stable"), (ErrorCode.GROUP_ID_NOT_FOUND, "")]
            assert described.groups[0].members[0].client_host == "/127.0.0.1"
    finally:
        broker.close()


# -- the schemas kmem carries (kafka-python has none for these)

def compact_string(text):
    return bytes([len(text) + 1]) + text.encode()


def test_heartbeat_request_bytes_follow_kafkas_schema():
    topic = uuid.UUID(int=7)
    request = H(group_id="g", member_id="m", member_epoch=3, instance_id=None, rack_id="r", rebalance_timeout_ms=-1,
                subscribed_topic_names=["t"], subscribed_topic_regex="x.*", server_assignor=None,
                topic_partitions=[H.TopicPartitions(topic_id=topic, partitions=[1, 2])])
    header = struct.pack(">hhi", 68, 1, 9) + struct.pack(">h", 1) + b"c" + b"\0"      # request header v2
    body = (compact_string("g") + compact_string("m") + struct.pack(">i", 3) + b"\0" + compact_string("r")
            + struct.pack(">i", -1) + b"\x02" + compact_string("t") + compact_string("x.*") + b"\0"
            + b"\x02" + topic.bytes + b"\x03" + struct.pack(">ii", 1, 2) + b"\0" + b"\0")
    assert bytes(encode_request(request, 1, 9, client_id="c")) == header + body
    # v0 has no SubscribedTopicRegex
    assert bytes(encode_request(request, 0, 9, client_id="c"))[len(header):] == \
        body.replace(compact_string("x.*"), b"")


def test_describe_response_decodes_kafkas_bytes():
    topic = uuid.UUID(int=9)
    assignment = b"\x02" + topic.bytes + compact_string("t") + b"\x02" + struct.pack(">i", 0) + b"\0" + b"\0"
    member = (compact_string("m") + b"\0" + b"\0" + struct.pack(">i", 4) + compact_string("c") + compact_string("/h")
              + b"\x02" + compact_string("t") + b"\0" + assignment + assignment + b"\0")
    group = (struct.pack(">h", 0) + b"\0" + compact_string("g") + compact_string("Stable") + struct.pack(">ii", 4, 4)
             + compact_string("uniform") + b"\x02" + member + struct.pack(">i", -2**31) + b"\0")
    payload = struct.pack(">i", 5) + b"\0" + struct.pack(">i", 0) + b"\x02" + group + b"\0"    # header v1
    _, response = decode_response(payload, ApiKey.CONSUMER_GROUP_DESCRIBE, 0)
    described = response.groups[0]
    assert (described.group_id, described.group_state, described.assignor_name) == ("g", "Stable", "uniform")
    m = described.members[0]
    assert (m.member_id, m.instance_id, m.member_epoch, m.client_host, m.subscribed_topic_names) == \
        ("m", None, 4, "/h", ["t"])
    assert [(tp.topic_id, tp.topic_name, tp.partitions) for tp in m.target_assignment.topic_partitions] == \
        [(topic, "t", [0])]


# -- the other group APIs on a consumer group

def commit(groups, version, member_id, epoch, offset=5):
    C = messages.OffsetCommitRequest
    request = C(group_id=groups.group_id, generation_id_or_member_epoch=epoch, member_id=member_id, topics=[
        C.OffsetCommitRequestTopic(name="t", partitions=[C.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset)])])
    response = groups.coordinator.offset_commit(RequestHeader(ApiKey.OFFSET_COMMIT, version, 1, "c"), request)
    return response.topics[0].partitions[0].error_code


def fetch(groups, member_id, epoch):
    F = messages.OffsetFetchRequest
    topics = [F.OffsetFetchRequestTopics(name="t", partition_indexes=[0])]
    request = F(groups=[F.OffsetFetchRequestGroup(group_id=groups.group_id, member_id=member_id, member_epoch=epoch,
                                                  topics=topics)], require_stable=False)
    group = groups.coordinator.offset_fetch(RequestHeader(ApiKey.OFFSET_FETCH, 9, 1, "c"), request).groups[0]
    return group.error_code, [p.committed_offset for t in group.topics for p in t.partitions]


def test_offsets_are_committed_and_fetched_at_the_member_epoch(groups):
    groups.join("a")
    assert commit(groups, 9, "a", 1) == ErrorCode.NONE
    assert commit(groups, 9, "a", 0) == ErrorCode.STALE_MEMBER_EPOCH
    assert commit(groups, 9, "x", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit(groups, 8, "a", 1) == ErrorCode.UNSUPPORTED_VERSION      # KIP-848 members commit with v9+
    assert commit(groups, 9, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID        # not while the group has members
    assert fetch(groups, "a", 1) == (ErrorCode.NONE, [5])
    assert fetch(groups, "a", 2) == (ErrorCode.STALE_MEMBER_EPOCH, [])
    assert fetch(groups, None, -1) == (ErrorCode.NONE, [5])                # an admin client
    groups.send("a", -1)
    assert commit(groups, 9, "", -1, offset=9) == ErrorCode.NONE           # an empty group takes any commit
    assert fetch(groups, None, -1) == (ErrorCode.NONE, [9])


def test_list_describe_and_delete_a_consumer_group(groups):
    groups.join("a")
    commit(groups, 9, "a", 1)

    def listed(version=5, states=(), types=()):
        request = messages.ListGroupsRequest(states_filter=list(states), types_filter=list(types))
        response = groups.coordinator.list_groups(RequestHeader(ApiKey.LIST_GROUPS, version, 1, "c"), request)
        return [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in response.groups]

    assert listed() == [("g", "consumer", "Stable", "consumer")]
    assert listed(types=["Consumer"]) == listed(states=["stable"]) == listed()
    assert listed(types=["classic"]) == listed(states=["empty"]) == []
    describe = messages.DescribeGroupsRequest(groups=["g"], include_authorized_operations=False)
    described = groups.coordinator.describe_groups(RequestHeader(ApiKey.DESCRIBE_GROUPS, 5, 1, "c"), describe).groups
    # Kafka 3.9's describeGroups: no classic group of that id
    assert [(g.error_code, g.group_state, g.members) for g in described] == [(ErrorCode.NONE, "Dead", [])]

    delete = messages.DeleteGroupsRequest(groups_names=["g"])
    header = RequestHeader(ApiKey.DELETE_GROUPS, 2, 1, "c")
    assert groups.coordinator.delete_groups(header, delete).results[0].error_code == ErrorCode.NON_EMPTY_GROUP
    groups.send("a", -1)
    assert listed() == [("g", "consumer", "Empty", "consumer")]
    assert groups.coordinator.delete_groups(header, delete).results[0].error_code == ErrorCode.NONE
    assert listed() == [] and fetch(groups, None, -1) == (ErrorCode.NONE, [-1])


def test_without_the_consumer_protocol_its_apis_are_neither_advertised_nor_served(tmp_path):
    broker = start_broker(tmp_path, **{"group.coordinator.rebalance.protocols": "classic"})
    try:
        with RawConnection(broker.bootstrap_servers) as connection:
            versions = connection.call(ApiKey.API_VERSIONS, 3, messages.ApiVersionsRequest(
                client_software_name="t", client_software_version="1"))
            served = {v.api_key for v in versions.api_keys}
            assert ApiKey.OFFSET_COMMIT in served and ApiKey.CONSUMER_GROUP_HEARTBEAT not in served
            connection.send_frame(bytes(encode_request(H(group_id="g", member_id="m", member_epoch=1), 1, 2)))
            assert connection.receive_frame() is None          # refused as an API the broker does not serve
    finally:
        broker.close()
    with pytest.raises(ConfigError):
        GroupConfig.from_properties({"group.coordinator.rebalance.protocols": "consumer"})


def test_heartbeats_schedule_nothing_on_the_timer(logs):
    coordinator = GroupCoordinator(logs, GroupConfig(offsets_topic_partitions=3))
    try:
        members = Members(coordinator, logs)
        for name in "abc":
            members.join(name)
        for name in "abc":
            members.beat(name, None)
        scheduled = len(coordinator._timer._heap)
        for _ in range(50):
            for name in "abc":
                members.beat(name, None)
        # the group's one task fires at the earliest session deadline, then moves on: nothing is pushed meanwhile
        assert len(coordinator._timer._heap) == scheduled and len(coordinator._timer) == 1
    finally:
        coordinator.close()


def test_a_regular_expression_subscribes_to_the_topics_it_matches_whole(groups, logs):
    for name in ("orders-eu", "orders-us", "old-orders-eu"):
        logs.create_topic(name, 2)
    groups.join("a", subscribed_topic_names=None, subscribed_topic_regex="orders-(eu|us)")
    resolved = groups.send("a", 1, owned=())                # the regex was resolved after the join: epoch 2
    ids = {protocol_uuid(logs.topics()[name].topic_id) for name in ("orders-eu", "orders-us")}
    assert {tp.topic_id: tp.partitions for tp in resolved.assignment.topic_partitions} == dict.fromkeys(ids, [0, 1])
    logs.create_topic("orders-us-2", 1)                  # not matched whole
    logs.add_partitions("orders-eu", 3)
    grown = groups.send("a", 2, owned=None)                 # the new partition: a new group epoch
    eu = protocol_uuid(logs.topics()["orders-eu"].topic_id)
    assert grown.member_epoch == 3
    assert {tp.topic_id: tp.partitions for tp in grown.assignment.topic_partitions}[eu] == [0, 1, 2]


def test_a_new_regular_expression_is_resolved_after_the_heartbeat_that_brings_it(groups, logs):
    """As Kafka's coordinator (KIP-848, and librdkafka's 0045-subscribe_update counts on it): the heartbeat that
    subscribes to a regex new to the group gets the topics subscribed by name; the matched ones come at the next
    group epoch. A regex every member dropped is forgotten, and resolved anew when subscribed again."""
    logs.create_topic("orders-eu", 2)
    t, eu = (protocol_uuid(logs.topics()[name].topic_id) for name in ("t", "orders-eu"))

    def topics(response):
        return {tp.topic_id: tp.partitions for tp in response.assignment.topic_partitions}

    for _ in range(2):
        joined = groups.join("a", subscribed_topic_names=["t"], subscribed_topic_regex="orders-.*")
        assert topics(joined) == {t: [0, 1, 2, 3]}
        resolved = groups.send("a", joined.member_epoch, owned={0, 1, 2, 3})
        assert (resolved.member_epoch, topics(resolved)) == (joined.member_epoch + 1,
                                                             {t: [0, 1, 2, 3], eu: [0, 1]})
        assert groups.send("a", -1).error_code == ErrorCode.NONE     # leaves: the group forgets the regex
    # a member subscribing to a regex the group has resolved: its target takes the matched topics in at once
    groups.join("a", subscribed_topic_names=[], subscribed_topic_regex="orders-.*")
    assert topics(groups.send("a", groups.epochs["a"], owned=())) == {eu: [0, 1]}
    joined = groups.join("b", subscribed_topic_names=[], subscribed_topic_regex="orders-.*")
    group = groups.coordinator.consumer_groups.groups["g"]
    assert group.epoch == group.assignment_epoch == joined.member_epoch
    assert [len(parts) for parts in group.target["b"].values()] == [1]


@pytest.mark.parametrize("regex", ["(a+)+b", "(x|xx)*y", "(.*)\\1", "orders(?!-eu)", ".*a.*b.*c.*d"])
def test_a_regular_expression_that_could_backtrack_for_ever_is_refused(groups, regex):
    refused = groups.join("a", subscribed_topic_names=None, subscribed_topic_regex=regex)
    assert refused.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION and "refused" in refused.error_message
    assert groups.join("a", subscribed_topic_names=None, subscribed_topic_regex="a" * 1001).error_code == \
        ErrorCode.INVALID_REGULAR_EXPRESSION


def test_offsets_of_a_topic_the_members_subscribe_to_are_not_deleted(groups):
    groups.join("a")
    commit(groups, 9, "a", 1)
    D = messages.OffsetDeleteRequest
    request = D(group_id="g", topics=[D.OffsetDeleteRequestTopic(name="t", partitions=[
        D.OffsetDeleteRequestPartition(partition_index=0)])])
    deleted = groups.coordinator.offset_delete(RequestHeader(ApiKey.OFFSET_DELETE, 0, 1, "c"), request)
    assert deleted.topics[0].partitions[0].error_code == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
    assert fetch(groups, None, -1) == (ErrorCode.NONE, [5])


def test_a_group_that_empties_stays_until_the_retention_check(groups):
    """Kafka's ``getOrMaybeCreateConsumerGroup``: a heartbeat for a group the coordinator does not know is
    GROUP_ID_NOT_FOUND; a group that emptied is kept (its fenced members are UNKNOWN_MEMBER_ID and rejoin) until
    ``offsets.retention.check.interval.ms`` later without offsets, as Kafka's periodic cleanup deletes it."""
    assert groups.send("a", 3, owned={0}).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert groups.send("a", -1).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    groups.join("a")
    assert groups.send("a", -1).error_code == ErrorCode.NONE
    assert groups.send("a", 1, owned={0}).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert groups.describe().group_state == "Empty"
    later = time.monotonic() + groups.coordinator.config.offsets_retention_check_interval_ms / 1000
    groups.coordinator.tick(later, time.time_ns() // 1_000_000 + groups.coordinator.config.
                            offsets_retention_check_interval_ms + 1)
    assert groups.describe().error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert groups.send("a", 1, owned={0}).error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_a_subscription_of_ten_thousand_topics_is_served_over_the_wire(tmp_path):
    """Kafka takes any subscription a request can carry: the topics that do not exist are simply not assigned. The
    connection stays open, the members share the one topic that exists, and the subscription is replaced, not
    added to, by the next heartbeat that carries one."""
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 2)
        names = [f"missing-{i:05d}" for i in range(10_000)] + ["t"]
        with RawConnection(broker.bootstrap_servers) as connection:
            epochs = {}
            for member in ("a", "b"):
                joined = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, H(
                    group_id="g", member_id=member, member_epoch=0, rebalance_timeout_ms=1000,
                    subscribed_topic_names=names, topic_partitions=[]))
                assert joined.error_code == ErrorCode.NONE
                epochs[member] = joined.member_epoch
            group = broker.coordinator.consumer_groups.groups["g"]
            assert len(group.members["a"].topic_names) == len(names)
            narrowed = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, H(
                group_id="g", member_id="a", member_epoch=epochs["a"], subscribed_topic_names=["t"],
                topic_partitions=None))
            assert narrowed.error_code == ErrorCode.NONE
            assert list(group.members["a"].topic_names) == ["t"]
            described = connection.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, messages.ConsumerGroupDescribeRequest(
                group_ids=["g"], include_authorized_operations=False)).groups[0]
            targets = [p for m in described.members for tp in m.target_assignment.topic_partitions
                       for p in tp.partitions]
            assert sorted(targets) == [0, 1]
    finally:
        broker.close()
