"""The request handlers of ``kmem broker``: one method per API, from a decoded request body to a
response body, as Kafka's ``KafkaApis`` answers them on a single node.

Served (versions as Kafka 3.9): ApiVersions 0-4, Metadata 0-12, Produce 0-11, Fetch 0-17, ListOffsets
0-9, InitProducerId 0-5, CreateTopics 0-7, DeleteTopics 0-6, FindCoordinator 0-6 (this broker, for
groups and for transactional ids), OffsetForLeaderEpoch 0-4, the group APIs of
``kmem.broker.group.coordinator.GroupCoordinator``, the transaction APIs of
``kmem.broker.txn.coordinator.TransactionCoordinator`` and the admin APIs of ``kmem.broker.apis.admin``.
InitProducerId without a transactional id gives an idempotent producer a new producer id; with one it is
the transaction coordinator's (``Handlers.transactions``; without a coordinator it is refused
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka refuses an id its ACLs deny). A Produce carrying
transactional batches needs a transactional id, else every partition is answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (Kafka's ``handleProduceRequest``); without a transaction coordinator
(``Handlers.transactions`` None) it is refused so too, and one whose transactional batches carry more than one
producer id and epoch is answered INVALID_PRODUCER_ID_MAPPING on every partition (``handleProduceAppend``).
Otherwise each partition whose producer has no transaction open there at that epoch is verified with the
coordinator first (KIP-890 part 1, ``verify_transaction``): its error answers the partition as Kafka's
``ReplicaManager`` answers it (INVALID_PRODUCER_ID_MAPPING, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE or from
Produce v11 TRANSACTION_ABORTABLE for a partition not in the transaction; NOT_ENOUGH_REPLICAS, which every
producer retries, for a retriable one such as CONCURRENT_TRANSACTIONS while the transaction ends), and a
marker written between the verification (or the check finding the transaction open) and the append voids
it (INVALID_TXN_STATE, Kafka's ``VerificationGuard``), so no batch opens a transaction that already ended.
WriteTxnMarkers and DescribeProducers are served (see their handlers).
Topic ids are served from Metadata v12: a v10-11 request naming a topic by id is INVALID_REQUEST for every
topic, as Kafka answers it. A request naming any topic by a non-zero id is answered by its ids alone, whatever
the names beside them hold (the Java client sends ``name=""``), UNKNOWN_TOPIC_ID for an unknown one, and
creates no topic.

Fetch follows Kafka's ``KafkaApis.handleFetchRequest`` and ``ReplicaManager.readFromLog``:

- data stored as magic 2 goes out as a file region (``os.sendfile`` on plain sockets) to Fetch v4 and
  later, except small slices: a partition's slice of at most ``INLINE_RECORDS_MAX`` bytes is read into the
  response while the response's copies stay within ``FETCH_COPY_BYTES`` (one ``pread`` instead of a
  descriptor, a ``sendfile`` and a close per partition; a consumer at the tail of many partitions reads
  little from each); Fetch v0-1 get magic 0 and v2-3 magic 1 by lazy chunked down-conversion (KIP-283), unless
  ``message.downconversion.enable`` is off (UNSUPPORTED_VERSION, whatever is read); a topic whose
  ``compression.type`` is zstd is UNSUPPORTED_COMPRESSION_TYPE below Fetch v10, whatever its batches hold;
  otherwise Fetch v4-9 get zstd batches as stored and v0-3 UNSUPPORTED_COMPRESSION_TYPE when the first
  batch to convert is zstd (magic 0 and 1 have no zstd);
- KIP-74 (v3+): ``max_bytes`` bounds the response, ``partition_max_bytes`` each partition, but the first
  batch of the first non-empty partition is returned whole; before v3 a partition's limit is hard;
- long polling: with fewer than ``min_bytes`` available, the request is parked as a ``DelayedFetch`` in
  the fetch purgatory (no thread waits), completed by an append to a fetched partition or at
  ``max_wait_ms``;
- isolation_level 1 (read_committed, v4+) reads up to the last stable offset and answers the aborted
  transactions (producer id, first offset) overlapping the range read, from the ``.txnindex`` files of the
  segment read and the later ones (Kafka's ``collectAbortedTransactions``), never by reading the log; a
  parked read_committed fetch completes when the last stable offset moves (a marker). ListOffsets
  read_committed answers the last stable offset for latest, and for a timestamp no offset at or past it.
  Fetch v0-3 read uncommitted and never see a transaction marker: down-conversion skips control batches, as
  Kafka's;
- no fetch sessions (KIP-227): every response has session id 0, so clients keep sending full fetches;
- a partition listed twice is read and answered once (Kafka's ``FetchRequest.fetchData``).

Leader epochs (KIP-320): the partition's leader epoch is the one Metadata reports. OffsetForLeaderEpoch
answers from the partition's leader epoch cache (``leader-epoch-checkpoint``) as Kafka's
``LeaderEpochFileCache.endOffsetFor``: for the latest epoch, the log end offset; for an older one, the
largest epoch at or below it and the start of the next; for one below the first, itself and the first
start; -1/-1 (UNDEFINED_EPOCH) for -1, for one above every epoch and for an empty cache. The Java consumer
validates its position with it (and detects truncation) after a seek with an epoch or a committed offset.
OffsetForLeaderEpoch, ListOffsets (v4+) and Fetch (v9+) carrying a ``current_leader_epoch`` are checked as
Kafka's ``Partition.checkCurrentLeaderEpoch``: an older one is FENCED_LEADER_EPOCH, a newer one
UNKNOWN_LEADER_EPOCH (-1 is none; in Fetch any negative one).
"""
import bisect
import itertools
import logging
import time
import uuid

from kmem import _core
from kmem.broker.apis.admin import ADMIN_VERSIONS
from kmem.broker.apis.acls import ACL_VERSIONS
from kmem.broker.apis.client_quotas import QUOTA_VERSIONS
from kmem.broker.apis.authorized import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from kmem.broker.apis.purgatory import DelayedOperation, DelayedOperationPurgatory
from kmem.broker.apis.scram_admin import SCRAM_VERSIONS
from kmem.broker.codes import ErrorCode, LogError, storage_error
from kmem.broker.group.coordinator import GROUP_VERSIONS
from kmem.broker.log import READ_COMMITTED, READ_UNCOMMITTED, validate_topic_name
from kmem.broker.log.checkpoints import uuid_bytes, uuid_string
from kmem.broker.log.unified_log import EARLIEST_LOCAL_TIMESTAMP, EARLIEST_TIMESTAMP, TRANSACTION_OPEN
from kmem.broker.quotas import ThrottlingQuotaExceeded
from kmem.broker.txn.state_log import INTERNAL_TOPICS
from kmem.errors import ConfigError, CorruptRecordError, IllegalStateError, UnsupportedCompressionTypeError
from kmem.metrics import (ALL_TOPICS, BYTES_IN, BYTES_OUT, FAILED_FETCH, FAILED_PRODUCE, MESSAGES_IN, TOTAL_FETCH,
                          TOTAL_PRODUCE, broker_topic_stats)
