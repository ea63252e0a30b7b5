"""Group membership (Kafka's classic consumer protocol): find the coordinator, join, sync, heartbeat,
commit and fetch offsets, leave; the range, round-robin, sticky and cooperative-sticky assignors.

The sticky assignors (KIP-54) keep each member's partitions where balance allows. Members tell the
leader what they own in their subscription (ConsumerProtocol v2: owned partitions and generation, and the
StickyAssignor user data, previous assignment and generation, that Java's StickyAssignor, librdkafka,
kafka-python and aiokafka read); a partition claimed by two members goes with the later generation.
With ``cooperative-sticky`` alone configured, rebalancing is incremental (KIP-429): a member keeps its
partitions while it rejoins, the leader withholds a partition that changes owner, its old owner gives it up
and rejoins at once, and the second rebalance hands it to the new one. With eager assignors in the list as
well (the rolling upgrade's first step, ``["cooperative-sticky", "range"]``), the member revokes
everything before each join, as Kafka's. The consumer's rebalance listener hears of each change
(``kmem.consumer.consumer``); a member the coordinator no longer knows (UNKNOWN_MEMBER_ID) or whose
generation it fenced (ILLEGAL_GENERATION) has lost its partitions, and joins again.

Joining, syncing, assigning and commits are driven from the consumer's ``poll`` on the application's
thread. As in Kafka's ConsumerCoordinator, no OffsetCommit goes out from a member's JoinGroup to the end
of its SyncGroup (it would carry a generation that is ending; refused, it would start another rebalance):
the commit fails at once with ``RebalanceInProgressError``. A commit refused (ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS) changes the membership only when the answer concerns the
current generation and no rebalance is under way.

Heartbeats also go out from a ``HeartbeatThread`` (KIP-62) while the application works between
polls, so a batch that takes longer than ``session.timeout.ms`` to handle does not cost the partitions.
``max.poll.interval.ms`` bounds that time, as in Kafka: when ``poll`` was not called within it, the
heartbeat thread leaves the group (a static member, ``group.instance.id``, sends no LeaveGroup and only
stops heartbeating, so the coordinator keeps its partitions until ``session.timeout.ms``), and the member
rejoins at its next ``poll``. The coordinator connection is a KIP-81 priority channel: its responses are
read outside ``buffer.memory``, so a pool filled by fetch data cannot delay a heartbeat's answer, and
with it the next heartbeat.

The heartbeat thread is a Python thread: it runs whenever the application's thread lets go of the GIL,
which CPython makes it do every ``sys.getswitchinterval()`` (5 ms) while it runs Python code, and
whenever it sleeps or blocks on I/O. A C extension that holds the GIL for longer than
``session.timeout.ms`` (a long computation without ``Py_BEGIN_ALLOW_THREADS``) stops the heartbeats
for that time: the coordinator expires the member and its partitions move, as if the application had
stopped polling; its next ``poll`` rejoins and a commit of the old generation fails. Release the GIL
in such code, or raise ``session.timeout.ms`` above its longest call.
"""
import logging
import struct
import threading
import time
from typing import NamedTuple

from kmem.consumer import errors as codes
from kmem.consumer.errors import CommitFailedError, KafkaConnectionError, KafkaError, RebalanceInProgressError
from kmem.consumer.fetcher import TopicPartition
from kmem.errors import CorruptRecordError
from kmem.protocol import messages

log = logging.getLogger(__name__)

CONSUMER_PROTOCOL = "consumer"
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_COORDINATOR_ERRORS = {codes.COORDINATOR_NOT_AVAILABLE, codes.NOT_COORDINATOR, codes.COORDINATOR_LOAD_IN_PROGRESS}


# -- ConsumerProtocol payloads (Kafka's ConsumerProtocolSubscription / ConsumerProtocolAssignment) -------

def _string(s):
    raw = s.encode("utf-8")
    return _I16.pack(len(raw)) + raw


