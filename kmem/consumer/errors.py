"""The consumer's exceptions (all ``kmem.errors.KmemError``)."""
from kmem.errors import KmemError

# Kafka's error codes the consumer acts on, by name.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
INVALID_REQUEST = 42
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113
INVALID_REGULAR_EXPRESSION = 128
NAMES = {value: name for name, value in globals().items() if name.isupper()}


def error_name(code):
    return NAMES.get(code, f"error {code}")


class KafkaError(KmemError):
    """A broker answered with an error code the consumer cannot recover from by itself."""

    def __init__(self, message, code=None):
        super().__init__(message if code is None else f"{message}: {error_name(code)} ({code})")
        self.code = code


class KafkaConnectionError(KmemError, ConnectionError):
    """A broker could not be reached, or a connection broke or timed out."""


class OffsetOutOfRangeError(KafkaError):
    """A fetch position is outside the log and ``auto.offset.reset`` is ``none``."""

    def __init__(self, partition, offset):
        super().__init__(f"offset {offset} is out of range for {partition.topic}-{partition.partition} "
                         f"and auto.offset.reset is none (seek to a valid offset)")
        self.partition = partition
        self.offset = offset


class CommitFailedError(KafkaError):
    """An offset commit was refused (typically: the group rebalanced, so the partitions may have moved)."""


class RebalanceInProgressError(CommitFailedError):
    """Kafka's RebalanceInProgressException: an offset commit while the member rejoins its group (from its
    JoinGroup to the end of its SyncGroup), failed at once with nothing sent, or refused by the group for
    the same reason. Not fatal: ``poll()`` completes the rebalance, then commit what is still assigned."""
