"""Requests and responses with their headers: what a broker and a client call."""
import enum
import functools
import struct

from kmem import _core
from kmem.send import as_transport, close_send

from . import codegen, compiled, schema
from .errors import CorruptMessageError, InvalidMessageError, UnknownApiKeyError, UnsupportedVersionError


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    WRITE_TXN_MARKERS = 27
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    LIST_CLIENT_METRICS_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75

    @property
    def message_name(self):
        """The schema's name stem: ``ApiKey.LIST_OFFSETS.message_name == 'ListOffsets'``."""
        return "".join(part.capitalize() for part in self.name.split("_"))


# Kafka 3.9's version ranges (the schemas shipped with kafka-python describe later versions too)
SUPPORTED_VERSIONS = {
    ApiKey.PRODUCE: (0, 11), ApiKey.FETCH: (0, 17), ApiKey.LIST_OFFSETS: (0, 9), ApiKey.METADATA: (0, 12),
    ApiKey.OFFSET_COMMIT: (0, 9), ApiKey.OFFSET_FETCH: (0, 9), ApiKey.FIND_COORDINATOR: (0, 6),
    ApiKey.JOIN_GROUP: (0, 9), ApiKey.HEARTBEAT: (0, 4), ApiKey.LEAVE_GROUP: (0, 5), ApiKey.SYNC_GROUP: (0, 5),
    ApiKey.DESCRIBE_GROUPS: (0, 5), ApiKey.LIST_GROUPS: (0, 5), ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (0, 7), ApiKey.DELETE_TOPICS: (0, 6), ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.DELETE_RECORDS: (0, 2), ApiKey.DESCRIBE_CONFIGS: (0, 4), ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3), ApiKey.DELETE_GROUPS: (0, 2), ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.OFFSET_DELETE: (0, 0), ApiKey.DESCRIBE_CLUSTER: (0, 1), ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 4),
    ApiKey.WRITE_TXN_MARKERS: (0, 1),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 5), ApiKey.ADD_OFFSETS_TO_TXN: (0, 4), ApiKey.END_TXN: (0, 4),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0), ApiKey.LIST_TRANSACTIONS: (0, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 4),
    ApiKey.DESCRIBE_ACLS: (0, 3), ApiKey.CREATE_ACLS: (0, 3), ApiKey.DELETE_ACLS: (0, 3),
    ApiKey.SASL_HANDSHAKE: (0, 1), ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0), ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1), ApiKey.ALTER_CLIENT_QUOTAS: (0, 1),
    ApiKey.DESCRIBE_LOG_DIRS: (0, 4), ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 1), ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0),
    ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (0, 0), ApiKey.PUSH_TELEMETRY: (0, 0),
    ApiKey.LIST_CLIENT_METRICS_RESOURCES: (0, 0),
}

UNSUPPORTED_VERSION = 35       # Kafka's Errors.UNSUPPORTED_VERSION


class RequestHeader:
    """Request header v1 (``client_id``) or v2 (v1 + tagged fields); v0 (no client id) is only used by
    ControlledShutdown v0, which kmem does not serve."""
    __slots__ = ("api_key", "api_version", "correlation_id", "client_id", "unknown_tags")

    def __init__(self, api_key, api_version, correlation_id, client_id=None, unknown_tags=None):
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.unknown_tags = unknown_tags

    def __eq__(self, other):
        if type(other) is not RequestHeader:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self):
        return (f"RequestHeader(api_key={self.api_key!r}, api_version={self.api_version}, "
                f"correlation_id={self.correlation_id}, client_id={self.client_id!r})")


class ResponseHeader:
    """Response header v0 (``correlation_id``) or v1 (v0 + tagged fields)."""
    __slots__ = ("correlation_id", "unknown_tags")

    def __init__(self, correlation_id, unknown_tags=None):
        self.correlation_id = correlation_id
        self.unknown_tags = unknown_tags

    def __eq__(self, other):
        if type(other) is not ResponseHeader:
            return NotImplemented
        return self.correlation_id == other.correlation_id and self.unknown_tags == other.unknown_tags

    def __repr__(self):
        return f"ResponseHeader(correlation_id={self.correlation_id})"


_REQUEST_HEADER = struct.Struct(">hhih")
_RESPONSE_HEADER = struct.Struct(">i")


@functools.lru_cache(maxsize=None)
def message(api_key, kind):
    """The schema of ``kind`` ('Request' or 'Response') for ``api_key``."""
    return schema.load(ApiKey(api_key).message_name + kind)


