"""Kafka's error codes, for every answer of kmem broker, and the exception the storage layer raises with one."""
import enum
import errno
import resource

from kmem.errors import KmemError


class ErrorCode(enum.IntEnum):
    """Kafka's error codes (``org.apache.kafka.common.protocol.Errors``) that kmem broker answers with."""
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNKNOWN_TOPIC_ID = 100
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    INVALID_REGULAR_EXPRESSION = 128
    MISMATCHED_ENDPOINT_TYPE = 114
    UNSUPPORTED_ENDPOINT_TYPE = 115
    UNKNOWN_SUBSCRIPTION_ID = 117
    TELEMETRY_TOO_LARGE = 118
    INVALID_TXN_STATE = 48
    TRANSACTION_COORDINATOR_FENCED = 52
    TOPIC_AUTHORIZATION_FAILED = 29
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    OPERATION_NOT_ATTEMPTED = 55
    PRODUCER_FENCED = 90
    TRANSACTIONAL_ID_NOT_FOUND = 105
    TRANSACTION_ABORTABLE = 120
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    NOT_ENOUGH_REPLICAS = 19
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    SASL_AUTHENTICATION_FAILED = 58
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    SECURITY_DISABLED = 54
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93


class LogError(KmemError):
    """A request the log refuses, with the Kafka error code a broker answers it with."""

    #: KIP-467: ``[(batch index, message)]`` of the records that made a batch fail (Produce v8+ carries them)
    record_errors = ()

    def __init__(self, code, message):
        super().__init__(f"{ErrorCode(code).name}: {message}")
        self.code = ErrorCode(code)


class RecordValidationError(LogError):
    """Kafka's ``RecordValidationException``: records of a batch refused, each named by its index in the batch
    (KIP-467). Its text is the Produce response's ``error_message``, worded as Kafka's, without the code's name."""

    def __init__(self, code, message, record_errors):
        super().__init__(code, message)
        self.args = (message,)
        self.record_errors = record_errors


def storage_error(error, action):
    """The ``LogError`` (KAFKA_STORAGE_ERROR) for an ``OSError`` raised while ``action``; running out of
    file descriptors names the limit to raise."""
    message = f"{action} failed: {error.strerror or error}"
    if error.errno in (errno.EMFILE, errno.ENFILE):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        message += f" (open files limit RLIMIT_NOFILE: {soft}, hard limit {hard}; raise it, e.g. ulimit -n)"
    return LogError(ErrorCode.KAFKA_STORAGE_ERROR, message)
