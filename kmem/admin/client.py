"""A small synchronous admin client: one request at a time to any Kafka broker, over the consumer's
``NetworkClient`` (ApiVersions on each connection, the highest version both sides know).

It reaches the cluster through the first bootstrap server that answers, learns the brokers, the
controller and topic leaders from Metadata, and finds a group's coordinator with FindCoordinator, as
Kafka's ``KafkaAdminClient`` does. A broker that cannot be reached or does not answer within
``request_timeout_ms`` raises ``KafkaConnectionError``; an error code in an answer is for the caller to
read (``check`` raises ``AdminError`` for one).
"""
import base64
import time

from kmem.consumer.client import NetworkClient
from kmem.consumer.errors import KafkaConnectionError, KafkaError
from kmem.errors import InvalidArgumentError, KmemError, SaslAuthenticationError
from kmem.pool import SimpleMemoryPool
from kmem.protocol import ApiKey, CorruptMessageError, messages

# The versions sent: high enough for what the tools show (topic ids: Metadata v10), low enough that
# brokers from Kafka 2.4 on, librdkafka's mock cluster and Tansu answer each.
MAX_VERSIONS = {
    ApiKey.API_VERSIONS: 2, ApiKey.METADATA: 12, ApiKey.CREATE_TOPICS: 7, ApiKey.DELETE_TOPICS: 6,
    ApiKey.CREATE_PARTITIONS: 3, ApiKey.DESCRIBE_CONFIGS: 4, ApiKey.INCREMENTAL_ALTER_CONFIGS: 1,
    ApiKey.FIND_COORDINATOR: 3, ApiKey.LIST_GROUPS: 4, ApiKey.DESCRIBE_GROUPS: 5, ApiKey.OFFSET_FETCH: 8,
    ApiKey.OFFSET_COMMIT: 8, ApiKey.LIST_OFFSETS: 7, ApiKey.DELETE_GROUPS: 2,
    ApiKey.DESCRIBE_CLIENT_QUOTAS: 1, ApiKey.ALTER_CLIENT_QUOTAS: 1,
    ApiKey.DESCRIBE_LOG_DIRS: 4, ApiKey.PRODUCE: 9, ApiKey.LIST_TRANSACTIONS: 0, ApiKey.DESCRIBE_TRANSACTIONS: 0,
    ApiKey.DESCRIBE_PRODUCERS: 0, ApiKey.WRITE_TXN_MARKERS: 1, ApiKey.LIST_CLIENT_METRICS_RESOURCES: 0,
}
# Metadata v1: a null topic list asks for every topic; OffsetFetch v2: for every committed partition
# (Tansu answers that only in v8's per-group form, as Kafka's admin client sends it);
# ListOffsets v1: one offset per partition; CreateTopics v4: -1 for the broker's defaults (KIP-464).
MIN_VERSIONS = {ApiKey.METADATA: 1, ApiKey.OFFSET_FETCH: 2, ApiKey.LIST_OFFSETS: 1, ApiKey.CREATE_TOPICS: 4}

# Kafka's error codes (org.apache.kafka.common.protocol.Errors) an admin request meets, by name
ERROR_NAMES = {
    -1: "UNKNOWN_SERVER_ERROR", 3: "UNKNOWN_TOPIC_OR_PARTITION", 5: "LEADER_NOT_AVAILABLE",
    6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT", 14: "COORDINATOR_LOAD_IN_PROGRESS",
    15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR", 17: "INVALID_TOPIC_EXCEPTION", 22: "ILLEGAL_GENERATION",
    24: "INVALID_GROUP_ID", 25: "UNKNOWN_MEMBER_ID", 27: "REBALANCE_IN_PROGRESS",
    29: "TOPIC_AUTHORIZATION_FAILED", 30: "GROUP_AUTHORIZATION_FAILED", 31: "CLUSTER_AUTHORIZATION_FAILED",
    35: "UNSUPPORTED_VERSION", 36: "TOPIC_ALREADY_EXISTS", 37: "INVALID_PARTITIONS",
    38: "INVALID_REPLICATION_FACTOR", 39: "INVALID_REPLICA_ASSIGNMENT", 40: "INVALID_CONFIG", 41: "NOT_CONTROLLER",
    42: "INVALID_REQUEST", 44: "POLICY_VIOLATION", 68: "NON_EMPTY_GROUP", 69: "GROUP_ID_NOT_FOUND",
    73: "TOPIC_DELETION_DISABLED", 100: "UNKNOWN_TOPIC_ID",
}
UNSUPPORTED_VERSION = 35
UNKNOWN_TOPIC_OR_PARTITION, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 3, 14, 15, 16
COORDINATOR_MOVED_OR_LOADING = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}
RETRIABLE = {5, 6, 7, 41, *COORDINATOR_MOVED_OR_LOADING}
GROUP_KEY, TRANSACTION_KEY = 0, 1   # FindCoordinator's key types: a consumer group, a transactional id


