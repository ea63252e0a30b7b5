"""PidLedger and PidCache: the KIP-1044 read/update/flush behaviour, adoption, expiry, retention, faults."""
import contextlib
import gc
import logging
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from snapshot_files import kafka_snapshot, random_entries
from thread_helpers import run_racing, switching_often

from kmem.bloom import BloomFilter, Shape
from kmem.errors import CorruptSnapshotError, IllegalStateError, InvalidArgumentError
from kmem.ledger.active import ActiveFile, active_name
from kmem.ledger.snapshot import ENTRY_SIZE, HEADER
from kmem.ledger import (
    ENTRY_DTYPE, PidCache, PidLedger, ProducerEntry, Snapshot, open_snapshots, read_snapshot, set_open_snapshots_limit,
    snapshot_name, write_ledger_snapshot, write_snapshot,
)

SMALL = Shape.from_np(200, 0.01)        # saturates after ~190 ids: many flushes in small tests
NOW = 1_700_000_000_000
DAY = 86_400_000


class Clock:
    def __init__(self, now=NOW):
        self.now = now

    def __call__(self):
        return self.now


def entry(pid, offset=None, timestamp=NOW, txn=-1, epoch=0):
    return ProducerEntry(pid, epoch, 0, pid * 10 if offset is None else offset, 0, timestamp, 0, txn)


def files(directory, suffix):
    return sorted(n for n in os.listdir(directory) if n.endswith(suffix))


def test_update_read_in_place_and_flush(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(100):
            ledger.update(entry(pid))
        assert files(tmp_path, ".snapshot") == []
        ledger.update(entry(5, offset=99_999, epoch=3))              # in place: still 100 rows
        assert len(ledger) == 100
        assert ledger.read(5) == entry(5, offset=99_999, epoch=3)
        path = ledger.flush()
        assert os.path.basename(path) == snapshot_name(99_999 + 1)   # named by the end offset, as Kafka
        assert files(tmp_path, ".snapshot") == [snapshot_name(100_000)]
        assert files(tmp_path, ".bloom") == [snapshot_name(100_000) + ".bloom"]
        assert len(files(tmp_path, ".active")) == 1
        assert read_snapshot(path) == sorted([entry(p) for p in range(100) if p != 5] + [ledger.read(5)])
        assert all(ledger.read(pid) is not None for pid in range(100))
        assert ledger.read(1000) is None
        ledger.update(entry(5, offset=200_000, epoch=4))             # newer than the snapshot's
        assert ledger.read(5).epoch == 4
        assert ledger.flush() is not None
        assert ledger.flush() is None                               # nothing new
        assert ledger.read(5).epoch == 4                             # the newest snapshot wins


def test_sidecar_holds_the_snapshots_ids_in_java_layout(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(50):
            ledger.update(entry(pid))
        path = ledger.flush()
    sidecar = BloomFilter.read(path + ".bloom")
    assert sidecar.shape == Shape.from_np(50, 0.01)        # sized for the ids the merge may hold
    expected = BloomFilter(Shape.from_np(50, 0.01))
    expected.add_many(np.arange(50))
    assert np.array_equal(sidecar.as_bitmap_array(), expected.as_bitmap_array())


def test_automatic_flush_when_the_filter_saturates(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), keep_snapshots=True) as ledger:
        for pid in range(1000):
            ledger.update(entry(pid))
        snaps = [Snapshot(os.path.join(tmp_path, n)) for n in files(tmp_path, ".snapshot")]
        assert len(snaps) >= 4
        counts = [0] + [snap.count for snap in snaps]
        for rows in (b - a for a, b in zip(counts, counts[1:])):   # each flush near estimate_max_n, within capacity
            assert SMALL.estimate_max_n() * 0.8 < rows <= ledger.capacity
        for snap in snaps:      # and each snapshot holds every producer up to it
            assert [e.producer_id for e in read_snapshot(snap.path)] == list(range(snap.count))
        assert ledger.snapshot_paths == [snaps[-1].path]          # the newest is the only one read
        assert all(ledger.read(pid) == entry(pid) for pid in range(1000))


def test_flush_on_timer(tmp_path):
    with PidLedger(tmp_path, SMALL, flush_interval_ms=20) as ledger:
        ledger.update(entry(1, timestamp=ledger._clock_ms()))
        for _ in range(200):
            if files(tmp_path, ".snapshot"):
                break
            threading.Event().wait(0.01)
        assert len(files(tmp_path, ".snapshot")) == 1
        assert ledger.read(1) is not None


def test_reopen_keeps_active_rows_and_snapshots(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(500):
            ledger.update(entry(pid))
        active_rows = ledger._active.count
    assert active_rows > 0
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as again:
        assert len(again) == 500 and again.fell_back_to is None
        assert all(again.read(pid) == entry(pid) for pid in range(500))
        again.update(entry(3, epoch=9))
        assert again.read(3).epoch == 9


def test_readers_never_miss_a_known_id_during_flushes(tmp_path):
    ledger = PidLedger(tmp_path, Shape.from_np(2000, 0.01), clock_ms=Clock())
    known = list(range(0, 3000, 3))
    for pid in known:
        ledger.update(entry(pid))
    stop = threading.Event()
    misses = []
    reads = [0]

    def reader(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            for pid in rng.choice(known, 200).tolist():
                if ledger.read(pid) is None:
                    misses.append(pid)
            reads[0] += 200

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for round_ in range(12):                       # flush while readers run, with writes between
            for pid in range(round_ * 10_000 + 1, round_ * 10_000 + 200):
                ledger.update(entry(pid))
            ledger.flush()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert reads[0] > 1000
    assert misses == []
    ledger.close()


def test_adopts_a_kafka_directory(tmp_path):
    # Kafka's snapshots each hold every producer: the newer one updated a third of the first's and added more.
    first = random_entries(300, seed=11)
    second = [e._replace(last_offset=e.last_offset + 1, epoch=e.epoch ^ 1) for e in first[:100]] + first[100:] \
        + random_entries(300, seed=12)
    (tmp_path / snapshot_name(1000)).write_bytes(kafka_snapshot(first))
    (tmp_path / snapshot_name(2000)).write_bytes(kafka_snapshot(second))
    with PidLedger(tmp_path, SMALL, producer_id_expiration_ms=2**62, keep_snapshots=True) as ledger:
        # Only the newest is read, as Kafka loads it: its sidecar and row order are built, not the older's
        assert files(tmp_path, ".bloom") == [snapshot_name(2000) + ".bloom"]
        assert files(tmp_path, ".order") == [snapshot_name(2000) + ".order"]
        assert ledger.snapshot_paths == [str(tmp_path / snapshot_name(2000))]
        assert all(ledger.read(e.producer_id) == e for e in second)
        assert (tmp_path / snapshot_name(1000)).read_bytes() == kafka_snapshot(first)   # left as Kafka wrote it
        ledger.update(entry(1, offset=2500))
        ledger.flush(3000)                  # merged with the Kafka-ordered newest through its row order
        assert read_snapshot(tmp_path / snapshot_name(3000)) == sorted(second + [entry(1, offset=2500)])
        assert files(tmp_path, ".snapshot") == [snapshot_name(o) for o in (1000, 2000, 3000)]


def test_write_ledger_snapshot_for_batch_jobs(tmp_path):
    array = np.zeros(1000, ENTRY_DTYPE)
    array["producer_id"] = np.random.default_rng(1).permutation(1000) * 7 - 3000
    array["last_offset"] = np.arange(1000)
    array["timestamp"] = NOW
    array["current_txn_first_offset"] = -1
    path = write_ledger_snapshot(tmp_path, array)
    assert os.path.basename(path) == snapshot_name(1000)
    assert Snapshot(path).sorted
    assert BloomFilter.read(path + ".bloom").contains_many(array["producer_id"]).all()
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        row = array[17]
        assert ledger.read(int(row["producer_id"])).last_offset == int(row["last_offset"])
    with pytest.raises(InvalidArgumentError, match="twice"):
        write_ledger_snapshot(tmp_path, [entry(1), entry(1)], offset=5)
    assert not os.path.exists(tmp_path / (snapshot_name(5) + ".bloom"))


def test_expiry_and_open_transactions(tmp_path):
    clock = Clock()
    with PidLedger(tmp_path, SMALL, clock_ms=clock) as ledger:
        ledger.update(entry(1, timestamp=NOW))
        ledger.update(entry(2, timestamp=NOW, txn=500))
        clock.now = NOW + DAY - 1
        assert ledger.read(1) is not None
        clock.now = NOW + DAY                       # Kafka: expired once now - last timestamp >= expiration
        assert ledger.read(1) is None
        assert ledger.read(2) is not None           # an open transaction never expires
        ledger.update(entry(1, timestamp=clock.now))
        assert ledger.read(1) is not None


def test_a_snapshot_leaves_out_the_expired_producers(tmp_path):
    clock = Clock()
    with PidLedger(tmp_path, SMALL, clock_ms=clock) as ledger:
        for pid in range(10):
            ledger.update(entry(pid, timestamp=NOW))
        ledger.update(entry(100, timestamp=NOW, txn=7))
        ledger.flush()
        ledger.update(entry(200, timestamp=NOW + DAY))
        clock.now = NOW + DAY                       # Kafka's removeExpiredProducers would forget 0-9 now
        path = ledger.flush()
        assert [e.producer_id for e in read_snapshot(path)] == [100, 200]       # an open transaction stays
        assert ledger.read(100) is not None and ledger.read(3) is None
        assert files(tmp_path, ".snapshot") == [os.path.basename(path)]         # the older one is not needed
        clock.now = NOW                             # a clock going back does not bring them back
        assert ledger.read(3) is None


def test_snapshots_at_offsets_and_kafkas_rules_for_the_older_ones(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), keep_snapshots=True) as ledger:
        for pid in range(5):
            ledger.update(entry(pid, offset=pid))
        assert ledger.flush(100) == str(tmp_path / snapshot_name(100))        # Kafka's takeSnapshot at a roll
        assert ledger.flush(100) is None                                      # nothing new there
        assert ledger.flush(200) == str(tmp_path / snapshot_name(200))        # a roll with no producer written
        ledger.update(entry(7, offset=250))
        ledger.flush(300)
        assert [read_snapshot(tmp_path / snapshot_name(o)) for o in (100, 200, 300)] == \
            [[entry(p, offset=p) for p in range(5)]] * 2 + [[entry(p, offset=p) for p in range(5)] + [entry(7, 250)]]
        ledger.remove_stray_snapshots([0, 200])           # 100 is no segment's base; 300 is the newest, above them
        assert files(tmp_path, ".snapshot") == [snapshot_name(200), snapshot_name(300)]
        ledger.remove_stray_snapshots([0, 200, 400])      # Kafka would delete 300 too; it holds every producer
        ledger.delete_snapshots_before(10**6)             # so does deleteSnapshotsBefore: never the newest
        assert files(tmp_path, ".snapshot") == [snapshot_name(300)]
        assert files(tmp_path, ".bloom") == [snapshot_name(300) + ".bloom"]
        ledger.update(entry(3, offset=4, epoch=2))        # a truncation: the log ends at 250 again
        ledger.flush(250)
        assert files(tmp_path, ".snapshot") == [snapshot_name(250)]     # the log end above it is gone
        assert ledger.read(3).epoch == 2 and ledger.read(7) == entry(7, 250)
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), read_only=True) as reader:
        for call in (lambda: reader.flush(5), lambda: reader.delete_snapshots_before(5),
                     lambda: reader.remove_stray_snapshots([0])):
            with pytest.raises(IllegalStateError, match="read-only"):
                call()
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for bad in (-1, 10**20, 1.5, "7"):
            with pytest.raises(InvalidArgumentError, match="offset"):
                ledger.flush(bad)


