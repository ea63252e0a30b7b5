"""Sensors with Kafka's metric names, and their export through ``prometheus_client``.

Kafka names are kept because they are what operators search for; the Prometheus export renames
them to Prometheus conventions (base units, ``_total`` for counters).
"""
import collections
import threading
import time

from kmem import _core

# Kafka's defaults: metrics.sample.window.ms = 30000, metrics.num.samples = 2.
DEFAULT_WINDOW_SECONDS = 30.0
DEFAULT_SAMPLES = 2


class SampledRate:
    """Sum of recorded values per second over a sliding set of time windows (Kafka's ``Rate``).

    Recording durations in seconds makes the measure a ratio of time, which is what Kafka's
    ``MemoryPoolAvgDepletedPercent`` reports despite its name. Thread-safe.
    """

    def __init__(self, window_seconds=DEFAULT_WINDOW_SECONDS, samples=DEFAULT_SAMPLES, clock=time.monotonic):
        if window_seconds <= 0 or samples < 1:
            from kmem.errors import ConfigError
            raise ConfigError(f"need window_seconds > 0 and samples >= 1, got {window_seconds}, {samples}")
        self._window = window_seconds
        self._samples = samples
        self._clock = clock
        self._started = clock()
        self._windows = collections.deque()     # [window start, total recorded in it]
        self._lock = threading.Lock()

    def _purge(self, now):
        horizon = now - self._window * self._samples
        while self._windows and self._windows[0][0] <= horizon:
            self._windows.popleft()

    def record(self, value, now=None):
        now = self._clock() if now is None else now
        with self._lock:
            self._purge(now)
            if not self._windows or now - self._windows[-1][0] >= self._window:
                self._windows.append([now, 0.0])
            self._windows[-1][1] += value

    def measure(self, now=None):
        now = self._clock() if now is None else now
        with self._lock:
            self._purge(now)
            oldest = self._windows[0][0] if self._windows else now
            recorded = sum(total for _, total in self._windows)
        # As Kafka: elapsed time counts at least samples-1 full windows, so that a rate measured just
        # after start or after a quiet spell is not inflated by a tiny denominator.
        elapsed = max(now - max(oldest, self._started - self._window), (self._samples - 1) * self._window)
        return recorded / elapsed if elapsed > 0 else 0.0


class Tallies(_core.TalliesCore):
    """Integers that many threads add to without a lock, summed when read (by a scrape).

    Each thread adds to rows of its own: ``row(key)`` is the calling thread's list of ``width`` integers for
    ``key``, made the first time that thread asks for it (the core's ``TalliesCore.row``). A row is written by
    its thread alone, so no addition is lost between threads, and the request path pays a dictionary lookup
    and integer additions. ``totals()`` sums the rows of every thread (of ended ones too)."""

    def __init__(self, width):
        self._width = width
        self._local = threading.local()
        self._tables = []               # every thread's {key: row}
        self._lock = threading.Lock()   # taken by a thread's first row, and by readers

    def totals(self):
        """``{key: [sums]}`` over every thread's rows."""
        with self._lock:
            tables = list(self._tables)
        totals = {}
        for table in tables:
            for key, row in table.copy().items():       # a copy: its thread may add a key meanwhile
                total = totals.get(key)
                totals[key] = list(row) if total is None else [a + b for a, b in zip(total, row)]
        return totals

    def forget(self, keys):
        """Drop the rows of ``keys`` (a deleted topic's: the topic made again starts from zero, as in Kafka)."""
        with self._lock:
            tables = list(self._tables)
        for table in tables:
            for key in keys:
                table.pop(key, None)


# Kafka's BrokerTopicMetrics meters, in the order of a topic's row of ``Handlers.topic_stats``
BROKER_TOPIC_METERS = ("MessagesInPerSec", "BytesInPerSec", "BytesOutPerSec", "FailedProduceRequestsPerSec",
                       "FailedFetchRequestsPerSec", "TotalProduceRequestsPerSec", "TotalFetchRequestsPerSec")
MESSAGES_IN, BYTES_IN, BYTES_OUT, FAILED_PRODUCE, FAILED_FETCH, TOTAL_PRODUCE, TOTAL_FETCH = \
    range(len(BROKER_TOPIC_METERS))
ALL_TOPICS = None       # the row key of every topic together (Kafka's ``BrokerTopicStats.allTopicsStats``)


def broker_topic_stats():
    """The tallies of Kafka's ``BrokerTopicStats``: a row per topic and one for all topics (``ALL_TOPICS``)."""
    return Tallies(len(BROKER_TOPIC_METERS))


