"""kmem.broker idempotent producers: Kafka's sequence and epoch checks over a PidLedger, duplicates answered
with their original offsets (also after a restart), and memory that stays flat as producer ids grow."""
import gc
import os
import time
import tracemalloc

import pytest

from kmem.broker import READ_COMMITTED, BrokerConfig, ErrorCode, LogManager
from kmem.ledger import read_snapshot
from kmem.records import RecordsBuilder, build_control_batch

INT32_MAX = 2**31 - 1


def now_ms():
    return time.time_ns() // 1_000_000


def produce(partition_log, producer_id, epoch, sequence, count=1, transactional=False, **kwargs):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                             transactional=transactional)
    for i in range(count):
        builder.append(b"%d-%d-%d" % (producer_id, sequence, i), timestamp=now_ms())
    return partition_log.append(builder.build(), **kwargs)


def open_manager(path, clock=None, **settings):
    return LogManager(path, BrokerConfig.from_properties(**{"producer_ledger_ids": 100, **settings}), clock_ms=clock)


@pytest.fixture
def partition_log(tmp_path):
    manager = open_manager(tmp_path)
    manager.create_topic("t")
    yield manager.get_partition("t", 0)
    manager.close()


def test_in_order_and_duplicates_of_the_last_five_batches(partition_log):
    offsets = []
    for n in range(8):
        result = produce(partition_log, 1, 0, 3 * n, count=3)
        assert (result.error_code, result.duplicate) == (ErrorCode.NONE, False)
        offsets.append((result.base_offset, result.last_offset))
    assert offsets[-1] == (21, 23)
    for n in range(3, 8):                       # each of the last five, retried
        again = produce(partition_log, 1, 0, 3 * n, count=3)
        assert (again.error_code, again.duplicate) == (ErrorCode.NONE, True)
        assert (again.base_offset, again.last_offset) == offsets[n]
    assert partition_log.log_end_offset == 24, "duplicates are not appended again"
    older = produce(partition_log, 1, 0, 3 * 2, count=3)        # the sixth from the end is forgotten
    assert older.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    partial = produce(partition_log, 1, 0, 3 * 7, count=2)      # same first sequence, other last: not a duplicate
    assert partial.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_gap_fenced_epoch_and_new_epoch(partition_log):
    assert produce(partition_log, 1, 3, 0, count=2).error_code == ErrorCode.NONE
    gap = produce(partition_log, 1, 3, 5)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and gap.base_offset == -1
    fenced = produce(partition_log, 1, 2, 2)
    assert fenced.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert produce(partition_log, 1, 4, 7).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(partition_log, 1, 4, 0).error_code == ErrorCode.NONE     # a new epoch starts at 0
    assert produce(partition_log, 1, 3, 2).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert produce(partition_log, 2, 0, 42).error_code == ErrorCode.NONE, "an unknown producer starts anywhere"
    assert partition_log.log_end_offset == 4


def test_sequence_wraps_after_int32_max(partition_log):
    assert produce(partition_log, 1, 0, INT32_MAX - 1, count=2).error_code == ErrorCode.NONE
    assert produce(partition_log, 1, 0, 0).error_code == ErrorCode.NONE


