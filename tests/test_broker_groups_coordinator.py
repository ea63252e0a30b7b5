"""The group coordinator's state machine driven directly (requests decoded as the broker would hand
them over): Kafka's error codes for wrong generations and members, a SyncGroup from a non-leader,
JoinGroup storms, session expiry without requests, static membership, the initial rebalance delay,
and committed offsets as Kafka's ``__consumer_offsets`` records (layout, expiry, compaction by the log cleaner,
reload)."""
import queue
import struct
import threading
import time
import tracemalloc

import pytest

from broker_helpers import fail_appends
from kmem.broker import LogManager
from kmem.broker.group.coordinator import DelayedResponse, GroupConfig, GroupCoordinator
from kmem.broker.group.offsets import OFFSETS_TOPIC, java_string_hash, offset_commit_key, partition_for
from kmem.protocol import ApiKey, RequestHeader, messages
from kmem.records import FileRecords, log_segments

NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_COORDINATOR, INVALID_COMMIT_OFFSET_SIZE = 0, 3, 16, 28
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS = 22, 25, 27
INVALID_SESSION_TIMEOUT, MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID = 26, 79, 82
INCONSISTENT_GROUP_PROTOCOL = 23
J = messages.JoinGroupRequest


@pytest.fixture
def logs(tmp_path):
    with LogManager(tmp_path) as manager:
        manager.create_topic("t", 4)
        yield manager


def coordinator(logs, **settings):
    config = GroupConfig(**{"initial_rebalance_delay_ms": 0, "offsets_topic_partitions": 3, **settings})
    return GroupCoordinator(logs, config)


def settled(result, timeout=10):
    """A response, waiting for it if the coordinator answered with a DelayedResponse (as a client would)."""
    if not isinstance(result, DelayedResponse):
        return result
    answered = queue.SimpleQueue()
    result.start(lambda build: answered.put(build()))
    return answered.get(timeout=timeout)


def header(api_key, version, client_id="c"):
    return RequestHeader(api_key, version, 1, client_id)


def join_request(member_id="", instance_id=None, protocols=(("range", b"sub"),), session_ms=6000, rebalance_ms=2000,
                 group="g", protocol_type="consumer"):
    return J(group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms, member_id=member_id,
             group_instance_id=instance_id, protocol_type=protocol_type, reason=None,
             protocols=[J.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols])


def join(coord, version=7, **kwargs):
    return settled(coord.join_group(header(ApiKey.JOIN_GROUP, version), join_request(**kwargs)))


def join_new_member(coord, **kwargs):
    """KIP-394: the id first, then the real join."""
    first = join(coord, **kwargs)
    assert first.error_code == MEMBER_ID_REQUIRED
    return join(coord, member_id=first.member_id, **kwargs)


def join_async(coord, **kwargs):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("response", join(coord, **kwargs)))
    thread.start()
    return thread, result


def sync_request(member_id, generation, assignments=(), instance_id=None, group="g", protocol_name="range"):
    S = messages.SyncGroupRequest
    return S(group_id=group, generation_id=generation, member_id=member_id, group_instance_id=instance_id,
             protocol_type="consumer", protocol_name=protocol_name,
             assignments=[S.SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments])


def sync(coord, member_id, generation, assignments=(), instance_id=None, version=5, group="g"):
    request = sync_request(member_id, generation, assignments, instance_id, group)
    return settled(coord.sync_group(header(ApiKey.SYNC_GROUP, version), request))


def heartbeat(coord, member_id, generation, instance_id=None, version=4, group="g"):
    request = messages.HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id,
                                        group_instance_id=instance_id)
    return coord.heartbeat(header(ApiKey.HEARTBEAT, version), request).error_code


