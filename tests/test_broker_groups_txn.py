"""Transactional offset commits (KIP-98, KIP-447) in the group coordinator: TxnOffsetCommit writes a
transactional batch to the group's ``__consumer_offsets`` partition and holds its offsets pending (unseen by
OffsetFetch, UNSTABLE_OFFSET_COMMIT with ``require_stable``) until the transaction's marker completes them
(``handle_txn_completion``); a restart replays them from the log, markers included; the log cleaner leaves an
open transaction's offsets alone; KIP-447's generation checks; KIP-890's verification with the transaction
coordinator; the APIs over the wire with kafka-python's classes."""
import time

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.producer.transaction import TxnOffsetCommitRequest, TxnOffsetCommitResponse

from broker_helpers import RawConnection
from group_helpers import start_broker
from kmem.broker import LogManager
from kmem.broker.group.offsets import OFFSETS_TOPIC, partition_for
from kmem.broker.txn.markers import TxnMarkerWriter
from kmem.protocol import ApiKey, messages
from kmem.records import FileRecords, log_segments
from test_broker_groups_coordinator import (
    FENCED_INSTANCE_ID, ILLEGAL_GENERATION, NONE, UNKNOWN_MEMBER_ID, UNKNOWN_TOPIC_OR_PARTITION, cleaning, commit,
    coordinator, fetch, header, join_new_member, static_pair, sync,
)

UNSTABLE_OFFSET_COMMIT, INVALID_PRODUCER_EPOCH, OFFSET_METADATA_TOO_LARGE, INVALID_TXN_STATE = 88, 47, 12, 48
PRODUCER, EPOCH = 1000, 3


@pytest.fixture
def logs(tmp_path):
    with LogManager(tmp_path) as manager:
        manager.create_topic("t", 4)
        yield manager


def txn_commit(coord, offsets, producer_id=PRODUCER, epoch=EPOCH, version=4, group="g", generation=-1,
               member_id="", instance_id=None, metadata="m"):
    R = messages.TxnOffsetCommitRequest
    topics = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(R.TxnOffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=7, committed_metadata=metadata))
    request = R(transactional_id="tx", group_id=group, producer_id=producer_id, producer_epoch=epoch,
                generation_id=generation, member_id=member_id, group_instance_id=instance_id,
                topics=[R.TxnOffsetCommitRequestTopic(name=t, partitions=p) for t, p in topics.items()])
    response = coord.txn_offset_commit(header(ApiKey.TXN_OFFSET_COMMIT, version), request)
    return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def stable_fetch(coord, partitions, version=7, group="g"):
    """OffsetFetch with require_stable: {(topic, partition): (error, offset)}."""
    R = messages.OffsetFetchRequest
    wanted = {}
    for topic, partition in partitions:
        wanted.setdefault(topic, []).append(partition)
    if version < 8:
        request = R(group_id=group, topics=[R.OffsetFetchRequestTopic(name=t, partition_indexes=p)
                                            for t, p in wanted.items()], require_stable=True)
        topics = coord.offset_fetch(header(ApiKey.OFFSET_FETCH, version), request).topics
    else:
        request = R(groups=[R.OffsetFetchRequestGroup(group_id=group, topics=[
            R.OffsetFetchRequestTopics(name=t, partition_indexes=p) for t, p in wanted.items()])], require_stable=True)
        response = coord.offset_fetch(header(ApiKey.OFFSET_FETCH, version), request)
        assert response.groups[0].error_code == NONE
        topics = response.groups[0].topics
    return {(t.name, p.partition_index): (p.error_code, p.committed_offset) for t in topics for p in t.partitions}


def offsets_partition(logs, group="g"):
    return logs.get_partition(OFFSETS_TOPIC, partition_for(group, 3))


def complete(coord, logs, commit, producer_id=PRODUCER, group="g", epoch=EPOCH):
    """The transaction coordinator's marker in the group's offsets partition, and its completion."""
    writer = TxnMarkerWriter(logs, coord)
    assert writer.write(producer_id, epoch, 0, commit, [(OFFSETS_TOPIC, partition_for(group, 3))]) == {
        (OFFSETS_TOPIC, partition_for(group, 3)): NONE}


def stored_batches(log_dir, group="g"):
    batches = []
    for _, path in log_segments(str(log_dir / f"{OFFSETS_TOPIC}-{partition_for(group, 3)}")):
        with FileRecords(path) as file:
            batches.extend((b.base_offset, b.producer_id, b.producer_epoch, b.base_sequence, b.is_transactional,
                            b.is_control_batch, len(b)) for b in file.batches())
    return batches


