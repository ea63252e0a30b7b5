"""What each API checks with the authorizer, as Kafka's ``KafkaApis`` and ``AuthHelper`` do, at Kafka's level.

``RequestChecks.check(context, header, request)`` runs before the request's handler and answers one of:

- ``Refused(response)``: the request is answered as a whole, with Kafka's error (its ``getErrorResponse``):
  GROUP_AUTHORIZATION_FAILED for a JoinGroup whose group the principal may not READ,
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED for a Produce or EndTxn of a transactional id it may not WRITE,
  CLUSTER_AUTHORIZATION_FAILED...;
- a function ``finish(response)``: the topics, partitions, groups or ids the principal may not touch were taken
  out of ``request`` (the handler never sees them) and ``finish`` puts them back into the handler's response
  with their error (TOPIC_AUTHORIZATION_FAILED per partition of a Produce, Fetch, ListOffsets...), filters
  what the principal may not see (Metadata for all topics, ListGroups, ListTransactions) and fills the KIP-430
  ``authorized_operations`` fields from the ACLs;
- None: nothing to check (ApiVersions, SASL, an allowed request that needs no finishing).

Named resources that are denied are logged (Kafka's ``logIfDenied``); the resources a list is filtered by
are not.
"""
import dataclasses
import uuid

from kmem.broker.apis.admin import cursor_is_valid
from kmem.broker.apis.authorized import CLUSTER_OPERATIONS, GROUP_OPERATIONS, TOPIC_OPERATIONS
from kmem.broker.apis.handlers import check_produce_records
from kmem.broker.codes import ErrorCode
from kmem.broker.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from kmem.broker.txn.state_log import INTERNAL_TOPICS
from kmem.broker.log.checkpoints import uuid_string
from kmem.protocol import ApiKey, error_response, messages

TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, \
    ResourceType.TRANSACTIONAL_ID
GROUP_KEY, TRANSACTION_KEY = 0, 1                   # FindCoordinator key types
TOPIC_CONFIG, BROKER_CONFIG, BROKER_LOGGER_CONFIG, CLIENT_METRICS_CONFIG = 2, 4, 8, 16     # ConfigResource.Type
ZERO_UUID = uuid.UUID(int=0)
CLOSE_CONNECTION = object()         # a finish's answer: close the connection instead of answering
_OPERATIONS = {TOPIC: TOPIC_OPERATIONS, GROUP: GROUP_OPERATIONS, CLUSTER: CLUSTER_OPERATIONS}


@dataclasses.dataclass(frozen=True)
class RequestContext:
    """Who sent a request (``User:alice``), from which address (``127.0.0.1``), with which API (``Produce``)."""
    principal: str
    host: str
    api: str


@dataclasses.dataclass(frozen=True)
class Refused:
    """A request answered as a whole, without its handler."""
    response: object