def commit(coord, offsets, member_id="", generation=-1, version=8, group="g", instance_id=None):
    R = messages.OffsetCommitRequest
    topics = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(R.OffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="m"))
    request = R(group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=instance_id, retention_time_ms=-1,
                topics=[R.OffsetCommitRequestTopic(name=t, partitions=p) for t, p in topics.items()])
    response = coord.offset_commit(header(ApiKey.OFFSET_COMMIT, version), request)
    return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def fetch(coord, group="g", version=7):
    """The group's committed offsets (all of them: topics null); from v8 (KIP-709) asked in the groups list."""
    R = messages.OffsetFetchRequest
    if version < 8:
        request = R(group_id=group, topics=None, require_stable=False)
    else:
        request = R(groups=[R.OffsetFetchRequestGroup(group_id=group, member_id=None, member_epoch=-1, topics=None)],
                    require_stable=False)
    response = coord.offset_fetch(header(ApiKey.OFFSET_FETCH, version), request)
    if version >= 8:
        assert response.groups[0].error_code == NONE
        response = response.groups[0]
    else:
        assert response.error_code == NONE
    return {(t.name, p.partition_index): p.committed_offset for t in response.topics for p in t.partitions}


def stable_pair(coord):
    """Two members, generation 2, the first leads and assigned; returns (leader id, follower id)."""
    leader = join_new_member(coord)
    assert leader.error_code == NONE and leader.generation_id == 1
    assert sync(coord, leader.member_id, 1, [(leader.member_id, b"all")]).assignment == b"all"
    thread, result = join_async(coord)            # a newcomer: MEMBER_ID_REQUIRED first
    thread.join(10)
    follower_id = result["response"].member_id
    thread, result = join_async(coord, member_id=follower_id)
    assert _wait(lambda: heartbeat(coord, leader.member_id, 1) == REBALANCE_IN_PROGRESS)
    again = join(coord, member_id=leader.member_id)
    thread.join(10)
    assert again.generation_id == result["response"].generation_id == 2
    assert again.leader == leader.member_id and len(again.members) == 2 and result["response"].members == []
    return leader.member_id, follower_id


def _wait(condition, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_wrong_generation_member_or_group_get_kafkas_errors(logs):
    coord = coordinator(logs)
    try:
        leader, follower = stable_pair(coord)
        assert heartbeat(coord, "nobody", 2) == UNKNOWN_MEMBER_ID
        assert coord.heartbeat(header(ApiKey.HEARTBEAT, 0), messages.HeartbeatRequest(
            group_id="other", generation_id=1, member_id=leader)).error_code == UNKNOWN_MEMBER_ID
        assert sync(coord, follower, 1).error_code == ILLEGAL_GENERATION
        assert sync(coord, "nobody", 2).error_code == UNKNOWN_MEMBER_ID
        assert commit(coord, {("t", 0): 5}, leader, 1) == {("t", 0): ILLEGAL_GENERATION}
        assert commit(coord, {("t", 0): 5}, "nobody", 2) == {("t", 0): UNKNOWN_MEMBER_ID}
        assert commit(coord, {("t", 0): 5}, follower, 2) == {("t", 0): REBALANCE_IN_PROGRESS}   # not synced yet
        assert join(coord, session_ms=10).error_code == INVALID_SESSION_TIMEOUT
        assert join(coord, protocols=(("other", b""),)).error_code == INCONSISTENT_GROUP_PROTOCOL
    finally:
        coord.close()


def test_only_the_leaders_assignment_counts(logs):
    coord = coordinator(logs)
    try:
        leader, follower = stable_pair(coord)
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault(
            "follower", sync(coord, follower, 2, [(follower, b"mine"), (leader, b"nothing")])))
        thread.start()
        assert _wait(lambda: coord.groups["g"].members[follower].sync_reply is not None)
        assert "follower" not in result                          # it waits for the leader
        assert sync(coord, leader, 2, [(leader, b"L"), (follower, b"F")]).assignment == b"L"
        thread.join(10)
        assert result["follower"].error_code == NONE and result["follower"].assignment == b"F"
        assert heartbeat(coord, follower, 2) == NONE
        assert commit(coord, {("t", 1): 7, ("missing", 0): 1}, follower, 2) == {
            ("t", 1): NONE, ("missing", 0): UNKNOWN_TOPIC_OR_PARTITION}
        assert fetch(coord) == {("t", 1): 7}
    finally:
        coord.close()


