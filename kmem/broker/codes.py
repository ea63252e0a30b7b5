"""Kafka's error codes for what the storage layer answers, and the exception that carries one."""
import enum

from kmem.errors import KmemError


class ErrorCode(enum.IntEnum):
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    MESSAGE_TOO_LARGE = 10
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_CONFIG = 40
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    KAFKA_STORAGE_ERROR = 56
    INVALID_RECORD = 87


class LogError(KmemError):
    """A request the log refuses, with the Kafka error code a broker answers it with."""

    def __init__(self, code, message):
        super().__init__(f"{ErrorCode(code).name}: {message}")
        self.code = ErrorCode(code)
