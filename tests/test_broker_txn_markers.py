"""kmem.broker transaction markers: ``PartitionLog.write_txn_marker`` (Kafka's EndTransactionMarker written as
the coordinator: the producer's transaction closes, the last stable offset moves, an abort goes into the
segment's ``.txnindex``) and ``kmem.broker.txn.markers.TxnMarkerWriter``."""
import errno
import os
import struct
import time

import pytest

from kmem.broker import READ_COMMITTED, BrokerConfig, ErrorCode, LogManager
from kmem.broker.group.offsets import OFFSETS_TOPIC
from kmem.broker.log.cleaner import complete_interrupted_swaps
from kmem.broker.log.txn_index import ENTRY_SIZE, AbortedTxn
from kmem.broker.txn.markers import TxnMarkerWriter
from kmem.ledger import NO_TXN
from kmem.records import ControlRecordType, RecordsBuilder


def now_ms():
    return time.time_ns() // 1_000_000


def produce(partition_log, producer_id, epoch, sequence, count=1, transactional=True):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                             transactional=transactional)
    for i in range(count):
        builder.append(b"%d-%d-%d" % (producer_id, sequence, i), key=b"k%d" % i, timestamp=now_ms())
    result = partition_log.append(builder.build())
    assert result.error_code == ErrorCode.NONE
    return result


def batches(partition_log):
    fetched = partition_log.read(0, 1 << 30)
    with fetched.records as records:
        return [(b, list(b)) for b in records.batches()]


def txn_index_path(partition_log, segment=-1):
    return partition_log.segments[segment].txn_index.path


@pytest.fixture
def manager(tmp_path):
    opened = LogManager(tmp_path, BrokerConfig.from_properties(producer_ledger_ids=100))
    opened.create_topic("t", 2)
    yield opened
    opened.close()


@pytest.fixture
def partition_log(manager):
    return manager.get_partition("t", 0)


@pytest.mark.parametrize("commit", [True, False])
def test_marker_is_a_control_batch_with_kafkas_key_and_value(partition_log, commit):
    result = partition_log.write_txn_marker(7, 3, 11, commit, now_ms=1_700_000_000_000)
    assert (result.error_code, result.base_offset, result.last_offset) == (ErrorCode.NONE, 0, 0)
    [(batch, records)] = batches(partition_log)
    assert batch.is_control_batch and batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 3, -1)
    assert batch.control_type == (ControlRecordType.COMMIT if commit else ControlRecordType.ABORT)
    [record] = records
    assert record.key == struct.pack(">hh", 0, 1 if commit else 0)          # version 0, type
    assert record.value == struct.pack(">hi", 0, 11)                        # version 0, coordinator epoch
    assert record.timestamp == 1_700_000_000_000
    assert partition_log.producers.state(7).coordinator_epoch == 11
    assert not os.path.exists(txn_index_path(partition_log))        # nothing was open: no aborted transaction


def test_commit_closes_the_transaction_and_the_last_stable_offset_moves(partition_log):
    woken = []
    partition_log.add_listener(lambda log: woken.append(log.last_stable_offset))
    produce(partition_log, 1, 0, 0, transactional=False)
    first = produce(partition_log, 2, 0, 0, count=2)
    produce(partition_log, 2, 0, 2)
    assert partition_log.last_stable_offset == first.base_offset == 1
    assert partition_log.producers.state(2).current_txn_first_offset == 1
    marker = partition_log.write_txn_marker(2, 0, 0, True)
    assert (marker.error_code, marker.base_offset) == (ErrorCode.NONE, 4)
    assert partition_log.last_stable_offset == partition_log.log_end_offset == 5
    assert partition_log.producers.state(2).current_txn_first_offset == NO_TXN
    assert woken[-1] == 5                       # listeners (parked read_committed fetches) see the new LSO
    committed = partition_log.read(0, 1 << 20, isolation=READ_COMMITTED)
    with committed.records as records:
        assert [b.last_offset for b in records.batches()] == [0, 2, 3, 4]
    assert not os.path.exists(txn_index_path(partition_log))        # commits are not indexed


