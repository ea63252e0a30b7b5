"""Compaction of transactional data (``kmem.broker.log.cleaner``, Kafka's ``CleanedTransactionMetadata`` and
KIP-534): transaction markers go once their transaction is gone and their delete horizon passed, the
``.txnindex`` keeps only the aborted transactions still needed, and a pass reads the aborted transactions a
few at a time."""
import random
import tracemalloc
from types import SimpleNamespace

import pytest

from kmem.broker import READ_COMMITTED
from kmem.broker.codes import ErrorCode
from kmem.broker.log import cleaner
from kmem.broker.log.cleaner import DELETE_HORIZON_FLAG, CleanedTransactions
from kmem.broker.log.txn_index import AbortedTxn, TransactionIndex
from kmem.records import ControlRecordType, RecordsBuilder
from test_broker_compaction import DAY, NOW, compacted, latest, open_manager
from test_broker_txn_markers import crash

RETENTION = 1000                # delete.retention.ms


@pytest.fixture
def manager(tmp_path):
    opened = open_manager(tmp_path / "logs")
    yield opened
    opened.close()


class Producer:
    """A transactional producer writing straight to a partition log, the coordinator's markers included."""

    def __init__(self, partition_log, producer_id, epoch=0):
        self.log, self.producer_id, self.epoch, self.sequence = partition_log, producer_id, epoch, 0

    def send(self, *pairs):
        builder = RecordsBuilder(2, "none", producer_id=self.producer_id, producer_epoch=self.epoch,
                                 base_sequence=self.sequence, transactional=True)
        for key, value in pairs:
            builder.append(value, key=key, timestamp=NOW - DAY)
        result = self.log.append(builder.build(), now_ms=NOW)
        assert result.error_code == ErrorCode.NONE, result
        self.sequence += len(pairs)
        return [(result.base_offset + i, key, value) for i, (key, value) in enumerate(pairs)]

    def end(self, commit, epoch=None):
        result = self.log.write_txn_marker(self.producer_id, self.epoch if epoch is None else epoch, 0, commit,
                                           now_ms=NOW)
        assert result.error_code == ErrorCode.NONE, result
        return result.base_offset


def put(partition_log, key, value):
    builder = RecordsBuilder(2, "none")
    builder.append(value, key=key, timestamp=NOW - DAY)
    result = partition_log.append(builder.build(), now_ms=NOW)
    assert result.error_code == ErrorCode.NONE, result
    return result.base_offset, key, value


def log_batches(partition_log, isolation=None):
    """``[(RecordBatch, [Record])]`` of the whole log, fetch after fetch, and each fetch's aborted list."""
    found, aborted, offset = [], [], partition_log.log_start_offset
    extra = {} if isolation is None else {"isolation": isolation}
    while (fetched := partition_log.read(offset, 1 << 20, **extra)).records is not None:
        aborted.append(fetched.aborted_transactions)
        with fetched.records as records:
            for batch in records.batches():
                found.append((batch, list(batch)))
                offset = batch.next_offset
    return found, aborted


def read_all(partition_log):
    """Every record ``(offset, key, value)`` and marker ``("marker", offset, producer id)``."""
    return [("marker", b.base_offset, b.producer_id) if b.is_control_batch else (r.offset, r.key, r.value)
            for b, records in log_batches(partition_log)[0] for r in (records if not b.is_control_batch else [0])]


def read_committed(partition_log):
    """The records a read_committed consumer gets (Kafka's ``CompletedFetch``): fetch after fetch up to the
    last stable offset, skipping the batches of the aborted transactions each fetch lists."""
    found, offset = [], partition_log.log_start_offset
    while (fetched := partition_log.read(offset, 1 << 20, isolation=READ_COMMITTED)).records is not None:
        pending = sorted(fetched.aborted_transactions, key=lambda t: t.first_offset)
        aborting = set()
        with fetched.records as records:
            for batch in records.batches():
                while pending and pending[0].first_offset <= batch.last_offset:
                    aborting.add(pending.pop(0).producer_id)
                if batch.is_control_batch:
                    if batch.control_type == ControlRecordType.ABORT:
                        aborting.discard(batch.producer_id)
                elif not (batch.is_transactional and batch.producer_id in aborting):
                    found += [(r.offset, r.key, r.value) for r in batch]
                offset = batch.next_offset
    return found


