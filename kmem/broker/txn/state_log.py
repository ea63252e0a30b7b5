"""The records of Kafka's ``__transaction_state`` topic, byte for byte: Kafka 3.9's ``TransactionLogKey``
(version 0: ``transactional id``) and ``TransactionLogValue`` (``kafka.coordinator.transaction.TransactionLog``).

- the key: ``i16 version (0) | string transactional id``;
- the value, written at version 0 as Kafka 3.9 writes it (version 1, flexible, only with
  ``transaction.version`` 1+, which Kafka 3.9 does not enable by default), read at 0 and 1:
  ``i16 version | i64 producer id | i16 producer epoch | i32 timeout ms | i8 state | partitions | i64 last
  update ms | i64 start ms``, partitions a nullable array of ``topic | [i32 partition]``, null for Empty;
  version 1 uses compact strings and arrays and ends each struct with tagged fields (Kafka 4's
  previous/next producer id and client transaction version, skipped here);
- a null value is a tombstone: the transactional id expired.

A transactional id's records go to partition ``abs(hashCode(id)) % transaction.state.log.num.partitions``
(``kmem.broker.group.offsets.partition_for``, Kafka's ``TransactionStateManager.partitionFor``).
"""
import struct
from typing import NamedTuple

from kmem.broker.group.offsets import OFFSETS_TOPIC, FlexibleReader, versioned_reader
from kmem.broker.txn.metadata import EMPTY, STATE_NAMES
from kmem.errors import CorruptRecordError

TRANSACTION_STATE_TOPIC = "__transaction_state"
# Kafka's internal topics (``Topic.isInternal``): the coordinators' own, which clients may not write to
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
KEY_VERSION = 0
VALUE_VERSION = 0
_KEY_HEAD = struct.Struct(">hh")             # version, transactional id's length
_VALUE_HEAD = struct.Struct(">hqhiB")       # version, producer id, epoch, timeout ms, state
_VALUE_TAIL = struct.Struct(">qq")          # last update ms, start ms
_NULL_ARRAY = struct.pack(">i", -1)


class TransactionLogValue(NamedTuple):
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int
    partitions: frozenset          # {(topic, partition)}
    last_update_ms: int
    start_ms: int


def transaction_log_key(transactional_id):
    name = transactional_id.encode()
    return _KEY_HEAD.pack(KEY_VERSION, len(name)) + name


def transaction_log_value(transit):
    """Value v0 of a ``TxnTransit`` (Kafka's ``TransactionLog.valueToBytes``). Written on the path of every
    AddPartitionsToTxn and EndTxn: packed in one piece per topic."""
    if transit.state == EMPTY and transit.partitions:
        raise ValueError(f"an Empty transaction has no partitions: {transit!r}")
    parts = [_VALUE_HEAD.pack(VALUE_VERSION, transit.producer_id, transit.producer_epoch, transit.timeout_ms,
                              transit.state)]
    if transit.state == EMPTY:
        parts.append(_NULL_ARRAY)
    else:
        by_topic = {}
        for topic, partition in sorted(transit.partitions):
            by_topic.setdefault(topic, []).append(partition)
        parts.append(len(by_topic).to_bytes(4, "big"))
        for topic, partitions in by_topic.items():
            name = topic.encode()
            parts.append(struct.pack(f">h{len(name)}si{len(partitions)}i", len(name), name, len(partitions),
                                     *partitions))
    parts.append(_VALUE_TAIL.pack(transit.last_update_ms, transit.start_ms))
    return b"".join(parts)


def read_key(key):
    """The transactional id of a key; ``CorruptRecordError`` for a missing key or an unknown version."""
    r, _ = versioned_reader(key, TRANSACTION_STATE_TOPIC, "key", (KEY_VERSION,))
    return r.string()


def read_value(value):
    """A ``TransactionLogValue``, or None for a tombstone; ``CorruptRecordError`` for bad bytes."""
    if value is None:
        return None
    r, version = versioned_reader(value, TRANSACTION_STATE_TOPIC, "value", (0, 1), FlexibleReader)
    flexible = version == 1
    producer_id, epoch, timeout = r.i64(), r.i16(), r.i32()
    state = r._take(1)[0]
    if state >= len(STATE_NAMES):
        raise CorruptRecordError(f"{TRANSACTION_STATE_TOPIC}: unknown transaction state {state}")
    count = r.uvarint() - 1 if flexible else r.i32()
    partitions = set()
    for _ in range(max(count, 0)):
        topic = r.compact_string() if flexible else r.string()
        for _ in range(r.uvarint() - 1 if flexible else r.i32()):
            partitions.add((topic, r.i32()))
        if flexible:
            r.skip_tagged_fields()
    last_update, start = r.i64(), r.i64()
    if flexible:
        r.skip_tagged_fields()
    if state == EMPTY:               # Kafka ignores the partitions of an Empty transaction
        partitions.clear()
    return TransactionLogValue(producer_id, epoch, timeout, state, frozenset(partitions), last_update, start)
