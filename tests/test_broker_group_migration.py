"""KIP-848's online migration on the coordinator (requests decoded as the broker hands them over): a consumer-protocol
member joining a classic group upgrades it, its classic members following the consumer group's assignment through
JoinGroup, SyncGroup and Heartbeat; the last consumer-protocol member leaving downgrades it back;
``group.consumer.migration.policy`` refusing either with Kafka's error codes; the classic members' deadlines."""
import pytest

from broker_helpers import RawConnection, wait_for
from group_helpers import start_broker
from kmem.broker.codes import ErrorCode
from kmem.broker.group.coordinator import GroupConfig
from kmem.broker.group.offsets import partition_for, read_key
from kmem.consumer.fetcher import TopicPartition
from kmem.consumer.group import decode_assignment, encode_assignment, encode_sticky_subscription
from kmem.errors import ConfigError
from kmem.protocol import ApiKey, messages
from test_broker_consumer_groups import Members, assignment
from test_broker_groups_coordinator import (  # noqa: F401 (logs: the fixture)
    commit, coordinator, fetch, header, heartbeat, join, join_async, logs, settled, stored_records, sync_request,
)

PARTITIONS = {0, 1, 2, 3}


def subscription(owned=(), rack=None):
    """A ConsumerProtocolSubscription of topic ``t`` owning ``owned``: v2, or v3 with ``rack`` (KIP-881)."""
    v2 = encode_sticky_subscription(["t"], [TopicPartition("t", p) for p in sorted(owned)], [], 1)
    if rack is None:
        return v2
    return b"\x00\x03" + v2[2:] + len(rack).to_bytes(2, "big") + rack.encode()


def protocols(owned=(), names=("range",), rack=None):
    return tuple((name, subscription(owned, rack)) for name in names)


def sync(coord, member_id, generation, assignments=(), protocol_name="range"):
    request = sync_request(member_id, generation, assignments, protocol_name=protocol_name)
    return settled(coord.sync_group(header(ApiKey.SYNC_GROUP, 5), request))


def partitions(response):
    return {tp.partition for tp in decode_assignment(response.assignment)}


def classic_group(coord, shares, names=("range",)):
    """A Stable classic group whose members (one per share) own ``shares`` (lists of partitions); their ids."""
    ids = [join(coord, protocols=protocols(names=names)).member_id for _ in shares]
    waiting = [join_async(coord, member_id=member_id, protocols=protocols(names=names)) for member_id in ids]
    for thread, _ in waiting:
        thread.join(10)
    joined = [result["response"] for _, result in waiting]
    leader = next(r for r in joined if r.leader == r.member_id)
    assignments = [(member_id, encode_assignment([TopicPartition("t", p) for p in share]))
                   for member_id, share in zip(ids, shares)]
    assert sync(coord, leader.member_id, leader.generation_id, assignments, names[0]).error_code == ErrorCode.NONE
    for member_id, share in zip(ids, shares):
        assert partitions(sync(coord, member_id, leader.generation_id, protocol_name=names[0])) == set(share)
    assert coord.groups["g"].state == "Stable"
    return ids


def follow(coord, member_id, owned, names=("range",)):
    """A classic member told to rejoin: it joins owning ``owned`` and syncs; (generation, assigned partitions)."""
    joined = join(coord, member_id=member_id, protocols=protocols(owned, names))
    assert (joined.error_code, joined.protocol_type, joined.protocol_name, joined.leader, joined.members) == \
        (ErrorCode.NONE, "consumer", names[0], "", [])
    synced = sync(coord, member_id, joined.generation_id, protocol_name=names[0])
    assert synced.error_code == ErrorCode.NONE
    return joined.generation_id, partitions(synced)


def group_records(log_dir):
    """Group ``g``'s metadata records in ``__consumer_offsets``: whether each is a tombstone."""
    return [value is None for key, value in stored_records(log_dir, partition_for("g", 3))
            if read_key(key) == ("group", "g")]


