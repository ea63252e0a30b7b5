"""kmem's exceptions: one hierarchy, so callers can catch ``KmemError`` for anything kmem rejects.

Each message says what was wrong and where (file, offset) when that is known. Classes that stand for
bad arguments or bad bytes also derive from ``ValueError`` so generic handlers keep working.
"""


class KmemError(Exception):
    """Base class of every error kmem raises on purpose."""


class ConfigError(KmemError, ValueError):
    """A configuration value is out of range or inconsistent with another."""


class InvalidArgumentError(KmemError, ValueError):
    """An argument breaks a documented precondition (Kafka's IllegalArgumentException)."""


class IllegalStateError(KmemError, RuntimeError):
    """An operation is not allowed in the object's current state (Kafka's IllegalStateException)."""


class CorruptRecordError(KmemError, ValueError):
    """Record data is malformed: truncated, bad CRC, impossible length, unknown magic or codec.

    ``offset`` is the byte position in the input where the problem was found, when known.
    """

    def __init__(self, message, offset=None):
        super().__init__(message if offset is None else f"{message} (at byte {offset})")
        self.offset = offset


class CorruptIndexError(KmemError, ValueError):
    """An index file does not describe its segment (Kafka's CorruptIndexException)."""


class DecompressionLimitError(CorruptRecordError):
    """Compressed record data expands beyond the decompression limit (``kmem.records.MAX_DECOMPRESSED_BYTES``
    unless the caller sets another): refused before more memory is spent, as a decompression bomb."""


class UnsupportedCompressionTypeError(KmemError):
    """The codec cannot be used here (e.g. zstd below magic 2)."""


class InvalidReceiveError(KmemError):
    """A network frame is invalid (negative or oversized size prefix); the connection must close."""


class CorruptSnapshotError(KmemError):
    """A producer-state snapshot or Bloom sidecar file is unreadable (version, CRC, truncation)."""


class SaslAuthenticationError(KmemError):
    """A SASL authentication failed; the message is what the client is told (Kafka's
    ``SaslAuthenticationException``: it holds nothing a client should not learn)."""


class InvalidSaslCredentialsError(KmemError):
    """A SASL exchange failed for a reason the client is not told (Kafka's ``SaslException``: whether the
    user exists, which check failed); the client gets the mechanism's generic failure message."""


class SslAuthenticationError(KmemError):
    """An SSL client's certificate names no principal (Kafka's ``SslAuthenticationException``, from
    ``SslPrincipalMapper``'s ``NoMatchingRule``); the connection ends."""
