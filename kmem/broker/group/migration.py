"""KIP-848's online migration between the classic and the consumer group protocols, as Kafka 3.9's
``GroupMetadataManager`` does it (``group.consumer.migration.policy``: ``disabled``, ``upgrade``, ``downgrade`` or
``bidirectional``; Kafka 4.0's default, ``bidirectional``, is kmem's, as for ``group.coordinator.rebalance.protocols``).

- Upgrade (Kafka's ``convertToConsumerGroup``): a ConsumerGroupHeartbeat joining a classic group of the
  ``consumer`` protocol type turns it into a consumer group. Its classic members stay, as classic members of the
  consumer group, at the generation's epoch, owning their last assignment (or the partitions their subscription
  said they own when they joined, if a rebalance under way voided it), which is their target too; a partition two
  of them were given goes to the first. The joining member moves the group to a new epoch, whose target
  assignment the classic members are told to rejoin for (also those of a classic group that was rebalancing:
  their waiting JoinGroup or SyncGroup is answered REBALANCE_IN_PROGRESS). The classic group's record becomes a
  tombstone; its offsets stay. An empty classic group becomes a consumer group whatever the policy.
- Classic members of a consumer group keep using JoinGroup, SyncGroup, Heartbeat and LeaveGroup (Kafka's
  ``classicGroupJoinToConsumerGroup``, ``classicGroupSyncToConsumerGroup``...): the group's target assignment
  drives them. A JoinGroup reconciles the member (``CurrentAssignmentBuilder``) with the partitions its
  subscription says it owns and answers at once, its generation the member epoch and no leader; SyncGroup hands
  it its assignment. A Heartbeat is REBALANCE_IN_PROGRESS when the member should rejoin: the group moved to a
  new epoch, the member must revoke partitions, or partitions it waited for are free. A member told to rejoin
  must JoinGroup within its rebalance timeout, a joined one SyncGroup within it, and each heartbeat within its
  ``session.timeout.ms``: else it is fenced. Errors as Kafka's: UNKNOWN_MEMBER_ID (also for a consumer-protocol
  member), ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL, FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED.
- Downgrade (``convertToClassicGroup``): when the last consumer-protocol member leaves or is fenced and classic
  members remain (no more than ``group.max.size``), the group becomes a classic group at the group epoch, each
  member's assignment its target, and a rebalance starts that the members join as in any classic group.

With the policy against it, the heartbeat joining a non-empty classic group is GROUP_ID_NOT_FOUND (as Kafka), and,
as Kafka's later fix KAFKA-20640, under ``disabled`` a classic member new to a consumer group is
INCONSISTENT_GROUP_PROTOCOL.
"""
import logging
import struct
import time
import uuid

from kmem.broker.codes import ErrorCode
from kmem.broker.group.consumer import (
    UNRELEASED, UNREVOKED, ClassicProtocol, ConsumerGroup, ConsumerMember, Refused, _topic_uuid,
)
from kmem.consumer.fetcher import TopicPartition
from kmem.consumer.group import _Reader, decode_assignment, encode_assignment, read_subscription
from kmem.errors import ConfigError, CorruptRecordError
from kmem.protocol import messages

log = logging.getLogger(__name__)

POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")
PROTOCOL_TYPE = "consumer"          # the classic protocol type of consumers (Kafka's ConsumerProtocol.PROTOCOL_TYPE)
_VERSION, _GENERATION = struct.Struct(">h"), struct.Struct(">i")


def migration_policy(name, value):
    """``group.consumer.migration.policy``, case-insensitive as Kafka's."""
    policy = str(value).strip().lower()
    if policy not in POLICIES:
        raise ConfigError(f"{name}: {value!r} must be one of {', '.join(POLICIES)}")
    return policy