def test_txn_offsets_are_written_as_a_transaction_and_unseen_until_its_commit_marker(logs, tmp_path):
    coord = coordinator(logs)
    try:
        assert commit(coord, {("t", 0): 5}) == {("t", 0): NONE}
        assert txn_commit(coord, {("t", 0): 10, ("t", 1): 20, ("nope", 0): 1, ("t", 9): 1}) == {
            ("t", 0): NONE, ("t", 1): NONE, ("nope", 0): UNKNOWN_TOPIC_OR_PARTITION,
            ("t", 9): UNKNOWN_TOPIC_OR_PARTITION}
        # the batch of the producer's transaction, sequence 0 as Kafka's storeOffsets writes it
        partition = offsets_partition(logs)
        txn_batch = partition.log_end_offset - 2
        assert stored_batches(tmp_path)[-1] == (txn_batch, PRODUCER, EPOCH, 0, True, False, 2)
        assert partition.last_stable_offset == txn_batch < partition.log_end_offset      # the transaction is open
        assert fetch(coord) == {("t", 0): 5}
        assert stable_fetch(coord, [("t", 0), ("t", 1), ("t", 2)]) == {
            ("t", 0): (UNSTABLE_OFFSET_COMMIT, -1), ("t", 1): (UNSTABLE_OFFSET_COMMIT, -1), ("t", 2): (NONE, -1)}
        assert stable_fetch(coord, [("t", 0), ("t", 2)], version=8) == {
            ("t", 0): (UNSTABLE_OFFSET_COMMIT, -1), ("t", 2): (NONE, -1)}

        complete(coord, logs, commit=True)
        assert partition.last_stable_offset == partition.log_end_offset
        assert fetch(coord) == {("t", 0): 10, ("t", 1): 20}
        assert stable_fetch(coord, [("t", 0), ("t", 1)], version=9) == {("t", 0): (NONE, 10), ("t", 1): (NONE, 20)}
        assert coord.groups["g"].offsets[("t", 0)][:3] == (10, 7, "m")
    finally:
        coord.close()


def test_an_abort_marker_drops_the_pending_offsets(logs):
    coord = coordinator(logs)
    try:
        commit(coord, {("t", 0): 5})
        assert txn_commit(coord, {("t", 0): 10, ("t", 1): 20}) == {("t", 0): NONE, ("t", 1): NONE}
        coord.handle_txn_completion(PRODUCER + 1, [partition_for("g", 3)], True)     # another producer's marker
        assert stable_fetch(coord, [("t", 0)]) == {("t", 0): (UNSTABLE_OFFSET_COMMIT, -1)}
        complete(coord, logs, commit=False)
        assert fetch(coord) == {("t", 0): 5}
        assert stable_fetch(coord, [("t", 0), ("t", 1)]) == {("t", 0): (NONE, 5), ("t", 1): (NONE, -1)}
        assert coord.groups["g"].txn_offsets == {} and coord._txn_groups == {}
    finally:
        coord.close()



def offset_delete(coord, partitions, group="g"):
    R = messages.OffsetDeleteRequest
    topics = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(R.OffsetDeleteRequestPartition(partition_index=partition))
    response = coord.offset_delete(header(ApiKey.OFFSET_DELETE, 0), R(group_id=group, topics=[
        R.OffsetDeleteRequestTopic(name=t, partitions=p) for t, p in topics.items()]))
    assert response.error_code == NONE
    return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def test_offset_delete_drops_the_pending_offsets_of_open_transactions_too(logs):
    """Kafka's GroupMetadata.removeOffsets: a COMMIT marker after OffsetDelete does not bring them back."""
    coord = coordinator(logs)
    try:
        commit(coord, {("t", 0): 5, ("t", 2): 6})
        assert txn_commit(coord, {("t", 0): 10, ("t", 1): 20, ("t", 3): 30}) == {
            ("t", 0): NONE, ("t", 1): NONE, ("t", 3): NONE}
        assert offset_delete(coord, [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): NONE, ("t", 1): NONE, ("t", 2): NONE}
        assert fetch(coord) == {}
        complete(coord, logs, commit=True)
        assert fetch(coord) == {("t", 3): 30}
    finally:
        coord.close()

