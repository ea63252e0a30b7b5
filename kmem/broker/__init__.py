"""The storage layer of ``kmem broker``: Kafka 3.9's log directory, byte for byte, for a single node.

- ``BrokerConfig`` / ``LogConfig`` (``kmem.broker.config``): Kafka's settings, names and defaults.
- ``LogManager`` (``kmem.broker.log``): the log directory: topics, partitions, checkpoints,
  ``meta.properties``, clean-shutdown marker, retention, producer-id allocation.
- ``PartitionLog``: append (validation, offsets, idempotent producers), read, ListOffsets, roll.
- ``LogSegment``, ``OffsetIndex``, ``TimeIndex``: the segment files.
- ``ProducerStateManager``: idempotent-producer state over a ``kmem.ledger.PidLedger`` (KIP-1044).
- ``ErrorCode`` / ``LogError``: Kafka's error codes for what the log refuses.
- ``Broker`` (``kmem.broker.server``): the whole broker, serving Kafka clients over the wire protocol.

Everything here is independent of the wire protocol: request handlers pass record bytes in and get
Kafka's error codes, offsets and ``FileRecords`` slices back.
"""
from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.config import BrokerConfig, LogConfig
from kmem.broker.index import OffsetIndex, TimeIndex
from kmem.broker.log import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, READ_COMMITTED, READ_UNCOMMITTED, AppendResult, FetchData,
    LogManager, OffsetAndTimestamp, PartitionLog, TopicInfo,
)
from kmem.broker.producer_state import ProducerStateManager
from kmem.broker.segment import LogSegment
from kmem.broker.server import Broker

__all__ = [
    "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP", "READ_COMMITTED", "READ_UNCOMMITTED", "AppendResult",
    "Broker", "BrokerConfig", "ErrorCode", "FetchData", "LogConfig", "LogError", "LogManager", "LogSegment",
    "OffsetAndTimestamp", "OffsetIndex", "PartitionLog", "ProducerStateManager", "TimeIndex", "TopicInfo",
]