class Migration:
    """The migration of a ``GroupCoordinator``'s groups (under its lock)."""

    def __init__(self, coordinator):
        self.coordinator = coordinator

    @property
    def policy(self):
        return self.coordinator.config.consumer_migration_policy

    # --- upgrade ----------------------------------------------------------------------------------------

    def upgraded(self, classic):
        """The consumer group a ConsumerGroupHeartbeat joining the classic group ``classic`` makes of it (Kafka's
        ``validateOnlineUpgrade`` and ``ConsumerGroup.fromClassicGroup``), not registered yet: ``complete_upgrade``
        does that once the heartbeat's member is accepted. Refused GROUP_ID_NOT_FOUND when the policy or the group
        forbid it."""
        group_id = classic.group_id
        group = ConsumerGroup(group_id)
        if not classic.members:
            return group
        reason = None
        if self.policy not in ("upgrade", "bidirectional"):
            reason = "the online upgrade is disabled"
        elif classic.protocol_type != PROTOCOL_TYPE:
            reason = "the group does not use the consumer embedded protocol"
        elif len(classic.members) > self.coordinator.config.consumer_max_size:
            reason = "the group size exceeds the consumer group maximum size"
        if reason:
            log.info("group %r: cannot upgrade the classic group to a consumer group: %s", group_id, reason)
            raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
        ids = self._topic_ids()
        now = time.monotonic()
        group.epoch = group.assignment_epoch = classic.generation
        for classic_member in classic.members.values():
            metadata = classic_member.metadata(classic.protocol) if classic.protocol else \
                classic_member.protocols[0][1]
            try:
                subscription = read_subscription(metadata)
                rack_id = _rack_id(metadata)
                last = decode_assignment(classic_member.assignment)
            except CorruptRecordError:
                raise Refused(ErrorCode.GROUP_ID_NOT_FOUND, f"Cannot upgrade the classic group {group_id} to a "
                              "consumer group because the embedded consumer protocol is malformed.") from None
            # its assignment, or if a rebalance under way voided it, the partitions it said it owns when it joined
            held = _by_topic_id(last or subscription.owned, ids)
            held = {topic: frozenset(p for p in parts if (topic, p) not in group.owners)
                    for topic, parts in held.items()}
            held = {topic: parts for topic, parts in held.items() if parts}
            member = ConsumerMember(
                classic_member.member_id, instance_id=classic_member.group_instance_id, rack_id=rack_id,
                client_id=classic_member.client_id, client_host=classic_member.client_host,
                rebalance_timeout_ms=classic_member.rebalance_timeout_ms,
                topic_names=tuple(sorted(set(subscription.topics))), epoch=classic.generation,
                previous_epoch=classic.generation,
                session_deadline=now + classic_member.session_timeout_ms / 1000,
                classic=ClassicProtocol(classic_member.session_timeout_ms, list(classic_member.protocols)))
            group.add(member)
            group.hold(member, held, {})
            group.target[member.member_id] = held
        group.topics = self.coordinator.consumer_groups._subscribed_topics(group)
        return group

    def complete_upgrade(self, group):
        """Register ``group``, made by ``upgraded``, in place of its classic group: the classic group's record is a
        tombstone (its offsets stay) and the requests its members wait in are answered REBALANCE_IN_PROGRESS.
        Refused (with the write's error) if the tombstone cannot be written: the classic group stays."""
        from kmem.broker.group import coordinator as classic_coordinator    # it imports this module
        coordinator = self.coordinator
        classic = coordinator.groups.get(group.group_id)
        if classic is not None and (classic.members or classic.protocol_type is not None):
            error = coordinator._append(group.group_id, [(classic_coordinator.group_metadata_key(group.group_id),
                                                          None)])
            if error:
                raise Refused(error, f"The classic group {group.group_id} could not be converted.")
            log.info("group %r: classic group of generation %d with %d members is now a consumer group (%s)",
                     group.group_id, classic.generation, len(classic.members), self.policy)
            for member in classic.members.values():
                for reply in (member.join_reply, member.sync_reply):
                    if reply is not None:
                        reply.set(ErrorCode.REBALANCE_IN_PROGRESS)
            classic.members.clear()
            classic.static_members.clear()
            classic.pending.clear()
            classic.protocol_type = classic.protocol = classic.leader = None
            classic.generation = 0
            classic.set_state(classic_coordinator.EMPTY, classic_coordinator._now_ms())
        coordinator.consumer_groups.groups[group.group_id] = group
        if classic is not None:
            coordinator._schedule(classic)          # its offsets' expiry waits while the group has members
        if group.members:
            coordinator.schedule_consumer_group(group)

    # --- downgrade --------------------------------------------------------------------------------------

    def downgrade(self, group, leaving):
        """Kafka's ``validateOnlineDowngrade`` and ``convertToClassicGroup``: when ``leaving`` is the last
        consumer-protocol member and classic members stay, the group becomes a classic group that rebalances.
        Returns whether it did (otherwise ``leaving`` is fenced as usual)."""
        from kmem.broker.group import coordinator as classic_coordinator    # it imports this module
        coordinator = self.coordinator
        staying = [m for m in group.members.values() if m is not leaving]
        if leaving.classic is not None or not staying or any(m.classic is None for m in staying):
            return False
        reason = None
        if self.policy not in ("downgrade", "bidirectional"):
            reason = "the online downgrade is disabled"
        elif len(staying) > coordinator.config.max_size:
            reason = "its size is greater than group.max.size"
        if reason:
            log.info("group %r: cannot downgrade the consumer group to a classic group: %s", group.group_id, reason)
            return False
        now, now_ms = time.monotonic(), classic_coordinator._now_ms()
        names = self._topic_names()
        classic = classic_coordinator.Group(group.group_id, now_ms)
        classic.protocol_type, classic.generation = PROTOCOL_TYPE, group.epoch
        for m in staying:
            classic.members[m.member_id] = classic_coordinator.Member(
                m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                m.classic.session_timeout_ms, PROTOCOL_TYPE, list(m.classic.protocols),
                heartbeat_deadline=now + m.classic.session_timeout_ms / 1000, is_new=False)
            if m.instance_id is not None:
                classic.static_members[m.instance_id] = m.member_id
        classic.leader = staying[0].member_id
        classic.protocol = classic.select_protocol()
        for member in classic.members.values():
            member.assignment = _assignment(group.target.get(member.member_id, {}), names,
                                            member.metadata(classic.protocol))
        classic.set_state(classic_coordinator.STABLE, now_ms)
        holder = coordinator.groups.get(group.group_id)       # the group's offsets
        if holder is not None:
            classic.offsets, classic.txn_offsets = holder.offsets, holder.txn_offsets
        error = coordinator._store_group(classic)
        if error:
            log.error("group %r: the downgrade to a classic group could not be stored (%s)", group.group_id,
                      ErrorCode(error).name)
            return False
        log.info("group %r: member %s was the last of the consumer protocol: the group is a classic group of "
                 "generation %d (%s)", group.group_id, leaving.member_id, classic.generation, self.policy)
        if holder is not None and holder.timer_task is not None:
            holder.timer_task.cancel()
        coordinator.groups[group.group_id] = classic
        error = coordinator.consumer_groups.delete(group)       # its records, tombstones
        if error:
            log.error("group %r: the consumer group's records could not be deleted after the downgrade (%s)",
                      group.group_id, ErrorCode(error).name)
        coordinator._prepare_rebalance(classic, now, f"downgrade of group {group.group_id} from consumer to classic")
        coordinator._schedule(classic)
        return True

    # --- classic requests to a consumer group -----------------------------------------------------------

    def join(self, group, header, request, client_host):
        """JoinGroup of a classic member (Kafka's ``classicGroupJoinToConsumerGroup``): answered at once."""
        coordinator, config = self.coordinator, self.coordinator.config
        version = header.api_version
        member_id = request.member_id or ""
        instance_id = request.group_instance_id if version >= 5 else None
        protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]
        if not config.min_session_timeout_ms <= request.session_timeout_ms <= config.max_session_timeout_ms:
            return coordinator._join_error(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        unknown_member = not member_id
        member_id = member_id or str(uuid.uuid4())
        new = (member_id not in group.members) if instance_id is None else instance_id not in group.static_members
        if member_id not in group.members and len(group.members) >= config.consumer_max_size:
            return coordinator._join_error(ErrorCode.GROUP_MAX_SIZE_REACHED, member_id)
        if not self._supports(group, request.protocol_type, protocols) or (new and self.policy == "disabled"):
            return coordinator._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if unknown_member and instance_id is None and version >= 4:       # KIP-394: the id first
            return coordinator._join_error(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        try:
            subscription = read_subscription(protocols[0][1])
            rack_id = _rack_id(protocols[0][1])
        except CorruptRecordError as e:
            log.info("group %r: JoinGroup of %s with an unreadable subscription: %s", group.group_id, member_id, e)
            return coordinator._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        try:
            member = self._joining_member(group, member_id, instance_id, unknown_member)
        except Refused as e:
            return coordinator._join_error(e.code, member_id)
        now = time.monotonic()
        rebalance_timeout_ms = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        topic_names = tuple(sorted(set(subscription.topics)))
        changed = member.member_id not in group.members or topic_names != member.topic_names
        member.topic_names, member.rebalance_timeout_ms = topic_names, rebalance_timeout_ms
        if rack_id is not None:
            member.rack_id = rack_id
        member.client_id, member.client_host = header.client_id or "", client_host
        member.classic = ClassicProtocol(request.session_timeout_ms, protocols,
                                         sync_deadline=now + rebalance_timeout_ms / 1000)
        if member.member_id not in group.members:
            group.add(member)
            log.info("group %r: member %s joins (classic protocol)", group.group_id, member.member_id)
        consumer_groups = coordinator.consumer_groups
        consumer_groups._refresh(group, bump=changed)
        consumer_groups._reconcile(group, member, _by_topic_id(subscription.owned, self._topic_ids()), now)
        member.session_deadline = now + request.session_timeout_ms / 1000
        coordinator.schedule_consumer_group(group)
        return messages.JoinGroupResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE, generation_id=member.epoch, protocol_type=PROTOCOL_TYPE,
            protocol_name=member.classic.protocol_name, leader="", skip_assignment=False, member_id=member.member_id,
            members=[])

    def _joining_member(self, group, member_id, instance_id, unknown_member):
        if instance_id is None:
            return group.members.get(member_id) or ConsumerMember(member_id)
        known_id = group.static_members.get(instance_id)
        if unknown_member:
            if known_id is None:
                return ConsumerMember(member_id, instance_id=instance_id)
            # the instance rejoins under a new member id: it takes the place of its previous one
            return self.coordinator.consumer_groups._rejoined(group, group.members[known_id], member_id)
        return self._member(group, member_id, instance_id)

    def sync(self, group, header, request):
        """SyncGroup of a classic member (Kafka's ``classicGroupSyncToConsumerGroup``): its assignment."""
        version = header.api_version
        try:
            member = self._member(group, request.member_id, request.group_instance_id if version >= 3 else None)
            self._check_generation(member, request.generation_id)
            if version >= 5 and (request.protocol_type not in (None, PROTOCOL_TYPE) or
                                 request.protocol_name not in (None, member.classic.protocol_name)):
                raise Refused(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "")
            now = time.monotonic()
            self._refresh_session(member, now)
            if group.epoch > member.epoch and member.state != UNREVOKED:
                self._rejoin_by(member, now)
                raise Refused(ErrorCode.REBALANCE_IN_PROGRESS, "")
        except Refused as e:
            return self.coordinator._sync_error(e.code)
        finally:
            if group.members:
                self.coordinator.schedule_consumer_group(group)
        member.classic.sync_deadline = None
        names = self._topic_names()
        return messages.SyncGroupResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE, protocol_type=PROTOCOL_TYPE,
            protocol_name=member.classic.protocol_name,
            assignment=_assignment(member.assigned, names, member.classic.protocols[0][1]))

    def heartbeat(self, group, header, request):
        """Heartbeat of a classic member (Kafka's ``classicGroupHeartbeatToConsumerGroup``): REBALANCE_IN_PROGRESS
        when it should rejoin."""
        try:
            member = self._member(group, request.member_id,
                                  request.group_instance_id if header.api_version >= 3 else None)
            self._check_generation(member, request.generation_id)
        except Refused as e:
            return e.code
        now = time.monotonic()
        self._refresh_session(member, now)
        if member.epoch < group.epoch or member.state == UNREVOKED or \
                (member.state == UNRELEASED and not _waits_on_unreleased(group, member)):
            self._rejoin_by(member, now)
            self.coordinator.schedule_consumer_group(group, member)
            return ErrorCode.REBALANCE_IN_PROGRESS
        self.coordinator.schedule_consumer_group(group, member)
        return ErrorCode.NONE

    def leave(self, group, identities):
        """LeaveGroup of classic members (Kafka's ``classicGroupLeaveToConsumerGroup``): an error code for each of
        ``identities``; the group moves to a new epoch once if any left."""
        errors = []
        for identity in identities:
            member_id, instance_id = identity.member_id or "", identity.group_instance_id
            try:
                if instance_id is not None and not member_id:       # an admin removes it by instance id
                    member_id = group.static_members.get(instance_id, "")
                member = self._member(group, member_id, instance_id)
            except Refused as e:
                errors.append(e.code)
                continue
            log.info("group %r: member %s left (classic protocol)", group.group_id, member.member_id)
            group.remove(member)
            errors.append(ErrorCode.NONE)
        if ErrorCode.NONE in errors:
            group.topics = self.coordinator.consumer_groups._subscribed_topics(group)
            group.epoch += 1
            self.coordinator.schedule_consumer_group(group)
        return errors

    def _member(self, group, member_id, instance_id):
        """Kafka's ``validateConsumerGroupMember`` and ``throwIfMemberDoesNotUseClassicProtocol``."""
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, "")
        else:
            known_id = group.static_members.get(instance_id)
            if known_id is None:
                raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, "")
            if known_id != member_id:
                raise Refused(ErrorCode.FENCED_INSTANCE_ID, "")
            member = group.members[known_id]
        if member.classic is None:
            raise Refused(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member.member_id} does not use the classic protocol.")
        return member

    @staticmethod
    def _check_generation(member, generation):
        if generation != member.epoch:
            raise Refused(ErrorCode.ILLEGAL_GENERATION, "")

    @staticmethod
    def _refresh_session(member, now):
        member.session_deadline = now + member.classic.session_timeout_ms / 1000

    @staticmethod
    def _rejoin_by(member, now):
        if member.classic.join_deadline is None:
            member.classic.join_deadline = now + member.rebalance_timeout_ms / 1000

    @staticmethod
    def _supports(group, protocol_type, protocols):
        """Kafka's ``ConsumerGroup.supportsClassicProtocols``: the consumer protocol type, and a protocol that every
        classic member supports."""
        if protocol_type != PROTOCOL_TYPE or not protocols:
            return False
        common = None
        for member in group.members.values():
            if member.classic is not None:
                names = {name for name, _ in member.classic.protocols}
                common = names if common is None else common & names
        return common is None or any(name in common for name, _ in protocols)

    def _topic_ids(self):
        return {name: _topic_uuid(info.topic_id) for name, info in self.coordinator.logs.topics().items()}

    def _topic_names(self):
        return {_topic_uuid(info.topic_id): name for name, info in self.coordinator.logs.topics().items()}