def test_open_transactions_and_entries_of_the_snapshot_a_recovery_starts_from(tmp_path, caplog):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), keep_snapshots=True) as ledger:
        assert ledger.open_transactions_at(100) == {}                   # no snapshot yet
        assert ledger.entries_at(100, [1]) == {}
        ledger.update(entry(1, offset=10, txn=10))
        ledger.update(entry(2, offset=20))
        ledger.flush(100)
        ledger.update(entry(1, offset=110))                               # closed after 100
        ledger.update(entry(3, offset=120, txn=115))
        ledger.flush(200)
        ledger.update(entry(4, offset=210, txn=205))
        assert ledger.open_transactions_at(99) == {}
        assert ledger.open_transactions_at(150) == {1: 10}              # the newest snapshot at or below
        assert ledger.open_transactions_at(10**6) == {3: 115}           # not the active file's rows
        assert ledger.entries_at(150, [1, 3, 4]) == {1: entry(1, offset=10, txn=10)}
        assert ledger.entries_at(10**6, [1, 2, 4]) == {1: entry(1, offset=110), 2: entry(2, offset=20)}
        path = tmp_path / snapshot_name(200)
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
        assert ledger.open_transactions_at(10**6) == {1: 10}            # an unreadable one: the previous
        assert ledger.entries_at(10**6, [1]) == {1: entry(1, offset=10, txn=10)}
        assert "CRC" in caplog.text
        with pytest.raises(InvalidArgumentError, match="offset"):
            ledger.open_transactions_at(-1)
        with pytest.raises(InvalidArgumentError, match="offset"):
            ledger.entries_at(-1, [1])


def test_active_file_holding_an_id_twice_is_refused(tmp_path):
    path = tmp_path / active_name(7)
    active = ActiveFile(path, SMALL, capacity=8)
    for pid in (5, 6, 7):
        active.put(entry(pid))
    assert ActiveFile(path, SMALL).find(7) == entry(7)
    del active
    data = bytearray(path.read_bytes())
    struct.pack_into(">q", data, HEADER.size + 2 * ENTRY_SIZE, 5)     # row 2 now claims producer 5 too
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match="producer id 5 appears twice"):
        ActiveFile(path, SMALL)


def test_corrupt_truncated_and_foreign_files_are_skipped_with_a_warning(tmp_path, caplog):
    # The newest readable snapshot is used, as Kafka falls back past a corrupt one.
    good = random_entries(50, seed=21)
    (tmp_path / snapshot_name(30)).write_bytes(kafka_snapshot(random_entries(50, seed=20))[:-3])  # truncated
    bad_crc = bytearray(kafka_snapshot(random_entries(50, seed=22)))
    bad_crc[40] ^= 1
    (tmp_path / snapshot_name(20)).write_bytes(bytes(bad_crc))
    (tmp_path / snapshot_name(10)).write_bytes(kafka_snapshot(good))
    (tmp_path / (snapshot_name(10) + ".bloom")).write_bytes(b"\x00\x00\x00\x40\x00\x00")   # torn sidecar
    (tmp_path / "README.txt").write_text("not ours")
    (tmp_path / "ledger-00000000000000000007.active").write_bytes(b"\x00\x02garbage")
    (tmp_path / (snapshot_name(5) + ".bloom")).write_bytes(b"orphan")
    with caplog.at_level(logging.WARNING, logger="kmem.ledger"):
        with PidLedger(tmp_path, SMALL, producer_id_expiration_ms=2**62) as ledger:
            assert all(ledger.read(e.producer_id) == e for e in good)
            assert ledger.fell_back_to == 10                # the producers written after it come from the log
            ledger.update(entry(1))
            assert ledger.read(1) == entry(1)
    text = caplog.text
    assert snapshot_name(30) in text and "truncated" in text
    assert snapshot_name(20) in text and "CRC" in text
    assert "rebuilding Bloom sidecar" in text and "README.txt" in text and ".active" in text
    assert not os.path.exists(tmp_path / (snapshot_name(5) + ".bloom"))      # orphan sidecar removed
    assert BloomFilter.read(tmp_path / (snapshot_name(10) + ".bloom")).shape.number_of_bits > 64