def test_session_expiry_rebalances_without_any_request(logs):
    coord = coordinator(logs)
    try:
        leader, follower = stable_pair(coord)
        sync_thread = threading.Thread(target=sync, args=(coord, follower, 2))
        sync_thread.start()
        assert sync(coord, leader, 2, [(leader, b"L"), (follower, b"F")]).error_code == NONE
        sync_thread.join(10)
        # the follower goes silent; the leader keeps heartbeating; the timer thread removes the follower
        assert _wait(lambda: heartbeat(coord, leader, 2) == REBALANCE_IN_PROGRESS, timeout=9)
        group = coord.groups["g"]
        assert follower not in group.members
        again = join(coord, member_id=leader)
        assert again.generation_id == 3 and [m.member_id for m in again.members] == [leader]
    finally:
        coord.close()


def test_a_silent_member_holds_a_rebalance_for_its_session_timeout_not_the_rebalance_timeout(logs):
    """Kafka's hasSatisfiedHeartbeat: during PreparingRebalance a member that neither rejoins nor heartbeats
    is removed at its session timeout and the join completes; one waiting in JoinGroup is kept."""
    coord = coordinator(logs)
    try:
        silent = join_new_member(coord, rebalance_ms=300_000)        # kafka-python's max.poll.interval.ms
        assert sync(coord, silent.member_id, 1, [(silent.member_id, b"all")]).error_code == NONE
        newcomer_id = join(coord, rebalance_ms=300_000).member_id        # MEMBER_ID_REQUIRED
        thread, result = join_async(coord, member_id=newcomer_id, rebalance_ms=300_000)
        assert _wait(lambda: coord.groups["g"].state == "PreparingRebalance")
        coord.tick(time.monotonic() + 7)                  # one session timeout (6 s) later: not a rebalance timeout
        thread.join(10)
        assert "response" in result, "the join still waits for the silent member"
        answered = result["response"]
        assert answered.error_code == NONE and answered.generation_id == 2 and answered.leader == newcomer_id
        assert [m.member_id for m in answered.members] == [newcomer_id]
        assert list(coord.groups["g"].members) == [newcomer_id]
    finally:
        coord.close()


def test_member_ids_handed_out_by_a_join_storm_expire(logs):
    coord = coordinator(logs)
    try:
        def storm(count):
            # a session of a minute: however slow the machine, none expires before the tick
            assert all(join(coord, session_ms=60_000).error_code == MEMBER_ID_REQUIRED for _ in range(count))
            assert len(coord.groups["g"].pending) == count
            coord.tick(time.monotonic() + 61)                     # one session timeout later
            assert "g" not in coord.groups                        # it never had a generation

        storm(100)                                                # warm-up: the group and its topic exist
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        storm(5000)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert grown < 64 * 1024                                  # 5000 pending ids hold ~1 MB while pending
        assert join_new_member(coord).generation_id == 1          # the group still works
    finally:
        coord.close()


def test_a_join_storm_over_many_group_ids_leaves_nothing_behind(logs):
    coord = coordinator(logs)
    try:
        for i in range(1000):
            request = join_request()
            request.group_id = f"storm-{i}"
            assert coord.join_group(header(ApiKey.JOIN_GROUP, 7), request).error_code == MEMBER_ID_REQUIRED
        assert len(coord.groups) == 1000
        coord.tick(time.monotonic() + 7)
        assert coord.groups == {}
    finally:
        coord.close()


