"""What a Kafka broker finds in kmem's producer snapshots when it takes a log directory over.

KIP-1044 promises that the earlier implementation reads the ledger's storage without issue. Kafka 3.9 rebuilds
a partition's producers from one snapshot: at load it removes stray snapshots
(``ProducerStateManager.removeStraySnapshots``), drops those above the log end offset or at or below the log
start (``truncateAndReload``), reads the newest left (``readSnapshot``, expired producers dropped) and replays
the log after it; after a clean shutdown that snapshot is at the log end and nothing is replayed.
``kafka_producers`` does the same over the files, with a reader of Kafka's layout written from its
description (``snapshot_files.read_kafka_snapshot``) and kafka-python's record reader for the log. The tests
compare what it finds with the producers each partition was written by.
"""
import gc
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import crc32c
import pytest
import numpy as np
from kafka.record.memory_records import MemoryRecords
from snapshot_files import read_kafka_snapshot
from thread_helpers import switching_often

from kmem.broker import BrokerConfig, ErrorCode, LogManager
from kmem.ledger import ENTRY_DTYPE, PidLedger, ProducerEntry, write_ledger_snapshot
from kmem.records import RecordsBuilder

DAY = 86_400_000
# Small segments (a roll every ~30 batches) and a ledger flush every ~20 new producers: many snapshots at
# segment bases, and stray ones between them.
SETTINGS = dict(producer_ledger_ids=16, log_segment_bytes=3000)


def now_ms():
    return time.time_ns() // 1_000_000


def open_manager(path, clock=None, **settings):
    return LogManager(path, BrokerConfig.from_properties(**{**SETTINGS, **settings}), clock_ms=clock)


def offsets(directory, suffix):
    """The offsets in the names of a partition directory's ``<20 digits><suffix>`` files, in order."""
    names = (n for n in os.listdir(directory) if n.endswith(suffix) and len(n) == 20 + len(suffix))
    return sorted(int(n[:20]) for n in names if n[:20].isdigit())


def log_batches(directory):
    """The batches of a partition's segments in offset order, as kafka-python reads them."""
    for base in offsets(directory, ".log"):
        with open(os.path.join(directory, f"{base:020d}.log"), "rb") as f:
            records = MemoryRecords(f.read())
        while (batch := records.next_batch()) is not None:
            yield batch


def apply(state, batch):
    """Kafka's state of the batch's producer after it (``ProducerStateEntry`` of a client's data batch)."""
    if batch.producer_id >= 0:
        state[batch.producer_id] = ProducerEntry(batch.producer_id, batch.producer_epoch, batch.last_sequence,
                                                 batch.last_offset, batch.last_offset - batch.base_offset,
                                                 batch.max_timestamp, -1, -1)


def expired(entry, now, expiration_ms):
    """Kafka's ``isProducerExpired``."""
    return entry.current_txn_first_offset < 0 and now - entry.timestamp >= expiration_ms


def log_producers(directory, below=None):
    """Each producer's state after the log's batches (those ending below ``below`` only)."""
    state = {}
    for batch in log_batches(directory):
        if below is None or batch.last_offset < below:
            apply(state, batch)
    return state


def kafka_producers(directory, log_start_offset, log_end_offset, now, expiration_ms=DAY):
    """(the offset of the snapshot Kafka 3.9 loads, every producer it knows once loaded) for a partition."""
    bases = offsets(directory, ".log")
    snapshots = offsets(directory, ".snapshot")
    strays = [o for o in snapshots if o not in bases]
    kept = [o for o in snapshots if o in bases]                     # removeStraySnapshots
    if strays and (not bases or strays[-1] > max(bases)):
        kept.append(strays[-1])
    state, loaded = {}, log_start_offset
    for offset in sorted((o for o in kept if log_start_offset < o <= log_end_offset), reverse=True):
        try:                                                        # truncateAndReload, loadFromSnapshot
            entries = read_kafka_snapshot(os.path.join(directory, f"{offset:020d}.snapshot"))
        except ValueError:
            continue                # Kafka deletes a corrupt snapshot and loads the previous one
        state = {e.producer_id: e for e in entries if not expired(e, now, expiration_ms)}
        loaded = offset
        break
    for batch in log_batches(directory):                            # the log after it is replayed
        if batch.last_offset >= loaded and batch.last_offset < log_end_offset:
            apply(state, batch)
    return loaded, state