def test_finishes_a_flush_cut_short(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(50):
            ledger.update(entry(pid))
        active = ledger._active.path
    copy = open(active, "rb").read()
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        ledger.flush()
    # Crash after the snapshot was written but before the old active file was deleted:
    with open(active, "wb") as f:
        f.write(copy)
    os.replace(active, str(tmp_path / "ledger-00000000000000000000.active"))
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        assert len(files(tmp_path, ".snapshot")) == 1        # recognised as sealed: no duplicate
        assert all(ledger.read(pid) == entry(pid) for pid in range(50))
        assert len(ledger) == 50


def fail_with(error):
    def fail(*args, **kwargs):
        raise error
    return fail


@pytest.mark.parametrize("step", ["merge_snapshot", "Snapshot"])
def test_a_failed_flush_stays_pending_and_is_sealed_first(tmp_path, monkeypatch, step):
    import kmem.ledger.ledger as ledger_module
    ledger = PidLedger(tmp_path, SMALL, clock_ms=Clock())
    ledger.update(entry(7, offset=100))
    with monkeypatch.context() as m:                       # a full disk, or no file descriptors left
        m.setattr(ledger_module, step, fail_with(OSError(28, "No space left on device")))
        with pytest.raises(OSError):
            ledger.flush()
        ledger.update(entry(7, offset=200, epoch=5))
        assert ledger.read(7).epoch == 5
        with pytest.raises(OSError):                       # the pending file goes first: nothing newer is sealed
            ledger.flush()
        assert ledger.snapshot_paths == [] and ledger.read(7).epoch == 5
    ledger.close()
    ledger = PidLedger(tmp_path, SMALL, clock_ms=Clock())  # reopened with space again
    assert ledger.read(7).epoch == 5
    ledger.update(entry(8, offset=300))
    ledger.flush()
    assert ledger.read(7).epoch == 5 and ledger._view.sealing == ()
    assert [e.epoch for e in read_snapshot(ledger.snapshot_paths[0]) if e.producer_id == 7] == [5]
    ledger.close()
    assert PidLedger(tmp_path, SMALL, clock_ms=Clock()).read(7).epoch == 5


def test_a_failed_flush_is_retried_by_the_next_one(tmp_path, monkeypatch):
    import kmem.ledger.ledger as ledger_module
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        ledger.update(entry(7, offset=100))
        with monkeypatch.context() as m:
            m.setattr(ledger_module, "merge_snapshot", fail_with(OSError(24, "Too many open files")))
            with pytest.raises(OSError):
                ledger.flush()
        ledger.update(entry(7, offset=200, epoch=5))
        ledger.flush()
        assert ledger._view.sealing == () and files(tmp_path, ".snapshot") == [snapshot_name(201)]
        assert ledger.read(7).epoch == 5
        with monkeypatch.context() as m:                   # a new active file that cannot be made changes nothing
            m.setattr(ledger_module, "ActiveFile", fail_with(OSError(28, "No space left on device")))
            ledger.update(entry(9, offset=300))
            with pytest.raises(OSError):
                ledger.flush()
            assert ledger._view.sealing == () and ledger.read(9) == entry(9, offset=300)
    assert PidLedger(tmp_path, SMALL, clock_ms=Clock()).read(7).epoch == 5


def test_active_file_blocks_are_reserved_and_a_full_disk_is_an_error(tmp_path, monkeypatch):
    with PidLedger(tmp_path / "a", SMALL, clock_ms=Clock()) as ledger:
        st = os.stat(ledger._active.path)
        assert st.st_blocks * 512 >= st.st_size          # not sparse: no SIGBUS when the disk fills later
    monkeypatch.setattr(os, "posix_fallocate", fail_with(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        PidLedger(tmp_path / "b", SMALL, clock_ms=Clock())
    assert os.listdir(tmp_path / "b") == ["ledger.lock"]  # the reserved temporary file is gone too


def test_fsync_makes_the_first_active_file_durable(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def recording(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", recording)
    with PidLedger(tmp_path / "new", SMALL, fsync=True, clock_ms=Clock()) as ledger:
        active = ledger._active.path
    assert str(tmp_path) in synced                        # the new directory's entry
    assert active + ".tmp" in synced and str(tmp_path / "new") in synced     # the file, then its rename


def test_a_sidecar_of_other_content_is_rebuilt(tmp_path, monkeypatch, caplog):
    import kmem.ledger.ledger as ledger_module
    write_ledger_snapshot(tmp_path, [entry(pid) for pid in range(100)], offset=5000)
    with monkeypatch.context() as m:          # a rewrite killed between its sidecar and its snapshot
        m.setattr(ledger_module, "write_entries", fail_with(OSError(4, "killed")))
        with pytest.raises(OSError):
            write_ledger_snapshot(tmp_path, [entry(pid) for pid in range(1000, 1100)], offset=5000)
    with caplog.at_level(logging.WARNING), PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        assert all(ledger.read(pid) == entry(pid) for pid in range(100))
    assert "does not match" in caplog.text
    path = str(tmp_path / snapshot_name(5000))
    write_snapshot(path, [entry(pid) for pid in range(2000, 2100)])      # Kafka rewrote the snapshot
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        assert all(ledger.read(pid) == entry(pid) for pid in range(2000, 2100))


def open_fds():
    # Collect first: files of objects other tests left to the garbage collector would close mid-count.
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_files_and_refuses_use(tmp_path):
    before = open_fds()
    ledger = PidLedger(tmp_path, SMALL, clock_ms=Clock())
    for pid in range(500):                                 # several flushes
        ledger.update(entry(pid))
    assert ledger._sequence >= 3
    ledger.close()
    assert open_fds() == before
    for call in (lambda: ledger.read(1), lambda: ledger.update(entry(1)), ledger.flush, ledger.sync):
        with pytest.raises(IllegalStateError):
            call()
    ledger.close()                                         # closing twice is harmless
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        assert all(ledger.read(pid) == entry(pid) for pid in range(500))


def test_a_second_ledger_on_one_directory_is_refused(tmp_path, caplog):
    with caplog.at_level(logging.WARNING), PidLedger(tmp_path, SMALL, clock_ms=Clock()):
        with pytest.raises(IllegalStateError, match="ledger.lock"):
            PidLedger(tmp_path, SMALL, clock_ms=Clock())
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()):     # free again once closed
        pass
    assert "foreign" not in caplog.text


def test_a_ledger_under_the_callers_lock_makes_no_lock_file(tmp_path):
    before = open_fds()
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), lock_directory=False) as ledger:
        assert open_fds() == before
        for pid in range(300):                             # a flush on the way
            ledger.update(entry(pid))
        assert ledger.snapshot_paths and "ledger.lock" not in os.listdir(tmp_path)
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), read_only=True, lock_directory=False) as reader:
        assert all(reader.read(pid) == entry(pid) for pid in range(300))
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:     # by default it locks, as before
        assert "ledger.lock" in os.listdir(tmp_path) and ledger.read(299) == entry(299)


def ledger_with_every_kind_of_file(directory):
    """A ledger with sorted snapshots and their sidecars, then a Kafka-ordered newest one (Kafka took the
    directory over: every producer) with its row order, and an active file that grew; returns what it holds."""
    expected = {e.producer_id: e for e in random_entries(300, seed=5)}
    with PidLedger(directory, SMALL, clock_ms=Clock(), producer_id_expiration_ms=2**62, keep_snapshots=True) as ledger:
        ledger.update_many(list(expected.values()))
        for pid in range(1000):                            # flushes of SMALL
            ledger.update(expected.setdefault(pid, entry(pid, offset=2**41 + pid)))
    with open(os.path.join(directory, snapshot_name(2**52)), "wb") as f:
        f.write(kafka_snapshot(random.Random(5).sample(list(expected.values()), len(expected))))
    with PidLedger(directory, Shape.from_np(100_000, 0.01), clock_ms=Clock(), producer_id_expiration_ms=2**62,
                   keep_snapshots=True) as ledger:
        ledger.update_many([entry(pid, offset=2**53 + pid) for pid in range(10**6, 10**6 + 3000)])   # grows
    expected.update((pid, entry(pid, offset=2**53 + pid)) for pid in range(10**6, 10**6 + 3000))
    return expected


