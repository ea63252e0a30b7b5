"""The producer-id ledger (KIP-1044): Kafka snapshot files, Bloom sidecars, an active file, a cache.

- ``ProducerEntry``, ``read_snapshot``, ``write_snapshot``, ``Snapshot``: Kafka's snapshot files.
- ``PidLedger``: read/update/flush (and read_many/update_many over arrays) over a directory of them, each
  snapshot it writes holding every producer as Kafka's do; ``PidCache``: write-through in front.
  ``kafka_view``: an entry as Kafka 3.9 reads it back.
- ``write_ledger_snapshot``: a sorted snapshot plus its sidecar from a batch of entries.
- ``set_open_snapshots_limit``, ``open_snapshots``: how many snapshots of the process's ledgers may keep a
  descriptor open between searches (the most recently searched), and how many do.
"""
from kmem.ledger.cache import PidCache
from kmem.ledger.ledger import DEFAULT_EXPIRATION_MS, DEFAULT_SHAPE, PidLedger, write_ledger_snapshot
from kmem.ledger.snapshot import (
    ENTRY_DTYPE, ENTRY_SIZE, NO_TXN, ProducerEntry, Snapshot, kafka_view, open_snapshots, read_snapshot,
    set_open_snapshots_limit, snapshot_name, snapshot_offset, verify_snapshot, write_snapshot,
)

__all__ = [
    "DEFAULT_EXPIRATION_MS", "DEFAULT_SHAPE", "ENTRY_DTYPE", "ENTRY_SIZE", "NO_TXN", "PidCache", "PidLedger",
    "ProducerEntry", "Snapshot", "kafka_view", "open_snapshots", "read_snapshot", "set_open_snapshots_limit",
    "snapshot_name", "snapshot_offset", "verify_snapshot", "write_ledger_snapshot", "write_snapshot",
]