def test_waiting_joins_hold_no_thread_and_are_answered_by_the_rebalance(logs):
    """JoinGroups during the initial delay are parked DelayedResponses, however many: a thousand wait at
    once with no thread each, the coordinator keeps answering, and the rebalance answers every one."""
    # Each join restarts the delay, up to the members' rebalance timeout from the first join (Kafka's
    # InitialDelayedJoin): a long timeout, and 2 s between two joins, keep them in one rebalance on a loaded machine.
    coord = coordinator(logs, initial_rebalance_delay_ms=2000)
    try:
        threads_before = threading.active_count()
        parked = [coord.join_group(header(ApiKey.JOIN_GROUP, 3), join_request(rebalance_ms=120_000))
                  for _ in range(1000)]
        assert all(isinstance(p, DelayedResponse) for p in parked)    # v3: no member id round-trip
        assert threading.active_count() == threads_before
        assert coord.describe_groups(header(ApiKey.DESCRIBE_GROUPS, 5), messages.DescribeGroupsRequest(
            groups=["g"], include_authorized_operations=False)).groups[0].group_state == "PreparingRebalance"
        answered = [settled(p) for p in parked]                         # the timer completes the join
        assert {r.error_code for r in answered} == {NONE} and {r.generation_id for r in answered} == {1}
        assert sum(r.leader == r.member_id for r in answered) == 1
    finally:
        coord.close()


def test_close_answers_parked_joins_coordinator_not_available(logs):
    coord = coordinator(logs, initial_rebalance_delay_ms=60_000)
    parked = coord.join_group(header(ApiKey.JOIN_GROUP, 3), join_request())
    assert isinstance(parked, DelayedResponse)
    coord.close()
    assert settled(parked, timeout=1).error_code == 15             # COORDINATOR_NOT_AVAILABLE


def test_static_member_rejoining_fences_its_old_id(logs):
    coord = coordinator(logs)
    try:
        first = join(coord, instance_id="app-1")                  # static members skip MEMBER_ID_REQUIRED
        assert first.error_code == NONE and first.member_id.startswith("app-1-")
        assert sync(coord, first.member_id, 1, [(first.member_id, b"A")], instance_id="app-1").assignment == b"A"
        second = join(coord, instance_id="app-1")                 # restarted without its member id
        assert second.error_code == NONE and second.member_id != first.member_id
        assert heartbeat(coord, first.member_id, second.generation_id, "app-1") == FENCED_INSTANCE_ID
    finally:
        coord.close()


def test_initial_rebalance_delay_gathers_members(logs):
    coord = coordinator(logs, initial_rebalance_delay_ms=400)
    try:
        started = time.monotonic()
        a = join(coord)
        thread_a, result_a = join_async(coord, member_id=a.member_id)
        b = join(coord)
        thread_b, result_b = join_async(coord, member_id=b.member_id)
        thread_a.join(10)
        thread_b.join(10)
        assert time.monotonic() - started >= 0.4
        assert result_a["response"].generation_id == result_b["response"].generation_id == 1
        assert len(result_a["response"].members) == 2           # one generation for both
    finally:
        coord.close()


def stored_records(log_dir, partition):
    records = []
    for _, path in log_segments(str(log_dir / f"{OFFSETS_TOPIC}-{partition}")):
        with FileRecords(path) as file:
            records.extend((r.key, r.value) for b in file.batches() for r in b)
    return records


def test_offsets_are_kafka_records_in_consumer_offsets(logs, tmp_path):
    assert java_string_hash("hello") == 99162322 and java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert partition_for("polygenelubricants", 50) == 0            # hashCode is Integer.MIN_VALUE
    coord = coordinator(logs)
    try:
        assert commit(coord, {("t", 2): 42}) == {("t", 2): NONE}   # a group that only commits
    finally:
        coord.close()
    key, value = stored_records(tmp_path, partition_for("g", 3))[-1]
    assert key == struct.pack(">hh1sh1si", 1, 1, b"g", 1, b"t", 2)
    version, offset, epoch, size = struct.unpack_from(">hqih", value)
    assert (version, offset, epoch, value[16:16 + size]) == (3, 42, -1, b"m")
    assert abs(struct.unpack_from(">q", value, 16 + size)[0] - time.time() * 1000) < 60_000
    assert len(value) == 16 + size + 8


