"""kmem.broker recovery after an unclean shutdown, as Kafka's LogLoader: segments past the recovery point
revalidated batch by batch, truncated at the first invalid or partial batch, indexes rebuilt."""
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

from kmem.broker import BrokerConfig, ErrorCode, LogManager
from kmem.records import FileRecords, RecordsBuilder

SETTINGS = dict(producer_ledger_ids=100, log_index_interval_bytes=300, log_segment_bytes=2000)


def open_manager(path, **settings):
    return LogManager(path, BrokerConfig.from_properties(**{**SETTINGS, **settings}))


def batch(value, sequence=-1, producer_id=-1):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                             base_sequence=sequence)
    builder.append(value, timestamp=time.time_ns() // 1_000_000)
    return builder.build()


def values(partition_log):
    found, offset = [], 0
    while (fetched := partition_log.read(offset, 1 << 30)).records is not None:
        with fetched.records as records:
            found += [(r.offset, r.value) for r in records.records()]
        offset = found[-1][0] + 1
    return found


def populate(path, count=40, **settings):
    with open_manager(path, **settings) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for i in range(count):
            assert partition_log.append(batch(b"value-%03d" % i * 10)).error_code == ErrorCode.NONE
        return [s.base_offset for s in partition_log.segments], partition_log.directory


def crash(path, recovery_point=0):
    """Make the closed log directory look like the broker died: no marker, an older recovery point."""
    os.unlink(os.path.join(path, ".kafka_cleanshutdown"))
    with open(os.path.join(path, "recovery-point-offset-checkpoint"), "w") as f:
        f.write(f"0\n1\nt 0 {recovery_point}\n")


def positions(path):
    with FileRecords(path) as records:
        return [(b.file_position, b.size_in_bytes, b.last_offset) for b in records]


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_truncated_batch_is_cut_and_indexes_rebuilt(tmp_path):
    bases, directory = populate(tmp_path, log_segment_bytes=1 << 20)
    last = os.path.join(directory, f"{bases[-1]:020d}.log")
    batches = positions(last)
    index_before = file_bytes(last[:-4] + ".index")
    cut = batches[-3][0] + 30                  # inside the third batch from the end
    os.truncate(last, cut)
    os.truncate(last[:-4] + ".index", 0)
    crash(tmp_path, recovery_point=bases[-1])
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        partition_log = manager.get_partition("t", 0)
        assert not manager.had_clean_shutdown
        assert partition_log.log_end_offset == batches[-3][2]
        assert os.path.getsize(last) == batches[-3][0]
        assert [v for _, v in values(partition_log)] == [b"value-%03d" % i * 10 for i in range(40 - 3)]
        result = partition_log.append(batch(b"after"))
        assert result.base_offset == batches[-3][2]
    # The rebuilt index holds the entries the appends wrote for the batches left (one batch per append).
    kept = [entry for entry in struct.iter_unpack(">ii", index_before) if entry[1] < batches[-3][0]]
    rebuilt = list(struct.iter_unpack(">ii", file_bytes(last[:-4] + ".index")))
    assert rebuilt[:len(kept)] == kept and kept


def test_bad_crc_truncates_there_and_drops_later_segments(tmp_path):
    bases, directory = populate(tmp_path)
    assert len(bases) >= 3
    second = os.path.join(directory, f"{bases[1]:020d}.log")
    batches = positions(second)
    with open(second, "r+b") as f:              # one bit of a record value in the second batch
        f.seek(batches[1][0] + batches[1][1] - 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    crash(tmp_path, recovery_point=0)
    with open_manager(tmp_path) as manager:
        partition_log = manager.get_partition("t", 0)
        assert [s.base_offset for s in partition_log.segments] == bases[:2]
        assert partition_log.log_end_offset == batches[0][2] + 1
        assert not os.path.exists(os.path.join(directory, f"{bases[2]:020d}.log"))
        assert len(values(partition_log)) == batches[0][2] + 1
    assert file_bytes(os.path.join(tmp_path, "recovery-point-offset-checkpoint")) == \
        f"0\n1\nt 0 {batches[0][2] + 1}\n".encode()


def test_producer_state_follows_a_truncation(tmp_path):
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        manager.create_topic("t")
        partition_log = manager.get_partition("t", 0)
        for sequence in range(10):
            assert partition_log.append(batch(b"p1-%d" % sequence, sequence, producer_id=1)).base_offset == sequence
        assert partition_log.append(batch(b"p2-0", 0, producer_id=2)).base_offset == 10
        directory = partition_log.directory
    segment = os.path.join(directory, "00000000000000000000.log")
    sixth = positions(segment)[6]
    with open(segment, "r+b") as f:                 # corrupt the batch at offset 6
        f.seek(sixth[0] + sixth[1] - 1)
        f.write(b"\xee")
    crash(tmp_path, recovery_point=0)
    with open_manager(tmp_path, log_segment_bytes=1 << 20) as manager:
        partition_log = manager.get_partition("t", 0)
        assert partition_log.log_end_offset == 6
        # Batches kept are still known (the state was replayed from them) ...
        kept = partition_log.append(batch(b"p1-5", 5, producer_id=1))
        assert (kept.duplicate, kept.base_offset) == (True, 5)
        # ... while lost ones are appended again instead of being answered with offsets that are gone.
        lost = partition_log.append(batch(b"p1-6", 6, producer_id=1))
        assert (lost.duplicate, lost.base_offset) == (False, 6)
        other = partition_log.append(batch(b"p2-0", 0, producer_id=2))
        assert (other.error_code, other.duplicate, other.base_offset) == (ErrorCode.NONE, False, 7)
        assert [v for _, v in values(partition_log)][5:] == [b"p1-5", b"p1-6", b"p2-0"]


def test_segments_before_the_recovery_point_are_trusted(tmp_path):
    bases, directory = populate(tmp_path)
    first = os.path.join(directory, f"{bases[0]:020d}.log")
    with open(first, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")                      # Kafka does not revalidate flushed segments either
    crash(tmp_path, recovery_point=bases[-1])
    with open_manager(tmp_path) as manager:
        assert manager.get_partition("t", 0).log_end_offset == 40


def test_missing_or_corrupt_indexes_are_rebuilt_after_a_clean_shutdown(tmp_path):
    bases, directory = populate(tmp_path)
    stem = os.path.join(directory, f"{bases[0]:020d}")
    index, time_index = file_bytes(stem + ".index"), file_bytes(stem + ".timeindex")
    assert index and time_index
    os.unlink(stem + ".index")
    with open(os.path.join(directory, f"{bases[1]:020d}.timeindex"), "r+b") as f:
        f.write(b"\x7f" * 12)                 # a timestamp far above the others: not increasing
    second_time_index = file_bytes(os.path.join(directory, f"{bases[1]:020d}.timeindex"))
    with open_manager(tmp_path) as manager:
        assert manager.had_clean_shutdown
        assert len(values(manager.get_partition("t", 0))) == 40
    assert file_bytes(stem + ".index") == index
    assert file_bytes(stem + ".timeindex") == time_index
    assert file_bytes(os.path.join(directory, f"{bases[1]:020d}.timeindex")) != second_time_index


def test_recovered_indexes_are_trimmed(tmp_path, caplog):
    bases, directory = populate(tmp_path)
    crash(tmp_path, recovery_point=0)
    # Rebuilt with a larger interval, the indexes have fewer entries than the files they replace.
    with open_manager(tmp_path, log_index_interval_bytes=600):
        pass
    for base in bases:
        stem = os.path.join(directory, f"{base:020d}")
        entries = list(struct.iter_unpack(">ii", file_bytes(stem + ".index")))
        assert all(position > 0 for _, position in entries)
        stamps = [stamp for stamp, _ in struct.iter_unpack(">qi", file_bytes(stem + ".timeindex"))]
        assert stamps == sorted(set(stamps)) and stamps
    caplog.clear()
    with open_manager(tmp_path, log_index_interval_bytes=600) as manager:
        assert len(values(manager.get_partition("t", 0))) == 40
    assert "rebuilding" not in caplog.text


CHILD = textwrap.dedent("""
    import sys
    import time
    from kmem.broker import BrokerConfig, LogManager
    from kmem.records import RecordsBuilder
    manager = LogManager(sys.argv[1], BrokerConfig.from_properties(
        producer_ledger_ids=100, log_segment_bytes=200_000, log_index_interval_bytes=4096))
    if manager.get_partition("t", 0) is None:
        manager.create_topic("t")
    partition_log = manager.get_partition("t", 0)
    sequence = int(sys.argv[2])
    while True:
        builder = RecordsBuilder(2, "none", producer_id=7, producer_epoch=0, base_sequence=sequence)
        for i in range(8):
            builder.append(b"%08d-%d" % (sequence, i) + bytes(4000), timestamp=time.time_ns() // 1_000_000)
        result = partition_log.append(builder.build())
        assert result.error_code == 0, result
        print(sequence, result.base_offset, flush=True)
        sequence += 8
""")


def run_child_until_killed(path, sequence, acknowledgements):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(sequence)], stdout=subprocess.PIPE,
                             text=True)
    acked = []
    try:
        for line in child.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) == acknowledgements:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert len(acked) == acknowledgements, "the child stopped before being killed"
    return acked