class Producers:
    """Idempotent producers writing to a topic's partitions (``pid % partitions``), now and then starting a
    new epoch (at sequence 0); ``expected[partition]`` is each one's state as Kafka keeps it, from the
    appends' results."""

    def __init__(self, manager, topic, partitions, seed):
        self.manager, self.topic, self.partitions = manager, topic, partitions
        self.rng = random.Random(seed)
        self.sessions = {}                  # pid -> (epoch, next sequence)
        self.expected = [{} for _ in range(partitions)]

    def produce(self, pid, timestamp):
        epoch, sequence = self.sessions.get(pid, (0, 0))
        if pid in self.sessions and self.rng.random() < 0.05:
            epoch, sequence = epoch + 1, 0
        count = self.rng.randrange(1, 4)
        builder = RecordsBuilder(2, "none", producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
        for i in range(count):
            builder.append(b"%d-%d-%d" % (pid, epoch, sequence + i), timestamp=timestamp)
        partition = pid % self.partitions
        result = self.manager.get_partition(self.topic, partition).append(builder.build())
        assert (result.error_code, result.duplicate) == (ErrorCode.NONE, False), result
        self.sessions[pid] = (epoch, sequence + count)
        self.expected[partition][pid] = ProducerEntry(pid, epoch, sequence + count - 1, result.last_offset,
                                                      count - 1, timestamp, -1, -1)

    def produce_randomly(self, producers, appends, timestamp=None):
        for _ in range(appends):
            self.produce(self.rng.randrange(producers), now_ms() if timestamp is None else timestamp)


def test_each_snapshot_holds_every_producer_at_its_offset_and_kafka_loads_them_all_after_a_clean_stop(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t", 2)
        producers = Producers(manager, "t", 2, seed=1)
        producers.produce_randomly(2000, 5000)              # ~1,900 producers, ~1,300 of them written again
        logs = [manager.get_partition("t", p) for p in range(2)]
        for partition_log, expected in zip(logs, producers.expected):
            directory = partition_log.directory
            bases = [s.base_offset for s in partition_log.segments]
            assert len(bases) > 30 and len(expected) > 800
            snapshots = offsets(directory, ".snapshot")
            assert set(bases[1:]) <= set(snapshots)             # one at each roll, at the new segment's base
            assert len(snapshots) > len(bases)                   # and flushes of the ledger between rolls
            for offset in snapshots:                             # each one what Kafka's would be at its offset
                entries = read_kafka_snapshot(os.path.join(directory, f"{offset:020d}.snapshot"))
                assert sorted(entries) == sorted(log_producers(directory, below=offset).values())
        ends = [(p.log_start_offset, p.log_end_offset, p.directory) for p in logs]
    now = now_ms()
    for (start, end, directory), expected in zip(ends, producers.expected):
        assert log_producers(directory) == expected             # (the test's own account agrees with the log)
        loaded, known = kafka_producers(directory, start, end, now)
        assert loaded == end, "a clean shutdown leaves a snapshot at the log end offset: nothing is replayed"
        assert known == expected

    with open_manager(tmp_path):                   # a load removes the strays, as Kafka's does
        pass
    for (start, end, directory), expected in zip(ends, producers.expected):
        bases = offsets(directory, ".log")
        assert offsets(directory, ".snapshot") == sorted({b for b in bases if b > start} | {end})
        assert kafka_producers(directory, start, end, now_ms()) == (end, expected)


def test_expired_producers_are_left_out_as_kafka_forgets_them(tmp_path):
    clock = [now_ms()]
    with open_manager(tmp_path, clock=lambda: clock[0]) as manager:
        manager.create_topic("t", 1)
        producers = Producers(manager, "t", 1, seed=2)
        old = clock[0]
        for pid in range(100):
            producers.produce(pid, old)
        clock[0] += 2 * DAY
        for pid in range(100, 250):
            producers.produce(pid, clock[0])
        manager.remove_expired_producers()          # Kafka's check every producer.id.expiration.check.interval.ms
        partition_log = manager.get_partition("t", 0)
        directory, end = partition_log.directory, partition_log.log_end_offset
    fresh = {pid: e for pid, e in producers.expected[0].items() if pid >= 100}
    (entries,) = [read_kafka_snapshot(os.path.join(directory, f"{o:020d}.snapshot"))
                  for o in offsets(directory, ".snapshot") if o == end]
    assert sorted(entries) == sorted(fresh.values())
    assert kafka_producers(directory, 0, end, clock[0]) == (end, fresh)


def test_deleted_segments_take_their_snapshots_along_and_no_producer(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t", 1)
        producers = Producers(manager, "t", 1, seed=3)
        for pid in range(600):                                 # producers that write once, early
            producers.produce(pid, now_ms())
        producers.produce_randomly(200, 1500)
        partition_log = manager.get_partition("t", 0)
        middle = partition_log.segments[len(partition_log.segments) // 2]
        partition_log.delete_records_before(middle.base_offset + 1)
        directory = partition_log.directory
        start, end = partition_log.log_start_offset, partition_log.log_end_offset
        # Kafka's deleteSnapshotsBefore: none below the log start offset is left
        assert offsets(directory, ".snapshot")[0] >= start and offsets(directory, ".log")[0] == middle.base_offset
        assert [o for o in offsets(directory, ".snapshot.bloom") if o < start] == []
    # The producers whose batches were deleted are still known (Kafka keeps them until they expire)
    assert kafka_producers(directory, start, end, now_ms()) == (end, producers.expected[0])


def test_an_unreadable_newest_snapshot_is_made_up_for_by_replaying_the_log(tmp_path, caplog):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t", 1)
        producers = Producers(manager, "t", 1, seed=4)
        producers.produce_randomly(400, 1500)
        for pid in range(5):                       # the last batches, after the newest snapshot before the close
            producers.produce(pid, now_ms())
        partition_log = manager.get_partition("t", 0)
        directory, end = partition_log.directory, partition_log.log_end_offset
    newest = os.path.join(directory, f"{end:020d}.snapshot")
    with open(newest, "r+b") as f:                  # a bit flips in the snapshot taken at the close
        f.seek(os.path.getsize(newest) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x04]))
    expected = producers.expected[0]
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        for pid, entry in expected.items():         # each producer's last batch, retried, is recognised
            first = entry.last_sequence - entry.offset_delta
            builder = RecordsBuilder(2, "none", producer_id=pid, producer_epoch=entry.epoch, base_sequence=first)
            for i in range(entry.offset_delta + 1):
                builder.append(b"retry", timestamp=entry.timestamp)
            again = partition_log.append(builder.build())
            assert (again.error_code, again.duplicate, again.last_offset) == (ErrorCode.NONE, True, entry.last_offset)
    assert "CRC" in caplog.text
    assert kafka_producers(directory, 0, end, now_ms()) == (end, expected)


CHILD = textwrap.dedent("""
    import random, sys, time
    from kmem.broker import BrokerConfig, LogManager
    from kmem.records import RecordsBuilder
    path, seed, epoch, producers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    manager = LogManager(path, BrokerConfig.from_properties(producer_ledger_ids=16, log_segment_bytes=3000))
    if manager.get_partition("t", 0) is None:
        manager.create_topic("t", 2)
    rng = random.Random(seed)
    sequences = {}
    print("ready", flush=True)
    while True:
        pid = rng.randrange(producers)
        sequence, count = sequences.get(pid, 0), rng.randrange(1, 4)
        builder = RecordsBuilder(2, "none", producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
        for i in range(count):
            builder.append(b"%d-%d" % (pid, sequence + i), timestamp=time.time_ns() // 1_000_000)
        result = manager.get_partition("t", pid % 2).append(builder.build())
        assert result.error_code == 0, result
        sequences[pid] = sequence + count
        print(pid, flush=True)
""")


def run_child_until_killed(path, seed, epoch, acknowledgements, producers=1500):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(seed), str(epoch), str(producers)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        for _ in range(acknowledgements):
            assert child.stdout.readline(), "the child stopped before being killed"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_after_a_sigkill_a_restart_and_a_clean_stop_kafka_knows_every_producer(tmp_path):
    for epoch in range(2):                          # each run a new epoch of the producers, from sequence 0
        run_child_until_killed(tmp_path, seed=epoch, epoch=epoch, acknowledgements=2500)
        with open_manager(tmp_path) as manager:     # recovers, then stops cleanly
            assert not manager.had_clean_shutdown
            logs = [manager.get_partition("t", p) for p in range(2)]
            assert all(len(partition_log.segments) > 20 for partition_log in logs)
            ends = [(p.log_start_offset, p.log_end_offset, p.directory) for p in logs]
        for start, end, directory in ends:
            expected = log_producers(directory)
            assert len(expected) > 500
            assert kafka_producers(directory, start, end, now_ms()) == (end, expected)


def batch_ends(path):
    """The file positions where the batches of the segment at ``path`` end, in order."""
    ends, position = [], 0
    with open(path, "rb") as f:
        data = f.read()
    while position + 12 <= len(data):
        position += 12 + struct.unpack_from(">i", data, position + 8)[0]
        ends.append(position)
    return ends


@pytest.mark.parametrize("lost", ["half a batch", "whole batches", "the active segment"])
def test_a_tail_lost_in_a_crash_leaves_no_producer_state_from_after_the_log_end(tmp_path, lost):
    """A crash that loses the log's tail (a torn batch, whole batches that never reached the disk, the
    active segment) while the ledger kept those producers' entries: recovery takes each back to the state
    of the log kept (replayed, else the snapshot's), so the snapshot at the new log end holds exactly the
    log below it, as Kafka's truncateAndReload would load it, and every snapshot still holds the log below
    its offset."""
    run_child_until_killed(tmp_path, seed=3, epoch=0, acknowledgements=1200, producers=40)
    directory = tmp_path / "t-0"
    bases = offsets(directory, ".log")
    last = directory / f"{bases[-1]:020d}.log"
    ends = batch_ends(last)
    if lost == "half a batch":
        os.truncate(last, ends[-1] - 7)
    elif lost == "whole batches":
        os.truncate(last, ends[-4] if len(ends) > 3 else 0)
    else:
        for name in os.listdir(directory):
            if name.startswith(f"{bases[-1]:020d}.") and not name.endswith(".snapshot"):
                os.unlink(directory / name)
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        start, end = partition_log.log_start_offset, partition_log.log_end_offset
        expected = log_producers(directory)
        assert {pid: partition_log.producers.state(pid).to_entry() for pid in expected} == expected
    assert kafka_producers(directory, start, end, now_ms()) == (end, expected)
    for offset in offsets(directory, ".snapshot"):
        entries = read_kafka_snapshot(os.path.join(directory, f"{offset:020d}.snapshot"))
        assert sorted(entries) == sorted(log_producers(directory, below=offset).values()), offset


def test_a_producer_whose_batches_were_all_lost_is_unknown_again(tmp_path):
    """The disk as a crash leaves it (the files copied while the broker runs), less the last segment's
    final batches: a producer known only from them is unknown after recovery (as to Kafka: no snapshot
    holds it), another goes back to its batch kept."""
    with open_manager(tmp_path / "running") as manager:
        manager.create_topic("t", 1)
        partition_log = manager.get_partition("t", 0)
        for pid, sequence in [(1, 0), (2, 0), (1, 1), (3, 0)]:
            builder = RecordsBuilder(2, "none", producer_id=pid, producer_epoch=0, base_sequence=sequence)
            builder.append(b"%d" % pid, timestamp=now_ms())
            assert partition_log.append(builder.build()).error_code == ErrorCode.NONE
        shutil.copytree(tmp_path / "running", tmp_path / "crashed")
    directory = tmp_path / "crashed" / "t-0"
    [base] = offsets(directory, ".log")
    os.truncate(directory / f"{base:020d}.log", batch_ends(directory / f"{base:020d}.log")[1])
    with open_manager(tmp_path / "crashed") as manager:
        producers = manager.get_partition("t", 0).producers
        assert producers.state(3) is None
        assert producers.state(1).to_entry() == log_producers(directory)[1]
        assert sorted(log_producers(directory)) == [1, 2]
    [end] = offsets(directory, ".snapshot")
    assert end == 2 and sorted(e.producer_id for e in read_kafka_snapshot(directory / f"{end:020d}.snapshot")) == [1, 2]


def test_writing_a_snapshot_of_a_million_producers_takes_no_memory_per_producer(tmp_path):
    """A flush merges the newest snapshot (a million producers here, 46 MB) with the active file's rows,
    streamed: the heap holds a read of each, never the producers. (The core's own buffers are a piece of
    output; tracemalloc sees Python's and numpy's allocations.)"""
    now = now_ms()
    peaks = {}
    for count in (100_000, 1_000_000):
        directory = tmp_path / str(count)
        directory.mkdir()
        array = np.zeros(count, ENTRY_DTYPE)
        array["producer_id"] = np.arange(count, dtype=np.int64) * 7_919 + 12_345
        array["last_offset"] = np.arange(count)
        array["timestamp"] = now
        array["current_txn_first_offset"] = -1
        write_ledger_snapshot(directory, array, offset=count)
        del array
        with PidLedger(directory, keep_snapshots=True) as ledger:
            for pid in range(10_000):                   # written since that snapshot, new and known ids
                ledger.update(ProducerEntry(pid * 3, 1, 0, count + pid, 0, now, -1, -1))
            gc.collect()
            tracemalloc.start()
            try:
                path = ledger.flush(count + 10_000)
                peaks[count] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        with open(path, "rb") as f:                   # Kafka's header and CRC over the whole file
            data = f.read()
        known = np.arange(count, dtype=np.int64) * 7_919 + 12_345
        assert struct.unpack_from(">hIi", data) == (1, crc32c.crc32c(data[6:]),
                                                     count + 10_000 - np.isin(np.arange(10_000) * 3, known).sum())
    assert peaks[1_000_000] < 2 << 20, peaks                        # the snapshot is 46 MB
    assert peaks[1_000_000] < peaks[100_000] + (256 << 10), peaks   # the same at ten times the producers


def test_snapshots_taken_at_rolls_that_race_appends_hold_the_log_below_their_offset(tmp_path):
    """Idempotent producers on several threads append to one partition while another thread rolls it too:
    every snapshot ``N`` holds exactly Kafka's producer state of the batches below ``N``, whatever ran
    meanwhile (Kafka's ``takeSnapshot`` at a roll)."""
    with open_manager(tmp_path, log_segment_bytes=1500) as manager:
        manager.create_topic("t", 1)
        partition_log = manager.get_partition("t", 0)
        done, failures = threading.Event(), []

        def produce(thread):
            rng = random.Random(thread)
            sessions = {}
            try:
                for _ in range(100):
                    pid = 1000 + thread * 10 + rng.randrange(5)
                    epoch, sequence = sessions.get(pid, (0, 0))
                    if rng.random() < 0.05:
                        epoch, sequence = epoch + 1, 0
                    count = rng.randrange(1, 25)
                    builder = RecordsBuilder(2, "none", producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
                    for i in range(count):
                        builder.append(b"%d" % i, timestamp=now_ms() - rng.randrange(1000))
                    result = partition_log.append(builder.build())
                    assert (result.error_code, result.duplicate) == (ErrorCode.NONE, False), result
                    sessions[pid] = (epoch, sequence + count)
            except BaseException as e:
                failures.append(e)

        def roll():
            while not done.is_set():
                partition_log.roll()

        roller = threading.Thread(target=roll)
        producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
        with switching_often():
            for thread in [roller, *producers]:
                thread.start()
            for thread in producers:
                thread.join()
            done.set()
            roller.join()
        assert failures == []
        directory, bases = partition_log.directory, [s.base_offset for s in partition_log.segments]
        assert len(bases) > 30
        end = partition_log.log_end_offset
    snapshots = offsets(directory, ".snapshot")
    assert set(bases[1:]) | {end} <= set(snapshots)
    for offset in snapshots:
        entries = read_kafka_snapshot(os.path.join(directory, f"{offset:020d}.snapshot"))
        assert sorted(entries) == sorted(log_producers(directory, below=offset).values()), offset