from kmem.protocol import ApiKey, messages
from kmem.protocol.codegen import INLINE_RECORDS_MAX
from kmem.records import LazyDownConvertRecords, MemoryRecords, RecordBatch, codecs, plan_fetch
from kmem.records.arguments import byte_view
from kmem.records.batches import ATTR_TRANSACTIONAL

log = logging.getLogger(__name__)

# Kafka's error codes answered here beyond the storage layer's (kmem.broker.codes)

# What this broker answers; everything else is refused (and not advertised).
SERVED_VERSIONS = {
    ApiKey.API_VERSIONS: (0, 4), ApiKey.METADATA: (0, 12), ApiKey.PRODUCE: (0, 11), ApiKey.FETCH: (0, 17),
    ApiKey.LIST_OFFSETS: (0, 9), ApiKey.INIT_PRODUCER_ID: (0, 5), ApiKey.CREATE_TOPICS: (0, 7),
    ApiKey.DELETE_TOPICS: (0, 6), ApiKey.FIND_COORDINATOR: (0, 6), ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 4),
    **GROUP_VERSIONS, **ADMIN_VERSIONS, **SCRAM_VERSIONS, **ACL_VERSIONS, **QUOTA_VERSIONS,
    ApiKey.WRITE_TXN_MARKERS: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 4),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 4),
    ApiKey.SASL_HANDSHAKE: (0, 1), ApiKey.SASL_AUTHENTICATE: (0, 2),
}
# KIP-848's APIs, served when group.coordinator.rebalance.protocols lists consumer
CONSUMER_GROUP_APIS = frozenset({ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE})
GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE = 0, 1         # FindCoordinator key types (2, share groups, is not served)
ZERO_UUID = uuid.UUID(int=0)
NO_EPOCH = UNDEFINED_EPOCH_OFFSET = -1     # Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH, UNDEFINED_EPOCH(_OFFSET)
#: At most this many bytes of a Fetch response's records are copied into it (small slices; the rest is sent
#: from the files): what a response pending on a slow client holds in memory.
FETCH_COPY_BYTES = 1 << 20
MAGIC_OFFSET = 16                  # of a batch's magic byte
ATTRIBUTES_OFFSET = 21             # of a v2 batch's attributes (int16)
# Kafka's ReplicaManager.handleProduceAppend answers a transaction verification failing with one of these retriable
# codes, which older producers may not retry, NOT_ENOUGH_REPLICAS: every producer retries it, without a metadata
# refresh.
RETRIABLE_VERIFICATION_ERRORS = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                           ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})


# Errors Kafka's ReplicaManager answers a partition without counting a failed request (FailedProduceRequestsPerSec,
# FailedFetchRequestsPerSec): the partition is not there, or the records are too large or corrupt, or the disk fails
PRODUCE_ERRORS_NOT_FAILED = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.MESSAGE_TOO_LARGE,
                                       ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.CORRUPT_MESSAGE,
                                       ErrorCode.KAFKA_STORAGE_ERROR})
FETCH_ERRORS_NOT_FAILED = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_LEADER_EPOCH,
                                     ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR,
                                     ErrorCode.OFFSET_OUT_OF_RANGE})


def served_versions(group_config):
    """``SERVED_VERSIONS`` without KIP-848's APIs unless ``group.coordinator.rebalance.protocols`` lists consumer."""
    if "consumer" in group_config.rebalance_protocols:
        return SERVED_VERSIONS
    return {key: versions for key, versions in SERVED_VERSIONS.items() if key not in CONSUMER_GROUP_APIS}


def protocol_uuid(text):
    """A storage topic id (Kafka's base64 ``Uuid`` string) as the protocol's ``uuid.UUID``."""
    return uuid.UUID(bytes=uuid_bytes(text))


