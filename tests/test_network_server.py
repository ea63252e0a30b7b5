"""SocketServer over real sockets and threads: echo, configuration, failures, bad input, slowloris."""
import asyncio
import errno
import os
import socket
import struct
import threading
import time

import pytest

from kmem.errors import ConfigError, IllegalStateError
from kmem.network import SocketServer, SocketServerConfig, offloaded

from network_helpers import closed_by_peer, connect, frame, recv_frame, request, tls_contexts, wait_until  # noqa: F401


def echo(req):
    return bytes(req.payload)


def threads_named(prefix):
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_echo_and_clean_shutdown(tls, tls_contexts):
    server_context, client_context = tls_contexts if tls else (None, None)
    fds_before = open_fds()
    with SocketServer(echo, queued_max_request_bytes=1 << 20, socket_request_max_bytes=1 << 20,
                      ssl_context=server_context) as server:
        assert request(server.address, b"hello", client_context) == b"hello"
        assert request(server.address, b"", client_context) == b""
        big = os.urandom(1 << 20)
        with connect(server.address, client_context) as sock:
            for _ in range(3):          # several requests on one connection, one in flight at a time
                sock.sendall(frame(big))
                assert recv_frame(sock) == big
        assert wait_until(lambda: server.pool.available_memory == 1 << 20)
    assert threads_named("kmem-") == []
    assert open_fds() == fds_before


def test_pipelined_requests_are_answered_in_order():
    """One request in flight per connection: frames sent back to back are handled one after another."""
    active = []
    overlaps = []

    def handler(req):
        active.append(req.connection_id)
        overlaps.append(active.count(req.connection_id) > 1)
        time.sleep(0.01)
        active.remove(req.connection_id)
        return bytes(req.payload)

    with SocketServer(handler, num_io_threads=4) as server:
        with connect(server.address) as sock:
            sock.sendall(b"".join(frame(b"%d" % i) for i in range(20)))
            assert [recv_frame(sock) for _ in range(20)] == [b"%d" % i for i in range(20)]
    assert not any(overlaps)


def test_config_defaults_and_validation():
    config = SocketServerConfig()
    assert (config.queued_max_request_bytes, config.socket_request_max_bytes, config.queued_max_requests,
            config.num_network_threads, config.num_io_threads, config.connections_max_idle_ms) == (
        -1, 104857600, 500, 1, 8, 600000)
    config = SocketServerConfig.from_properties({"queued.max.request.bytes": "16777216",
                                                 "socket.request.max.bytes": 1048576,
                                                 "queued.max.requests": "10"})
    assert (config.queued_max_request_bytes, config.socket_request_max_bytes, config.queued_max_requests) == (
        16 << 20, 1 << 20, 10)
    with pytest.raises(ConfigError, match="larger or equal to socket.request.max.bytes"):
        SocketServerConfig(queued_max_request_bytes=1000, socket_request_max_bytes=1001)
    SocketServerConfig(queued_max_request_bytes=1001, socket_request_max_bytes=1001)
    for bad in ({"queued.max.request.bytes": 0}, {"queued.max.requests": 0}, {"socket.request.max.bytes": 0},
                {"num.network.threads": 0}, {"connections.max.idle.ms": 0}, {"queued.max.requests": "many"},
                {"no.such.setting": 1}):
        with pytest.raises(ConfigError):
            SocketServerConfig.from_properties(bad)
    for bad in ({"queued_max_request_bytes": "200000000"}, {"queued_max_request_bytes": 2 ** 64},
                {"connections_max_idle_ms": None}, {"connections_max_idle_ms": 0.5}, {"queued_max_requests": 1.5}):
        with pytest.raises(ConfigError):
            SocketServer(echo, **bad)
    with pytest.raises(ConfigError):
        SocketServer(echo, SocketServerConfig(), port=1)


def test_handler_failure_releases_memory_and_closes_connection():
    def handler(req):
        if bytes(req.payload) == b"boom":
            raise RuntimeError("handler failed")
        return b"ok"

    with SocketServer(handler, queued_max_request_bytes=1 << 16, socket_request_max_bytes=1 << 16) as server:
        with connect(server.address) as sock:
            sock.sendall(frame(b"boom"))
            assert closed_by_peer(sock)
        assert request(server.address, b"fine") == b"ok"
        assert wait_until(lambda: server.pool.available_memory == 1 << 16)