def encode_subscription(topics):
    return b"".join([_I16.pack(0), _I32.pack(len(topics)), *map(_string, sorted(topics)), _I32.pack(-1)])


def _partitions(partitions):
    by_topic = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    parts = [_I32.pack(len(by_topic))]
    for topic, ids in by_topic.items():
        parts += [_string(topic), _I32.pack(len(ids)), struct.pack(f">{len(ids)}i", *ids)]
    return b"".join(parts)


def encode_sticky_subscription(topics, owned, previous, generation):
    """Version 2: the partitions the member holds (``owned``) and ``generation``, and StickyAssignor user
    data (v1: the ``previous`` assignment, revoked by an eager member before it joins, and generation)."""
    user_data = _partitions(previous) + _I32.pack(generation) if previous else b""
    return b"".join([_I16.pack(2), _I32.pack(len(topics)), *map(_string, sorted(topics)),
                     _I32.pack(len(user_data) if user_data else -1), user_data, _partitions(owned),
                     _I32.pack(generation)])


def encode_assignment(partitions):
    return _I16.pack(0) + _partitions(partitions) + _I32.pack(-1)


class _Reader:
    def __init__(self, data, what):
        self.data = bytes(data)
        self.pos = 0
        self.what = what

    def unpack(self, fmt):
        try:
            values = fmt.unpack_from(self.data, self.pos)
        except struct.error:
            raise CorruptRecordError(f"{self.what} ends early", self.pos) from None
        self.pos += fmt.size
        return values[0]

    def string(self):
        length = self.unpack(_I16)
        if length < 0 or self.pos + length > len(self.data):
            raise CorruptRecordError(f"{self.what}: bad string length {length}", self.pos)
        self.pos += length
        return self.data[self.pos - length:self.pos].decode("utf-8", "replace")

    def count(self):
        n = self.unpack(_I32)
        if n < 0 or n > len(self.data):
            raise CorruptRecordError(f"{self.what}: bad array length {n}", self.pos)
        return n

    def bytes(self):
        length = self.unpack(_I32)
        if length < -1 or self.pos + length > len(self.data):
            raise CorruptRecordError(f"{self.what}: bad bytes length {length}", self.pos)
        if length < 0:
            return b""
        self.pos += length
        return self.data[self.pos - length:self.pos]

    def partitions(self):
        result = []
        for _ in range(self.count()):
            topic = self.string()
            result += [TopicPartition(topic, self.unpack(_I32)) for _ in range(self.count())]
        return result

    @property
    def at_end(self):
        return self.pos >= len(self.data)


class Subscription(NamedTuple):
    topics: list
    owned: list             # partitions the member holds (empty from eager members and v0)
    generation: int         # of that ownership; -1 when unknown


def decode_subscription(data):
    """The topics of a member's subscription (any version: later versions only append fields)."""
    return read_subscription(data).topics


def read_subscription(data, previous_as_owned=False):
    """A member's ``Subscription``: topics, the owned partitions (v1+) and generation (v2+); the generation
    otherwise from StickyAssignor user data (v0: previous assignment, v1: and generation), and with
    ``previous_as_owned`` (the eager sticky assignor) its previous assignment when nothing is owned.
    User data of another layout is ignored."""
    reader = _Reader(data, "consumer subscription")
    version = reader.unpack(_I16)
    topics = [reader.string() for _ in range(reader.count())]
    if reader.at_end:
        return Subscription(topics, [], -1)
    user_data = reader.bytes()
    owned = reader.partitions() if version >= 1 and not reader.at_end else []
    generation = reader.unpack(_I32) if version >= 2 and not reader.at_end else -1
    sticky = _sticky_user_data(user_data) if user_data and (generation < 0 or previous_as_owned and not owned) \
        else None
    if sticky is not None:
        previous, previous_generation = sticky
        if previous_as_owned and not owned:
            owned = previous
        generation = max(generation, previous_generation)
    return Subscription(topics, owned, generation)


