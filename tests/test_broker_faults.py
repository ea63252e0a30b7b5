"""kmem.broker under faults: damaged files, a full disk, descriptor limits, names that would break a restart.
Nothing acknowledged may be lost or stored twice, and the broker must start again."""
import errno
import os

import pytest

from kmem.broker import ErrorCode, LogError
from kmem.broker.log import index as index_module, segment as segment_module
from kmem.errors import CorruptRecordError, IllegalStateError
from kmem.records import FileRecords

from test_broker_log_recovery import batch, crash, open_manager, populate, values


def test_zeroed_tail_keeps_every_batch_before_it(tmp_path):
    # What a crash leaves when pages past the data were allocated but never written: zeros.
    bases, directory = populate(tmp_path, log_segment_bytes=1 << 20)
    last = os.path.join(directory, f"{bases[-1]:020d}.log")
    valid = os.path.getsize(last)
    with open(last, "ab") as f:
        f.write(bytes(4096))
    with FileRecords(last) as records:
        seen = []
        with pytest.raises(CorruptRecordError):
            for read in records:
                seen.append(read.last_offset)
    with FileRecords(last, 0, valid) as records:
        assert seen == [read.last_offset for read in records]
    crash(tmp_path)
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        partition_log = manager.get_partition("t", 0)
        assert [v for _, v in values(partition_log)] == [b"value-%03d" % i * 10 for i in range(40)]
        assert os.path.getsize(last) == valid
        assert partition_log.log_end_offset == 40



# --- an append is all or nothing ------------------------------------------------------------------------

def test_a_failed_index_write_leaves_no_batch_behind(tmp_path, monkeypatch):
    with open_manager(tmp_path, log_index_interval_bytes=0) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(3):
            assert partition_log.append(batch(b"kept-%d" % i, sequence=i, producer_id=7)).error_code == ErrorCode.NONE
        segment = partition_log.active
        size, entries = segment.size, segment.offset_index.entries

        def no_space(*args):
            raise OSError(errno.ENOSPC, "No space left on device")
        with monkeypatch.context() as m:            # the data write succeeds, the index entry after it fails
            m.setattr(index_module.os, "pwrite", no_space)
            result = partition_log.append(batch(b"refused", sequence=3, producer_id=7))
        assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert "No space left" in result.error_message
        assert (segment.size, segment.offset_index.entries, partition_log.log_end_offset) == (size, entries, 3)
        assert os.path.getsize(segment.log_path) == size
        assert [v for _, v in values(partition_log)] == [b"kept-0", b"kept-1", b"kept-2"]
        retried = partition_log.append(batch(b"refused", sequence=3, producer_id=7))
        assert (retried.error_code, retried.base_offset, retried.duplicate) == (ErrorCode.NONE, 3, False)
    crash(tmp_path)
    with open_manager(tmp_path) as manager:
        assert [v for _, v in values(manager.get_partition("t", 0))] == [b"kept-0", b"kept-1", b"kept-2", b"refused"]


def test_a_failed_roll_keeps_the_active_segment(tmp_path, monkeypatch):
    with open_manager(tmp_path) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        assert partition_log.append(batch(b"first")).error_code == ErrorCode.NONE
        real_open = segment_module.os.open

        def no_descriptors(path, *args):
            if str(path).endswith(".log"):
                raise OSError(errno.EMFILE, "Too many open files")
            return real_open(path, *args)
        with monkeypatch.context() as m:
            m.setattr(segment_module.os, "open", no_descriptors)
            with pytest.raises(OSError):
                partition_log.roll()
            result = partition_log.append(batch(b"refused"))
        assert result.error_code == ErrorCode.NONE       # no roll was due: the active segment took it
        partition_log.roll()
        assert partition_log.append(batch(b"after")).error_code == ErrorCode.NONE
        assert [v for _, v in values(partition_log)] == [b"first", b"refused", b"after"]
        assert [s.base_offset for s in partition_log.segments] == [0, 2]


# --- names and files that must not keep the broker from starting ----------------------------------------

@pytest.mark.parametrize("name", ["t\n", "t\n-0", "\nt", "t\r", "t ", "..", ".", "", "ü", "a" * 250, "t\x00"])
def test_topic_names_are_validated_over_the_whole_string(tmp_path, name):
    with open_manager(tmp_path) as manager:
        with pytest.raises(LogError) as refused:
            manager.create_topic(name)
        assert refused.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert [n for n in os.listdir(tmp_path) if os.path.isdir(tmp_path / n)] == []


def test_an_unreadable_recovery_point_checkpoint_recovers_every_partition(tmp_path, caplog):
    populate(tmp_path, log_segment_bytes=1 << 20)
    with open(tmp_path / "recovery-point-offset-checkpoint", "w") as f:
        f.write("0\n2\nt 0 40\nbroken\n")
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        assert [v for _, v in values(manager.get_partition("t", 0))] == [b"value-%03d" % i * 10 for i in range(40)]
    assert "recovering every partition" in caplog.text
    with open(tmp_path / "recovery-point-offset-checkpoint") as f:
        assert f.read() == "0\n1\nt 0 40\n"            # rewritten whole


def test_an_unreadable_log_start_checkpoint_starts_at_the_first_segment(tmp_path, caplog):
    populate(tmp_path)
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        first_kept = partition_log.segments[1].base_offset
        manager.get_partition("t", 0).delete_records_before(first_kept + 1)
    with open(tmp_path / "log-start-offset-checkpoint", "w") as f:
        f.write("0\n1\nt 0\n")
    with open_manager(tmp_path) as manager:
        assert manager.get_partition("t", 0).log_start_offset == first_kept
    assert "DeleteRecords" in caplog.text


def test_a_directory_with_partitions_but_no_meta_properties_is_refused(tmp_path):
    populate(tmp_path, count=3)
    os.unlink(tmp_path / "meta.properties")
    with pytest.raises(IllegalStateError, match="holds 1 partitions .* but no meta.properties"):
        open_manager(tmp_path)
    assert not os.path.exists(tmp_path / "meta.properties")
    empty = tmp_path / "empty"
    with open_manager(empty) as manager:                   # an empty directory is formatted, as before
        assert manager.cluster_id
