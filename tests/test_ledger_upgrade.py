"""A ledger directory left by kmem 0.1, whose sidecars hold commons-collections 4.5.0-M1's bits.

kmem 0.1 set the bits of EnhancedDoubleHasher's pre-release loop; under 4.5.0's indices those sidecars
miss most ids. Opening such a directory must rebuild them and lose no id.
"""
import os

from bloom_reference import commons_indices, m1_indices, sidecar_bytes
from snapshot_files import kafka_snapshot, random_entries

from kmem.bloom import SIDECAR_SUFFIX, BloomFilter, Shape
from kmem.ledger import PidLedger, snapshot_name, write_ledger_snapshot

LEDGER_SHAPE = Shape.from_np(5000, 0.01)


def kmem_01_directory(directory):
    """Three snapshots as kmem 0.1 left them, each with an M1 sidecar.

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
    return newest, ids


def test_sidecars_of_kmem_01_are_rebuilt_and_no_id_is_lost(tmp_path):
    newest, ids = kmem_01_directory(tmp_path)
    for offset, pids in ids.items():            # the case being upgraded: old bits miss most ids now
        with BloomFilter.open(os.path.join(tmp_path, snapshot_name(offset) + SIDECAR_SUFFIX)) as old:
            assert old.contains_many(pids).mean() < 0.2

    with PidLedger(tmp_path, LEDGER_SHAPE, producer_id_expiration_ms=2**62) as ledger:
        for pid, entry in newest.items():
            assert ledger.read(pid) == entry

    for offset, pids in ids.items():            # rewritten with commons 4.5.0's bits
        shape = Shape.from_np(len(pids), 0.01)
        with open(os.path.join(tmp_path, snapshot_name(offset) + SIDECAR_SUFFIX), "rb") as f:
            assert f.read() == sidecar_bytes(shape.number_of_bits, shape.number_of_hash_functions, pids,
                                             commons_indices)

    inodes = [os.stat(p).st_ino for p in sidecars(tmp_path)]
    with PidLedger(tmp_path, LEDGER_SHAPE, producer_id_expiration_ms=2**62) as ledger:
        assert all(ledger.read(pid) == entry for pid, entry in newest.items())
    assert [os.stat(p).st_ino for p in sidecars(tmp_path)] == inodes     # rebuilt once, then kept


def sidecars(directory):
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(SIDECAR_SUFFIX))