def test_a_commit_written_after_the_transactions_offsets_wins_over_them(logs):
    """Kafka orders a completed transaction's offsets against the committed ones by their place in the log."""
    coord = coordinator(logs)
    try:
        assert txn_commit(coord, {("t", 0): 10, ("t", 1): 20}) == {("t", 0): NONE, ("t", 1): NONE}
        assert commit(coord, {("t", 0): 7}) == {("t", 0): NONE}
        complete(coord, logs, commit=True)
        assert fetch(coord) == {("t", 0): 7, ("t", 1): 20}
    finally:
        coord.close()
    coord = coordinator(logs)           # the same order when replayed
    try:
        assert fetch(coord) == {("t", 0): 7, ("t", 1): 20}
    finally:
        coord.close()


def test_a_restart_keeps_pending_offsets_and_replays_completed_ones(tmp_path):
    with LogManager(tmp_path) as logs:
        logs.create_topic("t", 4)
        coord = coordinator(logs)
        commit(coord, {("t", 0): 5, ("t", 3): 3})
        assert txn_commit(coord, {("t", 0): 10}, producer_id=1) == {("t", 0): NONE}       # committed
        assert txn_commit(coord, {("t", 3): 30}, producer_id=2) == {("t", 3): NONE}       # aborted
        assert txn_commit(coord, {("t", 1): 21}, producer_id=3) == {("t", 1): NONE}       # no marker yet
        assert txn_commit(coord, {("t", 2): 2}, producer_id=4, group="solo") == {("t", 2): NONE}   # only pending
        complete(coord, logs, True, producer_id=1)
        complete(coord, logs, False, producer_id=2)
        coord.close()
    with LogManager(tmp_path) as logs:
        coord = coordinator(logs)
        try:
            assert fetch(coord) == {("t", 0): 10, ("t", 3): 3}
            assert stable_fetch(coord, [("t", 0), ("t", 1), ("t", 3)]) == {
                ("t", 0): (NONE, 10), ("t", 1): (UNSTABLE_OFFSET_COMMIT, -1), ("t", 3): (NONE, 3)}
            assert stable_fetch(coord, [("t", 2)], group="solo") == {("t", 2): (UNSTABLE_OFFSET_COMMIT, -1)}
            complete(coord, logs, True, producer_id=3)          # a marker after the restart completes them
            complete(coord, logs, True, producer_id=4, group="solo")
            assert fetch(coord) == {("t", 0): 10, ("t", 1): 21, ("t", 3): 3}
            assert fetch(coord, group="solo") == {("t", 2): 2}
        finally:
            coord.close()


def test_a_group_holding_pending_offsets_is_not_removed_by_its_deadlines(logs):
    """Kafka's ``hasOffsets`` counts a transaction's pending offsets: the group stays while its committed
    offsets expire, and one holding nothing else has no deadline until the marker."""
    coord = coordinator(logs, offsets_retention_check_interval_ms=1, offsets_retention_minutes=1)
    try:
        assert txn_commit(coord, {("t", 1): 21}, group="solo") == {("t", 1): NONE}
        assert coord.groups["solo"].timer_task is None
        assert commit(coord, {("t", 0): 5}) == {("t", 0): NONE}
        assert txn_commit(coord, {("t", 1): 11}, producer_id=PRODUCER + 1) == {("t", 1): NONE}
        coord.tick(time.monotonic() + 86_400, int(time.time() * 1000) + 86_400_000)
        assert "solo" in coord.groups and "g" in coord.groups and fetch(coord) == {}      # ("t", 0) expired
        complete(coord, logs, True, group="solo")
        complete(coord, logs, True, producer_id=PRODUCER + 1)
        assert fetch(coord, group="solo") == {("t", 1): 21} and fetch(coord) == {("t", 1): 11}
    finally:
        coord.close()


def test_kip_447_generation_checks(logs):
    coord = coordinator(logs)
    try:
        leader = join_new_member(coord)
        assert sync(coord, leader.member_id, 1, [(leader.member_id, b"A")]).error_code == NONE
        member = leader.member_id
        assert txn_commit(coord, {("t", 0): 1}, generation=2, member_id=member) == {("t", 0): ILLEGAL_GENERATION}
        assert txn_commit(coord, {("t", 0): 1}, generation=1, member_id="nobody") == {("t", 0): UNKNOWN_MEMBER_ID}
        assert txn_commit(coord, {("t", 0): 1}, generation=1, member_id=member) == {("t", 0): NONE}
        # v0-2 carry no member: a producer commits for a group with members
        assert txn_commit(coord, {("t", 1): 1}, version=2, generation=5, member_id="nobody") == {("t", 1): NONE}
        assert txn_commit(coord, {("t", 1): 1}, generation=-1) == {("t", 1): NONE}
        # an unknown group takes offsets without a generation (a group that only commits), not with one
        assert txn_commit(coord, {("t", 0): 1}, group="new") == {("t", 0): NONE}
        assert txn_commit(coord, {("t", 0): 1}, group="other", generation=1, member_id="m") == {
            ("t", 0): UNKNOWN_MEMBER_ID}
        assert "other" not in coord.groups
        assert txn_commit(coord, {("t", 0): 1}, metadata="x" * 5000) == {("t", 0): OFFSET_METADATA_TOO_LARGE}
        assert txn_commit(coord, {("t", 0): 1}, metadata="x" * 5000, generation=9, member_id=member) == {
            ("t", 0): ILLEGAL_GENERATION}
        assert txn_commit(coord, {("t", 0): 1}, group="") == {("t", 0): 24}       # INVALID_GROUP_ID
    finally:
        coord.close()


