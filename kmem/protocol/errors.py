"""The protocol's exceptions. Each carries what a broker needs to answer (api key, version,
correlation id) or what a developer needs to find the problem (API, version, field, byte)."""
from ..errors import KmemError


class UnknownApiKeyError(KmemError):
    """The request names an API key this codec does not know; Kafka closes such a connection."""

    def __init__(self, api_key, api_version=None, correlation_id=None):
        super().__init__(f"unknown API key {api_key} (version {api_version})")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class UnsupportedVersionError(KmemError):
    """A known API at a version outside ``SUPPORTED_VERSIONS``.

    ``header`` is the decoded request header (requests only), so a broker can answer: ApiVersions with
    ``api_versions_fallback_response(header)``; other APIs by closing the connection, as Kafka does.
    """

    def __init__(self, api_key, api_version, header=None):
        name = _api_name(api_key)
        super().__init__(f"{name} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.header = header


class CorruptMessageError(KmemError, ValueError):
    """Bytes that do not decode as the message they claim to be: truncated, a negative or impossible
    length, bad UTF-8, a tagged field whose size lies. Names the message, version, field and byte."""

    def __init__(self, message_name, version, field, position, reason):
        super().__init__(f"{message_name} v{version}: field {field or '(header)'} at byte {position}: {reason}")
        self.message_name = message_name
        self.version = version
        self.field = field
        self.position = position


class InvalidMessageError(KmemError, ValueError):
    """A message object that cannot be encoded: a value of the wrong type or out of its field's range."""

    def __init__(self, message_name, version, field, reason):
        super().__init__(f"{message_name} v{version}: field {field}: {reason}")
        self.message_name = message_name
        self.version = version
        self.field = field


def _api_name(api_key):
    from .api import ApiKey
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"API key {api_key}"
