"""A ledger directory left by kmem 0.1: sidecars holding commons-collections 4.5.0-M1's bits, and snapshots that
each hold only the producers written since the previous one (its active file is version 1).

kmem 0.1 set the bits of EnhancedDoubleHasher's pre-release loop; under 4.5.0's indices those sidecars
miss most ids. Opening such a directory must rebuild them and lose no id; a writable open then merges the
snapshots into one that holds every producer, as Kafka's do.
"""
import os
import struct

from bloom_reference import commons_indices, m1_indices, sidecar_bytes
from snapshot_files import kafka_snapshot, random_entries

from kmem.bloom import SIDECAR_SUFFIX, BloomFilter, Shape
from kmem.ledger import ENTRY_SIZE, PidLedger, read_snapshot, snapshot_name, write_ledger_snapshot
from kmem.ledger.active import active_name

LEDGER_SHAPE = Shape.from_np(5000, 0.01)


def kmem_01_directory(directory):
    """Three snapshots as kmem 0.1 left them, each with an M1 sidecar, and its active file.

    Returns {pid: newest entry} and {offset: the snapshot's ids}.
    """
    first = random_entries(3000, seed=1)
    # The second snapshot updates a third of the first one's producers and adds new ones.
    second = [e._replace(last_offset=e.last_offset + 2**50, epoch=7) for e in first[:1000]]
    second += random_entries(1500, seed=2)
    third = random_entries(2000, seed=3)
    newest, ids = {}, {}
    for offset, entries, shape in ((100, first, None), (200, second, LEDGER_SHAPE), (300, third, None)):
        path = os.path.join(directory, snapshot_name(offset))
        if shape is None:
            shape = Shape.from_np(len(entries), 0.01)       # a Spark job's snapshot
            write_ledger_snapshot(directory, entries, offset=offset, shape=shape)
        else:                                               # a flushed active file: the ledger's shape,
            with open(path, "wb") as f:                     # here unsorted as Kafka writes it
                f.write(kafka_snapshot(entries))
        ids[offset] = [e.producer_id for e in entries]
        with open(path + SIDECAR_SUFFIX, "wb") as f:
            f.write(sidecar_bytes(shape.number_of_bits, shape.number_of_hash_functions, ids[offset], m1_indices))
        newest.update((e.producer_id, e) for e in entries)
    # Its active file (version 1, the snapshot layout with CRC 0): one producer of the first, updated again.
    updated = first[5]._replace(last_offset=first[5].last_offset + 2**51, epoch=9)
    row = kafka_snapshot([updated])[10:]
    with open(os.path.join(directory, active_name(4)), "wb") as f:
        f.write(struct.pack(">hIi", 1, 0, 1) + row + bytes(3 * ENTRY_SIZE))
    newest[updated.producer_id] = updated
    return newest, ids


def test_sidecars_of_kmem_01_are_rebuilt_and_no_id_is_lost(tmp_path):
    newest, ids = kmem_01_directory(tmp_path)
    for offset, pids in ids.items():            # the case being upgraded: old bits miss most ids now
        with BloomFilter.open(os.path.join(tmp_path, snapshot_name(offset) + SIDECAR_SUFFIX)) as old:
            assert old.contains_many(pids).mean() < 0.2
    before = sorted(os.listdir(tmp_path))

    with PidLedger(tmp_path, LEDGER_SHAPE, producer_id_expiration_ms=2**62, read_only=True) as reader:
        assert len(reader.snapshot_paths) == 3                  # every snapshot read, sidecars rebuilt in the heap
        assert all(reader.read(pid) == entry for pid, entry in newest.items())
    assert sorted(os.listdir(tmp_path)) == before

    with PidLedger(tmp_path, LEDGER_SHAPE, producer_id_expiration_ms=2**62) as ledger:
        for pid, entry in newest.items():
            assert ledger.read(pid) == entry
        (merged,) = ledger.snapshot_paths
    # Merged into one snapshot holding every producer's newest entry, the 0.1 files deleted
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith((".snapshot", SIDECAR_SUFFIX))) == \
        [os.path.basename(merged), os.path.basename(merged) + SIDECAR_SUFFIX]
    assert read_snapshot(merged) == sorted(newest.values())
    with open(merged + SIDECAR_SUFFIX, "rb") as f:              # written with commons 4.5.0's bits
        data = f.read()
    m, k = struct.unpack_from(">ii", data)
    assert data == sidecar_bytes(m, k, sorted(newest), commons_indices)

    inodes = [os.stat(p).st_ino for p in sidecars(tmp_path)]
    with PidLedger(tmp_path, LEDGER_SHAPE, producer_id_expiration_ms=2**62) as ledger:
        assert all(ledger.read(pid) == entry for pid, entry in newest.items())
    assert [os.stat(p).st_ino for p in sidecars(tmp_path)] == inodes     # merged once, then kept


def sidecars(directory):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(SIDECAR_SUFFIX))
