"""Client metrics (KIP-714): the subscriptions clients are given, and the metrics they push, as Kafka's
``ClientMetricsManager`` handles them.

``ClientMetricsSubscriptions`` holds the subscriptions an operator configures as Kafka's ``kafka-client-metrics``
does: IncrementalAlterConfigs on resource type CLIENT_METRICS (16), a resource per subscription name, with
``metrics`` (metric name prefixes, ``*`` for every metric), ``interval.ms`` (100 to 3,600,000; 300,000 when unset)
and ``match`` (``selector=regex`` pairs a client must all match: ``client_instance_id``, ``client_id``,
``client_software_name``, ``client_software_version``, ``client_source_address``, ``client_source_port``; none,
every client). They persist in the log directory as ``client_metrics.json``, replaced atomically with fsync. A
client no subscription matches gets the broker's default one (``client.metrics.default.metrics``, every metric
unless set, and ``client.metrics.default.interval.ms``, kmem's own settings: Kafka has no default).

``ClientTelemetry`` answers GetTelemetrySubscriptions and PushTelemetry. A client gets a client instance id (a
random one if it has none), the union of the metrics and the shortest interval of the subscriptions it matches,
and a subscription id that changes with them; the broker asks for cumulative values (not deltas, so that each push
holds every series as Prometheus has them) compressed with zstd, lz4, gzip or snappy. A push is refused as Kafka
refuses it: with a subscription id that is not the client's current one (UNKNOWN_SUBSCRIPTION_ID: the client asks
again), sooner than its interval after the last (THROTTLING_QUOTA_EXCEEDED), larger than ``telemetry.max.bytes``
(TELEMETRY_TOO_LARGE), compressed otherwise (UNSUPPORTED_COMPRESSION_TYPE), after the client said it was
terminating or without a client instance id (INVALID_REQUEST), or not a decodable OTLP ``MetricsData`` (INVALID_RECORD).
The metrics of a push replace that client's previous ones; ``samples()`` gives them to the Prometheus endpoint
labelled by ``client_instance_id`` and ``client_id`` (at most ``MAX_SERIES`` a client). A client silent for three
of its intervals is forgotten, and at most ``MAX_CLIENTS`` are held (the least recently heard from goes first).
"""
import collections
import logging
import os
import re
import threading
import time
import uuid
import zlib

from kmem.broker.codes import ErrorCode
from kmem.durable import read_json, write_json
from kmem.errors import CorruptRecordError, KmemError
from kmem.protocol import ApiKey, messages

log = logging.getLogger(__name__)

CLIENT_METRICS_RESOURCE = 16          # Kafka's ConfigResource.Type.CLIENT_METRICS
TELEMETRY_VERSIONS = {ApiKey.GET_TELEMETRY_SUBSCRIPTIONS: (0, 0), ApiKey.PUSH_TELEMETRY: (0, 0)}
METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
SUBSCRIPTION_CONFIGS = (METRICS, INTERVAL_MS, MATCH)
ALL_METRICS = "*"
MATCH_SELECTORS = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
                   "client_source_address", "client_source_port")
DEFAULT_INTERVAL_MS, MIN_INTERVAL_MS, MAX_INTERVAL_MS = 300_000, 100, 3_600_000
# Kafka's preference order of the codecs a push may use: zstd, lz4, gzip, snappy
ACCEPTED_COMPRESSION_TYPES = (4, 3, 1, 2)
NO_COMPRESSION = 0
MAX_DECOMPRESSED_BYTES = 32 << 20     # what a push may expand to (a small payload must not become gigabytes)
MAX_CLIENTS = 16_384
MAX_SERIES = 10_000         # the series a client's push may show (a client's metrics are some hundreds)
SUBSCRIPTIONS_FILE = "client_metrics.json"
ZERO_UUID = uuid.UUID(int=0)
_PROMETHEUS_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_PROMETHEUS_LABEL = re.compile(r"[^a-zA-Z0-9_]")


class ClientMetricsConfigError(KmemError):
    """A CLIENT_METRICS config Kafka refuses (INVALID_CONFIG)."""