def test_abort_is_indexed_with_kafkas_last_stable_offset(partition_log):
    produce(partition_log, 1, 0, 0, count=2)            # offsets 0-1: producer 1's transaction
    produce(partition_log, 2, 0, 0)                     # offset 2: producer 2's, still open after the abort
    assert partition_log.write_txn_marker(1, 0, 5, False).base_offset == 3
    # The LSO at completion is the first offset of the oldest transaction still open: producer 2's.
    assert partition_log.last_stable_offset == 2
    assert partition_log.write_txn_marker(2, 0, 5, False).base_offset == 4
    with open(txn_index_path(partition_log), "rb") as f:
        data = f.read()
    assert len(data) == 2 * ENTRY_SIZE == 68
    assert struct.unpack(">hqqqqhqqqq", data) == (0, 1, 0, 3, 2, 0, 2, 2, 4, 5)
    assert list(partition_log.active.txn_index.entries()) == [AbortedTxn(1, 0, 3, 2), AbortedTxn(2, 2, 4, 5)]
    assert partition_log.last_stable_offset == 5


def test_marker_of_an_older_epoch_is_refused_and_nothing_is_written(partition_log):
    produce(partition_log, 1, 4, 0)
    refused = partition_log.write_txn_marker(1, 3, 0, False)
    assert refused.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert partition_log.log_end_offset == 1 and partition_log.last_stable_offset == 0
    assert partition_log.write_txn_marker(1, 4, 2, False).error_code == ErrorCode.NONE
    fenced = partition_log.write_txn_marker(1, 4, 1, True)           # an older coordinator's marker
    assert fenced.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert partition_log.log_end_offset == 2
    assert list(partition_log.active.txn_index.entries()) == [AbortedTxn(1, 0, 1, 2)]


@pytest.mark.parametrize("fault", ["read-only descriptor", "full disk"])
def test_failed_write_keeps_neither_marker_nor_index_entry(partition_log, monkeypatch, fault):
    produce(partition_log, 1, 0, 0)
    segment = partition_log.active
    if fault == "full disk":        # as the disk answers it; a full tmpfs is tested in test_broker_faults
        def full_disk(*args):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(type(segment), "append", full_disk)
        failed = partition_log.write_txn_marker(1, 0, 0, False)
        monkeypatch.undo()
    else:                           # the core's write itself fails
        writable, segment._fd = segment._fd, os.open(segment.log_path, os.O_RDONLY)
        try:
            failed = partition_log.write_txn_marker(1, 0, 0, False)
        finally:
            os.close(segment._fd)
            segment._fd = writable
    assert failed.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert ("No space left" if fault == "full disk" else "Bad file descriptor") in failed.error_message
    assert not os.path.exists(txn_index_path(partition_log))
    assert (partition_log.log_end_offset, partition_log.last_stable_offset) == (1, 0)
    assert partition_log.write_txn_marker(1, 0, 0, False).error_code == ErrorCode.NONE
    assert list(partition_log.active.txn_index.entries()) == [AbortedTxn(1, 0, 1, 2)]