def test_offsets_and_generation_survive_a_restart(tmp_path):
    from kmem.broker import BrokerConfig
    with LogManager(tmp_path, BrokerConfig(log_retention_bytes=1, log_retention_ms=1)) as logs:
        logs.create_topic("t", 4)
        coord = coordinator(logs, offsets_topic_segment_bytes=400)       # a segment every few commits
        leader = join_new_member(coord)
        sync(coord, leader.member_id, 1, [(leader.member_id, b"A")])
        for offset in range(5):
            assert commit(coord, {("t", 0): offset}, leader.member_id, 1) == {("t", 0): NONE}
        assert commit(coord, {("t", 0): 10, ("t", 3): 30}, leader.member_id, 1) == {("t", 0): NONE, ("t", 3): NONE}
        logs.maintain(int(time.time() * 1000) + 86_400_000)    # the broker's retention leaves the topic alone
        coord.close()
    with LogManager(tmp_path) as logs:
        coord = coordinator(logs)
        try:
            assert fetch(coord) == {("t", 0): 10, ("t", 3): 30}
            group = coord.groups["g"]
            assert group.state == "Stable" and group.generation == 1 and list(group.members) == [leader.member_id]
            assert heartbeat(coord, leader.member_id, 1) == NONE           # the member carries on
            assert sync(coord, leader.member_id, 1).assignment == b"A"
        finally:
            coord.close()


def test_expired_offsets_become_tombstones_and_the_group_goes(tmp_path):
    with LogManager(tmp_path) as logs:
        logs.create_topic("t", 4)
        coord = coordinator(logs, offsets_retention_minutes=1)
        commit(coord, {("t", 0): 10})
        assert coord.expire_offsets() == 0
        assert coord.expire_offsets(int(time.time() * 1000) + 61_000) == 1
        assert "g" not in coord.groups and fetch(coord) == {}
        coord.close()
        key, value = stored_records(tmp_path, partition_for("g", 3))[-1]
        assert value is None and key == struct.pack(">hh1s", 2, 1, b"g")   # the group's tombstone last
    with LogManager(tmp_path) as logs:
        coord = coordinator(logs)
        try:
            assert "g" not in coord.groups and fetch(coord) == {}
        finally:
            coord.close()


def cleaning(**settings):
    """A log directory's settings with a small key map for the log cleaner (the default takes 128 MiB)."""
    from kmem.broker import BrokerConfig
    return BrokerConfig.from_properties(log_cleaner_dedupe_buffer_size=24 * 1000, **settings)


@pytest.mark.parametrize("made_by_older_kmem", [False, True])
def test_the_log_cleaner_keeps_the_offsets_topic_bounded(tmp_path, made_by_older_kmem):
    """``__consumer_offsets`` is compacted by the log cleaner (cleanup.policy=compact), also when an older kmem
    made it with retention.ms=-1 and compacted it itself: the latest commit stays at its offset."""
    with LogManager(tmp_path, cleaning()) as logs:
        logs.create_topic("t", 4)
        if made_by_older_kmem:
            logs.create_topic(OFFSETS_TOPIC, 3, {"segment.bytes": 4096, "retention.ms": -1, "retention.bytes": -1})
        coord = coordinator(logs, offsets_topic_segment_bytes=4096)
        commit(coord, {("t", 0): 0})
        assert logs.topics()[OFFSETS_TOPIC].configs["cleanup.policy"] == "compact"
        partition = logs.get_partition(OFFSETS_TOPIC, partition_for("g", 3))
        sizes = []
        for i in range(400):
            commit(coord, {("t", 0): i, ("t", 1): 2 * i})
            if i % 100 == 99:
                sizes.append(partition.size_in_bytes)
                last_commit = partition.log_end_offset - 2
                assert logs.cleaner.clean_filthiest()[0] == (OFFSETS_TOPIC, partition_for("g", 3))
                assert partition.size_in_bytes < 4096 + 512     # the active segment and the latest commit
                assert partition.read(last_commit, 1 << 20).records is not None
        assert min(sizes) > 4096
        coord.close()
    with LogManager(tmp_path, cleaning()) as logs:
        coord = coordinator(logs)
        try:
            assert logs.topics()[OFFSETS_TOPIC].configs["cleanup.policy"] == "compact"
            assert fetch(coord) == {("t", 0): 399, ("t", 1): 798}
        finally:
            coord.close()


