"""Snapshot files as Kafka writes and reads them, from the layout alone (no kmem code involved)."""
import random
import struct

import crc32c

from kmem.ledger import ProducerEntry


def crc32c_reference(data):
    """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: independent of kmem's."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def kafka_snapshot(entries, version=1, trailing=b""):
    """A snapshot file as Kafka's ProducerStateManager writes it: hash-map order, CRC-32C of [6, end).

    ``trailing``: bytes after the entries, covered by the CRC (Kafka's reader accepts them).
    """
    body = struct.pack(">i", len(entries)) + b"".join(
        struct.pack(">qhiqiqiq", *e) for e in entries) + trailing
    return struct.pack(">hI", version, crc32c_reference(body)) + body


def with_crc(data):
    """``data`` with its CRC field recomputed, so a reader gets past the CRC check to the entries."""
    return data[:2] + struct.pack(">I", crc32c_reference(data[6:])) + data[6:] if len(data) >= 6 else data


def random_entries(n, seed=0):
    rng = random.Random(seed)
    ids = rng.sample(range(-(2**40), 2**40), n)
    return [ProducerEntry(pid, rng.randrange(2**15), rng.randrange(-1, 2**31 - 1), rng.randrange(2**50),
                          rng.randrange(100), rng.randrange(2**41), rng.randrange(-1, 50),
                          rng.choice([-1, rng.randrange(2**40)])) for pid in ids]


def read_kafka_snapshot(path):
    """The entries of a snapshot file as Kafka 3.9's ``ProducerStateManager.readSnapshot`` reads them, from the
    layout alone (version 1, CRC-32C of bytes [6, end) by the ``crc32c`` package, 46-byte entries): ValueError
    for an unknown version, a bad CRC or too few bytes (Kafka's CorruptSnapshotException)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 10:
        raise ValueError(f"{path}: {len(data)} bytes, no header")
    version, crc, count = struct.unpack_from(">hIi", data)
    if version != 1:
        raise ValueError(f"{path}: unknown file version {version}")
    if crc32c.crc32c(data[6:]) != crc:
        raise ValueError(f"{path}: CRC is no longer valid")
    if count < 0 or len(data) < 10 + 46 * count:
        raise ValueError(f"{path}: {len(data)} bytes cannot hold {count} entries")
    return [ProducerEntry(*struct.unpack_from(">qhiqiqiq", data, 10 + 46 * i)) for i in range(count)]