@pytest.mark.parametrize("offload", [False, True], ids=["network-thread", "io-thread"])
@pytest.mark.parametrize("exception", [asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit])
def test_handler_raising_a_base_exception_closes_only_its_connection(exception, offload, caplog):
    """Not an Exception (asyncio handlers raise CancelledError): the connection is closed, its memory
    released, and the thread that ran the handler (the only processor, or the only io thread) keeps
    serving."""
    def handler(req):
        if bytes(req.payload) == b"boom":
            raise exception()
        return b"ok"

    with SocketServer(offloaded(handler) if offload else handler, num_io_threads=1, num_network_threads=1,
                      queued_max_request_bytes=1 << 16, socket_request_max_bytes=1 << 16) as server:
        for _ in range(2):
            with connect(server.address) as sock:
                sock.sendall(frame(b"boom"))
                assert closed_by_peer(sock)
        assert request(server.address, b"fine") == b"ok"
        assert wait_until(lambda: server.pool.available_memory == 1 << 16)
        assert len(threads_named("kmem-io-thread-")) == 1 and len(threads_named("kmem-network-processor-")) == 1
    assert exception.__name__ in caplog.text


def test_requests_read_in_a_poll_that_raised_are_answered(caplog):
    """A poll that raises SystemExit (a response's Send raised it, closing that connection) still read the
    other connections' requests: the processor answers them, where it dropped the poll's results before."""
    with SocketServer(echo, num_network_threads=1) as server:
        processor = server.processors[0]
        real = processor.selector

        class RaisingOnce:          # the selector, whose next poll that reads something then raises
            raised = False

            def __getattr__(self, name):
                return getattr(real, name)

            def poll(self, timeout):
                real.poll(timeout)
                if real.completed_receives and not self.raised:
                    self.raised = True
                    raise SystemExit("raised by a response")

        wrapper = processor.selector = RaisingOnce()
        assert request(server.address, b"first") == b"first"
        assert wrapper.raised and "raised by a response" in caplog.text
        assert request(server.address, b"second") == b"second"


class FailingRelease:
    size = 0

    def close(self):
        raise TypeError("release failed")


@pytest.mark.parametrize("offload", [False, True], ids=["network-thread", "io-thread"])
def test_failing_release_still_answers_and_keeps_the_handler_thread(offload, caplog):
    def handler(req):
        payload = bytes(req.payload)
        req._receive.close()
        req._receive = FailingRelease()     # what the server releases after this returns
        return payload

    with SocketServer(offloaded(handler) if offload else handler, num_io_threads=1, num_network_threads=1) as server:
        assert request(server.address, b"first") == b"first"
        assert request(server.address, b"second") == b"second"     # the thread that answered is alive
    assert "release failed" in caplog.text


def test_processor_survives_an_unexpected_error(caplog):
    with SocketServer(echo, num_network_threads=1) as server:
        processor = server.processors[0]
        os_selector = processor.selector._selector      # what the processor's poll waits in
        real_select = os_selector.select
        raised = threading.Event()

        def select_failing_once(timeout):
            if not raised.is_set():
                raised.set()
                raise RuntimeError("injected processor fault")
            return real_select(timeout)

        os_selector.select = select_failing_once
        assert raised.wait(10)
        assert request(server.address, b"still served") == b"still served"
        assert processor.is_alive()
    assert "injected processor fault" in caplog.text


