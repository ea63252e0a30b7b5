"""The group coordinator of ``kmem broker``: Kafka's classic group protocol (``ClassicGroup`` and the
classic part of ``GroupMetadataManager``, Kafka 3.9) and committed offsets kept in ``__consumer_offsets``.

Groups move through Kafka's states: Empty -> PreparingRebalance (members (re)join) -> CompletingRebalance
(the leader assigns, SyncGroup) -> Stable, and Dead once an empty group has no offsets left.

- JoinGroup v4+ without a member id is answered MEMBER_ID_REQUIRED with a new id, which stays pending
  for one session timeout; ``group.instance.id`` (static membership) joins directly and a later join with
  the same instance id takes over the member (the old id is then FENCED_INSTANCE_ID; an instance id no
  member has is UNKNOWN_MEMBER_ID, as Kafka's ``validateCurrentMember``). In a Stable group
  whose selected protocol that join leaves unchanged, the new id keeps the member's assignment without a
  rebalance, also for the leader (answered, as Kafka, with the previous leader id before JoinGroup v9 and
  with KIP-814's ``skip_assignment`` from v9).
- A rebalance completes when every member has rejoined, or at the rebalance deadline (the members'
  largest ``rebalance.timeout.ms``) without those that did not; a group starting from Empty waits
  ``group.initial.rebalance.delay.ms`` (extended by each new member, up to the rebalance timeout). The
  members chosen protocol is the one all support that most members prefer; the first member to join
  leads. A JoinGroup offering no protocol that every member supports is INCONSISTENT_GROUP_PROTOCOL
  (Kafka's ``supportsProtocols``: the joining member's current protocols count too, so a lone member
  cannot switch to one it did not have; an Empty group takes any).
- Members that do not heartbeat within their ``session.timeout.ms`` (unless waiting in JoinGroup or
  SyncGroup; during a rebalance too, so a silent member does not hold it for the rebalance timeout), or do
  not send SyncGroup within the rebalance timeout after a join, are removed and the group rebalances (or
  completes the join under way), with no request arriving: each group has one task on the broker's
  ``Timer`` at its earliest deadline (pending ids, the join or sync deadline, a member's session, its
  offsets' expiry). A heartbeat only pushes a deadline later, so it schedules nothing; when the task
  fires early for that reason it finds nothing due and moves to the new earliest deadline. An idle
  broker's groups cost nothing per tick, however many there are.
- Errors as Kafka's: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID,
  INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT, GROUP_MAX_SIZE_REACHED, INVALID_GROUP_ID...

JoinGroup and SyncGroup may answer later (Kafka's ``DelayedJoin`` and pending sync callbacks): they
return a ``DelayedResponse`` that the rebalance completes, and no thread waits for it.

Offsets and group metadata are records of the internal ``__consumer_offsets`` topic (created on the
first group request, ``offsets.topic.num.partitions`` partitions; a group's records go to partition
``abs(hashCode(group)) % partitions``), written before a commit or a new generation is acknowledged
and replayed when the broker starts: a Stable group comes back Stable with its members, who carry on
heartbeating (or rejoin) as with a Kafka coordinator fail-over. A write that fails changes nothing and
is answered as Kafka 3.9 maps its error (``GROUP_WRITE_ERRORS``): a failing or full disk is NOT_COORDINATOR,
which clients retry after finding the coordinator again. Offsets expire
``offsets.retention.minutes`` after the group became empty (after their commit for groups that only
commit, or at the expire timestamp OffsetCommit v1-4 gave), at that deadline; tombstones mark them gone.
The topic is created with ``cleanup.policy=compact``, as Kafka creates it, so the broker's log cleaner
(``kmem.broker.log.cleaner``) keeps it bounded as every compacted topic: the latest record of each offset
and group stays, tombstones go ``delete.retention.ms`` after the clean that kept them. An offsets topic an
older kmem created without a ``cleanup.policy`` (it had ``retention.ms=-1`` and compacted the topic itself)
is given ``cleanup.policy=compact`` when the coordinator starts, since Kafka always compacts it.

Transactional offsets (KIP-98; Kafka's ``handleTxnCommitOffsets``): TxnOffsetCommit v0-4 writes the offsets to
the group's partition as a transactional batch of the request's producer id and epoch (base sequence 0, as
Kafka writes it), so the partition's producer state holds the transaction open and its last stable offset
stays below the batch until the marker. The offsets are pending, unseen by OffsetFetch, until the transaction
coordinator has written the marker and calls ``handle_txn_completion``: COMMIT makes them the committed offsets
(unless a later commit of the same partition is further on in the log, which wins as in Kafka), ABORT drops
them. OffsetFetch v7+ with ``require_stable`` (KIP-447) answers UNSTABLE_OFFSET_COMMIT for a partition with a
pending offset, which clients retry. From v3 (KIP-447) the request's generation, member id and
``group.instance.id`` are checked as OffsetCommit's (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
FENCED_INSTANCE_ID); a generation of -1 commits for an unknown or empty group, which is created as a group
that only commits. When ``transactions`` is set (the broker's ``TransactionCoordinator``), the group's offsets
partition must be in the producer's ongoing transaction first (KIP-890's verification; its error is the
answer: INVALID_TXN_STATE for a partition not in it, TRANSACTION_ABORTABLE from v4). On loading, a
transactional batch's offsets are pending until their producer's COMMIT or ABORT control batch is read; those
whose marker is not in the log stay pending, for a marker to come. A group with
pending offsets is kept however old its committed offsets get, and the log cleaner never cleans past the
partition's last stable offset, so a pending offset stays in the log.
"""
import dataclasses
import logging
import threading
import time
import uuid

from kmem.broker.apis.authorized import GROUP_OPERATIONS
from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.group.assignors import ASSIGNOR_CLASSES, ASSIGNORS
from kmem.broker.group.consumer import ConsumerGroups
from kmem.broker.group.migration import Migration, migration_policy
from kmem.broker.group.offsets import (
    INT64_MAX, OFFSETS_TOPIC, GroupRecord, MemberRecord, OffsetAndMetadata, group_metadata_key, group_metadata_value,
    offset_commit_key, offset_commit_value, partition_for, read_group_value, read_key, read_offset_value,
)
from kmem.broker.log.config import INT32_MAX, at_least, config_from_properties
from kmem.broker.log.unified_log import TRANSACTION_OPEN, batches_from_start
from kmem.broker.log.validator import COORDINATOR
from kmem.broker.timer import Timer
from kmem.consumer.group import decode_subscription
from kmem.errors import ConfigError, CorruptRecordError, IllegalStateError
from kmem.protocol import ApiKey, messages
from kmem.records import ControlRecordType, build_coordinator_records

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL = "consumer"

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
MEMBER_ID_PREFIX_BYTES = 32767 - 37    # a protocol string's bytes, less "-" and a uuid

# api key -> GroupCoordinator method (FindCoordinator stays with the other handlers)
GROUP_APIS = {
    ApiKey.JOIN_GROUP: "join_group", ApiKey.SYNC_GROUP: "sync_group", ApiKey.HEARTBEAT: "heartbeat",
    ApiKey.LEAVE_GROUP: "leave_group", ApiKey.OFFSET_COMMIT: "offset_commit", ApiKey.OFFSET_FETCH: "offset_fetch",
    ApiKey.LIST_GROUPS: "list_groups", ApiKey.DESCRIBE_GROUPS: "describe_groups",
    ApiKey.DELETE_GROUPS: "delete_groups", ApiKey.OFFSET_DELETE: "offset_delete",
    ApiKey.TXN_OFFSET_COMMIT: "txn_offset_commit",
    ApiKey.CONSUMER_GROUP_HEARTBEAT: "consumer_group_heartbeat",
    ApiKey.CONSUMER_GROUP_DESCRIBE: "consumer_group_describe",
}
GROUP_VERSIONS = {
    ApiKey.JOIN_GROUP: (0, 9), ApiKey.SYNC_GROUP: (0, 5), ApiKey.HEARTBEAT: (0, 4), ApiKey.LEAVE_GROUP: (0, 5),
    ApiKey.OFFSET_COMMIT: (0, 9), ApiKey.OFFSET_FETCH: (0, 9), ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5), ApiKey.DELETE_GROUPS: (0, 2), ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1), ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0),
}


# A failed write to __consumer_offsets is answered as Kafka 3.9 maps the append's error, for group metadata
# (``GroupMetadataManager.storeGroup``; ``GroupCoordinatorService.handleOperationException`` for deletions)
# and for offset commits (``GroupMetadataManager.maybeConvertOffsetCommitError``): a failing or full disk
# is NOT_COORDINATOR, which clients retry after finding the coordinator again. Other errors go as they are.
GROUP_WRITE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
}
COMMIT_WRITE_ERRORS = {**GROUP_WRITE_ERRORS, ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
                       ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE}


