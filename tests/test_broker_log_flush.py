"""A roll's flush (Kafka's ``UnifiedLog.roll`` scheduling ``flushUptoOffsetExclusive``): the segments before the
new one are fsynced on the log manager's flusher thread, not on the appending one; the recovery point (and its
checkpoint) moves only once they are; a clean shutdown flushes what is pending, a crash loses nothing
acknowledged, a close or delete racing a flush and a failing fsync are handled."""
import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from broker_helpers import wait_for
from test_broker_log_recovery import batch, values

from kmem.broker import BrokerConfig, ErrorCode, LogManager
from kmem.broker.log import checkpoints
from kmem.broker.log.manager import FlushScheduler

SETTINGS = dict(producer_ledger_ids=100, log_segment_bytes=1000)
DEADLINE = 30


def open_manager(path, **settings):
    return LogManager(path, BrokerConfig.from_properties(**{**SETTINGS, **settings}))


def append(partition_log, i):
    result = partition_log.append(batch(b"value-%03d" % i * 20))
    assert result.error_code == ErrorCode.NONE, result
    return result.base_offset


def append_until_rolled(partition_log, start=0, rolls=1):
    """Append values from ``start`` until the log rolled ``rolls`` times; returns the next value."""
    segments = len(partition_log.segments)
    while len(partition_log.segments) < segments + rolls:
        append(partition_log, start)
        start += 1
    return start


def checkpointed_recovery_point(path):
    return checkpoints.read_offset_checkpoint(os.path.join(path, checkpoints.RECOVERY_POINT_CHECKPOINT))[("t", 0)]


def is_segment(fd):
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".log")


@pytest.fixture
def segment_fsyncs(monkeypatch):
    """``os.fsync`` of segment files waits while ``held`` is clear, or fails with ``error`` when it is set;
    ``synced`` lists the segment files synced."""
    real_fsync = os.fsync

    class Disk:
        held = threading.Event()
        error = None
        synced = []
        waiting = threading.Event()

    Disk.held.set()

    def fsync(fd):
        if is_segment(fd):
            if not Disk.held.is_set():
                Disk.waiting.set()
                Disk.held.wait()
            if Disk.error is not None:
                raise OSError(Disk.error, os.strerror(Disk.error))
            Disk.synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield Disk
    Disk.held.set()


def test_an_append_that_rolls_does_not_wait_for_the_old_segment_to_be_synced(tmp_path, segment_fsyncs):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        segment_fsyncs.held.clear()                 # the disk takes its time
        appended = []
        appender = threading.Thread(target=lambda: appended.append(append_until_rolled(partition_log, rolls=2)))
        appender.start()
        appender.join(DEADLINE)
        if appender.is_alive():
            segment_fsyncs.held.set()
            appender.join()
            pytest.fail("the appends that rolled waited for the fsync of the segments they left")
        wait_for(segment_fsyncs.waiting.is_set, "the roll's flush to start")

        # Until the flush is done neither the recovery point nor its checkpoint claims the rolled segments.
        manager.checkpoint()
        assert partition_log.recovery_point == checkpointed_recovery_point(tmp_path) == 0
        segment_fsyncs.held.set()
        active = partition_log.active.base_offset
        wait_for(lambda: partition_log.recovery_point == active, "the recovery point at the last roll")
        manager.checkpoint()
        assert checkpointed_recovery_point(tmp_path) == active
        assert set(segment_fsyncs.synced) >= {f"{s.base_offset:020d}.log" for s in partition_log.segments[:-1]}


@pytest.fixture
def flushes_never_run(monkeypatch):
    """The rolls' flushes are kept, not run: the list of them."""
    pending = []
    monkeypatch.setattr(FlushScheduler, "schedule", lambda self, task: pending.append(task))
    return pending


def test_a_clean_shutdown_flushes_what_the_rolls_left_and_their_flushes_then_do_nothing(
        tmp_path, segment_fsyncs, flushes_never_run):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        append_until_rolled(partition_log, rolls=3)
        assert len(flushes_never_run) == 3 and partition_log.recovery_point == 0
        bases, end = [s.base_offset for s in partition_log.segments], partition_log.log_end_offset
    assert set(segment_fsyncs.synced) == {f"{base:020d}.log" for base in bases}
    assert checkpointed_recovery_point(tmp_path) == end
    assert os.path.exists(os.path.join(tmp_path, checkpoints.CLEAN_SHUTDOWN))
    synced = len(segment_fsyncs.synced)
    for flush in flushes_never_run:            # the pending flushes of a closed log: nothing, no error
        flush()
    assert len(segment_fsyncs.synced) == synced and partition_log.recovery_point == end


