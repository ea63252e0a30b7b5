"""A log directory after transactions (the broker stopped cleanly, or SIGKILLed, restarted and stopped), read
back with readers written here from Kafka's layouts alone (no kmem code): what Kafka 3.9's storage and
transaction coordinator would load to continue it.

- ``__transaction_state``: every record decodes with Kafka's ``TransactionLogKey`` (v0) and
  ``TransactionLogValue`` (v0) schemas (transaction-coordinator/src/main/resources/common/message/), and the
  last one of each transactional id says how its transaction ended;
- the markers: control batches whose key is ``EndTransactionMarker``'s (version 0, type) and value (version 0,
  coordinator epoch);
- ``.txnindex``: one 34-byte ``AbortedTxn`` entry (version, producer id, first offset, last offset, last
  stable offset) per aborted transaction, as Kafka's ``ProducerStateManager`` computes them from the log;
- the producer snapshots (``ProducerSnapshot`` v1, CRC-32C): each producer's epoch, sequence, coordinator
  epoch and open transaction's first offset as Kafka's ``ProducerStateEntry`` has them after the log.

Batches are read with kafka-python's record reader."""
import glob
import os
import signal
import struct

import crc32c
import pytest
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka.record.memory_records import MemoryRecords

from broker_helpers import TIMEOUT, start_broker_process, wait_for

# Kafka's TransactionState ids
EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT = range(6)
ABORT, COMMIT = 0, 1                 # ControlRecordType


def read_batches(directory):
    """``[(batch, [records])]`` of a partition's segments, in offset order."""
    batches = []
    for path in sorted(glob.glob(os.path.join(directory, "*.log"))):
        with open(path, "rb") as f:
            records = MemoryRecords(f.read())
        while records.has_next():
            batch = records.next_batch()
            batches.append((batch, list(batch)))
    return batches


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def string(self):
        size = self.take(">h")
        text = self.data[self.pos:self.pos + size].decode()
        self.pos += size
        return text

    def done(self):
        assert self.pos == len(self.data), f"{len(self.data) - self.pos} bytes left over"


def transaction_log_key(data):
    """TransactionLogKey: version (int16) 0, TransactionalId (string)."""
    r = Reader(data)
    assert r.take(">h") == 0
    transactional_id = r.string()
    r.done()
    return transactional_id


def transaction_log_value(data):
    """TransactionLogValue v0: ProducerId int64, ProducerEpoch int16, TransactionTimeoutMs int32,
    TransactionStatus int8, TransactionPartitions nullable [Topic string, PartitionIds [int32]],
    TransactionLastUpdateTimestampMs int64, TransactionStartTimestampMs int64."""
    r = Reader(data)
    assert r.take(">h") == 0                    # Kafka 3.9 writes v0 (v1 needs transaction.version 1)
    value = dict(zip(("producer_id", "producer_epoch", "timeout_ms", "state"), r.take(">qhib")))
    count = r.take(">i")
    if count < 0:
        value["partitions"] = None
    else:
        value["partitions"] = set()
        for _ in range(count):
            topic = r.string()
            value["partitions"] |= {(topic, r.take(">i")) for _ in range(r.take(">i"))}
    value["last_update_ms"], value["start_ms"] = r.take(">qq")
    r.done()
    return value


def transaction_state(log_dir):
    """The last value of each transactional id in ``__transaction_state`` (every record decoded)."""
    last = {}
    for directory in glob.glob(os.path.join(log_dir, "__transaction_state-*")):
        for batch, records in read_batches(directory):
            assert not batch.is_control_batch and batch.compression_type == 0        # Kafka enforces none
            for record in records:
                last[transaction_log_key(record.key)] = (None if record.value is None
                                                         else transaction_log_value(record.value))
    return last


def replay(batches):
    """Kafka's producer state (``ProducerAppendInfo``) and aborted transactions after ``batches``:
    ``({producer id: snapshot fields}, [AbortedTxn fields])``."""
    producers, aborted, open_firsts = {}, [], {}
    for batch, records in batches:
        pid = batch.producer_id
        if pid < 0:
            continue
        entry = producers.setdefault(pid, {"epoch": batch.producer_epoch, "last_sequence": -1, "last_offset": -1,
                                           "offset_delta": 0, "timestamp": -1, "coordinator_epoch": -1,
                                           "txn_first_offset": -1})
        if entry["epoch"] != batch.producer_epoch:                   # a new epoch forgets the batches
            entry.update(epoch=batch.producer_epoch, last_sequence=-1, last_offset=-1, offset_delta=0)
        if batch.is_control_batch:
            key, value = records[0].key, records[0].value
            version, marker_type = struct.unpack(">hh", key)
            value_version, coordinator_epoch = struct.unpack(">hi", value)
            assert (version, value_version, batch.last_offset) == (0, 0, batch.base_offset)
            first = open_firsts.pop(pid, None)
            if first is not None and marker_type == ABORT:
                others = [f for p, f in open_firsts.items()]
                aborted.append((0, pid, first, batch.base_offset, min(others) if others else batch.base_offset + 1))
            entry.update(coordinator_epoch=coordinator_epoch, txn_first_offset=-1, timestamp=records[0].timestamp)
        else:
            entry.update(last_sequence=batch.last_sequence, last_offset=batch.last_offset,
                         offset_delta=batch.last_offset_delta, timestamp=batch.max_timestamp)
            if batch.is_transactional and pid not in open_firsts:
                open_firsts[pid] = batch.base_offset
            entry["txn_first_offset"] = open_firsts.get(pid, -1)
    return producers, aborted