def test_tombstones_of_expired_offsets_and_groups_are_cleaned_away_after_delete_retention(tmp_path):
    day = 86_400_000
    with LogManager(tmp_path, cleaning(log_cleaner_min_cleanable_ratio=0.01)) as logs:
        logs.create_topic("t", 4)
        coord = coordinator(logs, offsets_retention_minutes=1)
        index = partition_for("g", 3)
        neighbour = next(g for g in (f"h{i}" for i in range(100)) if partition_for(g, 3) == index)
        commit(coord, {("t", 0): 10})
        commit(coord, {("t", 1): 5}, group=neighbour)
        now = int(time.time() * 1000)
        assert coord.expire_offsets(now + 61_000) == 2
        partition = logs.get_partition(OFFSETS_TOPIC, index)
        partition.roll()
        assert logs.cleaner.clean_filthiest(now)[0] == (OFFSETS_TOPIC, index)
        group_tombstone = struct.pack(">hh1s", 2, 1, b"g")
        assert (group_tombstone, None) in stored_records(tmp_path, index)         # kept delete.retention.ms
        commit(coord, {("t", 2): 7}, group=neighbour)                             # something new to clean
        partition.roll()
        assert logs.cleaner.clean_filthiest(now + day + 1)[0] == (OFFSETS_TOPIC, index)
        remaining = stored_records(tmp_path, index)
        assert [key for key, _ in remaining] == [offset_commit_key(neighbour, "t", 2)]   # no tombstone left
        assert remaining[0][1] is not None
        coord.close()
    with LogManager(tmp_path, cleaning()) as logs:
        coord = coordinator(logs)
        try:
            assert "g" not in coord.groups and fetch(coord) == {}
            assert fetch(coord, neighbour) == {("t", 2): 7}
        finally:
            coord.close()


@pytest.mark.parametrize("name, value", [("offsets.topic.num.partitions", 0), ("group.max.size", "many"),
                                         ("group.initial.rebalance.delay.ms", -1)])
def test_bad_group_settings_raise_config_error_naming_them(tmp_path, name, value):
    from kmem.broker import Broker
    from kmem.errors import ConfigError
    with pytest.raises(ConfigError, match=name):
        Broker(tmp_path, properties={name: value})


def test_deadlines_fire_on_their_own_without_any_request(logs):
    """No tick, no request: the group's timer task expires a silent member at its session timeout and
    empties the group, which goes one offsets.retention.check.interval.ms later (it has no offsets); a
    member that heartbeats stays."""
    coord = coordinator(logs, min_session_timeout_ms=100, offsets_retention_check_interval_ms=500)
    try:
        silent = join(coord, version=3, session_ms=500)              # v3: no member id round-trip
        assert silent.error_code == NONE
        assert sync(coord, silent.member_id, 1, [(silent.member_id, b"a")]).error_code == NONE
        assert coord.groups["g"].timer_task is not None
        assert _wait(lambda: coord.groups["g"].state == "Empty" and not coord.groups["g"].members)
        assert _wait(lambda: "g" not in coord.groups)

        alive = join(coord, version=3, session_ms=1000)
        assert sync(coord, alive.member_id, alive.generation_id, [(alive.member_id, b"a")]).error_code == NONE
        deadline = time.monotonic() + 3.0                                 # three session timeouts
        while time.monotonic() < deadline:
            assert heartbeat(coord, alive.member_id, alive.generation_id) == NONE
            time.sleep(0.1)
        assert list(coord.groups["g"].members) == [alive.member_id]
    finally:
        coord.close()


def test_an_idle_coordinator_schedules_one_task_per_group_and_scans_nothing(logs):
    """Thousands of groups with offsets: each has one timer task (its offsets' expiry, days away), and
    time passing runs none of them."""
    coord = coordinator(logs)
    try:
        for i in range(2000):
            assert commit(coord, {("t", 0): i}, group=f"g{i}") == {("t", 0): NONE}
        tasks = {id(group.timer_task) for group in coord.groups.values()}
        assert len(coord.groups) == 2000 and len(tasks) == 2000 and None not in tasks
        assert len(coord._timer) == 2000
        checked = []
        real_check = coord._check_group
        coord._check_group = lambda *args: checked.append(args) or real_check(*args)
        time.sleep(0.2)
        assert checked == []
    finally:
        coord.close()