def test_markers_and_their_state_survive_a_restart(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    with LogManager(tmp_path, config) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        produce(partition_log, 1, 0, 0)
        partition_log.write_txn_marker(1, 0, 9, False)
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        assert partition_log.producers.state(1).coordinator_epoch == 9
        assert list(partition_log.active.txn_index.entries()) == [AbortedTxn(1, 0, 1, 2)]
        assert partition_log.write_txn_marker(1, 0, 8, True).error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED


class GroupCoordinatorDouble:
    """Records ``handle_txn_completion`` calls with what the offsets partitions' logs held at that moment."""

    def __init__(self, logs, fail=False):
        self.logs, self.fail, self.calls = logs, fail, []

    def handle_txn_completion(self, producer_id, offsets_partitions, commit):
        ends = {p: self.logs.get_partition(OFFSETS_TOPIC, p).log_end_offset for p in offsets_partitions}
        self.calls.append((producer_id, sorted(offsets_partitions), commit, ends))
        if self.fail:
            raise RuntimeError("a broken group coordinator")


def test_writer_answers_each_partition_and_completes_offsets_after_the_marker(manager):
    manager.create_topic(OFFSETS_TOPIC, 3)
    group = GroupCoordinatorDouble(manager)
    writer = TxnMarkerWriter(manager, group)
    produce(manager.get_partition("t", 1), 5, 2, 0)
    errors = writer.write(5, 2, 0, True, [("t", 0), ("t", 1), ("t", 7), ("missing", 0),
                                          (OFFSETS_TOPIC, 0), (OFFSETS_TOPIC, 2)])
    assert errors == {("t", 0): ErrorCode.NONE, ("t", 1): ErrorCode.NONE,
                      ("t", 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                      ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, (OFFSETS_TOPIC, 0): ErrorCode.NONE,
                      (OFFSETS_TOPIC, 2): ErrorCode.NONE}
    # Called once, for the offsets partitions only, each already holding its marker (offset 0 there).
    assert group.calls == [(5, [0, 2], True, {0: 1, 2: 1})]
    assert manager.get_partition("t", 1).last_stable_offset == 2
    [(batch, _)] = batches(manager.get_partition(OFFSETS_TOPIC, 2))
    assert batch.is_control_batch and batch.control_type == ControlRecordType.COMMIT


def test_writer_skips_the_group_coordinator_for_markers_not_written(manager):
    manager.create_topic(OFFSETS_TOPIC, 2)
    group = GroupCoordinatorDouble(manager)
    writer = TxnMarkerWriter(manager, group)
    produce(manager.get_partition(OFFSETS_TOPIC, 0), 5, 3, 0)
    errors = writer.write(5, 2, 0, False, [(OFFSETS_TOPIC, 0), (OFFSETS_TOPIC, 1), ("t", 0)])
    assert errors == {(OFFSETS_TOPIC, 0): ErrorCode.INVALID_PRODUCER_EPOCH, (OFFSETS_TOPIC, 1): ErrorCode.NONE,
                      ("t", 0): ErrorCode.NONE}
    assert group.calls == [(5, [1], False, {1: 1})]
    assert writer.write(5, 2, 0, False, [("t", 1)]) == {("t", 1): ErrorCode.NONE}
    assert len(group.calls) == 1                                    # no offsets partition: not called


def test_writer_reports_a_failing_group_coordinator_on_its_partitions(manager):
    manager.create_topic(OFFSETS_TOPIC, 1)
    writer = TxnMarkerWriter(manager, GroupCoordinatorDouble(manager, fail=True))
    errors = writer.write(5, 0, 0, True, [(OFFSETS_TOPIC, 0), ("t", 0)])
    assert errors == {(OFFSETS_TOPIC, 0): ErrorCode.UNKNOWN_SERVER_ERROR, ("t", 0): ErrorCode.NONE}



def test_writer_answers_a_partition_deleted_while_its_marker_is_written(manager):
    """A topic deleted between the writer finding its partition and appending the marker: the partition is
    UNKNOWN_TOPIC_OR_PARTITION (never an exception, which would stall the coordinator's markers), the others
    are written."""
    find = manager.get_partition

    def found_then_deleted(topic, partition):
        partition_log = find(topic, partition)
        if topic == "t" and partition_log is not None:
            manager.delete_topic("t")
        return partition_log
    manager.create_topic("u", 1)
    manager.get_partition = found_then_deleted
    errors = TxnMarkerWriter(manager, None).write(5, 0, 0, True, [("t", 0), ("u", 0)])
    assert errors == {("t", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ("u", 0): ErrorCode.NONE}

# --- the .txnindex beside its segment -----------------------------------------------------------------------

def aborted_transactions(tmp_path, config, topic_configs=None):
    """A closed log: producers 1 and 2 each abort a transaction (offsets 0-1 and 2-3), each in its segment,
    then a record in a third; returns the two .txnindex paths."""
    with LogManager(tmp_path, config) as manager:
        manager.create_topic("t", 1, topic_configs)
        partition_log = manager.get_partition("t", 0)
        for pid in (1, 2):
            produce(partition_log, pid, 0, 0)
            assert partition_log.write_txn_marker(pid, 0, 0, False).error_code == ErrorCode.NONE
            partition_log.roll()
        produce(partition_log, 3, 0, 0, transactional=False)
        return txn_index_path(partition_log, 0), txn_index_path(partition_log, 1)


EXPECTED = [AbortedTxn(1, 0, 1, 2), AbortedTxn(2, 2, 3, 4)]


def entries_per_segment(partition_log):
    return [list(segment.txn_index.entries()) for segment in partition_log.segments]


def crash(path, recovery_point=0):
    """As test_broker_log_recovery: the directory looks like the broker died."""
    os.unlink(os.path.join(path, ".kafka_cleanshutdown"))
    with open(os.path.join(path, "recovery-point-offset-checkpoint"), "w") as f:
        f.write(f"0\n1\nt 0 {recovery_point}\n")


def test_txn_index_is_deleted_with_its_segment(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    indexes = aborted_transactions(tmp_path, config)
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        assert entries_per_segment(partition_log) == [EXPECTED[:1], EXPECTED[1:], []]
        assert partition_log.delete_records_before(4) == 4
        assert [s.base_offset for s in partition_log.segments] == [4]
        assert not any(map(os.path.exists, indexes))


def test_recovery_rebuilds_a_lost_txn_index(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    _, index = aborted_transactions(tmp_path, config)
    os.unlink(index)
    os.unlink(index[:-len(".txnindex")] + ".index")         # the segment is recovered (its index is missing)
    crash(tmp_path)
    with LogManager(tmp_path, config) as manager:
        assert entries_per_segment(manager.get_partition("t", 0)) == [EXPECTED[:1], EXPECTED[1:], []]


def test_recovery_drops_the_entries_of_a_truncated_part(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    _, index = aborted_transactions(tmp_path, config)
    log_path = index[:-len(".txnindex")] + ".log"
    with open(log_path, "rb") as f:
        data = f.read()
    os.truncate(log_path, len(data) - 10)               # into the second marker (offset 3)
    crash(tmp_path)
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        assert partition_log.log_end_offset == 3
        assert entries_per_segment(partition_log) == [EXPECTED[:1], []]


# Producers 1 and 2 interleave their transactions over two segments, and producer 1 aborts in the second: the
# batches of each segment as (producer, None for a record or the marker's commit flag), and the AbortedTxn the
# abort adds at run time, whose last stable offset is where producer 2's open transaction starts.
INTERLEAVED = {
    "the other transaction opened before the replayed segment":
        ([(2, None)], [(1, None), (1, False), (2, True)], AbortedTxn(1, 1, 2, 0)),
    "the aborted transaction opened before the replayed segment":
        ([(1, None), (2, None)], [(1, False)], AbortedTxn(1, 0, 2, 1)),
}


@pytest.mark.parametrize("replayed_because", ["crash", "unreadable snapshot"])
@pytest.mark.parametrize("layout", INTERLEAVED)
def test_an_abort_replayed_by_recovery_is_indexed_as_at_run_time(tmp_path, layout, replayed_because):
    """The second segment is replayed (after a crash, or because the producer snapshot taken at the close is
    unreadable) without its .txnindex: the entry rebuilt is the one written at run time, as Kafka's loader
    computes it with the producers of the snapshot at the segment's base (producer 2's open transaction)."""
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    first, second, expected = INTERLEAVED[layout]
    with LogManager(tmp_path, config) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for pid, commit in first:
            produce(partition_log, pid, 0, 0)
        partition_log.roll()
        for pid, commit in second:
            if commit is None:
                produce(partition_log, pid, 0, 0)
            else:
                assert partition_log.write_txn_marker(pid, 0, 0, commit).error_code == ErrorCode.NONE
        index, base = txn_index_path(partition_log), partition_log.active.base_offset
        end, last_stable_offset = partition_log.log_end_offset, partition_log.last_stable_offset
    with open(index, "rb") as f:
        written = f.read()
    assert written == struct.pack(">hqqqq", 0, *expected)
    os.unlink(index)
    if replayed_because == "crash":
        crash(tmp_path, recovery_point=base)
    else:
        with open(tmp_path / "t-0" / f"{end:020d}.snapshot", "r+b") as f:     # its CRC fails
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0x01]))
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        with open(index, "rb") as f:
            assert f.read() == written
        assert partition_log.last_stable_offset == last_stable_offset
        fetched = partition_log.read(expected.first_offset, 1 << 20, isolation=READ_COMMITTED)
        assert fetched.aborted_transactions == [expected]
        fetched.records.close()


def test_an_open_transaction_bounds_the_last_stable_offset_after_a_restart(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    with LogManager(tmp_path, config) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        produce(partition_log, 1, 0, 0, transactional=False)
        produce(partition_log, 2, 0, 0)
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        assert (partition_log.last_stable_offset, partition_log.log_end_offset) == (1, 2)
        partition_log.write_txn_marker(2, 0, 0, True)
        assert partition_log.last_stable_offset == 3


def test_the_cleaner_carries_the_aborted_transactions_into_the_cleaned_segment(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100, log_cleaner_dedupe_buffer_size=240_000)
    first, second = aborted_transactions(tmp_path, config, {"cleanup.policy": "compact"})
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        manager.cleaner.clean("t", 0)
        assert [s.base_offset for s in partition_log.segments] == [0, 4]      # both cleaned into one
        assert not os.path.exists(second)
        assert not any(name.endswith((".cleaned", ".swap", ".deleted")) for name in os.listdir(os.path.dirname(first)))
        assert entries_per_segment(partition_log) == [EXPECTED, []]


def test_an_interrupted_swap_keeps_the_cleaned_txn_index(tmp_path):
    with open(tmp_path / f"{0:020d}.log", "wb"):        # the cleaned log was swapped in before the crash
        pass
    (tmp_path / f"{0:020d}.txnindex.deleted").write_bytes(b"old")
    (tmp_path / f"{0:020d}.txnindex.swap").write_bytes(b"cleaned")
    complete_interrupted_swaps(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [f"{0:020d}.log", f"{0:020d}.txnindex"]
    assert (tmp_path / f"{0:020d}.txnindex").read_bytes() == b"cleaned"


# --- compaction and transactions ------------------------------------------------------------------------------

def keyed(partition_log, key, value, producer_id=-1, transactional=False):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                             base_sequence=0 if producer_id >= 0 else -1, transactional=transactional)
    builder.append(value, key=key, timestamp=now_ms())
    assert partition_log.append(builder.build()).error_code == ErrorCode.NONE


def records_and_markers(partition_log):
    """Every record (offset, key, value) and marker ("marker", offset), fetch after fetch."""
    found, offset = [], partition_log.log_start_offset
    while (fetched := partition_log.read(offset, 1 << 20)).records is not None:
        with fetched.records as records:
            for batch in records.batches():
                found += [("marker", batch.base_offset)] if batch.is_control_batch else \
                    [(r.offset, r.key, r.value) for r in batch]
                offset = batch.next_offset
    return found


@pytest.fixture
def compacted(tmp_path):
    config = BrokerConfig.from_properties(producer_ledger_ids=100, log_cleaner_dedupe_buffer_size=240_000)
    with LogManager(tmp_path, config) as manager:
        manager.create_topic("c", 1, {"cleanup.policy": "compact"})
        yield manager


def test_the_cleaner_drops_aborted_records_which_never_supersede_committed_ones(compacted):
    partition_log = compacted.get_partition("c", 0)
    keyed(partition_log, b"k", b"committed")
    keyed(partition_log, b"k", b"aborted", producer_id=1, transactional=True)
    partition_log.write_txn_marker(1, 0, 0, False)
    partition_log.roll()
    keyed(partition_log, b"other", b"x")
    compacted.cleaner.clean("c", 0)
    assert records_and_markers(partition_log) == [(0, b"k", b"committed"), ("marker", 2), (3, b"other", b"x")]
    assert list(partition_log.segments[0].txn_index.entries()) == [AbortedTxn(1, 1, 2, 3)]


def test_nothing_from_the_last_stable_offset_on_is_cleaned(compacted):
    partition_log = compacted.get_partition("c", 0)
    keyed(partition_log, b"k", b"old")
    keyed(partition_log, b"k", b"new", producer_id=1, transactional=True)     # open: the LSO is 1
    partition_log.roll()
    keyed(partition_log, b"other", b"x")
    partition_log.roll()
    compacted.cleaner.clean("c", 0)
    assert records_and_markers(partition_log)[:2] == [(0, b"k", b"old"), (1, b"k", b"new")]
    partition_log.write_txn_marker(1, 0, 0, True)
    compacted.cleaner.clean("c", 0)
    assert records_and_markers(partition_log) == [(1, b"k", b"new"), (2, b"other", b"x"), ("marker", 3)]


@pytest.mark.parametrize("damage", ["unknown version", "partial entry"])
def test_a_damaged_txn_index_is_rebuilt_from_the_log(tmp_path, damage):
    """A .txnindex whose bytes are not Kafka's entries (a newer version, a torn write) never
    fails the partition's load nor a read: the segment is recovered and its index rebuilt from the markers."""
    config = BrokerConfig.from_properties(producer_ledger_ids=100)
    first, _ = aborted_transactions(tmp_path, config)
    with open(first, "r+b") as f:
        if damage == "unknown version":
            f.write(struct.pack(">h", 7))
        else:
            f.seek(0, os.SEEK_END)
            f.write(b"\x00" * (ENTRY_SIZE // 2))
    with LogManager(tmp_path, config) as manager:
        partition_log = manager.get_partition("t", 0)
        assert entries_per_segment(partition_log) == [EXPECTED[:1], EXPECTED[1:], []]
        data = partition_log.read(0, 1 << 20, isolation=READ_COMMITTED)
        assert data.error_code == ErrorCode.NONE