def message_class(api_key, kind):
    """The Python class of an API's request or response, e.g. ``message_class(ApiKey.FETCH, 'Response')``."""
    return codegen.build_classes(message(api_key, kind))


@functools.lru_cache(maxsize=None)
def _codec(api_key, version, kind, direction):
    """The compiled codec where there is one (the hot APIs), with the Python codec behind it."""
    spec = message(api_key, kind)
    reference = codegen.decoder(spec, version) if direction == "decode" else codegen.encoder(spec, version)
    return compiled.codec(spec, version, direction, reference)


@functools.lru_cache(maxsize=None)
def request_header_version(api_key, api_version):
    """2 from the API's first flexible version on, else 1 (Kafka's ``ApiKeys.requestHeaderVersion``)."""
    return 2 if message(api_key, "Request").is_flexible(api_version) else 1


@functools.lru_cache(maxsize=None)
def response_header_version(api_key, api_version):
    """1 from the API's first flexible version on, else 0; ApiVersions always 0 (clients read it before
    they know the broker's versions)."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if message(api_key, "Response").is_flexible(api_version) else 0


def _view(buf):
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _read_tags(view, pos, what):
    """Skip a header's tagged fields, keeping them as ``{tag: bytes}`` (or None)."""
    try:
        return codegen.read_unknown_tags(view, pos)
    except codegen._Bad as e:
        raise CorruptMessageError(what, 0, "<tagged fields>", e.pos, str(e)) from None


_API_KEYS = {int(key): key for key in ApiKey}
_HEADER = struct.Struct(">hhih")


def decode_request_header(buf):
    """``(RequestHeader, body offset)`` of a request payload (the bytes after the size prefix).

    Raises ``UnknownApiKeyError`` for an API this codec does not know (before reading further), and
    ``CorruptMessageError`` when the header itself is cut short. Versions are not checked here.
    """
    return _decode_request_header(_view(buf))


def _decode_request_header(view):
    try:
        api_key, api_version, correlation_id, client_id, pos = _core.wire_request_header(view)
    except Exception:
        return _decode_request_header_reference(view)   # names the fault
    key = _API_KEYS.get(api_key)
    if key is None:
        raise UnknownApiKeyError(api_key, api_version, correlation_id)
    return _with_header_tags(view, key, api_version, correlation_id, client_id, pos)


def _decode_request_header_reference(view):
    """The Python reading of a request header, which names what is wrong with it."""
    size = len(view)
    if size < 8:
        raise CorruptMessageError("RequestHeader", 1, "api_key..correlation_id", 0,
                                  f"{size} bytes, a request header needs at least 10")
    if size < 10:
        api_key, api_version, correlation_id = struct.unpack_from(">hhi", view, 0)
        length = None
    else:
        api_key, api_version, correlation_id, length = _HEADER.unpack_from(view, 0)
    key = _API_KEYS.get(api_key)
    if key is None:
        raise UnknownApiKeyError(api_key, api_version, correlation_id)
    if length is None:
        raise CorruptMessageError("RequestHeader", 1, "client_id", 8, "message ends early")
    pos = 10
    client_id = None
    if length >= 0:
        if pos + length > size:
            raise CorruptMessageError("RequestHeader", 1, "client_id", pos,
                                      f"{length} bytes announced, {size - pos} left")
        try:
            client_id = str(view[pos:pos + length], "utf-8")
        except UnicodeDecodeError as e:
            raise CorruptMessageError("RequestHeader", 1, "client_id", pos, f"invalid UTF-8 ({e.reason})") from None
        pos += length
    elif length != -1:
        raise CorruptMessageError("RequestHeader", 1, "client_id", 8, f"negative length {length}")
    return _with_header_tags(view, key, api_version, correlation_id, client_id, pos)


def _with_header_tags(view, key, api_version, correlation_id, client_id, pos):
    tags = None
    plan = _REQUEST_PLANS.get((key, api_version))
    flexible = plan[0] if plan is not None else request_header_version(key, api_version) == 2
    if flexible:
        if view[pos:pos + 1] == b"\x00":
            pos += 1
        else:
            tags, pos = _read_tags(view, pos, "RequestHeader")
    return RequestHeader(key, api_version, correlation_id, client_id, tags), pos


# (api key, version) -> (flexible header, body decoder) of each supported request version, and
# (response class, version) -> (api key, flexible header, body encoder) of each response encoded: the
# lookups of every request, made once
_REQUEST_PLANS = {}
_RESPONSE_PLANS = {}
# Of those with a compiled codec, what the core needs to read a request or write a response whole
# (``_core.wire_decode_request``, ``_core.wire_encode_response``): api key << 16 | version -> (api key,
# flexible header, codec index), and (response class, version) -> (api key, flexible header, codec index)
_COMPILED_REQUESTS = {}
_COMPILED_RESPONSES = {}