def txn_index_entries(partition_log):
    return [txn for segment in partition_log.segments for txn in segment.txn_index.entries()]


def clean(manager, partition_log, now_ms, filler):
    """One pass at ``now_ms``; a pass needs dirty records, so a filler record goes first (a segment of its own)."""
    filler.append(put(partition_log, b"filler", b"%d" % len(filler)))
    partition_log.roll()
    manager.cleaner.clean("t", 0, now_ms=now_ms)


def test_markers_and_aborted_entries_go_once_their_transactions_are_gone_and_the_horizon_passed(manager):
    partition_log = compacted(manager, **{"delete.retention.ms": RETENTION})
    committer, aborter = Producer(partition_log, 1), Producer(partition_log, 2)
    rng = random.Random(5)
    committed = []                  # every record a committed transaction or a plain append wrote

    def update():
        return b"k%d" % rng.randrange(8), b"v%d" % rng.randrange(1 << 30)

    for _ in range(30):             # overlapping transactions, many updates per key
        writes = committer.send(update(), update())
        aborter.send(update())
        committed.append(put(partition_log, *update()))
        writes += committer.send(update())
        aborter.send(update(), update())
        committed += writes
        committer.end(commit=True)
        aborter.end(commit=False)
    for key in (b"k%d" % i for i in range(8)):     # every key of the transactions is updated after them
        committed.append(put(partition_log, key, b"last-" + key))
    last_commit = committer.send((b"only", b"committer"))
    committed += last_commit
    committer.end(commit=True)
    last_abort = aborter.send((b"only", b"aborter"))
    abort_marker = aborter.end(commit=False)
    assert len(txn_index_entries(partition_log)) == 31
    filler = []

    clean(manager, partition_log, NOW, filler)      # aborted and superseded records go, every marker stays
    assert read_committed(partition_log) == latest(committed + filler)
    markers = [m for m in read_all(partition_log) if m[0] == "marker"]
    assert len(markers) == 62
    assert len(txn_index_entries(partition_log)) == 31      # each aborted transaction's batch was read

    clean(manager, partition_log, NOW, filler)      # the markers of the transactions gone get a delete horizon
    found, _ = log_batches(partition_log)
    horizons = [(b.base_timestamp, records[0].timestamp) for b, records in found
                if b.is_control_batch and b.attributes & DELETE_HORIZON_FLAG]
    assert horizons == [(NOW + RETENTION, NOW)] * 60
    assert txn_index_entries(partition_log) == [AbortedTxn(2, last_abort[0][0], abort_marker, abort_marker + 1)]
    assert read_committed(partition_log) == latest(committed + filler)

    clean(manager, partition_log, NOW + RETENTION - 1, filler)     # within the horizon: kept
    assert len([m for m in read_all(partition_log) if m[0] == "marker"]) == 62

    clean(manager, partition_log, NOW + RETENTION, filler)
    assert read_all(partition_log) == sorted(latest(committed + filler) + [
        ("marker", last_commit[0][0] + 1, 1),       # the producers' last transactions: their batches stay
        ("marker", abort_marker, 2)], key=lambda r: r[1] if r[0] == "marker" else r[0])
    found, _ = log_batches(partition_log)
    assert [(b.base_offset, b.records_count) for b, _ in found if b.producer_id == 2] == [
        (last_abort[0][0], 0), (abort_marker, 1)]      # the aborter's last batch, emptied, and its abort
    assert read_committed(partition_log) == latest(committed + filler)
    assert len(txn_index_entries(partition_log)) == 1


