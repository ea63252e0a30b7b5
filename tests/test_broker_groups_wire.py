"""The group APIs over the wire at old and new versions, requests and responses coded by kafka-python's
own classes (``kafka.protocol``): a whole membership at v0, retention times of OffsetCommit v2 (up to the
int64 limit, across a restart), ListGroups' state filter, DescribeGroups of an unknown group,
FindCoordinator for a transaction, and the answers of a coordinator whose disk is full."""
import time

import pytest
from kafka.protocol.admin import (DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
                                  DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse)
from kafka.protocol.consumer import (FetchRequest, FetchResponse, HeartbeatRequest, HeartbeatResponse,
                                     JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                     OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
                                     OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from broker_helpers import RawConnection, fail_appends
from group_helpers import start_broker
from kmem.broker.group.offsets import OFFSETS_TOPIC

NONE, NOT_COORDINATOR, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 16, 22, 25


def test_a_membership_at_version_0_and_offsets_with_retention(tmp_path):
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 2)
        connection = RawConnection(broker.bootstrap_servers)
        found = connection.request(FindCoordinatorRequest(key="g"), FindCoordinatorResponse, 0)
        assert (found.error_code, found.node_id, f"{found.host}:{found.port}") == (NONE, 0, broker.bootstrap_servers)
        transaction = connection.request(FindCoordinatorRequest(key="tx", key_type=1), FindCoordinatorResponse, 1)
        assert (transaction.error_code, transaction.node_id, transaction.port) == (NONE, 0, found.port)

        joined = connection.request(JoinGroupRequest(
            group_id="g", session_timeout_ms=6000, member_id="", protocol_type="consumer",
            protocols=[("range", b"meta")]), JoinGroupResponse, 0)          # v0: no MEMBER_ID_REQUIRED
        member = joined.member_id
        assert joined.error_code == NONE and joined.generation_id == 1 and joined.leader == member
        assert [(m.member_id, m.metadata) for m in joined.members] == [(member, b"meta")]
        synced = connection.request(SyncGroupRequest(group_id="g", generation_id=1, member_id=member,
                                                     assignments=[(member, b"both")]), SyncGroupResponse, 0)
        assert (synced.error_code, synced.assignment) == (NONE, b"both")
        assert connection.request(HeartbeatRequest(group_id="g", generation_id=1, member_id=member),
                                  HeartbeatResponse, 0).error_code == NONE
        assert connection.request(HeartbeatRequest(group_id="g", generation_id=7, member_id=member),
                                  HeartbeatResponse, 0).error_code == ILLEGAL_GENERATION

        committed = connection.request(OffsetCommitRequest(
            group_id="g", generation_id_or_member_epoch=1, member_id=member, retention_time_ms=60_000,
            topics=[("t", [(0, 5, "x"), (1, 6, None)])]), OffsetCommitResponse, 2)
        assert [p.error_code for p in committed.topics[0].partitions] == [NONE, NONE]
        expire = broker.coordinator.groups["g"].offsets[("t", 0)].expire_timestamp
        assert abs(expire - (time.time() * 1000 + 60_000)) < 30_000               # the retention asked for
        fetched = connection.request(OffsetFetchRequest(group_id="g", topics=[("t", [0, 1])]), OffsetFetchResponse, 1)
        assert [(p.partition_index, p.committed_offset, p.metadata) for p in fetched.topics[0].partitions] == \
            [(0, 5, "x"), (1, 6, "")]

        listed = connection.request(ListGroupsRequest(states_filter=["stable"]), ListGroupsResponse, 4)
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Stable")]
        assert connection.request(ListGroupsRequest(states_filter=["Empty"]), ListGroupsResponse, 4).groups == []
        described = connection.request(DescribeGroupsRequest(groups=["g", "nope"]), DescribeGroupsResponse, 0)
        assert [(g.group_id, g.group_state, len(g.members)) for g in described.groups] == [("g", "Stable", 1),
                                                                                         ("nope", "Dead", 0)]
        assert described.groups[0].members[0].member_assignment == b"both"
        assert described.groups[0].members[0].client_host == "/127.0.0.1"      # as Kafka shows it

        left = connection.request(LeaveGroupRequest(group_id="g", member_id=member), LeaveGroupResponse, 0)
        assert left.error_code == NONE
        assert connection.request(LeaveGroupRequest(group_id="g", member_id=member), LeaveGroupResponse, 0
                                  ).error_code == UNKNOWN_MEMBER_ID
        listed = connection.request(ListGroupsRequest(states_filter=["Empty"]), ListGroupsResponse, 4)
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Empty")]
    finally:
        broker.close()


