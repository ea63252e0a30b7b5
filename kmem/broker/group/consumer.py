"""KIP-848 consumer groups (the ``consumer`` group protocol) on kmem broker: Kafka 4.0's ``ConsumerGroup``,
``CurrentAssignmentBuilder`` and the consumer part of ``GroupMetadataManager``.

A member heartbeats (ConsumerGroupHeartbeat) with its subscription and the partitions it owns; the coordinator
keeps the group epoch (bumped whenever a member joins, leaves or changes its subscription, or a subscribed topic
changes), computes the target assignment of that epoch with a server-side assignor (``uniform`` or ``range``;
the member chooses with ``ServerAssignor``, else the first of ``group.consumer.assignors``), and moves each member
towards its target one step at a time:

- a member keeping partitions the target gives to another must revoke them first: it stays at its epoch and is
  answered its assignment without them (UNREVOKED_PARTITIONS) until a heartbeat reports it no longer owns them;
- a partition goes to its new owner only once no other member holds it (UNRELEASED_PARTITIONS until then), so a
  partition is never owned by two members at once; the member's epoch moves to the target epoch;
- a member that owns its whole target at the target epoch is STABLE.

The epochs fence: a heartbeat with an epoch the coordinator did not give is FENCED_MEMBER_EPOCH (the previous
epoch is accepted while the member owns a subset of its assignment, its answer may have been lost), an unknown
member UNKNOWN_MEMBER_ID; OffsetCommit v9+ and OffsetFetch v9+ from a member with another epoch are
STALE_MEMBER_EPOCH. Epoch -1 leaves; -2 (a static member, ``group.instance.id``) leaves for now and keeps its
assignment for ``group.consumer.session.timeout.ms``, so the instance rejoining under a new member id takes it
over (before that, the instance id is UNRELEASED_INSTANCE_ID for another member). A member that does not heartbeat
within the session timeout, or does not revoke within its rebalance timeout, is fenced: removed, its partitions
free. Each group has one task on the broker's timer at its earliest such deadline: no thread per member or group.

The group's state is in ``__consumer_offsets`` as Kafka 3.9 writes it (``kmem.broker.group.consumer_records``),
written before a heartbeat is answered: a restart, clean or not, keeps the group epoch, the members, their epochs
and their target and current assignments, and a member heartbeating with its epoch carries on; sessions start
afresh at load. A group that empties stays (its members, fenced, are UNKNOWN_MEMBER_ID, not GROUP_ID_NOT_FOUND) until
its offsets expire, or ``offsets.retention.check.interval.ms`` without offsets; its records then become tombstones.

Classic members in a consumer group, and the conversions between classic and consumer groups (KIP-848's online
migration): ``kmem.broker.group.migration``.
"""
import dataclasses
import functools
import logging
import re
import re._constants as re_constants       # the parsed form of a pattern, to refuse those that backtrack
import re._parser as re_parser
import time
import uuid

from kmem.broker.apis.authorized import GROUP_OPERATIONS
from kmem.broker.codes import ErrorCode
from kmem.broker.group.assignors import ASSIGNORS, AssignmentMember
from kmem.broker.group.consumer_records import (
    CURRENT_ASSIGNMENT, GROUP_EPOCH, MEMBER, PARTITION_METADATA, TARGET_EPOCH, TARGET_MEMBER, ClassicMemberMetadata,
    CurrentAssignment, GroupEpoch, MemberMetadata, PartitionMetadata, SupportedProtocol, TargetEpoch, TargetMember,
    TopicMetadata, consumer_group_key, consumer_group_value, read_consumer_group_value, topic_partitions,
)
from kmem.broker.group.offsets import OFFSETS_TOPIC
from kmem.broker.log.checkpoints import uuid_bytes
from kmem.protocol import messages

log = logging.getLogger(__name__)

LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2
# member states (Kafka's MemberState, in the order of their codes in the records)
STABLE, UNREVOKED, UNRELEASED = "stable", "unrevoked_partitions", "unreleased_partitions"
_MEMBER_STATES = (STABLE, UNREVOKED, UNRELEASED)
# the order of a write's records by key version: tombstones, then the others
_RECORD_ORDER = {False: (CURRENT_ASSIGNMENT, TARGET_MEMBER, TARGET_EPOCH, MEMBER, PARTITION_METADATA, GROUP_EPOCH),
                 True: (MEMBER, PARTITION_METADATA, GROUP_EPOCH, TARGET_MEMBER, TARGET_EPOCH, CURRENT_ASSIGNMENT)}
# group states (Kafka's ConsumerGroupState)
EMPTY, ASSIGNING, RECONCILING, STABLE_GROUP, DEAD = "Empty", "Assigning", "Reconciling", "Stable", "Dead"
REGEX_MAX_CHARS = 1000          # a subscription's regular expression: longer is INVALID_REGULAR_EXPRESSION
REGEX_MAX_REPEATS = 3           # its repeated parts (``*``, ``+``, ``{2,}``...): more is refused