class Handlers:
    """Answers decoded requests from a ``LogManager``; ``endpoint(listener_name)`` gives the (host, port) advertised
    to the clients of a listener."""

    #: The transaction coordinator (``verify_transaction`` of Produce's transactional batches), set by the
    #: server; None: transactional batches are refused.
    transactions = None
    #: The ``TxnMarkerWriter`` WriteTxnMarkers writes with, set by the server.
    txn_markers = None
    #: What ApiVersions advertises and the dispatcher serves (``served_versions``), set by the server.
    served = SERVED_VERSIONS

    def __init__(self, logs, node_id, endpoint, timer, *, lazy_chunk_size=None, rack=None):
        self.logs = logs
        self.node_id = node_id
        self.rack = rack                    # broker.rack
        self.endpoint = endpoint
        self.lazy_chunk_size = lazy_chunk_size
        self._api_keys = None, []       # (the served dict, ApiVersionsResponse entries made from it)
        self._fetch_plans = {}          # (Fetch version, topic compression, down-conversion, follower) -> FetchPlan
        self.closing = False
        self.fetch_purgatory = DelayedOperationPurgatory("Fetch", timer)
        self.topic_stats = broker_topic_stats()     # Kafka's BrokerTopicMetrics, counted as requests are answered
        logs.add_listener(self.fetch_purgatory.check_and_complete)

    def complete_all(self):
        """Shutdown: every parked fetch is answered now with what is there."""
        self.closing = True
        self.fetch_purgatory.complete_all()

    # --- ApiVersions, FindCoordinator -------------------------------------------------------------------

    def api_versions(self, header, request):
        # The entries are made once per ``served`` (set at start), as every connection asks for them first.
        served, listed = self._api_keys
        if served is not self.served:
            listed = [messages.ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
                      for key, (low, high) in sorted(self.served.items())]
            self._api_keys = self.served, listed
        return messages.ApiVersionsResponse(error_code=ErrorCode.NONE, throttle_time_ms=0, api_keys=list(listed))

    def sasl_handshake(self, header, request):
        """A handshake that reaches the broker comes on a listener without SASL, or after authentication: Kafka's
        ``KafkaApis`` answers ILLEGAL_SASL_STATE (the authenticator of a SASL listener answers the others)."""
        return messages.SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])

    def sasl_authenticate(self, header, request):
        return messages.SaslAuthenticateResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE, auth_bytes=b"", session_lifetime_ms=0,
            error_message="SaslAuthenticate request received after successful authentication")

    def find_coordinator(self, header, request, listener_name=None):
        """Every group's and every transactional id's coordinator is this broker (``__transaction_state`` is
        created first, on an io thread: see ``kmem.broker.apis.dispatch``). Without a transaction coordinator
        a transactional id is refused as Kafka refuses one its ACLs deny (TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        which clients take as fatal). Any other key type is INVALID_REQUEST (share groups, KIP-932, are
        Kafka 4's)."""
        key_type = request.key_type if header.api_version >= 1 else GROUP_KEY_TYPE
        error, message = ErrorCode.NONE, None
        if key_type == TRANSACTION_KEY_TYPE and self.transactions is None:
            error, message = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "kmem broker serves no transactions here"
        elif key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
            error, message = ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}"
        if error:
            node, host, port = -1, "", -1
        else:
            node, (host, port) = self.node_id, self.endpoint(listener_name)
        response = messages.FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message,
                                                    node_id=node, host=host, port=port)
        keys = request.coordinator_keys if header.api_version >= 4 else []
        response.coordinators = [
            messages.FindCoordinatorResponse.Coordinator(key=key, node_id=node, host=host, port=port,
                                                         error_code=error, error_message=message)
            for key in keys]
        return response

    # --- Metadata -------------------------------------------------------------------------------------

    def metadata(self, header, request, listener_name=None):
        version = header.api_version
        if version < 12 and request.topics and any(t.name is None or t.topic_id != ZERO_UUID for t in request.topics):
            return _topic_ids_before_v12(request)
        host, port = self.endpoint(listener_name)
        response = messages.MetadataResponse(
            throttle_time_ms=0, cluster_id=self.logs.cluster_id, controller_id=self.node_id,
            brokers=[messages.MetadataResponse.MetadataResponseBroker(node_id=self.node_id, host=host, port=port,
                                                                       rack=self.rack)])
        topics = self.logs.topics()
        wanted = request.topics
        if wanted is None or (version == 0 and not wanted):
            response.topics = [self._topic_metadata(info.name, info) for info in topics.values()]
        else:
            response.topics = self._wanted_topic_metadata(version, request, topics)
        # both flags decode as False before v8, the cluster one also from v11 (KIP-430)
        if request.include_cluster_authorized_operations:
            response.cluster_authorized_operations = CLUSTER_OPERATIONS
        if request.include_topic_authorized_operations:
            for topic in response.topics:
                if topic.error_code != ErrorCode.UNKNOWN_TOPIC_ID:         # as Kafka: unknown topic ids get none
                    topic.topic_authorized_operations = TOPIC_OPERATIONS
        return response

    def metadata_creates_topics(self, version, request):
        """Whether this Metadata request would create topics (which fsyncs: run it where blocking is fine)."""
        if not (request.allow_auto_topic_creation if version >= 4 else True) \
                or not self.logs.config.auto_create_topics_enable or not request.topics:
            return False
        if _topic_ids_asked(request):
            return False
        topics = self.logs.topics()
        return any(requested.name is not None and requested.name not in topics for requested in request.topics)

    def _wanted_topic_metadata(self, version, request, topics):
        topic_ids = _topic_ids_asked(request)
        if topic_ids:
            return [self._topic_id_metadata(topic_id, topics) for topic_id in topic_ids]
        auto_create = (request.allow_auto_topic_creation if version >= 4 else True) \
            and self.logs.config.auto_create_topics_enable
        answered = []
        for requested in request.topics:
            name = requested.name
            if name is None:          # v12, with the zero id: no topic to find
                answered.append(messages.MetadataResponse.MetadataResponseTopic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None, topic_id=requested.topic_id))
                continue
            info = topics.get(name)
            if info is None and auto_create:
                try:
                    self.logs.create_topic(name)
                except LogError as e:
                    if e.code != ErrorCode.TOPIC_ALREADY_EXISTS:          # created meanwhile: fine
                        answered.append(messages.MetadataResponse.MetadataResponseTopic(
                            error_code=e.code, name=name))
                        continue
                info = self.logs.topics().get(name)
            if info is None:
                answered.append(messages.MetadataResponse.MetadataResponseTopic(
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name))
                continue
            answered.append(self._topic_metadata(name, info))
        return answered

    def _topic_id_metadata(self, topic_id, topics):
        name = self.logs.topic_name(_storage_uuid(topic_id))
        info = topics.get(name) if name is not None else None
        if info is None:
            return messages.MetadataResponse.MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None,
                                                                   topic_id=topic_id)
        return self._topic_metadata(name, info)

    def _topic_metadata(self, name, info):
        node = self.node_id
        partitions = []
        for index in range(info.partitions):
            partition_log = self.logs.get_partition(name, index)
            epoch = partition_log.leader_epoch if partition_log is not None else 0
            partitions.append(messages.MetadataResponse.MetadataResponsePartition(
                error_code=ErrorCode.NONE, partition_index=index, leader_id=node, leader_epoch=epoch,
                replica_nodes=[node], isr_nodes=[node], offline_replicas=[]))
        return messages.MetadataResponse.MetadataResponseTopic(
            error_code=ErrorCode.NONE, name=name, topic_id=protocol_uuid(info.topic_id),
            is_internal=name in INTERNAL_TOPICS, partitions=partitions)

    # --- CreateTopics, DeleteTopics -------------------------------------------------------------------

    def create_topics(self, header, request, mutation_quota=None):
        """``mutation_quota``: the client's controller mutation quota (KIP-599), each topic's partitions taken
        from it once the topic is valid (Kafka's ``ReplicationControlManager.createTopic``)."""
        response = messages.CreateTopicsResponse(throttle_time_ms=0, topics=[])
        names = [topic.name for topic in request.topics]
        for topic in request.topics:
            result = messages.CreateTopicsResponse.CreatableTopicResult(name=topic.name, error_message=None)
            response.topics.append(result)
            partitions = len(topic.assignments) if topic.assignments else topic.num_partitions
            if partitions == -1:
                partitions = self.logs.config.num_partitions
            configs = {c.name: c.value for c in topic.configs}
            if names.count(topic.name) > 1:
                result.error_code, result.error_message = ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} named twice"
                continue
            replicas = {len(a.broker_ids) for a in topic.assignments} or {topic.replication_factor}
            if replicas - {-1, 1}:
                result.error_code = ErrorCode.INVALID_REPLICATION_FACTOR
                result.error_message = "replication factor must be 1: this cluster has one broker"
                continue
            try:
                validate_new_topic(self.logs, topic.name, partitions, configs)
                if mutation_quota is not None:
                    mutation_quota.record(partitions)
                topic_id = None if request.validate_only else self.logs.create_topic(topic.name, partitions, configs)
            except LogError as e:
                result.error_code, result.error_message = int(e.code), str(e)
                continue
            except ThrottlingQuotaExceeded as e:
                result.error_code, result.error_message = ErrorCode.THROTTLING_QUOTA_EXCEEDED, str(e)
                continue
            result.num_partitions, result.replication_factor = partitions, 1
            if topic_id is not None:
                result.topic_id = protocol_uuid(topic_id)
            effective = self.logs.config.topic_config({k: v for k, v in configs.items() if v is not None})
            result.configs = [
                messages.CreateTopicsResponse.CreatableTopicConfigs(
                    name=name, value=str(value).lower() if isinstance(value, bool) else str(value), read_only=False,
                    config_source=1 if name in configs else 5, is_sensitive=False)
                for name, value in effective.properties().items()]
        return response

    def delete_topics(self, header, request, mutation_quota=None):
        """``mutation_quota``: the client's controller mutation quota (KIP-599), each topic's partitions taken
        from it before it is deleted."""
        response = messages.DeleteTopicsResponse(throttle_time_ms=0, responses=[])
        if header.api_version >= 6:
            wanted = [(t.name, t.topic_id) for t in request.topics]
        else:
            wanted = [(name, ZERO_UUID) for name in request.topic_names]
        for name, topic_id in wanted:
            result = messages.DeleteTopicsResponse.DeletableTopicResult(name=name, topic_id=topic_id,
                                                                        error_message=None)
            response.responses.append(result)
            if name is None:
                name = self.logs.topic_name(_storage_uuid(topic_id))
                if name is None:
                    result.error_code, result.error_message = ErrorCode.UNKNOWN_TOPIC_ID, f"unknown topic id {topic_id}"
                    continue
                result.name = name
            try:
                info = self.logs.topics().get(name)
                if mutation_quota is not None and info is not None:
                    mutation_quota.record(info.partitions)
                self.logs.delete_topic(name)
            except LogError as e:
                result.error_code, result.error_message = int(e.code), str(e)
                continue
            except ThrottlingQuotaExceeded as e:
                result.error_code, result.error_message = ErrorCode.THROTTLING_QUOTA_EXCEEDED, str(e)
                continue
            if info is not None:
                result.topic_id = protocol_uuid(info.topic_id)
        return response

    # --- InitProducerId -------------------------------------------------------------------------------

    def init_producer_id(self, header, request):
        if request.transactional_id is not None:
            if self.transactions is not None:
                return self.transactions.init_producer_id(header, request)
            return messages.InitProducerIdResponse(
                throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, producer_id=-1,
                producer_epoch=-1)
        # An idempotent producer always gets a new id (Kafka's ProducerIdManager), never one issued before.
        try:
            producer_id = self.logs.allocate_producer_id()
        except OSError as e:
            # The next block of ids could not be reserved on disk (a full disk). Kafka answers a producer id
            # manager without a block COORDINATOR_LOAD_IN_PROGRESS, which clients retry.
            log.error("InitProducerId: %s", storage_error(e, "reserving producer ids"))
            return messages.InitProducerIdResponse(throttle_time_ms=0, producer_id=-1, producer_epoch=-1,
                                                   error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return messages.InitProducerIdResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                               producer_id=producer_id, producer_epoch=0)

    # --- Produce --------------------------------------------------------------------------------------

    def produce(self, header, request):
        """Appends every partition's records before returning (they are views of the request's pooled
        memory, released when the handler returns). acks=0 gets no response (None)."""
        version = header.api_version
        response = _PRODUCE_LANE.produce(self, version, request)      # the common case, whole, in the core
        if response is not False:
            return response
        Partition = messages.ProduceResponse.PartitionProduceResponse
        response = messages.ProduceResponse(throttle_time_ms=0, responses=[])
        # Kafka's KafkaApis.handleProduceRequest: a request holding transactional batches needs a transactional
        # id, else it is refused as a whole. Without a transaction coordinator (``transactions`` None) every
        # such request is: its batches would hold the last stable offset back for good (no marker would come).
        # Each listing's first batch if transactional and Kafka's check of its records, made once. A partition
        # listed again is appended and answered once, with its last listing's records (Kafka keys the request's
        # partitions by TopicPartition), in its first place.
        latest, transactional = {}, False
        for topic in request.topic_data:
            for data in topic.partition_data:
                first, error = check_produce_records(version, data.records)
                transactional = transactional or first is not None
                latest[topic.name, data.index] = data, first, error
        refusal = None
        if transactional and (request.transactional_id is None or self.transactions is None):
            refusal = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, (
                "a Produce of transactional batches needs a transactional id" if self.transactions
                else "kmem broker serves no transactions here: transactional batches are refused")
        elif transactional and len(self._transactional_producers(latest)) > 1:
            # Kafka's ReplicaManager.handleProduceAppend refuses the whole request
            refusal = ErrorCode.INVALID_PRODUCER_ID_MAPPING, \
                "the transactional batches of a Produce must all be of one producer id and epoch"
        everywhere = self.topic_stats.row(ALL_TOPICS)
        for topic in request.topic_data:
            topic_response = messages.ProduceResponse.TopicProduceResponse(name=topic.name, partition_responses=[])
            response.responses.append(topic_response)
            for data in topic.partition_data:
                listing = latest.pop((topic.name, data.index), None)
                if listing is None:
                    continue
                data, first, error = listing
                result = Partition(index=data.index, error_code=ErrorCode.NONE, base_offset=-1, log_append_time_ms=-1,
                                   log_start_offset=-1)
                topic_response.partition_responses.append(result)
                if refusal:
                    result.error_code, result.error_message = refusal
                    continue
                if request.acks not in (0, 1, -1):
                    result.error_code = ErrorCode.INVALID_REQUIRED_ACKS
                    continue
                everywhere[TOTAL_PRODUCE] += 1
                if topic.name in INTERNAL_TOPICS:     # Kafka's internalTopicsAllowed=false
                    result.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
                    result.error_message = f"cannot append to internal topic {topic.name}"
                    continue
                partition_log = self.logs.get_partition(topic.name, data.index)
                if partition_log is None:
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                here = self.topic_stats.row(topic.name)
                here[TOTAL_PRODUCE] += 1
                if error:
                    result.error_code, result.error_message = error
                    _count_failed(result.error_code, PRODUCE_ERRORS_NOT_FAILED, FAILED_PRODUCE, here, everywhere)
                    continue
                try:
                    guard, error = self._verify_transaction(request, version, topic.name, data, first, partition_log)
                    if error:
                        result.error_code = ErrorCode.NOT_ENOUGH_REPLICAS if error in RETRIABLE_VERIFICATION_ERRORS \
                            else error
                        name = ErrorCode(error).name if error in ErrorCode._value2member_map_ else error
                        result.error_message = f"the transaction of {request.transactional_id!r} was not verified " \
                                               f"for {topic.name}-{data.index}: {name}"
                        continue
                    appended = partition_log.append(data.records if data.records is not None else b"",
                                                    verification_guard=guard)
                except IllegalStateError:            # the topic was deleted meanwhile
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if appended.error_code:
                    self.answer_refused_append(result, appended, topic.name, data.index, here, everywhere)
                else:
                    _PRODUCE_LANE.answer_appended(result, appended, len(data.records), here, everywhere)
        return None if request.acks == 0 else response

    @staticmethod
    def answer_refused_append(result, appended, topic, partition, here, everywhere):
        """A partition's answer (``result``) to an append its log refused (``appended``, an ``AppendResult``)."""
        result.error_code = int(appended.error_code)
        result.log_start_offset = appended.log_start_offset
        _count_failed(result.error_code, PRODUCE_ERRORS_NOT_FAILED, FAILED_PRODUCE, here, everywhere)
        result.error_message = appended.error_message
        result.record_errors = [messages.ProduceResponse.BatchIndexAndErrorMessage(
            batch_index=index, batch_index_error_message=message) for index, message in appended.record_errors]
        log.debug("produce to %s-%d refused: %s", topic, partition, appended.error_message)

    def _transactional_producers(self, partitions):
        """The ``(producer id, epoch)`` of each transactional batch Kafka's ``handleProduceAppend`` gets: those of
        ``partitions`` (``{(topic, index): (partition data, its first batch if transactional, its records' check
        error or None)}``) that exist and whose records are valid."""
        return {(batch.producer_id, batch.producer_epoch) for (topic, index), (_, batch, error) in partitions.items()
                if batch is not None and not error
                and self.logs.get_partition(topic, index) is not None}

    def _verify_transaction(self, request, version, topic, data, first, partition_log):
        """KIP-890 part 1 for one partition's transactional batch (``first``, or None when its records are not
        transactional): ``(guard for the append, error code)``. The coordinator is asked only when the producer
        has no transaction open here at this epoch; Produce v11+ may be answered TRANSACTION_ABORTABLE."""
        if first is None:
            return None, ErrorCode.NONE
        guard = partition_log.start_txn_verification(first.producer_id, first.producer_epoch)
        if guard is TRANSACTION_OPEN:
            return guard, ErrorCode.NONE
        error = self.transactions.verify_transaction(request.transactional_id, first.producer_id,
                                                     first.producer_epoch, topic, data.index,
                                                     transaction_abortable=version >= 11)
        if error:
            partition_log.cancel_txn_verification(first.producer_id, guard)
        return guard, error

    # --- WriteTxnMarkers, DescribeProducers ------------------------------------------------------------

    def write_txn_markers(self, header, request):
        """Kafka's ``handleWriteTxnMarkersRequest``: each marker written to its partitions (``TxnMarkerWriter``,
        which also completes the ``__consumer_offsets`` offsets), answered per producer id and partition. A
        producer id listed twice is answered once, its partitions' codes merged, as Kafka's map of them."""
        Response = messages.WriteTxnMarkersResponse
        by_producer = {}
        for marker in request.markers:
            partitions = [(topic.name, index) for topic in marker.topics for index in topic.partition_indexes]
            errors = self.txn_markers.write(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                            marker.transaction_result, partitions)
            by_producer.setdefault(marker.producer_id, {}).update(errors)
        results = []
        for producer_id, errors in by_producer.items():
            topics = {}
            for (name, index), error in errors.items():
                topics.setdefault(name, []).append(Response.WritableTxnMarkerPartitionResult(
                    partition_index=index, error_code=int(error)))
            results.append(Response.WritableTxnMarkerResult(producer_id=producer_id, topics=[
                Response.WritableTxnMarkerTopicResult(name=name, partitions=partitions)
                for name, partitions in topics.items()]))
        return Response(markers=results)

    def describe_producers(self, header, request):
        """Kafka's ``handleDescribeProducersRequest`` (KIP-664): each partition's active producers (those not
        expired, ``PartitionLog.active_producers``); an invalid topic name is INVALID_TOPIC_EXCEPTION, an
        unknown topic or partition UNKNOWN_TOPIC_OR_PARTITION."""
        Response = messages.DescribeProducersResponse
        response = Response(throttle_time_ms=0, topics=[])
        for topic in request.topics:
            topic_response = Response.TopicResponse(name=topic.name, partitions=[])
            response.topics.append(topic_response)
            try:
                validate_topic_name(topic.name)
                topic_error, message = ErrorCode.NONE, None
            except LogError as e:
                topic_error, message = e.code, str(e)
            for index in topic.partition_indexes:
                result = Response.PartitionResponse(partition_index=index, error_code=topic_error,
                                                    error_message=message, active_producers=[])
                topic_response.partitions.append(result)
                partition_log = None if topic_error else self.logs.get_partition(topic.name, index)
                if partition_log is None:
                    result.error_code = topic_error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                try:
                    producers = partition_log.active_producers()
                except IllegalStateError:            # the topic was deleted meanwhile
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                result.active_producers = [Response.ProducerState(
                    producer_id=entry.producer_id, producer_epoch=entry.epoch, last_sequence=entry.last_sequence,
                    last_timestamp=entry.timestamp, coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset) for entry in producers]
        return response

    # --- ListOffsets ----------------------------------------------------------------------------------

    def list_offsets(self, header, request):
        version = header.api_version
        Partition = messages.ListOffsetsResponse.ListOffsetsPartitionResponse
        response = messages.ListOffsetsResponse(throttle_time_ms=0, topics=[])
        for topic in request.topics:
            topic_response = messages.ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=[])
            response.topics.append(topic_response)
            for wanted in topic.partitions:
                result = Partition(partition_index=wanted.partition_index, error_code=ErrorCode.NONE, timestamp=-1,
                                   offset=-1, leader_epoch=-1, old_style_offsets=[])
                topic_response.partitions.append(result)
                partition_log = self.logs.get_partition(topic.name, wanted.partition_index)
                if partition_log is None:
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                result.error_code = _leader_epoch_error(partition_log, wanted.current_leader_epoch)
                if result.error_code:
                    continue
                try:
                    if wanted.timestamp == -1 and request.isolation_level == READ_COMMITTED:
                        found = (partition_log.last_stable_offset, -1)
                    else:
                        found = partition_log.offset_for_timestamp(wanted.timestamp)
                        # Kafka's Partition.fetchOffsetForTimestamp: a lookup (not of the earliest offsets)
                        # answers only what the reader can fetch, below the last stable offset for read_committed
                        if found is not None and request.isolation_level == READ_COMMITTED \
                                and wanted.timestamp not in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP) \
                                and found[0] >= partition_log.last_stable_offset:
                            found = None
                except IllegalStateError:            # the topic was deleted meanwhile
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if version == 0:
                    result.old_style_offsets = [found[0]] if found is not None and wanted.max_num_offsets > 0 else []
                elif found is not None and found[0] >= 0:
                    result.offset, result.timestamp = found
                    result.leader_epoch = partition_log.leader_epoch
        return response

    # --- OffsetForLeaderEpoch -------------------------------------------------------------------------

    def offset_for_leader_epoch(self, header, request):
        """Kafka's ``ReplicaManager.lastOffsetForLeaderEpoch`` (see the module docstring); every partition is
        led here, so an existing one is answered from its cache and any other is UNKNOWN_TOPIC_OR_PARTITION."""
        Response = messages.OffsetForLeaderEpochResponse
        response = Response(throttle_time_ms=0, topics=[])
        for topic in request.topics:
            topic_response = Response.OffsetForLeaderTopicResult(topic=topic.topic, partitions=[])
            response.topics.append(topic_response)
            for wanted in topic.partitions:
                result = Response.EpochEndOffset(partition=wanted.partition, error_code=ErrorCode.NONE,
                                                 leader_epoch=NO_EPOCH, end_offset=UNDEFINED_EPOCH_OFFSET)
                topic_response.partitions.append(result)
                partition_log = self.logs.get_partition(topic.topic, wanted.partition)
                if partition_log is None:
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                result.error_code = _leader_epoch_error(partition_log, wanted.current_leader_epoch)
                if not result.error_code:
                    result.leader_epoch, result.end_offset = _epoch_end_offset(
                        partition_log.leader_epochs, wanted.leader_epoch, partition_log.log_end_offset)
        return response

    # --- Fetch ----------------------------------------------------------------------------------------

    def fetch(self, header, request):
        version = header.api_version
        response = messages.FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, session_id=0, responses=[])
        if request.session_id != 0 or request.session_epoch > 0:
            response.error_code = ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            return response
        wanted = []                   # (topic response, request partition, PartitionLog or error code)
        topic_response = None         # as Kafka's FetchResponse: one topic per run of partitions of a topic
        for (topic_id, name, _), partition in _fetched_partitions(version, request, self.logs).items():
            if topic_response is None or (topic_response.topic_id, topic_response.topic) != (topic_id, name or ""):
                topic_response = messages.FetchResponse.FetchableTopicResponse(topic=name or "", topic_id=topic_id,
                                                                              partitions=[])
                response.responses.append(topic_response)
            if name is None:
                source = ErrorCode.UNKNOWN_TOPIC_ID
            else:
                source = self.logs.get_partition(name, partition.partition) or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            wanted.append((topic_response, partition, source))
        is_follower = (request.replica_state.replica_id if version >= 15 else request.replica_id) >= 0
        if _fetch_isolation(version, request, is_follower) not in (READ_UNCOMMITTED, READ_COMMITTED) and \
                any(not isinstance(source, int) for _, _, source in wanted):
            # Kafka's IsolationLevel.forId fails as a consumer's partitions are read: UNKNOWN_SERVER_ERROR
            return _fetch_refused(version, request, ErrorCode.UNKNOWN_SERVER_ERROR)
        results, size, errors = self._read_all(version, request, wanted, is_follower)
        if size >= request.min_bytes or errors or request.max_wait_ms <= 0 or self.closing:
            return self._fetch_response(response, wanted, results)
        # Kafka's DelayedFetch: parked until enough bytes arrive (or a segment rolls) or max_wait_ms passes
        try:
            fetched = [(source, partition, source.offset_metadata(partition.fetch_offset))
                       for _, partition, source in wanted]
        except IllegalStateError:            # a topic was deleted meanwhile: answer at once
            return self._fetch_response(response, wanted, self._read_all(version, request, wanted, is_follower)[0])
        return DelayedFetch(self, version, request, response, wanted, fetched, is_follower)

    def _fetch_response(self, response, wanted, results):
        """``response`` with ``results`` in place, its partitions counted (as Kafka's ``readFromLog`` counts them)."""
        everywhere = self.topic_stats.row(ALL_TOPICS)
        everywhere[TOTAL_FETCH] += len(results)
        counted, here = None, None
        for (topic_response, _, source), result in zip(wanted, results):
            topic_response.partitions.append(result)
            if isinstance(source, int):         # no such partition
                continue
            if topic_response is not counted:   # a topic's partitions come in a run: its row looked up once
                counted, here = topic_response, self.topic_stats.row(topic_response.topic)
            here[TOTAL_FETCH] += 1
            if result.error_code:
                _count_failed(result.error_code, FETCH_ERRORS_NOT_FAILED, FAILED_FETCH, here, everywhere)
        return response

    def fetch_sent(self, response):
        """Counts the record bytes of a consumer's Fetch ``response`` as it goes out (where Kafka's ``KafkaApis``
        counts BytesOutPerSec: not a follower's, nor those of a response a quota replaces by an empty one)."""
        total = 0
        for topic_response in response.responses:
            size = 0
            for result in topic_response.partitions:
                size += _records_size(result.records)
            if size:
                self.topic_stats.row(topic_response.topic)[BYTES_OUT] += size
                total += size
        self.topic_stats.row(ALL_TOPICS)[BYTES_OUT] += total

    def _read_all(self, version, request, wanted, is_follower):
        """One pass over the fetched partitions: ``([PartitionData], bytes returned, any error)``."""
        Partition = messages.FetchResponse.PartitionData
        results, total, errors = [], 0, False
        remaining = request.max_bytes if version >= 3 else 2**31 - 1
        first_whole = version >= 3             # KIP-74: the first batch whole; before v3 limits are hard
        isolation = _fetch_isolation(version, request, is_follower)
        copy_left = FETCH_COPY_BYTES
        for _, partition, source in wanted:
            result = Partition(partition_index=partition.partition, error_code=ErrorCode.NONE, high_watermark=-1,
                               last_stable_offset=-1, log_start_offset=-1, records=b"")
            results.append(result)
            if isinstance(source, int):
                result.error_code, errors = source, True
                continue
            result.error_code, records = self._read_partition(version, isolation, partition, source, remaining,
                                                              first_whole, is_follower, result,
                                                              min(copy_left, INLINE_RECORDS_MAX) + 1)
            if result.error_code:
                errors = True
                continue
            if records is not None:
                result.records = records
                size = _records_size(records)
                if isinstance(records, bytes):
                    copy_left -= size
                total += size
                remaining = max(remaining - size, 0)
                first_whole = first_whole and not size
        return results, total, errors

    def _read_partition(self, version, isolation, partition, partition_log, remaining, first_whole, is_follower,
                        result, copy_below):
        """``(error code, records)`` for one partition: ``bytes`` when its slice is shorter than ``copy_below`` and
        goes out as stored, else a Send, or None; fills the offsets of ``result``."""
        limit = min(partition.partition_max_bytes, remaining)
        config = partition_log.config
        # Kafka's KafkaApis decides by the topic's configs, whatever is read: zstd needs Fetch v10 when the topic
        # is zstd (otherwise the stored batches go out as they are); down-conversion may be off.
        plan_key = (version, config.compression_type, config.message_downconversion_enable, is_follower)
        plan = self._fetch_plans.get(plan_key)
        if plan is None:            # a handful of keys: the versions, codecs and flags a broker sees
            plan = self._fetch_plans[plan_key] = plan_fetch(
                version, 2, topic_compression=config.compression_type, is_follower=is_follower,
                topic_config={"message.downconversion.enable": config.message_downconversion_enable})
        if plan.error:
            return int(plan.error), None
        # FetchRequest.PartitionData: any negative current leader epoch (v9+) is none
        if partition.current_leader_epoch >= 0:
            error = _leader_epoch_error(partition_log, partition.current_leader_epoch)
            if error:
                return error, None
        try:
            data = partition_log.read(partition.fetch_offset, limit, min_one_message=first_whole, isolation=isolation,
                                      copy_below=copy_below if plan.to_magic is None else 0)
        except IllegalStateError:                    # the topic was deleted meanwhile
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
        result.high_watermark, result.last_stable_offset = data.high_watermark, data.last_stable_offset
        result.log_start_offset = data.log_start_offset
        if data.aborted_transactions is not None:
            result.aborted_transactions = [
                messages.FetchResponse.AbortedTransaction(producer_id=txn.producer_id, first_offset=txn.first_offset)
                for txn in data.aborted_transactions]
        if data.error_code:
            return int(data.error_code), None
        records = data.records
        if records is None or isinstance(records, bytes):
            return ErrorCode.NONE, records
        try:
            if plan.to_magic is None:
                return ErrorCode.NONE, records.into_send()
            chunk = {} if self.lazy_chunk_size is None else {"chunk_size": self.lazy_chunk_size}
            # The lazy records keep reading ``records`` as they are sent: not closed here.
            lazy = LazyDownConvertRecords(records, plan.to_magic, partition.fetch_offset, **chunk)
            records = None
            return ErrorCode.NONE, lazy.to_send()
        except UnsupportedCompressionTypeError:        # a zstd batch first: magic 0 and 1 cannot hold it
            result.high_watermark = result.last_stable_offset = result.log_start_offset = -1
            return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, None
        finally:
            if records is not None:
                records.close()