@pytest.mark.parametrize("lock_directory", [False, True])
def test_open_ledgers_hold_no_descriptor_for_their_files(tmp_path, lock_directory):
    ledgers = 8
    expected = ledger_with_every_kind_of_file(str(tmp_path / "0"))
    for n in range(1, ledgers):
        shutil.copytree(tmp_path / "0", tmp_path / str(n))
    big = Shape.from_np(100_000, 0.01)                     # room for the active file to grow while open
    before = open_fds()
    opened = [PidLedger(tmp_path / str(n), big, clock_ms=Clock(), producer_id_expiration_ms=2**62,
                        lock_directory=lock_directory) for n in range(ledgers)]
    kinds = {name.rsplit(".", 1)[-1] for name in os.listdir(tmp_path / "0")}
    assert {"snapshot", "bloom", "order", "active"} <= kinds and len(files(tmp_path / "0", ".snapshot")) >= 6
    assert opened[0].snapshot_paths == [str(tmp_path / "0" / snapshot_name(2**52))]     # Kafka-ordered: mapped
    for ledger in opened:
        for pid in range(5000, 8000):                      # the active file grows: new mappings
            ledger.update(entry(pid))
        assert all(ledger.read(pid) == e for pid, e in expected.items())
        assert ledger.read_many(np.array(list(expected), np.int64))[0].all()
        ledger.flush()
    assert open_fds() == before + (ledgers if lock_directory else 0)        # ledger.lock or nothing
    for ledger in opened:
        ledger.close()
    assert open_fds() == before


# --- the descriptors kept for the most recently searched snapshots ---------------------------------------

@pytest.fixture
def open_snapshot_limit():
    """``set_open_snapshots_limit`` for one test; the limit it found is set again after it."""
    found = open_snapshots()[1]
    yield set_open_snapshots_limit
    set_open_snapshots_limit(found)


def held_files(directory):
    """The files under ``directory`` this process holds a descriptor of (a file gone ends in " (deleted)")."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):        # the listing's own descriptor, closed since
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory) + os.sep):
                held.append(target)
    return sorted(held)


def ledgers_with_a_snapshot(directory, count, **kwargs):
    """``count`` ledgers under ``directory``, each with the ids 0-49 in a snapshot (ledger n's at offsets
    n * 1000 + id) and an empty active file: a read goes to the snapshot."""
    ledgers = []
    for n in range(count):
        ledger = PidLedger(os.path.join(directory, str(n)), SMALL, clock_ms=Clock(), lock_directory=False, **kwargs)
        ledger.update_many([entry(pid, offset=n * 1000 + pid) for pid in range(50)])
        ledger.flush()
        ledgers.append(ledger)
    return ledgers


def test_the_process_keeps_a_descriptor_for_its_most_recently_searched_snapshots(tmp_path, open_snapshot_limit):
    open_snapshot_limit(5)
    ledgers = ledgers_with_a_snapshot(tmp_path, 20)
    assert held_files(tmp_path) == []                      # none searched yet
    for n, ledger in enumerate(ledgers):
        assert ledger.read(7) == entry(7, offset=n * 1000 + 7)
        assert len(held_files(tmp_path)) == min(n + 1, 5)  # never more than the limit
    assert held_files(tmp_path) == sorted(ledger.snapshot_paths[0] for ledger in ledgers[-5:])
    assert open_snapshots() == (5, 5)
    for n in (2, 0, 1):                                    # searched again: they replace the least recent
        assert ledgers[n].read(8) == entry(8, offset=n * 1000 + 8)
    assert held_files(tmp_path) == sorted(ledger.snapshot_paths[0] for ledger in ledgers[:3] + ledgers[-2:])
    open_snapshot_limit(2)                                 # lowered: the least recently searched go now
    assert held_files(tmp_path) == sorted(ledger.snapshot_paths[0] for ledger in ledgers[:2])
    open_snapshot_limit(0)                                 # none kept: each search opens its file
    assert held_files(tmp_path) == [] and ledgers[3].read(9) == entry(9, offset=3009)
    assert held_files(tmp_path) == []
    open_snapshot_limit(5)
    for ledger in ledgers:
        ledger.read(1)
    for ledger in ledgers:                                 # a partition's ledger closes: its descriptor goes
        ledger.close()
    assert held_files(tmp_path) == [] and open_snapshots() == (0, 5)
    for bad in (-1, 2**31, 2**64, True, 1.5, "3"):
        with pytest.raises(InvalidArgumentError, match="limit of open snapshots"):
            set_open_snapshots_limit(bad)
    assert open_snapshots() == (0, 5)


def test_no_descriptor_is_kept_for_a_snapshot_superseded_deleted_or_replaced_by_the_ledger(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), lock_directory=False, keep_snapshots=True) as ledger:
        ledger.update(entry(1))
        first = ledger.flush(100)
        assert ledger.read(1) == entry(1) and held_files(tmp_path) == [first]
        ledger.update(entry(2))
        second = ledger.flush(200)                         # supersedes the first, which stays on disk
        assert held_files(tmp_path) == []
        assert ledger.read(1) == entry(1) and held_files(tmp_path) == [second]
        ledger.update(entry(3))
        assert ledger.flush(200) == second                 # written again: the file at that name is replaced
        assert held_files(tmp_path) == []
        assert ledger.read(3) == entry(3) and held_files(tmp_path) == [second]      # the new file
        ledger.delete_snapshots_before(200)                # Kafka's retention: the first goes
        assert files(tmp_path, ".snapshot") == [snapshot_name(200)] and held_files(tmp_path) == [second]
        os.unlink(second)                                  # someone else's doing: read as it was until closed
        assert ledger.read(1) == entry(1) and held_files(tmp_path) == [second + " (deleted)"]
    assert held_files(tmp_path) == []


def test_readers_racing_evictions_never_read_through_a_closed_descriptor(tmp_path, open_snapshot_limit):
    # With a limit of 1, each search of one ledger evicts the descriptor another thread may be reading
    # through; limit changes evict too. A descriptor closed under a reader would fail its pread (EBADF) or,
    # its number reused by another snapshot's, find another ledger's offsets.
    open_snapshot_limit(1)
    ledgers = ledgers_with_a_snapshot(tmp_path, 4)
    errors, reading = [], [len(ledgers)]

    def reader(n):
        try:
            for i in range(3000):
                pid = i % 50
                got = ledgers[n].read(pid)
                if got != entry(pid, offset=n * 1000 + pid):
                    errors.append((n, pid, got))
        except Exception as e:     # noqa: BLE001 - surface any error from the thread
            errors.append(e)
        finally:
            reading[0] -= 1

    def resizer():
        while reading[0]:
            for limit in (0, 2, 1):
                open_snapshot_limit(limit)

    try:
        run_racing(*[lambda n=n: reader(n) for n in range(len(ledgers))], resizer)
        assert errors == []
    finally:
        for ledger in ledgers:
            ledger.close()
    assert held_files(tmp_path) == []


def test_a_process_allowed_few_descriptors_keeps_fewer_for_snapshots():
    child = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (80, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from kmem.ledger import open_snapshots
        print(*open_snapshots())
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "10"]          # an eighth of 80, not 32


def test_a_forked_child_keeps_none_of_its_parents_snapshot_descriptors(tmp_path):
    (ledger,) = ledgers_with_a_snapshot(tmp_path, 1)
    try:
        assert ledger.read(3) == entry(3, offset=3) and held_files(tmp_path) == ledger.snapshot_paths
        child = os.fork()
        if child == 0:              # the child's copies are closed; its own searches keep their own
            try:
                kept = [open_snapshots()[0], held_files(tmp_path)]
                kept += [ledger.read(4) == entry(4, offset=4), open_snapshots()[0], held_files(tmp_path)]
                os._exit(0 if kept == [0, [], True, 1, ledger.snapshot_paths] else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert held_files(tmp_path) == ledger.snapshot_paths       # the parent's is still open
    finally:
        ledger.close()


def test_searches_under_a_descriptor_limit_keep_at_most_the_limit_and_give_them_back(tmp_path):
    # A process at its RLIMIT_NOFILE: many partitions' snapshots searched never hold more than the limit of
    # descriptors, and a search that finds none left takes back those kept before failing.
    child = textwrap.dedent("""
        import os, resource, sys
        from kmem.bloom import Shape
        from kmem.ledger import PidLedger, ProducerEntry, open_snapshots

        def opened():
            return len(os.listdir("/proc/self/fd")) - 1        # the listing's own descriptor

        ledgers = []
        for n in range(100):
            ledger = PidLedger(os.path.join(sys.argv[1], str(n)), Shape.from_np(200, 0.01), lock_directory=False)
            ledger.update(ProducerEntry(n, 0, 0, n, 0, 1, 0, 5))  # in a transaction: it never expires
            ledger.flush()
            ledgers.append(ledger)
        base = opened()
        resource.setrlimit(resource.RLIMIT_NOFILE, (base + 40, base + 40))
        most = 0
        for _ in range(2):
            for n, ledger in enumerate(ledgers):
                assert ledger.read(n).last_offset == n
                most = max(most, opened())
        assert most == base + 32 and open_snapshots() == (32, 32), (base, most, open_snapshots())
        hog = []
        try:
            while True:
                hog.append(open(os.devnull, "rb"))
        except OSError:
            pass
        assert ledgers[0].read(0).last_offset == 0          # not kept: opened after the kept ones are closed
        assert open_snapshots() == (1, 32)
        for f in hog:
            f.close()
        for ledger in ledgers:
            ledger.close()
        assert opened() == base and open_snapshots() == (0, 32)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


