"""``Broker``: a single-node Kafka broker built from kmem's parts, for real clients.

- requests are read into a pool bounded by ``queued.max.request.bytes`` (KIP-72, ``kmem.network``), and
  decoded without copying their records (``kmem.protocol``): a Produce appends from the pooled request
  memory, before the handler returns and that memory goes back to the pool;
- each request is answered on the network thread that read it (``kmem.broker.apis.dispatch``); one that
  waits is parked without a thread (``kmem.broker.apis.purgatory``, the group coordinator's delayed
  responses) and one that may block on the disk runs on an io thread; every deadline (parked fetches,
  group sessions and rebalances, offset expiry, transaction timeouts and markers, transactional id expiry)
  is a task on one ``kmem.broker.timer.Timer``, so the broker's threads do not grow with its clients:
  ``num.network.threads`` + ``num.io.threads`` + 4 + an acceptor per listener (the timer, log maintenance,
  the flusher of the segments a roll leaves, the log cleaner of the compacted topics, ``__consumer_offsets``
  and ``__transaction_state`` among them);
- Fetch responses are ``kmem.send.Send``s: file regions of the segments for Fetch v4+ (sendfile on plain
  sockets), lazily down-converted chunks for Fetch v0-3 (KIP-283);
- the log directory is Kafka's (``kmem.broker.LogManager``), idempotent producers' state lives in a
  ``PidLedger`` per partition (KIP-1044) and producer ids are never reissued.

``Broker(log_dir, port=0, **settings)`` is a context manager; ``bootstrap_servers`` is the address of its
first listener (``bootstrap_servers_of(name)`` another's); ``requests_served`` counts the requests answered
by (api key, version). Settings take Kafka's names, as a ``properties`` dict or snake_case keywords (see
``kmem.broker.settings``); ``host`` and ``port``, when given, replace those of the listener in ``listeners``
(without it the broker listens on 127.0.0.1 and a free port; with several listeners, ``port=0`` puts each on
a free port). A start that fails (a busy port, a bad file) leaves a log directory that was new or empty
before it as it was: nothing half-made stays behind.
"""
import collections
import logging
import os
import resource
import shutil
import threading
import time

from kmem.broker.apis.admin import AdminHandlers
from kmem.broker.apis.dispatch import RequestDispatcher
from kmem.broker.apis.handlers import Handlers, served_versions
from kmem.broker.apis.scram_admin import ScramAdminHandlers
from kmem.broker.group.coordinator import GroupCoordinator
from kmem.broker.log import LogManager
from kmem.broker.security import SaslMechanisms, ScramCredentialStore
from kmem.broker.quotas import ClientQuotaStore
from kmem.broker.security.authorizer import StandardAuthorizer
from kmem.broker.settings import BrokerSettings, advertised_host, merge_settings
from kmem.broker.telemetry import TELEMETRY_VERSIONS, ClientMetricsSubscriptions, ClientTelemetry
from kmem.broker.timer import Timer
from kmem.broker.txn.coordinator import TransactionCoordinator
from kmem.broker.txn.markers import TxnMarkerWriter
from kmem.errors import ConfigError, IllegalStateError, InvalidArgumentError
from kmem.network import ListenerConfig, SaslChannelBuilder, SocketServer

log = logging.getLogger(__name__)


