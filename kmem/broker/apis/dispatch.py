"""``RequestDispatcher``: a request from bytes to its answer, on the network thread that read it.

It decodes the request, picks its handler (``Handlers``, ``AdminHandlers`` or the ``GroupCoordinator``)
and answers in one of three ways (see ``kmem.network.server``):

- at once, for nearly every request: Metadata, Produce (an append into the page cache), a Fetch that has
  its bytes, the group APIs, ListOffsets, WriteTxnMarkers (appends too), DescribeProducers...;
- later, for a request that waits: a Fetch short of ``min_bytes`` (a ``DelayedFetch`` in the fetch
  purgatory), a JoinGroup or SyncGroup during a rebalance (a ``DelayedResponse`` the group completes).
  The request is deferred and its memory goes back to the pool; nothing holds a thread;
- on an io thread (``num.io.threads``), for what may block on the disk: topic creation and deletion (each
  partition fsyncs its files), the admin APIs, AlterUserScramCredentials, CreateAcls and DeleteAcls, a Metadata
  request that auto-creates topics, and FindCoordinator, OffsetCommit and the other group requests before
  ``__consumer_offsets`` exists
  (FindCoordinator creates it, as Kafka's does), and FindCoordinator for a transactional id and
  InitProducerId with one before ``__transaction_state`` exists (both create it), AddOffsetsToTxn before
  ``__consumer_offsets`` exists.

With an authorizer (``authorizer.class.name``), each request is first checked as Kafka's ``KafkaApis`` checks it
(``kmem.broker.apis.authorize``): it is refused as a whole, or its handler sees only what the principal may touch
and the rest is answered with its authorization error.

With client quotas (``kmem.broker.quotas``), a request that takes its client over a quota is throttled as KIP-219
has it: the response carries ``throttle_time_ms`` and goes out at once, then the connection is muted for that long
(``Request.throttle``); with several quotas over, the longest throttle. The quotas: the byte rates of Produce and
Fetch, ``request_percentage`` on the time each request takes to handle (except WriteTxnMarkers, a follower's
Fetch and an acks=0 Produce, which Kafka exempts), and ``controller_mutation_rate`` on the partitions
CreateTopics, CreatePartitions and DeleteTopics create or delete (a strict quota refuses topics with
THROTTLING_QUOTA_EXCEEDED). A throttled Fetch is answered empty and its bytes are not counted, as Kafka's
``handleFetchRequest`` does.

A handler that raises (a bug) gets its request answered UNKNOWN_SERVER_ERROR, as Kafka's ``handleError``
answers it, when the response has a top-level error code; the connection stays open. A response whose
errors are per topic or partition (Produce, Metadata, ...) has no such answer: that connection is closed.
"""
import ipaddress
import logging
import time

from kmem._core import DispatchCore, from_follower
from kmem.broker.apis.acls import ACL_APIS, AclHandlers
from kmem.broker.apis.admin import ADMIN_APIS
from kmem.broker.apis.authorize import CLOSE_CONNECTION, Refused, RequestChecks, RequestContext, refusal_response
from kmem.broker.apis.client_quotas import QUOTA_APIS, ClientQuotaHandlers
from kmem.broker.apis.handlers import DelayedFetch
from kmem.broker.apis.scram_admin import SCRAM_APIS
from kmem.broker.codes import ErrorCode
from kmem.broker.group.coordinator import GROUP_APIS, DelayedResponse
from kmem.broker.group.offsets import OFFSETS_TOPIC
from kmem.broker.quotas import (CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, ClientQuotaManager,
                                ControllerMutationQuotaManager)
from kmem.broker.telemetry import TELEMETRY_VERSIONS
from kmem.broker.txn.coordinator import TXN_APIS
from kmem.errors import KmemError
from kmem.metrics import REQUEST_TIMES, request_times
from kmem.protocol import (ApiKey, UnsupportedVersionError, api_versions_fallback_response, decode_request,
                           encode_response, error_response, messages)
from kmem.send import close_send

log = logging.getLogger(__name__)

