"""The admin APIs of ``kmem broker`` (what ``kafka-topics``, ``kafka-configs`` and the admin clients of
kafka-python, aiokafka and confluent-kafka send), as Kafka's ``KafkaApis`` and its controller answer them
on a single node:

- CreatePartitions 0-3: a topic grows to the count asked (INVALID_PARTITIONS if not larger,
  INVALID_REPLICA_ASSIGNMENT for an assignment naming another broker, INVALID_REQUEST for the internal
  ``__consumer_offsets``, whose partition count places the groups);
- DescribeConfigs 0-4: a topic's effective settings, every topic config Kafka 3.9 defines (its overrides
  and the broker's defaults, with their source, type and, when asked, synonyms and documentation,
  ``kmem.broker.apis.config_docs``) or the broker's (resource name ``""`` or its node id);
- AlterConfigs 0-2 (the overrides are replaced as a whole) and IncrementalAlterConfigs 0-1 (SET,
  DELETE, APPEND and SUBTRACT on list settings) of topics and of KIP-714's client metrics subscriptions
  (resource type CLIENT_METRICS, ``kmem.broker.telemetry``, which DescribeConfigs describes too); the broker's
  settings are static (INVALID_REQUEST naming the setting to put in ``server.properties``);
- ListClientMetricsResources 0 (KIP-714, ``kafka-client-metrics --list``): the subscriptions' names;
- DeleteRecords 0-2 (KIP-107): the log start offset moves up, whole segments before it are deleted;
- DescribeCluster 0-1 (KIP-700): this broker, its cluster id, itself as controller and, when asked,
  the cluster's authorized operations (``kmem.broker.apis.authorized``);
- DescribeLogDirs 0-4 (KIP-113, ``kafka-log-dirs``, ``Admin.describeLogDirs``): the log directory, each partition's
  size as Kafka's ``UnifiedLog.size`` counts it (its segments' ``.log`` files), offset lag 0 (one replica, no future
  logs) and from v4 the volume's total and usable bytes (KIP-827); a directory that cannot be read is
  KAFKA_STORAGE_ERROR, as Kafka answers an offline one;
- DescribeTopicPartitions 0 (KIP-966, ``Admin.describeTopics`` by name): each topic's partitions in pages of at most
  ``response_partition_limit`` (and ``max.request.partition.size.limit``) partitions, with the cursor where the next
  page starts, as Kafka's ``DescribeTopicPartitionsRequestHandler``; this broker is every partition's leader, only
  replica and only in-sync replica, and no replica is eligible (ELR) or offline.
"""
import logging
import os
import uuid

from kmem.broker.apis.authorized import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from kmem.broker.apis.config_docs import BROKER_DOCS, TOPIC_DOCS
from kmem.broker.codes import ErrorCode, LogError, storage_error
from kmem.broker.log import validate_topic_name
from kmem.broker.log.checkpoints import uuid_bytes
from kmem.broker.log.config import TOPIC_SETTINGS
from kmem.broker.quotas import ThrottlingQuotaExceeded
from kmem.broker.telemetry import CLIENT_METRICS_RESOURCE, SUBSCRIPTION_CONFIGS, ClientMetricsConfigError
from kmem.broker.txn.state_log import INTERNAL_TOPICS
from kmem.errors import IllegalStateError
from kmem.protocol import ApiKey, messages

log = logging.getLogger(__name__)


TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4                    # Kafka's ConfigResource.Type
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3                 # Kafka's AlterConfigOp.OpType
# DescribeConfigs config sources
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG, CLIENT_METRICS_CONFIG = 1, 4, 5, 7
BROKERS_ENDPOINT, CONTROLLERS_ENDPOINT = 1, 2               # DescribeCluster endpoint types
# Kafka's ConfigDef types as DescribeConfigs v3+ numbers them
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
CONFIG_TYPES = {      # topic-level and broker-level names
    "segment.bytes": INT, "segment.ms": LONG, "segment.jitter.ms": LONG, "retention.ms": LONG,
    "retention.bytes": LONG, "max.message.bytes": INT, "message.timestamp.type": STRING,
    "message.downconversion.enable": BOOLEAN, "index.interval.bytes": INT, "segment.index.bytes": INT,
    "compression.type": STRING, "cleanup.policy": LIST, "min.insync.replicas": INT,
    "message.timestamp.before.max.ms": LONG, "message.timestamp.after.max.ms": LONG,
    "message.timestamp.difference.max.ms": LONG, "compression.gzip.level": INT, "compression.lz4.level": INT,
    "compression.zstd.level": INT, "delete.retention.ms": LONG, "min.compaction.lag.ms": LONG,
    "max.compaction.lag.ms": LONG, "min.cleanable.dirty.ratio": DOUBLE, "file.delete.delay.ms": LONG,
    "flush.messages": LONG, "flush.ms": LONG, "preallocate": BOOLEAN, "message.format.version": STRING,
    "unclean.leader.election.enable": BOOLEAN, "leader.replication.throttled.replicas": LIST,
    "follower.replication.throttled.replicas": LIST, "remote.storage.enable": BOOLEAN,
    "local.retention.ms": LONG, "local.retention.bytes": LONG, "remote.log.copy.disable": BOOLEAN,
    "remote.log.delete.on.disable": BOOLEAN,
    "metrics": LIST, "interval.ms": INT, "match": LIST,         # a client metrics subscription's (KIP-714)
    "node.id": INT, "num.partitions": INT, "auto.create.topics.enable": BOOLEAN, "producer.id.expiration.ms": INT,
    "producer.id.expiration.check.interval.ms": INT, "log.segment.bytes": INT, "log.roll.ms": LONG,
    "log.roll.hours": INT, "log.roll.jitter.ms": LONG, "log.retention.ms": LONG, "log.retention.minutes": INT,
    "log.retention.hours": INT, "log.retention.bytes": LONG, "message.max.bytes": INT,
    "log.message.timestamp.type": STRING, "log.message.downconversion.enable": BOOLEAN,
    "log.index.interval.bytes": INT, "log.index.size.max.bytes": INT, "log.cleanup.policy": LIST,
    "producer.ledger.ids": INT, "producer.state.cache.entries": INT,
    "log.cleaner.enable": BOOLEAN, "log.cleaner.threads": INT, "log.cleaner.dedupe.buffer.size": LONG,
    "log.cleaner.io.buffer.size": INT, "log.cleaner.io.buffer.load.factor": DOUBLE,
    "log.cleaner.io.max.bytes.per.second": DOUBLE, "log.cleaner.backoff.ms": LONG,
    "log.cleaner.min.cleanable.ratio": DOUBLE, "log.cleaner.delete.retention.ms": LONG,
    "log.cleaner.min.compaction.lag.ms": LONG, "log.cleaner.max.compaction.lag.ms": LONG,
    "max.request.partition.size.limit": INT,
}
# topic-level name -> the broker-level name that gives its default (Kafka's ServerTopicConfigSynonyms); the
# tiered storage switches and the replication throttles have none
BROKER_SYNONYMS = {
    "segment.bytes": "log.segment.bytes", "segment.ms": "log.roll.ms", "segment.jitter.ms": "log.roll.jitter.ms",
    "retention.ms": "log.retention.ms", "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes", "message.timestamp.type": "log.message.timestamp.type",
    "message.downconversion.enable": "log.message.downconversion.enable",
    "index.interval.bytes": "log.index.interval.bytes", "segment.index.bytes": "log.index.size.max.bytes",
    "compression.type": "compression.type", "cleanup.policy": "log.cleanup.policy",
    "min.insync.replicas": "min.insync.replicas",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "compression.gzip.level": "compression.gzip.level", "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level", "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages", "flush.ms": "log.flush.interval.ms",
    "preallocate": "log.preallocate", "message.format.version": "log.message.format.version",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "local.retention.ms": "log.local.retention.ms", "local.retention.bytes": "log.local.retention.bytes",
}

ADMIN_APIS = {
    ApiKey.CREATE_PARTITIONS: "create_partitions", ApiKey.DESCRIBE_CONFIGS: "describe_configs",
    ApiKey.ALTER_CONFIGS: "alter_configs", ApiKey.INCREMENTAL_ALTER_CONFIGS: "incremental_alter_configs",
    ApiKey.DELETE_RECORDS: "delete_records", ApiKey.DESCRIBE_CLUSTER: "describe_cluster",
    ApiKey.DESCRIBE_LOG_DIRS: "describe_log_dirs", ApiKey.DESCRIBE_TOPIC_PARTITIONS: "describe_topic_partitions",
    ApiKey.LIST_CLIENT_METRICS_RESOURCES: "list_client_metrics_resources",
}
ADMIN_VERSIONS = {
    ApiKey.CREATE_PARTITIONS: (0, 3), ApiKey.DESCRIBE_CONFIGS: (0, 4), ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1), ApiKey.DELETE_RECORDS: (0, 2), ApiKey.DESCRIBE_CLUSTER: (0, 1),
    ApiKey.DESCRIBE_LOG_DIRS: (0, 4), ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    ApiKey.LIST_CLIENT_METRICS_RESOURCES: (0, 0),
}