def _records_size(records):
    """The bytes of a Fetch result's records: read into memory, or a Send of them."""
    return len(records) if isinstance(records, bytes) else records.size


class DelayedFetch(DelayedOperation):
    """A Fetch parked until it can be answered (Kafka's ``DelayedFetch.tryComplete``): a fetched partition
    is gone; a fetch offset now lies on an older segment than the upper bound (the high watermark, or the
    last stable offset for READ_COMMITTED), after a roll or for a lagging reader; or the bytes between
    each fetch offset and its upper bound, capped at the partition's max bytes, reach ``min_bytes``.
    Otherwise it is answered at ``max_wait_ms`` with what is there. Watched by the fetched partitions'
    logs. ``start(complete)`` parks it; ``complete(build)`` is called once, when it completes, and
    ``build()`` reads the partitions and makes the response (on the client's network thread)."""

    def __init__(self, handlers, version, request, response, wanted, fetched, is_follower):
        super().__init__(time.monotonic() + request.max_wait_ms / 1000)
        self._handlers = handlers
        self._version = version
        self._request = request
        self._response = response
        self._wanted = wanted
        self._fetched = fetched         # [(PartitionLog, request partition, LogOffsetMetadata or None)]
        self._is_follower = is_follower
        self._isolation = _fetch_isolation(version, request, is_follower)
        self._complete = None

    def start(self, complete):
        self._complete = complete
        self._handlers.fetch_purgatory.try_complete_else_watch(self, [source for source, _, _ in self._fetched])

    def try_complete(self):
        accumulated = 0
        for source, partition, fetch_position in self._fetched:
            try:
                end = source.fetch_upper_bound(self._isolation)
            except IllegalStateError:              # the topic was deleted
                return self.force_complete()
            if fetch_position is None or end is None:
                return self.force_complete()       # the fetch offset left the log (records deleted)
            if end.offset == fetch_position.offset:
                continue
            if end.segment_base_offset != fetch_position.segment_base_offset:
                return self.force_complete()       # a roll, a lagging reader, or a truncation
            if fetch_position.offset < end.offset:
                accumulated += min(end.position - fetch_position.position, partition.partition_max_bytes)
        if accumulated >= self._request.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self):
        complete, self._complete = self._complete, None     # it refers back to this operation
        complete(self._build)

    def _build(self):
        # Called once: from now on the response belongs to its send alone, whoever still refers to this
        # operation (its records' descriptors go as soon as the send is written or dropped).
        wanted, response, self._wanted, self._response = self._wanted, self._response, None, None
        results, _, _ = self._handlers._read_all(self._version, self._request, wanted, self._is_follower)
        return self._handlers._fetch_response(response, wanted, results)

    def __repr__(self):
        return f"<DelayedFetch of {len(self._fetched)} partitions>"