def test_an_abort_whose_marker_is_past_the_cleaned_part_still_drops_its_records(manager):
    partition_log = compacted(manager, **{"delete.retention.ms": RETENTION, "min.compaction.lag.ms": DAY // 2})
    kept = put(partition_log, b"k", b"committed")
    aborter = Producer(partition_log, 2)
    aborter.send((b"k", b"aborted"))
    partition_log.roll()
    young = RecordsBuilder(2, "none", producer_id=2, producer_epoch=0, base_sequence=1, transactional=True)
    young.append(b"aborted too", key=b"k", timestamp=NOW)     # younger than min.compaction.lag.ms: not cleaned
    assert partition_log.append(young.build(), now_ms=NOW).error_code == ErrorCode.NONE
    marker = aborter.end(commit=False)
    partition_log.roll()
    manager.cleaner.clean("t", 0, now_ms=NOW)
    assert manager.cleaner.first_dirty_offset("t", 0) == 2
    assert read_all(partition_log) == [kept, (2, b"k", b"aborted too"), ("marker", marker, 2)]
    assert read_committed(partition_log) == [kept]
    assert txn_index_entries(partition_log) == [AbortedTxn(2, 1, 3, 4)]


def test_a_fenced_producers_last_marker_stays_as_an_empty_batch(tmp_path):
    manager = open_manager(tmp_path)
    partition_log = compacted(manager, **{"delete.retention.ms": RETENTION})
    producer = Producer(partition_log, 3)
    producer.send((b"k", b"aborted"))
    marker = producer.end(commit=False, epoch=1)   # the coordinator fenced the producer: a marker of epoch 1
    filler = []
    for now in (NOW, NOW, NOW + RETENTION):
        clean(manager, partition_log, now, filler)
    found, _ = log_batches(partition_log)
    batches = [(b.base_offset, b.is_control_batch, b.producer_epoch, b.records_count, b.control_type)
               for b, _ in found if b.producer_id == 3]
    assert batches == [(marker, True, 1, 0, None)]          # the epoch survives, the transaction does not
    assert txn_index_entries(partition_log) == []
    end = partition_log.log_end_offset
    manager.close()
    crash(tmp_path)                 # recovery replays the log: an empty marker has nothing to replay
    reopened = open_manager(tmp_path)
    try:
        partition_log = reopened.get_partition("t", 0)
        assert partition_log.log_end_offset == end
        state = partition_log.producers.state(3)
        assert (state.epoch, state.coordinator_epoch) == (1, 0)
    finally:
        reopened.close()


def test_a_segment_taken_back_from_a_group_is_read_again_with_its_transactions(manager):
    partition_log = compacted(manager, **{"segment.bytes": 4000})
    # The first segment keeps a few records in eight: the group guesses the next keeps as little and tries it,
    # but it keeps everything, so it is taken back and cleaned into a segment of its own.
    kept = [put(partition_log, b"key-%d" % i, b"v") for i in range(7)]
    kept += [put(partition_log, b"hot", b"%d" % i) for i in range(44)][-1:]
    partition_log.roll()
    aborter = Producer(partition_log, 5)
    aborted = aborter.send((b"aborted", b"x"))[0][0]        # the producer's last batch: kept emptied, indexed
    marker = aborter.end(commit=False)
    kept += [put(partition_log, b"cold-%d" % i, b"v" * 60) for i in range(27)]
    partition_log.roll()
    manager.cleaner.clean("t", 0, now_ms=NOW)
    assert aborted in [s.base_offset for s in partition_log.segments]
    assert read_all(partition_log) == sorted(kept + [("marker", marker, 5)],
                                             key=lambda r: r[1] if r[0] == "marker" else r[0])
    assert read_committed(partition_log) == sorted(kept)
    assert txn_index_entries(partition_log) == [AbortedTxn(5, aborted, marker, marker + 1)]


# --- which transactions aborted, read a few entries at a time ---------------------------------------------------

def random_transactions(rng, producers, count):
    """A log of ``count`` transactions of ``producers`` interleaved, some long: ``([(offset, producer id)]
    data batches and markers in offset order, {offset of a data batch: aborted}, [AbortedTxn] in marker order,
    {marker offset: its transaction's data batch offsets})``, the AbortedTxn last stable offsets as the log
    computes them (the first offset of the oldest transaction still open, else the offset after the marker)."""
    events, aborted_batches, entries, txn_batches = [], {}, [], {}
    open_txns = {}                  # pid -> (first offset, will abort, [data batch offsets], batches left)
    offset = 0
    started = 0
    while started < count or open_txns:
        pid = rng.randrange(producers)
        if pid not in open_txns:
            if started == count:
                continue
            started += 1
            open_txns[pid] = (offset, rng.random() < 0.5, [], rng.choice([1, 1, 2, 3, 40]))
        first, abort, batches, left = open_txns[pid]
        if left:
            events.append((offset, pid))
            batches.append(offset)
            open_txns[pid] = (first, abort, batches, left - 1)
        else:
            events.append((offset, pid, "marker"))
            del open_txns[pid]
            txn_batches[offset] = batches
            for b in batches:
                aborted_batches[b] = abort
            if abort:
                lso = min((f for f, *_ in open_txns.values()), default=offset + 1)
                entries.append(AbortedTxn(pid, first, offset, lso))
        offset += 1
    return events, aborted_batches, entries, txn_batches


def write_segments(directory, entries, bases):
    indexes = []
    for i, base in enumerate(bases):
        end = bases[i + 1] if i + 1 < len(bases) else float("inf")
        index = TransactionIndex(str(directory / f"{base:020d}.txnindex"), base)
        index.extend(e for e in entries if base <= e.last_offset < end)
        indexes.append(index)
    return indexes


class Cleaned:
    def __init__(self):
        self.aborted = []

    def add_aborted(self, txn):
        self.aborted.append(txn)


@pytest.mark.parametrize("seed", range(20))
def test_the_aborted_transactions_read_from_the_index_match_the_log(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(cleaner, "READ_ENTRIES", 7)       # many chunks, read again once dropped
    monkeypatch.setattr(CleanedTransactions, "FORGET_RESUMES", 3)     # the producers' resume points pruned
    rng = random.Random(seed)
    events, aborted_batches, entries, txn_batches = random_transactions(rng, producers=rng.choice([2, 5, 30]),
                                                                        count=300)
    bases = sorted({0, *rng.sample(range(1, len(events)), 5)})
    indexes = write_segments(tmp_path, entries, bases)
    gone = {b for marker, batches in txn_batches.items() if rng.random() < 0.3 for b in batches}
    start = rng.choice([0, 0, bases[2]])     # a pass from the log start, or the map's fill from a dirty offset
    transactions = CleanedTransactions(indexes, start)
    transactions.cleaned = Cleaned()
    for event in events:
        offset, pid = event[:2]
        batch = SimpleNamespace(base_offset=offset, last_offset=offset, producer_id=pid, is_transactional=True)
        if offset < start or (offset in gone):       # before the pass, or cleaned away before
            continue
        if len(event) == 2:
            assert transactions.on_batch_read(batch) == aborted_batches[offset], (seed, event)
        else:
            alone = not any(start <= b and b not in gone for b in txn_batches[offset])
            assert transactions.on_marker_read(batch) == alone, (seed, event)
    expected = [e for e in entries if any(start <= b and b not in gone for b in txn_batches[e.last_offset])]
    assert transactions.cleaned.aborted == expected


def test_a_pass_over_100k_aborted_transactions_holds_a_bounded_memory(manager):
    partition_log = compacted(manager, **{"segment.bytes": 1 << 20})
    producer = Producer(partition_log, 4)
    for i in range(100_000):
        producer.send((b"k%d" % (i % 100), b"v"))
        producer.end(commit=False)
    kept = put(partition_log, b"k", b"committed")
    partition_log.roll()
    tracemalloc.start()
    try:
        manager.cleaner.clean("t", 0, now_ms=NOW)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20           # the entries alone would take 20 MB held at once
    assert read_committed(partition_log) == [kept]
    assert len(txn_index_entries(partition_log)) == 100_000     # each transaction's batch was read: kept