def _assignor_names(name, value):
    """``group.consumer.assignors``: a list of ``uniform`` and ``range`` (or Kafka's class names), the first the
    default."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names = tuple(ASSIGNOR_CLASSES.get(item.strip(), item.strip()) for item in items if item.strip())
    unknown = [item for item in names if item not in ASSIGNORS]
    if not names or unknown:
        raise ConfigError(f"{name}: {value!r} must list assignors among {', '.join(ASSIGNORS)}")
    return names


def _rebalance_protocols(name, value):
    """``group.coordinator.rebalance.protocols``: ``classic`` and optionally ``consumer`` (KIP-848)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    protocols = tuple(item.strip().lower() for item in items if item.strip())
    if "classic" not in protocols or not set(protocols) <= {"classic", CONSUMER_PROTOCOL}:
        raise ConfigError(f"{name}: {value!r} must list classic, and may list consumer")
    return protocols


# Kafka's group coordinator settings: name -> (GroupConfig field, parser)
GROUP_SETTINGS = {
    "group.min.session.timeout.ms": ("min_session_timeout_ms", at_least(0, INT32_MAX)),
    "group.max.session.timeout.ms": ("max_session_timeout_ms", at_least(0, INT32_MAX)),
    "group.initial.rebalance.delay.ms": ("initial_rebalance_delay_ms", at_least(0, INT32_MAX)),
    "group.max.size": ("max_size", at_least(1, INT32_MAX)),
    "offsets.topic.num.partitions": ("offsets_topic_partitions", at_least(1, INT32_MAX)),
    "offsets.topic.segment.bytes": ("offsets_topic_segment_bytes", at_least(14, INT32_MAX)),
    "offsets.retention.minutes": ("offsets_retention_minutes", at_least(1, INT32_MAX)),
    "offsets.retention.check.interval.ms": ("offsets_retention_check_interval_ms", at_least(1)),
    "offset.metadata.max.bytes": ("offset_metadata_max_bytes", at_least(0, INT32_MAX)),
    "group.consumer.heartbeat.interval.ms": ("consumer_heartbeat_interval_ms", at_least(1, INT32_MAX)),
    "group.consumer.session.timeout.ms": ("consumer_session_timeout_ms", at_least(1, INT32_MAX)),
    "group.consumer.max.size": ("consumer_max_size", at_least(1, INT32_MAX)),
    "group.consumer.assignors": ("consumer_assignors", _assignor_names),
    "group.coordinator.rebalance.protocols": ("rebalance_protocols", _rebalance_protocols),
    "group.consumer.migration.policy": ("consumer_migration_policy", migration_policy),
}


def _some(names, shown=5):
    """The first ``shown`` of ``names``, for a log line."""
    names = list(names)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """The coordinator's settings, Kafka's names and defaults (``from_properties`` takes dotted names)."""
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = INT32_MAX
    offsets_topic_partitions: int = 50
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    offsets_retention_minutes: int = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    consumer_heartbeat_interval_ms: int = 5000
    consumer_session_timeout_ms: int = 45000
    consumer_max_size: int = INT32_MAX
    consumer_assignors: tuple = ("uniform", "range")
    rebalance_protocols: tuple = ("classic", CONSUMER_PROTOCOL)      # Kafka 4.0's default
    consumer_migration_policy: str = "bidirectional"                # Kafka 4.0's default (3.9's: disabled)

    @classmethod
    def from_properties(cls, properties):
        return config_from_properties(cls, GROUP_SETTINGS, properties)


def _now_ms():
    return time.time_ns() // 1_000_000


def _member_id_prefix(name):
    """Kafka's member id is ``<group.instance.id or client id>-<uuid>``, a protocol string (32767 bytes at
    most): the name is cut, at a character, so that the id fits whatever the name's length."""
    return name.encode()[:MEMBER_ID_PREFIX_BYTES].decode(errors="ignore")


class DelayedResponse:
    """A JoinGroup or SyncGroup response that the group's progress decides: ``set(value)`` (a response, or
    an error code that ``to_response`` turns into one) once; ``start(complete)`` calls ``complete(build)``
    with a ``build()`` giving the response, now if it is already set, else when it is. ``cancel()`` (the
    client left) drops ``complete``."""
    __slots__ = ("_lock", "_value", "_is_set", "_send", "_to_response")

    def __init__(self, to_response):
        self._lock = threading.Lock()
        self._value = None
        self._is_set = False
        self._send = None
        self._to_response = to_response

    def set(self, value):
        with self._lock:
            if self._is_set:
                return
            self._value, self._is_set, send, self._send = value, True, self._send, None
        if send is not None:
            send(self._response)

    def start(self, complete):
        with self._lock:
            ready = self._is_set
            if not ready:
                self._send = complete
        if ready:
            complete(self._response)

    def cancel(self):
        with self._lock:
            self._send = None

    def _response(self):
        return self._to_response(self._value) if isinstance(self._value, int) else self._value


@dataclasses.dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list                    # [(name, metadata bytes)] in the member's order of preference
    assignment: bytes = b""
    join_reply: DelayedResponse | None = None    # set while the member waits in JoinGroup
    sync_reply: DelayedResponse | None = None    # set while the member waits in SyncGroup
    heartbeat_deadline: float = 0.0    # monotonic seconds
    is_new: bool = True
    join_version: int = 0

    def metadata(self, protocol):
        return next((data for name, data in self.protocols if name == protocol), b"")

    def matches(self, protocols):
        return [name for name, _ in self.protocols] == [name for name, _ in protocols] and \
            all(bytes(a) == bytes(b) for (_, a), (_, b) in zip(self.protocols, protocols))


class Group:
    def __init__(self, group_id, now_ms):
        self.group_id = group_id
        self.state = EMPTY
        self.state_timestamp = now_ms
        self.protocol_type = None
        self.protocol = None
        self.generation = 0
        self.leader = None
        self.members = {}              # member id -> Member, in join order
        self.static_members = {}       # group.instance.id -> member id
        self.pending = {}              # member ids handed out with MEMBER_ID_REQUIRED -> monotonic deadline
        self.offsets = {}              # (topic, partition) -> OffsetAndMetadata
        self.txn_offsets = {}          # producer id -> {(topic, partition): OffsetAndMetadata} awaiting its marker
        self.join_deadline = None      # PreparingRebalance: when the join completes at the latest
        self.join_delay_ms = 0         # > 0 while the initial rebalance delay runs
        self.join_started = 0.0
        self.sync_deadline = None      # CompletingRebalance: when members that did not sync are removed
        self.timer_task = None         # the Timer's task at the group's earliest deadline

    def set_state(self, state, now_ms):
        self.state = state
        self.state_timestamp = now_ms

    def candidate_protocols(self, extra=None):
        members = list(self.members.values())
        sets = [{name for name, _ in m.protocols} for m in members]
        if extra is not None:
            sets.append({name for name, _ in extra})
        return set.intersection(*sets) if sets else set()

    def supports(self, protocol_type, protocols):
        if not protocols or not protocol_type:
            return False
        if self.state == EMPTY and not self.members:
            return True
        return self.protocol_type == protocol_type and bool(self.candidate_protocols(protocols))

    def select_protocol(self):
        candidates = self.candidate_protocols()
        votes = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=votes.get)       # ties: the first protocol voted for

    def max_rebalance_timeout_ms(self):
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self):
        return not self.pending and all(m.join_reply is not None for m in self.members.values())

    def record(self):
        return GroupRecord(self.protocol_type or "", self.generation, self.protocol, self.leader, self.state_timestamp,
                           [MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                         m.rebalance_timeout_ms, m.session_timeout_ms,
                                         bytes(m.metadata(self.protocol)), bytes(m.assignment))
                            for m in self.members.values()])