def _count_failed(error_code, not_failed, meter, here, everywhere):
    if error_code not in not_failed:
        here[meter] += 1
        everywhere[meter] += 1


def _topic_ids_before_v12(request):
    """Kafka's ``KafkaApis.handleTopicMetadataRequest``: Metadata v10-11 can carry topic ids but not be
    answered by them (the response has no null names before v12), so such a request is refused as a whole,
    ``MetadataRequest.getErrorResponse``: INVALID_REQUEST for every topic asked, named "" if by id."""
    Topic = messages.MetadataResponse.MetadataResponseTopic
    return messages.MetadataResponse(throttle_time_ms=0, brokers=[], cluster_id=None, controller_id=-1, topics=[
        Topic(error_code=ErrorCode.INVALID_REQUEST, name=topic.name or "", topic_id=topic.topic_id, is_internal=False,
              partitions=[])
        for topic in request.topics])


def _epoch_end_offset(epochs, requested_epoch, log_end_offset):
    """Kafka's ``LeaderEpochFileCache.endOffsetFor`` over ``[(epoch, start offset)]`` in order:
    ``(epoch, end offset)``, ``(-1, -1)`` when undefined (see the module docstring)."""
    if requested_epoch == NO_EPOCH or not epochs:
        return NO_EPOCH, UNDEFINED_EPOCH_OFFSET
    if epochs[-1][0] == requested_epoch:
        return requested_epoch, log_end_offset
    higher = bisect.bisect_right(epochs, requested_epoch, key=lambda entry: entry[0])
    if higher == len(epochs):
        return NO_EPOCH, UNDEFINED_EPOCH_OFFSET
    floor_epoch = epochs[higher - 1][0] if higher else requested_epoch
    return floor_epoch, epochs[higher][1]