def test_a_restart_still_recognises_the_last_batch(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        firsts = [produce(partition_log, pid, 0, 0, count=2) for pid in (10, 11)]
        last = produce(partition_log, 10, 0, 2, count=2)
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        again = produce(partition_log, 10, 0, 2, count=2)
        assert (again.duplicate, again.base_offset, again.last_offset) == (True, last.base_offset, last.last_offset)
        other = produce(partition_log, 11, 0, 0, count=2)
        assert (other.duplicate, other.base_offset) == (True, firsts[1].base_offset)
        # A Kafka snapshot keeps only each producer's last batch: an older retry is out of order.
        assert produce(partition_log, 10, 0, 0, count=2).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(partition_log, 10, 0, 4).base_offset == 6
        assert produce(partition_log, 10, 0, 9).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_evicted_producers_are_read_back_from_the_ledger(tmp_path):
    with open_manager(tmp_path, producer_state_cache_entries=2, log_segment_bytes=2000) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        results = {pid: produce(partition_log, pid, 0, 0) for pid in range(50)}
        assert len(partition_log.segments) >= 2         # rolls flushed the ledger into snapshots
        snapshots = sorted(n for n in os.listdir(partition_log.directory) if n.endswith(".snapshot"))
        # Each roll flushed the ledger into a Kafka producer snapshot named at most at the roll offset.
        rolls = [s.base_offset for s in partition_log.segments[1:]]
        assert [int(n[:20]) for n in snapshots] == rolls
        entries = read_snapshot(os.path.join(partition_log.directory, snapshots[0]))
        assert sorted(e.producer_id for e in entries) == list(range(rolls[0]))
        assert all(e.last_offset == e.producer_id and e.epoch == 0 for e in entries)
        for pid in (0, 17, 49):
            again = produce(partition_log, pid, 0, 0)
            assert (again.duplicate, again.base_offset) == (True, results[pid].base_offset)
            assert produce(partition_log, pid, 0, 5).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_expired_producers_are_forgotten_at_the_periodic_check(tmp_path):
    clock = [now_ms()]
    with open_manager(tmp_path, clock=lambda: clock[0], producer_id_expiration_ms=60_000) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        assert produce(partition_log, 1, 0, 0).error_code == ErrorCode.NONE
        assert produce(partition_log, 1, 0, 5).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        clock[0] += 61_000
        # Kafka's removeExpiredProducers runs every producer.id.expiration.check.interval.ms: until then
        # the producer is known
        assert produce(partition_log, 1, 0, 5).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        manager.remove_expired_producers()
        assert produce(partition_log, 1, 0, 5).error_code == ErrorCode.NONE


def old_batch(producer_id, sequence, timestamp):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=0, base_sequence=sequence)
    builder.append(b"backfill-%d" % sequence, timestamp=timestamp)
    return builder.build()


def test_a_producer_writing_timestamps_older_than_the_expiration_is_kept_until_the_check(tmp_path):
    """A backfill: CreateTime timestamps two days old. Kafka keeps the producer until its next check."""
    clock = [now_ms()]
    two_days_ago = clock[0] - 2 * 86_400_000
    with open_manager(tmp_path, clock=lambda: clock[0]) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        first = partition_log.append(old_batch(7, 0, two_days_ago))
        retried = partition_log.append(old_batch(7, 0, two_days_ago))
        assert (retried.duplicate, retried.base_offset) == (True, first.base_offset)
        assert partition_log.append(old_batch(7, 3, two_days_ago)).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert partition_log.append(old_batch(7, 1, two_days_ago)).error_code == ErrorCode.NONE
        clock[0] += 1
        manager.remove_expired_producers()
        assert partition_log.append(old_batch(7, 3, two_days_ago)).error_code == ErrorCode.NONE   # unknown now
        assert partition_log.log_end_offset == 3


def test_open_transaction_bounds_the_last_stable_offset(partition_log):
    assert produce(partition_log, 1, 0, 0).error_code == ErrorCode.NONE
    txn = produce(partition_log, 2, 0, 0, count=2, transactional=True)
    assert produce(partition_log, 1, 0, 1).error_code == ErrorCode.NONE
    assert partition_log.last_stable_offset == txn.base_offset == 1
    committed = partition_log.read(0, 1 << 20, isolation=READ_COMMITTED)
    with committed.records as records:
        assert [b.last_offset for b in records] == [0]
    marker = build_control_batch(1, offset=0, producer_id=2, producer_epoch=0, timestamp=now_ms())
    assert partition_log.append(marker, origin="client").error_code == ErrorCode.INVALID_RECORD
    assert partition_log.append(marker, origin="coordinator").error_code == ErrorCode.NONE
    assert partition_log.last_stable_offset == partition_log.log_end_offset == 5
    keyless = RecordsBuilder(2, "none", producer_id=2, producer_epoch=0, transactional=True, control=True)
    keyless.append(b"", key=b"\0")        # a marker key is 4 bytes: version and type
    refused = partition_log.append(keyless.build(), origin="coordinator")
    assert (refused.error_code, partition_log.log_end_offset) == (ErrorCode.INVALID_RECORD, 5)


