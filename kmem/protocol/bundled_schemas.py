"""The message schemas kafka-python's bundle lacks, in the shape of Kafka's JSON files (facts only: names,
types, versions, nullability, defaults): KIP-848's ConsumerGroupHeartbeat (68, v0-1 as Kafka 4.0 defines
them: v1 carries ``SubscribedTopicRegex`` and a member id the client generates) and ConsumerGroupDescribe
(69, v0); KIP-714's GetTelemetrySubscriptions (71, v0), PushTelemetry (72, v0) and ListClientMetricsResources
(74, v0)."""


def _field(name, kind, versions="0+", nullable=None, default=None, fields=None):
    spec = {"name": name, "type": kind, "versions": versions}
    if nullable is not None:
        spec["nullableVersions"] = nullable
    if default is not None:
        spec["default"] = default
    if fields is not None:
        spec["fields"] = fields
    return spec


def _topic_partitions(with_name=False):
    return [_field("TopicId", "uuid"), *([_field("TopicName", "string")] if with_name else []),
            _field("Partitions", "[]int32")]


SCHEMAS = {
    "ConsumerGroupHeartbeatRequest": {
        "apiKey": 68, "type": "request", "name": "ConsumerGroupHeartbeatRequest", "validVersions": "0-1",
        "flexibleVersions": "0+", "fields": [
            _field("GroupId", "string"),
            _field("MemberId", "string"),
            _field("MemberEpoch", "int32"),
            _field("InstanceId", "string", nullable="0+", default="null"),
            _field("RackId", "string", nullable="0+", default="null"),
            _field("RebalanceTimeoutMs", "int32", default=-1),
            _field("SubscribedTopicNames", "[]string", nullable="0+", default="null"),
            _field("SubscribedTopicRegex", "string", versions="1+", nullable="1+", default="null"),
            _field("ServerAssignor", "string", nullable="0+", default="null"),
            _field("TopicPartitions", "[]TopicPartitions", nullable="0+", default="null",
                   fields=_topic_partitions()),
        ]},
    "ConsumerGroupHeartbeatResponse": {
        "apiKey": 68, "type": "response", "name": "ConsumerGroupHeartbeatResponse", "validVersions": "0-1",
        "flexibleVersions": "0+", "fields": [
            _field("ThrottleTimeMs", "int32"),
            _field("ErrorCode", "int16"),
            _field("ErrorMessage", "string", nullable="0+", default="null"),
            _field("MemberId", "string", nullable="0+", default="null"),
            _field("MemberEpoch", "int32"),
            _field("HeartbeatIntervalMs", "int32"),
            _field("Assignment", "Assignment", nullable="0+", default="null", fields=[
                _field("TopicPartitions", "[]TopicPartitions")]),
        ],
        "commonStructs": [{"name": "TopicPartitions", "versions": "0+", "fields": _topic_partitions()}]},
    "ConsumerGroupDescribeRequest": {
        "apiKey": 69, "type": "request", "name": "ConsumerGroupDescribeRequest", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("GroupIds", "[]string"),
            _field("IncludeAuthorizedOperations", "bool"),
        ]},
    "ConsumerGroupDescribeResponse": {
        "apiKey": 69, "type": "response", "name": "ConsumerGroupDescribeResponse", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("ThrottleTimeMs", "int32"),
            _field("Groups", "[]DescribedGroup", fields=[
                _field("ErrorCode", "int16"),
                _field("ErrorMessage", "string", nullable="0+", default="null"),
                _field("GroupId", "string"),
                _field("GroupState", "string"),
                _field("GroupEpoch", "int32"),
                _field("AssignmentEpoch", "int32"),
                _field("AssignorName", "string"),
                _field("Members", "[]Member", fields=[
                    _field("MemberId", "string"),
                    _field("InstanceId", "string", nullable="0+", default="null"),
                    _field("RackId", "string", nullable="0+", default="null"),
                    _field("MemberEpoch", "int32"),
                    _field("ClientId", "string"),
                    _field("ClientHost", "string"),
                    _field("SubscribedTopicNames", "[]string"),
                    _field("SubscribedTopicRegex", "string", nullable="0+", default="null"),
                    _field("Assignment", "Assignment"),
                    _field("TargetAssignment", "Assignment"),
                ]),
                _field("AuthorizedOperations", "int32", default="-2147483648"),
            ]),
        ],
        "commonStructs": [
            {"name": "TopicPartitions", "versions": "0+", "fields": _topic_partitions(with_name=True)},
            {"name": "Assignment", "versions": "0+", "fields": [_field("TopicPartitions", "[]TopicPartitions")]},
        ]},
    "GetTelemetrySubscriptionsRequest": {
        "apiKey": 71, "type": "request", "name": "GetTelemetrySubscriptionsRequest", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("ClientInstanceId", "uuid"),
        ]},
    "GetTelemetrySubscriptionsResponse": {
        "apiKey": 71, "type": "response", "name": "GetTelemetrySubscriptionsResponse", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("ThrottleTimeMs", "int32"),
            _field("ErrorCode", "int16"),
            _field("ClientInstanceId", "uuid"),
            _field("SubscriptionId", "int32"),
            _field("AcceptedCompressionTypes", "[]int8"),
            _field("PushIntervalMs", "int32"),
            _field("TelemetryMaxBytes", "int32"),
            _field("DeltaTemporality", "bool"),
            _field("RequestedMetrics", "[]string"),
        ]},
    "PushTelemetryRequest": {
        "apiKey": 72, "type": "request", "name": "PushTelemetryRequest", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("ClientInstanceId", "uuid"),
            _field("SubscriptionId", "int32"),
            _field("Terminating", "bool"),
            _field("CompressionType", "int8"),
            _field("Metrics", "bytes"),
        ]},
    "PushTelemetryResponse": {
        "apiKey": 72, "type": "response", "name": "PushTelemetryResponse", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("ThrottleTimeMs", "int32"),
            _field("ErrorCode", "int16"),
        ]},
    "ListClientMetricsResourcesRequest": {
        "apiKey": 74, "type": "request", "name": "ListClientMetricsResourcesRequest", "validVersions": "0",
        "flexibleVersions": "0+", "fields": []},
    "ListClientMetricsResourcesResponse": {
        "apiKey": 74, "type": "response", "name": "ListClientMetricsResourcesResponse", "validVersions": "0",
        "flexibleVersions": "0+", "fields": [
            _field("ThrottleTimeMs", "int32"),
            _field("ErrorCode", "int16"),
            _field("ClientMetricsResources", "[]ClientMetricsResource", fields=[_field("Name", "string")]),
        ]},
}
