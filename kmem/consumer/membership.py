"""Group membership with the consumer group protocol of KIP-848 (``group.protocol=consumer``), as Kafka's Java
consumer has it (``ConsumerMembershipManager`` and ``ConsumerHeartbeatRequestManager``).

The coordinator assigns: a member sends ConsumerGroupHeartbeat with its subscription (topic names, or a regular
expression the coordinator matches, heartbeat v1) and the partitions it owns, and is answered its member epoch,
the heartbeat interval to keep, and its assignment whenever that changes (topics by id, resolved to names through
Metadata v10+). The member reconciles incrementally, on the application's thread inside ``poll``: it gives up the
partitions no longer assigned first (committing their positions when auto-committing, then the rebalance
listener's ``on_partitions_revoked`` with exactly those), takes the new ones (``on_partitions_assigned`` with
exactly those, possibly none), and acknowledges with its owned partitions in a heartbeat sent at once. The others
keep consuming meanwhile: a partition moves only once its old owner acknowledged giving it up.

A member the coordinator fenced (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID: its session expired, or it missed its
rebalance timeout) has lost its partitions (``on_partitions_lost``) and rejoins with epoch 0 under the same member
id. A refusal no retry can cure (UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, GROUP_MAX_SIZE_REACHED,
FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID, an authorization failure...) ends the membership: every ``poll``
raises it as a ``KafkaError`` until ``subscribe`` is called again. Leaving is a heartbeat with epoch -1, or -2 for
a static member (``group.instance.id``), whose partitions the coordinator keeps for its return within
``group.consumer.session.timeout.ms``. Offsets are committed and fetched with the member id and epoch
(OffsetCommit v9, OffsetFetch v9 where the coordinator serves it); a commit refused with STALE_MEMBER_EPOCH
because the epoch moved on while it was out is sent again with the new one.

The heartbeat thread and the priority channel to the coordinator are the classic protocol's
(``kmem.consumer.group``).
"""
import base64
import logging
import time
import uuid

from kmem.consumer import errors as codes
from kmem.consumer.errors import KafkaError
from kmem.consumer.fetcher import TopicPartition
from kmem.consumer.group import _COORDINATOR_ERRORS, Coordinator
from kmem.protocol import ApiKey, messages

log = logging.getLogger(__name__)

JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2
FENCED = (codes.UNKNOWN_MEMBER_ID, codes.FENCED_MEMBER_EPOCH)
# the request versions this protocol needs: topic ids in Metadata, member epochs in OffsetCommit and OffsetFetch
MIN_VERSIONS = {ApiKey.METADATA: 10, ApiKey.OFFSET_COMMIT: 9, ApiKey.CONSUMER_GROUP_HEARTBEAT: 0}
MAX_VERSIONS = {ApiKey.METADATA: 12, ApiKey.OFFSET_COMMIT: 9, ApiKey.OFFSET_FETCH: 9,
                ApiKey.CONSUMER_GROUP_HEARTBEAT: 1}