def _request_plan(key, version):
    plan = _REQUEST_PLANS.get((key, version))
    if plan is None:
        low, high = SUPPORTED_VERSIONS[key]
        if not low <= version <= high:
            return None             # not kept: a client may name any of 65,536 versions
        plan = _REQUEST_PLANS[key, version] = (request_header_version(key, version) == 2,
                                               _codec(key, version, "Request", "decode"))
        index = compiled.codec_index(message(key, "Request"), version)
        if index is not None:
            _COMPILED_REQUESTS[key << 16 | version] = (key, plan[0], index)
    return plan


def _response_plan(body, version):
    plan = _RESPONSE_PLANS.get((type(body), version))
    if plan is None:
        api_key = _api_key_of(body, "Response")
        _check_version(api_key, version)
        plan = _RESPONSE_PLANS[type(body), version] = (api_key, response_header_version(api_key, version) == 1,
                                                       _codec(api_key, version, "Response", "encode"))
        index = compiled.codec_index(message(api_key, "Response"), version)
        if index is not None:
            _COMPILED_RESPONSES[type(body), version] = (api_key, plan[1], index)
    return plan


def _check_version(api_key, version, header=None):
    low, high = SUPPORTED_VERSIONS[api_key]
    if not low <= version <= high:
        raise UnsupportedVersionError(api_key, version, header)


def decode_request(buf):
    """``(RequestHeader, request body)`` of a request payload; the body's record fields are views of
    ``buf`` (valid as long as ``buf`` is). Raises ``UnknownApiKeyError``, ``UnsupportedVersionError``
    (with ``.header``) or ``CorruptMessageError``."""
    decoded = _core.wire_decode_request(buf, _COMPILED_REQUESTS, RequestHeader)
    if decoded is not None:
        return decoded
    view = _view(buf)
    header, pos = _decode_request_header(view)
    plan = _request_plan(header.api_key, header.api_version)
    if plan is None:
        raise UnsupportedVersionError(header.api_key, header.api_version, header)
    body, _ = plan[1](view, pos)
    return header, body


def decode_response(buf, api_key, api_version):
    """``(ResponseHeader, response body)`` of a response payload to a request of ``api_key`` at
    ``api_version``. An ApiVersions response with UNSUPPORTED_VERSION is read in the v0 layout, the
    broker's fallback."""
    try:
        api_key = ApiKey(api_key)
    except ValueError:
        raise UnknownApiKeyError(api_key, api_version) from None
    _check_version(api_key, api_version)
    view = _view(buf)
    if len(view) < 4:
        raise CorruptMessageError("ResponseHeader", 0, "correlation_id", 0, "message ends early")
    correlation_id, = _RESPONSE_HEADER.unpack_from(view, 0)
    tags, pos = None, 4
    if response_header_version(api_key, api_version) == 1:
        tags, pos = _read_tags(view, pos, "ResponseHeader")
    if api_key == ApiKey.API_VERSIONS and view[pos:pos + 2] == b"\x00\x23":
        api_version = 0
    body, _ = _codec(api_key, api_version, "Response", "decode")(view, pos)
    return ResponseHeader(correlation_id, tags), body


class SplicedSend:
    """An encoded message with record Sends spliced in at byte offsets: a ``kmem.send.Send`` whose
    ``size`` counts both. One object whatever the number of partitions (a ``SequenceSend`` would need
    a part per gap between records)."""

    def __init__(self, data, splices, spliced_bytes=None):
        """``spliced_bytes``: the sum of the sends' sizes, if the caller counted them already."""
        self._data = memoryview(data)
        self._splices = splices                      # [(offset in data, send)], offsets ascending
        if spliced_bytes is None:
            spliced_bytes = sum(send.size for _, send in splices)
        self.size = self.remaining = len(data) + spliced_bytes
        self._position = 0                           # next byte of data to write
        self._next = 0                               # next splice

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        transport = as_transport(transport)
        written = 0
        while self.remaining:
            if self._next < len(self._splices):
                offset, send = self._splices[self._next]
            else:
                offset, send = len(self._data), None
            if self._position < offset:
                n = transport.write([self._data[self._position:offset]])
                self._position += n
                written += n
                self.remaining -= n
                if self._position < offset:
                    break
            if send is None:
                break
            n = send.write_to(transport)
            written += n
            self.remaining -= n
            if not send.completed:
                break
            self._splices[self._next] = None         # let a written send's memory go
            self._next += 1
        return written

    def close(self):
        """Release the sends not yet written (idempotent)."""
        for index in range(self._next, len(self._splices)):
            close_send(self._splices[index][1])
            self._splices[index] = None
        self._next = len(self._splices)

    def __repr__(self):
        return f"<SplicedSend {self.size - self.remaining}/{self.size} bytes, {len(self._splices)} sends>"