# api key -> Handlers method (the group and admin APIs have their own tables)
DATA_APIS = {
    ApiKey.API_VERSIONS: "api_versions", ApiKey.METADATA: "metadata", ApiKey.PRODUCE: "produce",
    ApiKey.FETCH: "fetch", ApiKey.LIST_OFFSETS: "list_offsets", ApiKey.INIT_PRODUCER_ID: "init_producer_id",
    ApiKey.CREATE_TOPICS: "create_topics", ApiKey.DELETE_TOPICS: "delete_topics",
    ApiKey.FIND_COORDINATOR: "find_coordinator", ApiKey.OFFSET_FOR_LEADER_EPOCH: "offset_for_leader_epoch",
    ApiKey.WRITE_TXN_MARKERS: "write_txn_markers",
    ApiKey.DESCRIBE_PRODUCERS: "describe_producers",
    ApiKey.SASL_HANDSHAKE: "sasl_handshake", ApiKey.SASL_AUTHENTICATE: "sasl_authenticate",
}
# APIs answered on an io thread: they write files and fsync them
BLOCKING_APIS = frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                           ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS, ApiKey.ALTER_CLIENT_QUOTAS, *ADMIN_APIS})


# the APIs under the controller mutation quota (KIP-599), and the version from which it is strict
MUTATION_APIS = {ApiKey.CREATE_TOPICS: 6, ApiKey.CREATE_PARTITIONS: 3, ApiKey.DELETE_TOPICS: 5}
# the APIs Kafka exempts from the request quota: inter-broker ones (a follower's Fetch is checked apart)
REQUEST_QUOTA_EXEMPT = frozenset({ApiKey.WRITE_TXN_MARKERS})


# the APIs that answer with the broker's endpoint: that of the listener the request came in on, as Kafka does
ENDPOINT_APIS = frozenset((ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER))
# the APIs whose handlers take more than (header, body): the rest (most requests) skip their cases
_CALLED_APART = frozenset((ApiKey.JOIN_GROUP, ApiKey.CONSUMER_GROUP_HEARTBEAT, *MUTATION_APIS, ApiKey.END_TXN,
                           *ENDPOINT_APIS, *TELEMETRY_VERSIONS, ApiKey.API_VERSIONS))


# the APIs whose handler alone answers, with (header, body), at once (or a Fetch by a DelayedFetch), never on an io
# thread: without an authorizer and with no quota set, the core calls their handler and encodes the answer; the
# handlers of AFTER_RESPONSE_APIS also get ``write_markers``, work to run once the response is out
AFTER_RESPONSE_APIS = frozenset((ApiKey.END_TXN,))
DIRECT_APIS = frozenset((ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.OFFSET_FOR_LEADER_EPOCH,
                         ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.WRITE_TXN_MARKERS, ApiKey.DESCRIBE_PRODUCERS,
                         ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.LIST_TRANSACTIONS, *AFTER_RESPONSE_APIS))


class RequestRefused(KmemError):
    """A request Kafka answers by closing the connection: an API or version the broker does not serve."""


def _client_host(request):
    """The client's address as Kafka's group coordinator records it (``/127.0.0.1``); "" once gone."""
    channel = request.processor.selector.channel(request.connection_id)
    try:
        return "/" + channel.transport.sock.getpeername()[0]
    except (AttributeError, OSError):
        return ""


def _client_address(request):
    """The client's IP address, as Kafka's authorizer matches ACL hosts (``InetAddress.getHostAddress``)."""
    return java_host_address(_client_host(request)[1:])


def _remember_client_software(request, body):
    """An ApiVersions v3+'s client software name and version (KIP-511), kept with the connection as Kafka's
    ``ClientInformation``: KIP-714's subscriptions match them."""
    channel = request.processor.selector.channel(request.connection_id)
    if channel is not None:
        channel.client_software = (body.client_software_name or "", body.client_software_version or "")


def _telemetry_client(request, header):
    """What KIP-714's ``match`` selectors see of the client of a request (Kafka's
    ``ClientMetricsInstanceMetadata``)."""
    channel = request.processor.selector.channel(request.connection_id)
    try:
        address, port = channel.transport.sock.getpeername()[:2]
    except (AttributeError, OSError):
        address, port = "", ""
    name, version = channel.client_software if channel is not None else ("", "")
    return {"client_id": header.client_id or "", "client_software_name": name, "client_software_version": version,
            "client_source_address": java_host_address(address), "client_source_port": str(port)}


def java_host_address(ip):
    """``ip`` as Java's ``InetAddress.getHostAddress`` writes it: an IPv6 address in full, each group without
    leading zeros and no scope (``0:0:0:0:0:0:0:1``), an IPv4-mapped one as IPv4; IPv4 as it is."""
    if ":" not in ip:
        return ip
    try:
        address = ipaddress.IPv6Address(ip.partition("%")[0])
    except ValueError:
        return ip
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return ":".join(f"{int(group, 16):x}" for group in address.exploded.split(":"))


