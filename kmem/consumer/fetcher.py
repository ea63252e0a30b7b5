"""Fetching with KIP-81's bound: responses live in pool memory until their last record is handed out.

A fetch response is read whole into one pool buffer (the selector allocates it when the size prefix
arrives). Its partitions become ``CompletedFetch``es holding views of that buffer; the buffer goes back
to the pool when the last of them is drained, seeked away or revoked - not when the response is parsed
(the flaw that sank KIP-81's last implementation: parsed records still referenced released memory).
Records are decoded, and batches decompressed, only as they are handed out, at most
``max.poll.records`` at a time.
"""
import collections
import itertools
from typing import NamedTuple

from kmem.consumer.errors import (FENCED_LEADER_EPOCH, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER,
                                  OFFSET_OUT_OF_RANGE, UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION,
                                  KafkaError, OffsetOutOfRangeError)
from kmem.errors import CorruptRecordError, InvalidReceiveError
from kmem.metrics import SampledRate
from kmem.protocol import messages
from kmem.records import ControlRecordType, MemoryRecords

EARLIEST = -2
MAX_BUFFERED_FETCHES = 2           # per partition: the one being handed out and the next
MIN_PARTITION_FETCH_BYTES = 16 << 10
LATEST = -1
_RETRIABLE_PARTITION_ERRORS = {NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE,
                               FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH}


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ConsumerRecord(NamedTuple):
    """One record handed to the application. ``headers``: list of ``(key str, value bytes or None)``."""
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list


_new_record = tuple.__new__


class PartitionState:
    __slots__ = ("position", "fetch_position", "paused", "high_watermark", "reset_to")

    def __init__(self):
        self.position = None            # next offset to hand out; None until known
        self.fetch_position = None      # next offset to fetch when data is buffered (else position)
        self.paused = False
        self.high_watermark = -1
        self.reset_to = None            # EARLIEST / LATEST while a ListOffsets lookup is due

    @property
    def next_fetch_offset(self):
        return self.position if self.fetch_position is None else self.fetch_position


class _PooledResponse:
    """One fetch response in pool memory, shared by its partitions' completed fetches."""
    __slots__ = ("receive", "pending")

    def __init__(self, receive):
        self.receive = receive
        self.pending = 0

    def release_one(self):
        self.pending -= 1
        if self.pending == 0:
            self.receive.close()
            self.receive = None


class CompletedFetch:
    """One partition's data from one response, handed out lazily (views of the pooled buffer)."""

    def __init__(self, partition, fetch_offset, records, response, aborted, read_committed, check_crcs):
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.size = len(records)
        self._response = response
        data = MemoryRecords(records)
        self.end_offset = None          # after the last complete batch: where the next fetch starts
        try:
            for batch in data.batches():
                self.end_offset = batch.next_offset
        except CorruptRecordError:
            self.end_offset = None      # no fetch ahead: handing out reaches the error and reports it
        self._batches = data.batches()
        self._records = None            # iterator over the current batch's records
        self._batch = None
        self._check_crcs = check_crcs
        self._read_committed = read_committed
        # KIP-98: aborted transactions by first offset; producers become aborted when we reach it.
        self._aborted = collections.deque(sorted(aborted, key=lambda a: a[1])) if read_committed else ()
        self._aborted_producers = set()
        self.error = None
        self.drained = False

    def take(self, state, limit, out):
        """Append up to ``limit`` records from ``state.position`` on to ``out``; updates the position."""
        position = state.position
        try:
            return self._take(position, limit, out, state)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"fetched data of {self._where(state.position)} is corrupt: {exc}") from None

    def _take(self, position, limit, out, state):
        topic, part = self.partition
        taken = 0
        while taken < limit:
            if self._records is None:
                batch = self._next_batch(position)
                if batch is None:
                    break
                if batch is False:
                    position = state.position = self._batch_end(position)
                    continue
                self._records = iter(self._batch)
            chunk = list(itertools.islice(self._records, limit - taken))
            if not chunk:
                position = state.position = self._batch_end(position)
                continue
            if chunk[0].offset < position:      # a batch that started before our position
                chunk = [r for r in chunk if r.offset >= position]
                if not chunk:
                    continue
            out.extend([_new_record(ConsumerRecord, (topic, part) + r) for r in chunk])
            taken += len(chunk)
            position = state.position = chunk[-1].offset + 1
        state.position = position
        return taken

    def _batch_end(self, position):
        end = self._batch.next_offset
        self._records = self._batch = None
        return max(position, end)

    def _next_batch(self, position):
        """The next batch to read records from; False for one skipped whole; None at the end."""
        batch = next(self._batches, None)
        if batch is None:
            self.release()
            return None
        self._batch = batch
        if batch.last_offset < position:
            return False
        if self._check_crcs and not batch.is_valid():
            raise CorruptRecordError(f"record batch {batch.base_offset}..{batch.last_offset} fails its CRC "
                                     f"(stored {batch.crc}, computed {batch.compute_checksum()})")
        if self._read_committed:
            return self._filter_transactional(batch)
        return False if batch.is_control_batch else batch

    def _filter_transactional(self, batch):
        while self._aborted and self._aborted[0][1] <= batch.last_offset:
            self._aborted_producers.add(self._aborted.popleft()[0])
        if batch.is_control_batch:
            if batch.control_type == ControlRecordType.ABORT:
                self._aborted_producers.discard(batch.producer_id)
            return False
        if batch.is_transactional and batch.producer_id in self._aborted_producers:
            return False
        return batch

    def _where(self, position):
        return f"partition {self.partition.topic}-{self.partition.partition} at offset {position}"

    def release(self):
        """Drop every view of the pooled buffer, then give our share of it back (idempotent)."""
        if self.drained:
            return
        self.drained = True
        self._batches = self._records = self._batch = None
        self._response.release_one()
        self._response = None