def test_a_fenced_static_member_cannot_commit_in_a_transaction(logs):
    coord = coordinator(logs)
    try:
        leader, follower = static_pair(coord)
        assert txn_commit(coord, {("t", 0): 1}, generation=2, member_id=follower, instance_id="a") == {
            ("t", 0): FENCED_INSTANCE_ID}
        assert txn_commit(coord, {("t", 0): 1}, generation=2, member_id=leader, instance_id="a") == {("t", 0): NONE}
    finally:
        coord.close()


class Transactions:
    """A transaction coordinator's ``verify_transaction`` (KIP-890) answering ``error``."""

    def __init__(self, error):
        self.error = error
        self.calls = []

    def verify_transaction(self, transactional_id, producer_id, producer_epoch, topic, partition,
                           transaction_abortable=False):
        self.calls.append((transactional_id, producer_id, producer_epoch, topic, partition))
        return self.error


def test_the_offsets_partition_must_be_in_the_producers_transaction(logs):
    coord = coordinator(logs)
    try:
        coord.transactions = Transactions(INVALID_PRODUCER_EPOCH)
        partition = coord._offsets_partition("g")
        end = partition.log_end_offset
        assert txn_commit(coord, {("t", 0): 10, ("nope", 0): 1}) == {
            ("t", 0): INVALID_PRODUCER_EPOCH, ("nope", 0): UNKNOWN_TOPIC_OR_PARTITION}
        assert coord.transactions.calls == [("tx", PRODUCER, EPOCH, OFFSETS_TOPIC, partition_for("g", 3))]
        assert partition.log_end_offset == end and "g" not in coord.groups      # nothing written or held
        coord.transactions.error = NONE
        assert txn_commit(coord, {("t", 0): 10}) == {("t", 0): NONE}
        assert txn_commit(coord, {("t", 1): 11}) == {("t", 1): NONE}
        assert len(coord.transactions.calls) == 2       # open in the partition at this epoch: asked no more
        assert stable_fetch(coord, [("t", 0), ("t", 1)]) == {
            ("t", 0): (UNSTABLE_OFFSET_COMMIT, -1), ("t", 1): (UNSTABLE_OFFSET_COMMIT, -1)}
    finally:
        coord.close()


def test_a_transaction_ending_while_its_offsets_are_verified_takes_none_of_them(logs):
    """Kafka's VerificationGuard: the marker written between the verification and the append voids it, so the
    offsets do not open a transaction that has ended (its last stable offset would never move again)."""
    coord = coordinator(logs)
    try:
        partition = coord._offsets_partition("g")
        coord.transactions = Transactions(NONE)
        coord.transactions.verify_transaction = lambda *args, **options: partition.write_txn_marker(
            PRODUCER, EPOCH, 0, False).error_code
        assert txn_commit(coord, {("t", 0): 10}) == {("t", 0): INVALID_TXN_STATE}
        assert partition.last_stable_offset == partition.log_end_offset
        assert coord.groups.get("g") is None and stable_fetch(coord, [("t", 0)]) == {("t", 0): (NONE, -1)}
    finally:
        coord.close()