def txn_index_entries(directory):
    entries = []
    for path in sorted(glob.glob(os.path.join(directory, "*.txnindex"))):
        with open(path, "rb") as f:
            data = f.read()
        assert len(data) % 34 == 0, path
        entries += [struct.unpack_from(">hqqqq", data, pos) for pos in range(0, len(data), 34)]
    return entries


def newest_snapshot(directory):
    """ProducerSnapshot v1: Version int16, Crc uint32 (CRC-32C of what follows), ProducerEntries [ProducerId
    int64, Epoch int16, LastSequence int32, LastOffset int64, OffsetDelta int32, Timestamp int64,
    CoordinatorEpoch int32, CurrentTxnFirstOffset int64]."""
    paths = sorted(glob.glob(os.path.join(directory, "*.snapshot")))
    assert paths, directory
    with open(paths[-1], "rb") as f:
        data = f.read()
    r = Reader(data)
    version, crc = r.take(">hI")
    assert version == 1 and crc == crc32c.crc32c(data[6:])
    producers = {}
    for _ in range(r.take(">i")):
        pid, *fields = r.take(">qhiqiqiq")
        producers[pid] = dict(zip(("epoch", "last_sequence", "last_offset", "offset_delta", "timestamp",
                                   "coordinator_epoch", "txn_first_offset"), fields))
    r.done()
    return int(os.path.basename(paths[-1]).split(".")[0]), producers


def transactional(bootstrap, transactional_id, timeout_ms=60000):
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": timeout_ms})
    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    return producer


def end_offsets(bootstrap, isolation_level):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = {TopicPartition("t", p): OffsetSpec.latest() for p in range(2)}
    return [future.result(TIMEOUT).offset for _, future in sorted(
        admin.list_offsets(partitions, isolation_level=isolation_level).items(), key=lambda item: item[0].partition)]


def settled(bootstrap):
    """Every partition's last stable offset is its end (ListOffsets read_committed and read_uncommitted)."""
    return end_offsets(bootstrap, IsolationLevel.READ_COMMITTED) == \
        end_offsets(bootstrap, IsolationLevel.READ_UNCOMMITTED)


def stop(process, how):
    process.send_signal(how)
    process.wait()


@pytest.mark.parametrize("stopped", ["cleanly", "by SIGKILL, restarted"])
def test_a_log_directory_after_transactions_is_one_kafka_continues(tmp_path, stopped):
    """Committed, aborted, aborted at its timeout (the producer gone), and one open at the stop; the broker
    stopped cleanly, or killed and restarted (recovery rebuilds producer state and .txnindex), then stopped."""
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, "--override", "num.partitions=2", "--override",
                                              "transaction.abort.timed.out.transaction.cleanup.interval.ms=50")
    try:
        plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        plain.produce("t", b"p1", partition=1)
        plain.flush(TIMEOUT)
        committed = transactional(bootstrap, "committed")
        committed.produce("t", b"c0", partition=0)
        committed.produce("t", b"c1", partition=1)
        committed.commit_transaction(TIMEOUT)
        aborted = transactional(bootstrap, "aborted")
        aborted.produce("t", b"a1", partition=1)
        aborted.flush(TIMEOUT)
        aborted.abort_transaction(TIMEOUT)
        hanging = transactional(bootstrap, "hanging", timeout_ms=1000)      # never ended: aborted at its timeout
        hanging.produce("t", b"h0", partition=0)
        hanging.flush(TIMEOUT)
        wait_for(lambda: settled(bootstrap), "the hanging transaction aborted")
        still_open = transactional(bootstrap, "open")                        # open when the broker stops
        still_open.produce("t", b"o1", partition=1)
        still_open.flush(TIMEOUT)
    finally:
        stop(process, signal.SIGTERM if stopped == "cleanly" else signal.SIGKILL)
    if stopped != "cleanly":
        process, bootstrap = start_broker_process(log_dir)
        stop(process, signal.SIGTERM)
    assert process.returncode == 0 or stopped != "cleanly"
    state = transaction_state(log_dir)
    assert {t: v["state"] for t, v in state.items()} == {
        "committed": COMPLETE_COMMIT, "aborted": COMPLETE_ABORT, "hanging": COMPLETE_ABORT, "open": ONGOING}
    assert state["open"]["partitions"] == {("t", 1)} and state["open"]["timeout_ms"] == 60000
    assert state["hanging"]["producer_epoch"] == 1                          # fenced by the abort's epoch bump
    assert all(v["partitions"] == set() for t, v in state.items() if t != "open")
    by_pid = {v["producer_id"]: t for t, v in state.items()}
    for partition in range(2):
        directory = os.path.join(log_dir, f"t-{partition}")
        batches = read_batches(directory)
        producers, aborted_txns = replay(batches)
        assert txn_index_entries(directory) == aborted_txns
        snapshot_offset, snapshot = newest_snapshot(directory)
        assert snapshot_offset == batches[-1][0].next_offset
        assert snapshot == producers
        open_txns = {by_pid.get(pid): entry["txn_first_offset"] for pid, entry in snapshot.items()
                     if entry["txn_first_offset"] >= 0}
        markers = {by_pid[b.producer_id]: r[0].key[3] for b, r in batches if b.is_control_batch}
        if partition == 0:
            assert open_txns == {} and markers == {"committed": COMMIT, "hanging": ABORT}
            assert [entry[1] for entry in aborted_txns] == [state["hanging"]["producer_id"]]
        else:
            assert open_txns == {"open": 5} and markers == {"committed": COMMIT, "aborted": ABORT}
            assert [entry[1] for entry in aborted_txns] == [state["aborted"]["producer_id"]]