class Fetcher:
    """Fetch requests (one in flight per broker), completed fetches, and records handed out in order."""

    def __init__(self, client, metadata, config, pool):
        self._client = client
        self._metadata = metadata
        self._pool = pool
        self._max_wait_ms = config["fetch.max.wait.ms"]
        self._min_bytes = config["fetch.min.bytes"]
        # Brokers overshoot a fetch's limits by whole batches (KIP-74, and librdkafka's mock cluster per
        # partition): asking for at most half the pool leaves the other half for that, so a response
        # fits in one pool allocation.
        self._max_bytes = max(1, min(config["fetch.max.bytes"], config["buffer.memory"] // 2))
        self._partition_max_bytes = min(config["max.partition.fetch.bytes"], self._max_bytes) or 1
        self._read_committed = config["isolation.level"] == "read_committed"
        self._check_crcs = config["check.crcs"]
        self.assignment = {}                    # TopicPartition -> PartitionState, in fetch order
        self._completed = collections.deque()
        self._in_flight = set()                 # node ids with a fetch outstanding
        self._pending_error = None              # (completed fetch, corrupt-data error) until a seek
        self._errors = []                       # broker errors to raise from the next poll
        self._reset_strategy = {"earliest": EARLIEST, "latest": LATEST}.get(config["auto.offset.reset"])
        self.fetch_rate = SampledRate()
        self.records_rate = SampledRate()
        self.bytes_rate = SampledRate()
        self.fetch_total = self.records_total = self.bytes_total = 0

    # -- assignment ------------------------------------------------------------------------------------

    def assign(self, partitions):
        """Replace the assignment; states of partitions kept are kept, data of removed ones released."""
        old = self.assignment
        self.assignment = {tp: old.get(tp) or PartitionState() for tp in partitions}
        self._drop_completed(lambda cf: cf.partition not in self.assignment)

    def seek(self, partition, offset):
        state = self.assignment[partition]
        state.position = offset
        state.fetch_position = None
        state.reset_to = None
        self._drop_completed(lambda cf: cf.partition == partition)

    def _drop_completed(self, predicate):
        kept = collections.deque()
        for cf in self._completed:
            if predicate(cf):
                cf.release()
            else:
                kept.append(cf)
        self._completed = kept
        if self._pending_error is not None and predicate(self._pending_error[0]):
            self._pending_error = None

    def close(self):
        self._drop_completed(lambda cf: True)

    @property
    def buffered_bytes(self):
        return sum(cf.size for cf in self._completed)

    # -- fetching --------------------------------------------------------------------------------------

    def send_fetches(self):
        """Send a fetch to each broker leading fetchable partitions, unless the pool is exhausted (then
        the fetch connections are muted by the selector and nothing new is asked for)."""
        if self._pool.is_out_of_memory:
            return
        buffered = collections.Counter(cf.partition for cf in self._completed)
        behind, caught_up = [], []
        for tp, state in self.assignment.items():
            # One response per partition may wait while the one before it is handed out: the next
            # fetch is then already under way (the pool bounds both).
            if state.position is None or state.paused or buffered[tp] >= MAX_BUFFERED_FETCHES:
                continue
            offset = state.next_fetch_offset
            (caught_up if 0 <= state.high_watermark <= offset else behind).append((tp, offset))
        by_node = {}
        for tp, position in behind + caught_up:
            leader = self._metadata.leader(tp)
            if leader is not None and leader not in self._in_flight:
                by_node.setdefault(leader, []).append((tp, position))
        for node, partitions in by_node.items():
            if self._metadata.ensure_connected(node):
                # A fetch asks for at most fetch.max.bytes in all (partitions x partition limit), so a
                # broker that does not cap the whole response (Fetch < v3, librdkafka's mock cluster)
                # stays within the pool too. The limit is shared out over the partitions, down to
                # MIN_PARTITION_FETCH_BYTES each; partitions left out come first next time, and lagging
                # ones before those at their end (whose long polls return nothing).
                partition_max = min(self._partition_max_bytes,
                                    max(self._max_bytes // len(partitions), MIN_PARTITION_FETCH_BYTES))
                count = max(1, self._max_bytes // partition_max)
                self._send_fetch(node, partitions[:count], partition_max)

    def _send_fetch(self, node, partitions, partition_max):
        topics = {}
        for tp, offset in partitions:       # topics in the order of their first partition (KIP-74)
            topics.setdefault(tp.topic, []).append(messages.FetchRequest.FetchPartition(
                partition=tp.partition, fetch_offset=offset, partition_max_bytes=partition_max,
                current_leader_epoch=-1, log_start_offset=-1))
        request = messages.FetchRequest(
            replica_id=-1, max_wait_ms=self._max_wait_ms, min_bytes=self._min_bytes, max_bytes=self._max_bytes,
            isolation_level=int(self._read_committed), session_id=0, session_epoch=-1,
            topics=[messages.FetchRequest.FetchTopic(topic=t, partitions=p) for t, p in topics.items()],
            forgotten_topics_data=[], rack_id="")
        requested = dict(partitions)
        self._in_flight.add(node)
        self._client.send(node, request,
                          lambda receive, body, error: self._on_fetch(node, requested, receive, body, error),
                          keep_receive=True)
        self.fetch_total += 1
        self.fetch_rate.record(1)

    def _on_fetch(self, node, requested, receive, body, error):
        self._in_flight.discard(node)
        if error is not None:
            if isinstance(getattr(error, "reason", None), InvalidReceiveError):
                # Larger than the pool could ever grant: retrying would fail the same way.
                self._errors.append(KafkaError(f"a fetch response from broker {node} does not fit in "
                                               f"buffer.memory ({error.reason}); raise buffer.memory"))
            self._metadata.request_update()
            return
        pooled = _PooledResponse(receive)
        returned = []
        try:
            if body.error_code:
                self._metadata.request_update()
                return
            for topic in body.responses:
                for data in topic.partitions:
                    tp = TopicPartition(topic.topic, data.partition_index)
                    offset = requested.get(tp)
                    state = self.assignment.get(tp)
                    if offset is None or state is None or state.position is None \
                            or state.next_fetch_offset != offset:
                        continue        # revoked or seeked while the fetch was out
                    if self._partition_data(tp, offset, state, data, pooled):
                        returned.append(tp)
        finally:
            del body
            if pooled.pending == 0:
                receive.close()
        # KIP-74 fairness: partitions that got data go behind the others in the next fetch.
        for tp in returned:
            self.assignment[tp] = self.assignment.pop(tp)

    def _partition_data(self, tp, offset, state, data, pooled):
        code = data.error_code
        if code == 0:
            state.high_watermark = data.high_watermark
            records = data.records
            if records is not None and len(records):
                aborted = [(a.producer_id, a.first_offset) for a in data.aborted_transactions or ()]
                pooled.pending += 1
                completed = CompletedFetch(tp, offset, records, pooled, aborted, self._read_committed,
                                           self._check_crcs)
                self._completed.append(completed)
                if completed.end_offset is not None:
                    state.fetch_position = completed.end_offset
                return True
        elif code == OFFSET_OUT_OF_RANGE:
            if self._reset_strategy is None:
                self._errors.append(OffsetOutOfRangeError(tp, offset))
            else:
                self.seek(tp, None)
                state.reset_to = self._reset_strategy
        elif code in _RETRIABLE_PARTITION_ERRORS:
            self._metadata.request_update()
        else:
            self._errors.append(KafkaError(f"fetch of {tp.topic}-{tp.partition} at offset {offset} failed", code))

    # -- handing records out ---------------------------------------------------------------------------

    def fetched_records(self, max_records):
        """Up to ``max_records`` records, in fetch order; each drained fetch gives its memory back."""
        if self._errors:
            raise self._errors.pop(0)
        if self._pending_error is not None:
            raise self._pending_error[1]
        out = []
        completed = self._completed
        while completed and len(out) < max_records:
            cf = completed[0]
            state = self.assignment.get(cf.partition)
            if state is None or state.position is None or state.paused:
                if state is None or state.position is None:
                    completed.popleft().release()
                    continue
                completed.rotate(-1)        # paused: keep its data for resume
                if all(self.assignment[c.partition].paused for c in completed):
                    break
                continue
            try:
                cf.take(state, max_records - len(out), out)
            except CorruptRecordError as exc:
                # Raised by this poll if it has nothing else, else by the next; again until a seek.
                self._pending_error = (cf, exc)
                if out:
                    break
                raise
            if cf.drained:
                completed.popleft()
                self.bytes_total += cf.size
                self.bytes_rate.record(cf.size)
        if out:
            self.records_total += len(out)
            self.records_rate.record(len(out))
        return out