class RequestChecks:
    """The authorization of every request (see the module docstring); ``logs`` names topics by their ids."""

    def __init__(self, authorizer, logs):
        self.authorizer = authorizer
        self.logs = logs
        self._checks = {
            ApiKey.METADATA: self._metadata, ApiKey.PRODUCE: self._produce, ApiKey.FETCH: self._fetch,
            ApiKey.LIST_OFFSETS: self._list_offsets, ApiKey.OFFSET_FOR_LEADER_EPOCH: self._offset_for_leader_epoch,
            ApiKey.FIND_COORDINATOR: self._find_coordinator,
            ApiKey.JOIN_GROUP: self._group_read, ApiKey.SYNC_GROUP: self._group_read,
            ApiKey.HEARTBEAT: self._group_read, ApiKey.LEAVE_GROUP: self._group_read,
            ApiKey.OFFSET_COMMIT: self._offset_commit, ApiKey.OFFSET_FETCH: self._offset_fetch,
            ApiKey.DESCRIBE_GROUPS: self._describe_groups, ApiKey.LIST_GROUPS: self._list_groups,
            ApiKey.DELETE_GROUPS: self._delete_groups, ApiKey.OFFSET_DELETE: self._offset_delete,
            ApiKey.INIT_PRODUCER_ID: self._init_producer_id, ApiKey.ADD_PARTITIONS_TO_TXN: self._add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: self._add_offsets_to_txn, ApiKey.TXN_OFFSET_COMMIT: self._txn_offset_commit,
            ApiKey.END_TXN: self._end_txn, ApiKey.WRITE_TXN_MARKERS: self._write_txn_markers,
            ApiKey.DESCRIBE_TRANSACTIONS: self._describe_transactions,
            ApiKey.LIST_TRANSACTIONS: self._list_transactions, ApiKey.DESCRIBE_PRODUCERS: self._describe_producers,
            ApiKey.CREATE_TOPICS: self._create_topics, ApiKey.DELETE_TOPICS: self._delete_topics,
            ApiKey.CREATE_PARTITIONS: self._create_partitions, ApiKey.DELETE_RECORDS: self._delete_records,
            ApiKey.DESCRIBE_CONFIGS: self._describe_configs, ApiKey.ALTER_CONFIGS: self._alter_configs,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self._alter_configs, ApiKey.DESCRIBE_CLUSTER: self._describe_cluster,
            ApiKey.DESCRIBE_ACLS: self._describe_acls, ApiKey.CREATE_ACLS: self._alter_acls,
            ApiKey.DELETE_ACLS: self._alter_acls,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self._describe_scram_users,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self._alter_scram_users,
            ApiKey.DESCRIBE_CLIENT_QUOTAS: self._describe_client_quotas,
            ApiKey.ALTER_CLIENT_QUOTAS: self._alter_client_quotas,
            ApiKey.DESCRIBE_LOG_DIRS: self._describe_log_dirs,
            ApiKey.LIST_CLIENT_METRICS_RESOURCES: self._list_client_metrics_resources,
            ApiKey.DESCRIBE_TOPIC_PARTITIONS: self._describe_topic_partitions,
            ApiKey.CONSUMER_GROUP_HEARTBEAT: self._consumer_group_heartbeat,
            ApiKey.CONSUMER_GROUP_DESCRIBE: self._consumer_group_describe,
        }

    def check(self, context, header, request):
        check = self._checks.get(header.api_key)
        return None if check is None else check(context, header.api_version, request)

    # -- AuthHelper

    def allowed(self, context, operation, resource_type, name, *, log_if_denied=True):
        return self.authorizer.authorize(context.principal, context.host, operation, resource_type, name,
                                         api=context.api, log_if_denied=log_if_denied)

    def _split(self, context, operation, resource_type, items, name_of, *, log_if_denied=True):
        """``(allowed, denied)`` items, each name asked once (``AuthHelper.filterByAuthorized``)."""
        decisions = {}
        allowed, denied = [], []
        for item in items:
            name = name_of(item)
            if name not in decisions:
                decisions[name] = self.allowed(context, operation, resource_type, name, log_if_denied=log_if_denied)
            (allowed if decisions[name] else denied).append(item)
        return allowed, denied

    def authorized_operations(self, context, resource_type, name):
        """KIP-430's bit field: the operations of ``AclEntry.supportedOperations`` the principal may do."""
        field = 0
        for operation in Operation:
            if _OPERATIONS[resource_type] >> operation & 1 and self.allowed(context, operation, resource_type, name,
                                                                             log_if_denied=False):
                field |= 1 << operation
        return field

    def _topic_name(self, topic_id):
        return self.logs.topic_name(uuid_string(topic_id.bytes))

    # -- Metadata, Produce, Fetch, ListOffsets, OffsetForLeaderEpoch

    def _metadata(self, context, version, request):
        everything = request.topics is None or (version == 0 and not request.topics)
        denied = []
        if not everything:
            # topics asked by id are named by the broker's metadata; an unknown id is left to the handler
            named = [(topic, topic.name if topic.topic_id == ZERO_UUID else self._topic_name(topic.topic_id))
                     for topic in request.topics]
            allowed, denied = self._split(context, Operation.DESCRIBE, TOPIC,
                                          [(t, n) for t, n in named if n is not None], lambda pair: pair[1])
            uncreatable = []
            auto_create = (request.allow_auto_topic_creation if version >= 4 else True) \
                and self.logs.config.auto_create_topics_enable
            missing = [pair for pair in allowed if pair[1] not in self.logs.topics()]
            if auto_create and missing and not self.allowed(context, Operation.CREATE, CLUSTER, CLUSTER_NAME,
                                                            log_if_denied=False):
                _, uncreatable = self._split(context, Operation.CREATE, TOPIC, missing, lambda pair: pair[1])
            refused = {id(t) for t, _ in denied + uncreatable}
            request.topics = [t for t in request.topics if id(t) not in refused]
            denied += uncreatable

        def finish(response):
            Topic = messages.MetadataResponse.MetadataResponseTopic
            if everything:
                response.topics = [t for t in response.topics if self.allowed(
                    context, Operation.DESCRIBE, TOPIC, t.name, log_if_denied=False)]
            for topic, name in denied:
                # the id of a topic asked by id is no secret (Kafka answers it); a name asked is not confirmed
                response.topics.append(Topic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                             name=name if topic.topic_id == ZERO_UUID else None,
                                             topic_id=topic.topic_id, is_internal=False, partitions=[]))
            if request.include_cluster_authorized_operations:
                response.cluster_authorized_operations = self.authorized_operations(context, CLUSTER, CLUSTER_NAME) \
                    if self.allowed(context, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME) else 0
            if request.include_topic_authorized_operations:
                for topic in response.topics:
                    if topic.error_code == ErrorCode.NONE:
                        topic.topic_authorized_operations = self.authorized_operations(context, TOPIC, topic.name)
            return response
        return finish

    def _produce(self, context, version, request):
        Response = messages.ProduceResponse
        # transactional batches need WRITE on their transactional id (Kafka: RequestUtils.hasTransactionalRecords)
        transactional = any(check_produce_records(version, partition.records)[0] is not None
                            for topic in request.topic_data for partition in topic.partition_data)
        if transactional and (request.transactional_id is None or not self.allowed(
                context, Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id)):
            if request.acks == 0:
                return Refused(None)
            return Refused(Response(throttle_time_ms=0, responses=[
                Response.TopicProduceResponse(name=topic.name, partition_responses=[
                    _produce_error(partition.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                    for partition in topic.partition_data]) for topic in request.topic_data]))
        request.topic_data, denied = self._split(context, Operation.WRITE, TOPIC, request.topic_data,
                                                 lambda topic: topic.name)
        if not denied:
            return None

        def finish(response):
            if response is None:            # acks=0: Kafka closes the connection of a produce with an error
                return CLOSE_CONNECTION
            response.responses += [Response.TopicProduceResponse(name=topic.name, partition_responses=[
                _produce_error(partition.index, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                for partition in topic.partition_data]) for topic in denied]
            return response
        return finish

    def _fetch(self, context, version, request):
        def name_of(topic):
            return topic.topic if version < 13 else self._topic_name(topic.topic_id)
        # an unknown topic id is the handler's UNKNOWN_TOPIC_ID
        topics = [t for t in request.topics if name_of(t) is not None]
        unknown = [t for t in request.topics if name_of(t) is None]
        if (request.replica_state.replica_id if version >= 15 else request.replica_id) >= 0:
            # a follower's fetch: CLUSTER_ACTION on the cluster, else every partition is refused
            if self.allowed(context, Operation.CLUSTER_ACTION, CLUSTER, CLUSTER_NAME):
                return None
            allowed, denied = [], topics
        else:
            allowed, denied = self._split(context, Operation.READ, TOPIC, topics, name_of)
        if not denied:
            return None
        request.topics = allowed + unknown
        if not request.topics:
            request.max_wait_ms = 0         # nothing to wait for: answered at once, as Kafka does
        Response = messages.FetchResponse

        def finish(response):
            response.responses += [Response.FetchableTopicResponse(
                topic=topic.topic, topic_id=topic.topic_id, partitions=[Response.PartitionData(
                    partition_index=p.partition, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, high_watermark=-1,
                    last_stable_offset=-1, log_start_offset=-1, records=b"") for p in topic.partitions])
                for topic in denied]
            return response
        return finish

    def _list_offsets(self, context, version, request):
        request.topics, denied = self._split(context, Operation.DESCRIBE, TOPIC, request.topics, lambda t: t.name)
        if not denied:
            return None
        Response = messages.ListOffsetsResponse

        def finish(response):
            response.topics += [Response.ListOffsetsTopicResponse(name=topic.name, partitions=[
                Response.ListOffsetsPartitionResponse(partition_index=p.partition_index, old_style_offsets=[],
                                                      error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, timestamp=-1,
                                                      offset=-1, leader_epoch=-1)
                for p in topic.partitions]) for topic in denied]
            return response
        return finish

    def _offset_for_leader_epoch(self, context, version, request):
        if self.allowed(context, Operation.CLUSTER_ACTION, CLUSTER, CLUSTER_NAME, log_if_denied=False):
            return None
        request.topics, denied = self._split(context, Operation.DESCRIBE, TOPIC, request.topics, lambda t: t.topic)
        if not denied:
            return None
        Response = messages.OffsetForLeaderEpochResponse

        def finish(response):
            response.topics += [Response.OffsetForLeaderTopicResult(topic=topic.topic, partitions=[
                Response.EpochEndOffset(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, partition=p.partition,
                                        leader_epoch=-1, end_offset=-1) for p in topic.partitions])
                for topic in denied]
            return response
        return finish

    # -- FindCoordinator and the group APIs

    def _coordinator_error(self, context, key_type, key):
        if key_type == GROUP_KEY and not self.allowed(context, Operation.DESCRIBE, GROUP, key):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED
        if key_type == TRANSACTION_KEY and not self.allowed(context, Operation.DESCRIBE, TRANSACTIONAL_ID, key):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return ErrorCode.NONE

    def _find_coordinator(self, context, version, request):
        Response = messages.FindCoordinatorResponse
        if version < 4:
            error = self._coordinator_error(context, request.key_type, request.key)
            if error:
                return Refused(Response(throttle_time_ms=0, error_code=error, error_message=None, node_id=-1, host="",
                                        port=-1))
            return None
        errors = {key: self._coordinator_error(context, request.key_type, key) for key in request.coordinator_keys}
        denied = [key for key, error in errors.items() if error]
        if not denied:
            return None
        request.coordinator_keys = [key for key in request.coordinator_keys if not errors[key]]

        def finish(response):
            response.coordinators += [Response.Coordinator(key=key, node_id=-1, host="", port=-1,
                                                           error_code=errors[key], error_message=None)
                                      for key in denied]
            return response
        return finish

    def _group_read(self, context, version, request):
        """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group, else the request is refused."""
        if self.allowed(context, Operation.READ, GROUP, request.group_id):
            return None
        return Refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)

    def _offset_commit(self, context, version, request):
        Response = messages.OffsetCommitResponse
        if not self.allowed(context, Operation.READ, GROUP, request.group_id):
            return Refused(_commit_errors(Response, request.topics, ErrorCode.GROUP_AUTHORIZATION_FAILED))
        return self._commit_topics(context, Response, request)

    def _commit_topics(self, context, Response, request):
        """An offset commit's topics: those the principal may not READ are left out of the request and answered
        TOPIC_AUTHORIZATION_FAILED beside the others."""
        request.topics, denied = self._split(context, Operation.READ, TOPIC, request.topics, lambda t: t.name)
        if not denied:
            return None

        def finish(response):
            response.topics += _commit_errors(Response, denied, ErrorCode.TOPIC_AUTHORIZATION_FAILED).topics
            return response
        return finish

    def _offset_fetch(self, context, version, request):
        """DESCRIBE on the group, then on each topic: a topic asked is TOPIC_AUTHORIZATION_FAILED, one not asked
        (every committed offset) is left out (``KafkaApis.handleOffsetFetchRequest``)."""
        Response = messages.OffsetFetchResponse
        if version < 8:
            if not self.allowed(context, Operation.DESCRIBE, GROUP, request.group_id):
                if version >= 2:
                    return Refused(Response(throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                            topics=[]))
                return Refused(Response(throttle_time_ms=0, topics=[Response.OffsetFetchResponseTopic(
                    name=topic.name, partitions=[_unauthorized_offset(Response.OffsetFetchResponsePartition, index,
                                                                      ErrorCode.GROUP_AUTHORIZATION_FAILED)
                                                 for index in topic.partition_indexes])
                    for topic in request.topics or []]))
            wanted = [(request, request.topics)]
        else:
            wanted = [(group, group.topics) for group in request.groups]
        refused_groups, denied = set(), {}
        for group, topics in wanted:
            if version >= 8 and not self.allowed(context, Operation.DESCRIBE, GROUP, group.group_id):
                refused_groups.add(group.group_id)
                continue
            if topics is not None:
                allowed, denied[group.group_id] = self._split(context, Operation.DESCRIBE, TOPIC, topics,
                                                              lambda t: t.name)
                if version < 8:
                    request.topics = allowed
                else:
                    group.topics = allowed
        if version >= 8:
            request.groups = [g for g in request.groups if g.group_id not in refused_groups]

        def finish(response):
            if version < 8:
                response.topics = self._offsets_seen(context, response.topics, request.topics is None)
                response.topics += [Response.OffsetFetchResponseTopic(name=topic.name, partitions=[
                    _unauthorized_offset(Response.OffsetFetchResponsePartition, index,
                                         ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                    for index in topic.partition_indexes]) for topic in denied.get(request.group_id, [])]
                return response
            asked_all = {group.group_id for group in request.groups if group.topics is None}
            for group in response.groups:
                group.topics = self._offsets_seen(context, group.topics, group.group_id in asked_all)
                group.topics += [Response.OffsetFetchResponseTopics(name=topic.name, partitions=[
                    _unauthorized_offset(Response.OffsetFetchResponsePartitions, index,
                                         ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                    for index in topic.partition_indexes]) for topic in denied.get(group.group_id, [])]
            response.groups += [Response.OffsetFetchResponseGroup(group_id=group_id, topics=[],
                                                                  error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
                                for group_id in sorted(refused_groups)]
            return response
        return finish

    def _offsets_seen(self, context, topics, every_topic):
        if not every_topic:
            return topics
        return [t for t in topics if self.allowed(context, Operation.DESCRIBE, TOPIC, t.name, log_if_denied=False)]

    def _describe_groups(self, context, version, request):
        allowed, denied = self._split(context, Operation.DESCRIBE, GROUP, request.groups, lambda g: g)
        request.groups = allowed
        Group = messages.DescribeGroupsResponse.DescribedGroup

        def finish(response):
            if request.include_authorized_operations:
                for group in response.groups:
                    group.authorized_operations = self.authorized_operations(context, GROUP, group.group_id)
            response.groups += [Group(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=None, group_id=g,
                                      group_state="", protocol_type="", protocol_data="", members=[])
                                for g in denied]
            return response
        return finish

    def _consumer_group_heartbeat(self, context, version, request):
        """Kafka's ``handleConsumerGroupHeartbeat``: READ on the group, DESCRIBE on every topic subscribed by name."""
        if not self.allowed(context, Operation.READ, GROUP, request.group_id):
            return Refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        names = request.subscribed_topic_names or ()
        _, denied = self._split(context, Operation.DESCRIBE, TOPIC, names, lambda name: name)
        return Refused(ErrorCode.TOPIC_AUTHORIZATION_FAILED) if denied else None

    def _consumer_group_describe(self, context, version, request):
        """DESCRIBE on each group; a denied one is answered GROUP_AUTHORIZATION_FAILED."""
        allowed, denied = self._split(context, Operation.DESCRIBE, GROUP, request.group_ids, lambda g: g)
        request.group_ids = allowed
        Group = messages.ConsumerGroupDescribeResponse.DescribedGroup

        def finish(response):
            if request.include_authorized_operations:
                for group in response.groups:
                    group.authorized_operations = self.authorized_operations(context, GROUP, group.group_id)
            response.groups += [Group(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=None, group_id=g,
                                      group_state="", group_epoch=0, assignment_epoch=0, assignor_name="", members=[])
                                for g in denied]
            return response
        return finish

    def _list_groups(self, context, version, request):
        if self.allowed(context, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME, log_if_denied=False):
            return None

        def finish(response):
            response.groups = [g for g in response.groups
                               if self.allowed(context, Operation.DESCRIBE, GROUP, g.group_id, log_if_denied=False)]
            return response
        return finish

    def _delete_groups(self, context, version, request):
        request.groups_names, denied = self._split(context, Operation.DELETE, GROUP, request.groups_names,
                                                   lambda g: g)
        if not denied:
            return None
        Result = messages.DeleteGroupsResponse.DeletableGroupResult

        def finish(response):
            response.results += [Result(group_id=g, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED) for g in denied]
            return response
        return finish

    def _offset_delete(self, context, version, request):
        if not self.allowed(context, Operation.DELETE, GROUP, request.group_id):
            return Refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        request.topics, denied = self._split(context, Operation.READ, TOPIC, request.topics, lambda t: t.name)
        if not denied:
            return None
        Response = messages.OffsetDeleteResponse

        def finish(response):
            response.topics += [Response.OffsetDeleteResponseTopic(name=topic.name, partitions=[
                Response.OffsetDeleteResponsePartition(partition_index=p.partition_index,
                                                       error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                for p in topic.partitions]) for topic in denied]
            return response
        return finish

    # -- transactions

    def _init_producer_id(self, context, version, request):
        if request.transactional_id is not None:
            if not self.allowed(context, Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id):
                return Refused(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            return None
        # an idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic (KIP-679)
        if self.allowed(context, Operation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME, log_if_denied=False) or \
                self.authorizer.authorize_by_resource_type(context.principal, context.host, Operation.WRITE, TOPIC,
                                                           api=context.api):
            return None
        return Refused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)

    def _add_partitions_to_txn(self, context, version, request):
        Response = messages.AddPartitionsToTxnResponse
        if version >= 4:        # from brokers (KIP-890): CLUSTER_ACTION
            if self.allowed(context, Operation.CLUSTER_ACTION, CLUSTER, CLUSTER_NAME):
                return None
            return Refused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)

        def every_partition(error_of):
            return Refused(Response(throttle_time_ms=0, results_by_topic_v3_and_below=[
                Response.AddPartitionsToTxnTopicResult(name=topic.name, results_by_partition=[
                    Response.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=error_of(topic))
                    for p in topic.partitions]) for topic in request.v3_and_below_topics]))
        if not self.allowed(context, Operation.WRITE, TRANSACTIONAL_ID, request.v3_and_below_transactional_id):
            return every_partition(lambda _: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        _, denied = self._split(context, Operation.WRITE, TOPIC,
                                [t for t in request.v3_and_below_topics if t.name not in INTERNAL_TOPICS],
                                lambda t: t.name)
        if not denied:
            return None
        # as Kafka: nothing is added when a topic is denied; the others are OPERATION_NOT_ATTEMPTED
        denied_names = {t.name for t in denied}
        return every_partition(lambda topic: ErrorCode.TOPIC_AUTHORIZATION_FAILED if topic.name in denied_names
                               else ErrorCode.OPERATION_NOT_ATTEMPTED)

    def _add_offsets_to_txn(self, context, version, request):
        if not self.allowed(context, Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id):
            return Refused(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not self.allowed(context, Operation.READ, GROUP, request.group_id):
            return Refused(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        return None

    def _txn_offset_commit(self, context, version, request):
        Response = messages.TxnOffsetCommitResponse
        if not self.allowed(context, Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id):
            return Refused(_commit_errors(Response, request.topics, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
        if not self.allowed(context, Operation.READ, GROUP, request.group_id):
            return Refused(_commit_errors(Response, request.topics, ErrorCode.GROUP_AUTHORIZATION_FAILED))
        return self._commit_topics(context, Response, request)

    def _end_txn(self, context, version, request):
        if self.allowed(context, Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id):
            return None
        return Refused(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)

    def _write_txn_markers(self, context, version, request):
        if self.allowed(context, Operation.ALTER, CLUSTER, CLUSTER_NAME, log_if_denied=False) or \
                self.allowed(context, Operation.CLUSTER_ACTION, CLUSTER, CLUSTER_NAME):
            return None
        return Refused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)

    def _describe_transactions(self, context, version, request):
        """DESCRIBE on each transactional id; a transaction's partitions are listed only for the topics the
        principal may DESCRIBE."""
        request.transactional_ids, denied = self._split(context, Operation.DESCRIBE, TRANSACTIONAL_ID,
                                                        request.transactional_ids, lambda i: i)
        State = messages.DescribeTransactionsResponse.TransactionState

        def finish(response):
            for state in response.transaction_states:
                state.topics = [t for t in state.topics
                                if self.allowed(context, Operation.DESCRIBE, TOPIC, t.topic, log_if_denied=False)]
            response.transaction_states += [State(
                error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, transactional_id=i, transaction_state="",
                transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])
                for i in denied]
            return response
        return finish

    def _list_transactions(self, context, version, request):
        def finish(response):
            response.transaction_states = [s for s in response.transaction_states if self.allowed(
                context, Operation.DESCRIBE, TRANSACTIONAL_ID, s.transactional_id, log_if_denied=False)]
            return response
        return finish

    def _describe_producers(self, context, version, request):
        request.topics, denied = self._split(context, Operation.READ, TOPIC, request.topics, lambda t: t.name)
        if not denied:
            return None
        Response = messages.DescribeProducersResponse

        def finish(response):
            response.topics += [Response.TopicResponse(name=topic.name, partitions=[Response.PartitionResponse(
                partition_index=p, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message=None,
                active_producers=[]) for p in topic.partition_indexes]) for topic in denied]
            return response
        return finish

    # -- the admin APIs

    def _create_topics(self, context, version, request):
        """CREATE on the cluster or each topic; a created topic's configs are told only with DESCRIBE_CONFIGS on it
        (else ``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED, KIP-525)."""
        denied = []
        if not self.allowed(context, Operation.CREATE, CLUSTER, CLUSTER_NAME, log_if_denied=False):
            request.topics, denied = self._split(context, Operation.CREATE, TOPIC, request.topics, lambda t: t.name)
        Result = messages.CreateTopicsResponse.CreatableTopicResult

        def finish(response):
            for topic in response.topics:
                if topic.error_code == ErrorCode.NONE and not self.allowed(
                        context, Operation.DESCRIBE_CONFIGS, TOPIC, topic.name, log_if_denied=False):
                    topic.topic_config_error_code, topic.configs = ErrorCode.TOPIC_AUTHORIZATION_FAILED, []
            response.topics += [Result(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                       error_message="Authorization failed.", topic_config_error_code=0,
                                       num_partitions=-1, replication_factor=-1, configs=[]) for t in denied]
            return response
        return finish

    def _delete_topics(self, context, version, request):
        Result = messages.DeleteTopicsResponse.DeletableTopicResult
        if version < 6:
            request.topic_names, denied = self._split(context, Operation.DELETE, TOPIC, request.topic_names,
                                                      lambda n: n)
            results = [Result(name=n, topic_id=ZERO_UUID, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                              error_message=None) for n in denied]
        else:
            # a topic named by id must be DESCRIBE-able before its name is told (KafkaApis.handleDeleteTopicsRequest)
            results, kept = [], []
            for topic in request.topics:
                name = topic.name if topic.name is not None else self._topic_name(topic.topic_id)
                if name is None:
                    kept.append(topic)
                elif topic.name is None and not self.allowed(context, Operation.DESCRIBE, TOPIC, name):
                    results.append(Result(name=None, topic_id=topic.topic_id,
                                          error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message=None))
                elif not self.allowed(context, Operation.DELETE, TOPIC, name):
                    results.append(Result(name=name, topic_id=topic.topic_id,
                                          error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, error_message=None))
                else:
                    kept.append(topic)
            request.topics = kept
        if not results:
            return None

        def finish(response):
            response.responses += results
            return response
        return finish

    def _create_partitions(self, context, version, request):
        request.topics, denied = self._split(context, Operation.ALTER, TOPIC, request.topics, lambda t: t.name)
        if not denied:
            return None
        Result = messages.CreatePartitionsResponse.CreatePartitionsTopicResult

        def finish(response):
            response.results += [Result(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                        error_message="The topic authorization is failed.") for t in denied]
            return response
        return finish

    def _delete_records(self, context, version, request):
        request.topics, denied = self._split(context, Operation.DELETE, TOPIC, request.topics, lambda t: t.name)
        if not denied:
            return None
        Response = messages.DeleteRecordsResponse

        def finish(response):
            response.topics += [Response.DeleteRecordsTopicResult(name=topic.name, partitions=[
                Response.DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1,
                                                      error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                for p in topic.partitions]) for topic in denied]
            return response
        return finish

    def _config_error(self, context, operation, resource):
        """None, or the error of a config resource the principal may not describe or alter (``ConfigHelper``)."""
        if resource.resource_type in (BROKER_CONFIG, BROKER_LOGGER_CONFIG, CLIENT_METRICS_CONFIG):
            if not self.allowed(context, operation, CLUSTER, CLUSTER_NAME):
                return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        elif resource.resource_type == TOPIC_CONFIG:
            if not self.allowed(context, operation, TOPIC, resource.resource_name):
                return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return None

    def _describe_configs(self, context, version, request):
        errors = [(r, self._config_error(context, Operation.DESCRIBE_CONFIGS, r)) for r in request.resources]
        denied = [(r, e) for r, e in errors if e is not None]
        if not denied:
            return None
        request.resources = [r for r, e in errors if e is None]
        Result = messages.DescribeConfigsResponse.DescribeConfigsResult

        def finish(response):
            response.results += [Result(error_code=e, error_message=None, resource_type=r.resource_type,
                                        resource_name=r.resource_name, configs=[]) for r, e in denied]
            return response
        return finish

    def _alter_configs(self, context, version, request):
        errors = [(r, self._config_error(context, Operation.ALTER_CONFIGS, r)) for r in request.resources]
        denied = [(r, e) for r, e in errors if e is not None]
        if not denied:
            return None
        request.resources = [r for r, e in errors if e is None]

        def finish(response):
            Result = type(response).AlterConfigsResourceResponse
            response.responses += [Result(error_code=e, error_message=None, resource_type=r.resource_type,
                                          resource_name=r.resource_name) for r, e in denied]
            return response
        return finish

    def _describe_cluster(self, context, version, request):
        if not request.include_cluster_authorized_operations:
            return None

        def finish(response):
            response.cluster_authorized_operations = self.authorized_operations(context, CLUSTER, CLUSTER_NAME) \
                if self.allowed(context, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME) else 0
            return response
        return finish

    def _describe_log_dirs(self, context, version, request):
        """DESCRIBE on the cluster, else no log directory (the error code is on the wire from v3)."""
        if self.allowed(context, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME):
            return None
        return Refused(messages.DescribeLogDirsResponse(
            throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results=[]))

    def _list_client_metrics_resources(self, context, version, request):
        """DESCRIBE_CONFIGS on the cluster (KIP-714)."""
        if self.allowed(context, Operation.DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME):
            return None
        return Refused(messages.ListClientMetricsResourcesResponse(
            throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, client_metrics_resources=[]))

    def _describe_topic_partitions(self, context, version, request):
        """DESCRIBE on each topic, before the partition limit counts (``DescribeTopicPartitionsRequestHandler``):
        a topic named that is denied is TOPIC_AUTHORIZATION_FAILED (zero topic id), one denied among all topics is
        left out; the handler sees the allowed ones from the cursor's on, and from partition 0 when the cursor's
        own topic is denied. A cursor Kafka refuses is left to the handler."""
        if not cursor_is_valid(request):
            return None
        cursor = request.cursor
        every_topic = not request.topics
        names = self.logs.topics() if every_topic else dict.fromkeys(topic.name for topic in request.topics)
        names = [name for name in names if cursor is None or name >= cursor.topic_name]
        allowed, denied = self._split(context, Operation.DESCRIBE, TOPIC, names, lambda name: name,
                                      log_if_denied=not every_topic)
        if every_topic:
            denied = []
        if cursor is not None and cursor.topic_name not in allowed:
            request.cursor = None
        Response = messages.DescribeTopicPartitionsResponse
        if not allowed:         # nothing left to describe: an empty list would mean every topic
            response = Response(throttle_time_ms=0, topics=[], next_cursor=None)
            return Refused(self._described_topics_finished(context, response, denied))
        request.topics = [messages.DescribeTopicPartitionsRequest.TopicRequest(name=name) for name in allowed]
        return lambda response: self._described_topics_finished(context, response, denied)

    def _described_topics_finished(self, context, response, denied):
        Topic = messages.DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
        for topic in response.topics:
            topic.topic_authorized_operations = self.authorized_operations(context, TOPIC, topic.name)
        response.topics += [Topic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name, topic_id=ZERO_UUID,
                                  is_internal=False, partitions=[]) for name in denied]
        return response

    def _describe_acls(self, context, version, request):
        if self.allowed(context, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME):
            return None
        return Refused(messages.DescribeAclsResponse(
            throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message="Cluster authorization failed.", resources=[]))

    def _alter_acls(self, context, version, request):
        """CreateAcls and DeleteAcls: ALTER on the cluster, else each creation or filter fails."""
        if self.allowed(context, Operation.ALTER, CLUSTER, CLUSTER_NAME):
            return None
        message = "Cluster authorization failed."
        if hasattr(request, "creations"):
            Result = messages.CreateAclsResponse.AclCreationResult
            return Refused(messages.CreateAclsResponse(throttle_time_ms=0, results=[
                Result(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=message)
                for _ in request.creations]))
        Result = messages.DeleteAclsResponse.DeleteAclsFilterResult
        return Refused(messages.DeleteAclsResponse(throttle_time_ms=0, filter_results=[
            Result(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=message, matching_acls=[])
            for _ in request.filters]))

    def _describe_scram_users(self, context, version, request):
        if self.allowed(context, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME):
            return None
        Response = messages.DescribeUserScramCredentialsResponse
        return Refused(Response(
            throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None,
            results=[Response.DescribeUserScramCredentialsResult(
                user=user.name, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None,
                credential_infos=[]) for user in request.users or []]))

    def _alter_scram_users(self, context, version, request):
        if self.allowed(context, Operation.ALTER, CLUSTER, CLUSTER_NAME):
            return None
        Response = messages.AlterUserScramCredentialsResponse
        users = dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions])
        return Refused(Response(throttle_time_ms=0, results=[Response.AlterUserScramCredentialsResult(
            user=user, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=None) for user in users]))

    def _describe_client_quotas(self, context, version, request):
        if self.allowed(context, Operation.DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME):
            return None
        return Refused(messages.DescribeClientQuotasResponse(
            throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message="Cluster authorization failed.", entries=None))

    def _alter_client_quotas(self, context, version, request):
        """ALTER_CONFIGS on the cluster, else each entry fails (Kafka's ``handleAlterClientQuotasRequest``)."""
        if self.allowed(context, Operation.ALTER_CONFIGS, CLUSTER, CLUSTER_NAME):
            return None
        Response = messages.AlterClientQuotasResponse
        return Refused(Response(throttle_time_ms=0, entries=[Response.EntryData(
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message="Cluster authorization failed.",
            entity=[Response.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity])
            for entry in request.entries]))


def _produce_error(index, error):
    return messages.ProduceResponse.PartitionProduceResponse(index=index, error_code=error, base_offset=-1,
                                                             log_append_time_ms=-1, log_start_offset=-1,
                                                             record_errors=[], error_message=None)


def _commit_errors(Response, topics, error):
    """An OffsetCommit or TxnOffsetCommit response with ``error`` for every partition of ``topics``."""
    topic_type = getattr(Response, "OffsetCommitResponseTopic", None) or Response.TxnOffsetCommitResponseTopic
    partition_type = getattr(Response, "OffsetCommitResponsePartition", None) or \
        Response.TxnOffsetCommitResponsePartition
    return Response(throttle_time_ms=0, topics=[topic_type(name=topic.name, partitions=[
        partition_type(partition_index=p.partition_index, error_code=error) for p in topic.partitions])
        for topic in topics])


def _unauthorized_offset(Partition, index, error):
    return Partition(partition_index=index, committed_offset=-1, committed_leader_epoch=-1, metadata="",
                     error_code=error)


def refusal_response(api_key, version, refused):
    """The response object of a ``Refused``: a bare error code stands for the API's top-level error field."""
    if isinstance(refused.response, int):
        return error_response(api_key, version, refused.response)
    return refused.response