def config_text(value):
    """A setting's value as Kafka shows it: ``true``/``false`` for booleans."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class AdminHandlers:
    """The admin APIs over a ``LogManager`` (see the module docstring); ``endpoint(listener_name)`` gives a
    listener's advertised (host, port); ``client_metrics``: the ``ClientMetricsSubscriptions``."""

    def __init__(self, logs, node_id, endpoint, client_metrics, rack=None):
        self.logs = logs
        self.node_id = node_id
        self.rack = rack                    # broker.rack
        self.endpoint = endpoint
        self.client_metrics = client_metrics

    # --- CreatePartitions -----------------------------------------------------------------------------

    def create_partitions(self, header, request, mutation_quota=None):
        """``mutation_quota``: the client's controller mutation quota (KIP-599), the partitions each topic adds
        taken from it once the request for it is valid."""
        Result = messages.CreatePartitionsResponse.CreatePartitionsTopicResult
        response = messages.CreatePartitionsResponse(throttle_time_ms=0, results=[])
        names = [topic.name for topic in request.topics]
        for topic in request.topics:
            result = Result(name=topic.name, error_code=ErrorCode.NONE, error_message=None)
            response.results.append(result)
            try:
                self._create_partitions(topic, names.count(topic.name), request.validate_only, mutation_quota)
            except LogError as e:
                result.error_code, result.error_message = int(e.code), str(e)
            except _Refused as e:
                result.error_code, result.error_message = e.code, e.message
            except ThrottlingQuotaExceeded as e:
                result.error_code, result.error_message = ErrorCode.THROTTLING_QUOTA_EXCEEDED, str(e)
        return response

    def _create_partitions(self, topic, times_named, validate_only, mutation_quota):
        if times_named > 1:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} named twice")
        if topic.name in INTERNAL_TOPICS:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"the partition count of {topic.name} places the groups or "
                                                      "transactional ids: it cannot grow")
        info = self.logs.topics().get(topic.name)
        if info is None:
            raise LogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {topic.name!r}")
        self.logs.check_partition_count(info, topic.count)
        if topic.assignments is not None:
            if len(topic.assignments) != topic.count - info.partitions:
                raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{len(topic.assignments)} assignments for "
                                                           f"{topic.count - info.partitions} new partitions")
            if any(a.broker_ids != [self.node_id] for a in topic.assignments):
                raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                               f"every partition's only replica is broker {self.node_id}")
        if mutation_quota is not None:
            mutation_quota.record(topic.count - info.partitions)
        if not validate_only:
            self.logs.add_partitions(topic.name, topic.count)

    # --- DescribeConfigs ------------------------------------------------------------------------------

    def describe_configs(self, header, request):
        version = header.api_version
        Result = messages.DescribeConfigsResponse.DescribeConfigsResult
        response = messages.DescribeConfigsResponse(throttle_time_ms=0, results=[])
        for resource in request.resources:
            result = Result(error_code=ErrorCode.NONE, error_message=None, resource_type=resource.resource_type,
                            resource_name=resource.resource_name, configs=[])
            response.results.append(result)
            try:
                entries = self._config_entries(resource.resource_type, resource.resource_name)
            except _Refused as e:
                result.error_code, result.error_message = e.code, e.message
                continue
            wanted = resource.configuration_keys
            synonyms = version >= 1 and request.include_synonyms
            docs = (BROKER_DOCS if resource.resource_type == BROKER_RESOURCE else TOPIC_DOCS) \
                if version >= 3 and request.include_documentation else {}
            result.configs = [self._described(name, value, source, default, version, synonyms, docs.get(name))
                              for name, (value, source, default) in entries.items()
                              if wanted is None or name in wanted]
        return response

    def _config_entries(self, resource_type, name):
        """``{name: (value, source, broker default)}`` of a topic or of the broker."""
        if resource_type == TOPIC_RESOURCE:
            info = self.logs.topics().get(name)
            if info is None:
                raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            defaults = self.logs.config.default_log_config().properties()
            effective = self.logs.config.topic_config(info.configs).properties()
            return {key: (value, DYNAMIC_TOPIC_CONFIG if key in info.configs else DEFAULT_CONFIG, defaults.get(key))
                    for key, value in effective.items()}
        if resource_type == BROKER_RESOURCE:
            self._check_broker_name(name)
            return {key: (value, STATIC_BROKER_CONFIG, None) for key, value in self.logs.config.properties().items()}
        if resource_type == CLIENT_METRICS_RESOURCE:
            if not name:
                raise _Refused(ErrorCode.INVALID_REQUEST, "a client metrics subscription's name must not be empty")
            return {key: (value, CLIENT_METRICS_CONFIG, None)
                    for key, value in self.client_metrics.configs(name).items()}
        raise _Refused(ErrorCode.INVALID_REQUEST,
                       f"resource type {resource_type} is not served (topics 2, the broker 4, client metrics 16)")

    def _check_broker_name(self, name):
        if name not in ("", str(self.node_id)):
            raise _Refused(ErrorCode.INVALID_REQUEST, f"this broker's id is {self.node_id}, not {name!r}")

    def _described(self, name, value, source, default, version, with_synonyms, documentation):
        Config = messages.DescribeConfigsResponse.DescribeConfigsResourceResult
        Synonym = messages.DescribeConfigsResponse.DescribeConfigsSynonym
        synonyms = []
        if with_synonyms:
            if source == DYNAMIC_TOPIC_CONFIG:
                synonyms.append(Synonym(name=name, value=config_text(value), source=source))
            if default is not None and name in BROKER_SYNONYMS:
                synonyms.append(Synonym(name=BROKER_SYNONYMS[name], value=config_text(default),
                                        source=DEFAULT_CONFIG))
        return Config(name=name, value=config_text(value), read_only=source == STATIC_BROKER_CONFIG,
                      is_default=source == DEFAULT_CONFIG, config_source=source, is_sensitive=False,
                      synonyms=synonyms, config_type=CONFIG_TYPES.get(name, STRING) if version >= 3 else 0,
                      documentation=documentation)

    # --- AlterConfigs, IncrementalAlterConfigs --------------------------------------------------------

    def alter_configs(self, header, request):
        return self._alter(messages.AlterConfigsResponse, request,
                           lambda resource, current, kind: {c.name: c.value for c in resource.configs})

    def incremental_alter_configs(self, header, request):
        return self._alter(messages.IncrementalAlterConfigsResponse, request, _apply_operations)

    def _alter(self, response_class, request, new_overrides):
        """Each resource's new overrides are ``new_overrides(resource, current overrides, "topic" or "client
        metrics")``."""
        response = response_class(throttle_time_ms=0, responses=[])
        for resource in request.resources:
            result = response_class.AlterConfigsResourceResponse(
                error_code=ErrorCode.NONE, error_message=None, resource_type=resource.resource_type,
                resource_name=resource.resource_name)
            response.responses.append(result)
            try:
                if resource.resource_type == BROKER_RESOURCE:
                    self._check_broker_name(resource.resource_name)
                    names = ", ".join(c.name for c in resource.configs)
                    raise _Refused(ErrorCode.INVALID_REQUEST, f"kmem broker's settings are static: set {names} in "
                                                    "server.properties or with --override and restart")
                if resource.resource_type == CLIENT_METRICS_RESOURCE:
                    name = resource.resource_name
                    configs = new_overrides(resource, self.client_metrics.configs(name), "client metrics")
                    self.client_metrics.alter(name, configs, validate_only=request.validate_only)
                    continue
                if resource.resource_type != TOPIC_RESOURCE:
                    raise _Refused(ErrorCode.INVALID_REQUEST, f"resource type {resource.resource_type} is not served")
                info = self.logs.topics().get(resource.resource_name)
                if info is None:
                    raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {resource.resource_name!r}")
                overrides = new_overrides(resource, dict(info.configs), "topic")
                self.logs.set_topic_configs(resource.resource_name, overrides, validate_only=request.validate_only)
            except LogError as e:
                result.error_code, result.error_message = int(e.code), str(e)
            except _Refused as e:
                result.error_code, result.error_message = e.code, e.message
            except ClientMetricsConfigError as e:
                result.error_code, result.error_message = ErrorCode.INVALID_CONFIG, str(e)
        return response

    def list_client_metrics_resources(self, header, request):
        Response = messages.ListClientMetricsResourcesResponse
        return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, client_metrics_resources=[
            Response.ClientMetricsResource(name=name) for name in self.client_metrics.names()])

    # --- DeleteRecords --------------------------------------------------------------------------------

    def delete_records(self, header, request):
        Response = messages.DeleteRecordsResponse
        response = Response(throttle_time_ms=0, topics=[])
        for topic in request.topics:
            topic_result = Response.DeleteRecordsTopicResult(name=topic.name, partitions=[])
            response.topics.append(topic_result)
            for wanted in topic.partitions:
                result = Response.DeleteRecordsPartitionResult(partition_index=wanted.partition_index,
                                                               low_watermark=-1, error_code=ErrorCode.NONE)
                topic_result.partitions.append(result)
                if topic.name in INTERNAL_TOPICS:      # Kafka refuses internal topics
                    result.error_code = ErrorCode.INVALID_TOPIC_EXCEPTION
                    continue
                partition_log = self.logs.get_partition(topic.name, wanted.partition_index)
                if partition_log is None:
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                try:
                    result.low_watermark = partition_log.delete_records_before(wanted.offset)
                except LogError as e:
                    result.error_code = int(e.code)
                except IllegalStateError:            # the topic was deleted meanwhile
                    result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                except OSError as e:                 # deleting a segment's files failed
                    error = storage_error(e, f"deleting records of {topic.name}-{wanted.partition_index}")
                    log.error("%s", error)
                    result.error_code = int(error.code)
        try:
            self.logs.checkpoint()                   # the new log start offsets survive a crash
        except OSError as e:        # the log start offsets moved all the same: the next retention pass writes them
            log.error("%s", storage_error(e, "writing the checkpoints after DeleteRecords"))
        return response

    # --- DescribeCluster ------------------------------------------------------------------------------

    def describe_cluster(self, header, request, listener_name=None):
        endpoint_type = request.endpoint_type if header.api_version >= 1 else BROKERS_ENDPOINT
        response = messages.DescribeClusterResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=endpoint_type,
            cluster_id=self.logs.cluster_id, controller_id=self.node_id, brokers=[])
        if endpoint_type == CONTROLLERS_ENDPOINT:        # as Kafka's AuthHelper answers on a broker listener
            response.error_code = ErrorCode.MISMATCHED_ENDPOINT_TYPE
            response.error_message = "The request was sent to an endpoint of type BROKER, but we wanted CONTROLLER"
            return response
        if endpoint_type != BROKERS_ENDPOINT:
            response.error_code = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
            response.error_message = f"Unsupported endpoint type {endpoint_type}"
            return response
        if request.include_cluster_authorized_operations:
            response.cluster_authorized_operations = CLUSTER_OPERATIONS
        host, port = self.endpoint(listener_name)
        response.brokers = [messages.DescribeClusterResponse.DescribeClusterBroker(
            broker_id=self.node_id, host=host, port=port, rack=self.rack, is_fenced=False)]
        return response


    # --- DescribeLogDirs ------------------------------------------------------------------------------

    def describe_log_dirs(self, header, request):
        """The one log directory: every partition (``topics`` null) or those asked that exist here."""
        Response = messages.DescribeLogDirsResponse
        log_dir = os.path.abspath(self.logs.log_dir)
        result = Response.DescribeLogDirsResult(error_code=ErrorCode.NONE, log_dir=log_dir, topics=[])
        response = Response(throttle_time_ms=0, error_code=ErrorCode.NONE, results=[result])
        try:
            volume = os.statvfs(log_dir)
        except OSError:
            result.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            return response
        # Java's FileStore.getTotalSpace and getUsableSpace (the space an unprivileged user may fill)
        result.total_bytes, result.usable_bytes = volume.f_blocks * volume.f_frsize, volume.f_bavail * volume.f_frsize
        wanted = None if request.topics is None else {(t.topic, p) for t in request.topics for p in t.partitions}
        by_topic = {}
        for (topic, index), partition_log in sorted(self.logs.partitions().items()):
            if wanted is None or (topic, index) in wanted:
                by_topic.setdefault(topic, []).append(Response.DescribeLogDirsPartition(
                    partition_index=index, partition_size=partition_log.size_in_bytes, offset_lag=0,
                    is_future_key=False))
        result.topics = [Response.DescribeLogDirsTopic(name=name, partitions=partitions)
                         for name, partitions in by_topic.items()]
        return response

    # --- DescribeTopicPartitions ----------------------------------------------------------------------

    def describe_topic_partitions(self, header, request):
        """The topics named (all when none is), in name order from the cursor's, at most the partition limit's
        partitions; ``next_cursor`` names the first partition left out."""
        Response = messages.DescribeTopicPartitionsResponse
        response = Response(throttle_time_ms=0, topics=[], next_cursor=None)
        if not cursor_is_valid(request):      # Kafka's InvalidRequestException: every topic named refused
            response.topics = [Response.DescribeTopicPartitionsResponseTopic(
                error_code=ErrorCode.INVALID_REQUEST, name=topic.name, is_internal=False, partitions=[])
                for topic in request.topics]
            return response
        cursor = request.cursor
        every_topic = not request.topics
        topics = self.logs.topics()
        names = topics if every_topic else {topic.name for topic in request.topics}
        remaining = max(min(self.logs.config.max_request_partition_size_limit, request.response_partition_limit), 1)
        for name in sorted(n for n in names if cursor is None or n >= cursor.topic_name):
            if remaining == 0:
                response.next_cursor = Response.Cursor(topic_name=name, partition_index=0)
                break
            info = topics.get(name)
            if info is None:
                if not every_topic:
                    response.topics.append(self._unknown_topic(name))
                continue
            first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
            end = min(info.partitions, first + remaining)
            response.topics.append(Response.DescribeTopicPartitionsResponseTopic(
                error_code=ErrorCode.NONE, name=name, topic_id=uuid.UUID(bytes=uuid_bytes(info.topic_id)),
                is_internal=name in INTERNAL_TOPICS, topic_authorized_operations=TOPIC_OPERATIONS,
                partitions=[self._described_partition(name, index) for index in range(first, end)]))
            if end < info.partitions:
                response.next_cursor = Response.Cursor(topic_name=name, partition_index=end)
                break
            remaining -= max(end - first, 0)
        return response

    @staticmethod
    def _unknown_topic(name):
        try:
            validate_topic_name(name)
            error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        except LogError as e:
            error = e.code
        return messages.DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic(
            error_code=error, name=name, is_internal=name in INTERNAL_TOPICS, partitions=[],
            topic_authorized_operations=TOPIC_OPERATIONS)

    def _described_partition(self, topic, index):
        partition_log = self.logs.get_partition(topic, index)
        node = self.node_id
        return messages.DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponsePartition(
            error_code=ErrorCode.NONE, partition_index=index, leader_id=node,
            leader_epoch=partition_log.leader_epoch if partition_log is not None else 0, replica_nodes=[node],
            isr_nodes=[node], eligible_leader_replicas=[], last_known_elr=[], offline_replicas=[])