def _sticky_user_data(data):
    """StickyAssignor user data as Java and librdkafka write it, or after the int16 version that
    kafka-python 3 puts first: (previous assignment, generation), or None if it is neither."""
    for start in (0, 2):
        try:
            reader = _Reader(data[start:], "sticky user data")
            previous = reader.partitions()
            generation = reader.unpack(_I32) if not reader.at_end else -1
        except CorruptRecordError:
            continue
        if reader.at_end:
            return previous, generation
    return None


def decode_assignment(data):
    if not data:
        return []
    reader = _Reader(data, "consumer assignment")
    reader.unpack(_I16)
    return reader.partitions()


# -- assignors ------------------------------------------------------------------------------------------

def assign_range(subscriptions, partitions):
    """Kafka's RangeAssignor: per topic, members sorted by id get consecutive ranges, the first ones
    one partition more when the count does not divide."""
    result = {member: [] for member in subscriptions}
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        ids = partitions.get(topic, [])
        per_member, extra = divmod(len(ids), len(members))
        start = 0
        for i, member in enumerate(members):
            count = per_member + (i < extra)
            result[member] += [TopicPartition(topic, p) for p in ids[start:start + count]]
            start += count
    return result


def assign_round_robin(subscriptions, partitions):
    """Kafka's RoundRobinAssignor: all partitions sorted, dealt to the members sorted by id in turn,
    skipping members not subscribed to the partition's topic."""
    result = {member: [] for member in subscriptions}
    members = sorted(subscriptions)
    turn = 0
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        for p in partitions.get(topic, []):
            for _ in range(len(members)):
                member = members[turn % len(members)]
                turn += 1
                if topic in subscriptions[member]:
                    result[member].append(TopicPartition(topic, p))
                    break
    return result


def assign_sticky(subscriptions, partitions, owned, *, cooperative=False):
    """Kafka's sticky assignors (KIP-54): each member keeps what it owns (``owned``: {member:
    ``Subscription``}) up to its share of a balanced assignment; the rest goes to the least loaded members
    subscribed, partitions of topics with the fewest subscribers first. A partition claimed twice stays
    with the later generation. ``cooperative`` (KIP-429): a partition whose owner changes is left out,
    to be assigned in the rebalance its old owner starts once it has revoked it."""
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    every = [TopicPartition(t, p) for t in topics for p in partitions.get(t, [])]
    existing = set(every)
    owner = {}
    for member in sorted(subscriptions, key=lambda m: (owned[m].generation, m)):     # later claims win
        for tp in owned[member].owned:
            if tp in existing and tp.topic in subscriptions[member]:
                owner[tp] = member
    result = {member: [] for member in subscriptions}
    share, extra = divmod(len(every), len(subscriptions))
    for member in sorted(subscriptions):
        mine = sorted(tp for tp, m in owner.items() if m == member)
        keep = share + (extra > 0 and len(mine) > share)
        extra -= keep > share
        result[member] = mine[:keep]
    kept = {tp for parts in result.values() for tp in parts}
    subscribers = {t: sorted(m for m, ts in subscriptions.items() if t in ts) for t in topics}
    for tp in sorted(existing - kept, key=lambda tp: (len(subscribers[tp.topic]), tp)):
        member = min(subscribers[tp.topic], key=lambda m: (len(result[m]), m))
        result[member].append(tp)
    if cooperative:
        result = {m: [tp for tp in parts if owner.get(tp, m) == m] for m, parts in result.items()}
    return {m: sorted(parts) for m, parts in result.items()}


ASSIGNORS = {"range": assign_range, "roundrobin": assign_round_robin}
STICKY_ASSIGNORS = ("sticky", "cooperative-sticky")


