"""``Consumer``: a poll-driven Kafka consumer whose fetch memory is bounded by ``buffer.memory`` (KIP-81).

Metadata, fetches, joining the group, commits and record delivery happen inside ``poll``, ``commit`` and
``close``, on the application's thread. In a group, a heartbeat thread (KIP-62,
``kmem.consumer.group.HeartbeatThread``) keeps the membership while the application works between
polls: a batch may take longer than ``session.timeout.ms``, but ``poll`` must come again within
``max.poll.interval.ms`` (default 5 minutes), or the member leaves the group and rejoins at its next
``poll`` (its partitions may have moved; a commit in between raises ``CommitFailedError``). While the
member rejoins (from its JoinGroup to the end of its SyncGroup) no commit goes out, as in Kafka's
ConsumerCoordinator: ``commit`` raises ``RebalanceInProgressError`` and auto-commit waits. What a C
extension holding the GIL does to the heartbeats is in ``kmem.consumer.group``'s docstring.

Rebalance listener (Kafka's ``ConsumerRebalanceListener``): ``subscribe(topics, listener=...)`` with an
object whose ``on_partitions_revoked``, ``on_partitions_assigned`` and optionally ``on_partitions_lost``
take a sorted list of ``TopicPartition``. They run on the application's thread, inside ``poll`` (and
``unsubscribe``/``close``), never on the heartbeat thread, as in Kafka's ConsumerCoordinator:

- eager assignors (range, roundrobin, sticky): before each rejoin, ``on_partitions_revoked`` with every
  partition held (also when none is, except before the first join); after the rebalance,
  ``on_partitions_assigned`` with the whole new assignment;
- ``cooperative-sticky`` alone (KIP-429): nothing is revoked before rejoining (but partitions of topics
  no longer subscribed); after the rebalance, ``on_partitions_revoked`` with only the partitions moved away
  (when there are any; the member then rejoins at once) and ``on_partitions_assigned`` with only those
  added (possibly none);
- ``group.protocol=consumer`` (KIP-848, ``kmem.consumer.membership``): at each new assignment the coordinator
  sends, ``on_partitions_revoked`` with only the partitions no longer assigned (when there are any), then
  ``on_partitions_assigned`` with only those added (possibly none); no rejoin, the next heartbeat tells the
  coordinator;
- ``on_partitions_lost`` instead of revoked when the member is no longer in the group: it left after
  ``max.poll.interval.ms`` without ``poll``, or the coordinator expired its session or fenced its generation
  (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION). Its partitions may already be someone else's: do not commit
  them. Without the method, ``on_partitions_revoked`` is called, as Kafka's default does;
- ``unsubscribe`` and ``close`` revoke what is held (lost when out of the group or rebalancing).

Revoked runs before the partitions are given up, so it may ``commit`` their positions; assigned runs
after the partitions are taken, so it may ``seek``. A callback that raises is logged and the rebalance
goes on; the ``poll`` that ran it then raises ``KafkaError`` with the callback's exception as its cause.
"""
import functools
import logging
import threading
import time

from kmem.consumer import config as cfg
from kmem.consumer import membership
from kmem.consumer.client import MAX_VERSIONS, MIN_VERSIONS, NetworkClient
from kmem.consumer.errors import CommitFailedError, KafkaError, KafkaConnectionError
from kmem.consumer.fetcher import EARLIEST, LATEST, Fetcher, TopicPartition
from kmem.consumer.group import Coordinator, HeartbeatThread
from kmem.consumer.metadata import Metadata
from kmem.errors import IllegalStateError, InvalidArgumentError
from kmem.pool import SimpleMemoryPool
from kmem.protocol import messages

log = logging.getLogger(__name__)

# Coordinator responses are read outside the pool (KIP-81), so their size is bounded separately.
COORDINATOR_MAX_RECEIVE_BYTES = 8 << 20
_STRATEGIES = {"earliest": EARLIEST, "latest": LATEST, "none": None}
# The heartbeat thread's pace between looks at the network, at most (Kafka's waits retry.backoff.ms).
HEARTBEAT_TICK_SECONDS = 0.1