@pytest.mark.parametrize("how", ["result", "raise"])
def test_a_full_disk_answers_not_coordinator_and_keeps_what_was_committed(tmp_path, monkeypatch, how):
    """Kafka maps a storage error of ``__consumer_offsets`` to NOT_COORDINATOR (clients look the coordinator
    up again and retry), for offset commits and group metadata alike; nothing half-written is kept."""
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 1)
        connection = RawConnection(broker.bootstrap_servers)
        connection.request(FindCoordinatorRequest(key="g"), FindCoordinatorResponse, 0)   # creates the topic
        assert commit(connection, "solo", 5) == NONE
        joined = connection.request(JoinGroupRequest(
            group_id="g", session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="", group_instance_id="i",
            protocol_type="consumer", protocols=[("range", b"meta")]), JoinGroupResponse, 5)
        member = joined.member_id
        assert joined.error_code == NONE

        fail_appends(monkeypatch, broker.logs, OFFSETS_TOPIC, how)
        assert commit(connection, "solo", 6) == NOT_COORDINATOR
        assert committed(connection, "solo") == 5
        synced = connection.request(SyncGroupRequest(group_id="g", generation_id=1, member_id=member,
                                                     group_instance_id="i", assignments=[(member, b"all")]),
                                    SyncGroupResponse, 3)
        assert synced.error_code == NOT_COORDINATOR                 # the assignment was not stored
        deleted = connection.request(DeleteGroupsRequest(groups_names=["solo"]), DeleteGroupsResponse, 2)
        assert deleted.results[0].error_code == NOT_COORDINATOR
        assert committed(connection, "solo") == 5

        monkeypatch.undo()
        assert commit(connection, "solo", 7) == NONE
        assert committed(connection, "solo") == 7
    finally:
        broker.close()


def commit(connection, group, offset, version=8):
    committed = connection.request(OffsetCommitRequest(group_id=group, topics=[("t", [(0, offset, -1, None)])]),
                                   OffsetCommitResponse, version)
    return committed.topics[0].partitions[0].error_code


def committed(connection, group):
    fetched = connection.request(OffsetFetchRequest(group_id=group, topics=[("t", [0])]), OffsetFetchResponse, 7)
    return fetched.topics[0].partitions[0].committed_offset


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_commit_time_or_retention_at_the_int64_limit_is_kept_for_ever_across_a_restart(tmp_path, version):
    """OffsetCommit v1's commit timestamp, or v2-4's retention time, at Long.MAX_VALUE: Kafka accepts it; the
    expiry is capped at the largest timestamp a record holds, and the broker's deadlines keep running."""
    int64_max = 2**63 - 1
    if version == 1:
        request = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                      topics=[("t", [(0, 5, int64_max, "x")])])
    else:
        request = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                      retention_time_ms=int64_max, topics=[("t", [(0, 5, "x")])])
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 1)
        with RawConnection(broker.bootstrap_servers) as connection:
            committed_ = connection.request(request, OffsetCommitResponse, version)
            assert committed_.topics[0].partitions[0].error_code == NONE
            assert committed(connection, "g") == 5
            assert long_poll(connection) == NONE
    finally:
        broker.close()
    broker = start_broker(tmp_path)
    try:
        assert broker.coordinator.groups["g"].offsets[("t", 0)].expire_timestamp == int64_max
        with RawConnection(broker.bootstrap_servers) as connection:
            assert committed(connection, "g") == 5
            assert long_poll(connection) == NONE
    finally:
        broker.close()


def long_poll(connection):
    """A Fetch without data, answered at its max wait by the broker's timer."""
    request = FetchRequest(replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=1 << 20, topics=[
        FetchRequest.FetchTopic(topic="t", partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
    return connection.request(request, FetchResponse, 4).responses[0].partitions[0].error_code


def test_a_static_member_named_with_the_longest_instance_id_joins_and_is_stored(tmp_path):
    """The member id is the instance id, "-" and a uuid: cut to the 32767 bytes of a protocol string."""
    instance = "é" * (32766 // 2) + "i"                              # 32767 bytes, two-byte characters
    broker = start_broker(tmp_path)
    try:
        with RawConnection(broker.bootstrap_servers) as connection:
            connection.request(FindCoordinatorRequest(key="g"), FindCoordinatorResponse, 0)
            joined = connection.request(JoinGroupRequest(
                group_id="g", session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="",
                group_instance_id=instance, protocol_type="consumer", protocols=[("range", b"meta")]),
                JoinGroupResponse, 5)
            member = joined.member_id
            assert joined.error_code == NONE and len(member.encode()) <= 32767
            assert member.startswith("é" * 100) and member.rsplit("-", 5)[0] == instance[:len(member) - 37]
            synced = connection.request(SyncGroupRequest(group_id="g", generation_id=1, member_id=member,
                                                         group_instance_id=instance, assignments=[(member, b"all")]),
                                        SyncGroupResponse, 3)
            assert (synced.error_code, synced.assignment) == (NONE, b"all")
    finally:
        broker.close()
    broker = start_broker(tmp_path)
    try:
        assert list(broker.coordinator.groups["g"].members) == [member]
    finally:
        broker.close()