def _leader_epoch_error(partition_log, current_leader_epoch):
    """Kafka's ``Partition.checkCurrentLeaderEpoch``: a client's epoch older than the partition's is
    FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH; -1 (none) or the same, NONE."""
    epoch = partition_log.leader_epoch
    if current_leader_epoch == NO_EPOCH or current_leader_epoch == epoch:
        return ErrorCode.NONE
    return ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < epoch else ErrorCode.UNKNOWN_LEADER_EPOCH


def _topic_ids_asked(request):
    """Kafka's ``KafkaApis.handleTopicMetadataRequest``: a Metadata request (v12; v10-11 are refused before)
    naming any topic by a non-zero id is answered by its ids alone, once each, whatever the names hold (the
    Java client sends ``name=""`` with the id), and creates no topic. ``[]`` when it asks by name."""
    if not request.topics:
        return []
    return list(dict.fromkeys(t.topic_id for t in request.topics if t.topic_id != ZERO_UUID))


def _storage_uuid(topic_id):
    return uuid_string(topic_id.bytes)


def _fetch_isolation(version, request, is_follower):
    """The isolation level a Fetch reads at (Kafka's ``FetchIsolation.of``): a follower's is ignored."""
    return request.isolation_level if version >= 4 and not is_follower else READ_UNCOMMITTED