def _finish(buf, splices, spliced_bytes):
    return SplicedSend(bytes(buf), splices, spliced_bytes) if splices else bytes(buf)


def _api_key_of(body, kind):
    api_key = getattr(body, "API_KEY", None)
    if api_key is None or getattr(body, "KIND", None) != kind:
        raise InvalidMessageError(type(body).__name__, None, "(message)",
                                  f"a kmem.protocol {kind.lower()} object is needed")
    return ApiKey(api_key)


def encode_request(body, api_version, correlation_id, client_id=None, unknown_tags=None):
    """The payload (no size prefix) of ``body`` at ``api_version`` with its request header: ``bytes``,
    or a ``SplicedSend`` (a ``kmem.send.Send``) when records are Sends or larger than 16 KiB; its
    ``size`` is then the payload's length, to write the size prefix."""
    api_key = _api_key_of(body, "Request")
    _check_version(api_key, api_version)
    try:
        raw = None if client_id is None else client_id.encode("utf-8")
        buf = bytearray(_REQUEST_HEADER.pack(api_key, api_version, correlation_id, -1 if raw is None else len(raw)))
        buf += raw or b""
        if request_header_version(api_key, api_version) == 2:
            buf += codegen.tagged_section(unknown_tags or {})
    except (struct.error, AttributeError, TypeError, codegen._Bad) as e:
        raise InvalidMessageError("RequestHeader", api_version, "correlation_id..client_id", str(e)) from None
    splices = []
    spliced_bytes = _codec(api_key, api_version, "Request", "encode")(body, buf, splices)
    return _finish(buf, splices, spliced_bytes)


def encode_response(request_header, body, unknown_tags=None):
    """The payload (no size prefix) of the response ``body`` to the request whose header is given:
    its version and correlation id are the request's. Returns ``bytes`` when the body holds no Send
    (and no records above 16 KiB), otherwise a ``SplicedSend`` (a ``kmem.send.Send``: the encoded
    fields with each record Send in place, nothing copied) whose ``size`` is the payload's length:
    write ``size`` as the frame prefix, then the send."""
    if unknown_tags is None:
        encoded = _core.wire_encode_response(request_header, body, _COMPILED_RESPONSES)
        if encoded is not None:
            return encoded if type(encoded) is bytes else SplicedSend(*encoded)
    version = request_header.api_version
    api_key, flexible_header, encode = _response_plan(body, version)
    if api_key != request_header.api_key:
        raise InvalidMessageError(type(body).__name__, request_header.api_version, "(message)",
                                  f"the request was {ApiKey(request_header.api_key).name}")
    try:
        buf = bytearray(_RESPONSE_HEADER.pack(request_header.correlation_id))
        if flexible_header:
            buf += codegen.tagged_section(unknown_tags) if unknown_tags else b"\x00"
    except (struct.error, TypeError, codegen._Bad) as e:
        raise InvalidMessageError("ResponseHeader", version, "correlation_id", str(e)) from None
    splices = []
    spliced_bytes = encode(body, buf, splices)
    return _finish(buf, splices, spliced_bytes)


def error_response(api_key, api_version, error_code):
    """The response of ``api_key`` carrying ``error_code`` in its top-level ``ErrorCode``, every other field at
    its default (Kafka's ``getErrorResponse`` for a request answered as a whole), or None when that version's
    response has no top-level error code (its errors are per topic or partition)."""
    if not any(f.name == "error_code" and f.present(api_version) for f in message(api_key, "Response").fields):
        return None
    return message_class(api_key, "Response")(error_code=error_code)


def api_versions_fallback_response(request_header):
    """Kafka's answer to an ApiVersions request at a version it does not support: error
    UNSUPPORTED_VERSION in the v0 layout, listing ApiVersions' own range (the client retries at its
    max), after a v0 response header."""
    low, high = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS]
    return struct.pack(">ihihhh", request_header.correlation_id, UNSUPPORTED_VERSION, 1,
                       ApiKey.API_VERSIONS, low, high)