def new_member_id():
    """A member id as Kafka's ``Uuid.randomUuid().toString()`` writes it: the client names itself (heartbeat v1)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class ConsumerGroupMember(Coordinator):
    """One member of a KIP-848 consumer group, advanced by the consumer's ``poll`` and its heartbeat thread."""

    def __init__(self, client, metadata, config, **kwargs):
        super().__init__(client, metadata, config, **kwargs)
        self.cooperative = True             # reconciles incrementally
        self.member_id = new_member_id()    # kept for the consumer's life, over rejoins
        self.pattern = None                 # a regular expression the coordinator matches topic names with
        self._remote_assignor = config["group.remote.assignor"]
        self.owned = []                     # acknowledged: the partitions the consumer holds, for the heartbeats
        self._reconciled = False            # an assignment of this membership was taken
        self._target = None                 # [(topic id, partition)] received, not yet handed to the consumer
        self._topic_ids = {}                # name -> topic id, of the topics assigned
        self._full_heartbeat = True         # ask for the whole assignment (the last answer may be lost)
        self._incarnation = 0               # bumped when the membership ends: answers of an older one are stale
        self._release_after_failure = False     # the consumer is yet to drop its partitions as lost

    # -- state ---------------------------------------------------------------------------------------

    @property
    def leaves_on_close(self):
        return True                         # a static member too, with epoch -2

    def subscribe(self, topics, pattern=None):
        self.subscription = set(topics)
        self.pattern = pattern
        self._metadata.every_topic = pattern is not None
        self._full_heartbeat = True
        self._heartbeat_due = 0.0           # the coordinator hears of it at once
        if self._state == "failed":
            self._state, self.failure = "unjoined", None

    def unsubscribe(self):
        self.subscribe([])

    def assignment_applied(self, assigned, revoked):
        """The consumer holds ``assigned`` now: acknowledge it in a heartbeat sent at once."""
        self.owned = sorted(assigned)
        self._reconciled = True
        self._heartbeat_due = 0.0

    # -- polling -------------------------------------------------------------------------------------

    def poll(self, now):
        """Look up the coordinator, join when unjoined, heartbeat when due, hand a received assignment over."""
        if self.node is None or not self._client.is_connected(self.node):
            self.node = None
            self._heartbeat_in_flight = False
            self._full_heartbeat = True
            if self._state == "joining":
                self._state = "unjoined"
            self._lookup(now)
            return
        if self._state == "failed" and self._release_after_failure:
            self._release_after_failure = False
            self._on_join_prepare()         # the partitions still held are lost
        elif self._state == "unjoined" and (self.subscription or self.pattern) and not self._heartbeat_in_flight \
                and now >= self._retry_at and self._client.is_ready(self.node):
            self._join(now)
        elif self._state == "stable" and not self._heartbeat_in_flight and now >= self._heartbeat_due:
            self._heartbeat(now)
        self._resolve_target()

    def poll_heartbeat(self, now):
        """The heartbeat thread's share: heartbeat when due, or leave the group when the application has not
        called ``poll`` within ``max.poll.interval.ms`` (it rejoins at its next ``poll``)."""
        if self._state != "stable" or not self.ready:
            return
        if now - self.last_poll > self._max_poll_interval:
            log.warning("group %s: poll() was not called within max.poll.interval.ms (%d ms): leaving the group; it "
                        "rejoins at the next poll() (handle fewer records per poll, max.poll.records, or raise "
                        "max.poll.interval.ms)", self.group_id, self._rebalance_timeout_ms)
            self.leave(lambda *_: None)
        elif not self._heartbeat_in_flight and now >= self._heartbeat_due:
            self._heartbeat(now)

    def _join(self, now):
        if self.pattern is not None and self._client.version(self.node, ApiKey.CONSUMER_GROUP_HEARTBEAT) < 1:
            self._fail(KafkaError(f"group {self.group_id}: the coordinator serves ConsumerGroupHeartbeat v0 only, "
                                  f"which carries no regular expression (v1 does): subscribe to topic names"))
            return
        self._state = "joining"             # first: the listener may poll()
        self._on_join_prepare()             # the partitions of a previous membership are lost
        self._full_heartbeat = True
        if self._state == "joining" and self.ready:
            self._send(now, JOIN_EPOCH)

    def _heartbeat(self, now):
        self._send(now, self.generation)

    def _send(self, now, epoch, callback=None):
        """A ConsumerGroupHeartbeat at ``epoch``: the subscription and owned partitions every time, the rebalance
        timeout when joining or after a lost answer (then the coordinator answers the whole assignment). Epoch 0
        is a join, also when a coordinator answered the join with epoch 0 (librdkafka's mock cluster does, until it
        has an assignment for the member)."""
        Request = messages.ConsumerGroupHeartbeatRequest
        leaving = epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH)
        owned = {}
        for tp in self.owned:
            owned.setdefault(self._topic_ids[tp.topic], []).append(tp.partition)
        request = Request(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch, instance_id=self.instance_id,
            rebalance_timeout_ms=self._rebalance_timeout_ms if (self._full_heartbeat or epoch == JOIN_EPOCH)
            and not leaving else -1,
            subscribed_topic_names=None if leaving or self.pattern is not None else sorted(self.subscription),
            # with names, an empty expression as librdkafka sends (its mock cluster insists on one or the other)
            subscribed_topic_regex=None if leaving else self.pattern or "",
            server_assignor=None if leaving else self._remote_assignor,
            topic_partitions=None if leaving else [] if epoch == JOIN_EPOCH else [
                Request.TopicPartitions(topic_id=topic, partitions=partitions) for topic, partitions in owned.items()])
        if callback is None:
            self._heartbeat_in_flight = True
            self._heartbeat_due = now + self._heartbeat_interval
            incarnation = self._incarnation
            callback = lambda r, b, e: self._on_heartbeat(incarnation, b, e)     # noqa: E731
        self._client.send(self.node, request, callback)

    def _on_heartbeat(self, incarnation, body, error):
        if incarnation != self._incarnation:
            return                          # the member left or was fenced meanwhile
        self._heartbeat_in_flight = False
        if error is not None:
            if self._state == "joining":
                self._state = "unjoined"
            self._coordinator_dead(error)
            return
        self.heartbeats_answered += 1
        self.last_heartbeat_answer = now = time.monotonic()
        code = body.error_code
        if code == codes.NONE:
            self.member_id = body.member_id or self.member_id
            self.generation = body.member_epoch
            self._state = "stable"
            self._full_heartbeat = False
            if body.heartbeat_interval_ms > 0:
                self._heartbeat_interval = body.heartbeat_interval_ms / 1000.0
            if self._heartbeat_due:         # (0: an acknowledgement is to go out at once)
                self._heartbeat_due = now + self._heartbeat_interval
            if body.assignment is not None:
                self._target = [(tp.topic_id, p) for tp in body.assignment.topic_partitions for p in tp.partitions]
            return
        if self._state == "joining":
            self._state = "unjoined"
        if code in FENCED:
            self._fenced(code)
        elif code in _COORDINATOR_ERRORS:
            self._full_heartbeat = True
            self._coordinator_dead(codes.error_name(code))
        else:
            self._fail(KafkaError(f"group {self.group_id}: the coordinator refused member {self.member_id}: "
                                  f"{body.error_message or 'no message'}", code))

    def _resolve_target(self):
        """Hand a received assignment to the consumer (``assignment_changed``) once the metadata names its topics;
        one equal to what the consumer holds is not reconciled again."""
        if self._target is None:
            return
        names = self._metadata.topic_names
        if any(topic not in names for topic, _ in self._target):
            self._metadata.request_update()
            return
        target, self._target = self._target, None
        self._topic_ids.update((names[topic], topic) for topic, _ in target)
        assigned = sorted(TopicPartition(names[topic], p) for topic, p in target)
        if not (self._reconciled and assigned == self.owned):
            self.assignment_changed = assigned

    def _fail(self, error):
        log.error("%s", error)
        self._forget_membership()
        self._state = "failed"
        self.failure = error
        self._release_after_failure = True

    # -- leaving and fencing ---------------------------------------------------------------------------

    def leave(self, callback):
        """Leave the group (a heartbeat with epoch -1, or -2 for a static member; ``callback`` runs on its
        answer) and forget the membership."""
        if self._state in ("joining", "stable") and self.ready:
            epoch = STATIC_LEAVE_EPOCH if self.instance_id is not None else LEAVE_EPOCH
            self._send(time.monotonic(), epoch, callback)
        else:
            callback(None, None, None)
        self._forget_membership()

    def _forget_membership(self):
        self._incarnation += 1
        self._state = "unjoined"
        self.generation = -1
        self.owned = []
        self._reconciled = False
        self._target = self.assignment_changed = None
        self._heartbeat_in_flight = False
        self._full_heartbeat = True

    def _fenced(self, code):
        log.info("group %s: member %s of epoch %d fenced (%s); its partitions are lost, it rejoins", self.group_id,
                 self.member_id, self.generation, codes.error_name(code))
        self._forget_membership()

    # -- offsets ---------------------------------------------------------------------------------------

    def commit(self, offsets, callback):
        """OffsetCommit v9 at the member's epoch; sent again when refused as stale because the epoch moved on."""
        epoch = self.generation

        def answered(error):
            if getattr(error, "code", None) == codes.STALE_MEMBER_EPOCH and self.generation not in (epoch, -1) \
                    and self.ready:
                self.commit(offsets, callback)
            else:
                callback(error)
        super().commit(offsets, answered)

    def fetch_offsets(self, partitions, callback):
        """OffsetFetch v9 (by group, with member id and epoch) for ``partitions``; ``callback`` as the classic's.
        A coordinator without v8 (librdkafka's mock cluster) is asked in the older form, which the request carries
        too (the version encoded keeps its own fields)."""
        Request = messages.OffsetFetchRequest
        topics = {}
        for tp in partitions:
            topics.setdefault(tp.topic, []).append(tp.partition)
        request = Request(
            require_stable=False, group_id=self.group_id,
            topics=[Request.OffsetFetchRequestTopic(name=t, partition_indexes=p) for t, p in topics.items()],
            groups=[Request.OffsetFetchRequestGroup(
                group_id=self.group_id, member_id=self.member_id, member_epoch=self.generation,
                topics=[Request.OffsetFetchRequestTopics(name=t, partition_indexes=p) for t, p in topics.items()])])
        self._client.send(self.node, request, lambda r, b, e: self._on_offsets(
            b.groups[0] if b is not None and b.groups else b, e, callback))
