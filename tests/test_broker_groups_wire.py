"""The group APIs over the wire at old and new versions, requests and responses coded by kafka-python's
own classes (``kafka.protocol``): a whole membership at v0, retention times of OffsetCommit v2,
ListGroups' state filter, DescribeGroups of an unknown group, FindCoordinator for a transaction."""
import time

from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse
from kafka.protocol.consumer import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
                                     LeaveGroupRequest, LeaveGroupResponse, OffsetCommitRequest,
                                     OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
                                     SyncGroupResponse)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from broker_helpers import RawConnection
from group_helpers import start_broker

NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 22, 25
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


def test_a_membership_at_version_0_and_offsets_with_retention(tmp_path):
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 2)
        connection = RawConnection(broker.bootstrap_servers)
        found = connection.request(FindCoordinatorRequest(key="g"), FindCoordinatorResponse, 0)
        assert (found.error_code, found.node_id, f"{found.host}:{found.port}") == (NONE, 0, broker.bootstrap_servers)
        transaction = connection.request(FindCoordinatorRequest(key="tx", key_type=1), FindCoordinatorResponse, 1)
        assert transaction.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED

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
