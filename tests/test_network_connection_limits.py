"""Several listeners on one SocketServer, and Kafka's connection limits (KIP-402, KIP-612) over real sockets:
``max.connections.per.ip`` closes the connection past it at once; a listener's or the broker's
``max.connections`` makes the next connection wait, unaccepted, until one closes (the inter-broker listener
exempt from the broker-wide one); ``max.connection.creation.rate`` delays accepts; every close frees its slot."""
import os
import socket
import threading
import time

import pytest

from network_helpers import closed_by_peer, connect, frame, recv_frame, tls_contexts, wait_until  # noqa: F401
from kmem.network import ConnectionQuotas, ListenerConfig, SaslChannelBuilder, SocketServer, SocketServerConfig


def echo(request):
    return bytes(request.payload)


def open_fds():
    """How many descriptors are open (earlier tests' threads may still close some: compare with <=)."""
    return len(os.listdir("/proc/self/fd"))


def exchange(sock, payload=b"ping"):
    """True when ``payload`` comes back on ``sock``: the server accepted and serves the connection."""
    sock.settimeout(10)
    sock.sendall(frame(payload))
    return recv_frame(sock) == payload


def unanswered(sock, seconds=0.5):
    """True when nothing comes back on ``sock`` within ``seconds`` (the connection waits unaccepted)."""
    sock.settimeout(seconds)
    try:
        return not sock.recv(1)
    except (TimeoutError, socket.timeout):
        return True


def test_each_request_carries_the_listener_it_came_in_on(tls_contexts):
    server_context, client_context = tls_contexts
    listeners = [ListenerConfig("PLAINTEXT"), ListenerConfig("SECURE", ssl_context=server_context)]
    with SocketServer(lambda request: request.listener_name.encode(), listeners=listeners) as server:
        plaintext, secure = server.addresses["PLAINTEXT"], server.addresses["SECURE"]
        assert plaintext != secure and server.address == plaintext
        with connect(plaintext) as sock, connect(secure, client_context) as tls:
            for connection, name in ((sock, b"PLAINTEXT"), (tls, b"SECURE"), (sock, b"PLAINTEXT")):
                connection.sendall(frame(b"which?"))
                assert recv_frame(connection) == name
    assert [t for t in threading.enumerate() if t.name.startswith("kmem-")] == []


def test_a_listener_that_cannot_bind_leaves_no_socket_open():
    fds = open_fds()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = SocketServer(echo, listeners=[ListenerConfig("FIRST"), ListenerConfig("SECOND", port=port)])
        with pytest.raises(OSError) as refused:
            server.start()
        assert refused.value.filename == f"127.0.0.1:{port}"
        assert open_fds() <= fds + 1        # the busy socket only
    assert not server.running


@pytest.mark.parametrize("settings, allowed", [
    ({"max_connections_per_ip": 3}, 3),
    ({"max_connections_per_ip": 0, "max_connections_per_ip_overrides": "localhost:2"}, 2),
], ids=["max.connections.per.ip", "overrides"])
def test_a_connection_over_the_per_ip_limit_is_closed_at_once_and_a_close_frees_a_slot(settings, allowed):
    fds = open_fds()
    with SocketServer(echo, **settings) as server:
        socks = [connect(server.address) for _ in range(allowed)]
        assert all(exchange(sock) for sock in socks)
        with connect(server.address) as refused:
            assert closed_by_peer(refused)
        socks.pop().close()
        assert wait_until(lambda: server.quotas.total == allowed - 1)
        with connect(server.address) as again:
            assert exchange(again)
        for sock in socks:
            sock.close()
        assert wait_until(lambda: server.quotas.total == 0)
    assert open_fds() <= fds


def test_at_a_listeners_max_connections_the_next_connection_waits_until_one_closes():
    with SocketServer(echo, listeners=[ListenerConfig(max_connections=2)]) as server:
        first, second = connect(server.address), connect(server.address)
        assert exchange(first) and exchange(second)
        with connect(server.address) as waiting:       # the kernel's backlog holds it; the server does not accept
            waiting.sendall(frame(b"waiting"))
            assert unanswered(waiting)
            assert server.quotas.count("PLAINTEXT") == 2
            first.close()
            waiting.settimeout(10)
            assert recv_frame(waiting) == b"waiting"
            assert server.quotas.count("PLAINTEXT") == 2
        second.close()
        assert wait_until(lambda: server.quotas.total == 0)