def _creates_transaction_state(header, body):
    """FindCoordinator for a transactional id, or InitProducerId with one: they need ``__transaction_state``."""
    if header.api_key == ApiKey.FIND_COORDINATOR:
        return header.api_version >= 1 and body.key_type == 1
    return header.api_key == ApiKey.INIT_PRODUCER_ID and body.transactional_id is not None


class RequestDispatcher(DispatchCore):
    """The ``SocketServer`` handler of ``kmem broker`` (see the module docstring). ``served`` counts the
    requests answered by (api key, version); ``request_times`` tallies each API's requests and their times
    (Kafka's ``RequestMetrics``, ``kmem.metrics.REQUEST_TIMES``), marked by the network layer as the request
    goes (``Request.measure``). A request is read, counted and measured by the core (``DispatchCore``), which
    also answers the ``DIRECT_APIS`` while no authorizer and no quota applies; the rest goes to ``_dispatch``."""

    def __init__(self, handlers, admin, coordinator, served, transactions=None, scram_admin=None, authorizer=None,
                 quotas=None, quota_window=(11, 1), telemetry=None):
        self.handlers = handlers
        self.checks = None if authorizer is None else RequestChecks(authorizer, handlers.logs)
        self.coordinator = coordinator
        self.transactions = transactions
        self.served = served
        self.request_times = request_times()
        self.quota_store = quotas
        self.delayed_fetch = DelayedFetch
        self._methods = {key: getattr(handlers, name) for key, name in DATA_APIS.items()}
        self._methods.update({key: getattr(coordinator, name) for key, name in GROUP_APIS.items()})
        self._methods.update({key: getattr(admin, name) for key, name in ADMIN_APIS.items()})
        acls = AclHandlers(authorizer)
        self._methods.update({key: getattr(acls, name) for key, name in ACL_APIS.items()})
        self.produce_quota = self.fetch_quota = self.request_quota = self.mutation_quota = None
        if quotas is not None:
            quota_handlers = ClientQuotaHandlers(quotas)
            self._methods.update({key: getattr(quota_handlers, name) for key, name in QUOTA_APIS.items()})
            self.produce_quota = ClientQuotaManager(quotas, PRODUCER_BYTE_RATE, *quota_window)
            self.fetch_quota = ClientQuotaManager(quotas, CONSUMER_BYTE_RATE, *quota_window)
            self.request_quota = ClientQuotaManager(quotas, REQUEST_PERCENTAGE, *quota_window)
            self.mutation_quota = ControllerMutationQuotaManager(quotas, *quota_window)
        if transactions is not None:
            self._methods.update({key: getattr(transactions, name) for key, name in TXN_APIS.items()})
        if scram_admin is not None:
            self._methods.update({key: getattr(scram_admin, name) for key, name in SCRAM_APIS.items()})
        if telemetry is not None:
            self._methods[ApiKey.GET_TELEMETRY_SUBSCRIPTIONS] = telemetry.get_subscriptions
            self._methods[ApiKey.PUSH_TELEMETRY] = telemetry.push
        self.direct_methods = {key: method for key, method in self._methods.items() if key in DIRECT_APIS}
        self.after_response_apis = AFTER_RESPONSE_APIS

    def api_versions(self, payload):
        """The encoded answer to an ApiVersions request (``payload``), for a SASL channel's authenticator: Kafka
        answers it before the handshake (KIP-35)."""
        started = time.perf_counter_ns()
        try:
            header, body = decode_request(payload)
        except UnsupportedVersionError as e:
            return self._unsupported(e)
        self.count_served(header)
        response = encode_response(header, self.handlers.api_versions(header, body))
        # answered by the authenticator, outside the request path's marks: all of it is local time
        elapsed = time.perf_counter_ns() - started
        times = self.request_times.row(header.api_key)
        times[0] += 1
        times[1] += elapsed
        times[1 + REQUEST_TIMES.index("LocalTimeMs")] += elapsed
        return response

    def _unsupported(self, error):
        """An API version the codec does not know: ApiVersions is answered in its v0 layout (KIP-511's fallback),
        anything else refused."""
        if error.api_key == ApiKey.API_VERSIONS and error.header is not None:
            return api_versions_fallback_response(error.header)
        raise error

    @staticmethod
    def _refuse(header):
        raise RequestRefused(f"{header.api_key.name} v{header.api_version} is not served by kmem broker "
                             f"(client {header.client_id!r})")

    def _dispatch(self, request, header, body, started):
        """The way of a request the core does not answer itself (``DispatchCore``): on an io thread, or through
        the authorizer's checks and the quotas, or to a handler called apart."""
        if header.api_key != ApiKey.PRODUCE and header.api_key != ApiKey.FETCH and self._blocks(header, body):
            return request.offload(lambda _: self._answered(self._answer_blocking, request, header, body))
        response = self._answered(self._answer, request, header, body)
        if response is CLOSE_CONNECTION:
            closing = request.defer()
            closing.fail()
            return closing
        if isinstance(response, (DelayedFetch, DelayedResponse, _Finishing)):
            return self._defer(request, header, body, response, started)
        return response

    def _defer(self, request, header, body, delayed, started):
        """A handler's answer that waits (``delayed``): the request is deferred until it completes."""
        handling_ns = time.perf_counter_ns() - started
        deferred = request.defer()
        deferred.on_cancel(delayed.cancel)
        delayed.start(lambda build: deferred.complete_with(
            lambda: self._respond(request, header, body, build(), handling_ns)))
        return deferred

    def _answered(self, answer, request, header, body):
        """``answer(request, header, body)``; should it raise (a bug), ``_error_answer``."""
        try:
            return answer(request, header, body)
        except Exception:
            response = self._error_answer(header)
            if response is None:
                raise
            return response

    @staticmethod
    def _error_answer(header):
        """While a handler's exception is handled: the request answered as Kafka's ``KafkaApis.handleError``
        answers it, UNKNOWN_SERVER_ERROR, where the response has a top-level error code, else None (the error
        goes on to the network layer, which closes the connection)."""
        response = error_response(header.api_key, header.api_version, ErrorCode.UNKNOWN_SERVER_ERROR)
        if response is None:
            return None
        log.exception("%s v%d from %r failed; answered UNKNOWN_SERVER_ERROR", header.api_key.name,
                      header.api_version, header.client_id)
        return encode_response(header, response)

    def _blocks(self, header, body):
        """Whether the request goes to an io thread (Produce and Fetch, most requests, never do: the caller skips
        them)."""
        api = header.api_key
        if api in BLOCKING_APIS:
            return True
        if api == ApiKey.METADATA:
            return self.handlers.metadata_creates_topics(header.api_version, body)
        if self.transactions is not None and _creates_transaction_state(header, body):
            return not self.transactions.state_topic_exists()
        if api == ApiKey.ADD_OFFSETS_TO_TXN:
            return self.handlers.logs.get_partition(OFFSETS_TOPIC, 0) is None
        if api in GROUP_APIS and api not in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP) or api == ApiKey.FIND_COORDINATOR:
            return self.handlers.logs.get_partition(OFFSETS_TOPIC, 0) is None
        return False

    def _answer_blocking(self, request, header, body):
        return self._answer(request, header, body, prepare=self._create_internal_topic)

    def _create_internal_topic(self, header, body):
        """The internal topic a FindCoordinator or InitProducerId needs, created once the request is authorized."""
        if self.transactions is not None and _creates_transaction_state(header, body):
            self.transactions.create_state_topic()
        elif header.api_key == ApiKey.FIND_COORDINATOR:
            self.coordinator.create_offsets_topic()

    def _answer(self, request, header, body, prepare=None):
        """The response (encoded), None (acks=0), or a delayed response to start; ``prepare(header, body)`` runs
        once the request is authorized, before its handler."""
        started = time.perf_counter_ns()
        finish = None
        if self.checks is not None:
            context = RequestContext(request.principal, _client_address(request), header.api_key.message_name)
            finish = self.checks.check(context, header, body)
            if isinstance(finish, Refused):
                response = refusal_response(header.api_key, header.api_version, finish)
                return None if response is None else encode_response(header, response)
        if prepare is not None:
            prepare(header, body)
        if self._fetch_quota_applies(header, body):
            window_bytes = self.fetch_quota.max_value_in_window(request.principal, header.client_id)
            if window_bytes is not None:
                body.max_bytes = min(body.max_bytes, int(window_bytes))
                body.min_bytes = min(body.min_bytes, body.max_bytes)
        mutation_quota = None
        if header.api_key in MUTATION_APIS and self.mutation_quota is not None and self.mutation_quota.enabled():
            mutation_quota = self.mutation_quota.quota_for(request.principal, header.client_id,
                                                           strict=header.api_version >= MUTATION_APIS[header.api_key])
        if header.api_key not in _CALLED_APART:
            response = self._methods[header.api_key](header, body)
        elif header.api_key == ApiKey.JOIN_GROUP:
            response = self.coordinator.join_group(header, body, client_host=_client_host(request))
        elif header.api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            response = self.coordinator.consumer_group_heartbeat(header, body, client_host=_client_host(request))
        elif header.api_key in MUTATION_APIS:
            response = self._methods[header.api_key](header, body, mutation_quota=mutation_quota)
        elif header.api_key == ApiKey.END_TXN:
            response = self.transactions.end_txn(header, body, write_markers=request.after_response)
        elif header.api_key in ENDPOINT_APIS:
            response = self._methods[header.api_key](header, body, request.listener_name)
        elif header.api_key in TELEMETRY_VERSIONS:
            response = self._methods[header.api_key](header, body, _telemetry_client(request, header))
        else:
            if header.api_key == ApiKey.API_VERSIONS and header.api_version >= 3:
                _remember_client_software(request, body)
            response = self._methods[header.api_key](header, body)
        if isinstance(response, (DelayedFetch, DelayedResponse)):
            return response if finish is None else _Finishing(response, finish)
        if finish is not None:
            response = finish(response)
        if response is CLOSE_CONNECTION:
            return response
        return self._respond(request, header, body, response, time.perf_counter_ns() - started, mutation_quota)

    def _respond(self, request, header, body, response, handling_ns, mutation_quota=None):
        """The encoded ``response``, throttled as the client's quotas have it (see the module docstring); None
        for none (an acks=0 Produce)."""
        if self.request_quota is None or not self.request_quota.enabled():
            if header.api_key == ApiKey.FETCH and not from_follower(header, body):
                self.handlers.fetch_sent(response)
            return None if response is None else encode_response(header, response)
        principal, client_id = request.principal, header.client_id
        throttle_ms = 0
        if response is not None and header.api_key not in REQUEST_QUOTA_EXEMPT and not from_follower(header, body):
            throttle_ms = self.request_quota.record_time(principal, client_id, handling_ns)
        if header.api_key == ApiKey.PRODUCE:
            throttle_ms = max(throttle_ms, self.produce_quota.record(principal, client_id, len(request.payload)))
        if mutation_quota is not None:
            throttle_ms = max(throttle_ms, mutation_quota.throttle_time_ms())
        if header.api_key == ApiKey.FETCH and not from_follower(header, body):
            return self._throttled_fetch(request, header, response, throttle_ms)
        request.throttle(throttle_ms)
        if response is None:
            return None
        if throttle_ms and hasattr(response, "throttle_time_ms"):
            response.throttle_time_ms = throttle_ms
        return encode_response(header, response)

    def _fetch_quota_applies(self, header, body):
        """A consumer's Fetch with quotas set (a follower's, ``replica_id`` >= 0, is exempt, as in Kafka)."""
        if header.api_key != ApiKey.FETCH or self.fetch_quota is None or not self.fetch_quota.enabled():
            return False
        return not from_follower(header, body)

    def _throttled_fetch(self, request, header, response, throttle_ms):
        """A consumer's Fetch response, encoded, or, when it takes the client over its ``consumer_byte_rate`` or
        another quota throttles it (``throttle_ms``), the empty response Kafka sends instead (its bytes not
        counted, by the quota nor in BytesOutPerSec), with ``throttle_time_ms``; the channel is throttled."""
        encoded = encode_response(header, response)
        size = len(encoded) if isinstance(encoded, (bytes, bytearray)) else encoded.size
        throttle_ms = max(throttle_ms, self.fetch_quota.record(request.principal, header.client_id, size))
        if not throttle_ms:
            self.handlers.fetch_sent(response)
            return encoded
        self.fetch_quota.unrecord(request.principal, header.client_id, size)
        close_send(encoded)
        request.throttle(throttle_ms)
        return encode_response(header, messages.FetchResponse(
            throttle_time_ms=throttle_ms, error_code=ErrorCode.NONE, session_id=0, responses=[]))


class _Finishing:
    """A delayed response whose authorization ``finish`` completes it once it is built."""

    def __init__(self, delayed, finish):
        self.delayed = delayed
        self.finish = finish

    def cancel(self):
        self.delayed.cancel()

    def start(self, respond):
        self.delayed.start(lambda build: respond(lambda: self.finish(build())))