class GroupCoordinator:
    """Kafka's classic group coordinator over a ``LogManager`` (see the module docstring). One method
    per API, from a decoded request to a response; ``close()`` answers every waiting request."""

    def __init__(self, logs, config=None, *, timer=None):
        """``timer``: the broker's ``kmem.broker.timer.Timer`` (by default one of its own)."""
        self.logs = logs
        self.config = config or GroupConfig()
        self.groups = {}
        self.transactions = None       # the TransactionCoordinator verifying TxnOffsetCommit (KIP-890), if any
        self._txn_groups = {}          # producer id -> ids of the groups holding its pending offsets
        self._lock = threading.RLock()
        self._closed = False
        self._own_timer = timer is None
        self._timer = Timer("kmem-group-timer") if timer is None else timer
        self.consumer_groups = ConsumerGroups(self)     # KIP-848's, by group id; self.groups keeps their offsets
        self.migration = Migration(self)                # classic members in them, conversions both ways
        self._compact_offsets_topic_of_older_kmem()
        self._load()
        with self._lock:
            for group in self.groups.values():
                self._schedule(group)

    # --- __consumer_offsets ---------------------------------------------------------------------------

    def _offsets_partition(self, group_id):
        """The ``__consumer_offsets`` partition of ``group_id``, creating the topic on first use."""
        partitions = self.config.offsets_topic_partitions
        if self.logs.get_partition(OFFSETS_TOPIC, 0) is None:
            try:
                self.logs.create_topic(OFFSETS_TOPIC, partitions, {
                    "cleanup.policy": "compact", "segment.bytes": self.config.offsets_topic_segment_bytes})
            except LogError as e:
                if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise
        count = self.logs.partition_count(OFFSETS_TOPIC)
        return self.logs.get_partition(OFFSETS_TOPIC, partition_for(group_id, count))

    def _compact_offsets_topic_of_older_kmem(self):
        """An offsets topic without a ``cleanup.policy`` (older kmem compacted it itself) becomes compacted."""
        info = self.logs.topics().get(OFFSETS_TOPIC)
        if info is not None and "cleanup.policy" not in info.configs:
            self.logs.set_topic_configs(OFFSETS_TOPIC, {**info.configs, "cleanup.policy": "compact"})
            log.info("%s: cleanup.policy=compact (the log cleaner compacts it now)", OFFSETS_TOPIC)

    def create_offsets_topic(self):
        """Create ``__consumer_offsets`` if it is missing, as Kafka does for the first FindCoordinator (its
        fsyncs then happen before a JoinGroup needs the topic); a failure is left to the requests that
        write to it."""
        try:
            self._offsets_partition("")
        except (LogError, OSError) as e:
            log.error("cannot create %s: %s", OFFSETS_TOPIC, e)

    def _append(self, group_id, entries, errors=GROUP_WRITE_ERRORS):
        """Write ``[(key, value or None)]`` to the group's partition; returns the Kafka error code to answer:
        NONE, or the append's error as ``errors`` maps it (see ``GROUP_WRITE_ERRORS``)."""
        return self._write(group_id, entries, errors)[0]

    def _write(self, group_id, entries, errors, verification_guard=None, **batch_fields):
        """``_append`` with the batch's fields (``build_coordinator_records``'s: a transaction's producer) and
        the guard of its transaction's verification (``PartitionLog.start_txn_verification``); returns
        ``(error code, offset of the batch)``."""
        batch = build_coordinator_records(entries, _now_ms(), **batch_fields)
        try:
            partition_log = self._offsets_partition(group_id)
        except (LogError, OSError) as e:
            log.error("cannot create %s: %s", OFFSETS_TOPIC, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1
        try:
            result = partition_log.append(batch, origin=COORDINATOR, verification_guard=verification_guard)
            error, message = result.error_code, result.error_message
        except IllegalStateError as e:              # the topic was deleted meanwhile
            error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, str(e)
        except OSError as e:                        # the disk failed outside what the append reports
            error, message = ErrorCode.KAFKA_STORAGE_ERROR, str(e)
        if not error:
            return ErrorCode.NONE, result.base_offset
        answer = ErrorCode(errors.get(error, error))
        log.error("writing to %s for group %r failed (answered %s): %s", OFFSETS_TOPIC, group_id, answer.name,
                  message)
        return answer, -1

    def _store_group(self, group):
        return self._append(group.group_id, [(group_metadata_key(group.group_id),
                                              group_metadata_value(group.record()))])

    def _load(self):
        """Replay every partition of ``__consumer_offsets`` (last record per key wins). The offsets of a
        transactional batch are pending until their producer's marker: COMMIT makes them committed (unless
        the partition's committed offset is a later record), ABORT drops them; without a marker in the log
        they stay pending, as Kafka's ``loadGroupsAndOffsets`` leaves them."""
        now_ms, now = _now_ms(), time.monotonic()
        for index in range(self.logs.partition_count(OFFSETS_TOPIC)):
            pending = {}        # producer id -> {(group, topic, partition): OffsetAndMetadata}
            for batch in batches_from_start(self.logs.get_partition(OFFSETS_TOPIC, index)):
                if batch.is_control_batch:
                    try:
                        commit = batch.control_type == ControlRecordType.COMMIT
                    except CorruptRecordError as e:
                        log.warning("skipping a control batch of %s-%d: %s", OFFSETS_TOPIC, index, e)
                        continue
                    for (group_id, topic, partition), offset in pending.pop(batch.producer_id, {}).items():
                        if commit:
                            self._commit_txn_offset(self._loaded_group(group_id, now_ms), (topic, partition), offset)
                    continue
                txn = pending.setdefault(batch.producer_id, {}) if batch.is_transactional else None
                for record in batch:
                    try:
                        self._load_record(record.key, record.value, batch.base_offset, txn, now_ms, now)
                    except CorruptRecordError as e:
                        log.warning("skipping a record of %s-%d: %s", OFFSETS_TOPIC, index, e)
            for producer_id, offsets in pending.items():
                for (group_id, topic, partition), offset in offsets.items():
                    self._add_txn_offsets(self._loaded_group(group_id, now_ms), producer_id,
                                          {(topic, partition): offset})
        for group_id in [g for g, group in self.groups.items() if not group.members and not group.offsets
                         and not group.txn_offsets and group.state == EMPTY and group.protocol_type is None]:
            del self.groups[group_id]
        if self.groups:
            log.info("loaded %d groups from %s", len(self.groups), OFFSETS_TOPIC)
        self.consumer_groups.loaded()

    def _load_record(self, key, value, log_offset, txn, now_ms, now):
        """One record at ``log_offset``; ``txn``: the pending offsets of its producer (transactional batch)."""
        kind = read_key(key)
        if kind[0] == "offset":
            _, group_id, topic, partition = kind
            offset = None if value is None else read_offset_value(value)._replace(log_offset=log_offset)
            offsets, key = (txn, (group_id, topic, partition)) if txn is not None else \
                (self._loaded_group(group_id, now_ms).offsets, (topic, partition))
            if offset is None:
                offsets.pop(key, None)
            else:
                offsets[key] = offset
        elif kind[0] == "consumer":
            self.consumer_groups.replay(*kind[1:], value)
        elif value is None:
            self.groups.pop(kind[1], None)
        else:
            self._load_group(kind[1], read_group_value(value), now_ms, now)

    def _loaded_group(self, group_id, now_ms):
        return self.groups.get(group_id) or self.groups.setdefault(group_id, Group(group_id, now_ms))

    def _load_group(self, group_id, record, now_ms, now):
        group = self.groups.get(group_id) or Group(group_id, now_ms)
        self.groups[group_id] = group
        group.protocol_type = record.protocol_type or None
        group.generation, group.protocol, group.leader = record.generation, record.protocol, record.leader
        group.members.clear()
        group.static_members.clear()
        for m in record.members:
            member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                            m.session_timeout_ms, group.protocol_type or "", [(record.protocol, m.subscription)],
                            assignment=m.assignment, heartbeat_deadline=now + m.session_timeout_ms / 1000,
                            is_new=False)
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
        group.set_state(STABLE if group.members else EMPTY,
                        record.state_timestamp if record.state_timestamp >= 0 else now_ms)

    # --- deadlines ------------------------------------------------------------------------------------

    def _next_deadline(self, group, now, now_ms):
        """The group's earliest deadline (monotonic seconds), or None."""
        deadlines = list(group.pending.values())
        if group.state == PREPARING:
            deadlines.append(group.join_deadline)
        elif group.state == COMPLETING:
            deadlines.append(group.sync_deadline)
        deadlines.extend(m.heartbeat_deadline for m in group.members.values()
                         if m.join_reply is None and m.sync_reply is None)
        expiry_ms = self._offsets_expiry_ms(group)
        if expiry_ms is not None:
            deadlines.append(now + max(expiry_ms - now_ms, 0) / 1000)
        return min(deadlines, default=None)

    def _schedule(self, group):
        """Keep the group's timer task at (or before) its earliest deadline; under the lock."""
        if self._closed:
            return
        deadline = self._next_deadline(group, time.monotonic(), _now_ms())
        task = group.timer_task
        if task is not None and task.pending:
            if deadline is not None and task.deadline <= deadline:
                return                  # it fires first and reschedules then
            task.cancel()
        group.timer_task = None
        if deadline is not None:
            group_id = group.group_id
            group.timer_task = self._timer.schedule(deadline, lambda: self._deadline_reached(group_id))

    def _forget(self, group):
        del self.groups[group.group_id]
        if group.timer_task is not None:
            group.timer_task.cancel()
        consumer_group = self.consumer_groups.groups.get(group.group_id)
        if consumer_group is not None and not consumer_group.members:
            self._forget_consumer_group(consumer_group)

    def schedule_consumer_group(self, group, member=None):
        """Keep a consumer group's timer task at (or before) its earliest member deadline: as for classic groups,
        a heartbeat (of ``member``, whose deadlines alone changed) only moves a deadline later, so it schedules
        nothing and scans no other member. A group that emptied is kept by the group of its offsets (made if it
        has none), whose expiry deletes it. Under the lock."""
        if not group.members:
            if group.timer_task is not None:
                group.timer_task.cancel()
                group.timer_task = None
            # as Kafka keeps an empty group until its offsets expire (or one offsets.retention.check.interval.ms
            # without any), the group of its offsets does; it then writes the group's tombstones
            now_ms = _now_ms()
            offsets = self._loaded_group(group.group_id, now_ms)
            offsets.set_state(EMPTY, now_ms)
            self._schedule(offsets)
            return
        task = group.timer_task
        if member is not None and task is not None and task.pending and \
                task.deadline <= self.consumer_groups.next_deadline_of(member):
            return
        deadline = self.consumer_groups.next_deadline(group)
        if task is not None and task.pending:
            if task.deadline <= deadline:
                return                  # it fires first and reschedules then
            task.cancel()
        group.timer_task = None
        if not self._closed:
            group_id = group.group_id
            group.timer_task = self._timer.schedule(deadline, lambda: self._consumer_deadline_reached(group_id))

    def _store_migrated(self, group):
        """After a classic member's JoinGroup or LeaveGroup to the consumer group ``group``: its records written
        (those of every member, as the request may have moved any); the write's error code."""
        group.dirty.update(group.members)
        return self.consumer_groups.store(group)

    def _forget_consumer_group(self, group):
        if self.consumer_groups.groups.get(group.group_id) is group:
            del self.consumer_groups.groups[group.group_id]
        if group.timer_task is not None:
            group.timer_task.cancel()

    def _consumer_deadline_reached(self, group_id):
        with self._lock:
            group = self.consumer_groups.groups.get(group_id)
            if group is None or self._closed:
                return
            group.timer_task = None
            self.consumer_groups.expire(group, time.monotonic())
            if self.consumer_groups.groups.get(group_id) is group:
                self.schedule_consumer_group(group)

    def _schedule_if_idle(self, group):
        """After an offset commit: the first offsets of a group without a task need one (their expiry)."""
        if group.timer_task is None or not group.timer_task.pending:
            self._schedule(group)

    def _deadline_reached(self, group_id):
        with self._lock:
            group = self.groups.get(group_id)
            if group is None or self._closed:
                return
            group.timer_task = None
            self._fire(group, time.monotonic(), _now_ms())

    def tick(self, now=None, now_ms=None):
        """Fire every group's deadlines due by ``now`` (monotonic seconds) at once, as the timer does for
        each group at its earliest deadline: for tests and tools that move time on."""
        now = time.monotonic() if now is None else now
        now_ms = _now_ms() if now_ms is None else now_ms
        with self._lock:
            for group in list(self.groups.values()):
                self._fire(group, now, now_ms)

    def _fire(self, group, now, now_ms):
        """``_check_group``, then the group's task moves to its next deadline (unless the group went)."""
        try:
            self._check_group(group, now, now_ms)
        finally:
            if self.groups.get(group.group_id) is group:
                self._schedule(group)

    def _check_group(self, group, now, now_ms):
        """Everything due for ``group`` by ``now``: rebalances to complete, members and offsets to expire."""
        if self._closed:
            return
        if any(now >= deadline for deadline in group.pending.values()):
            # a new dict: one emptied by deletions would keep the size of its largest storm
            group.pending = {m: deadline for m, deadline in group.pending.items() if now < deadline}
            self._maybe_complete_join(group, now)
            if group.state == EMPTY and group.generation == 0 and not (group.members or group.pending
                                                                       or group.offsets or group.txn_offsets):
                self._forget(group)                  # only ever handed out ids: nothing to keep
                return
        if group.state == PREPARING and now >= group.join_deadline:
            self._complete_join(group, now)
        elif group.state == COMPLETING and now >= group.sync_deadline:
            missing = [m for m in group.members.values() if m.sync_reply is None]
            for member in missing:
                log.info("group %r: member %s sent no SyncGroup in time", group.group_id, member.member_id)
                self._remove_member(group, member)
            if missing:
                self._prepare_rebalance(group, now, "members did not sync in time")
        # Kafka's ClassicGroupMember.hasSatisfiedHeartbeat: waiting in JoinGroup or SyncGroup counts as
        # alive; any other member must heartbeat, in PreparingRebalance too (a live one is told
        # REBALANCE_IN_PROGRESS), so a silent member holds a rebalance for its session timeout only
        for member in list(group.members.values()):
            if member.join_reply is None and member.sync_reply is None and now >= member.heartbeat_deadline:
                log.info("group %r: member %s expired (session timeout)", group.group_id, member.member_id)
                self._remove_member_and_rebalance(group, member, now)
        self._expire_group_offsets(group, now_ms)

    def close(self):
        """Stop the deadlines; every waiting JoinGroup/SyncGroup is answered COORDINATOR_NOT_AVAILABLE
        (clients look for the coordinator again)."""
        with self._lock:
            self._closed = True
            for group in self.consumer_groups.groups.values():
                if group.timer_task is not None:
                    group.timer_task.cancel()
            for group in self.groups.values():
                if group.timer_task is not None:
                    group.timer_task.cancel()
                for member in group.members.values():
                    for reply in (member.join_reply, member.sync_reply):
                        if reply is not None:
                            reply.set(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if self._own_timer:
            self._timer.close()

    # --- rebalancing ----------------------------------------------------------------------------------

    def _prepare_rebalance(self, group, now, reason):
        if group.state == COMPLETING:        # the assignment under way is void
            for member in group.members.values():
                member.assignment = b""
                if member.sync_reply is not None:
                    member.sync_reply.set(ErrorCode.REBALANCE_IN_PROGRESS)
                    member.sync_reply = None
        log.info("group %r: rebalance (%s), generation %d", group.group_id, reason, group.generation)
        group.join_started = now
        if group.state == EMPTY and self.config.initial_rebalance_delay_ms > 0:
            group.join_delay_ms = self.config.initial_rebalance_delay_ms
            group.join_deadline = now + min(group.join_delay_ms, group.max_rebalance_timeout_ms()) / 1000
        else:
            group.join_delay_ms = 0
            group.join_deadline = now + group.max_rebalance_timeout_ms() / 1000
        group.set_state(PREPARING, _now_ms())
        self._maybe_complete_join(group, now)

    def _maybe_complete_join(self, group, now):
        if group.state == PREPARING and not group.join_delay_ms and group.all_joined():
            self._complete_join(group, now)

    def _member_added_during_delay(self, group, now):
        if group.state == PREPARING and group.join_delay_ms:       # InitialDelayedJoin: wait a delay more
            limit = group.join_started + group.max_rebalance_timeout_ms() / 1000
            group.join_deadline = min(now + group.join_delay_ms / 1000, limit)

    def _complete_join(self, group, now):
        for member in [m for m in group.members.values() if m.join_reply is None]:
            if member.group_instance_id is None or member.is_new:
                self._remove_member(group, member)
        group.join_delay_ms = 0
        now_ms = _now_ms()
        group.generation += 1
        if not group.members:
            group.protocol, group.leader = None, None
            group.set_state(EMPTY, now_ms)
            self._store_group(group)
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.set_state(COMPLETING, now_ms)
        group.sync_deadline = now + group.max_rebalance_timeout_ms() / 1000
        for member in group.members.values():
            if member.join_reply is None:
                continue
            member.join_reply.set(self._join_response(group, member, member.join_version))
            member.join_reply = None
            member.is_new = False
            member.heartbeat_deadline = now + member.session_timeout_ms / 1000

    def _join_response(self, group, member, version, error=ErrorCode.NONE):
        leader = member.member_id == group.leader
        response = messages.JoinGroupResponse(
            throttle_time_ms=0, error_code=error, generation_id=group.generation, protocol_type=group.protocol_type,
            protocol_name=group.protocol, leader=group.leader or "", skip_assignment=False,
            member_id=member.member_id, members=[])
        if leader:
            response.members = [messages.JoinGroupResponse.JoinGroupResponseMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id,
                metadata=bytes(m.metadata(group.protocol)))
                for m in group.members.values()]
        if version < 7 and response.protocol_name is None:
            response.protocol_name = ""
        return response

    def _remove_member(self, group, member):
        if member.join_reply is not None:
            member.join_reply.set(ErrorCode.UNKNOWN_MEMBER_ID)
        if member.sync_reply is not None:
            member.sync_reply.set(ErrorCode.UNKNOWN_MEMBER_ID)
        del group.members[member.member_id]
        if member.group_instance_id is not None and group.static_members.get(member.group_instance_id) == \
                member.member_id:
            del group.static_members[member.group_instance_id]
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _remove_member_and_rebalance(self, group, member, now):
        self._remove_member(group, member)
        if group.state in (STABLE, COMPLETING):
            self._prepare_rebalance(group, now, f"member {member.member_id} left")
        elif group.state == PREPARING:
            self._maybe_complete_join(group, now)

    # --- JoinGroup ------------------------------------------------------------------------------------

    def join_group(self, header, request, client_host=""):
        """``client_host``: the client's address as DescribeGroups shows it (Kafka's ``/127.0.0.1``)."""
        with self._lock:
            consumer_group = self.consumer_groups.groups.get(request.group_id)
            if consumer_group is not None:
                if consumer_group.members:
                    if self._closed:
                        return self._join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, request.member_id or "")
                    response = self.migration.join(consumer_group, header, request, client_host)
                    error = self._store_migrated(consumer_group)
                    return self._join_error(error, request.member_id or "") if error else response
                error = self.consumer_groups.delete(consumer_group)
                if error:
                    return self._join_error(error, request.member_id or "")
            result = self._join(header, request, header.api_version, client_host)
            group = self.groups.get(request.group_id)
            if group is not None:
                self._schedule(group)
            return result

    def _join_reply(self, request):
        member_id = request.member_id or ""
        return DelayedResponse(lambda code: self._join_error(code, member_id))

    @staticmethod
    def _join_error(code, member_id=""):
        return messages.JoinGroupResponse(throttle_time_ms=0, error_code=code, generation_id=-1, protocol_type=None,
                                          protocol_name="", leader="", skip_assignment=False, member_id=member_id,
                                          members=[])

    def _join(self, header, request, version, client_host):
        group_id, member_id = request.group_id, request.member_id or ""
        instance_id = request.group_instance_id if version >= 5 else None
        protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]
        if not group_id:
            return self._join_error(ErrorCode.INVALID_GROUP_ID, member_id)
        if not self.config.min_session_timeout_ms <= request.session_timeout_ms <= self.config.max_session_timeout_ms:
            return self._join_error(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        if self._closed:
            return self._join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        now = time.monotonic()
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return self._join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            try:
                self._offsets_partition(group_id)          # the topic exists before a generation is written
            except (LogError, OSError) as e:
                log.error("cannot create %s: %s", OFFSETS_TOPIC, e)
                return self._join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            group = self.groups[group_id] = Group(group_id, _now_ms())
        if group.state == DEAD:
            return self._join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        rebalance_timeout = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        client = (header.client_id or "", client_host)
        if not member_id:
            return self._join_new(group, client, request, version, instance_id, protocols, rebalance_timeout, now)
        return self._join_known(group, client, request, version, member_id, instance_id, protocols,
                                rebalance_timeout, now)

    def _join_new(self, group, client, request, version, instance_id, protocols, rebalance_timeout, now):
        if not group.supports(request.protocol_type, protocols):
            return self._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if instance_id is None and len(group.members) + len(group.pending) >= self.config.max_size:
            return self._join_error(ErrorCode.GROUP_MAX_SIZE_REACHED)
        new_id = f"{_member_id_prefix(instance_id or client[0])}-{uuid.uuid4()}"
        if instance_id is not None and instance_id in group.static_members:
            return self._replace_static_member(group, group.members[group.static_members[instance_id]], new_id,
                                               request, version, protocols, rebalance_timeout, now)
        if instance_id is None and version >= 4:       # KIP-394: the id first, then the real join
            group.pending[new_id] = now + request.session_timeout_ms / 1000
            return self._join_error(ErrorCode.MEMBER_ID_REQUIRED, new_id)
        if len(group.members) >= self.config.max_size:
            return self._join_error(ErrorCode.GROUP_MAX_SIZE_REACHED)
        return self._add_member(group, new_id, client, request, version, instance_id, protocols,
                                rebalance_timeout, now)

    def _add_member(self, group, member_id, client, request, version, instance_id, protocols, rebalance_timeout,
                    now):
        member = Member(member_id, instance_id, *client, rebalance_timeout,
                        request.session_timeout_ms, request.protocol_type, protocols, join_version=version)
        reply = member.join_reply = self._join_reply(request)
        if not group.members:
            group.protocol_type = request.protocol_type
            group.leader = member_id
        group.members[member_id] = member
        if instance_id is not None:
            group.static_members[instance_id] = member_id
        if group.state == PREPARING:
            self._member_added_during_delay(group, now)
            self._maybe_complete_join(group, now)
        else:
            self._prepare_rebalance(group, now, f"new member {member_id} joined")
        return reply

    def _replace_static_member(self, group, old, new_id, request, version, protocols, rebalance_timeout, now):
        """A static member rejoining without its member id: it takes over ``old``'s place, and assignment,
        under a new id (Kafka's ``updateStaticMemberAndRebalance``). A Stable group whose protocol stays the
        same does not rebalance: the group is stored with the new id and the member answered at once."""
        if old.join_reply is not None:
            old.join_reply.set(ErrorCode.FENCED_INSTANCE_ID)
        if old.sync_reply is not None:
            old.sync_reply.set(ErrorCode.FENCED_INSTANCE_ID)
        members_before, leader_before = dict(group.members), group.leader
        del group.members[old.member_id]
        member = dataclasses.replace(old, member_id=new_id, join_reply=None, sync_reply=None, protocols=protocols,
                                     rebalance_timeout_ms=rebalance_timeout,
                                     session_timeout_ms=request.session_timeout_ms, join_version=version)
        group.members[new_id] = member
        group.static_members[member.group_instance_id] = new_id
        if group.leader == old.member_id:
            group.leader = new_id
        if group.state == STABLE and group.select_protocol() == group.protocol:
            error = self._store_group(group)
            if error:       # as Kafka: the old member id stays, the join fails
                group.members, group.leader = members_before, leader_before
                group.static_members[old.group_instance_id] = old.member_id
                old.heartbeat_deadline = now + old.session_timeout_ms / 1000
                response = self._join_response(group, old, version, error)
                response.member_id, response.members = "", []
                return response
            member.heartbeat_deadline = now + member.session_timeout_ms / 1000
            return self._static_rejoin_response(group, member, version, leader_before)
        reply = member.join_reply = self._join_reply(request)
        if group.state == PREPARING:
            self._maybe_complete_join(group, now)
        else:
            self._prepare_rebalance(group, now, f"static member {member.group_instance_id} rejoined")
        return reply

    def _static_rejoin_response(self, group, member, version, leader_before):
        """The JoinGroup answer of a static member that took its place back in a Stable group. From v9 on
        (KIP-814) a returning leader is told it leads, with the members, but to skip the assignment; before
        v9 it is given the previous leader's id, so that it syncs as a follower: either way the group's
        assignment stays as it is and no member sees a revocation."""
        response = self._join_response(group, member, version)
        if member.member_id == group.leader:
            if version >= 9:
                response.skip_assignment = True
            else:
                response.leader, response.members = leader_before, []
        return response

    def _join_known(self, group, client, request, version, member_id, instance_id, protocols, rebalance_timeout,
                    now):
        # As Kafka's doCurrentMemberJoinGroup: the protocols first (the member's own count among those the group
        # supports, so a lone member cannot switch to a protocol it did not have), then the member
        if not group.supports(request.protocol_type, protocols):
            return self._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if member_id in group.pending:
            del group.pending[member_id]
            return self._add_member(group, member_id, client, request, version, None, protocols, rebalance_timeout,
                                    now)
        error = self._check_member(group, member_id, instance_id)
        if error:
            return self._join_error(error, member_id)
        member = group.members[member_id]
        member.join_version = version
        member.rebalance_timeout_ms, member.session_timeout_ms = rebalance_timeout, request.session_timeout_ms
        if group.state == PREPARING:
            member.protocols = protocols
            reply = member.join_reply = self._join_reply(request)
            self._maybe_complete_join(group, now)
            return reply
        if group.state == COMPLETING and member.matches(protocols):
            return self._join_response(group, member, version)      # its join response was lost: same again
        if group.state == STABLE and member_id != group.leader and member.matches(protocols):
            member.heartbeat_deadline = now + member.session_timeout_ms / 1000
            return self._join_response(group, member, version)
        member.protocols = protocols
        reply = member.join_reply = self._join_reply(request)
        self._prepare_rebalance(group, now, f"member {member_id} rejoined")
        return reply

    # --- SyncGroup ------------------------------------------------------------------------------------

    def sync_group(self, header, request):
        with self._lock:
            consumer_group = self.consumer_groups.groups.get(request.group_id)
            if consumer_group is not None and not self._closed:
                return self.migration.sync(consumer_group, header, request)
            result = self._sync(request, header.api_version)
            group = self.groups.get(request.group_id)
            if group is not None:
                self._schedule(group)
        return self._sync_error(result) if isinstance(result, int) else result

    @staticmethod
    def _sync_error(code):
        return messages.SyncGroupResponse(throttle_time_ms=0, error_code=code, protocol_type=None, protocol_name=None,
                                          assignment=b"")

    def _sync(self, request, version):
        group = self.groups.get(request.group_id)
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group is None or group.state == DEAD:
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = self._check_generation(group, request.member_id, request.group_instance_id if version >= 3 else None,
                                       request.generation_id)
        if error:
            return error
        if version >= 5 and ((request.protocol_type is not None and request.protocol_type != group.protocol_type) or
                             (request.protocol_name is not None and request.protocol_name != group.protocol)):
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        member = group.members[request.member_id]
        now = time.monotonic()
        member.heartbeat_deadline = now + member.session_timeout_ms / 1000
        if group.state == PREPARING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if group.state == STABLE:
            return self._sync_response(group, member)
        # CompletingRebalance: wait for the leader's assignment (only the leader's is used, as Kafka does)
        if member.sync_reply is not None:
            member.sync_reply.set(ErrorCode.REBALANCE_IN_PROGRESS)       # a duplicate: the newer request waits instead
        reply = member.sync_reply = DelayedResponse(self._sync_error)
        if member.member_id == group.leader:
            assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            error = self._store_group(group)
            group.set_state(STABLE, _now_ms())
            for m in group.members.values():
                if m.sync_reply is not None:
                    m.sync_reply.set(error or self._sync_response(group, m))
                    m.sync_reply = None
                m.heartbeat_deadline = now + m.session_timeout_ms / 1000
            if error:
                self._prepare_rebalance(group, now, "its assignment could not be stored")
            else:
                log.info("group %r: stable at generation %d, %d member%s (%s): %s", group.group_id, group.generation,
                         len(group.members), "" if len(group.members) == 1 else "s", group.protocol,
                         _some(group.members))
        return reply

    @staticmethod
    def _sync_response(group, member):
        return messages.SyncGroupResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                          protocol_type=group.protocol_type, protocol_name=group.protocol,
                                          assignment=bytes(member.assignment))

    def _check_generation(self, group, member_id, instance_id, generation_id):
        """``_check_member``, then ILLEGAL_GENERATION for another generation than the group's."""
        error = self._check_member(group, member_id, instance_id)
        return error or (ErrorCode.ILLEGAL_GENERATION if generation_id != group.generation else ErrorCode.NONE)

    def _check_member(self, group, member_id, instance_id):
        """Kafka's ``validateCurrentMember``: FENCED_INSTANCE_ID (the instance id is another member's),
        UNKNOWN_MEMBER_ID (no member has the instance id, or the member id) or NONE."""
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if known != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    # --- Heartbeat, LeaveGroup ------------------------------------------------------------------------

    def heartbeat(self, header, request):
        with self._lock:
            consumer_group = self.consumer_groups.groups.get(request.group_id)
            if consumer_group is not None and not self._closed:
                error = self.migration.heartbeat(consumer_group, header, request)
            else:
                error = self._heartbeat(request, header.api_version)
        return messages.HeartbeatResponse(throttle_time_ms=0, error_code=error)

    def _heartbeat(self, request, version):
        group = self.groups.get(request.group_id)
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group is None or group.state in (EMPTY, DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = self._check_generation(group, request.member_id, request.group_instance_id if version >= 3 else None,
                                       request.generation_id)
        if error:
            return error
        member = group.members[request.member_id]
        member.heartbeat_deadline = time.monotonic() + member.session_timeout_ms / 1000
        return ErrorCode.REBALANCE_IN_PROGRESS if group.state == PREPARING else ErrorCode.NONE

    def leave_group(self, header, request):
        version = header.api_version
        if version < 3:
            leaving = [messages.LeaveGroupRequest.MemberIdentity(member_id=request.member_id, group_instance_id=None)]
        else:
            leaving = request.members
        Response = messages.LeaveGroupResponse
        with self._lock:
            consumer_group = self.consumer_groups.groups.get(request.group_id)
            if consumer_group is not None and not self._closed:
                errors = self.migration.leave(consumer_group, leaving)
                error = self._store_migrated(consumer_group)
                errors = [error or e for e in errors]
            else:
                errors = self._leave_classic_group(request.group_id, leaving)
        results = [Response.MemberResponse(member_id=identity.member_id, group_instance_id=identity.group_instance_id,
                                           error_code=error) for identity, error in zip(leaving, errors)]
        if version < 3:
            return Response(throttle_time_ms=0, error_code=results[0].error_code, members=[])
        return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, members=results)

    def _leave_classic_group(self, group_id, leaving):
        group = self.groups.get(group_id)
        now = time.monotonic()
        errors = [ErrorCode.UNKNOWN_MEMBER_ID if group is None or group.state == DEAD
                  else self._leave(group, identity, now)
                  for identity in leaving]
        if group is not None and self.groups.get(group_id) is group:
            self._schedule(group)
        return errors

    def _leave(self, group, identity, now):
        member_id, instance_id = identity.member_id or "", identity.group_instance_id
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if member_id and member_id != known:
                return ErrorCode.FENCED_INSTANCE_ID
            member_id = known
        if member_id in group.pending:
            del group.pending[member_id]
            self._maybe_complete_join(group, now)
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        log.info("group %r: member %s left", group.group_id, member_id)
        self._remove_member_and_rebalance(group, member, now)
        return ErrorCode.NONE

    # --- OffsetCommit, OffsetFetch --------------------------------------------------------------------

    def offset_commit(self, header, request):
        version = header.api_version
        Topic, Partition = messages.OffsetCommitResponse.OffsetCommitResponseTopic, \
            messages.OffsetCommitResponse.OffsetCommitResponsePartition
        response = messages.OffsetCommitResponse(throttle_time_ms=0, topics=[])
        with self._lock:
            error = self._check_commit(request, version)
            now_ms = _now_ms()
            retention = request.retention_time_ms if 2 <= version <= 4 else -1
            entries, accepted, results = [], [], []
            for topic in request.topics:
                topic_result = Topic(name=topic.name, partitions=[])
                response.topics.append(topic_result)
                for p in topic.partitions:
                    result = Partition(partition_index=p.partition_index, error_code=error)
                    topic_result.partitions.append(result)
                    if error:
                        continue
                    if p.committed_metadata is not None and \
                            len(p.committed_metadata.encode()) > self.config.offset_metadata_max_bytes:
                        result.error_code = ErrorCode.OFFSET_METADATA_TOO_LARGE
                        continue
                    if self.logs.get_partition(topic.name, p.partition_index) is None:
                        result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        continue
                    commit_ts = p.commit_timestamp if version == 1 and p.commit_timestamp >= 0 else now_ms
                    expire_ts = -1
                    if version == 1 and p.commit_timestamp >= 0:
                        expire_ts = p.commit_timestamp + self.config.offsets_retention_minutes * 60_000
                    elif retention >= 0:
                        expire_ts = commit_ts + retention
                    # a commit time or retention near the int64 limit: never expires (Kafka's long wraps)
                    expire_ts = min(expire_ts, INT64_MAX)
                    offset = OffsetAndMetadata(p.committed_offset, p.committed_leader_epoch if version >= 6 else -1,
                                               p.committed_metadata or "", commit_ts, expire_ts)
                    entries.append((offset_commit_key(request.group_id, topic.name, p.partition_index),
                                    offset_commit_value(offset)))
                    accepted.append(((topic.name, p.partition_index), offset))
                    results.append(result)
            if entries:
                stored, log_offset = self._write(request.group_id, entries, COMMIT_WRITE_ERRORS)
                if stored:
                    for result in results:
                        result.error_code = stored
                else:
                    group = self.groups.get(request.group_id)
                    if group is None:       # a group that only commits (generation -1, no member id)
                        group = self.groups[request.group_id] = Group(request.group_id, now_ms)
                    group.offsets.update((key, offset._replace(log_offset=log_offset)) for key, offset in accepted)
                    if retention >= 0 or version == 1:
                        self._schedule(group)       # an expiry of its own may come first
                    else:
                        self._schedule_if_idle(group)
        return response

    def _check_commit(self, request, version):
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not request.group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(request.group_id)
        generation = request.generation_id_or_member_epoch if version >= 1 else -1
        member_id = request.member_id if version >= 1 else ""
        consumer_group = self.consumer_groups.groups.get(request.group_id)
        if consumer_group is not None:
            return self.consumer_groups.check_commit(consumer_group, member_id, generation, version)
        if group is None:
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if group.state == DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.state == EMPTY:
            return ErrorCode.NONE
        error = self._check_generation(group, member_id, request.group_instance_id if version >= 7 else None,
                                       generation)
        if error:
            return error
        if group.state == COMPLETING:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = group.members[member_id]
        member.heartbeat_deadline = time.monotonic() + member.session_timeout_ms / 1000
        return ErrorCode.NONE

    # --- TxnOffsetCommit and the transactions' markers ------------------------------------------------------

    def txn_offset_commit(self, header, request):
        """Kafka's ``handleTxnCommitOffsets``: the offsets are written to the group's ``__consumer_offsets``
        partition as a transactional batch of the request's producer (sequence 0, as Kafka writes it), which
        keeps the producer's transaction open on that partition until its marker, and held pending (unseen
        by OffsetFetch) until ``handle_txn_completion``."""
        version = header.api_version
        Topic = messages.TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
        Partition = messages.TxnOffsetCommitResponse.TxnOffsetCommitResponsePartition
        response = messages.TxnOffsetCommitResponse(throttle_time_ms=0, topics=[])
        wanted = []                 # (result, topic, request partition) of the partitions that exist
        for topic in request.topics:
            topic_result = Topic(name=topic.name, partitions=[])
            response.topics.append(topic_result)
            for p in topic.partitions:
                result = Partition(partition_index=p.partition_index, error_code=ErrorCode.NONE)
                topic_result.partitions.append(result)
                if self.logs.get_partition(topic.name, p.partition_index) is None:
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    wanted.append((result, topic.name, p))
        if not wanted:
            return response
        error, guard = self._verify_txn_commit(request, version)
        with self._lock:
            error = error or self._check_txn_commit(request, version)
            fitting = []
            for item in wanted:
                metadata = item[2].committed_metadata
                if not error and metadata is not None and \
                        len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                    item[0].error_code = ErrorCode.OFFSET_METADATA_TOO_LARGE
                else:
                    fitting.append(item)
            if fitting and not error:
                error = self._store_txn_offsets(request, version, fitting, guard)
        for result, _, _ in fitting:
            result.error_code = error
        return response

    def _verify_txn_commit(self, request, version):
        """KIP-890: the group's offsets partition must be in the producer's ongoing transaction; returns
        ``(error code, guard for the append)``. Unless the producer has its transaction open in the partition
        at this epoch already, the transaction coordinator is asked, before the coordinator's lock is taken
        (it calls ``handle_txn_completion`` holding its own); a marker written meanwhile voids the guard (or
        closes the transaction found open), so the offsets cannot open a transaction that has ended (Kafka's
        ``VerificationGuard``). From v4 a partition not in the transaction is TRANSACTION_ABORTABLE, before it
        INVALID_TXN_STATE."""
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        if not request.group_id:
            return ErrorCode.INVALID_GROUP_ID, None
        if request.producer_id < 0 or request.producer_epoch < 0:
            return ErrorCode.INVALID_TXN_STATE, None          # no transaction can hold it
        if self.transactions is None:
            return ErrorCode.NONE, None
        try:
            partition_log = self._offsets_partition(request.group_id)
            guard = partition_log.start_txn_verification(request.producer_id, request.producer_epoch)
        except (LogError, OSError, IllegalStateError) as e:
            log.error("cannot write to %s: %s", OFFSETS_TOPIC, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        if guard is TRANSACTION_OPEN:
            return ErrorCode.NONE, guard
        error = self.transactions.verify_transaction(request.transactional_id, request.producer_id,
                                                     request.producer_epoch, OFFSETS_TOPIC, partition_log.partition,
                                                     transaction_abortable=version >= 4)
        if error:
            partition_log.cancel_txn_verification(request.producer_id, guard)
        return COMMIT_WRITE_ERRORS.get(error, error), guard

    def _check_txn_commit(self, request, version):
        """Kafka's ``validateOffsetCommit`` for a transaction (KIP-447 from v3): an unknown or empty group
        takes offsets without a generation (a group that only commits); a generation, member id or
        instance id must be the group's current one (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
        ILLEGAL_GENERATION)."""
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        generation, member_id, instance_id = (request.generation_id, request.member_id, request.group_instance_id) \
            if version >= 3 else (-1, "", None)
        consumer_group = self.consumer_groups.groups.get(request.group_id)
        if consumer_group is not None and (generation >= 0 or member_id):
            # Kafka's OffsetMetadataManager.validateTransactionalOffsetCommit: a stale epoch is ILLEGAL_GENERATION
            error = self.consumer_groups.check_commit(consumer_group, member_id, generation, version,
                                                      transactional=True)
            return ErrorCode.ILLEGAL_GENERATION if error == ErrorCode.STALE_MEMBER_EPOCH else error
        group = self.groups.get(request.group_id) or Group(request.group_id, _now_ms())
        if group.state == DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.state == EMPTY:
            return ErrorCode.NONE
        if generation >= 0 or member_id or instance_id is not None:
            return self._check_generation(group, member_id, instance_id, generation)
        return ErrorCode.NONE           # no member id: older producers commit for a group with members too

    def _store_txn_offsets(self, request, version, wanted, guard):
        now_ms = _now_ms()
        offsets = {(topic, p.partition_index): OffsetAndMetadata(
            p.committed_offset, p.committed_leader_epoch if version >= 2 else -1, p.committed_metadata or "", now_ms,
            -1) for _, topic, p in wanted}
        entries = [(offset_commit_key(request.group_id, *key), offset_commit_value(offset))
                   for key, offset in offsets.items()]
        error, log_offset = self._write(request.group_id, entries, COMMIT_WRITE_ERRORS, guard,
                                        producer_id=request.producer_id, producer_epoch=request.producer_epoch,
                                        base_sequence=0, transactional=True)
        if error:
            return error
        group = self.groups.get(request.group_id)
        if group is None:
            group = self.groups[request.group_id] = Group(request.group_id, now_ms)
        self._add_txn_offsets(group, request.producer_id,
                              {key: offset._replace(log_offset=log_offset) for key, offset in offsets.items()})
        self._schedule(group)           # an empty group's removal waits for the marker now
        return ErrorCode.NONE

    def _add_txn_offsets(self, group, producer_id, offsets):
        group.txn_offsets.setdefault(producer_id, {}).update(offsets)
        self._txn_groups.setdefault(producer_id, set()).add(group.group_id)

    @staticmethod
    def _commit_txn_offset(group, key, offset):
        """A committed transaction's offset replaces the committed one written before it (not a later one)."""
        current = group.offsets.get(key)
        if current is None or current.log_offset < offset.log_offset:
            group.offsets[key] = offset

    def handle_txn_completion(self, producer_id, offsets_partitions, commit):
        """The marker of ``producer_id``'s transaction is in these ``__consumer_offsets`` partitions (their
        numbers): the producer's pending offsets of their groups become committed (``commit``) or are dropped,
        as Kafka's ``handleTxnCompletion``. Never raises."""
        try:
            partitions = set(offsets_partitions)
            with self._lock:
                count = self.logs.partition_count(OFFSETS_TOPIC)
                group_ids = self._txn_groups.get(producer_id, set())
                for group_id in [g for g in group_ids if count and partition_for(g, count) in partitions]:
                    group_ids.discard(group_id)
                    group = self.groups.get(group_id)
                    offsets = group.txn_offsets.pop(producer_id, None) if group is not None else None
                    if offsets is None:
                        continue            # deleted meanwhile
                    if commit:
                        for key, offset in offsets.items():
                            self._commit_txn_offset(group, key, offset)
                    self._schedule(group)
                if not group_ids:
                    self._txn_groups.pop(producer_id, None)
        except Exception:
            log.exception("completing the transaction of producer %d in %s failed", producer_id, OFFSETS_TOPIC)

    def offset_fetch(self, header, request):
        version = header.api_version
        Response = messages.OffsetFetchResponse
        with self._lock:
            stable = version >= 7 and request.require_stable
            if version < 8:
                topics = self._fetch_offsets(request.group_id, request.topics, stable)
                return Response(throttle_time_ms=0, error_code=self._fetch_error(), topics=[
                    Response.OffsetFetchResponseTopic(name=name, partitions=[
                        Response.OffsetFetchResponsePartition(**fields) for fields in partitions])
                    for name, partitions in topics])
            groups = []
            for wanted in request.groups:
                error = self._fetch_error() or self._check_fetch(wanted, version)
                topics = [] if error else self._fetch_offsets(wanted.group_id, wanted.topics, stable)
                groups.append(Response.OffsetFetchResponseGroup(
                    group_id=wanted.group_id, error_code=error,
                    topics=[Response.OffsetFetchResponseTopics(name=name, partitions=[
                        Response.OffsetFetchResponsePartitions(**fields) for fields in partitions])
                        for name, partitions in topics]))
            return Response(throttle_time_ms=0, groups=groups)

    def _check_fetch(self, wanted, version):
        """OffsetFetch v9+ (KIP-848): a consumer group's member fetches at its epoch."""
        consumer_group = self.consumer_groups.groups.get(wanted.group_id)
        if version < 9 or consumer_group is None:
            return ErrorCode.NONE
        return self.consumer_groups.check_fetch(consumer_group, wanted.member_id, wanted.member_epoch)

    def _fetch_error(self):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if self._closed else ErrorCode.NONE

    def _fetch_offsets(self, group_id, topics, require_stable):
        """``[(topic, [partition fields])]``: the asked partitions, or every committed one (topics null).
        A transaction's pending offsets are not seen; with ``require_stable`` (KIP-447) a partition holding
        one is UNSTABLE_OFFSET_COMMIT, which the client retries, as Kafka answers it (per partition, in
        every version)."""
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        unstable = {key for pending in group.txn_offsets.values() for key in pending} \
            if require_stable and group is not None else set()
        if topics is None:
            wanted = {}
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
            wanted = wanted.items()
        else:
            wanted = [(t.name, t.partition_indexes) for t in topics]
        result = []
        for topic, partitions in wanted:
            fields = []
            for partition in partitions:
                if (topic, partition) in unstable:
                    fields.append({"partition_index": partition, "error_code": ErrorCode.UNSTABLE_OFFSET_COMMIT,
                                   "committed_offset": -1, "committed_leader_epoch": -1, "metadata": ""})
                    continue
                found = offsets.get((topic, partition))
                fields.append({"partition_index": partition, "error_code": ErrorCode.NONE,
                               "committed_offset": found.offset if found else -1,
                               "committed_leader_epoch": found.leader_epoch if found else -1,
                               "metadata": found.metadata if found else ""})
            result.append((topic, fields))
        return result

    # --- ListGroups, DescribeGroups -------------------------------------------------------------------

    def list_groups(self, header, request):
        version = header.api_version
        states = {s.lower() for s in request.states_filter} if version >= 4 else set()
        types = {t.lower() for t in request.types_filter} if version >= 5 else set()
        Listed = messages.ListGroupsResponse.ListedGroup
        with self._lock:
            consumer_groups = self.consumer_groups.groups
            listed = [Listed(group_id=g.group_id, protocol_type=g.protocol_type or "", group_state=g.state,
                             group_type="classic")
                      for g in self.groups.values()
                      if g.state != DEAD and g.group_id not in consumer_groups
                      and (not states or g.state.lower() in states) and (not types or "classic" in types)]
            listed += [Listed(group_id=g.group_id, protocol_type=CONSUMER_PROTOCOL, group_state=g.state,
                              group_type="consumer")
                       for g in consumer_groups.values()
                       if (not states or g.state.lower() in states) and (not types or "consumer" in types)]
        return messages.ListGroupsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, groups=listed)

    def describe_groups(self, header, request):
        Described = messages.DescribeGroupsResponse.DescribedGroup
        Member_ = messages.DescribeGroupsResponse.DescribedGroupMember
        described = []
        with self._lock:
            for group_id in request.groups:
                group = self.groups.get(group_id)
                if group is None or group_id in self.consumer_groups.groups:
                    # Kafka 3.9's describeGroups: a consumer group is no classic group, answered as an unknown one
                    described.append(Described(error_code=ErrorCode.NONE, group_id=group_id, group_state=DEAD,
                                               protocol_type="", protocol_data="", members=[]))
                    continue
                stable = group.state == STABLE
                described.append(Described(
                    error_code=ErrorCode.NONE, group_id=group_id, group_state=group.state,
                    protocol_type=group.protocol_type or "", protocol_data=group.protocol or "" if stable else "",
                    members=[Member_(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                     client_id=m.client_id, client_host=m.client_host,
                                     member_metadata=bytes(m.metadata(group.protocol)) if stable else b"",
                                     member_assignment=bytes(m.assignment) if stable else b"")
                             for m in group.members.values()]))
        if request.include_authorized_operations:            # decodes as False before v3 (KIP-430)
            for group in described:
                group.authorized_operations = GROUP_OPERATIONS
        return messages.DescribeGroupsResponse(throttle_time_ms=0, groups=described)

    # --- ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848, kmem.broker.group.consumer) -------------

    def consumer_group_heartbeat(self, header, request, client_host=""):
        with self._lock:
            if self._closed:
                return messages.ConsumerGroupHeartbeatResponse(
                    throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, error_message=None,
                    member_id=None, member_epoch=0, heartbeat_interval_ms=0, assignment=None)
            return self.consumer_groups.heartbeat(header, request, client_host)

    def consumer_group_describe(self, header, request):
        with self._lock:
            return self.consumer_groups.describe(request)

    # --- DeleteGroups, OffsetDelete ------------------------------------------------------------------

    def delete_groups(self, header, request):
        """Kafka's ``deleteGroups``: an empty group's offsets and metadata become tombstones; a group with
        members is NON_EMPTY_GROUP, an unknown one GROUP_ID_NOT_FOUND."""
        Result = messages.DeleteGroupsResponse.DeletableGroupResult
        results = []
        with self._lock:
            for group_id in request.groups_names:
                results.append(Result(group_id=group_id, error_code=self._delete_group(group_id)))
        return messages.DeleteGroupsResponse(throttle_time_ms=0, results=results)

    def _delete_group(self, group_id):
        if self._closed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        consumer_group = self.consumer_groups.groups.get(group_id)
        if consumer_group is not None:
            if consumer_group.members:
                return ErrorCode.NON_EMPTY_GROUP
            if group is None:
                return self.consumer_groups.delete(consumer_group)
        if group is None or group.state == DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.state != EMPTY or group.members:
            return ErrorCode.NON_EMPTY_GROUP
        entries = [(offset_commit_key(group_id, t, p), None) for t, p in group.offsets]
        error = self._append(group_id, entries + self._group_tombstones(group_id))
        if error == ErrorCode.NONE:
            group.set_state(DEAD, _now_ms())
            self._forget(group)
        return error

    def offset_delete(self, header, request):
        """Kafka's ``deleteOffsets`` (KIP-496): the committed offsets of topics the group's members do not
        subscribe to become tombstones, and their offsets pending in open transactions are dropped; a
        subscribed topic's partitions get GROUP_SUBSCRIBED_TO_TOPIC."""
        Response = messages.OffsetDeleteResponse
        response = Response(error_code=ErrorCode.NONE, throttle_time_ms=0, topics=[])
        with self._lock:
            group = self.groups.get(request.group_id)
            if self._closed:
                response.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            elif not request.group_id:
                response.error_code = ErrorCode.INVALID_GROUP_ID
            elif group is None or group.state == DEAD:
                response.error_code = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.members and group.protocol_type != CONSUMER_PROTOCOL:
                response.error_code = ErrorCode.NON_EMPTY_GROUP      # the topics of other protocols are unknown
            if response.error_code:
                return response
            subscribed = self._subscribed_topics(group) | self.consumer_groups.subscribed_topic_names(group.group_id)
            eligible = []
            for topic in request.topics:
                topic_result = Response.OffsetDeleteResponseTopic(name=topic.name, partitions=[])
                response.topics.append(topic_result)
                for p in topic.partitions:
                    error = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if topic.name in subscribed else ErrorCode.NONE
                    topic_result.partitions.append(Response.OffsetDeleteResponsePartition(
                        partition_index=p.partition_index, error_code=error))
                    if not error:
                        eligible.append((topic.name, p.partition_index))
            deleted = [key for key in eligible if key in group.offsets]
            if deleted:
                error = self._append(group.group_id, [(offset_commit_key(group.group_id, t, p), None)
                                                      for t, p in deleted])
                if error:
                    response.error_code, response.topics = error, []
                    return response
                for key in deleted:
                    del group.offsets[key]
            # As Kafka's GroupMetadata.removeOffsets: the offsets of open transactions go too, so that a
            # later COMMIT marker does not bring back what was deleted.
            for pending in group.txn_offsets.values():
                for key in eligible:
                    pending.pop(key, None)
        return response

    @staticmethod
    def _subscribed_topics(group):
        """The topics the members of a consumer group subscribe to (Kafka's ``isSubscribedToTopic``)."""
        topics = set()
        if group.protocol is None:           # no generation yet: Kafka knows no subscription either
            return topics
        for member in group.members.values():
            try:
                topics.update(decode_subscription(member.metadata(group.protocol)))
            except CorruptRecordError:
                log.warning("group %r: member %s has an unreadable subscription", group.group_id, member.member_id)
        return topics

    # --- offset expiry ---------------------------------------------------------------------------------

    def expire_offsets(self, now_ms=None):
        """Kafka's ``cleanupGroupMetadata`` for every group at once (each group's timer does it for that
        group at its deadline). Returns the number of offsets expired."""
        now_ms = _now_ms() if now_ms is None else now_ms
        with self._lock:
            return sum(self._expire_group_offsets(group, now_ms) for group in list(self.groups.values()))

    def _offset_due_ms(self, group, offset):
        if offset.expire_timestamp >= 0:
            return offset.expire_timestamp
        retention_ms = self.config.offsets_retention_minutes * 60_000
        if group.protocol_type is not None:
            return group.state_timestamp + retention_ms
        return offset.commit_timestamp + retention_ms

    def _offsets_expiry_ms(self, group):
        """When the group's first offset expires (wall-clock ms), or None: a group with members keeps its
        offsets. An empty group without offsets goes one ``offsets.retention.check.interval.ms`` after it
        became empty, as Kafka's periodic cleanup finds it within an interval; one holding a transaction's
        pending offsets stays (its marker schedules it again)."""
        if group.state != EMPTY or self._has_consumer_members(group.group_id):
            return None
        if not group.offsets:
            return None if group.txn_offsets else \
                group.state_timestamp + self.config.offsets_retention_check_interval_ms
        return min(self._offset_due_ms(group, offset) for offset in group.offsets.values())

    def _group_tombstones(self, group_id):
        """The tombstones of a deleted group (Kafka's ``createGroupTombstoneRecords``): a consumer group's records,
        else the classic group's metadata."""
        return self.consumer_groups.tombstones(group_id) or [(group_metadata_key(group_id), None)]

    def _has_consumer_members(self, group_id):
        consumer_group = self.consumer_groups.groups.get(group_id)
        return consumer_group is not None and bool(consumer_group.members)

    def _expire_group_offsets(self, group, now_ms):
        """The group's offsets past their retention become tombstones; an empty group left without offsets
        is removed (a group tombstone). Returns the number of offsets expired."""
        due = self._offsets_expiry_ms(group)
        if due is None or now_ms < due:
            return 0
        expired = [key for key, offset in group.offsets.items() if now_ms >= self._offset_due_ms(group, offset)]
        entries = [(offset_commit_key(group.group_id, t, p), None) for t, p in expired]
        dead = len(expired) == len(group.offsets) and not group.members and not group.txn_offsets
        if dead:
            entries += self._group_tombstones(group.group_id)
        if not entries or self._append(group.group_id, entries) != ErrorCode.NONE:
            return 0
        for key in expired:
            del group.offsets[key]
        if dead:
            group.set_state(DEAD, now_ms)
            self._forget(group)
        return len(expired)