def test_upgrade_then_downgrade_keeps_the_members_and_the_offsets(logs, tmp_path):
    coord = coordinator(logs)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        assert commit(coord, {("t", 0): 5}, member_id=a, generation=1) == {("t", 0): ErrorCode.NONE}
        consumers = Members(coord, logs)
        joined = consumers.join("c")
        # a consumer group of the classic group's generation, moved to the next epoch by c
        assert (joined.error_code, joined.member_epoch, assignment(joined)) == (ErrorCode.NONE, 2, set())
        assert "g" in coord.consumer_groups.groups and coord.groups["g"].members == {}
        assert group_records(tmp_path)[-1] is True              # the classic group's record is a tombstone
        described = consumers.describe()
        assert (described.group_state, described.group_epoch) == ("Reconciling", 2)
        assert {m.member_id: m.member_epoch for m in described.members} == {a: 1, b: 1, "c": 2}
        # the classic members learn of the new epoch from their heartbeats, rejoin and sync their share
        owned = {}
        for member_id, before in ((a, {0, 1}), (b, {2, 3})):
            assert heartbeat(coord, member_id, 1) == ErrorCode.REBALANCE_IN_PROGRESS
            generation, owned[member_id] = follow(coord, member_id, ())      # eager: it revoked everything
            assert generation == 2 and owned[member_id] and owned[member_id] <= before     # sticky
            assert heartbeat(coord, member_id, 2) == ErrorCode.NONE
        assert consumers.beat("c", set()) == (2, PARTITIONS - owned[a] - owned[b])
        assert sorted(map(len, owned.values())) == [1, 2]
        assert consumers.describe().group_state == "Stable"
        # offsets: the classic generation is the member epoch; the commit of before is kept
        assert commit(coord, {("t", 1): 7}, member_id=a, generation=2) == {("t", 1): ErrorCode.NONE}
        assert commit(coord, {("t", 1): 8}, member_id=a, generation=1) == {("t", 1): ErrorCode.ILLEGAL_GENERATION}
        assert fetch(coord) == {("t", 0): 5, ("t", 1): 7}

        # the last consumer-protocol member leaves: a classic group again, rebalancing
        assert consumers.send("c", -1).error_code == ErrorCode.NONE
        assert "g" not in coord.consumer_groups.groups
        classic = coord.groups["g"]
        assert (classic.state, classic.generation, classic.protocol_type, set(classic.members)) == \
            ("PreparingRebalance", 2, "consumer", {a, b})
        assert group_records(tmp_path)[-1] is False
        assert heartbeat(coord, a, 2) == ErrorCode.REBALANCE_IN_PROGRESS
        waiting = [join_async(coord, member_id=m, protocols=protocols(owned[m])) for m in (a, b)]
        for thread, _ in waiting:
            thread.join(10)
        rejoined = [result["response"] for _, result in waiting]
        assert {r.generation_id for r in rejoined} == {3}
        leader = next(r for r in rejoined if r.leader == r.member_id)
        assert len(leader.members) == 2
        assert settled(sync(coord, leader.member_id, 3, [(a, encode_assignment([TopicPartition("t", 0)]))])
                       ).error_code == ErrorCode.NONE
        assert classic.state == "Stable" and fetch(coord) == {("t", 0): 5, ("t", 1): 7}
    finally:
        coord.close()