class OutOfDescriptors:
    """The listening socket, its first ``failures`` accepts failing with EMFILE."""

    def __init__(self, sock, failures):
        self.sock, self.failures, self.calls = sock, failures, 0

    def fileno(self):
        return self.sock.fileno()

    def accept(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(errno.EMFILE, "Too many open files")
        return self.sock.accept()

    def close(self):
        self.sock.close()


def test_acceptor_backs_off_while_out_of_descriptors(caplog):
    with SocketServer(echo, num_network_threads=1) as server:
        acceptor, = server._acceptors
        pauses = []
        real_pause = acceptor._pause

        def pause(exc):
            real_pause(exc)
            pauses.append(acceptor._backoff)

        acceptor._pause = pause
        listener = acceptor._listen_socket = OutOfDescriptors(acceptor._listen_socket, failures=5)
        assert request(server.address, b"after the shortage") == b"after the shortage"
        # A doubling pause after each of the five failures, not a busy loop; then the accept, and one that
        # finds the backlog empty.
        assert pauses == [0.01, 0.02, 0.04, 0.08, 0.16] and listener.calls <= 7
    assert caplog.text.count("accept failed") == 1


def test_memory_is_released_when_handling_ends_not_when_sent():
    seen = []
    gate = threading.Event()

    def handler(req):
        gate.wait(10)
        return b"r" * 100

    with SocketServer(offloaded(handler), queued_max_request_bytes=1 << 16,
                      socket_request_max_bytes=1 << 16) as server:
        with connect(server.address) as sock:
            sock.sendall(frame(b"x" * 1000))
            assert wait_until(lambda: server.pool.available_memory == (1 << 16) - 1000)
            # The client does not read yet; the release happens as the handler returns.
            gate.set()
            assert wait_until(lambda: server.pool.available_memory == 1 << 16)
            seen.append(recv_frame(sock))
    assert seen == [b"r" * 100]


def test_client_disconnect_mid_request_and_mid_handling():
    gate = threading.Event()

    def handler(req):
        gate.wait(10)
        return bytes(req.payload)

    with SocketServer(offloaded(handler), queued_max_request_bytes=1 << 20,
                      socket_request_max_bytes=1 << 20) as server:
        size = 1 << 20
        with connect(server.address) as sock:          # half a frame, then gone
            sock.sendall(struct.pack(">i", 4096) + b"x" * 100)
            assert wait_until(lambda: server.pool.available_memory == size - 4096)
        assert wait_until(lambda: server.pool.available_memory == size)
        with connect(server.address) as sock:          # a whole frame, gone while it is being handled
            sock.sendall(frame(b"y" * 5000))
            assert wait_until(lambda: server.pool.available_memory == size - 5000)
        gate.set()
        assert wait_until(lambda: server.pool.available_memory == size)
        assert request(server.address, b"still serving") == b"still serving"


def test_bad_input_keeps_serving_and_pool_recovers():
    limit = 1 << 16
    # A backlog above Kafka's 50: the test opens connections faster than any acceptor takes them, and
    # overflowing SYNs are retried only after a second.
    with SocketServer(echo, queued_max_request_bytes=4 * limit, socket_request_max_bytes=limit,
                      socket_listen_backlog_size=1024) as server:
        for prefix in (-1, -(2 ** 31), limit + 1, 2 ** 31 - 1):
            with connect(server.address) as sock:
                sock.sendall(struct.pack(">i", prefix) + b"garbage")
                assert closed_by_peer(sock)
        with connect(server.address) as sock:          # random garbage: a prefix and whatever follows
            sock.sendall(os.urandom(3000))
        # A thousand connections opened and abandoned: silent ones and ones cut mid-prefix stay open while
        # a well-behaved client is served; ones cut mid-payload are dropped (some with a reset).
        lingering = []
        for i in range(1000):
            sock = socket.create_connection(server.address)
            if i % 2:
                sock.sendall(b"\0\0"[:i % 3])
                lingering.append(sock)
                continue
            sock.sendall(struct.pack(">i", 2000) + b"z" * (i % 50))
            if i % 4 == 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        assert request(server.address, b"well behaved") == b"well behaved"
        for sock in lingering:
            sock.close()
        assert request(server.address, b"still fine") == b"still fine"
        assert wait_until(lambda: server.pool.available_memory == 4 * limit and server.pool.outstanding_count == 0)
        assert wait_until(lambda: sum(len(p.selector.channels) for p in server.processors) == 0)


def test_slowloris_is_cut_off_by_the_idle_timeout():
    """Connections that send a size prefix and stall pin memory only until the idle timeout."""
    limit = 1 << 20
    idle_ms = 1000
    with SocketServer(echo, queued_max_request_bytes=4 * limit, socket_request_max_bytes=limit,
                      connections_max_idle_ms=idle_ms, num_network_threads=2) as server:
        stallers = []
        for _ in range(20):
            sock = socket.create_connection(server.address)
            sock.sendall(struct.pack(">i", limit))
            stallers.append(sock)
        assert wait_until(lambda: server.pool.is_out_of_memory, timeout=5)
        assert request(server.address, b"x" * 1000, timeout=10) == b"x" * 1000
        assert all(closed_by_peer(sock, timeout=idle_ms / 1000 * 3) for sock in stallers)
        assert wait_until(lambda: server.pool.available_memory == 4 * limit)
        for sock in stallers:
            sock.close()


def test_client_that_stops_reading_its_response_is_cut_off_by_the_idle_timeout():
    gate = threading.Event()
    big = b"r" * (16 << 20)

    def handler(req):
        if bytes(req.payload) == b"slow":
            gate.wait(10)       # waiting for us: never idle
            return b"done"
        return big

    with SocketServer(offloaded(handler), connections_max_idle_ms=300, num_network_threads=1) as server:
        selector = server.processors[0].selector
        with connect(server.address) as slow, socket.socket() as stalled:
            slow.sendall(frame(b"slow"))
            assert wait_until(lambda: len(selector.channels) == 1)
            slow_id = selector.channels[0].id
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.settimeout(10)
            stalled.connect(server.address)
            stalled.sendall(frame(b"big"))
            assert stalled.recv(4, socket.MSG_PEEK)     # the response has begun; it is never read
            assert wait_until(lambda: [c.id for c in selector.channels] == [slow_id])
            gate.set()
            assert recv_frame(slow) == b"done"


def test_request_queue_bounds_the_count():
    gate = threading.Event()
    depth = []

    def handler(req):
        gate.wait(10)
        return b"ok"

    with SocketServer(offloaded(handler), queued_max_requests=2, num_io_threads=1, num_network_threads=1) as server:
        offered = []
        real_offload = server.offload
        server.offload = lambda request, *rest: offered.append(request) or real_offload(request, *rest)
        socks = [connect(server.address) for _ in range(6)]
        for sock in socks:
            sock.sendall(frame(b"q"))
        # One request in the handler, two queued, the fourth offered and waiting for room: the processor
        # waits there instead of growing the queue.
        assert wait_until(lambda: len(offered) == 4 and server.requests.qsize() == 2)
        depth.append(server.requests.qsize())
        gate.set()
        assert [recv_frame(sock) for sock in socks] == [b"ok"] * 6
        for sock in socks:
            sock.close()
    assert depth == [2]


def test_metrics_exported():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    with SocketServer(echo, queued_max_request_bytes=1 << 20, socket_request_max_bytes=1 << 20) as server:
        server.register_metrics("broker", registry)
        assert request(server.address, b"m") == b"m"
        assert registry.get_sample_value("kmem_memory_pool_available_bytes", {"pool": "broker"}) == 1 << 20
        assert server.metrics()["MemoryPoolUsed"] == 0
    with SocketServer(echo) as unbounded:
        with pytest.raises(IllegalStateError, match="queued.max.request.bytes"):
            unbounded.register_metrics("unbounded", registry)
        assert "MemoryPoolUsed" not in unbounded.metrics()


class Parking:
    """A handler that parks every request whose payload starts with ``wait``; the test completes them."""

    def __init__(self):
        self.parked = []                # [(payload, Deferred)]
        self.cancelled = []
        self.threads = set()

    def __call__(self, req):
        self.threads.add(threading.current_thread().name)
        payload = bytes(req.payload)
        if not payload.startswith(b"wait"):
            return payload
        deferred = req.defer()
        deferred.on_cancel(lambda: self.cancelled.append(payload))
        self.parked.append((payload, deferred))
        return deferred


def test_deferred_requests_hold_no_thread_nor_memory_and_are_answered_from_any_thread():
    handler = Parking()
    with SocketServer(handler, num_network_threads=1, queued_max_request_bytes=1 << 16,
                      socket_request_max_bytes=1 << 16) as server:
        waiting = [connect(server.address) for _ in range(50)]
        for i, sock in enumerate(waiting):
            sock.sendall(frame(b"wait %d" % i + b"x" * 1000))
        assert wait_until(lambda: len(handler.parked) == 50)
        # Parked on the only network thread: it still answers others, and the pool holds no parked bytes.
        assert request(server.address, b"meanwhile") == b"meanwhile"
        assert wait_until(lambda: server.pool.available_memory == 1 << 16)
        assert handler.threads == {"kmem-network-processor-0"}
        finisher = threading.Thread(target=lambda: [d.complete(p[:7]) for p, d in reversed(handler.parked)])
        finisher.start()
        finisher.join()
        answers = [recv_frame(sock) for sock in waiting]
        assert answers == [(b"wait %d" % i + b"x" * 1000)[:7] for i in range(50)]
        assert all(not d.complete(b"again") for _, d in handler.parked)     # exactly once
        for sock in waiting:
            sock.close()


def test_pipelined_requests_behind_a_deferred_one_wait_their_turn():
    handler = Parking()
    with SocketServer(handler) as server:
        with connect(server.address) as sock:
            sock.sendall(frame(b"wait first") + frame(b"second") + frame(b"third"))
            assert wait_until(lambda: handler.parked)
            sock.settimeout(0.2)
            with pytest.raises(socket.timeout):             # muted until the first is answered
                sock.recv(1)
            sock.settimeout(10)
            handler.parked[0][1].complete(b"first")
            assert [recv_frame(sock) for _ in range(3)] == [b"first", b"second", b"third"]


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_request_sent_while_one_is_deferred_waits_its_turn(tls, tls_contexts):
    """The muted channel is watched for its peer's close; a request arriving meanwhile (librdkafka pipelines them)
    is not a close, on TLS too (where the socket can only be peeked at below OpenSSL)."""
    server_context, client_context = tls_contexts if tls else (None, None)
    handler = Parking()
    with SocketServer(handler, ssl_context=server_context) as server:
        with connect(server.address, client_context) as sock:
            sock.sendall(frame(b"wait first"))
            assert wait_until(lambda: handler.parked)
            sock.sendall(frame(b"second"))
            # the selector saw the bytes: it no longer watches the muted channel for a close
            selector, = [p.selector for p in server.processors if p.selector.channels]
            assert wait_until(lambda: not selector._watching_close or not selector.channels)
            handler.parked[0][1].complete(b"first")
            assert [recv_frame(sock) for _ in range(2)] == [b"first", b"second"]


def test_a_client_leaving_while_deferred_cancels_its_response():
    handler = Parking()
    with SocketServer(handler, num_network_threads=1) as server:
        with connect(server.address) as sock:
            sock.sendall(frame(b"wait gone"))
            assert wait_until(lambda: handler.parked)
        assert wait_until(lambda: handler.cancelled == [b"wait gone"])
        assert not handler.parked[0][1].complete(b"too late")
        assert server.processors[0]._deferred == {}
        assert request(server.address, b"still serving") == b"still serving"


def test_close_sends_responses_completed_as_it_stops_and_cancels_the_rest():
    handler = Parking()
    server = SocketServer(handler).start()
    answered, left = connect(server.address), connect(server.address)
    try:
        answered.sendall(frame(b"wait answered"))
        left.sendall(frame(b"wait left"))
        assert wait_until(lambda: len(handler.parked) == 2)
        dict(handler.parked)[b"wait answered"].complete(b"answered at shutdown")
        server.close()
        assert recv_frame(answered) == b"answered at shutdown"
        assert handler.cancelled == [b"wait left"] and closed_by_peer(left)
    finally:
        answered.close()
        left.close()


def test_close_sends_every_response_completed_as_it_stops_beyond_one_build_slice():
    """Deferred responses built on the network thread are built a slice of time at a time; the ones a slow first
    build leaves queued at shutdown are sent as well (they were once dropped with their connection)."""
    handler = Parking()
    server = SocketServer(handler, num_network_threads=1).start()
    clients = [connect(server.address) for _ in range(3)]
    try:
        for i, sock in enumerate(clients):
            sock.sendall(frame(b"wait %d" % i))
        assert wait_until(lambda: len(handler.parked) == 3)

        def slow_build(answer):
            def build():
                time.sleep(0.01)        # longer than a build slice
                return answer
            return build
        for payload, deferred in handler.parked:
            deferred.complete_with(slow_build(b"built " + payload))
        server.close()
        assert [recv_frame(sock) for sock in clients] == [b"built wait %d" % i for i in range(3)]
    finally:
        for sock in clients:
            sock.close()


def test_work_after_a_response_runs_on_the_network_thread_once_the_response_is_out(caplog):
    """``Request.after_response``: the client has its answer before the work starts (the work here waits
    for the client to say it has it); a failing piece of work is logged and the processor serves on."""
    client_has_answer = threading.Event()
    ran_on = []

    def handler(req):
        payload = bytes(req.payload)
        if payload == b"fail":
            req.after_response(lambda: 1 / 0)
        else:
            req.after_response(lambda: ran_on.append((threading.current_thread().name,
                                                      client_has_answer.wait(10))))
        return payload

    with SocketServer(handler, num_network_threads=1) as server:
        with connect(server.address) as sock:
            sock.sendall(frame(b"work"))
            assert recv_frame(sock) == b"work"
            client_has_answer.set()
            assert wait_until(lambda: ran_on)
            assert ran_on == [("kmem-network-processor-0", True)]
            sock.sendall(frame(b"fail"))
            assert recv_frame(sock) == b"fail"
            sock.sendall(frame(b"again"))
            assert recv_frame(sock) == b"again"
    assert "work after a response failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_a_response_left_on_its_way_by_a_closed_connection_is_timed():
    """Kafka's processDisconnected times the responses in flight on a connection that closes: a client that goes
    before reading a large response still counts in its API's request times."""
    from kmem.metrics import request_times

    tallies = request_times()

    def large(req):
        req.measure(tallies, "large")
        return b"x" * (64 << 20)        # more than the socket buffers take at once

    with SocketServer(large, num_network_threads=1) as server:
        client = connect(server.address)
        client.sendall(frame(b"give me a lot"))
        assert wait_until(lambda: server.processors[0].measured)     # its response is being written
        client.close()
        assert wait_until(lambda: tallies.totals().get("large", [0])[0] == 1)
        assert not server.processors[0].measured
