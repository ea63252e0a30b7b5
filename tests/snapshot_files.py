"""Snapshot files as Kafka writes them, built here from the layout alone (no kmem code involved)."""
import random
import struct

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