def _list(value):
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def validate(configs):
    """``configs`` ({name: text}) as Kafka's ``ClientMetricsConfigs.validate`` checks them:
    ``ClientMetricsConfigError`` naming what is wrong."""
    for name in configs:
        if name not in SUBSCRIPTION_CONFIGS:
            raise ClientMetricsConfigError(f"unknown client metrics config {name!r} (known: "
                                           f"{', '.join(SUBSCRIPTION_CONFIGS)})")
    if INTERVAL_MS in configs:
        try:
            interval = int(configs[INTERVAL_MS])
        except (TypeError, ValueError):
            raise ClientMetricsConfigError(f"interval.ms {configs[INTERVAL_MS]!r} is not an integer") from None
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise ClientMetricsConfigError(f"interval.ms {interval} is not between {MIN_INTERVAL_MS} and "
                                           f"{MAX_INTERVAL_MS}")
    for pattern in _list(configs.get(MATCH)):
        selector, equals, regex = pattern.partition("=")
        if not equals or selector.strip() not in MATCH_SELECTORS:
            raise ClientMetricsConfigError(f"match {pattern!r} is not <selector>=<regex> with a selector among "
                                           f"{', '.join(MATCH_SELECTORS)}")
        try:
            re.compile(regex.strip())
        except re.error as e:
            raise ClientMetricsConfigError(f"match {pattern!r}: not a regular expression ({e})") from None


class _Subscription:
    __slots__ = ("metrics", "interval_ms", "match")

    def __init__(self, configs):
        self.metrics = _list(configs.get(METRICS))
        self.interval_ms = int(configs.get(INTERVAL_MS, DEFAULT_INTERVAL_MS))
        self.match = [(selector.strip(), re.compile(regex.strip()))
                      for selector, _, regex in (p.partition("=") for p in _list(configs.get(MATCH)))]

    def matches(self, client):
        return all(pattern.fullmatch(client.get(selector, "")) for selector, pattern in self.match)


class ClientMetricsSubscriptions:
    """The subscriptions configured (see the module docstring), by name; ``version`` counts the changes."""

    def __init__(self, log_dir, default_metrics=(ALL_METRICS,), default_interval_ms=60_000):
        self._path = os.path.join(log_dir, SUBSCRIPTIONS_FILE)
        self._lock = threading.Lock()
        self._configs = read_json(self._path, 1, "subscriptions", "the client metrics subscriptions") or {}
        self._subscriptions = {name: _Subscription(configs) for name, configs in self._configs.items()}
        self._default = _Subscription({METRICS: ",".join(default_metrics), INTERVAL_MS: default_interval_ms})
        self.version = 0

    def names(self):
        with self._lock:
            return sorted(self._configs)

    def configs(self, name):
        """The configs set on ``name`` ({} for none)."""
        with self._lock:
            return dict(self._configs.get(name, {}))

    def alter(self, name, configs, validate_only=False):
        """Set ``name``'s configs to ``configs`` (validated; none left: the subscription goes)."""
        if not name:
            raise ClientMetricsConfigError("a client metrics resource needs a name")
        validate(configs)
        if validate_only:
            return
        with self._lock:
            changed = dict(self._configs)
            if configs:
                changed[name] = dict(configs)
            else:
                changed.pop(name, None)
            write_json(self._path, 1, "subscriptions", changed)
            self._configs = changed
            self._subscriptions = {n: _Subscription(c) for n, c in changed.items()}
            self.version += 1

    def for_client(self, client):
        """``(metrics, interval_ms, version)`` for a client (its selectors' values): the union of the metrics and
        the shortest interval of the subscriptions it matches, else the default subscription's."""
        with self._lock:
            matched = [s for s in self._subscriptions.values() if s.matches(client)] or [self._default]
            version = self.version
        metrics = sorted({prefix for s in matched for prefix in s.metrics})
        if ALL_METRICS in metrics:
            metrics = [ALL_METRICS]
        return metrics, min(s.interval_ms for s in matched), version