def test_memory_stays_flat_as_producer_ids_grow(tmp_path):
    with open_manager(tmp_path, producer_state_cache_entries=500, producer_ledger_ids=2000) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        stamp = now_ms()

        def produce_from(pids):
            for pid in pids:
                builder = RecordsBuilder(2, "none", producer_id=pid, producer_epoch=0, base_sequence=0)
                builder.append(b"v", timestamp=stamp)
                assert partition_log.append(builder.build()).error_code == ErrorCode.NONE

        tracemalloc.start()     # from the start: what the full cache and ledger hold is counted in ``before``
        try:
            produce_from(range(5_000))
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            produce_from(range(5_000, 25_000))
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # Kafka keeps every producer in the heap (about 90 bytes of entry alone, each); here the 20,000 new
        # producers cost the ledger's in-heap index (1/16 byte each plus a few objects per snapshot).
        assert grown < 100_000, grown
        again = produce(partition_log, 7, 0, 0)
        assert again.duplicate and again.base_offset == 7


class _ModelBatch:
    """A data batch as the producer state reads it (the validator's ``BatchInfo`` fields)."""

    def __init__(self, epoch, first, last, base_offset, timestamp, transactional):
        self.producer_id, self.producer_epoch, self.base_sequence, self.last_sequence = 7, epoch, first, last
        self.base_offset, self.last_offset = base_offset, base_offset + (last - first) % (INT32_MAX + 1)
        self.max_timestamp, self.is_transactional, self.is_control = timestamp, transactional, False


def _model_check_and_add(model, batch, from_client, replication, known):
    """Kafka's ProducerAppendInfo for a data batch, written out plainly: ``model`` is
    ``{"epoch", "batches": [(first, last, last offset, delta, timestamp)], "txn", "timestamp"}``."""
    same_epoch = batch.producer_epoch == model["epoch"]
    if from_client and same_epoch:
        for i, kept in enumerate(model["batches"]):
            if kept[:2] == (batch.base_sequence, batch.last_sequence):
                return i + 1
    if batch.producer_epoch < model["epoch"] and not replication:
        return -1
    if from_client and known and model["epoch"] != -1:
        last = model["batches"][-1][1] if model["batches"] else -1
        if not same_epoch and batch.base_sequence != 0:
            return -2
        if same_epoch and not (batch.base_sequence == last + 1 or (batch.base_sequence == 0 and last == INT32_MAX)):
            return -3
    if not same_epoch:
        model["epoch"], model["batches"] = batch.producer_epoch, []
    model["batches"] = (model["batches"] + [(batch.base_sequence, batch.last_sequence, batch.last_offset,
                                            batch.last_offset - batch.base_offset, batch.max_timestamp)])[-5:]
    model["timestamp"] = batch.max_timestamp
    if batch.is_transactional and model["txn"] == -1:
        model["txn"] = batch.base_offset
    return 0


def test_the_cores_producer_state_checks_and_adds_as_kafkas_rules_say():
    # random data batches (in order, duplicates, gaps, old and new epochs, sequences wrapping) against the model
    import random

    from kmem import _core
    from kmem.broker.log.producer_state import ProducerState

    assert issubclass(ProducerState, _core.ProducerStateCore) and type(_core).__name__ == "module" \
        and _core.__file__.endswith(".so")
    assert (_core.PRODUCER_EPOCH_FENCED, _core.NEW_EPOCH_NOT_AT_ZERO, _core.SEQUENCE_OUT_OF_ORDER) == (-1, -2, -3)
    rng = random.Random(20261129)
    verdicts = set()
    for _ in range(300):
        state, known = ProducerState(7), rng.random() < 0.5
        model = {"epoch": -1, "batches": [], "txn": -1, "timestamp": -1}
        offset, sequence, epoch = 0, rng.choice([0, INT32_MAX - 3]), rng.randrange(3)
        for _ in range(40):
            roll = rng.random()
            if roll < 0.1:
                epoch += 1
                sequence = rng.choice([0, 0, 5])
            elif roll < 0.15:
                epoch = max(0, epoch - 1)
            count = rng.randint(1, 3)
            first, last = sequence, (sequence + count - 1) % (INT32_MAX + 1)
            if roll > 0.85 and model["batches"]:            # a retry of a kept batch, or a gap
                first, last = rng.choice(model["batches"])[:2] if roll > 0.92 else (first + 2, last + 2)
            batch = _ModelBatch(epoch, first, last, offset, rng.randrange(10**6), rng.random() < 0.2)
            from_client, replication = rng.random() < 0.8, rng.random() < 0.1
            before = state.copy()
            verdict = state.check_and_add(batch, from_client, replication, known)
            assert verdict == _model_check_and_add(model, batch, from_client, replication, known)
            verdicts.add(max(-4, min(verdict, 1)))
            if verdict:                                     # refused or a duplicate: nothing changed
                assert state.entry_fields() == before.entry_fields() and state.batches == before.batches
                continue
            known, offset = True, batch.last_offset + 1
            sequence = (last + 1) % (INT32_MAX + 1)
            assert [tuple(b) for b in state.batches] == model["batches"]
            assert (state.epoch, state.timestamp, state.current_txn_first_offset) == \
                (model["epoch"], model["timestamp"], model["txn"])
            assert state.to_entry() == (7, model["epoch"], model["batches"][-1][1], model["batches"][-1][2],
                                        model["batches"][-1][3], model["timestamp"], -1, model["txn"])
    assert verdicts == {-3, -2, -1, 0, 1}, "every outcome was met"


