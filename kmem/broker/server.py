"""``Broker``: a single-node Kafka broker built from kmem's parts, for real clients.

- requests are read into a pool bounded by ``queued.max.request.bytes`` (KIP-72, ``kmem.network``), and
  decoded without copying their records (``kmem.protocol``): a Produce appends from the pooled request
  memory, before the handler returns and that memory goes back to the pool;
- Fetch responses are ``kmem.send.Send``s: file regions of the segments for Fetch v4+ (sendfile on plain
  sockets), lazily down-converted chunks for Fetch v0-3 (KIP-283);
- the log directory is Kafka's (``kmem.broker.LogManager``), idempotent producers' state lives in a
  ``PidLedger`` per partition (KIP-1044) and producer ids are never reissued.

``Broker(log_dir, port=0, **settings)`` is a context manager; ``bootstrap_servers`` is its address;
``requests_served`` counts the requests answered by (api key, version).
Settings take Kafka's names, as a ``properties`` dict or snake_case keywords (see ``kmem.broker.settings``).
"""
import collections
import logging
import os
import threading
import time

from kmem.broker.apis.admin import ADMIN_APIS, AdminHandlers
from kmem.broker.apis.handlers import SERVED_VERSIONS, Handlers
from kmem.broker.group.coordinator import GROUP_APIS, WAIT_RESERVE_THREADS, GroupCoordinator
from kmem.broker.log import LogManager
from kmem.broker.settings import BrokerSettings, advertised_host, merge_settings
from kmem.errors import IllegalStateError, KmemError
from kmem.network import SocketServer
from kmem.protocol import (ApiKey, UnsupportedVersionError, api_versions_fallback_response, decode_request,
                           encode_response)

log = logging.getLogger(__name__)


def _client_host(request):
    """The client's address as Kafka's group coordinator records it (``/127.0.0.1``); "" once gone."""
    channel = request.processor.selector.channel(request.connection_id)
    try:
        return "/" + channel.transport.sock.getpeername()[0]
    except (AttributeError, OSError):
        return ""


class RequestRefused(KmemError):
    """A request Kafka answers by closing the connection: an API or version the broker does not serve."""


class Broker:
    """A Kafka broker on one node (see the module docstring). ``start()``/``close()`` or ``with``."""

    def __init__(self, log_dir, port=0, *, host="127.0.0.1", properties=None, ssl_context=None, **settings):
        self.log_dir = os.fspath(log_dir)
        self.settings = BrokerSettings.build(host, port, merge_settings(properties, settings), ssl_context)
        self.logs = None
        self.server = None
        self.handlers = None
        self.coordinator = None
        self.admin = None
        self._stop = threading.Event()
        self.requests_served = collections.Counter()      # (api key, version) -> requests answered
        self._counts_lock = threading.Lock()
        self._maintenance = None
        self._apis = {
            ApiKey.API_VERSIONS: "api_versions", ApiKey.METADATA: "metadata", ApiKey.PRODUCE: "produce",
            ApiKey.FETCH: "fetch", ApiKey.LIST_OFFSETS: "list_offsets", ApiKey.INIT_PRODUCER_ID: "init_producer_id",
            ApiKey.CREATE_TOPICS: "create_topics", ApiKey.DELETE_TOPICS: "delete_topics",
            ApiKey.FIND_COORDINATOR: "find_coordinator",
        }
        self._apis.update(GROUP_APIS)
        self._apis.update(ADMIN_APIS)

    @property
    def node_id(self):
        return self.settings.storage.node_id

    def start(self):
        if self.logs is not None:
            raise IllegalStateError("the broker was already started")
        self.logs = LogManager(self.log_dir, self.settings.storage)
        self.handlers = Handlers(self.logs, self.node_id, self.endpoint)
        self.admin = AdminHandlers(self.logs, self.node_id, self.endpoint)
        self.server = SocketServer(self.handle, self.settings.network)
        try:
            max_waiting = max(self.settings.network.num_io_threads - WAIT_RESERVE_THREADS, 1)
            self.coordinator = GroupCoordinator(self.logs, self.settings.groups, max_waiting=max_waiting)
            self.server.start()
        except BaseException:
            if self.coordinator is not None:
                self.coordinator.close()
            self.logs.close()
            raise
        self._maintenance = threading.Thread(target=self._maintain, name="kmem-broker-maintenance", daemon=True)
        self._maintenance.start()
        host, port = self.server.address
        log.info("listening on %s:%d", host, port)
        return self

    def endpoint(self):
        """The advertised ``(host, port)``: ``advertised.listeners``, else the bound address."""
        bound_host, bound_port = self.server.address
        advertised = self.settings.advertised
        if advertised is None:
            return advertised_host(bound_host), bound_port
        return advertised.host or advertised_host(bound_host), advertised.port or bound_port

    @property
    def bootstrap_servers(self):
        host, port = self.endpoint()
        return f"{host}:{port}"

    def _maintain(self):
        """Retention every ``log.retention.check.interval.ms``, producer expiry every
        ``producer.id.expiration.check.interval.ms``."""
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

    def handle(self, request):
        """The SocketServer handler: decode, answer, encode (bytes or a Send; None for acks=0)."""
        try:
            header, body = decode_request(request.payload)
        except UnsupportedVersionError as e:
            if e.api_key == ApiKey.API_VERSIONS and e.header is not None:
                return api_versions_fallback_response(e.header)
            raise
        served = SERVED_VERSIONS.get(header.api_key)
        if served is None or not served[0] <= header.api_version <= served[1]:
            raise RequestRefused(f"{header.api_key.name} v{header.api_version} is not served by kmem broker "
                                 f"(client {header.client_id!r})")
        with self._counts_lock:
            self.requests_served[(int(header.api_key), header.api_version)] += 1
        if header.api_key == ApiKey.JOIN_GROUP:
            response = self.coordinator.join_group(header, body, client_host=_client_host(request))
        else:
            owner = self.coordinator if header.api_key in GROUP_APIS else \
                self.admin if header.api_key in ADMIN_APIS else self.handlers
            response = getattr(owner, self._apis[header.api_key])(header, body)
        return None if response is None else encode_response(header, response)

    def close(self):
        """Stop serving, then close the logs: checkpoints and the clean-shutdown marker are written."""
        if self.logs is None:
            return
        self._stop.set()
        self.handlers.wake_all()
        self.coordinator.close()
        self.server.close()
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
