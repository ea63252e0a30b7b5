"""Sensors with Kafka's metric names, and their export through ``prometheus_client``.

Kafka names are kept because they are what operators search for; the Prometheus export renames
them to Prometheus conventions (base units, ``_total`` for counters).
"""
import collections
import threading
import time

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
    (``RequestMetrics``' ``RequestsPerSec``), each partition's size, log start and log end offsets (``Log``), and
    the fetch purgatory's size (``DelayedOperationPurgatory``)."""

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
        families = {name: GaugeMetricFamily(f"kafka_log_log_{name}", text, labels=["topic", "partition"])
                    for name, text in (("size", "Bytes of the partition's segments"),
                                       ("logstartoffset", "The partition's log start offset"),
                                       ("logendoffset", "The partition's log end offset"))}
        logs = self._broker.logs
        for (topic, partition), log in sorted(logs.partitions().items() if logs is not None else ()):
            labels = [topic, str(partition)]
            families["size"].add_metric(labels, log.size_in_bytes)
            families["logstartoffset"].add_metric(labels, log.log_start_offset)
            families["logendoffset"].add_metric(labels, log.log_end_offset)
        yield from families.values()
        purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                      "Requests waiting in a purgatory", labels=["delayedOperation"])
        if self._broker.handlers is not None:
            purgatory.add_metric(["Fetch"], len(self._broker.handlers.fetch_purgatory))
        yield purgatory