def _fetch_refused(version, request, error):
    """Kafka's ``FetchRequest.getErrorResponse``: ``error`` at the top and, before v13 (no top-level error
    code for older clients), in every partition asked."""
    Response = messages.FetchResponse
    topics = [] if version >= 13 else [
        Response.FetchableTopicResponse(topic=topic.topic, topic_id=topic.topic_id, partitions=[
            Response.PartitionData(partition_index=partition.partition, error_code=error, high_watermark=-1,
                                   last_stable_offset=-1, log_start_offset=-1, records=b"")
            for partition in topic.partitions])
        for topic in request.topics]
    return Response(throttle_time_ms=0, error_code=error, session_id=request.session_id, responses=topics)


def _fetched_partitions(version, request, logs):
    """Kafka's ``FetchRequest.fetchData``, every version: ``{(topic id, name, partition): request partition}``
    in request order, the name None for an unknown topic id (v13+). A partition listed again keeps its
    first place and takes the last listing's fields (offset, max bytes...): it is read and answered once."""
    fetched = {}
    for topic in request.topics:
        name = topic.topic if version < 13 else logs.topic_name(_storage_uuid(topic.topic_id))
        for partition in topic.partitions:
            fetched[(topic.topic_id, name, partition.partition)] = partition
    return fetched