def test_the_brokers_log_cleaner_compacts_the_offsets_topic(tmp_path):
    """The broker's log cleaner thread compacts __consumer_offsets; the group coordinator writes only."""
    from kmem.broker import Broker

    with Broker(tmp_path / "logs", properties={"log.cleaner.backoff.ms": "50",
                                              "log.cleaner.dedupe.buffer.size": str(24 * 1000),
                                              "offsets.topic.segment.bytes": "4096",
                                              "offsets.topic.num.partitions": "3"}) as broker:
        broker.logs.create_topic("t", 2)
        for i in range(200):
            assert commit(broker.coordinator, {("t", 0): i, ("t", 1): 2 * i}) == {("t", 0): NONE, ("t", 1): NONE}
        partition = broker.logs.get_partition(OFFSETS_TOPIC, partition_for("g", 3))
        # the 200 commits took some 30 KiB; compacted, the partition holds its active segment (at most
        # offsets.topic.segment.bytes) and the latest commit before it
        # the pass records where it stopped once its segments are swapped in
        assert _wait(lambda: partition.size_in_bytes <= 4096 + 512
                     and broker.logs.cleaner.first_dirty_offset(OFFSETS_TOPIC, partition_for("g", 3)) > 0)
        assert fetch(broker.coordinator) == {("t", 0): 199, ("t", 1): 398}


def static_pair(coord, protocols=(("range", b"sub"),)):
    """Two static members, "a" leading (assigned b"A") and "b" (b"B"), Stable in generation 2; returns
    their member ids."""
    leader = join(coord, instance_id="a", protocols=protocols)
    assert sync(coord, leader.member_id, 1, [(leader.member_id, b"A")], instance_id="a").error_code == NONE
    thread, result = join_async(coord, instance_id="b", protocols=protocols)
    assert _wait(lambda: heartbeat(coord, leader.member_id, 1, "a") == REBALANCE_IN_PROGRESS)
    assert join(coord, member_id=leader.member_id, instance_id="a", protocols=protocols).generation_id == 2
    thread.join(10)
    follower = result["response"].member_id
    assert sync(coord, leader.member_id, 2, [(leader.member_id, b"A"), (follower, b"B")],
                instance_id="a").error_code == NONE
    assert sync(coord, follower, 2, instance_id="b").assignment == b"B"
    return leader.member_id, follower


@pytest.mark.parametrize("version", [7, 9])
def test_a_restarted_static_leader_takes_its_place_back_without_a_rebalance(logs, version):
    """Kafka's ``updateStaticMemberAndRebalance`` in a Stable group: the new member id takes the leader's
    place and assignment; before JoinGroup v9 it is given the old leader id (so it syncs as a follower),
    from v9 (KIP-814) its own with the members and ``skip_assignment``. The other member sees nothing."""
    coord = coordinator(logs)
    try:
        leader, follower = static_pair(coord)
        rejoined = join(coord, version=version, instance_id="a")         # restarted without its member id
        new_id = rejoined.member_id
        assert rejoined.error_code == NONE and new_id not in ("", leader) and rejoined.generation_id == 2
        if version >= 9:
            assert (rejoined.leader, rejoined.skip_assignment) == (new_id, True)
            assert {m.member_id: (m.group_instance_id, m.metadata) for m in rejoined.members} == {
                new_id: ("a", b"sub"), follower: ("b", b"sub")}
        else:
            assert (rejoined.leader, rejoined.skip_assignment, rejoined.members) == (leader, False, [])
        group = coord.groups["g"]
        assert (group.state, group.generation, group.leader) == ("Stable", 2, new_id)
        assert heartbeat(coord, follower, 2, "b") == NONE                  # no rebalance for the follower
        assert sync(coord, follower, 2, instance_id="b").assignment == b"B"
        assert sync(coord, new_id, 2, instance_id="a").assignment == b"A"  # the leader's old assignment
        assert heartbeat(coord, leader, 2, "a") == FENCED_INSTANCE_ID
    finally:
        coord.close()
    reloaded = coordinator(logs)                                          # the new id was stored
    try:
        group = reloaded.groups["g"]
        assert (group.state, group.generation, group.leader) == ("Stable", 2, new_id)
        assert group.members[new_id].assignment == b"A" and leader not in group.members
    finally:
        reloaded.close()