class Refused(Exception):
    """A heartbeat answered with a Kafka error code (and message)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(eq=False)
class ClassicProtocol:
    """What a classic member of a consumer group has beyond a consumer member (Kafka's ``ClassicMemberMetadata``),
    and its deadlines (monotonic seconds)."""
    session_timeout_ms: int
    protocols: list                     # [(name, metadata bytes)], the member's order of preference
    join_deadline: float | None = None  # told to rejoin: it must JoinGroup by then
    sync_deadline: float | None = None  # joined: it must SyncGroup by then

    @property
    def protocol_name(self):
        return self.protocols[0][0]

    def deadlines(self):
        return [d for d in (self.join_deadline, self.sync_deadline) if d is not None]


@dataclasses.dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    topic_names: tuple = ()            # subscribed by name, sorted
    topic_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = 0
    state: str = STABLE
    assigned: dict = dataclasses.field(default_factory=dict)             # topic id -> frozenset of partitions
    pending_revocation: dict = dataclasses.field(default_factory=dict)   # topic id -> frozenset of partitions
    session_deadline: float = 0.0       # monotonic seconds
    revocation_deadline: float | None = None
    classic: object = None              # a classic member's ``ClassicProtocol``; None for the others


class ConsumerGroup:
    def __init__(self, group_id):
        self.group_id = group_id
        self.epoch = 0
        self.assignment_epoch = 0
        self.members = {}               # member id -> ConsumerMember
        self.static_members = {}        # instance id -> member id
        self.target = {}                # member id -> {topic id: frozenset}
        self.owners = {}                # (topic id, partition) -> epoch of the member holding it
        self.topics = {}                # subscribed topics that exist: topic id -> partition count
        self.unresolved_regexes = set()  # regexes new to the group: matched after the heartbeat that brought them
        self.timer_task = None
        self.persisted = {}             # its records in __consumer_offsets: (key version, member id) -> value tuple
        self.dirty = set()              # ids of the members changed since the last write

    @property
    def state(self):
        if not self.members:
            return EMPTY
        if self.epoch > self.assignment_epoch:
            return ASSIGNING
        if any(m.state != STABLE or m.epoch != self.assignment_epoch for m in self.members.values()):
            return RECONCILING
        return STABLE_GROUP

    def regexes(self):
        """The regular expressions the members subscribe to."""
        return {m.topic_regex for m in self.members.values() if m.topic_regex is not None}

    def resolved_regexes(self):
        return self.regexes() - self.unresolved_regexes

    def preferred_assignor(self, default):
        """The server assignor most members name (Kafka's ``computePreferredServerAssignor``), else ``default``."""
        votes = {}
        for member in self.members.values():
            if member.server_assignor is not None:
                votes[member.server_assignor] = votes.get(member.server_assignor, 0) + 1
        return max(sorted(votes), key=votes.get) if votes else default

    def hold(self, member, assigned, pending_revocation):
        """Set what ``member`` holds (its partitions' epochs follow)."""
        for held in (member.assigned, member.pending_revocation):
            for topic, parts in held.items():
                for p in parts:
                    self.owners.pop((topic, p), None)
        member.assigned, member.pending_revocation = assigned, pending_revocation
        self.dirty.add(member.member_id)
        for held in (assigned, pending_revocation):
            for topic, parts in held.items():
                for p in parts:
                    self.owners[(topic, p)] = member.epoch

    def add(self, member):
        self.members[member.member_id] = member
        self.dirty.add(member.member_id)
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id

    def remove(self, member):
        self.hold(member, {}, {})
        del self.members[member.member_id]
        self.target.pop(member.member_id, None)
        self.dirty.add(member.member_id)
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member.member_id:
            del self.static_members[member.instance_id]


def _partitions(topic_partitions):
    """A request's [TopicPartitions] as {topic id: frozenset}; None stays None."""
    if topic_partitions is None:
        return None
    owned = {}
    for tp in topic_partitions:
        owned[tp.topic_id] = owned.get(tp.topic_id, frozenset()) | frozenset(tp.partitions)
    return owned


def _owns_any(owned, partitions):
    """Whether the member, reporting ``owned`` (None: not reported, so it still owns all), holds one of these."""
    if owned is None:
        return True
    return any(owned.get(topic, frozenset()) & parts for topic, parts in partitions.items())


def _is_subset(owned, assigned):
    return owned is not None and all(parts <= assigned.get(topic, frozenset()) for topic, parts in owned.items())


class ConsumerGroups:
    """The consumer groups of a ``GroupCoordinator``, under its lock. ``coordinator`` gives the settings, the
    timer, the topics (``logs``) and the classic groups (a group id is one or the other)."""

    def __init__(self, coordinator):
        self.coordinator = coordinator
        self.config = coordinator.config
        self.groups = {}
        self._loading = {}              # group id -> {(key version, member id): value}, while the log is replayed

    # --- ConsumerGroupHeartbeat -----------------------------------------------------------------------

    def heartbeat(self, header, request, client_host):
        Response = messages.ConsumerGroupHeartbeatResponse
        try:
            self._validate(request, header.api_version)
            if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                response = self._leave(request)
            else:
                response = self._heartbeat(request, header.client_id or "", client_host)
            group = self.groups.get(request.group_id)
            error = ErrorCode.NONE if group is None else self.store(group)
            if error:
                raise Refused(error, f"The coordinator could not write the group's records: {error.name}.")
            return response
        except Refused as e:
            return Response(throttle_time_ms=0, error_code=e.code, error_message=str(e), member_id=None,
                            member_epoch=0, heartbeat_interval_ms=0, assignment=None)

    def _validate(self, request, version):
        """Kafka's ``throwIfConsumerGroupHeartbeatRequestIsInvalid``: INVALID_REQUEST, INVALID_REGULAR_EXPRESSION,
        UNSUPPORTED_ASSIGNOR."""
        def invalid(message):
            raise Refused(ErrorCode.INVALID_REQUEST, message)
        if not request.group_id:
            invalid("GroupId can't be empty.")
        if request.instance_id == "":
            invalid("InstanceId can't be empty.")
        if request.rack_id == "":
            invalid("RackId can't be empty.")
        regex = request.subscribed_topic_regex if version >= 1 else None
        epoch = request.member_epoch
        if version >= 1 or epoch != 0:
            if not request.member_id:
                invalid("MemberId can't be empty.")
        if epoch == 0:
            if request.rebalance_timeout_ms == -1:
                invalid("RebalanceTimeoutMs must be provided in first request.")
            if request.topic_partitions is None or request.topic_partitions:
                invalid("TopicPartitions must be empty when (re-)joining.")
            if request.subscribed_topic_names is None and regex is None:
                invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.")
        elif epoch == STATIC_LEAVE_EPOCH:
            if request.instance_id is None:
                invalid("InstanceId can't be null.")
        elif epoch < LEAVE_EPOCH:
            invalid("MemberEpoch is invalid.")
        if regex:
            _compile(regex)
        if request.server_assignor is not None and request.server_assignor not in self.config.consumer_assignors:
            raise Refused(ErrorCode.UNSUPPORTED_ASSIGNOR,
                          f"ServerAssignor {request.server_assignor} is not supported. Supported assignors: "
                          f"{', '.join(self.config.consumer_assignors)}.")

    def _group(self, group_id, create):
        """The consumer group (a new one if ``create``); an unknown one is GROUP_ID_NOT_FOUND."""
        group = self.groups.get(group_id)
        if group is not None:
            return group
        classic = self.coordinator.groups.get(group_id)
        if classic is not None and (classic.members or classic.protocol_type is not None) and not create:
            raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
        if not create:
            raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
        # a classic group becomes a consumer group (its offsets kept) when it is empty, or as the migration policy
        # allows; it is registered with its first member, so a refused join leaves nothing behind
        return ConsumerGroup(group_id) if classic is None else self.coordinator.migration.upgraded(classic)

    def _heartbeat(self, request, client_id, client_host):
        now = time.monotonic()
        epoch = request.member_epoch
        group = self._group(request.group_id, create=epoch == 0)
        member_id = request.member_id
        if len(group.members) >= self.config.consumer_max_size and (not member_id or member_id not in group.members):
            raise Refused(ErrorCode.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum capacity of "
                          f"{self.config.consumer_max_size} members.")
        member_id = member_id or str(uuid.uuid4())
        owned = _partitions(request.topic_partitions)
        member = self._member(group, member_id, epoch, request.instance_id, owned)
        before = (member.topic_names, member.topic_regex, member.server_assignor, member.assigned)
        client_before = (member.rack_id, member.rebalance_timeout_ms, member.client_id, member.client_host)
        new = member.member_id not in group.members
        if request.rack_id is not None:
            member.rack_id = request.rack_id
        if request.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if request.server_assignor is not None:
            member.server_assignor = request.server_assignor
        if request.subscribed_topic_names is not None:
            member.topic_names = tuple(sorted(set(request.subscribed_topic_names)))
        if getattr(request, "subscribed_topic_regex", None) is not None:
            regex = request.subscribed_topic_regex or None      # "" drops it (librdkafka sends it)
            if regex is not None and regex not in group.regexes():
                group.unresolved_regexes.add(regex)
            member.topic_regex = regex
        member.client_id, member.client_host = client_id, client_host
        if client_before != (member.rack_id, member.rebalance_timeout_ms, member.client_id, member.client_host) \
                or member.classic is not None:
            group.dirty.add(member.member_id)           # its record changes (a new member's is added below)
        member.classic = None                   # a static member's instance may come back on the consumer protocol
        if self.groups.get(group.group_id) is not group:
            self.coordinator.migration.complete_upgrade(group)      # a new group, or a classic one converted
        if new:
            group.add(member)
            log.info("group %r: member %s joins (consumer protocol)", group.group_id, member.member_id)
        changed = new or before[:3] != (member.topic_names, member.topic_regex, member.server_assignor)
        if changed:
            group.dirty.add(member.member_id)
        self._refresh(group, bump=changed)
        self._reconcile(group, member, owned, now)
        member.session_deadline = now + self.config.consumer_session_timeout_ms / 1000
        self.coordinator.schedule_consumer_group(group, member)
        Response = messages.ConsumerGroupHeartbeatResponse
        response = Response(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                            member_id=member.member_id, member_epoch=member.epoch,
                            heartbeat_interval_ms=self.config.consumer_heartbeat_interval_ms, assignment=None)
        subscribes = request.subscribed_topic_names is not None or getattr(request, "subscribed_topic_regex", None)
        full = epoch == 0 or (request.rebalance_timeout_ms != -1 and subscribes is not None and owned is not None)
        if full or member.assigned != before[3]:
            response.assignment = Response.Assignment(topic_partitions=[
                Response.TopicPartitions(topic_id=topic, partitions=sorted(parts))
                for topic, parts in sorted(member.assigned.items(), key=lambda item: str(item[0]))])
        self._resolve_regexes(group)
        return response

    def _member(self, group, member_id, epoch, instance_id, owned):
        """The member the heartbeat is from (a new one joining with epoch 0), its epoch checked."""
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                if epoch != 0:
                    raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group "
                                                               f"{group.group_id}.")
                return ConsumerMember(member_id)
            if epoch == 0:
                return self._rejoined(group, member, member_id)
            _check_epoch(member, epoch, owned)
            return member
        known_id = group.static_members.get(instance_id)
        known = group.members.get(known_id) if known_id is not None else None
        if epoch == 0:
            if known is None:
                return ConsumerMember(member_id, instance_id=instance_id)
            if known.epoch != STATIC_LEAVE_EPOCH and known.member_id != member_id:
                raise Refused(ErrorCode.UNRELEASED_INSTANCE_ID, f"Static member {known.member_id} with instance id "
                              f"{instance_id} is not yet released.")
            return self._rejoined(group, known, member_id)
        if known is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        if known.member_id != member_id:
            raise Refused(ErrorCode.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id {instance_id} "
                                                        f"was fenced by member {known.member_id}.")
        _check_epoch(known, epoch, owned)
        return known

    @staticmethod
    def _rejoined(group, old, member_id):
        """A member rejoining with epoch 0 (a static one under a new member id): it starts again from epoch 0 with
        the partitions it held, and its target carries over."""
        member = dataclasses.replace(old, member_id=member_id, epoch=0, previous_epoch=0, pending_revocation={},
                                     state=STABLE, revocation_deadline=None)
        target = group.target.get(old.member_id)
        group.remove(old)
        if target is not None:
            group.target[member_id] = target
        member.assigned = {}
        group.add(member)
        group.hold(member, old.assigned, {})
        return member

    def _refresh(self, group, bump):
        """Bump the group epoch if a subscription changed (``bump``) or a subscribed topic did (created, deleted,
        more partitions), then compute the target assignment of a new epoch."""
        topics = self._subscribed_topics(group)
        if bump or topics != group.topics:
            group.topics = topics
            group.epoch += 1
            log.info("group %r: epoch %d", group.group_id, group.epoch)
        if group.epoch > group.assignment_epoch:
            self._assign(group)

    def _resolve_regexes(self, group):
        """Kafka resolves a regular expression new to the group asynchronously, after the heartbeat that brought
        it (KIP-848; ``GroupMetadataManager.maybeUpdateRegularExpressions``): that heartbeat is answered with the
        topics subscribed by name, and the matched ones come at a new group epoch, with the next heartbeats. One
        no member subscribes to any more is forgotten, and new again when subscribed again."""
        if group.unresolved_regexes:
            group.unresolved_regexes.clear()
            group.topics = self._subscribed_topics(group)
            group.epoch += 1
            log.info("group %r: epoch %d (regular expressions resolved)", group.group_id, group.epoch)

    def subscribed_topic_names(self, group_id):
        """The names of the topics the members of the consumer group ``group_id`` subscribe to (Kafka's
        ``isSubscribedToTopic``), by name or regex, that exist; empty for no such group."""
        group = self.groups.get(group_id)
        if group is None:
            return set()
        infos = self.coordinator.logs.topics()
        names = {_topic_uuid(info.topic_id): name for name, info in infos.items()}
        return {names[topic] for topic in self._subscribed_topics(group) if topic in names}

    def _subscribed_topics(self, group):
        """{topic id: partition count} of the topics some member subscribes to (by name or regex) that exist."""
        infos = self.coordinator.logs.topics()
        names = set()
        for member in group.members.values():
            names.update(member.topic_names)
        for regex in group.resolved_regexes():
            pattern = _compile(regex)
            names.update(name for name in infos if not name.startswith("__") and pattern.fullmatch(name))
        return {_topic_uuid(infos[name].topic_id): infos[name].partitions for name in names if name in infos}

    @staticmethod
    def _member_topics(member, infos, unresolved):
        names = set(member.topic_names)
        if member.topic_regex is not None and member.topic_regex not in unresolved:
            pattern = _compile(member.topic_regex)
            names.update(name for name in infos if not name.startswith("__") and pattern.fullmatch(name))
        return frozenset(_topic_uuid(infos[name].topic_id) for name in names if name in infos)

    def _assign(self, group):
        infos = self.coordinator.logs.topics()
        name = group.preferred_assignor(self.config.consumer_assignors[0])
        members = {m.member_id: AssignmentMember(self._member_topics(m, infos, group.unresolved_regexes),
                                                 group.target.get(m.member_id, {}))
                   for m in group.members.values()}
        group.target = ASSIGNORS[name](members, group.topics)
        group.assignment_epoch = group.epoch
        group.dirty.update(group.members)

    def _reconcile(self, group, member, owned, now):
        """Kafka's ``CurrentAssignmentBuilder``: one step of ``member`` towards its target."""
        target_epoch = group.assignment_epoch
        if member.state == STABLE:
            if member.epoch == target_epoch:
                return
            self._next_assignment(group, member, member.epoch, owned, now)
        elif member.state == UNREVOKED:
            if _owns_any(owned, member.pending_revocation):
                return
            self._next_assignment(group, member, member.epoch + 1, owned, now)
        else:
            self._next_assignment(group, member, member.epoch, owned, now)

    def _next_assignment(self, group, member, epoch, owned, now):
        target = group.target.get(member.member_id, {})
        kept, assigned, revoking, unreleased = {}, {}, {}, False
        for topic in set(target) | set(member.assigned):
            wanted = target.get(topic, frozenset())
            current = member.assigned.get(topic, frozenset())
            keep = current & wanted
            if keep:
                kept[topic] = keep
            if current - keep:
                revoking[topic] = current - keep
            coming = wanted - keep
            free = frozenset(p for p in coming if (topic, p) not in group.owners)
            unreleased = unreleased or free != coming
            if keep | free:
                assigned[topic] = keep | free
        if revoking and _owns_any(owned, revoking):
            # the member revokes first, at its epoch; what it keeps is its assignment meanwhile
            self._move(member, epoch)
            if member.state != UNREVOKED:
                member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
            member.state = UNREVOKED
            group.hold(member, kept, revoking)
            return
        self._move(member, group.assignment_epoch)
        member.state = UNRELEASED if unreleased else STABLE
        member.revocation_deadline = None
        group.hold(member, assigned, {})

    @staticmethod
    def _move(member, epoch):
        if epoch != member.epoch:
            member.previous_epoch, member.epoch = member.epoch, epoch

    def _leave(self, request):
        group = self._group(request.group_id, create=False)
        Response = messages.ConsumerGroupHeartbeatResponse
        response = Response(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                            member_id=request.member_id, member_epoch=request.member_epoch,
                            heartbeat_interval_ms=0, assignment=None)
        if request.instance_id is None:
            member = group.members.get(request.member_id)
            if member is None:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {request.member_id} is not a member of group "
                                                           f"{group.group_id}.")
        else:
            known_id = group.static_members.get(request.instance_id)
            if known_id is None:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {request.instance_id} is unknown.")
            if known_id != request.member_id:
                raise Refused(ErrorCode.FENCED_INSTANCE_ID, f"Static member {request.member_id} with instance id "
                                                            f"{request.instance_id} was fenced by member {known_id}.")
            member = group.members[known_id]
            if request.member_epoch == STATIC_LEAVE_EPOCH:
                # it comes back within its session timeout under a new member id, and takes its partitions over
                log.info("group %r: static member %s leaves for now", group.group_id, member.member_id)
                member.epoch, member.state, member.revocation_deadline = STATIC_LEAVE_EPOCH, STABLE, None
                group.hold(member, member.assigned, {})
                self.coordinator.schedule_consumer_group(group)
                return response
        log.info("group %r: member %s leaves", group.group_id, member.member_id)
        self.fence(group, member)
        return response

    def fence(self, group, member):
        """Remove ``member``: its partitions are free, the group moves to a new epoch (or, when it was the last
        member of the consumer protocol, becomes a classic group if the migration policy allows it)."""
        if self.coordinator.migration.downgrade(group, member):
            return
        group.remove(member)
        group.unresolved_regexes &= group.regexes()
        group.topics = self._subscribed_topics(group)
        group.epoch += 1
        self.coordinator.schedule_consumer_group(group)

    # --- deadlines ------------------------------------------------------------------------------------

    @staticmethod
    def next_deadline_of(member):
        deadlines = [member.session_deadline]
        if member.revocation_deadline is not None:
            deadlines.append(member.revocation_deadline)
        if member.classic is not None:
            deadlines += member.classic.deadlines()
        return min(deadlines)

    def next_deadline(self, group):
        return min(map(self.next_deadline_of, group.members.values()), default=None)

    def expire(self, group, now):
        """Fence the members whose session or revocation (a classic member's JoinGroup or SyncGroup) timed out by
        ``now`` (if their removal cannot be written, they stay, with a new session)."""
        for member in list(group.members.values()):
            if self.groups.get(group.group_id) is not group:
                break                   # it became a classic group: its records are written as tombstones
            if now >= member.session_deadline:
                log.info("group %r: member %s expired (session timeout)", group.group_id, member.member_id)
                self.fence(group, member)
            elif member.revocation_deadline is not None and now >= member.revocation_deadline:
                log.info("group %r: member %s did not revoke in its rebalance timeout", group.group_id,
                         member.member_id)
                self.fence(group, member)
            elif member.classic is not None and any(now >= d for d in member.classic.deadlines()):
                log.info("group %r: classic member %s did not rejoin or sync in its rebalance timeout",
                         group.group_id, member.member_id)
                self.fence(group, member)
        self.store(group)

    # --- __consumer_offsets ---------------------------------------------------------------------------
    # The group's state is kept in Kafka 3.9's records (kmem.broker.group.consumer_records), written before a
    # heartbeat is answered or a member is fenced: what changed since the last write, in the order Kafka's
    # GroupMetadataManager writes them, tombstones for a member that left and for every record of a deleted group.

    def store(self, group):
        """Write what changed in ``group`` (every record as a tombstone if it is no longer kept). A failed write
        restores the group as its records have it; returns the Kafka error code to answer (NONE once written)."""
        alive = self.groups.get(group.group_id) is group
        changes = self._changes(group, alive)
        group.dirty.clear()
        if not changes:
            return ErrorCode.NONE
        error = self.coordinator._append(group.group_id, [
            (consumer_group_key(version, group.group_id, member_id),
             None if value is None else consumer_group_value(value)) for (version, member_id), value in changes])
        if error:
            self._restore(group)
            return error
        for key, value in changes:
            if value is None:
                group.persisted.pop(key, None)
            else:
                group.persisted[key] = value
        return ErrorCode.NONE

    def delete(self, group):
        """Forget the group (emptied, or downgraded to a classic group), writing tombstones for its records; the
        error code of the write."""
        self.coordinator._forget_consumer_group(group)
        return self.store(group)

    def tombstones(self, group_id):
        """``[(key, None)]`` for every record of the group ``group_id`` (none for no such group), in Kafka's order
        (``ConsumerGroup.createGroupTombstoneRecords``), for the caller to write with others."""
        group = self.groups.get(group_id)
        return [] if group is None else [(consumer_group_key(version, group_id, member_id), None)
                                         for (version, member_id), _ in self._changes(group, alive=False)]

    def _changes(self, group, alive):
        """``[((key version, member id), value or None)]``: the records that differ from those written, in order."""
        current = self._records(group) if alive else {}
        keys = set(current) | {key for key in group.persisted if not alive or key[1] in group.dirty}
        changes = [(key, current.get(key)) for key in keys if current.get(key) != group.persisted.get(key)]
        # tombstones first (a member's current assignment, target, then the member, then the group's), then
        # the records of a heartbeat: the member, the subscribed topics, the epoch, the target, its epoch, the
        # member's current assignment (so Kafka's replay finds what each record refers to)
        return sorted(changes, key=lambda change: (change[1] is not None, _RECORD_ORDER[change[1] is not None]
                                                   .index(change[0][0]), change[0][1] or ""))

    def _records(self, group):
        """The values of the group's records and of its changed members' (the subscribed topics' only if they
        changed, as Kafka writes them)."""
        records = {(GROUP_EPOCH, None): GroupEpoch(group.epoch),
                   (TARGET_EPOCH, None): TargetEpoch(group.assignment_epoch)}
        written = group.persisted.get((PARTITION_METADATA, None))
        if group.topics != ({} if written is None else {t.topic_id: t.num_partitions for t in written.topics}):
            names = {_topic_uuid(info.topic_id): name for name, info in self.coordinator.logs.topics().items()}
            records[(PARTITION_METADATA, None)] = PartitionMetadata([
                TopicMetadata(topic, names.get(topic, ""), count, [])       # no broker rack: no partition racks
                for topic, count in sorted(group.topics.items(), key=lambda item: names.get(item[0], ""))])
        for member_id in group.dirty:
            member = group.members.get(member_id)
            if member is None:
                continue
            classic = None if member.classic is None else ClassicMemberMetadata(
                member.classic.session_timeout_ms, [SupportedProtocol(*p) for p in member.classic.protocols])
            records[(MEMBER, member_id)] = MemberMetadata(
                member.instance_id, member.rack_id, member.client_id, member.client_host, list(member.topic_names),
                member.topic_regex, member.rebalance_timeout_ms, member.server_assignor, classic)
            if member_id in group.target:
                records[(TARGET_MEMBER, member_id)] = TargetMember(topic_partitions(group.target[member_id]))
            records[(CURRENT_ASSIGNMENT, member_id)] = CurrentAssignment(
                member.epoch, member.previous_epoch, _MEMBER_STATES.index(member.state),
                topic_partitions(member.assigned), topic_partitions(member.pending_revocation))
        return records

    def _restore(self, group):
        """After a failed write: the group as its written records have it (gone if it has none)."""
        if group.timer_task is not None:
            group.timer_task.cancel()
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        if group.persisted:
            self._register(self._rebuild(group.group_id, group.persisted))

    def replay(self, version, group_id, member_id, value):
        """A record read from the log at load (the last of each key wins); ``CorruptRecordError`` for a value that
        does not decode. ``loaded()`` builds the groups once every record is read."""
        records = self._loading.setdefault(group_id, {})
        if value is None:
            records.pop((version, member_id), None)
        else:
            records[(version, member_id)] = read_consumer_group_value(version, value)

    def loaded(self):
        """The groups of the records replayed, their members' sessions starting now (as Kafka does at load)."""
        loading, self._loading = self._loading, {}
        for group_id, records in loading.items():
            if records:
                self._register(self._rebuild(group_id, records))
        if self.groups:
            log.info("loaded %d consumer groups from %s", len(self.groups), OFFSETS_TOPIC)

    def _register(self, group):
        self.groups[group.group_id] = group
        self.coordinator.schedule_consumer_group(group)

    def _rebuild(self, group_id, values):
        """The group that its records' ``values`` ({(key version, member id): value}) describe."""
        group = ConsumerGroup(group_id)
        group.persisted = dict(values)
        group.epoch = values[(GROUP_EPOCH, None)].epoch if (GROUP_EPOCH, None) in values else 0
        group.assignment_epoch = values[(TARGET_EPOCH, None)].assignment_epoch if (TARGET_EPOCH, None) in values \
            else 0
        if (PARTITION_METADATA, None) in values:
            group.topics = {t.topic_id: t.num_partitions for t in values[(PARTITION_METADATA, None)].topics}
        now = time.monotonic()
        for (version, member_id), value in values.items():
            if version == TARGET_MEMBER:
                group.target[member_id] = {tp.topic_id: frozenset(tp.partitions) for tp in value.topic_partitions}
            elif version == MEMBER:
                classic = value.classic_member_metadata
                if classic is not None and classic.supported_protocols:     # else a consumer-protocol member
                    classic = ClassicProtocol(classic.session_timeout_ms,
                                              [(p.name, bytes(p.metadata)) for p in classic.supported_protocols])
                else:
                    classic = None
                session_ms = self.config.consumer_session_timeout_ms if classic is None else classic.session_timeout_ms
                group.add(ConsumerMember(
                    member_id, value.instance_id, value.rack_id, value.client_id, value.client_host,
                    value.rebalance_timeout_ms, tuple(sorted(value.subscribed_topic_names)),
                    value.subscribed_topic_regex, value.server_assignor, session_deadline=now + session_ms / 1000,
                    classic=classic))
        for member_id, member in group.members.items():
            current = values.get((CURRENT_ASSIGNMENT, member_id))
            if current is None:
                continue
            member.epoch, member.previous_epoch = current.member_epoch, current.previous_member_epoch
            member.state = _MEMBER_STATES[current.state] if 0 <= current.state < len(_MEMBER_STATES) else STABLE
            if member.state == UNREVOKED:
                member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
            group.hold(member, *({tp.topic_id: frozenset(tp.partitions) for tp in held}
                                 for held in (current.assigned_partitions, current.partitions_pending_revocation)))
        group.dirty.clear()
        return group

    # --- OffsetCommit, OffsetFetch --------------------------------------------------------------------

    def check_commit(self, group, member_id, epoch, version, transactional=False):
        """Kafka's ``ConsumerGroup.validateOffsetCommit``."""
        if epoch < 0 and not group.members:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if version < 9 and member.classic is None and not transactional:
            return ErrorCode.UNSUPPORTED_VERSION
        return _check_member_epoch(member, epoch)

    @staticmethod
    def check_fetch(group, member_id, epoch):
        """Kafka's ``ConsumerGroup.validateOffsetFetch``."""
        if member_id is None and epoch < 0:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return _check_member_epoch(member, epoch)

    # --- ConsumerGroupDescribe ------------------------------------------------------------------------

    def describe(self, request):
        Response = messages.ConsumerGroupDescribeResponse
        infos = self.coordinator.logs.topics()
        names = {_topic_uuid(info.topic_id): name for name, info in infos.items()}

        def assignment(partitions):
            return Response.Assignment(topic_partitions=[
                Response.TopicPartitions(topic_id=topic, topic_name=names.get(topic, ""), partitions=sorted(parts))
                for topic, parts in sorted(partitions.items(), key=lambda item: str(item[0]))])

        described = []
        for group_id in request.group_ids:
            group = self.groups.get(group_id)
            result = Response.DescribedGroup(error_code=ErrorCode.NONE, error_message=None, group_id=group_id,
                                             group_state="", group_epoch=0, assignment_epoch=0, assignor_name="",
                                             members=[])
            described.append(result)
            if not group_id:
                result.error_code, result.error_message = ErrorCode.INVALID_GROUP_ID, "GroupId can't be empty."
            elif group is None:
                result.error_code = ErrorCode.GROUP_ID_NOT_FOUND
                result.error_message = f"Group {group_id} is not a consumer group." \
                    if group_id in self.coordinator.groups else f"Group {group_id} not found."
            else:
                result.group_state, result.group_epoch = group.state, group.epoch
                result.assignment_epoch = group.assignment_epoch
                result.assignor_name = group.preferred_assignor(self.config.consumer_assignors[0])
                result.members = [Response.Member(
                    member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.epoch,
                    client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=list(m.topic_names),
                    subscribed_topic_regex=m.topic_regex, assignment=assignment(m.assigned),
                    target_assignment=assignment(group.target.get(m.member_id, {})))
                    for m in group.members.values()]
                if request.include_authorized_operations:
                    result.authorized_operations = GROUP_OPERATIONS
        return Response(throttle_time_ms=0, groups=described)