def test_only_the_ledgers_own_temporary_files_are_deleted(tmp_path):
    foreign = ["leader-epoch-checkpoint.tmp", "partition.metadata.tmp"]      # Kafka's, mid-rename
    own = [snapshot_name(10) + ".tmp", snapshot_name(10) + ".bloom.tmp", snapshot_name(10) + ".order.tmp",
           active_name(3) + ".tmp"]
    for name in foreign + own:
        (tmp_path / name).write_bytes(b"x")
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()):
        pass
    names = os.listdir(tmp_path)
    assert all(name in names for name in foreign) and not any(name in names for name in own)


def test_an_active_file_without_room_for_a_row_is_set_aside(tmp_path):
    (tmp_path / active_name(1)).write_bytes(HEADER.pack(1, 0, 0))       # cut back to its header
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        updating = threading.Thread(target=ledger.update, args=(entry(1),), daemon=True)
        updating.start()
        updating.join(10)
        assert not updating.is_alive() and ledger.read(1) == entry(1)    # it used to spin forever
    assert os.path.exists(tmp_path / (active_name(1) + ".corrupt"))


def test_negative_last_offset_is_refused(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        with pytest.raises(InvalidArgumentError):
            ledger.update(entry(1, offset=-2))
        ledger.update(entry(2, offset=-1))                 # Kafka's "no offset yet"
        assert os.path.basename(ledger.flush()) == snapshot_name(0)


def test_bad_configuration(tmp_path):
    with pytest.raises(InvalidArgumentError):
        PidLedger(tmp_path, SMALL, producer_id_expiration_ms=0)
    with pytest.raises(InvalidArgumentError):
        PidLedger(tmp_path, SMALL, flush_interval_ms=-5)
    with PidLedger(tmp_path, SMALL) as ledger:
        with pytest.raises(InvalidArgumentError):
            ledger.update(entry(2**63))
        with pytest.raises(InvalidArgumentError):
            ledger.read("x")


# --- PidCache ------------------------------------------------------------------------------------------

class CountingLedger:
    def __init__(self, ledger):
        self.ledger = ledger
        self.reads = 0

    def read(self, pid):
        self.reads += 1
        return self.ledger.read(pid)

    def update(self, e):
        return self.ledger.update(e)

    def expired(self, e):
        return self.ledger.expired(e)


def test_cache_write_through_hits_misses_and_bound(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        counting = CountingLedger(ledger)
        cache = PidCache(counting, max_entries=10)
        cache.put(entry(1))
        assert ledger.read(1) == entry(1)               # written through
        assert cache.get(1) == entry(1) and counting.reads == 0
        assert cache.get(2) is None and cache.get(2) is None
        assert counting.reads == 1                      # the miss is remembered
        cache.put(entry(2))                             # and replaced by a write
        assert cache.get(2) == entry(2)
        for pid in range(100, 120):
            cache.get(pid)
        assert len(cache) == 10
        reads = counting.reads
        cache.get(1)                                    # evicted: back to the ledger
        assert counting.reads == reads + 1
        with pytest.raises(InvalidArgumentError):
            PidCache(ledger, 0)


def test_cache_does_not_store_a_read_a_put_overtook(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        cache = PidCache(ledger, max_entries=2)
        reading, release = threading.Event(), threading.Event()
        real = ledger.read

        def slow_read(pid):
            found = real(pid)
            reading.set()
            release.wait()
            return found
        ledger.read = slow_read
        reader = threading.Thread(target=cache.get, args=(1,))
        reader.start()
        reading.wait()                          # the read found nothing; now a put lands and is evicted
        ledger.read = real
        cache.put(entry(1))
        cache.get(2)
        cache.get(3)
        release.set()
        reader.join()
        assert cache.get(1) == entry(1)


def test_cache_put_of_a_tuple_and_expiry(tmp_path):
    clock = Clock()
    with PidLedger(tmp_path, SMALL, clock_ms=clock) as ledger:
        cache = PidCache(ledger, max_entries=10)
        assert cache.get(1) is None
        assert cache.put(tuple(entry(1))) == entry(1)          # converted by the ledger, cached as such
        assert cache.get(1) == entry(1)
        clock.now += DAY
        assert ledger.read(1) is None and cache.get(1) is None  # expired in the cache as in the ledger


def test_cache_is_thread_safe(tmp_path):
    with PidLedger(tmp_path, Shape.from_np(5000, 0.01), clock_ms=Clock()) as ledger:
        cache = PidCache(ledger, max_entries=300)
        errors = []

        def worker(base):
            try:
                for i in range(2000):
                    pid = base + i % 700
                    if i % 3 == 0:
                        cache.put(entry(pid, offset=i))
                    got = cache.get(pid)
                    if i % 3 == 0 and got is None:
                        errors.append(pid)
            except Exception as e:     # noqa: BLE001 - surface any error from the thread
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(n * 10_000,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(cache) <= 300


def test_updates_from_threads_survive_concurrent_flushes_and_growth(tmp_path):
    # update is one core call under the ledger's lock: a flush swapping the active file or a growth
    # swapping its row table in between must lose no entry.
    with PidLedger(tmp_path, Shape.from_np(3000, 0.01), clock_ms=Clock()) as ledger:
        errors, done = [], threading.Event()

        def writer(base):
            try:
                for i in range(3000):
                    stored = ledger.update(entry(base + i % 1000, offset=i))
                    assert stored.last_offset == i
            except Exception as e:     # noqa: BLE001 - surface any error from the thread
                errors.append(e)

        def flusher():
            while not done.is_set():
                ledger.flush()
                ledger.update_many(entries_of(np.arange(10**6, 10**6 + 50), np.arange(50), np.zeros(50, np.int64)))

        threads = [threading.Thread(target=writer, args=(n * 10_000,)) for n in range(3)]
        background = threading.Thread(target=flusher)
        with switching_often(1e-5):          # switch threads inside the update calls' Python parts too
            try:
                background.start()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                done.set()
                background.join()
        assert errors == []
        assert ledger._sequence > 2                 # flushed more than once
        for n in range(3):
            assert [ledger.read(n * 10_000 + pid).last_offset for pid in range(1000)] == list(range(2000, 3000))


def test_entry_struct_is_kafkas():
    assert struct.calcsize(">qhiqiqiq") == 46 == ENTRY_DTYPE.itemsize


# --- a model check: the ledger behaves as a dict of newest entries through updates, flushes, reopens ---


class LedgerModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="kmem-ledger-model-")
        self.ledger = PidLedger(self.directory, Shape.from_np(20, 0.01), clock_ms=Clock())
        self.model = {}
        self.offset = 0

    @rule(pid=st.integers(-50, 50), epoch=st.integers(0, 5))
    def update(self, pid, epoch):
        self.offset += 1
        e = entry(pid, offset=self.offset, epoch=epoch)
        self.ledger.update(e)
        self.model[pid] = e

    @rule()
    def flush(self):
        self.ledger.flush()

    @rule()
    def reopen(self):
        self.ledger.close()
        self.ledger = PidLedger(self.directory, Shape.from_np(20, 0.01), clock_ms=Clock())

    @rule(pid=st.integers(-60, 60))
    def read(self, pid):
        assert self.ledger.read(pid) == self.model.get(pid)

    @invariant()
    def snapshots_are_valid_kafka_files(self):
        for path in self.ledger.snapshot_paths:
            assert read_snapshot(path)

    def teardown(self):
        self.ledger.close()
        shutil.rmtree(self.directory, ignore_errors=True)


TestLedgerModel = LedgerModel.TestCase
TestLedgerModel.settings = settings(max_examples=25, stateful_step_count=40, deadline=None)


# --- footprint: read-only opens, active files that grow, arguments checked at the boundary ------------

def directory_state(directory):
    """Every file's name, size and content: what a read-only open must leave as it was."""
    state = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            state[name] = f.read()
    return state


def test_read_only_open_writes_nothing_and_refuses_writes(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(450):                                   # two flushes and rows in the active file
            ledger.update(entry(pid))
    kafka = random_entries(50, seed=41)     # Kafka then wrote a snapshot of every producer: no sidecar, no order
    (tmp_path / snapshot_name(10**12)).write_bytes(kafka_snapshot(kafka + [entry(pid) for pid in range(450)]))
    (tmp_path / (snapshot_name(5) + ".bloom")).write_bytes(b"orphan")
    (tmp_path / (snapshot_name(7) + ".tmp")).write_bytes(b"cut short")
    before = directory_state(tmp_path)
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), producer_id_expiration_ms=2**62, read_only=True) as reader:
        assert all(reader.read(pid) == entry(pid) for pid in range(450))
        assert all(reader.read(e.producer_id) == e for e in kafka)
        assert reader.read(10**15) is None and reader.snapshot_paths == [str(tmp_path / snapshot_name(10**12))]
        for call in (lambda: reader.update(entry(1)), reader.flush, reader.sync):
            with pytest.raises(IllegalStateError, match="read-only"):
                call()
    assert directory_state(tmp_path) == before


def test_read_only_open_of_a_batch_jobs_directory_creates_no_file(tmp_path):
    write_ledger_snapshot(tmp_path, [entry(pid) for pid in range(100)])
    before = directory_state(tmp_path)
    with PidLedger(tmp_path, read_only=True, clock_ms=Clock()) as reader:     # no lock file: no lock taken
        assert reader.read(42) == entry(42)
    assert directory_state(tmp_path) == before
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        PidLedger(tmp_path / "missing", read_only=True)
    assert not os.path.exists(tmp_path / "missing")


def test_readers_share_the_lock_and_exclude_a_writer(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as writer:
        writer.update(entry(1))
        with pytest.raises(IllegalStateError, match="ledger.lock"):
            PidLedger(tmp_path, SMALL, read_only=True)
    with PidLedger(tmp_path, SMALL, read_only=True, clock_ms=Clock()) as one, \
            PidLedger(tmp_path, SMALL, read_only=True, clock_ms=Clock()) as two:
        assert one.read(1) == two.read(1) == entry(1)
        with pytest.raises(IllegalStateError, match="ledger.lock"):
            PidLedger(tmp_path, SMALL)
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as writer:         # free again
        assert writer.read(1) == entry(1)


def test_the_active_file_grows_with_use_and_reserves_each_step(tmp_path):
    from kmem.ledger.active import INITIAL_ROWS
    shape = Shape.from_np(100_000, 0.01)
    with PidLedger(tmp_path, shape, clock_ms=Clock()) as ledger:
        path = ledger._active.path
        assert os.path.getsize(path) == HEADER.size + INITIAL_ROWS * ENTRY_SIZE      # 46 KB, not the capacity
        assert ledger.capacity > 50 * INITIAL_ROWS
        for pid in range(3 * INITIAL_ROWS):
            ledger.update(entry(pid))
        size = os.path.getsize(path)
        assert size == HEADER.size + 4 * INITIAL_ROWS * ENTRY_SIZE
        st = os.stat(path)
        assert st.st_blocks * 512 >= st.st_size                 # each growth reserved its blocks
        assert all(ledger.read(pid) == entry(pid) for pid in range(3 * INITIAL_ROWS))
    with PidLedger(tmp_path, shape, clock_ms=Clock()) as ledger:
        assert len(ledger) == 3 * INITIAL_ROWS
        for pid in range(3 * INITIAL_ROWS, 5 * INITIAL_ROWS):   # reopened, it keeps growing
            ledger.update(entry(pid))
        assert os.path.getsize(path) == HEADER.size + 8 * INITIAL_ROWS * ENTRY_SIZE
        assert all(ledger.read(pid) == entry(pid) for pid in range(0, 5 * INITIAL_ROWS, 7))


def test_a_growth_on_a_full_disk_is_an_oserror_and_loses_nothing(tmp_path, monkeypatch):
    from kmem.ledger.active import INITIAL_ROWS
    with PidLedger(tmp_path, Shape.from_np(100_000, 0.01), clock_ms=Clock()) as ledger:
        for pid in range(INITIAL_ROWS):
            ledger.update(entry(pid))
        size = os.path.getsize(ledger._active.path)
        with monkeypatch.context() as m:
            m.setattr(os, "posix_fallocate", fail_with(OSError(28, "No space left on device")))
            with pytest.raises(OSError):
                ledger.update(entry(INITIAL_ROWS))
            ledger.update(entry(5, epoch=3))                     # rows in place need no new blocks
        assert os.path.getsize(ledger._active.path) == size
        assert ledger.read(INITIAL_ROWS) is None and ledger.read(5) == entry(5, epoch=3)
        ledger.update(entry(INITIAL_ROWS))                       # space again
        assert ledger.read(INITIAL_ROWS) == entry(INITIAL_ROWS) and len(ledger) == INITIAL_ROWS + 1


def test_a_growth_cut_short_leaves_the_file_at_its_size(tmp_path, monkeypatch):
    # Some file systems (ext4) extend the file before they run out of blocks: rows mapped over blocks
    # that are not there would be SIGBUS at the first store, in this process or after a reopen.
    from kmem.ledger.active import INITIAL_ROWS

    def extend_then_fail(fd, offset, length):
        os.ftruncate(fd, offset + length)
        raise OSError(28, "No space left on device")
    shape = Shape.from_np(100_000, 0.01)
    with PidLedger(tmp_path, shape, clock_ms=Clock()) as ledger:
        for pid in range(INITIAL_ROWS):
            ledger.update(entry(pid))
        size = os.path.getsize(ledger._active.path)
        with monkeypatch.context() as m:
            m.setattr(os, "posix_fallocate", extend_then_fail)
            for call in (lambda: ledger.update(entry(INITIAL_ROWS)), lambda: ledger.reserve(1)):
                with pytest.raises(OSError):
                    call()
                assert os.path.getsize(ledger._active.path) == size
    with PidLedger(tmp_path, shape, clock_ms=Clock()) as ledger:
        assert ledger._active.rows == INITIAL_ROWS and len(ledger) == INITIAL_ROWS


def without_io(m):
    """Make every way an update could touch the disk (growth, a new active file, a flush) fail."""
    import kmem.ledger.active as active_module
    import kmem.ledger.ledger as ledger_module
    from kmem import _core
    full = fail_with(OSError(28, "No space left on device"))
    for module, name in [(os, "posix_fallocate"), (os, "ftruncate"), (_core, "FileMapping"),
                         (active_module, "replaced_atomically"), (ledger_module, "ActiveFile"),
                         (ledger_module, "write_entries"), (BloomFilter, "write")]:
        m.setattr(module, name, full)


@pytest.mark.parametrize("shape, filled, count", [
    (SMALL, 150, 100),                          # the filter cannot take 100 more: a flush makes room
    (Shape.from_np(100_000, 0.01), 1000, 3000),     # rows for 1024: the file grows
    (Shape.from_np(100_000, 0.01), 10, 50),        # room already
])
def test_after_reserve_the_next_updates_need_no_io(tmp_path, monkeypatch, shape, filled, count):
    with PidLedger(tmp_path / "unreserved", shape, clock_ms=Clock()) as ledger:
        for pid in range(filled):
            ledger.update(entry(pid))
        if count > 50:
            with monkeypatch.context() as m, pytest.raises(OSError):     # without reserve they would
                without_io(m)
                for pid in range(filled, filled + count):
                    ledger.update(entry(pid))
    with PidLedger(tmp_path / "reserved", shape, clock_ms=Clock()) as ledger:
        for pid in range(filled):
            ledger.update(entry(pid))
        ledger.reserve(count)
        snapshots = ledger.snapshot_paths
        with monkeypatch.context() as m:
            without_io(m)
            for pid in range(filled, filled + count):                   # each a new id: the most room
                ledger.update(entry(pid))
            ledger.update(entry(3, epoch=4))                            # known ids are updated in place
        assert ledger.snapshot_paths == snapshots
        assert all(ledger.read(pid) == entry(pid) for pid in range(filled + count) if pid != 3)
    with PidLedger(tmp_path / "reserved", shape, clock_ms=Clock()) as ledger:
        assert ledger.read(3) == entry(3, epoch=4) and ledger.read(filled + count - 1) is not None


def test_a_flush_between_reserve_and_the_updates_keeps_the_room(tmp_path, monkeypatch):
    with PidLedger(tmp_path, Shape.from_np(100_000, 0.01), clock_ms=Clock()) as ledger:
        ledger.update(entry(1))
        ledger.reserve(5000)
        ledger.flush()                          # the timer's, say: its new active file has the room
        with monkeypatch.context() as m:
            without_io(m)
            for pid in range(2, 5002):
                ledger.update(entry(pid))
        assert all(ledger.read(pid) == entry(pid) for pid in range(1, 5002))


def test_a_reserve_that_cannot_flush_leaves_the_ledger_as_it_was(tmp_path, monkeypatch):
    import kmem.ledger.ledger as ledger_module
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(150):
            ledger.update(entry(pid))
        active, listing = ledger._active, sorted(os.listdir(tmp_path))
        for step in ("merge_snapshot", "Snapshot", "ActiveFile"):      # sealing, or the new active file
            with monkeypatch.context() as m:
                m.setattr(ledger_module, step, fail_with(OSError(28, "No space left on device")))
                with pytest.raises(OSError):
                    ledger.reserve(100)
            assert ledger._active is active and ledger._view.sealing == () and ledger.snapshot_paths == []
            assert sorted(os.listdir(tmp_path)) == listing          # no new active file, sidecar or snapshot
            assert all(ledger.read(pid) == entry(pid) for pid in range(150))
        ledger.reserve(100)                                          # room again
        for pid in range(150, 250):
            ledger.update(entry(pid))
        assert len(ledger.snapshot_paths) == 1
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        assert all(ledger.read(pid) == entry(pid) for pid in range(250))


def test_a_reserve_whose_flush_sealed_but_could_not_delete_keeps_the_snapshot(tmp_path, monkeypatch):
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".active"):
            raise PermissionError(13, "Permission denied", path)
        real_unlink(path, *args, **kwargs)
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for pid in range(150):
            ledger.update(entry(pid))
        old = ledger._active
        with monkeypatch.context() as m:
            m.setattr(os, "unlink", unlink)
            with pytest.raises(PermissionError):
                ledger.reserve(100)
        # Sealed: the old file is not taken back (its entries are in the snapshot now)
        assert ledger._active is not old and ledger._view.sealing == () and len(ledger.snapshot_paths) == 1
        ledger.reserve(100)
        for pid in range(150, 250):
            ledger.update(entry(pid))
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:      # the undeleted file is recognised
        assert all(ledger.read(pid) == entry(pid) for pid in range(250)) and len(ledger.snapshot_paths) == 1
        assert not os.path.exists(old.path)


@pytest.mark.parametrize("shape", [SMALL, Shape.from_np(2_000, 0.01)])
def test_reserve_in_the_core_decides_as_the_ledger_does(tmp_path, monkeypatch, shape):
    """``LedgerCore.reserve`` answers alone only where the ledger's own path would reserve without I/O: two
    ledgers fed the same updates and reservations, one always taking the ledger's path, end with the same files,
    rows, reservation and entries after every step, and without I/O after each reserve until its count is used."""
    rng = random.Random(7)
    decided = {"fast": [], "slow": []}

    def counting(ledger, name):
        decide = ledger._core.reserve_decided

        def counted(count):
            decided[name].append(count)
            return decide(count)
        ledger._core.reserve_decided = counted

    with PidLedger(tmp_path / "fast", shape, clock_ms=Clock()) as fast, \
            PidLedger(tmp_path / "slow", shape, clock_ms=Clock()) as slow:
        slow._core.flush_lock = None                    # the core never answers: always the ledger's path
        counting(fast, "fast")
        counting(slow, "slow")
        written = []
        for step in range(400):
            count = rng.choice([0, 1, 1, 1, 2, 5, 40, fast.max_reservation])
            fast.reserve(count)
            slow.reserve(count)
            for ledger in (fast, slow):
                assert ledger._core.reserved == count
            with monkeypatch.context() as m:
                without_io(m)
                for _ in range(count):                  # new ids now and then, else known ones (updated in place)
                    pid = len(written) if not written or rng.random() < 0.03 else rng.choice(written)
                    written += [pid] if pid == len(written) else []
                    fast.update(entry(pid, epoch=step % 7))
                    slow.update(entry(pid, epoch=step % 7))
            assert files(tmp_path / "fast", "") == files(tmp_path / "slow", "")
            assert (fast._active.rows, fast._active.count) == (slow._active.rows, slow._active.count)
        assert all(fast.read(pid) == slow.read(pid) == entry(pid, epoch=fast.read(pid).epoch) for pid in written)
    assert len(decided["slow"]) == 400
    assert 0 < len(decided["fast"]) <= 300          # the ledger's path where needed, the core's in a quarter or more


def test_reserve_checks_its_count_and_the_ledger(tmp_path):
    ledger = PidLedger(tmp_path, SMALL, clock_ms=Clock())
    assert 1 <= ledger.max_reservation <= ledger.capacity
    for bad in (-1, ledger.max_reservation + 1, True, 2.0, "3"):
        with pytest.raises(InvalidArgumentError, match="count"):
            ledger.reserve(bad)
    pid = 0
    while not ledger._active.full:
        ledger.update(entry(pid))
        pid += 1
    ledger.reserve(0)                                   # nothing to make room for: no flush
    assert ledger.snapshot_paths == []
    ledger.reserve(ledger.max_reservation)
    assert len(ledger.snapshot_paths) == 1
    ledger.close()
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), read_only=True) as reader:
        with pytest.raises(IllegalStateError, match="read-only"):
            reader.reserve(1)
    with pytest.raises(IllegalStateError, match="closed"):
        ledger.reserve(1)


