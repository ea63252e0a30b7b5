"""The log: Kafka 3.9's log directory, byte for byte, for a single node (Kafka's ``kafka.log`` and
``storage`` modules). Independent of the wire protocol: callers pass record bytes in and get Kafka's
error codes, offsets and ``FileRecords`` slices back.

- ``manager``: ``LogManager``, the directory (topics, partitions, root checkpoints, ``meta.properties``,
  the clean-shutdown marker, retention, producer-id allocation).
- ``unified_log``: ``PartitionLog``, one partition (Kafka's ``UnifiedLog``): append, read, ListOffsets, roll,
  recovery.
- ``segment``, ``index``: ``LogSegment``, ``OffsetIndex``, ``TimeIndex``, the segment files.
- ``checkpoints``: the checkpoint files, ``partition.metadata``, ``meta.properties``.
- ``producer_state``: idempotent producers over a ``kmem.ledger.PidLedger`` (KIP-1044).
- ``validator``: Kafka's ``LogValidator``: batch checks and offset assignment.
- ``config``: ``BrokerConfig`` / ``LogConfig``, Kafka's log settings, names and defaults.
"""
from kmem.broker.log.manager import LogManager, TopicInfo, validate_topic_name
from kmem.broker.log.unified_log import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, READ_COMMITTED, READ_UNCOMMITTED, AppendResult, FetchData,
    OffsetAndTimestamp, PartitionLog,
)

__all__ = [
    "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP", "READ_COMMITTED", "READ_UNCOMMITTED", "AppendResult",
    "FetchData", "LogManager", "OffsetAndTimestamp", "PartitionLog", "TopicInfo", "validate_topic_name",
]
