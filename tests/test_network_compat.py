"""Kafka's framing as third-party code speaks it: kafka-python's protocol layer against a kmem server."""
import socket

import pytest

from kmem.network import SocketServer

from network_helpers import tls_contexts  # noqa: F401  (fixture)

kafka_parser = pytest.importorskip("kafka.protocol.parser")
api_versions = pytest.importorskip("kafka.protocol.metadata.api_versions")


def api_versions_handler(request):
    """Decode the request with kafka-python, answer with an ApiVersions response it encodes."""
    decoded = api_versions.ApiVersionsRequest.decode(bytes(request.payload), version=0, header=True)
    response = api_versions.ApiVersionsResponse[0](error_code=0, api_keys=[(18, 0, 3), (3, 0, 12)])
    response.with_header(correlation_id=decoded.header.correlation_id)
    return response.encode(header=True)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_kafka_python_client_talks_to_kmem_server(tls, tls_contexts):
    server_context, client_context = tls_contexts if tls else (None, None)
    protocol = kafka_parser.KafkaProtocol(client_id="kmem-compat")
    correlation_ids = [protocol.send_request(api_versions.ApiVersionsRequest[0]()) for _ in range(5)]
    outgoing = bytes(protocol.send_bytes())     # five framed requests, back to back
    with SocketServer(api_versions_handler, ssl_context=server_context,
                      queued_max_request_bytes=1 << 20, socket_request_max_bytes=1 << 20) as server:
        sock = socket.create_connection(server.address, timeout=10)
        if client_context is not None:
            sock = client_context.wrap_socket(sock, server_hostname="localhost")
        with sock:
            sock.sendall(outgoing)
            responses = []
            while len(responses) < len(correlation_ids):
                data = sock.recv(65536)
                assert data, "server closed the connection"
                responses.extend(protocol.receive_bytes(data))
    assert [cid for cid, _ in responses] == correlation_ids
    for _, response in responses:
        assert response.error_code == 0
        assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [(18, 0, 3), (3, 0, 12)]