class AdminError(KafkaError):
    """A broker answered an admin request with an error code: ``code`` is Kafka's, ``name`` its name."""

    def __init__(self, message, code):
        name = error_name(code)
        super().__init__(message if name in message else f"{message}: {name}")
        self.code, self.name = code, name


class UnsupportedApiError(AdminError):
    """The broker does not serve an API (or no version of it this client sends): Kafka's UNSUPPORTED_VERSION."""

    def __init__(self, message):
        super().__init__(message, UNSUPPORTED_VERSION)


class RequestTimedOutError(KafkaConnectionError):
    """A broker did not answer a request within ``request_timeout_ms`` (its connection is closed)."""


class MalformedResponseError(KmemError):
    """A broker's answer does not decode as the response it must be (a defect of that broker)."""


def error_name(code):
    return ERROR_NAMES.get(code, f"error {code}")


def topic_id_text(topic_id):
    """A topic id as Kafka prints it (``Uuid.toString``: URL-safe base64 of its 16 bytes, no padding)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def parse_bootstrap(servers):
    """``[(host, port)]`` of ``"host:port,host:port"``; raises ``InvalidArgumentError`` naming a bad one."""
    addresses = []
    for server in (s.strip() for s in str(servers).split(",") if s.strip()):     # as Kafka's ClientUtils
        host, sep, port = server.rpartition(":")
        host = host.strip("[]")         # an IPv6 literal: [::1]:9092
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"bootstrap server {server!r} is not HOST:PORT")
        addresses.append((host, int(port)))
    if not addresses:
        raise InvalidArgumentError("no bootstrap server given: HOST:PORT")
    return addresses


class AdminClient:
    """Requests to the brokers of the cluster ``bootstrap_servers`` ("host:port,...") leads to."""

    def __init__(self, bootstrap_servers, *, client_id="kmem-admin", request_timeout_ms=30000,
                 connect_timeout_ms=10000, ssl_context=None, sasl=None):
        """``ssl_context``: TLS for every connection; ``sasl``: a ``kmem.consumer.sasl.SaslClientSettings`` each
        connection authenticates with."""
        self._bootstrap = parse_bootstrap(bootstrap_servers)
        self.request_timeout_ms = request_timeout_ms
        self._request_timeout = request_timeout_ms / 1000.0
        # responses are read into this pool; non-strict, so one larger than it still fits
        self._client = NetworkClient(
            SimpleMemoryPool(32 << 20, 32 << 20, strict=False), client_id=client_id,
            request_timeout_ms=request_timeout_ms, reconnect_backoff_ms=50, reconnect_backoff_max_ms=1000,
            coordinator_max_receive_bytes=1 << 20, max_versions=MAX_VERSIONS, min_versions=MIN_VERSIONS,
            connect_timeout_ms=connect_timeout_ms, ssl_context=ssl_context, sasl=sasl)
        self.brokers = {}               # node id -> (host, port), from the latest Metadata
        self.controller_id = -1
        self.cluster_id = None
        self._any = None                # the channel of the connection used for "any broker"
        self._coordinators = {}         # (key type, group or transactional id) -> its coordinator's node id

    # --- connections and requests ---------------------------------------------------------------------

    def _ready(self, channel, address):
        """Connect ``channel`` to ``address``, negotiate versions and authenticate; raises
        ``KafkaConnectionError``, or ``SaslAuthenticationError`` when the broker refused the credentials."""
        if self._client.is_ready(channel):
            return
        self._client.connect(channel, address)
        # answered once the connection's own ApiVersions (and SASL) is: a closed connection or a timeout says why
        try:
            self._call(channel, messages.ApiVersionsRequest())
        except KafkaConnectionError as exc:
            if isinstance(getattr(exc, "reason", None), SaslAuthenticationError):
                raise exc.reason from None      # not a broker out of reach: another one would refuse it too
            raise

    def _any_channel(self):
        if self._any is not None and self._client.is_ready(self._any):
            return self._any
        failures = []
        candidates = [(f"bootstrap-{i}", address) for i, address in enumerate(self._bootstrap)]
        candidates += [(node, address) for node, address in self.brokers.items()]
        for channel, address in candidates:
            try:
                self._ready(channel, address)
            except KafkaConnectionError as exc:
                failures.append(str(exc))
                continue
            self._any = channel
            return channel
        raise KafkaConnectionError("no broker reachable: " + "; ".join(failures))

    def request(self, body, node=None):
        """``body``'s response from broker ``node`` (a node id of the latest Metadata) or, None, any broker."""
        if node is None:
            channel = self._any_channel()
        else:
            if node not in self.brokers:
                self.metadata([])
            if node not in self.brokers:
                raise KafkaConnectionError(f"broker {node} is not in the cluster's metadata")
            channel = node
            self._ready(channel, self.brokers[node])
        try:
            self._client.version(channel, body.API_KEY)
        except KafkaConnectionError as exc:       # no version both sides know: nothing is sent
            raise UnsupportedApiError(str(exc)) from None
        return self._call(channel, body)

    def _call(self, channel, body):
        answers = []
        self._client.send(channel, body, lambda receive, response, error: answers.append((response, error)))
        deadline = time.monotonic() + self._request_timeout + 1.0
        while not answers:
            if time.monotonic() > deadline:        # the network client expires requests; this is a backstop
                self._client.close(channel, TimeoutError("no response within request.timeout.ms"))
                break
            self._client.poll(0.05)
        response, error = answers[0] if answers else (None, TimeoutError("no response"))
        if error is None:
            return response
        reason = getattr(error, "reason", None)
        if isinstance(reason, CorruptMessageError):
            raise MalformedResponseError(f"the broker's answer is malformed: {reason}") from None
        if isinstance(reason, TimeoutError) or not answers:
            raise RequestTimedOutError(str(error)) from None
        if isinstance(error, KafkaConnectionError):
            raise error
        raise KafkaConnectionError(f"{ApiKey(body.API_KEY).name}: {error}") from None

    def metadata(self, topics=None):
        """The Metadata response for ``topics`` (None: every topic); remembers brokers and controller."""
        Topic = messages.MetadataRequest.MetadataRequestTopic
        body = messages.MetadataRequest(topics=None if topics is None else [Topic(name=t) for t in topics],
                                        allow_auto_topic_creation=False)
        response = self.request(body)
        self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        self.controller_id = response.controller_id
        self.cluster_id = response.cluster_id
        return response

    def controller_request(self, body):
        """``body`` sent to the controller (any broker when the metadata names none, as before KIP-590)."""
        if not self.brokers:
            self.metadata([])
        node = self.controller_id if self.controller_id in self.brokers else None
        return self.request(body, node)

    def coordinator(self, group_id, refresh=False, key_type=GROUP_KEY):
        """The node id of ``group_id``'s coordinator (FindCoordinator, retried while it loads; remembered
        unless ``refresh``); with ``key_type`` TRANSACTION_KEY, a transactional id's."""
        if not refresh and (key_type, group_id) in self._coordinators:
            return self._coordinators[(key_type, group_id)]
        deadline = time.monotonic() + self._request_timeout
        while True:
            response = self.request(messages.FindCoordinatorRequest(key=group_id, key_type=key_type))
            if response.error_code == 0:
                self.brokers.setdefault(response.node_id, (response.host, response.port))
                self._coordinators[(key_type, group_id)] = response.node_id
                return response.node_id
            if response.error_code not in RETRIABLE or time.monotonic() > deadline:
                what = "group" if key_type == GROUP_KEY else "transactional id"
                raise AdminError(f"no coordinator for {what} {group_id!r}", response.error_code)
            time.sleep(0.1)

    def group_request(self, group_id, body, error_of=None):
        """``body`` sent to ``group_id``'s coordinator. While ``error_of(response)`` says the coordinator
        is loading the group or has moved, it is found again and asked again (as Kafka's admin client
        does), for up to ``request_timeout_ms``."""
        deadline = time.monotonic() + self._request_timeout
        refresh = False
        while True:
            response = self.request(body, self.coordinator(group_id, refresh))
            refresh = True
            if error_of is None or error_of(response) not in COORDINATOR_MOVED_OR_LOADING or \
                    time.monotonic() > deadline:
                return response
            time.sleep(0.1)

    def close(self):
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check(code, what, message=None):
    """Raises ``AdminError`` for an error ``code`` (not 0) of ``what``, with the broker's ``message``."""
    if code:
        raise AdminError(what if not message else f"{what}: {message}", code)