@pytest.mark.parametrize("kwargs, name", [
    ({"shape": 1_000_000}, "shape"),
    ({"directory": 5}, "directory"),
    ({"producer_id_expiration_ms": "86400000"}, "producer_id_expiration_ms"),
    ({"producer_id_expiration_ms": 0}, "producer_id_expiration_ms"),
    ({"flush_interval_ms": -5}, "flush_interval_ms"),
    ({"flush_interval_ms": 2.5}, "flush_interval_ms"),
    ({"fsync": "yes"}, "fsync"),
    ({"read_only": 1}, "read_only"),
    ({"lock_directory": "no"}, "lock_directory"),
    ({"clock_ms": 17}, "clock_ms"),
    ({"read_only": True, "flush_interval_ms": 100}, "flush_interval_ms"),
])
def test_ledger_arguments_are_checked_and_named(tmp_path, kwargs, name):
    kwargs = {"directory": tmp_path, **kwargs}
    with pytest.raises(InvalidArgumentError, match=name):
        PidLedger(**kwargs)


def test_cache_and_batch_writer_arguments_are_checked_and_named(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        for bad, name in [((ledger, "10"), "max_entries"), ((ledger, True), "max_entries"),
                          ((ledger, 0), "max_entries"), ((object(), 10), "ledger")]:
            with pytest.raises(InvalidArgumentError, match=name):
                PidCache(*bad)
        with pytest.raises(InvalidArgumentError, match="entry"):
            ledger.update((1, 2))
    for kwargs, name in [({"offset": "5"}, "offset"), ({"offset": -1}, "offset"), ({"shape": 5}, "shape"),
                         ({"fsync": None}, "fsync")]:
        with pytest.raises(InvalidArgumentError, match=name):
            write_ledger_snapshot(tmp_path / "batch", [entry(1)], **kwargs)
    with pytest.raises(InvalidArgumentError, match="directory"):
        write_ledger_snapshot(None, [entry(1)])
    for bad in (5, [5], [(1, 2, 3)]):
        with pytest.raises(InvalidArgumentError, match="entries"):
            write_ledger_snapshot(tmp_path / "batch", bad)


# --- batch API: update_many / read_many agree with update / read ----------------------------------------

def entries_of(pids, offsets, epochs, timestamp=NOW):
    array = np.zeros(len(pids), ENTRY_DTYPE)
    array["producer_id"], array["last_offset"], array["epoch"] = pids, offsets, epochs
    array["last_sequence"] = 7
    array["timestamp"] = timestamp
    array["current_txn_first_offset"] = -1
    return array


@pytest.mark.parametrize("shape", [SMALL, Shape.from_np(20_000, 0.01)])
def test_update_many_is_update_in_order_across_flushes_and_growth(tmp_path, shape):
    rng = np.random.default_rng(5)
    pids = rng.integers(-3000, 3000, 6000)                     # repeats: a later entry of a producer wins
    array = entries_of(pids, np.arange(6000), rng.integers(0, 100, 6000))
    array["last_offset"][::97] = -1                            # no batch: stored as Kafka reads it
    with PidLedger(tmp_path / "batch", shape, clock_ms=Clock(), keep_snapshots=True) as batch, \
            PidLedger(tmp_path / "single", shape, clock_ms=Clock(), keep_snapshots=True) as single:
        batch.update_many(array[:2500])
        batch.update_many(array[2500:])
        for row in array.tolist():
            single.update(ProducerEntry(*row))
        probe = np.concatenate([np.unique(pids), [5000, -5000]])
        found, got = batch.read_many(probe)
        expected = [single.read(int(pid)) for pid in probe]
        assert found.tolist() == [e is not None for e in expected]
        assert [ProducerEntry(*row) if hit else None for hit, row in zip(found, got.tolist())] == expected
        assert all(batch.read(int(pid)) == e for pid, e in zip(probe, expected))
        assert files(tmp_path / "batch", ".snapshot") == files(tmp_path / "single", ".snapshot")
        if shape is SMALL:
            assert len(files(tmp_path / "batch", ".snapshot")) > 5     # many flushes inside the batches


def test_update_many_grows_the_active_file_once_for_its_batch(tmp_path):
    # Doubling from 1024 rows would rebuild the row table four times (and leave 8192 rows) for 5000 ids.
    with PidLedger(tmp_path, Shape.from_np(20_000, 0.01), clock_ms=Clock()) as ledger:
        ledger.update_many(entries_of(np.arange(5000), np.arange(5000), np.zeros(5000, np.int64)))
        (active,) = [n for n in os.listdir(tmp_path) if n.endswith(".active")]
        assert os.path.getsize(tmp_path / active) == HEADER.size + 5000 * ENTRY_SIZE
        assert ledger.read(4999).last_offset == 4999 and len(ledger) == 5000


def test_read_many_applies_expiry_and_reads_unsorted_kafka_files(tmp_path):
    kafka = random_entries(300, seed=51)
    (tmp_path / snapshot_name(10**15)).write_bytes(kafka_snapshot(kafka))
    clock = Clock()
    with PidLedger(tmp_path, SMALL, clock_ms=clock, producer_id_expiration_ms=DAY) as ledger:
        ledger.update(entry(1, timestamp=NOW))
        ledger.update(entry(2, timestamp=NOW - DAY))           # expired
        pids = [1, 2, 3] + [e.producer_id for e in kafka]
        found, got = ledger.read_many(pids)
        assert found.tolist() == [ledger.read(p) is not None for p in pids]
        assert found[0] and not found[1] and not found[2] and got[1].tolist() == (0,) * 8
        for hit, row, pid in zip(found, got.tolist(), pids):
            if hit:
                assert ProducerEntry(*row) == ledger.read(pid)
        with pytest.raises(InvalidArgumentError, match="integer"):
            ledger.read_many(["x"])


def test_read_many_expires_timestamps_near_int64_min_as_read_does(tmp_path):
    # now - timestamp overflows int64 for such a timestamp: it must still read as expired
    with PidLedger(tmp_path, SMALL, clock_ms=Clock(), producer_id_expiration_ms=2**62) as ledger:
        ledger.update(entry(1, timestamp=-2**63 + 10))
        ledger.update(entry(2, timestamp=NOW))
        found, _ = ledger.read_many([1, 2])
        assert found.tolist() == [False, True] == [ledger.read(p) is not None for p in (1, 2)]


def test_update_many_checks_the_whole_batch_first(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        array = entries_of([1, 2, 3], [5, -2, 7], [0, 0, 0])
        with pytest.raises(InvalidArgumentError, match="last_offset must be at least -1: entry 1"):
            ledger.update_many(array)
        assert ledger.read(1) is None                          # nothing written
        with pytest.raises(InvalidArgumentError):
            ledger.update_many([(1, 2)])
    with PidLedger(tmp_path, SMALL, read_only=True, clock_ms=Clock()) as reader:
        with pytest.raises(IllegalStateError, match="read-only"):
            reader.update_many(entries_of([1], [5], [0]))


def test_entries_of_numpy_integers_are_taken_as_ints(tmp_path):
    with PidLedger(tmp_path, SMALL, clock_ms=Clock()) as ledger:
        fields = [np.int64(7), np.int16(1), np.int32(3), np.int64(70), np.int32(0), np.int64(NOW), np.int32(0),
                  np.int64(-1)]
        assert ledger.update(ProducerEntry(*fields)) == entry(7, offset=70, epoch=1)._replace(last_sequence=3)
        assert ledger.read(np.int64(7)) == entry(7, offset=70, epoch=1)._replace(last_sequence=3)
        with pytest.raises(InvalidArgumentError):
            ledger.update(ProducerEntry(*fields[:1], np.int64(2**20), *fields[2:]))   # epoch beyond int16
        found, rows = ledger.read_many(np.empty(0, np.int64))
        assert len(found) == len(rows) == 0


def test_entry_chunks_yield_each_live_producer_once_newest_first(tmp_path):
    clock = Clock()
    with PidLedger(tmp_path, SMALL, clock_ms=clock, producer_id_expiration_ms=DAY) as ledger:
        for pid in range(10_000):      # flushes many times: most entries come from the snapshot
            ledger.update(entry(pid, timestamp=NOW - DAY if pid == 7 else NOW, txn=5 if pid == 3 else -1))
        ledger.update(entry(42, offset=123_456, epoch=9))           # newer than its snapshot entry
        chunks = list(ledger.entry_chunks())
        assert all(len(chunk) <= 4096 for chunk in chunks)
        found = {int(row["producer_id"]): ProducerEntry(*row.tolist()) for chunk in chunks for row in chunk}
        assert sum(map(len, chunks)) == len(found) == 9_999        # pid 7 expired
        assert found[42] == entry(42, offset=123_456, epoch=9) and found[3] == entry(3, txn=5)
        # Only the files that may hold an open transaction are read for those.
        opened = {int(row["producer_id"]) for chunk in ledger.entry_chunks(open_transactions=True) for row in chunk
                  if row["current_txn_first_offset"] >= 0}
        assert opened == {3}