def test_the_cores_producer_state_refuses_values_it_cannot_hold():
    from kmem.broker.log.producer_state import BatchMetadata, ProducerState

    with pytest.raises(OverflowError):
        ProducerState(2**63)
    with pytest.raises(TypeError):
        ProducerState("7")
    with pytest.raises((TypeError, ValueError)):
        ProducerState(7, 0, [(1, 2, 3)])                    # a batch is five fields
    state = ProducerState(7, 0, [BatchMetadata(0, 4, 10, 4, 99)] * 7)
    assert len(state.batches) == 5 and state.last_seq == 4 and state.last_offset == 10
    assert ProducerState(7).to_entry() == (7, -1, -1, -1, 0, -1, -1, -1)
    with pytest.raises(AttributeError):
        state.producer_id = 8                               # read-only: the state's key in the cache


def test_an_appends_producer_state_steps_are_the_cores_and_keep_the_least_recently_used(tmp_path):
    """``ProducerStateManager``'s check, reservation and storing of an append's states are the core's
    (``ProducerStatesCore``, as is the ledger's reservation): at most ``cache_entries`` states stay, the least
    recently used going first and read back from the ledger; an open transaction is listed until its marker;
    a state whose timestamp is already expired is kept until the next expiry check."""
    from kmem import _core
    from kmem.broker.log.producer_state import ProducerStateManager
    from kmem.broker.log.validator import BatchInfo

    for name in ("state", "check", "reserve", "apply", "_remember", "expired"):
        assert getattr(ProducerStateManager, name) is getattr(_core.ProducerStatesCore, name)
    now = 10_000_000
    producers = ProducerStateManager(tmp_path, ledger_ids=1000, cache_entries=2, expiration_ms=60_000,
                                     clock_ms=lambda: now)
    assert producers.ledger.reserve == producers.ledger._core.reserve

    def append(pid, first, offset, timestamp=now, transactional=False):
        batch = BatchInfo(pid, 0, first, first, offset, offset, timestamp, transactional, False)
        duplicate, updated, completed = producers.check([batch])
        assert duplicate is None and completed == [] and list(updated) == [pid]
        producers.reserve(updated)
        producers.apply(updated)

    append(1, 0, 0)
    append(2, 0, 1, transactional=True)
    append(1, 1, 2)                     # 1 used again: 2 is the least recently used
    append(3, 0, 3)
    assert list(producers._cache) == [1, 3] and producers._ongoing == {2: 1}
    assert producers.first_unstable_offset == 1
    assert producers.state(2).last_offset == 1 and producers.state(2).current_txn_first_offset == 1   # the ledger's
    append(4, 0, 4, timestamp=now - 120_000)        # a backfill: expired already, kept until the next check
    assert producers.state(4) is not None and 4 in producers._stale
    producers.remove_expired(now)
    assert producers.state(4) is None and producers._stale == {}
    duplicate, updated, _ = producers.check([BatchInfo(1, 0, 1, 1, 9, 9, now, False, False)])
    assert duplicate is not None and duplicate.last_offset == 2 and updated == {}
    producers.close()