def retry(partition_log, sequence):
    builder = RecordsBuilder(2, "none", producer_id=7, producer_epoch=0, base_sequence=sequence)
    for i in range(8):
        builder.append(b"%08d-%d" % (sequence, i) + bytes(4000), timestamp=time.time_ns() // 1_000_000)
    return partition_log.append(builder.build())


def test_sigkill_mid_append_loses_no_acknowledged_record(tmp_path):
    sequence = 0
    for round_ in range(3):
        acked = run_child_until_killed(tmp_path, sequence, 60 + 7 * round_)
        with open_manager(tmp_path, log_segment_bytes=200_000, log_index_interval_bytes=4096) as manager:
            assert not manager.had_clean_shutdown
            partition_log = manager.get_partition("t", 0)
            stored = values(partition_log)
            by_offset = dict(stored)
            for acked_sequence, offset in acked:            # every acknowledged record, at its offset
                for i in range(8):
                    assert by_offset[offset + i][:10] == b"%08d-%d" % (acked_sequence, i)
            prefixes = [v[:10] for _, v in stored]
            assert len(prefixes) == len(set(prefixes)) and [o for o, _ in stored] == list(range(len(stored)))
            assert len(partition_log.segments) > 1
            # The child may have written batches after its last acknowledgement before the kill arrived.
            written = [(int(stored[o][1][:8]), o) for o in range(0, len(stored), 8)]
            assert set(acked) <= set(written)
            # Retries of the producer's last five batches are answered with their original offsets.
            for written_sequence, offset in written[-5:]:
                again = retry(partition_log, written_sequence)
                assert (again.error_code, again.duplicate, again.base_offset) == (ErrorCode.NONE, True, offset)
            sequence = written[-1][0] + 8
            following = retry(partition_log, sequence)
            assert (following.error_code, following.duplicate, following.base_offset) == (
                ErrorCode.NONE, False, len(stored))
            sequence += 8
