import socket
import urllib.error
import urllib.request

import pytest

from kmem.network import SocketServer

prometheus_client = pytest.importorskip("prometheus_client")

from broker_helpers import RawConnection, wait_for  # noqa: E402
from test_broker_sasl import SASL_PROPERTIES, authenticate, handshake  # noqa: E402
from kmem.broker import Broker  # noqa: E402
from kmem.metrics import MetricsEndpoint, SocketServerCollector  # noqa: E402


def echo(req):
    return bytes(req.payload)


def scrape(address, path="/metrics"):
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=5) as answer:
        return answer.status, answer.read().decode()


def test_endpoint_serves_the_pool_and_its_changes():
    registry = prometheus_client.CollectorRegistry()
    with SocketServer(echo, queued_max_request_bytes=1 << 20, socket_request_max_bytes=1 << 20) as server:
        server.register_metrics("broker", registry)
        with MetricsEndpoint(registry) as endpoint:
            assert endpoint.address[0] == "127.0.0.1"
            status, text = scrape(endpoint.address)
            assert status == 200
            assert 'kmem_memory_pool_available_bytes{pool="broker"} 1.048576e+06' in text
            assert "kmem_memory_pool_depleted_seconds_total" in text


def test_endpoint_answers_bad_requests_and_keeps_serving():
    registry = prometheus_client.CollectorRegistry()
    with MetricsEndpoint(registry) as endpoint:
        with pytest.raises(urllib.error.HTTPError) as missing:
            scrape(endpoint.address, "/nothing")
        assert missing.value.code == 404
        with socket.create_connection(endpoint.address, timeout=5) as sock:
            sock.sendall(b"GET /metrics HTTP/x.y\r\n\r\n")
            # http.server answers a request line it cannot read in HTTP/0.9's way: a body without status line
            assert b"Error code: 400" in sock.makefile("rb").read()
        assert scrape(endpoint.address)[0] == 200


def sample(address, name):
    """The value of the sample ``name`` (no labels) in a scrape of ``address``."""
    for line in scrape(address)[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the scrape")


def test_authentication_counts_change_as_clients_authenticate(tmp_path):
    prefix = "kafka_server_socket_server_metrics_"
    registry = prometheus_client.CollectorRegistry()
    with Broker(tmp_path, properties=SASL_PROPERTIES) as broker, MetricsEndpoint(registry) as endpoint:
        registry.register(SocketServerCollector(broker.server))
        assert sample(endpoint.address, prefix + "successful_authentication_total") == 0
        assert sample(endpoint.address, "kafka_network_requestchannel_requestqueuesize") == 0
        with RawConnection(broker.bootstrap_servers) as connection:
            assert handshake(connection, "PLAIN").error_code == 0
            assert authenticate(connection, b"\0alice\0alice-secret").error_code == 0
        assert sample(endpoint.address, prefix + "successful_authentication_total") == 1
        with RawConnection(broker.bootstrap_servers) as connection:
            assert handshake(connection, "PLAIN").error_code == 0
            assert authenticate(connection, b"\0alice\0wrong").error_code != 0
        wait_for(lambda: sample(endpoint.address, prefix + "failed_authentication_total") == 1,
                 "the failed authentication counted")
        assert sample(endpoint.address, prefix + "successful_authentication_total") == 1
