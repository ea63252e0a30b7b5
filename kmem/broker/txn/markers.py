"""Writing transaction markers: ``TxnMarkerWriter`` (what Kafka's ``TransactionMarkerChannelManager`` sends
and ``KafkaApis.handleWriteTxnMarkersRequest`` writes, on one node).

``write(producer_id, producer_epoch, coordinator_epoch, commit, partitions)`` appends one marker (a v2
control batch, ``PartitionLog.write_txn_marker``) to each ``(topic, partition)`` and answers each with
Kafka's error code: NONE, UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist (or whose topic is
deleted while its marker is written), INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED or
KAFKA_STORAGE_ERROR as the append answers. Then
the ``__consumer_offsets`` partitions whose marker was written are handed to the group coordinator,
``handle_txn_completion(producer_id, [their partition numbers], commit)``, so the producer's transactional
offset commits there become committed (commit) or are dropped (abort) only once the marker is in the log;
should that call raise, those partitions answer UNKNOWN_SERVER_ERROR, as Kafka answers them.

Thread-safe: each partition's log serialises its appends, and the writer keeps no state of its own, so the
coordinator's timer thread and the request threads may write at once.
"""
import logging

from kmem.broker.codes import ErrorCode
from kmem.broker.group.offsets import OFFSETS_TOPIC
from kmem.errors import IllegalStateError

log = logging.getLogger(__name__)


class TxnMarkerWriter:
    """Writes transaction markers to the partitions of ``logs`` (a ``LogManager``); ``group_coordinator``
    (or None) completes the transactional offset commits of ``__consumer_offsets``."""

    def __init__(self, logs, group_coordinator):
        self.logs = logs
        self.group_coordinator = group_coordinator

    def write(self, producer_id, producer_epoch, coordinator_epoch, commit, partitions):
        """The marker of ``producer_id``'s transaction (COMMIT when ``commit``, else ABORT) in each
        ``(topic, partition)`` of ``partitions``; returns ``{(topic, partition): error code}``."""
        errors = {}
        for topic, partition in partitions:
            partition_log = self.logs.get_partition(topic, partition)
            if partition_log is None:
                errors[topic, partition] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            try:
                result = partition_log.write_txn_marker(producer_id, producer_epoch, coordinator_epoch, commit)
            except IllegalStateError:           # the topic was deleted meanwhile (its log is closed)
                errors[topic, partition] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if result.error_code != ErrorCode.NONE:
                log.warning("%s marker of producer %d (epoch %d) not written to %s-%d: %s",
                            "COMMIT" if commit else "ABORT", producer_id, producer_epoch, topic, partition,
                            result.error_message or result.error_code.name)
            errors[topic, partition] = result.error_code
        offsets_partitions = [partition for (topic, partition), error in errors.items()
                              if topic == OFFSETS_TOPIC and error == ErrorCode.NONE]
        if offsets_partitions and self.group_coordinator is not None:
            try:
                self.group_coordinator.handle_txn_completion(producer_id, offsets_partitions, commit)
            except Exception:       # seam 4 never raises; should it, the partitions say so as Kafka's do
                log.exception("completing the offsets of producer %d in %s %s failed", producer_id,
                              OFFSETS_TOPIC, offsets_partitions)
                for partition in offsets_partitions:
                    errors[OFFSETS_TOPIC, partition] = ErrorCode.UNKNOWN_SERVER_ERROR
        return errors