def test_a_pending_flush_of_a_deleted_partition_does_nothing(tmp_path, flushes_never_run, caplog):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        append_until_rolled(manager.get_partition("t", 0), rolls=2)
        manager.delete_topic("t")
        for flush in flushes_never_run:
            flush()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_delete_and_a_close_during_a_flush_neither_wait_for_it_nor_make_it_fail(tmp_path, segment_fsyncs, caplog):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        manager.create_topic("u")
        segment_fsyncs.held.clear()
        append_until_rolled(manager.get_partition("t", 0))
        wait_for(segment_fsyncs.waiting.is_set, "the roll's flush to start")
        deleted = threading.Thread(target=manager.delete_topic, args=("t",))
        deleted.start()
        deleted.join(DEADLINE)
        assert not deleted.is_alive(), "the deletion waited for the flush"
        segment_fsyncs.held.set()
        other = manager.get_partition("u", 0)         # the flusher carries on with the other logs
        append_until_rolled(other)
        wait_for(lambda: other.recovery_point == other.active.base_offset, "the flush of the other log")

        segment_fsyncs.waiting.clear()
        segment_fsyncs.held.clear()
        append_until_rolled(other, 100)
        wait_for(segment_fsyncs.waiting.is_set, "the second roll's flush to start")
        closing = threading.Thread(target=other.close)     # its own flush of the same files waits too
        closing.start()
        segment_fsyncs.held.set()
        closing.join(DEADLINE)
        assert not closing.is_alive()
        assert other.recovery_point == other.log_end_offset
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_failed_flush_is_a_storage_error_and_the_recovery_point_waits_for_a_flush_that_succeeds(
        tmp_path, segment_fsyncs, caplog):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        segment_fsyncs.error = errno.EIO
        next_value = append_until_rolled(partition_log)
        wait_for(lambda: "KAFKA_STORAGE_ERROR" in caplog.text or "Input/output error" in caplog.text,
                 "the flush's error to be logged")
        assert partition_log.recovery_point == 0
        assert append(partition_log, next_value) > 0           # the log goes on taking appends
        segment_fsyncs.error = None
        append_until_rolled(partition_log, next_value + 1)
        active = partition_log.active.base_offset
        wait_for(lambda: partition_log.recovery_point == active, "the next roll's flush")
        assert {f"{s.base_offset:020d}.log" for s in partition_log.segments[:-1]} <= set(segment_fsyncs.synced)

        segment_fsyncs.error = errno.ENOSPC                     # the close cannot flush: no clean shutdown
        append(partition_log, 0)
        expected = values(partition_log)
    assert not os.path.exists(os.path.join(tmp_path, checkpoints.CLEAN_SHUTDOWN))
    assert checkpointed_recovery_point(tmp_path) <= active
    segment_fsyncs.error = None
    with open_manager(tmp_path) as manager:
        assert not manager.had_clean_shutdown
        assert values(manager.get_partition("t", 0)) == expected


CHILD = textwrap.dedent("""
    import sys
    from kmem.broker import BrokerConfig, LogManager
    from test_broker_log_recovery import batch
    manager = LogManager(sys.argv[1], BrokerConfig.from_properties(log_segment_bytes=1000))
    manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    for i in range(100_000):
        result = partition_log.append(batch(b"value-%05d" % i * 10))
        assert result.error_code == 0, result
        print(result.base_offset, flush=True)
""")


def test_after_a_sigkill_every_acknowledged_record_is_recovered(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        acknowledged = [int(child.stdout.readline()) for _ in range(400)]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with open_manager(tmp_path) as manager:
        assert not manager.had_clean_shutdown
        partition_log = manager.get_partition("t", 0)
        assert len(partition_log.segments) > 20
        found = dict(values(partition_log))
    assert [found.get(offset) for offset in acknowledged] == [b"value-%05d" % i * 10 for i in range(400)]