# Kafka's RequestMetrics timers, in the order of an API's row of ``request_times`` after its count of requests
# (nanoseconds): from the request read to its response sent, and the parts of that (Kafka's RequestChannel
# marks): waiting for an io thread, handled, parked in a purgatory, the response waiting for the network
# thread (and, parked, its build there), the response being written.
REQUEST_TIMES = ("TotalTimeMs", "RequestQueueTimeMs", "LocalTimeMs", "RemoteTimeMs", "ResponseQueueTimeMs",
                 "ResponseSendTimeMs")


def request_times():
    """The tallies of Kafka's ``RequestMetrics`` times: a row per API key, [requests, *REQUEST_TIMES in ns]."""
    return Tallies(1 + len(REQUEST_TIMES))


# Kafka sensor name -> (Prometheus name, kind, help, scale to base units)
_POOL_METRICS = {
    "MemoryPoolAvailable": ("kmem_memory_pool_available_bytes", "gauge",
                            "Bytes the pool can still hand out (negative after over-allocation).", 1),
    "MemoryPoolUsed": ("kmem_memory_pool_used_bytes", "gauge", "Bytes handed out and not yet released.", 1),
    "MemoryPoolAvgDepletedPercent": ("kmem_memory_pool_depleted_ratio", "gauge",
                                     "Share of recent time the pool refused allocations (0..1).", 1),
    "MemoryPoolDepletedTimeTotal": ("kmem_memory_pool_depleted_seconds_total", "counter",
                                    "Total time the pool refused allocations.", 1e-3),
}


class PoolCollector:
    """A ``prometheus_client`` collector for one or more pools, labelled by pool name."""

    def __init__(self, pools):
        self._pools = dict(pools)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families = {}
        for kafka_name, (name, kind, help_text, _) in _POOL_METRICS.items():
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            # CounterMetricFamily appends _total itself.
            families[kafka_name] = family(name.removesuffix("_total"), help_text, labels=["pool"])
        for pool_name, pool in self._pools.items():
            for kafka_name, value in pool.metrics().items():
                families[kafka_name].add_metric([pool_name], value * _POOL_METRICS[kafka_name][3])
        return list(families.values())


def register_pool(pool, name="default", registry=None):
    """Export ``pool``'s sensors to Prometheus (the default registry unless one is given).

    Returns the collector, so that it can be unregistered.
    """
    try:
        from prometheus_client import REGISTRY
    except ImportError as exc:  # an optional dependency: say how to get it
        raise ImportError("prometheus export needs prometheus_client: pip install 'kmem[metrics]'") from exc
    collector = PoolCollector({name: pool})
    (registry or REGISTRY).register(collector)
    return collector


class MetricsEndpoint:
    """Serves a registry in Prometheus' text format at ``/metrics`` on 127.0.0.1 (the JMX exporter's place).

    One thread serves every scrape in turn (``wsgiref``): no thread per connection, and nothing on the
    broker's request path. Another path is answered 404; a malformed request line gets ``wsgiref``'s 400.
    Port 0 picks a free port (``address`` tells which).
    """

    def __init__(self, registry, port=0, host="127.0.0.1"):
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app

        metrics_app = make_wsgi_app(registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO") != "/metrics":
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"only /metrics is served\n"]
            return metrics_app(environ, start_response)

        class QuietHandler(WSGIRequestHandler):
            timeout = 5.0       # a client that sends nothing cannot hold the one serving thread

            def log_message(self, *args):
                pass

        self._httpd = make_server(host, port, app, handler_class=QuietHandler)
        self.address = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="kmem-metrics-http", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def _jmx_exporter_name(kafka_name):
    """The name the Prometheus JMX exporter's Kafka rules give a SocketServer value: ``RequestQueueSize`` of
    ``kafka.network:type=RequestChannel`` and the attributes of ``kafka.server:type=socket-server-metrics``."""
    if kafka_name == "RequestQueueSize":
        return "kafka_network_requestchannel_requestqueuesize"
    return "kafka_server_socket_server_metrics_" + kafka_name.replace("-", "_")


class SocketServerCollector:
    """A ``prometheus_client`` collector for ``SocketServer.metrics()`` besides its pool (``PoolCollector``):
    the request queue and, with a SASL listener, the authentication counts, read at each scrape."""

    def __init__(self, server):
        self._server = server

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        for kafka_name, value in self._server.metrics().items():
            if kafka_name not in _POOL_METRICS:
                yield GaugeMetricFamily(_jmx_exporter_name(kafka_name), f"SocketServer's {kafka_name}", value=value)


