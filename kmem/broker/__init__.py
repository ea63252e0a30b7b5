"""``kmem broker``: a single-node Kafka broker (see ``Broker``), laid out as Kafka's ``core`` is.

- ``server``: ``Broker``, which puts the parts together (Kafka's ``KafkaServer``); ``settings``: its
  settings, Kafka's names and defaults; ``codes``: Kafka's error codes (``ErrorCode``, ``LogError``).
- ``log``: the log directory, partitions, segments, indexes, checkpoints and producer state.
- ``group``: the group coordinator and ``__consumer_offsets``.
- ``txn``: the transaction coordinator, ``__transaction_state`` and the transaction markers.
- ``apis``: the request handlers.

The names exported here are the storage layer's and ``Broker``.
"""
from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.log import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, READ_COMMITTED, READ_UNCOMMITTED, AppendResult, FetchData,
    LogManager, OffsetAndTimestamp, PartitionLog, TopicInfo,
)
from kmem.broker.log.config import BrokerConfig, LogConfig
from kmem.broker.log.index import OffsetIndex, TimeIndex
from kmem.broker.log.producer_state import ProducerStateManager
from kmem.broker.log.segment import LogSegment
from kmem.broker.server import Broker

__all__ = [
    "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP", "READ_COMMITTED", "READ_UNCOMMITTED", "AppendResult",
    "Broker", "BrokerConfig", "ErrorCode", "FetchData", "LogConfig", "LogError", "LogManager", "LogSegment",
    "OffsetAndTimestamp", "OffsetIndex", "PartitionLog", "ProducerStateManager", "TimeIndex", "TopicInfo",
]