@pytest.mark.parametrize("policy", ["disabled", "upgrade", "downgrade", "bidirectional"])
def test_the_migration_policy(logs, policy):
    coord = coordinator(logs, consumer_migration_policy=policy)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        consumers = Members(coord, logs)
        joined = consumers.join("c")
        if policy in ("disabled", "downgrade"):
            # Kafka's answer: the group is no consumer group; it stays classic, untouched
            assert joined.error_code == ErrorCode.GROUP_ID_NOT_FOUND
            assert "g" not in coord.consumer_groups.groups and set(coord.groups["g"].members) == {a, b}
            assert heartbeat(coord, a, 1) == ErrorCode.NONE
            return
        assert joined.error_code == ErrorCode.NONE
        for member_id in (a, b):
            follow(coord, member_id, ())
        consumers.send("c", -1)
        if policy == "upgrade":
            # no downgrade: a consumer group of classic members, who carry on
            assert set(coord.consumer_groups.groups["g"].members) == {a, b}
            assert heartbeat(coord, a, 2) == ErrorCode.REBALANCE_IN_PROGRESS         # c's partitions are free
            assert follow(coord, a, ())[0] == 3
        else:
            assert "g" not in coord.consumer_groups.groups and coord.groups["g"].state == "PreparingRebalance"
    finally:
        coord.close()


def test_under_disabled_a_new_classic_member_cannot_join_a_consumer_group(logs):
    coord = coordinator(logs, consumer_migration_policy="disabled")
    try:
        Members(coord, logs).join("c")
        refused = join(coord, protocols=protocols())
        assert refused.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL          # Kafka's KAFKA-20640
        assert set(coord.consumer_groups.groups["g"].members) == {"c"}
    finally:
        coord.close()


def test_an_empty_classic_group_becomes_a_consumer_group_whatever_the_policy(logs):
    coord = coordinator(logs, consumer_migration_policy="disabled")
    try:
        (a,) = classic_group(coord, [[0, 1, 2, 3]])
        leave = messages.LeaveGroupRequest(group_id="g", members=[
            messages.LeaveGroupRequest.MemberIdentity(member_id=a, group_instance_id=None, reason=None)])
        coord.leave_group(header(ApiKey.LEAVE_GROUP, 4), leave)
        joined = Members(coord, logs).join("c")
        assert (joined.error_code, assignment(joined)) == (ErrorCode.NONE, PARTITIONS)
    finally:
        coord.close()


def test_only_a_group_of_the_consumer_protocol_type_upgrades(logs):
    coord = coordinator(logs)
    try:
        join(coord, member_id="", protocol_type="connect", protocols=(("default", b"x"),), version=3)
        assert Members(coord, logs).join("c").error_code == ErrorCode.GROUP_ID_NOT_FOUND
    finally:
        coord.close()


def test_the_policy_setting():
    assert GroupConfig().consumer_migration_policy == "bidirectional"                 # Kafka 4.0's default
    assert GroupConfig.from_properties({"group.consumer.migration.policy": "UPGRADE"}).consumer_migration_policy \
        == "upgrade"
    with pytest.raises(ConfigError, match="group.consumer.migration.policy"):
        GroupConfig.from_properties({"group.consumer.migration.policy": "both"})