class ConsumerRebalanceListener:
    """Kafka's ConsumerRebalanceListener: subclass it (or pass any object with these methods) to
    ``Consumer.subscribe``. Each method gets a sorted list of ``TopicPartition``; see the module docstring
    for when each is called."""

    def on_partitions_revoked(self, revoked):
        """The member is giving these partitions up, still in the group: commit their positions here."""

    def on_partitions_assigned(self, assigned):
        """The member took these partitions (only the new ones, with the cooperative protocol)."""

    def on_partitions_lost(self, lost):
        """The member is out of the group and these partitions may be another's already (Kafka's default:
        as revoked)."""
        self.on_partitions_revoked(lost)


def _locked(method):
    """Run ``method`` holding the consumer's lock, which the heartbeat thread takes between calls."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class Consumer:
    """A Kafka consumer: ``assign`` or ``subscribe``, then ``poll``.

    Configuration takes Kafka's consumer properties as keyword arguments (dots as underscores:
    ``fetch_max_bytes=...``) or as a dict of dotted names through ``from_properties``; ``buffer.memory``
    (default 100 MiB) bounds the pool that fetch responses are read into and may not be smaller than
    ``fetch.max.bytes``. ``ssl_context`` (an ``ssl.SSLContext``) enables TLS directly.

    Not thread-safe, as Kafka's ``KafkaConsumer``: use one consumer from one thread (its own heartbeat
    thread aside).
    """

    def __init__(self, bootstrap_servers=None, group_id=None, buffer_memory=100 << 20, *, ssl_context=None,
                 _priority_coordinator=True, **properties):
        props = cfg.from_keywords(properties)
        props.update({"bootstrap.servers": bootstrap_servers, "group.id": group_id, "buffer.memory": buffer_memory})
        self._init(props, ssl_context, _priority_coordinator)

    @classmethod
    def from_properties(cls, properties, *, ssl_context=None, _priority_coordinator=True):
        """A consumer from Kafka's dotted property names: ``{"bootstrap.servers": ..., "buffer.memory": ...}``."""
        self = cls.__new__(cls)
        self._init(dict(properties), ssl_context, _priority_coordinator)
        return self

    def _init(self, properties, ssl_context, priority_coordinator):
        self._closed = True
        self._lock = threading.RLock()
        self._heartbeat_thread = None
        self.config = config = cfg.parse(properties)
        if ssl_context is None:
            ssl_context = cfg.ssl_context(config)
        # Non-strict (KIP-72): one response larger than what is left is still granted, so the pool holds
        # at most buffer.memory + one response and a consumer always makes progress. Responses vary in
        # size: mapped blocks keep them out of malloc's heap, which they would fragment, growing RSS.
        self.pool = SimpleMemoryPool(config["buffer.memory"], config["buffer.memory"], strict=False, mapped=True)
        consumer_protocol = config["group.protocol"] == "consumer"
        versions = {}
        if consumer_protocol:
            versions = {"max_versions": {**MAX_VERSIONS, **membership.MAX_VERSIONS},
                        "min_versions": {**MIN_VERSIONS, **membership.MIN_VERSIONS}}
        self._client = NetworkClient(
            self.pool, client_id=config["client.id"], request_timeout_ms=config["request.timeout.ms"],
            reconnect_backoff_ms=config["reconnect.backoff.ms"],
            reconnect_backoff_max_ms=config["reconnect.backoff.max.ms"], ssl_context=ssl_context,
            sasl=cfg.sasl_settings(config), coordinator_max_receive_bytes=COORDINATOR_MAX_RECEIVE_BYTES, **versions)
        self._metadata = Metadata(self._client, config)
        self._fetcher = Fetcher(self._client, self._metadata, config, self.pool)
        member = membership.ConsumerGroupMember if consumer_protocol else Coordinator
        self._coordinator = (member(self._client, self._metadata, config, priority=priority_coordinator,
                                    on_join_prepare=self._on_join_prepare)
                             if config["group.id"] else None)
        self._max_poll_records = config["max.poll.records"]
        self._reset_strategy = _STRATEGIES[config["auto.offset.reset"]]
        self._auto_commit = config["enable.auto.commit"] and self._coordinator is not None
        self._auto_commit_interval = config["auto.commit.interval.ms"] / 1000.0
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval
        self._request_timeout = config["request.timeout.ms"] / 1000.0
        self._retry_backoff = config["retry.backoff.ms"] / 1000.0
        self._subscribed = False
        self._listener = None               # the ConsumerRebalanceListener given to subscribe()
        self._offsets_in_flight = set()     # partitions with an OffsetFetch or ListOffsets out
        self._errors = []                   # raised by the next poll
        self._commit_callbacks = []         # commit_async callbacks, run by the next poll
        self._closed = False

    # -- assignment ------------------------------------------------------------------------------------

    @_locked
    def assign(self, partitions):
        """Consume exactly these partitions (``TopicPartition`` or ``(topic, partition)`` tuples)."""
        self._check_open()
        if self._subscribed:
            raise IllegalStateError("assign() cannot follow subscribe(); unsubscribe() first")
        parts = [self._partition(p) for p in partitions]
        self._fetcher.assign(parts)
        self._metadata.set_topics({tp.topic for tp in parts})

    @_locked
    def subscribe(self, topics=(), listener=None, *, pattern=None):
        """Join ``group.id`` and consume the partitions the group assigns of ``topics``; ``listener`` (a
        ``ConsumerRebalanceListener``, or any object with its methods) hears of each change. With
        ``group.protocol=consumer``, ``pattern`` instead: a regular expression the coordinator matches the
        topic names with (RE2's syntax, as Kafka's ``SubscriptionPattern``), also against topics created later."""
        self._check_open()
        if self._coordinator is None:
            raise IllegalStateError("subscribe() needs a group.id")
        if isinstance(topics, str):
            topics = [topics]
        topics = list(topics)
        if pattern is not None:
            if topics or not isinstance(pattern, str) or not pattern:
                raise InvalidArgumentError(f"subscribe() takes topic names or a pattern (a non-empty string), got "
                                           f"{topics!r} and {pattern!r}")
            if self.config["group.protocol"] != "consumer":
                raise InvalidArgumentError("a subscription by pattern needs group.protocol=consumer (the "
                                           "coordinator matches it, KIP-848)")
        elif not topics or not all(isinstance(t, str) and t for t in topics):
            raise InvalidArgumentError(f"subscribe() needs topic names, got {topics!r}")
        if not self._subscribed and self._fetcher.assignment:
            raise IllegalStateError("subscribe() cannot follow assign(); unsubscribe() first")
        if listener is not None and not all(callable(getattr(listener, method, None)) for method in
                                            ("on_partitions_revoked", "on_partitions_assigned")):
            raise InvalidArgumentError(f"a rebalance listener needs on_partitions_revoked and "
                                       f"on_partitions_assigned methods, not {listener!r}")
        self._listener = listener
        self._subscribed = True
        if pattern is None:
            self._coordinator.subscribe(topics)
        else:
            self._coordinator.subscribe(topics, pattern)
        self._metadata.set_topics(topics)
        if self._heartbeat_thread is None:
            tick = min(HEARTBEAT_TICK_SECONDS, self.config["heartbeat.interval.ms"] / 1000.0)
            self._heartbeat_thread = HeartbeatThread(self._coordinator, self._client, self._lock, tick)
            self._heartbeat_thread.start()

    @_locked
    def unsubscribe(self):
        """Leave the group (committing first when auto-committing) or drop the assignment."""
        self._check_open()
        error = None
        if self._subscribed:
            if self._coordinator.generation >= 0:
                self._auto_commit_before_revoke(self._fetcher.assignment)
            error = self._on_leave_prepare()
            self._leave_group()
            self._coordinator.unsubscribe()
        self._subscribed = False
        self._listener = None
        self._fetcher.assign([])
        if error is not None:
            raise error

    @_locked
    def assignment(self):
        return set(self._fetcher.assignment)

    def subscription(self):
        return set(self._coordinator.subscription) if self._subscribed else set()

    @staticmethod
    def _partition(p):
        try:
            topic, partition = p
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"a partition is a (topic, partition) pair, not {p!r}") from None
        if not isinstance(topic, str) or not topic or isinstance(partition, bool) or not isinstance(partition, int) \
                or partition < 0:
            raise InvalidArgumentError(f"invalid partition {p!r}: need a topic name and a partition >= 0")
        return TopicPartition(topic, partition)

    def _assigned(self, p):
        tp = self._partition(p)
        if tp not in self._fetcher.assignment:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return tp

    # -- positions -------------------------------------------------------------------------------------

    @_locked
    def seek(self, partition, offset):
        """Hand out ``partition`` from ``offset`` on; buffered data of it is released."""
        self._check_open()
        tp = self._assigned(partition)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"seek offset must be an integer >= 0, not {offset!r}")
        self._fetcher.seek(tp, offset)

    def seek_to_beginning(self, *partitions):
        self._seek_reset(partitions, EARLIEST)

    def seek_to_end(self, *partitions):
        self._seek_reset(partitions, LATEST)

    @_locked
    def _seek_reset(self, partitions, strategy):
        self._check_open()
        for tp in [self._assigned(p) for p in partitions] or list(self._fetcher.assignment):
            self._fetcher.seek(tp, None)
            self._fetcher.assignment[tp].reset_to = strategy

    @_locked
    def position(self, partition, timeout_ms=None):
        """The offset of the next record ``poll`` hands out for ``partition`` (looked up if unknown)."""
        self._check_open()
        tp = self._assigned(partition)
        deadline = time.monotonic() + (self._request_timeout if timeout_ms is None else timeout_ms / 1000.0)
        while True:
            state = self._fetcher.assignment.get(tp)
            if state is None:
                raise IllegalStateError(f"{tp.topic}-{tp.partition} was revoked")
            if state.position is not None:
                return state.position
            now = time.monotonic()
            if now >= deadline:
                raise KafkaConnectionError(f"position of {tp.topic}-{tp.partition} unknown after the timeout")
            self._housekeeping(now)
            self._raise_errors()
            self._client.poll(min(self._retry_backoff, deadline - now))

    @_locked
    def pause(self, *partitions):
        """Stop fetching and handing out these partitions (their buffered data is kept) until ``resume``."""
        self._check_open()
        for tp in map(self._assigned, partitions):
            self._fetcher.assignment[tp].paused = True

    @_locked
    def resume(self, *partitions):
        self._check_open()
        for tp in map(self._assigned, partitions):
            self._fetcher.assignment[tp].paused = False

    # -- polling ---------------------------------------------------------------------------------------

    @_locked
    def poll(self, timeout_ms=0):
        """Records ready within ``timeout_ms`` (at most ``max.poll.records``), as a list of
        ``ConsumerRecord(topic, partition, offset, timestamp, key, value, headers)``."""
        self._check_open()
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise InvalidArgumentError(f"poll timeout_ms must be a number >= 0, not {timeout_ms!r}")
        deadline = time.monotonic() + timeout_ms / 1000.0
        if self._coordinator is not None:
            self._coordinator.last_poll = time.monotonic()
        self._run_commit_callbacks()
        while True:
            now = time.monotonic()
            self._housekeeping(now)
            self._raise_errors()
            records = self._fetcher.fetched_records(self._max_poll_records)
            self._fetcher.send_fetches()        # prefetch while the application processes these
            if records or now >= deadline:
                self._client.poll(0)
                return records
            self._client.poll(self._wait(now, deadline))

    def __iter__(self):
        """Records one at a time, polling as needed, until the consumer is closed."""
        while not self._closed:
            yield from self.poll(self._retry_backoff * 1000)

    def _wait(self, now, deadline):
        wait = min(deadline - now, self._retry_backoff)
        if self._coordinator is not None:
            heartbeat = self._coordinator.time_to_next_heartbeat(now)
            if heartbeat is not None:
                wait = min(wait, heartbeat)
        return max(0.0, wait)

    def _housekeeping(self, now):
        self._metadata.poll(now)
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.poll(now)
            if coordinator.assignment_changed is not None:
                assigned, coordinator.assignment_changed = coordinator.assignment_changed, None
                self._apply_assignment(assigned)
        # Not during a rebalance (Kafka's ConsumerCoordinator skips it too): the commit goes out at the
        # first poll once the member is stable again.
        if self._auto_commit and now >= self._next_auto_commit and coordinator.ready \
                and (coordinator.stable or not self._subscribed):
            self._next_auto_commit = now + self._auto_commit_interval
            offsets = self._positions()
            if offsets:
                coordinator.commit(offsets, self._on_auto_commit)
        self._update_positions()

    def _apply_assignment(self, assigned):
        """A SyncGroup's assignment, or one a KIP-848 coordinator sent. Incremental (KIP-429, KIP-848): partitions
        taken away are committed (when auto-committing) and revoked first; then the member rejoins at once
        (KIP-429) or acknowledges in its next heartbeat (KIP-848), so that their new owner gets them. The listener
        hears of the partitions added (eager: all, as it gave up everything before joining)."""
        owned = set(self._fetcher.assignment)
        revoked = sorted(owned.difference(assigned))
        if revoked and self._coordinator.cooperative:
            self._auto_commit_before_revoke(revoked)
            self._rebalance_callback("on_partitions_revoked", revoked)
        self._fetcher.assign(assigned)
        self._offsets_in_flight.difference_update(revoked)
        self._metadata.set_topics(self._coordinator.subscription | {tp.topic for tp in assigned})
        self._coordinator.assignment_applied(assigned, revoked)
        self._rebalance_callback("on_partitions_assigned", sorted(set(assigned) - owned))

    def _on_join_prepare(self):
        """Before a rebalance's JoinGroup: commit what was handed out (when auto-committing), then give up
        the partitions, except with the cooperative protocol (KIP-429), which keeps those of topics still
        subscribed while it rejoins. Out of the group (it left, expired or was fenced, which that commit
        may be the one to learn, as in Kafka's ConsumerCoordinator), the partitions are lost instead:
        nothing is committed, and the listener's ``on_partitions_lost`` is told."""
        owned = sorted(self._fetcher.assignment)
        if self._in_group():
            self._auto_commit_before_revoke(owned)
        if not self._in_group():
            if owned:
                self._rebalance_callback("on_partitions_lost", owned)
                self._drop_partitions(owned)
            return
        if self._coordinator.cooperative:
            owned = [tp for tp in owned if tp.topic not in self._coordinator.subscription]
            if not owned:
                return
        self._rebalance_callback("on_partitions_revoked", owned)
        self._drop_partitions(owned)

    def _in_group(self):
        return self._coordinator.generation >= 0 and bool(self._coordinator.member_id)

    def _drop_partitions(self, partitions):
        dropped = set(partitions)
        self._fetcher.assign([tp for tp in self._fetcher.assignment if tp not in dropped])
        self._offsets_in_flight.difference_update(dropped)

    def _rebalance_callback(self, method, partitions):
        """Call the rebalance listener inside ``poll``; what it raises is logged, the rebalance goes on,
        and ``poll`` raises it afterwards (as Kafka's ConsumerCoordinator does)."""
        error = self._call_listener(method, partitions)
        if error is not None:
            self._errors.append(error)

    def _call_listener(self, method, partitions):
        """``method`` of the rebalance listener with ``partitions``; what it raised, wrapped, or None."""
        listener = self._listener
        if listener is None:
            return None
        callback = getattr(listener, method, None)
        if callback is None:        # Kafka's default onPartitionsLost: as revoked
            callback = listener.on_partitions_revoked
        try:
            callback(partitions)
        except Exception as exc:
            log.error("group %s: rebalance listener %s failed in %s for %s", self.config["group.id"],
                      type(listener).__name__, method, partitions, exc_info=True)
            error = KafkaError(f"the rebalance listener raised in {method}: {exc!r}")
            error.__cause__ = exc
            return error
        return None

    def _on_leave_prepare(self):
        """Before leaving the group (``unsubscribe``, ``close``): the listener gives up the partitions, as
        revoked, or lost when the member is no longer in the group or a rebalance is under way. Returns
        what the listener raised, wrapped, or None."""
        owned = sorted(self._fetcher.assignment)
        error = None
        if owned:
            in_group = self._in_group() and self._coordinator.stable
            error = self._call_listener("on_partitions_revoked" if in_group else "on_partitions_lost", owned)
        self._fetcher.assign([])
        self._offsets_in_flight.clear()
        return error

    def _auto_commit_before_revoke(self, partitions):
        if not self._auto_commit:
            return
        positions = self._positions()
        offsets = {tp: positions[tp] for tp in partitions if tp in positions}
        if offsets:
            try:
                self._commit_sync(offsets)
            except (CommitFailedError, KafkaConnectionError):
                pass        # the group moved on; the partitions' next owner starts from the last commit

    @staticmethod
    def _on_auto_commit(error):
        if error is not None:
            log.info("auto-commit failed: %s", error)

    def _update_positions(self):
        """Ask for the offsets of partitions without a position: committed (groups), else reset."""
        need_committed, need_reset = [], {}
        for tp, state in self._fetcher.assignment.items():
            if state.position is not None or tp in self._offsets_in_flight:
                continue
            if state.reset_to is not None:
                need_reset.setdefault(self._metadata.leader(tp), []).append((tp, state.reset_to))
            elif self._coordinator is not None:
                need_committed.append(tp)
            elif self._reset_strategy is None:
                self._errors.append(KafkaError(f"no offset for {tp.topic}-{tp.partition} and "
                                               f"auto.offset.reset is none (seek first)"))
            else:
                state.reset_to = self._reset_strategy
                need_reset.setdefault(self._metadata.leader(tp), []).append((tp, state.reset_to))
        if need_committed and self._coordinator.ready:
            self._offsets_in_flight.update(need_committed)
            self._coordinator.fetch_offsets(need_committed,
                                            lambda offsets, error: self._on_committed(need_committed, offsets, error))
        for leader, partitions in need_reset.items():
            if leader is not None and self._metadata.ensure_connected(leader):
                self._list_offsets(leader, partitions)

    def _on_committed(self, partitions, offsets, error):
        self._offsets_in_flight.difference_update(partitions)
        if error is not None:
            return          # asked again by the next poll
        for tp in partitions:
            state = self._fetcher.assignment.get(tp)
            if state is None or state.position is not None or state.reset_to is not None:
                continue
            offset = offsets.get(tp)
            if offset is not None:
                state.position = offset
            elif self._reset_strategy is None:
                self._errors.append(KafkaError(f"no committed offset for {tp.topic}-{tp.partition} and "
                                               f"auto.offset.reset is none (seek first)"))
            else:
                state.reset_to = self._reset_strategy

    def _list_offsets(self, leader, partitions):
        topics = {}
        for tp, timestamp in partitions:
            topics.setdefault(tp.topic, []).append(messages.ListOffsetsRequest.ListOffsetsPartition(
                partition_index=tp.partition, timestamp=timestamp, current_leader_epoch=-1, max_num_offsets=1))
        request = messages.ListOffsetsRequest(
            replica_id=-1, isolation_level=int(self.config["isolation.level"] == "read_committed"),
            topics=[messages.ListOffsetsRequest.ListOffsetsTopic(name=t, partitions=p) for t, p in topics.items()])
        asked = dict(partitions)
        self._offsets_in_flight.update(asked)
        self._client.send(leader, request, lambda r, body, error: self._on_list_offsets(asked, body, error))

    def _on_list_offsets(self, asked, body, error):
        self._offsets_in_flight.difference_update(asked)
        if error is not None:
            self._metadata.request_update()
            return
        for topic in body.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                state = self._fetcher.assignment.get(tp)
                if state is None or state.position is not None or state.reset_to != asked.get(tp):
                    continue
                if p.error_code:
                    self._metadata.request_update()
                    continue
                state.position = p.offset
                state.reset_to = None

    def _run_commit_callbacks(self):
        callbacks, self._commit_callbacks = self._commit_callbacks, []
        for callback in callbacks:
            callback()

    def _raise_errors(self):
        failure = self._client.take_authentication_failure()
        if failure is not None:         # as Kafka's consumer: poll raises it, and the next poll tries again
            raise failure
        if self._coordinator is not None and self._coordinator.failure is not None:
            raise self._coordinator.failure
        if self._errors:
            error = self._errors[0]
            self._errors.clear()
            raise error

    # -- commits ---------------------------------------------------------------------------------------

    def _positions(self):
        return {tp: s.position for tp, s in self._fetcher.assignment.items() if s.position is not None}

    def _commit_offsets(self, offsets):
        if self._coordinator is None:
            raise IllegalStateError("commits need a group.id")
        if offsets is None:
            return self._positions()
        result = {}
        for p, offset in dict(offsets).items():
            offset = getattr(offset, "offset", offset)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgumentError(f"commit offset must be an integer >= 0, not {offset!r}")
            result[self._partition(p)] = offset
        return result

    @_locked
    def commit(self, offsets=None):
        """Commit ``{partition: offset}`` (default: the positions of every assigned partition) and wait.

        Raises ``RebalanceInProgressError`` (a ``CommitFailedError``) at once, sending nothing, while the
        member rejoins its group, as Kafka's ``commitSync`` does: ``poll()`` completes the rebalance, then
        commit again. ``CommitFailedError`` when the member is out of the group (fenced, expired, or it
        missed ``max.poll.interval.ms``)."""
        self._check_open()
        offsets = self._commit_offsets(offsets)
        if offsets:
            error = self._membership_error()
            if error is not None:
                raise error
            self._commit_sync(offsets)

    def _membership_error(self):
        """A ``CommitFailedError`` when the member holds partitions of a group it is no longer in."""
        if self._subscribed and self._coordinator.generation < 0 and self._fetcher.assignment:
            return CommitFailedError("this member is no longer in its group (poll() was not called within "
                                     "max.poll.interval.ms, or the coordinator expired or fenced it): its "
                                     "partitions may have moved; the next poll() rejoins")
        return None

    def _commit_sync(self, offsets):
        deadline = time.monotonic() + self._request_timeout
        result = []
        while True:
            now = time.monotonic()
            if self._coordinator.ready:
                self._coordinator.commit(offsets, result.append)
                break
            if now >= deadline:
                raise KafkaConnectionError("no group coordinator within request.timeout.ms")
            self._metadata.poll(now)
            self._coordinator.poll(now)
            self._client.poll(min(self._retry_backoff, deadline - now))
        while not result:
            if time.monotonic() >= deadline + self._request_timeout:
                raise KafkaConnectionError("no answer to the offset commit within request.timeout.ms")
            self._client.poll(self._retry_backoff)
        if result[0] is not None:
            raise result[0]

    @_locked
    def commit_async(self, offsets=None, callback=None):
        """Send a commit; ``callback(offsets, error or None)`` runs inside a later ``poll`` (the error is a
        ``RebalanceInProgressError``, and nothing is sent, while the member rejoins its group)."""
        self._check_open()
        offsets = self._commit_offsets(offsets)
        if callback is None:
            def done(error):
                pass
        else:
            def done(error):        # the answer may be read by the heartbeat thread: the callback waits for poll
                self._commit_callbacks.append(functools.partial(callback, offsets, error))
        if not offsets:
            done(None)
        elif self._membership_error() is not None:
            done(self._membership_error())
        elif not self._coordinator.ready:
            done(CommitFailedError("the group coordinator is not known yet"))
        else:
            self._coordinator.commit(offsets, done)

    @_locked
    def committed(self, partition, timeout_ms=None):
        """The committed offset of ``partition`` for this group, or None."""
        self._check_open()
        if self._coordinator is None:
            raise IllegalStateError("committed offsets need a group.id")
        tp = self._partition(partition)
        deadline = time.monotonic() + (self._request_timeout if timeout_ms is None else timeout_ms / 1000.0)
        result = []
        while not result:
            now = time.monotonic()
            if now >= deadline:
                raise KafkaConnectionError("no committed offsets within the timeout")
            if self._coordinator.ready:
                self._coordinator.fetch_offsets([tp], lambda offsets, error: result.append((offsets, error)))
                while not result and time.monotonic() < deadline:
                    self._client.poll(self._retry_backoff)
            else:
                self._metadata.poll(now)
                self._coordinator.poll(now)
                self._client.poll(min(self._retry_backoff, deadline - now))
        offsets, error = result[0]
        if error is not None:
            raise error if isinstance(error, Exception) else KafkaConnectionError(str(error))
        return offsets.get(tp)

    # -- state and metrics -----------------------------------------------------------------------------

    @property
    def generation(self):
        """The group generation this member is in (-1 outside a group)."""
        return self._coordinator.generation if self._coordinator is not None else -1

    @_locked
    def metrics(self):
        """The pool's sensors (Kafka's MemoryPool names), fetch rates (consumer-fetch-manager names) and,
        in a group, heartbeats answered (consumer-coordinator names)."""
        fetcher = self._fetcher
        result = dict(self.pool.metrics())
        result.update({
            "fetch-rate": fetcher.fetch_rate.measure(), "fetch-total": fetcher.fetch_total,
            "records-consumed-rate": fetcher.records_rate.measure(), "records-consumed-total": fetcher.records_total,
            "bytes-consumed-rate": fetcher.bytes_rate.measure(), "bytes-consumed-total": fetcher.bytes_total,
            "buffered-bytes": fetcher.buffered_bytes,
        })
        if self._coordinator is not None:       # consumer-coordinator-metrics
            last = self._coordinator.last_heartbeat_answer
            result["heartbeat-total"] = self._coordinator.heartbeats_answered
            result["last-heartbeat-seconds-ago"] = -1.0 if last is None else time.monotonic() - last
        return result

    # -- closing ---------------------------------------------------------------------------------------

    def close(self, autocommit=True):
        """Commit (when auto-committing), give up the partitions (the rebalance listener's
        ``on_partitions_revoked``), leave the group (a static member does not: Kafka's does not either),
        release every pooled buffer, disconnect. What the listener raised is raised once closed."""
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.stop()       # before taking the lock, which the thread may be waiting for
            self._heartbeat_thread = None
        with self._lock:
            self._close(autocommit)

    def _close(self, autocommit):
        if self._closed:
            return
        error = None
        try:
            if self._coordinator is not None:
                if autocommit and self._auto_commit and self._coordinator.ready and self._membership_error() is None:
                    offsets = self._positions()
                    if offsets:
                        try:
                            self._commit_sync(offsets)
                        except (CommitFailedError, KafkaConnectionError):
                            pass
                if self._subscribed:
                    error = self._on_leave_prepare()
                    if self._coordinator.leaves_on_close:
                        self._leave_group()
        finally:
            self._closed = True
            self._fetcher.close()
            self._client.close()
        if error is not None:
            raise error

    def _leave_group(self):
        """LeaveGroup, waiting briefly for its answer so the group rebalances at once."""
        answered = []
        self._coordinator.leave(lambda *_: answered.append(True))
        deadline = time.monotonic() + min(self._request_timeout, 1.0)
        while not answered and self._coordinator.node is not None and time.monotonic() < deadline:
            self._client.poll(0.05)

    def _check_open(self):
        if self._closed:
            raise IllegalStateError("consumer is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<kmem.consumer.Consumer group={self.config['group.id']!r} assigned={len(self._fetcher.assignment)}>"