def test_a_restarted_static_member_rebalances_the_group_only_when_its_protocol_changes(logs):
    """As Kafka: new metadata under the same selected protocol is stored without a rebalance; a rejoin
    that changes the protocol the group would select starts one."""
    coord = coordinator(logs)
    try:
        leader, follower = static_pair(coord, protocols=(("range", b"sub"), ("roundrobin", b"sub")))
        changed = join(coord, instance_id="b", protocols=(("range", b"new"), ("roundrobin", b"new")))
        assert (changed.error_code, changed.generation_id, changed.leader) == (NONE, 2, leader)
        assert coord.groups["g"].members[changed.member_id].metadata("range") == b"new"
        assert heartbeat(coord, leader, 2, "a") == NONE

        thread, result = join_async(coord, instance_id="b", protocols=(("roundrobin", b"rr"),))
        assert _wait(lambda: heartbeat(coord, leader, 2, "a") == REBALANCE_IN_PROGRESS)
        again = join(coord, member_id=leader, instance_id="a", protocols=(("range", b"sub"), ("roundrobin", b"sub")))
        thread.join(10)
        assert (again.generation_id, again.protocol_name) == (3, "roundrobin")
        assert result["response"].generation_id == 3
    finally:
        coord.close()


def test_a_static_member_whose_new_id_cannot_be_stored_keeps_its_old_one(logs, monkeypatch):
    """Kafka's ``updateStaticMemberAndRebalance``: a restarted static member gets a new member id only once
    the group holding it is stored; on a failing disk the join fails (NOT_COORDINATOR) and the old id stays."""
    coord = coordinator(logs)
    try:
        leader, follower = static_pair(coord)
        fail_appends(monkeypatch, logs, OFFSETS_TOPIC, "result")
        refused = join(coord, instance_id="b")                    # restarted without its member id
        assert (refused.error_code, refused.member_id) == (NOT_COORDINATOR, "")
        assert heartbeat(coord, follower, 2, "b") == NONE
        assert set(coord.groups["g"].members) == {leader, follower}

        monkeypatch.undo()
        rejoined = join(coord, instance_id="b")
        assert rejoined.error_code == NONE and rejoined.member_id != follower
        assert heartbeat(coord, follower, 2, "b") == FENCED_INSTANCE_ID
    finally:
        coord.close()


def test_a_commit_too_large_for_the_offsets_topic_is_invalid_commit_offset_size(logs):
    coord = coordinator(logs, offsets_topic_segment_bytes=100)
    try:
        assert commit(coord, {("t", 0): 1, ("t", 1): 2}) == {("t", 0): INVALID_COMMIT_OFFSET_SIZE,
                                                             ("t", 1): INVALID_COMMIT_OFFSET_SIZE}
        assert fetch(coord) == {}
    finally:
        coord.close()


def test_the_log_says_when_a_group_is_stable_and_with_whom(logs, caplog):
    caplog.set_level("INFO", logger="kmem.broker.group.coordinator")
    coord = coordinator(logs)
    try:
        leader, follower = stable_pair(coord)
        thread = threading.Thread(target=sync, args=(coord, follower, 2))
        thread.start()
        assert _wait(lambda: coord.groups["g"].members[follower].sync_reply is not None)
        sync(coord, leader, 2, [(leader, b"L"), (follower, b"F")])
        thread.join(10)
        assert f"group 'g': stable at generation 2, 2 members (range): {leader}, {follower}" in caplog.text
    finally:
        coord.close()