def test_a_cooperative_member_revokes_before_its_partitions_move(logs):
    coord = coordinator(logs)
    names = ("cooperative-sticky",)
    try:
        (a,) = classic_group(coord, [[0, 1, 2, 3]], names)
        consumers = Members(coord, logs)
        assert consumers.join("c").member_epoch == 2
        assert heartbeat(coord, a, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        # it still owns everything: it is told its assignment without the two it must revoke, at its epoch
        generation, kept = follow(coord, a, PARTITIONS, names)
        assert generation == 1 and len(kept) == 2
        assert consumers.beat("c", set()) == (2, None)                          # not before a revoked them
        assert heartbeat(coord, a, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        assert follow(coord, a, kept, names) == (2, kept)                        # revoked: the group's epoch
        assert heartbeat(coord, a, 2) == ErrorCode.NONE
        assert consumers.beat("c", set()) == (2, PARTITIONS - kept)
    finally:
        coord.close()


def test_classic_members_errors_as_kafka_answers_them(logs):
    coord = coordinator(logs)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        consumers = Members(coord, logs)
        consumers.join("c")
        assert heartbeat(coord, a, 7) == ErrorCode.ILLEGAL_GENERATION
        assert heartbeat(coord, "c", 2) == ErrorCode.UNKNOWN_MEMBER_ID           # it uses the consumer protocol
        assert heartbeat(coord, "nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
        assert join(coord, member_id=a, protocols=protocols(names=("roundrobin",))).error_code == \
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL                               # not every classic member has it
        for unreadable in (b"\x00\x01\x00", b"\x00\x03" + subscription()[2:] + b"\x00"):    # its rack cut short
            assert join(coord, member_id=a, protocols=(("range", unreadable),)).error_code == \
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert join(coord, member_id=a, protocols=protocols(), session_ms=1).error_code == \
            ErrorCode.INVALID_SESSION_TIMEOUT
        S = messages.SyncGroupRequest
        wrong_protocol = S(group_id="g", generation_id=1, member_id=a, group_instance_id=None,
                           protocol_type="consumer", protocol_name="roundrobin", assignments=[])
        assert coord.sync_group(header(ApiKey.SYNC_GROUP, 5), wrong_protocol).error_code == \
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        # a SyncGroup at a stale epoch: the member must rejoin first
        assert sync(coord, a, 1).error_code == ErrorCode.REBALANCE_IN_PROGRESS
        new = join(coord, protocols=protocols())
        assert new.error_code == ErrorCode.MEMBER_ID_REQUIRED
        assert join(coord, member_id=new.member_id, protocols=protocols()).error_code == ErrorCode.NONE
        assert commit(coord, {("t", 0): 1}, member_id="c", generation=2) == {("t", 0): ErrorCode.UNSUPPORTED_VERSION}
        M = messages.LeaveGroupRequest.MemberIdentity
        left = coord.leave_group(header(ApiKey.LEAVE_GROUP, 4), messages.LeaveGroupRequest(group_id="g", members=[
            M(member_id=b, group_instance_id=None, reason=None), M(member_id="c", group_instance_id=None, reason=None),
            M(member_id="", group_instance_id="nobody", reason=None)]))
        assert [m.error_code for m in left.members] == \
            [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.UNKNOWN_MEMBER_ID]
        group = coord.consumer_groups.groups["g"]
        assert b not in group.members and group.epoch == 4                     # one new epoch for the leave
    finally:
        coord.close()


def test_a_classic_member_that_does_not_rejoin_sync_or_heartbeat_in_time_is_fenced(logs):
    coord = coordinator(logs)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        Members(coord, logs).join("c")
        group = coord.consumer_groups.groups["g"]
        now = group.members[a].session_deadline - 6.0           # the classic session timeout: 6 s
        assert heartbeat(coord, a, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        joined = join(coord, member_id=b, protocols=protocols())       # b joins but never syncs
        assert joined.error_code == ErrorCode.NONE
        # the rebalance timeout (2 s) passes: a did not rejoin, b did not sync
        coord.consumer_groups.expire(group, now + 2.5)
        assert set(group.members) == {"c"}
        assert heartbeat(coord, a, 1) == ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        coord.close()


def test_a_classic_members_rack_comes_from_its_subscription(logs):
    coord = coordinator(logs)
    try:
        (a,) = classic_group(coord, [[0, 1, 2, 3]])
        Members(coord, logs).join("c", rack_id="rack-c")
        assert heartbeat(coord, a, 1) == ErrorCode.REBALANCE_IN_PROGRESS
        assert join(coord, member_id=a, protocols=protocols(rack="rack-a")).error_code == ErrorCode.NONE
        described = Members(coord, logs).describe()
        assert {m.member_id: m.rack_id for m in described.members} == {a: "rack-a", "c": "rack-c"}
    finally:
        coord.close()


def test_transactional_commits_of_the_members_of_an_upgraded_group(logs):
    coord = coordinator(logs)
    try:
        (a,) = classic_group(coord, [[0, 1, 2, 3]])
        consumers = Members(coord, logs)
        consumers.join("c")

        def txn_commit(member_id, generation):
            R = messages.TxnOffsetCommitRequest
            request = R(transactional_id="tx", group_id="g", producer_id=1000, producer_epoch=0,
                        generation_id=generation, member_id=member_id, group_instance_id=None,
                        topics=[R.TxnOffsetCommitRequestTopic(name="t", partitions=[R.TxnOffsetCommitRequestPartition(
                            partition_index=0, committed_offset=3, committed_leader_epoch=-1, committed_metadata="")])])
            return coord.txn_offset_commit(header(ApiKey.TXN_OFFSET_COMMIT, 3), request).topics[0].partitions[0] \
                .error_code

        # KIP-447's checks against the member's epoch: the classic member's generation, the other's epoch
        assert txn_commit(a, 1) == txn_commit("c", 2) == ErrorCode.NONE
        assert txn_commit(a, 2) == txn_commit("c", 1) == ErrorCode.ILLEGAL_GENERATION
        assert txn_commit("nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        coord.close()


def test_an_upgrade_during_a_rebalance_answers_the_waiting_requests(logs):
    coord = coordinator(logs)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        thread, result = join_async(coord, member_id=a, protocols=protocols())     # a rejoins, b is to follow
        wait_for(lambda: coord.groups["g"].members[a].join_reply is not None, "a waiting in JoinGroup")
        joined = Members(coord, logs).join("c")
        thread.join(10)
        assert result["response"].error_code == ErrorCode.REBALANCE_IN_PROGRESS   # it joins the consumer group
        assert joined.member_epoch == 2
        # each classic member owns its last assignment meanwhile: c waits for what they give up
        group = coord.consumer_groups.groups["g"]
        assert {m: set().union(*group.members[m].assigned.values()) for m in (a, b)} == {a: {0, 1}, b: {2, 3}}
        assert follow(coord, a, ())[0] == 2
    finally:
        coord.close()


@pytest.mark.parametrize("version", [0, 9])
def test_over_the_wire(tmp_path, version):
    """The classic APIs' oldest and newest versions, answered for a classic member of a consumer group."""
    broker = start_broker(tmp_path)
    try:
        broker.logs.create_topic("t", 4)
        J, S = messages.JoinGroupRequest, messages.SyncGroupRequest
        sync_version = min(version, 5)

        def classic_join(connection, member_id):
            return connection.call(ApiKey.JOIN_GROUP, version, J(
                group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id=member_id,
                group_instance_id="i", protocol_type="consumer", reason=None,
                protocols=[J.JoinGroupRequestProtocol(name="range", metadata=subscription())]))

        def classic_sync(connection, joined, assignments=()):
            return connection.call(ApiKey.SYNC_GROUP, sync_version, S(
                group_id="g", generation_id=joined.generation_id, member_id=joined.member_id, group_instance_id="i",
                protocol_type="consumer", protocol_name="range", assignments=[
                    S.SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments]))

        def classic_heartbeat(connection, joined):
            return connection.call(ApiKey.HEARTBEAT, min(version, 4), messages.HeartbeatRequest(
                group_id="g", generation_id=joined.generation_id, member_id=joined.member_id,
                group_instance_id="i")).error_code

        with RawConnection(broker.bootstrap_servers) as connection:
            first = classic_join(connection, "")
            if first.error_code == ErrorCode.MEMBER_ID_REQUIRED:
                first = classic_join(connection, first.member_id)
            everything = encode_assignment([TopicPartition("t", p) for p in PARTITIONS])
            assert classic_sync(connection, first, [(first.member_id, everything)]).error_code == ErrorCode.NONE
            upgrade = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, messages.ConsumerGroupHeartbeatRequest(
                group_id="g", member_id="c", member_epoch=0, rebalance_timeout_ms=10000,
                subscribed_topic_names=["t"], topic_partitions=[]))
            assert upgrade.error_code == ErrorCode.NONE
            assert classic_heartbeat(connection, first) == ErrorCode.REBALANCE_IN_PROGRESS
            joined = classic_join(connection, first.member_id)
            assert (joined.error_code, joined.generation_id, joined.protocol_name, joined.leader, joined.members) == \
                (ErrorCode.NONE, 2, "range", "", [])
            synced = classic_sync(connection, joined)
            assert synced.error_code == ErrorCode.NONE and len(partitions(synced)) == 2
            left = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, messages.ConsumerGroupHeartbeatRequest(
                group_id="g", member_id="c", member_epoch=-1))
            assert left.error_code == ErrorCode.NONE
            assert classic_heartbeat(connection, joined) == ErrorCode.REBALANCE_IN_PROGRESS      # classic again
            again = classic_join(connection, joined.member_id)
            assert (again.error_code, again.generation_id, again.leader) == (ErrorCode.NONE, 3, joined.member_id)
    finally:
        broker.close()


def test_the_timer_fences_a_silent_classic_member_and_downgrades_when_the_last_consumer_member_expires(logs):
    coord = coordinator(logs, min_session_timeout_ms=100, consumer_session_timeout_ms=500)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        Members(coord, logs).join("c")
        for member_id in (a, b):
            follow(coord, member_id, ())
        silent = join(coord, member_id=b, protocols=protocols(), session_ms=200)     # b's session is 200 ms now
        assert silent.error_code == ErrorCode.NONE
        assert sync(coord, b, silent.generation_id).error_code == ErrorCode.NONE
        group = coord.consumer_groups.groups["g"]
        wait_for(lambda: b not in group.members, "b fenced at its session timeout, with no request")
        # c sends nothing either: at its session timeout the group is classic again, with a alone
        wait_for(lambda: "g" not in coord.consumer_groups.groups, "the downgrade at c's session timeout")
        assert set(coord.groups["g"].members) == {a} and coord.groups["g"].state == "PreparingRebalance"
    finally:
        coord.close()


def test_a_partition_a_client_assignor_gave_twice_goes_to_one_member_on_upgrade(logs):
    coord = coordinator(logs)
    try:
        a, b = classic_group(coord, [[0, 1], [1, 2, 3]])          # partition 1 twice (Kafka's KAFKA-21684)
        assert Members(coord, logs).join("c").error_code == ErrorCode.NONE
        group = coord.consumer_groups.groups["g"]
        held = [set().union(*group.members[m].assigned.values()) for m in (a, b)]
        assert held[0] | held[1] == PARTITIONS and not held[0] & held[1]
    finally:
        coord.close()


def test_an_upgraded_group_and_its_downgrade_survive_a_restart(logs):
    """The classic members of a consumer group are written with their ClassicMemberMetadata (Kafka's tagged field)
    as the upgrade happens: after a restart they are still classic members, who rejoin and sync at the consumer
    group's epoch; after the downgrade the consumer group's records are tombstones, and a restart finds the classic
    group."""
    coord = coordinator(logs)
    try:
        a, b = classic_group(coord, [[0, 1], [2, 3]])
        assert Members(coord, logs).join("c").error_code == ErrorCode.NONE
    finally:
        coord.close()
    coord = coordinator(logs)
    try:
        group = coord.consumer_groups.groups["g"]
        classic = {m.member_id: m.classic for m in group.members.values() if m.classic is not None}
        assert set(classic) == {a, b}
        assert [name for name, _ in classic[a].protocols] == ["range"] and classic[a].session_timeout_ms > 0
        for member_id in (a, b):
            assert heartbeat(coord, member_id, 1) == ErrorCode.REBALANCE_IN_PROGRESS
            assert follow(coord, member_id, ())[0] == 2
        consumers = Members(coord, logs)
        consumers.epochs["c"] = 2
        assert consumers.send("c", -1).error_code == ErrorCode.NONE      # the downgrade
        assert "g" not in coord.consumer_groups.groups
    finally:
        coord.close()
    coord = coordinator(logs)
    try:
        assert "g" not in coord.consumer_groups.groups
        assert set(coord.groups["g"].members) == {a, b}
    finally:
        coord.close()