def test_a_transaction_ending_after_it_was_found_open_takes_no_more_offsets(logs):
    """A TxnOffsetCommit finding its transaction open on the offsets partition is not verified again; a marker
    closing the transaction before the append leaves its offsets out (INVALID_TXN_STATE), rather than in a
    transaction no coordinator knows, which would hold the partition's last stable offset back for good."""
    coord = coordinator(logs)
    try:
        partition = coord._offsets_partition("g")
        coord.transactions = Transactions(NONE)
        assert txn_commit(coord, {("t", 0): 10}) == {("t", 0): NONE}
        seen = partition.start_txn_verification

        def marker_after_the_check(producer_id, producer_epoch):
            guard = seen(producer_id, producer_epoch)
            complete(coord, logs, commit=True)
            return guard
        partition.start_txn_verification = marker_after_the_check
        assert txn_commit(coord, {("t", 1): 11}) == {("t", 1): INVALID_TXN_STATE}
        assert len(coord.transactions.calls) == 1
        assert partition.last_stable_offset == partition.log_end_offset
        assert stable_fetch(coord, [("t", 0), ("t", 1)]) == {("t", 0): (NONE, 10), ("t", 1): (NONE, -1)}
    finally:
        coord.close()

def test_an_older_producer_epoch_is_refused_by_the_offsets_partition(logs):
    coord = coordinator(logs)
    try:
        assert txn_commit(coord, {("t", 0): 10}) == {("t", 0): NONE}
        assert txn_commit(coord, {("t", 0): 11}, epoch=EPOCH - 1) == {("t", 0): INVALID_PRODUCER_EPOCH}
        complete(coord, logs, commit=True)
        assert fetch(coord) == {("t", 0): 10}
    finally:
        coord.close()


def test_the_log_cleaner_leaves_an_open_transactions_offsets(tmp_path):
    """Kafka's cleaner stops at the last stable offset: a pending offset is neither removed by later commits of
    the same partition nor used to remove them, and comes back pending after a restart."""
    with LogManager(tmp_path, cleaning()) as logs:
        logs.create_topic("t", 4)
        coord = coordinator(logs, offsets_topic_segment_bytes=1024)
        commit(coord, {("t", 0): 1})
        assert txn_commit(coord, {("t", 0): 10}) == {("t", 0): NONE}
        for i in range(100):
            commit(coord, {("t", 0): 100 + i, ("t", 1): i})
        partition = offsets_partition(logs)
        assert len(partition.segments) > 3
        logs.cleaner.clean_filthiest()
        coord.close()
    with LogManager(tmp_path, cleaning()) as logs:
        coord = coordinator(logs)
        try:
            assert stable_fetch(coord, [("t", 0), ("t", 1)]) == {
                ("t", 0): (UNSTABLE_OFFSET_COMMIT, -1), ("t", 1): (NONE, 99)}
            assert fetch(coord) == {("t", 0): 199, ("t", 1): 99}
        finally:
            coord.close()


def test_txn_offset_commit_and_require_stable_over_the_wire(tmp_path):
    broker = start_broker(tmp_path, **{"offsets.topic.num.partitions": 3})
    try:
        broker.logs.create_topic("t", 2)
        broker.coordinator.transactions = None         # no transaction verification (these ids never began one)
        connection = RawConnection(broker.bootstrap_servers)
        versions = connection.request(ApiVersionsRequest(), ApiVersionsResponse, 3)
        assert [(k.min_version, k.max_version) for k in versions.api_keys if k.api_key == ApiKey.TXN_OFFSET_COMMIT] \
            == [(0, 4)]
        for version in (0, 2, 3, 4):
            request = TxnOffsetCommitRequest(transactional_id="tx", group_id="g", producer_id=PRODUCER + version,
                                             producer_epoch=0, generation_id=-1, member_id="", group_instance_id=None,
                                             topics=[("t", [(0, 10 + version, -1, "meta")])])
            response = connection.request(request, TxnOffsetCommitResponse, version)
            assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in response.topics] \
                == [("t", [(0, NONE)])]
        fetched = connection.request(OffsetFetchRequest(group_id="g", topics=[("t", [0, 1])], require_stable=True),
                                     OffsetFetchResponse, 7)
        assert fetched.error_code == NONE
        assert [(p.partition_index, p.error_code) for p in fetched.topics[0].partitions] == \
            [(0, UNSTABLE_OFFSET_COMMIT), (1, NONE)]
        fetched = connection.request(OffsetFetchRequest(group_id="g", topics=[("t", [0])]), OffsetFetchResponse, 6)
        assert fetched.topics[0].partitions[0].committed_offset == -1             # not committed yet
        for version in (0, 2, 3, 4):
            complete(broker.coordinator, broker.logs, commit=True, producer_id=PRODUCER + version)
        fetched = connection.request(OffsetFetchRequest(groups=[("g", [("t", [0])])], require_stable=True),
                                     OffsetFetchResponse, 8)
        assert [(p.error_code, p.committed_offset, p.metadata) for p in fetched.groups[0].topics[0].partitions] == \
            [(NONE, 14, "meta")]
    finally:
        broker.close()