def cursor_is_valid(request):
    """Whether a DescribeTopicPartitions request's cursor is one Kafka accepts (else INVALID_REQUEST): none, or
    one naming one of the topics named (any name when none is) with a partition index not negative."""
    cursor = request.cursor
    if cursor is None:
        return True
    named = not request.topics or cursor.topic_name in {topic.name for topic in request.topics}
    return named and cursor.partition_index >= 0


_CONFIG_NAMES = {"topic": TOPIC_SETTINGS, "client metrics": SUBSCRIPTION_CONFIGS}


class _Refused(Exception):
    """A resource answered with an error code of this module (not the storage layer's)."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def _apply_operations(resource, overrides, kind):
    """IncrementalAlterConfigs: Kafka's SET, DELETE, APPEND and SUBTRACT on a topic's overrides, or a client metrics
    subscription's configs (``kind``: "topic" or "client metrics")."""
    for config in resource.configs:
        name, op, value = config.name, config.config_operation, config.value
        if name not in _CONFIG_NAMES[kind] and op != DELETE:
            raise _Refused(ErrorCode.INVALID_CONFIG, f"unknown {kind} config {name!r}")
        if op == SET:
            overrides[name] = value
        elif op == DELETE:
            overrides.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if CONFIG_TYPES.get(name) != LIST:
                raise _Refused(ErrorCode.INVALID_CONFIG, f"{name} is not a list: APPEND and SUBTRACT do not apply")
            items = [v for v in str(overrides.get(name, "")).split(",") if v]
            changes = [v.strip() for v in (value or "").split(",") if v.strip()]
            if op == APPEND:
                items += [v for v in changes if v not in items]
            else:
                items = [v for v in items if v not in changes]
            overrides[name] = ",".join(items)
        else:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"unknown operation {op} on {name}")
    return overrides