def raise_open_files_limit():
    """Raise the soft limit on open files to the hard limit, as the JVM does at start (``MaxFDLimit``): a
    broker holds a descriptor per partition and per connection, and 1,024 is a common default."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:      # an unlimited hard limit cannot be the soft one
            log.info("open files limit (RLIMIT_NOFILE) stays at %d (hard limit %d): %s", soft, hard, e)
            return
    log.info("open files limit (RLIMIT_NOFILE): %d (was %d, hard limit %d)", hard, soft, hard)


def _undo_start(log_dir):
    """A function that removes what a start made of ``log_dir`` if the directory was missing or empty
    before it (else it removes nothing), so that a failed start leaves no formatted directory behind."""
    log_dir = os.path.abspath(log_dir)
    if os.path.isdir(log_dir):
        if os.listdir(log_dir):
            return lambda: None

        def empty_again():
            for name in os.listdir(log_dir):
                path = os.path.join(log_dir, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
        return empty_again
    if os.path.lexists(log_dir):            # not a directory: the start fails without making anything
        return lambda: None
    created = log_dir                       # the outermost directory the start creates
    while not os.path.exists(os.path.dirname(created)):
        created = os.path.dirname(created)
    return lambda: shutil.rmtree(created, ignore_errors=True)


class Broker:
    """A Kafka broker on one node (see the module docstring). ``start()``/``close()`` or ``with``."""

    def __init__(self, log_dir, port=None, *, host=None, properties=None, ssl_context=None, **settings):
        self.log_dir = os.fspath(log_dir)
        self.settings = BrokerSettings.build(host, port, merge_settings(properties, settings), ssl_context)
        self.logs = None
        self.server = None
        self.handlers = None
        self.coordinator = None
        self.transactions = None
        self.admin = None
        self.scram_credentials = None     # the log directory's ScramCredentialStore
        self.authorizer = None          # a StandardAuthorizer when authorizer.class.name is set
        self.timer = None
        self._sasl_mechanisms = []       # each SASL listener's, closed with the broker
        self._stop = threading.Event()
        self.requests_served = collections.Counter()      # (api key, version) -> requests answered
        self._maintenance = None
        self.metrics_endpoint = None    # kmem.metrics.MetricsEndpoint, with metrics.port
        self.telemetry = None           # kmem.broker.telemetry.ClientTelemetry, with metrics.port (KIP-714)

    @property
    def node_id(self):
        return self.settings.storage.node_id

    def start(self):
        if self.logs is not None:
            raise IllegalStateError("the broker was already started")
        raise_open_files_limit()
        undo = _undo_start(self.log_dir)
        try:
            self.logs = LogManager(self.log_dir, self.settings.storage)
        except BaseException:
            undo()
            raise
        self.timer = Timer()
        try:
            self.handlers = Handlers(self.logs, self.node_id, self.endpoint, self.timer, rack=self.settings.rack)
            self.handlers.served = served_versions(self.settings.groups)
            subscriptions = ClientMetricsSubscriptions(self.log_dir, *self.settings.client_metrics_default)
            if self.settings.metrics_port is not None:
                # the endpoint receives the clients' metrics: KIP-714's APIs are advertised, as Kafka advertises
                # them once a ClientTelemetry reporter is configured
                self.telemetry = ClientTelemetry.receiving(subscriptions, self.settings.telemetry_max_bytes)
            if self.telemetry is not None:
                self.handlers.served = {**self.handlers.served, **TELEMETRY_VERSIONS}
            self.admin = AdminHandlers(self.logs, self.node_id, self.endpoint, subscriptions,
                                       rack=self.settings.rack)
            self.scram_credentials = ScramCredentialStore(self.log_dir)
            self.coordinator = GroupCoordinator(self.logs, self.settings.groups, timer=self.timer)
            self.handlers.txn_markers = TxnMarkerWriter(self.logs, self.coordinator)
            self.transactions = TransactionCoordinator(self.logs, self.settings.transactions, timer=self.timer,
                                                       markers=self.handlers.txn_markers, groups=self.coordinator)
            self.handlers.transactions = self.coordinator.transactions = self.transactions
            if self.settings.authorizer is not None:
                self.authorizer = StandardAuthorizer(self.log_dir, self.settings.authorizer)
            quotas = ClientQuotaStore(self.log_dir)
            quota_window = (self.settings.quota_window_num, self.settings.quota_window_size_seconds)
            dispatcher = RequestDispatcher(self.handlers, self.admin, self.coordinator, self.requests_served,
                                           self.transactions, ScramAdminHandlers(self.scram_credentials),
                                           self.authorizer, quotas, quota_window, self.telemetry)
            listeners = [ListenerConfig(served.name, served.listener.host, served.listener.port, served.ssl_context,
                                        self._channel_builder(served.sasl, dispatcher), served.max_connections,
                                        served.max_connection_creation_rate)
                         for served in self.settings.listeners]
            self.server = SocketServer(dispatcher, self.settings.network, listeners=listeners, timer=self.timer,
                                       protected_listener=self.settings.inter_broker_listener,
                                       ssl_principal_mapper=self.settings.ssl_principal_mapper,
                                       ip_connection_rate=quotas.connection_rate, quota_window=quota_window)
            self.server.start()
            if self.settings.metrics_port is not None:
                self.metrics_endpoint = self._metrics_endpoint(self.settings.metrics_port)
        except BaseException:
            if self.server is not None:
                self.server.close()
            self._close_sasl()
            if self.transactions is not None:
                self.transactions.close()
            if self.coordinator is not None:
                self.coordinator.close()
            self.timer.close()
            self.logs.close()
            self.logs = None
            undo()
            raise
        self._maintenance = threading.Thread(target=self._maintain, name="kmem-broker-maintenance", daemon=True)
        self._maintenance.start()
        self.logs.cleaner.start()
        for served in self.settings.listeners:
            host, port = self.server.addresses[served.name]
            log.info("%s listener (%s): listening on %s:%d", served.name, served.protocol, host, port)
            if served.advertised is not None:
                log.info("%s listener: advertising %s:%d to its clients (advertised.listeners)", served.name,
                         *self.endpoint(served.name))
        return self

    def _metrics_endpoint(self, port):
        """The Prometheus endpoint of ``metrics.port``, serving (``kmem.metrics``)."""
        from kmem.metrics import BrokerCollector, MetricsEndpoint, SocketServerCollector, prometheus_registry

        registry = prometheus_registry()
        if self.server.bounded:
            self.server.register_metrics(registry=registry)
        registry.register(SocketServerCollector(self.server))
        registry.register(BrokerCollector(self))
        try:
            endpoint = MetricsEndpoint(registry, port).start()
        except OSError as exc:
            raise ConfigError(f"metrics.port {port}: cannot serve on 127.0.0.1:{port} ({exc})") from None
        log.info("metrics: serving Prometheus' text format on http://%s:%d/metrics", *endpoint.address)
        return endpoint

    def _channel_builder(self, sasl, dispatcher):
        """A SASL listener's authentication (``kmem.network.sasl``): PLAIN's users from its settings, SCRAM's
        credentials from the log directory; None for a listener without SASL."""
        if sasl is None:
            return None
        mechanisms = SaslMechanisms(sasl, self.scram_credentials)
        self._sasl_mechanisms.append(mechanisms)
        return SaslChannelBuilder(mechanisms, dispatcher.api_versions, max_receive_size=sasl.max_receive_size,
                                  failed_authentication_delay_ms=sasl.failed_authentication_delay_ms,
                                  connections_max_reauth_ms=sasl.max_reauth_ms)

    def _close_sasl(self):
        """Stops what the SASL mechanisms run beside the listeners (KIP-768's JWKS refresh)."""
        while self._sasl_mechanisms:
            self._sasl_mechanisms.pop().close()

    def endpoint(self, listener_name=None):
        """The ``(host, port)`` advertised to the clients of listener ``listener_name`` (None: the first):
        its ``advertised.listeners`` entry, else its bound address. Metadata, FindCoordinator and DescribeCluster
        answer with the endpoint of the listener the request came in on, as Kafka does."""
        served = self._listener(listener_name)
        bound_host, bound_port = self.server.addresses[served.name]
        advertised = served.advertised
        if advertised is None:
            return advertised_host(bound_host), bound_port
        return advertised.host or advertised_host(bound_host), advertised.port or bound_port

    def _listener(self, name):
        if name is None:
            return self.settings.listeners[0]
        for served in self.settings.listeners:
            if served.name == name:
                return served
        raise InvalidArgumentError(f"no listener {name!r}: the broker serves "
                                   f"{', '.join(served.name for served in self.settings.listeners)}")

    @property
    def bootstrap_servers(self):
        """``host:port`` of the first listener (``bootstrap_servers_of`` names another)."""
        return self.bootstrap_servers_of()

    def bootstrap_servers_of(self, listener_name=None):
        """``host:port`` advertised by listener ``listener_name`` (None: the first)."""
        host, port = self.endpoint(listener_name)
        return f"{host}:{port}"

    def _maintain(self):
        """Retention every ``log.retention.check.interval.ms`` and producer expiry every
        ``producer.id.expiration.check.interval.ms``: on a thread of their own, as they write and fsync files
        (compaction is the log cleaner's, on its thread)."""
        tasks = [[self.settings.retention_check_interval_ms / 1000, self.logs.maintain],
                 [self.settings.storage.producer_id_expiration_check_interval_ms / 1000,
                  self.logs.remove_expired_producers]]
        for task in tasks:
            task.append(time.monotonic() + task[0])
        while not self._stop.wait(max(min(due for _, _, due in tasks) - time.monotonic(), 0)):
            for task in tasks:
                interval, run, due = task
                if time.monotonic() < due:
                    continue
                task[2] = time.monotonic() + interval
                try:
                    run()
                except Exception:
                    log.exception("log maintenance failed; retrying in %.0f s", interval)

    def close(self):
        """Stop serving, then close the logs: checkpoints and the clean-shutdown marker are written."""
        if self.logs is None:
            return
        self._stop.set()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.handlers.complete_all()
        self.transactions.close()
        self.coordinator.close()
        self.server.close()
        self._close_sasl()
        self.timer.close()
        if self._maintenance is not None:
            self._maintenance.join()
        self.logs.close()
        log.info("shut down cleanly; checkpoints written in %s", self.log_dir)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = f"on {self.bootstrap_servers}" if self.server is not None and self.server.running else "stopped"
        return f"<Broker {state} log_dir={self.log_dir!r}>"