def test_the_inter_broker_listener_is_exempt_from_the_broker_wide_max_connections():
    listeners = [ListenerConfig("EXTERNAL"), ListenerConfig("INTERNAL")]
    # one processor: each processor closes the least recently used of its own connections, as in Kafka
    with SocketServer(echo, max_connections=2, num_network_threads=1, listeners=listeners,
                      protected_listener="INTERNAL") as server:
        external, internal = server.addresses["EXTERNAL"], server.addresses["INTERNAL"]
        older, newer = connect(external), connect(external)
        assert exchange(older) and exchange(newer) and exchange(older, b"again") and exchange(newer, b"again")
        with connect(internal) as local:
            assert exchange(local)              # past max.connections: the protected listener is served,
            assert closed_by_peer(older)        # and, as in Kafka, the least recently used other connection goes
            assert exchange(newer)
            older.close()
            with connect(external) as waiting:
                waiting.sendall(frame(b"waiting"))
                assert unanswered(waiting)      # the protected connection counts in the total
                local.close()
                waiting.settimeout(10)
                assert recv_frame(waiting) == b"waiting"
        newer.close()


def test_without_a_protected_listener_the_broker_wide_limit_holds_on_every_listener():
    config = SocketServerConfig(max_connections=1)
    quotas = ConnectionQuotas(config, [ListenerConfig("EXTERNAL"), ListenerConfig("INTERNAL")])
    woken = []
    assert quotas.delay("EXTERNAL", lambda: woken.append("EXTERNAL")) == 0
    assert quotas.acquire("EXTERNAL", "127.0.0.1") == 0
    assert quotas.delay("INTERNAL", lambda: woken.append("INTERNAL")) == float("inf")
    quotas.release("EXTERNAL", "127.0.0.1")
    assert woken == ["INTERNAL"] and quotas.delay("INTERNAL", woken.append) == 0
    # one listener only: Kafka protects the inter-broker listener only when there are others
    alone = ConnectionQuotas(config, [ListenerConfig("INTERNAL")], protected="INTERNAL")
    assert alone.acquire("INTERNAL", "127.0.0.1") == 0
    assert alone.delay("INTERNAL", woken.append) == float("inf")


def test_max_connection_creation_rate_delays_accepts():
    with SocketServer(echo, max_connection_creation_rate=2) as server:
        started = time.monotonic()
        socks = [connect(server.address) for _ in range(3)]
        try:
            for sock in socks:
                sock.sendall(frame(b"r"))
            assert [recv_frame(sock) for sock in socks] == [b"r"] * 3
            # two a second: the first two at once, the third once the rate allows it, half a second later
            assert time.monotonic() - started >= 0.45
        finally:
            for sock in socks:
                sock.close()


class _Refuse:
    enabled = ["PLAIN"]

    @staticmethod
    def server(mechanism):
        from kmem.broker.security.plain import PlainServer
        return PlainServer({"alice": "alice-secret"})


def _close_by_failed_authentication(sock):
    sock.sendall(frame(b"\0\3\0\1\0\0\0\1\0\0"))        # a Metadata request before the SASL handshake
    assert closed_by_peer(sock)


def _close_by_idleness(sock):
    assert closed_by_peer(sock)


def _close_by_oversized_frame(sock):
    sock.sendall(b"\x7f\xff\xff\xff")
    assert closed_by_peer(sock)


@pytest.mark.parametrize("close", [_close_by_failed_authentication, _close_by_idleness, _close_by_oversized_frame],
                         ids=["failed authentication", "idle", "oversized frame"])
def test_a_connection_the_server_closes_frees_its_slot(close):
    builder = SaslChannelBuilder(_Refuse(), api_versions=None, failed_authentication_delay_ms=0)
    sasl = close is _close_by_failed_authentication
    listener = ListenerConfig(channel_builder=builder if sasl else None)
    config = SocketServerConfig(max_connections_per_ip=1, connections_max_idle_ms=200 if close is _close_by_idleness
                                else -1, socket_request_max_bytes=1 << 20)
    with SocketServer(echo, config, listeners=[listener]) as server:
        with connect(server.address) as first:
            close(first)
        assert wait_until(lambda: server.quotas.total == 0)
        with connect(server.address) as second:
            if sasl:
                assert not closed_by_peer(second, timeout=0.3)     # accepted: it waits for its handshake
            else:
                assert exchange(second)