def _waits_on_unreleased(group, member):
    """Kafka's ``waitingOnUnreleasedPartition``: a partition of the member's target still held by another."""
    target = group.target.get(member.member_id, {})
    return any((topic, p) in group.owners for topic, parts in target.items()
               for p in parts - member.assigned.get(topic, frozenset()))


def _by_topic_id(partitions, ids):
    """``[TopicPartition]`` as {topic id: frozenset}, topics that do not exist left out."""
    held = {}
    for tp in partitions:
        if tp.topic in ids:
            held.setdefault(ids[tp.topic], set()).add(tp.partition)
    return {topic: frozenset(parts) for topic, parts in held.items()}


def _assignment(partitions, names, metadata):
    """``partitions`` ({topic id: partitions}) as a ConsumerProtocolAssignment of the version of the member's
    subscription ``metadata`` (versions 0 to 3 share one layout), as Kafka serializes it."""
    version = min(max(_VERSION.unpack_from(metadata)[0], 0), 3) if len(metadata) >= 2 else 0
    payload = encode_assignment([TopicPartition(names[topic], p) for topic, parts in partitions.items()
                                 if topic in names for p in parts])
    return _VERSION.pack(version) + payload[_VERSION.size:]


def _rack_id(metadata):
    """The rack of a ConsumerProtocolSubscription v3+ (KIP-881), or None."""
    reader = _Reader(metadata, "consumer subscription")
    if reader.unpack(_VERSION) < 3:
        return None
    for _ in range(reader.count()):
        reader.string()
    reader.bytes()
    reader.partitions()
    reader.unpack(_GENERATION)
    length = reader.data[reader.pos:reader.pos + _VERSION.size]
    if not length or (len(length) == _VERSION.size and _VERSION.unpack(length)[0] < 0):
        return None                 # no rack, or a null one
    return reader.string()