class Coordinator:
    """One member of a consumer group, as a state machine advanced by ``poll``."""

    def __init__(self, client, metadata, config, *, priority=True, on_join_prepare=lambda: None):
        self._client = client
        self._on_join_prepare = on_join_prepare     # runs before a rebalance's first JoinGroup (commit, revoke)
        self._rebalancing = False       # from a rebalance's first JoinGroup until its SyncGroup completes
        self._metadata = metadata
        self.group_id = config["group.id"]
        self._session_timeout_ms = config["session.timeout.ms"]
        self._rebalance_timeout_ms = config["max.poll.interval.ms"]
        self._max_poll_interval = config["max.poll.interval.ms"] / 1000.0
        self.instance_id = config["group.instance.id"]     # KIP-345 static membership
        self._heartbeat_interval = config["heartbeat.interval.ms"] / 1000.0
        self._retry_backoff = config["retry.backoff.ms"] / 1000.0
        self._assignors = config["partition.assignment.strategy"]
        # KIP-429: incremental only when every configured assignor is (Kafka's choice of protocol).
        self.cooperative = all(name == "cooperative-sticky" for name in self._assignors)
        self.assigned = []              # from the last SyncGroup; with cooperative, still held while joining
        self._priority = priority
        self.node = None                # the coordinator's channel id, once found
        self._lookup_in_flight = False
        self._retry_at = 0.0
        self.member_id = ""
        self.generation = -1
        self.protocol = None
        self.leader = None
        self.subscription = set()
        self._state = "unjoined"        # unjoined -> joining -> syncing -> stable
        self._rejoin_after_sync = False     # a rejoin asked for while the JoinGroup or SyncGroup was out
        self._join_in_flight = False
        self._heartbeat_in_flight = False
        self._heartbeat_due = 0.0
        self._leader_members = None     # as leader: {member id: topics} waiting for metadata
        self._leader_members_version = 0
        self.assignment_changed = None  # set to the new assignment when a sync completes
        self.generations = []           # every generation joined (for diagnostics and tests)
        self.heartbeats_answered = 0
        self.last_heartbeat_answer = None
        self.last_poll = time.monotonic()   # the application's last poll(), for max.poll.interval.ms
        self.failure = None             # what ends the membership for good (KIP-848's fatal errors): poll raises it

    # -- state ---------------------------------------------------------------------------------------

    @property
    def stable(self):
        return self._state == "stable"

    @property
    def rebalancing(self):
        """The member sent a JoinGroup and its rebalance has not completed (Kafka's PREPARING_REBALANCE and
        COMPLETING_REBALANCE, also while a failed JoinGroup or SyncGroup is retried): its generation is
        about to be replaced, so no commit goes out with it."""
        return self._rebalancing

    @property
    def ready(self):
        return self.node is not None and self._client.is_connected(self.node)

    @property
    def leaves_on_close(self):
        """A static member (KIP-345) sends no LeaveGroup: the coordinator keeps its partitions for its return."""
        return self.instance_id is None

    def subscribe(self, topics):
        if set(topics) != self.subscription:
            self.subscription = set(topics)
            self.request_rejoin()

    def unsubscribe(self):
        self.subscription = set()

    def assignment_applied(self, assigned, revoked):
        """The consumer took a SyncGroup's assignment; a cooperative member that gave partitions up rejoins at
        once, so that their new owner gets them (KIP-429)."""
        if revoked and self.cooperative:
            self.request_rejoin()

    def request_rejoin(self):
        """Rejoin: at once when stable; after the rebalance under way completes otherwise, as Kafka's
        ``rejoinNeeded``. Dropping its JoinGroup or SyncGroup would leave the others waiting for this member,
        and its next JoinGroup (new metadata) would start yet another rebalance."""
        if self._state == "stable":
            self._state = "unjoined"
        elif self._state in ("joining", "syncing"):
            self._rejoin_after_sync = True

    def _coordinator_dead(self, reason):
        log.info("group %s: coordinator lost (%s)", self.group_id, reason)
        if self.node is not None:
            self._client.close(self.node)
        self.node = None
        self._retry_at = time.monotonic() + self._retry_backoff

    # -- polling -------------------------------------------------------------------------------------

    def poll(self, now):
        """Advance: look up the coordinator, (re)join when needed, heartbeat when due."""
        if self.node is None or not self._client.is_connected(self.node):
            self.node = None
            self._heartbeat_in_flight = False
            if self._state in ("joining", "syncing"):
                self._state, self._join_in_flight = "unjoined", False
            self._lookup(now)
            return
        if self._state == "stable" and self._rejoin_after_sync and self.assignment_changed is None:
            self._rejoin_after_sync = False     # once the consumer has taken the new assignment
            self._state = "unjoined"
        if self._state == "unjoined" and self.subscription and not self._join_in_flight and now >= self._retry_at:
            self._join()
        elif self._state == "syncing" and self._leader_members is not None:
            self._try_leader_sync()
        elif self._state == "stable" and not self._heartbeat_in_flight and now >= self._heartbeat_due:
            self._heartbeat(now)

    def poll_heartbeat(self, now):
        """The heartbeat thread's share: heartbeat when due, or leave the group when the application has
        not called ``poll`` within ``max.poll.interval.ms``. Joining stays with ``poll``."""
        if self._state != "stable" or not self.ready:
            return
        if now - self.last_poll > self._max_poll_interval:
            log.warning("group %s: poll() was not called within max.poll.interval.ms (%d ms): %s; it rejoins "
                        "at the next poll() (handle fewer records per poll, max.poll.records, or raise "
                        "max.poll.interval.ms)", self.group_id, self._rebalance_timeout_ms,
                        "stopping heartbeats" if self.instance_id else "leaving the group")
            if self.instance_id:
                self._forget_membership()
            else:
                self.leave(lambda *_: None)
        elif not self._heartbeat_in_flight and now >= self._heartbeat_due:
            self._heartbeat(now)

    def time_to_next_heartbeat(self, now):
        if self._state != "stable" or self._heartbeat_in_flight:
            return None
        return max(0.0, self._heartbeat_due - now)

    def _lookup(self, now):
        if self._lookup_in_flight or now < self._retry_at:
            return
        node = self._metadata.any_node()
        if node is None:
            self._retry_at = now + self._retry_backoff
            return
        self._lookup_in_flight = True
        self._client.send(node, messages.FindCoordinatorRequest(key=self.group_id, key_type=0),
                          self._on_lookup)

    def _on_lookup(self, receive, body, error):
        self._lookup_in_flight = False
        code = codes.COORDINATOR_NOT_AVAILABLE if error is not None else body.error_code
        if code:
            self._retry_at = time.monotonic() + self._retry_backoff
            return
        channel = f"coordinator-{body.node_id}"
        now = time.monotonic()
        try:
            if not self._client.can_connect(channel, now):
                raise KafkaConnectionError("backing off")
            self._client.connect(channel, (body.host, body.port), priority=self._priority)
        except KafkaConnectionError:
            self._retry_at = now + self._retry_backoff      # the client logged it and backs off
            return
        self.node = channel

    # -- join and sync ---------------------------------------------------------------------------------

    def _join(self):
        self._join_in_flight = True     # already while preparing: a listener's poll() must not join again
        if not self._rebalancing:       # once per rebalance: not again for a retried JoinGroup
            self._on_join_prepare()     # its commits still carry the generation being left
            self._rebalancing = True
        if not self.ready:              # the preparation's commit lost the coordinator: join once found
            self._join_in_flight = False
            return
        self._state = "joining"
        self._rejoin_after_sync = False     # this JoinGroup carries the subscription as it is now
        metadata = encode_subscription(self.subscription)
        sticky = encode_sticky_subscription(self.subscription, self.assigned if self.cooperative else [],
                                            self.assigned, self.generation)
        request = messages.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self._session_timeout_ms,
            rebalance_timeout_ms=self._rebalance_timeout_ms, member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type=CONSUMER_PROTOCOL,
            protocols=[messages.JoinGroupRequest.JoinGroupRequestProtocol(
                name=name, metadata=sticky if name in STICKY_ASSIGNORS else metadata) for name in self._assignors])
        self._client.send(self.node, request, self._on_join)

    def _on_join(self, receive, body, error):
        self._join_in_flight = False
        if self._state != "joining":
            return
        if error is not None:
            self._state = "unjoined"
            self._coordinator_dead(error)
            return
        code = body.error_code
        if code == codes.MEMBER_ID_REQUIRED:       # KIP-394: join again with the id the broker chose
            self.member_id = body.member_id
            self._state = "unjoined"
            return
        if code:
            self._join_failed(code)
            return
        self.member_id = body.member_id
        self.generation = body.generation_id
        self.protocol = body.protocol_name
        self.leader = body.leader
        self.generations.append(self.generation)
        self._state = "syncing"
        if self.leader == self.member_id:
            try:
                self._leader_members = {m.member_id: read_subscription(m.metadata, self.protocol == "sticky")
                                        for m in body.members}
            except CorruptRecordError as exc:
                log.warning("group %s: unreadable member subscription (%s); rejoining", self.group_id, exc)
                self._state = "unjoined"
                return
            topics = set().union(*(s.topics for s in self._leader_members.values()))
            self._metadata.set_topics(self._metadata.topics | topics)
            # As Java's ConsumerCoordinator: the metadata at hand serves when it knows every member's
            # topics. Waiting for a fresh answer would put it behind a fetch long-poll on the same
            # connection (fetch.max.wait.ms), at each rebalance of a cooperative leader, which keeps fetching.
            if topics <= self._metadata.partitions.keys():
                self._leader_members_version = -1
            else:
                self._metadata.request_update()
                self._leader_members_version = self._metadata.version
        else:
            self._leader_members = None
            self._sync([])

    def _join_failed(self, code):
        self._state = "unjoined"
        if code in _COORDINATOR_ERRORS:
            self._coordinator_dead(codes.error_name(code))
        elif code in (codes.UNKNOWN_MEMBER_ID, codes.ILLEGAL_GENERATION):
            self._fenced(code)
        elif code != codes.REBALANCE_IN_PROGRESS:
            log.warning("group %s: join failed with %s", self.group_id, codes.error_name(code))
        self._retry_at = time.monotonic() + self._retry_backoff

    def _try_leader_sync(self):
        # Assign once the metadata knows every member's topics (fetched after the join if it did not).
        if self._metadata.version <= self._leader_members_version:
            return
        members, self._leader_members = self._leader_members, None
        subscriptions = {member: s.topics for member, s in members.items()}
        if self.protocol in STICKY_ASSIGNORS:
            assignment = assign_sticky(subscriptions, self._metadata.partitions, members,
                                       cooperative=self.protocol == "cooperative-sticky")
        else:
            assignment = ASSIGNORS.get(self.protocol, assign_range)(subscriptions, self._metadata.partitions)
        self._sync([messages.SyncGroupRequest.SyncGroupRequestAssignment(
            member_id=member, assignment=encode_assignment(parts)) for member, parts in assignment.items()])

    def _sync(self, assignments):
        request = messages.SyncGroupRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, protocol_type=CONSUMER_PROTOCOL, protocol_name=self.protocol,
            assignments=assignments)
        generation = self.generation
        self._client.send(self.node, request, lambda r, b, e: self._on_sync(generation, b, e))

    def _on_sync(self, generation, body, error):
        if self._state != "syncing" or generation != self.generation:
            return
        if error is not None:
            self._state = "unjoined"
            self._coordinator_dead(error)
            return
        if body.error_code:
            self._join_failed(body.error_code)
            return
        try:
            assigned = decode_assignment(body.assignment)
        except CorruptRecordError as exc:
            log.warning("group %s: unreadable assignment (%s); rejoining", self.group_id, exc)
            self._state = "unjoined"
            return
        self._state = "stable"
        self._rebalancing = False
        self._heartbeat_due = time.monotonic() + self._heartbeat_interval
        self.assigned = self.assignment_changed = [tp for tp in assigned if tp.topic in self.subscription]

    # -- heartbeats ------------------------------------------------------------------------------------

    def _heartbeat(self, now):
        self._heartbeat_in_flight = True
        self._heartbeat_due = now + self._heartbeat_interval
        generation = self.generation
        request = messages.HeartbeatRequest(group_id=self.group_id, generation_id=generation,
                                            member_id=self.member_id, group_instance_id=self.instance_id)
        self._client.send(self.node, request, lambda r, b, e: self._on_heartbeat(generation, b, e))

    def _on_heartbeat(self, generation, body, error):
        self._heartbeat_in_flight = False
        if error is not None:
            self._coordinator_dead(error)
            return
        self.heartbeats_answered += 1
        self.last_heartbeat_answer = time.monotonic()
        code = body.error_code
        if code == 0 or generation != self.generation:
            return
        if code == codes.REBALANCE_IN_PROGRESS:
            self.request_rejoin()
        elif code in (codes.UNKNOWN_MEMBER_ID, codes.ILLEGAL_GENERATION):
            self._fenced(code)
        elif code in _COORDINATOR_ERRORS:
            self._coordinator_dead(codes.error_name(code))
        else:
            log.warning("group %s: heartbeat failed with %s", self.group_id, codes.error_name(code))

    # -- offsets ---------------------------------------------------------------------------------------

    def commit(self, offsets, callback):
        """Send an OffsetCommit of ``{TopicPartition: offset}``; ``callback(error or None)``. During a
        rebalance nothing is sent and ``callback`` gets a ``RebalanceInProgressError`` at once, as Kafka's
        ConsumerCoordinator fails such a commit locally: the generation it would carry is ending, and a
        commit refused with it would start yet another rebalance."""
        if self._rebalancing:
            callback(RebalanceInProgressError(
                f"offset commit refused: the member is rejoining group {self.group_id} (its generation "
                f"{self.generation} is ending); poll() completes the rebalance, then commit again"))
            return
        topics = {}
        for tp, offset in sorted(offsets.items()):
            topics.setdefault(tp.topic, []).append(messages.OffsetCommitRequest.OffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=offset, committed_leader_epoch=-1,
                commit_timestamp=-1, committed_metadata=""))
        # The generation joined, also once a rejoin is requested but before its JoinGroup (the commit of
        # the rebalance's preparation): Kafka accepts it until the new generation forms. Outside the group
        # (-1, ""), the commit is a simple one.
        generation = self.generation
        request = messages.OffsetCommitRequest(
            group_id=self.group_id, generation_id_or_member_epoch=generation,
            member_id=self.member_id, group_instance_id=self.instance_id, retention_time_ms=-1,
            topics=[messages.OffsetCommitRequest.OffsetCommitRequestTopic(name=t, partitions=p)
                    for t, p in topics.items()])
        self._client.send(self.node, request, lambda r, b, e: callback(self._commit_error(generation, b, e)))

    def _commit_error(self, generation, body, error):
        if error is not None:
            self._coordinator_dead(error)
            return CommitFailedError(f"offset commit failed: {error}")
        for topic in body.topics:
            for p in topic.partitions:
                code = p.error_code
                if not code:
                    continue
                what = f"offset commit of {topic.name}-{p.partition_index} failed"
                if code in (codes.REBALANCE_IN_PROGRESS, codes.ILLEGAL_GENERATION, codes.UNKNOWN_MEMBER_ID):
                    return self._commit_refused(generation, code, what)
                if code in _COORDINATOR_ERRORS:
                    self._coordinator_dead(codes.error_name(code))
                return CommitFailedError(what, code)
        return None

    def _commit_refused(self, generation, code, what):
        """The group refused a commit of ``generation``. As Kafka's ConsumerCoordinator, only an answer about
        the current generation, with no rebalance under way, changes the membership: REBALANCE_IN_PROGRESS
        rejoins, ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID fence the member. A rebalance already under way
        (its JoinGroup or SyncGroup answer pending) goes on undisturbed."""
        current = generation == self.generation and not self._rebalancing
        rebalancing = f"{what} as the group rebalances (poll() completes the rebalance, then commit again)"
        if code == codes.REBALANCE_IN_PROGRESS:
            if current:
                self.request_rejoin()
            return RebalanceInProgressError(rebalancing, code)
        if current:
            self._fenced(code)
        elif self._rebalancing:
            return RebalanceInProgressError(rebalancing, code)
        return CommitFailedError(what, code)

    def fetch_offsets(self, partitions, callback):
        """OffsetFetch for ``partitions``; ``callback({TopicPartition: offset or None}, error)``."""
        topics = {}
        for tp in partitions:
            topics.setdefault(tp.topic, []).append(tp.partition)
        request = messages.OffsetFetchRequest(
            group_id=self.group_id, require_stable=False,
            topics=[messages.OffsetFetchRequest.OffsetFetchRequestTopic(name=t, partition_indexes=p)
                    for t, p in topics.items()])
        self._client.send(self.node, request, lambda r, b, e: self._on_offsets(b, e, callback))

    def _on_offsets(self, body, error, callback):
        if error is not None:
            self._coordinator_dead(error)
            callback(None, error)
            return
        if body.error_code:
            if body.error_code in _COORDINATOR_ERRORS:
                self._coordinator_dead(codes.error_name(body.error_code))
            callback(None, KafkaError("offset fetch failed", body.error_code))
            return
        offsets = {}
        for topic in body.topics:
            for p in topic.partitions:
                if p.error_code:
                    callback(None, KafkaError(f"offset fetch of {topic.name}-{p.partition_index} failed",
                                              p.error_code))
                    return
                offsets[TopicPartition(topic.name, p.partition_index)] = (
                    p.committed_offset if p.committed_offset >= 0 else None)
        callback(offsets, None)

    def leave(self, callback):
        """Send LeaveGroup (``callback`` runs on its answer) and forget the membership."""
        if self.node is not None and self.member_id and self._client.is_connected(self.node):
            self._client.send(self.node, messages.LeaveGroupRequest(group_id=self.group_id,
                                                                    member_id=self.member_id), callback)
        else:
            callback(None, None, None)
        self._forget_membership()

    def _forget_membership(self):
        self._state = "unjoined"
        self.member_id = ""
        self.generation = -1
        self.assigned = []
        self._rebalancing = False

    def _fenced(self, code):
        """The coordinator no longer knows this member (its session expired) or its generation: the
        partitions it holds are lost (the next join reports them so), and it joins again as a new member,
        keeping its id after ILLEGAL_GENERATION as Kafka's does."""
        log.info("group %s: member %s of generation %d fenced (%s); rejoining", self.group_id, self.member_id,
                 self.generation, codes.error_name(code))
        member_id = self.member_id if code == codes.ILLEGAL_GENERATION else ""
        self._forget_membership()
        self.member_id = member_id


class HeartbeatThread(threading.Thread):
    """Heartbeats while the application works between polls (KIP-62): every ``tick`` seconds, under the
    consumer's ``lock`` (held by the application's thread inside each consumer call), it sends a due
    heartbeat and does the network I/O that reads its answer."""

    def __init__(self, coordinator, client, lock, tick):
        super().__init__(name=f"kmem-heartbeat-{coordinator.group_id}", daemon=True)
        self._coordinator = coordinator
        self._client = client
        self._lock = lock
        self._tick = tick
        self._stopping = threading.Event()

    def run(self):
        while not self._stopping.wait(self._tick):
            with self._lock:
                if self._stopping.is_set():
                    break
                self._coordinator.poll_heartbeat(time.monotonic())
                self._client.poll(0)

    def stop(self):
        """Stop and wait for the thread; call without holding the lock."""
        self._stopping.set()
        if self.is_alive():
            self.join()