class _ClientInstance:
    __slots__ = ("instance_id", "client_id", "metrics", "interval_ms", "subscription_id", "version", "last_get_ms",
                 "last_push_ms", "last_error", "terminating", "series", "heard_ms")

    def __init__(self, instance_id, client, metrics, interval_ms, version, now_ms):
        self.instance_id = instance_id
        self.client_id = client["client_id"]
        self.metrics = metrics
        self.interval_ms = interval_ms
        self.version = version
        # Kafka's ClientMetricsManager.computeSubscriptionId: a hash of what the client is asked for
        digest = zlib.crc32(f"{','.join(metrics)}|{interval_ms}|{instance_id}".encode())
        self.subscription_id = digest - (1 << 32) if digest >= 1 << 31 else digest
        self.last_get_ms = self.last_push_ms = 0
        self.last_error = ErrorCode.NONE
        self.terminating = False
        self.series = []                # [(metric name, kind, {label: value}, value)] of the last push
        self.heard_ms = now_ms


class ClientTelemetry:
    """The GetTelemetrySubscriptions and PushTelemetry handlers (see the module docstring). Thread-safe."""

    def __init__(self, subscriptions, max_bytes=1 << 20, clock_ms=None):
        self.subscriptions = subscriptions
        self.max_bytes = max_bytes
        self._clock = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._clients = collections.OrderedDict()      # instance id -> _ClientInstance, least recently heard first

    @classmethod
    def receiving(cls, subscriptions, max_bytes):
        """A receiver; None (a warning logged) without the OpenTelemetry protobuf package (the metrics extra):
        the clients are then not asked for their metrics."""
        try:
            import opentelemetry.proto.metrics.v1.metrics_pb2  # noqa: F401
        except ImportError:
            log.warning("metrics: client metrics (KIP-714) are not received without opentelemetry-proto "
                        "(pip install 'kmem[metrics]')")
            return None
        return cls(subscriptions, max_bytes)

    def _instance(self, instance_id, client, now):
        """The client's instance, made anew when unknown or when the subscriptions changed since (under the lock)."""
        client = {**client, "client_instance_id": str(instance_id)}
        instance = self._clients.get(instance_id)
        if instance is None or instance.version != self.subscriptions.version:
            metrics, interval, version = self.subscriptions.for_client(client)
            fresh = _ClientInstance(instance_id, client, metrics, interval, version, now)
            if instance is not None:
                fresh.series = instance.series          # what it pushed stays shown until its next push
            instance = self._clients[instance_id] = fresh
        instance.heard_ms = now
        self._clients.move_to_end(instance_id)
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)
        return instance

    def get_subscriptions(self, header, request, client):
        """GetTelemetrySubscriptions; ``client``: the selectors' values of the requesting client."""
        Response = messages.GetTelemetrySubscriptionsResponse
        instance_id = request.client_instance_id
        if instance_id == ZERO_UUID:
            instance_id = uuid.uuid4()
        now = self._clock()
        with self._lock:
            instance = self._instance(instance_id, client, now)
            # Kafka's maybeUpdateGetRequestTimestamp: one request an interval, unless the last answer told the
            # client to ask again
            if instance.last_get_ms + instance.interval_ms > now and instance.last_error not in (
                    ErrorCode.UNKNOWN_SUBSCRIPTION_ID, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE):
                instance.last_error = ErrorCode.THROTTLING_QUOTA_EXCEEDED
                return Response(throttle_time_ms=0, error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED)
            instance.last_get_ms = now
            instance.last_error = ErrorCode.NONE
            return Response(throttle_time_ms=0, error_code=ErrorCode.NONE, client_instance_id=instance_id,
                            subscription_id=instance.subscription_id,
                            accepted_compression_types=list(ACCEPTED_COMPRESSION_TYPES),
                            push_interval_ms=instance.interval_ms, telemetry_max_bytes=self.max_bytes,
                            delta_temporality=False, requested_metrics=list(instance.metrics))

    def push(self, header, request, client):
        """PushTelemetry; ``client`` as for ``get_subscriptions``."""
        def answer(code):
            return messages.PushTelemetryResponse(throttle_time_ms=0, error_code=code)

        instance_id = request.client_instance_id
        if instance_id == ZERO_UUID:
            return answer(ErrorCode.INVALID_REQUEST)
        now = self._clock()
        with self._lock:
            instance = self._instance(instance_id, client, now)
            code = self._refusal(instance, request, now)
            instance.last_error = code
            if code != ErrorCode.NONE:
                return answer(code)
            instance.terminating = request.terminating
        payload = bytes(request.metrics or b"")
        if not payload:
            return answer(ErrorCode.NONE)
        try:
            series = self._decoded(request.compression_type, payload, instance.metrics)
        except (CorruptRecordError, ValueError) as e:
            log.info("client %s (%r): push refused, INVALID_RECORD: %s", instance_id, header.client_id, e)
            with self._lock:
                instance.last_error = ErrorCode.INVALID_RECORD
            return answer(ErrorCode.INVALID_RECORD)
        with self._lock:
            instance.series = series
        return answer(ErrorCode.NONE)

    def _refusal(self, instance, request, now):
        """Kafka's ``validatePushRequest``: the error code a push gets, or NONE (its time then recorded)."""
        if instance.terminating:
            return ErrorCode.INVALID_REQUEST
        # Kafka's maybeUpdatePushRequestTimestamp: the first push after a GetTelemetrySubscriptions, or an
        # interval after the last one; a terminating client's last push always
        if not (instance.last_get_ms > instance.last_push_ms or now - instance.last_push_ms >= instance.interval_ms
                or request.terminating):
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED
        instance.last_push_ms = now
        if request.subscription_id != instance.subscription_id:
            return ErrorCode.UNKNOWN_SUBSCRIPTION_ID
        if request.compression_type not in (NO_COMPRESSION, *ACCEPTED_COMPRESSION_TYPES):
            return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        if len(request.metrics or b"") > self.max_bytes:
            return ErrorCode.TELEMETRY_TOO_LARGE
        return ErrorCode.NONE

    def _decoded(self, compression_type, payload, requested):
        """The series of an OTLP ``MetricsData`` payload (those ``requested`` prefixes name); ``ValueError`` or
        ``CorruptRecordError`` for a payload that is not one."""
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

        from kmem.records.codecs import decompress

        if compression_type != NO_COMPRESSION:
            payload = decompress(compression_type, payload, 2, limit=MAX_DECOMPRESSED_BYTES)
        data = MetricsData()
        try:
            data.ParseFromString(payload)
        except DecodeError as e:
            raise ValueError(f"not an OTLP MetricsData: {e}") from None
        wanted = None if ALL_METRICS in requested else tuple(requested)
        series = []
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if wanted is not None and not metric.name.startswith(wanted):
                        continue
                    series += _series(metric)
        if len(series) > MAX_SERIES:
            log.warning("a client pushed %d series: the first %d are shown", len(series), MAX_SERIES)
            del series[MAX_SERIES:]
        return series

    def samples(self):
        """``[(client instance id, client id, series)]`` of the clients heard from within three of their
        intervals (the others are forgotten)."""
        now = self._clock()
        with self._lock:
            for instance_id in [i for i, c in self._clients.items() if now - c.heard_ms > 3 * c.interval_ms]:
                del self._clients[instance_id]
            return [(str(c.instance_id), c.client_id, c.series) for c in self._clients.values() if c.series]


def _labels(attributes):
    labels = {}
    for attribute in attributes:
        value = attribute.value
        kind = value.WhichOneof("value")
        if kind in ("string_value", "int_value", "double_value", "bool_value"):
            labels[_PROMETHEUS_LABEL.sub("_", attribute.key)] = str(getattr(value, kind))
    return labels


def _series(metric):
    """``[(Prometheus name, kind, labels, value)]`` of an OTLP metric: a gauge's points as gauges, a monotonic
    sum's as counters (another sum's as gauges), a histogram's count and sum."""
    name = _PROMETHEUS_NAME.sub("_", metric.name)
    kind = metric.WhichOneof("data")
    found = []
    if kind in ("gauge", "sum"):
        counter = kind == "sum" and metric.sum.is_monotonic
        for point in getattr(metric, kind).data_points:
            value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
            found.append((name, "counter" if counter else "gauge", _labels(point.attributes), value))
    elif kind == "histogram":
        for point in metric.histogram.data_points:
            found.append((name, "histogram", _labels(point.attributes), (point.count, point.sum)))
    return found