# a Produce's common case (``ProduceLane``); the partitions' answers to appends that took, for every Produce
_PRODUCE_LANE = _core.ProduceLane(messages.ProduceResponse, INTERNAL_TOPICS, ALL_TOPICS,
                                  (TOTAL_PRODUCE, MESSAGES_IN, BYTES_IN), IllegalStateError,
                                  ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


def check_produce_records(version, records):
    """One partition's records in a Produce: ``(their first complete batch if it is transactional, else None;
    the error of Kafka's ProduceRequest.validateRecords as (code, message), or None)``. Kafka's
    ``RequestUtils.hasTransactionalRecords`` looks at no other batch (Produce v3+ carries one batch a
    partition); ``validateRecords``: v3+ carries exactly one batch, of magic 2; zstd needs v7+. Corrupt input is
    left to the validator, which names what is wrong. The common case (one plain v2 batch) is the core's to see."""
    if _core.plain_produce_records(records, version) or len(records) <= MAGIC_OFFSET:
        return None, None
    view = byte_view("records", records)
    magic = view[MAGIC_OFFSET]
    if version >= 3 and magic < 2:
        return None, (ErrorCode.INVALID_RECORD, f"Produce v{version} must carry magic 2 batches, not magic {magic}")
    try:
        first = _core.entry_at(view, 0)
    except CorruptRecordError:
        return None, None
    transactional = None
    try:
        # the attributes' low byte, read before making a batch of it (most are not transactional)
        if first is not None and first[1] == 2 and view[ATTRIBUTES_OFFSET + 1] & ATTR_TRANSACTIONAL:
            transactional = RecordBatch(view, 0, *first)
    except CorruptRecordError:
        pass
    try:
        # only a second complete entry (rare) has both read as batches, whose reading may find them corrupt
        if version >= 3 and first is not None and _core.entry_at(view, first[0]) is not None \
                and len(list(itertools.islice(MemoryRecords(view).batches(), 2))) > 1:
            return transactional, (ErrorCode.INVALID_RECORD,
                                   f"Produce v{version} carries exactly one record batch a partition")
        # a magic 0/1 message's codec bits can say zstd too (Sarama does below 2.1): Kafka refuses it alike
        if version < 7 and any(batch.compression == codecs.ZSTD for batch in MemoryRecords(view).batches()):
            return transactional, (ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                                   f"zstd batches need Produce v7 or later, not v{version}")
    except CorruptRecordError:
        pass
    return transactional, None


def validate_new_topic(logs, name, partitions, configs):
    """The checks ``LogManager.create_topic`` makes, creating nothing: CreateTopics makes them first (all it does
    with ``validate_only``), so a topic refused takes nothing from the client's mutation quota."""
    validate_topic_name(name)
    if partitions < 1:
        raise LogError(ErrorCode.INVALID_PARTITIONS, f"number of partitions must be at least 1: {partitions}")
    try:
        logs.config.topic_config({k: v for k, v in configs.items() if v is not None})
    except ConfigError as e:
        raise LogError(ErrorCode.INVALID_CONFIG, str(e)) from None
    if name in logs.topics():
        raise LogError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