def _check_member_epoch(member, epoch):
    """Kafka's ``ConsumerGroup.validateMemberEpoch``: a classic member's generation is its epoch."""
    if epoch == member.epoch:
        return ErrorCode.NONE
    return ErrorCode.ILLEGAL_GENERATION if member.classic is not None else ErrorCode.STALE_MEMBER_EPOCH


def _check_epoch(member, epoch, owned):
    """Kafka's ``throwIfConsumerGroupMemberEpochIsInvalid``: FENCED_MEMBER_EPOCH for an epoch ahead of the member's,
    or behind it unless it is the previous one and the member owns part of its assignment only."""
    if epoch > member.epoch:
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH, f"The consumer group member has a greater member epoch ({epoch}) "
                      f"than the one known by the group coordinator ({member.epoch}). The member must abandon all "
                      "its partitions and rejoin.")
    if epoch < member.epoch and (epoch != member.previous_epoch or not _is_subset(owned, member.assigned)):
        raise Refused(ErrorCode.FENCED_MEMBER_EPOCH, f"The consumer group member has a smaller member epoch ({epoch}) "
                      f"than the one known by the group coordinator ({member.epoch}). The member must abandon all "
                      "its partitions and rejoin.")


@functools.lru_cache(maxsize=256)
def _compile(regex):
    """The compiled subscription regex, or INVALID_REGULAR_EXPRESSION. Kafka matches with RE2/J, in linear time;
    Python's ``re`` backtracks, so what could make it run for ever on a topic name is refused: backreferences and
    lookarounds (RE2 has none either), a quantifier over a quantifier or an alternation, more than
    ``REGEX_MAX_REPEATS`` repeated parts."""
    if len(regex) > REGEX_MAX_CHARS:
        raise Refused(ErrorCode.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex is longer than {REGEX_MAX_CHARS}.")
    try:
        compiled = re.compile(regex)
        reason = _backtracking(re_parser.parse(regex).data, repeated=False, repeats=[0])
    except (re.error, RecursionError, OverflowError) as e:
        raise Refused(ErrorCode.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex {regex!r} is invalid: {e}") from None
    if reason:
        raise Refused(ErrorCode.INVALID_REGULAR_EXPRESSION, f"SubscribedTopicRegex {regex!r} is refused: {reason}.")
    return compiled


def _backtracking(items, repeated, repeats):
    """Why matching the parsed ``items`` may backtrack without bound, or None."""
    for op, value in items:
        if op in (re_constants.GROUPREF, re_constants.GROUPREF_EXISTS, re_constants.ASSERT,
                  re_constants.ASSERT_NOT):
            return "backreferences and lookarounds are not supported (RE2)"
        if op in (re_constants.MAX_REPEAT, re_constants.MIN_REPEAT, re_constants.POSSESSIVE_REPEAT):
            _, high, body = value
            if high > 1:
                if repeated:
                    return "a quantifier over a quantifier"
                repeats[0] += 1
                if repeats[0] > REGEX_MAX_REPEATS:
                    return f"more than {REGEX_MAX_REPEATS} repeated parts"
            reason = _backtracking(body, repeated or high > 1, repeats)
        elif op == re_constants.BRANCH:
            if repeated:
                return "a quantifier over an alternation"
            reason = next(filter(None, (_backtracking(branch, repeated, repeats) for branch in value[1])), None)
        elif op in (re_constants.SUBPATTERN, re_constants.ATOMIC_GROUP):
            reason = _backtracking(value[-1], repeated, repeats)
        else:
            reason = None
        if reason:
            return reason
    return None


def _topic_uuid(topic_id):
    return uuid.UUID(bytes=uuid_bytes(topic_id))