def prometheus_registry():
    """A registry of its own (not the process-wide one); ``ConfigError`` without ``prometheus_client``."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        from kmem.errors import ConfigError
        raise ConfigError("metrics.port needs prometheus_client: pip install 'kmem[metrics]'") from None
    return CollectorRegistry()


class BrokerCollector:
    """A ``prometheus_client`` collector for a ``kmem.broker.Broker``, read at each scrape, under the names the
    Prometheus JMX exporter's Kafka rules give Kafka's MBeans: the requests answered per API and version
    (``RequestMetrics``' ``RequestsPerSec``) and their total time (``TotalTimeMs``), the messages, bytes and
    requests per topic and for all topics (``BrokerTopicMetrics``), each partition's size, log start and log end
    offsets (``Log``), the fetch purgatory's size (``DelayedOperationPurgatory``), the group coordinator's groups
    by state and offsets (``GroupMetadataManager``); with kafka-exporter's names each group's members, committed
    offsets and lag; and the transactional ids by state. The coordinators' figures are read from what they hold,
    as they are: nothing is taken on the request path."""

    def __init__(self, broker):
        self._broker = broker

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from kmem.protocol import ApiKey

        requests = CounterMetricFamily("kafka_network_requestmetrics_requests",
                                       "Requests answered, by API and version", labels=["request", "version"])
        for (api_key, version), count in sorted(self._broker.requests_served.items()):
            requests.add_metric([ApiKey(api_key).message_name, str(version)], count)
        yield requests
        yield from self._request_times()
        yield from self._broker_topic_metrics()
        families = {name: GaugeMetricFamily(f"kafka_log_log_{name}", text, labels=["topic", "partition"])
                    for name, text in (("size", "Bytes of the partition's segments"),
                                       ("numlogsegments", "The partition's segments"),
                                       ("logstartoffset", "The partition's log start offset"),
                                       ("logendoffset", "The partition's log end offset"))}
        logs = self._broker.logs
        for (topic, partition), log in sorted(logs.partitions().items() if logs is not None else ()):
            labels = [topic, str(partition)]
            families["size"].add_metric(labels, log.size_in_bytes)
            families["numlogsegments"].add_metric(labels, len(log.segments))
            families["logstartoffset"].add_metric(labels, log.log_start_offset)
            families["logendoffset"].add_metric(labels, log.log_end_offset)
        yield from families.values()
        if logs is not None:
            yield from self._log_flushes_and_cleaner(logs)
        purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                      "Requests waiting in a purgatory", labels=["delayedOperation"])
        if self._broker.handlers is not None:
            purgatory.add_metric(["Fetch"], len(self._broker.handlers.fetch_purgatory))
        yield purgatory
        if self._broker.coordinator is not None:
            yield from self._groups()
        if self._broker.transactions is not None:
            transactions = GaugeMetricFamily("kmem_transaction_coordinator_transactional_ids",
                                             "Transactional ids the transaction coordinator holds, by state",
                                             labels=["state"])
            for state, count in self._broker.transactions.state_counts().items():
                transactions.add_metric([state], count)
            yield transactions
        if self._broker.telemetry is not None:
            yield from self._client_metrics()

    def _client_metrics(self):
        """The metrics the clients pushed (KIP-714, ``kmem.broker.telemetry``), under their OpenTelemetry names
        made Prometheus names, labelled by ``client_instance_id``, ``client_id`` and the points' attributes: a
        family per name (of the kind it first came as), a histogram as its count and sum."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": SummaryMetricFamily}
        families = {}
        for instance_id, client_id, series in self._broker.telemetry.samples():
            for name, kind, attributes, value in series:
                family = families.get(name)
                if family is None:
                    family = families[name] = kinds[kind](name, f"{name}, as the client pushed it (KIP-714)")
                labels = {**attributes, "client_instance_id": instance_id, "client_id": client_id}
                if family.type == "summary":
                    if kind == "histogram":
                        family.add_sample(name + "_count", labels, value[0])
                        family.add_sample(name + "_sum", labels, value[1])
                elif kind != "histogram":
                    family.add_sample(family.name + ("_total" if family.type == "counter" else ""), labels, value)
        yield from families.values()

    def _request_times(self):
        """``RequestMetrics``' timers of each API as summaries (count and sum in ms), as the JMX exporter gives
        a Kafka timer's count."""
        from prometheus_client.core import SummaryMetricFamily

        from kmem.protocol import ApiKey

        server = self._broker.server
        totals = sorted(server.handler.request_times.totals().items()) if server is not None else ()
        for index, timer in enumerate(REQUEST_TIMES):
            family = SummaryMetricFamily(f"kafka_network_requestmetrics_{timer.lower()}",
                                         f"RequestMetrics' {timer}: requests and their time in ms, by API",
                                         labels=["request"])
            for api_key, row in totals:
                family.add_metric([ApiKey(api_key).message_name], count_value=row[0], sum_value=row[1 + index] / 1e6)
            yield family

    @staticmethod
    def _log_flushes_and_cleaner(logs):
        """``LogFlushStats``' flush timer (a summary: flushes and their time in ms), the ``LogCleaner`` and
        ``LogCleanerManager`` gauges."""
        from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily

        count, total_ns = logs.flush_stats.totals().get(None, (0, 0))
        yield SummaryMetricFamily("kafka_log_logflushstats_logflushrateandtimems",
                                  "LogFlushStats' LogFlushRateAndTimeMs: log flushes (fsyncs) and their time in ms",
                                  count_value=count, sum_value=total_ns / 1e6)
        cleaner = logs.cleaner.metrics
        for name in ("max-clean-time-secs", "cleaner-recopy-percent", "max-buffer-utilization-percent",
                     "max-compaction-delay-secs"):
            yield GaugeMetricFamily("kafka_log_logcleaner_" + name.replace("-", "_"), f"LogCleaner's {name}",
                                    value=cleaner[name])
        yield GaugeMetricFamily("kafka_log_logcleanermanager_max_dirty_percent", "LogCleanerManager's "
                                "max-dirty-percent", value=cleaner["max-dirty-percent"])
        uncleanable = GaugeMetricFamily("kafka_log_logcleanermanager_uncleanable_partitions_count",
                                        "LogCleanerManager's uncleanable-partitions-count", labels=["logDirectory"])
        uncleanable.add_metric([logs.log_dir], cleaner["uncleanable-partitions-count"])
        yield uncleanable

    def _broker_topic_metrics(self):
        """``BrokerTopicMetrics``' counts per topic (existing topics: a deleted one's are dropped) and, without a
        topic label, for all topics, in one family each as the JMX exporter gives them."""
        from prometheus_client.core import CounterMetricFamily

        handlers, logs = self._broker.handlers, self._broker.logs
        if handlers is None or logs is None:
            return
        totals = handlers.topic_stats.totals()
        everywhere = totals.pop(ALL_TOPICS, [0] * len(BROKER_TOPIC_METERS))
        # The partitions after the counts (and under the log manager's lock): a topic counted then missing was
        # deleted, not made since the counts were read.
        topics = {topic for topic, _ in logs.partitions()}
        deleted = [topic for topic in totals if topic not in topics]
        handlers.topic_stats.forget(deleted)
        for index, meter in enumerate(BROKER_TOPIC_METERS):
            kind = meter.removesuffix("PerSec")
            family = CounterMetricFamily(f"kafka_server_brokertopicmetrics_{kind.lower()}",
                                         f"BrokerTopicMetrics' {meter} count, per topic and (no topic) for all",
                                         labels=["topic"])
            for topic, row in sorted(totals.items()):
                if topic in topics:
                    family.add_metric([topic], row[index])
            family.add_sample(family.name + "_total", {}, everywhere[index])
            yield family

    def _groups(self):
        from prometheus_client.core import GaugeMetricFamily

        from kmem.broker.group.coordinator import COMPLETING, DEAD, EMPTY, PREPARING, STABLE

        # The coordinator's groups as they are now, read without its lock (each read is whole under the GIL).
        groups = list(self._broker.coordinator.groups.values())
        consumer_groups = dict(self._broker.coordinator.consumer_groups.groups)     # KIP-848's: their members
        states = dict.fromkeys((PREPARING, COMPLETING, STABLE, DEAD, EMPTY), 0)
        members = GaugeMetricFamily("kafka_consumergroup_members", "Members of the group", labels=["consumergroup"])
        labels = ["consumergroup", "topic", "partition"]
        current = GaugeMetricFamily("kafka_consumergroup_current_offset", "The group's committed offset",
                                    labels=labels)
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "The partition's log end offset minus the group's "
                                                           "committed offset", labels=labels)
        offsets = 0
        for group in sorted(groups, key=lambda g: g.group_id):
            state = group.state
            states[state] += 1
            committed = group.offsets.copy()
            offsets += len(committed)
            if state == DEAD:
                continue
            members.add_metric([group.group_id], len((consumer_groups.get(group.group_id) or group).members))
            for (topic, partition), offset in sorted(committed.items()):
                log = self._broker.logs.get_partition(topic, partition)
                if log is None or offset.offset < 0:
                    continue
                group_labels = [group.group_id, topic, str(partition)]
                current.add_metric(group_labels, offset.offset)
                lag.add_metric(group_labels, log.log_end_offset - offset.offset)
        prefix = "kafka_coordinator_group_groupmetadatamanager_"
        yield GaugeMetricFamily(prefix + "numgroups", "Groups the coordinator holds", value=len(groups))
        for state, count in states.items():
            yield GaugeMetricFamily(prefix + "numgroups" + state.lower(), f"Groups in state {state}", value=count)
        yield GaugeMetricFamily(prefix + "numoffsets", "Offsets the groups committed", value=offsets)
        yield from (members, current, lag)
