"""Selector, channel and receive behaviour over real sockets on 127.0.0.1 (Kafka's SelectorTest cases)."""
import os
import socket
import struct
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmem.errors import ConfigError, IllegalStateError, InvalidArgumentError, InvalidReceiveError
from kmem.network import (ChannelMuteEvent, ChannelMuteState, KafkaChannel, NetworkReceive, NetworkSend,
                          PlaintextTransport, Selector)
from kmem.pool import SimpleMemoryPool

from network_helpers import Sender, closed_by_peer, frame, recv_frame, tls_contexts  # noqa: F401
from thread_helpers import switching_often


@pytest.fixture
def listener():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def start_senders(listener, payloads, client_context=None):
    senders = [Sender(listener.getsockname(), data, client_context) for data in payloads]
    for sender in senders:
        sender.start()
    return senders


def accept(listener, selector, names, server_context=None, **kwargs):
    listener.settimeout(10)
    for name in names:
        sock, _ = listener.accept()
        selector.register(name, sock, ssl_context=server_context, **kwargs)


def poll_until(selector, condition, timeout=10.0, poll_timeout=0.2):
    """Poll until ``condition(receives)`` holds; returns every receive completed meanwhile."""
    receives = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition(receives):
        selector.poll(poll_timeout)
        receives.extend(selector.completed_receives)
    return receives


def poll_until_out_of_memory(selector):
    """Poll until the selector is out of memory; returns what completed meanwhile (expected: nothing)."""
    return poll_until(selector, lambda r: selector.is_out_of_memory or r, poll_timeout=0.01)


def record_select_timeouts(selector):
    """The timeouts the selector's next polls pass to the OS select (0: it did not wait)."""
    timeouts = []
    real_select = selector._selector.select

    def select(timeout=None):
        timeouts.append(timeout)
        return real_select(timeout)

    selector._selector.select = select
    return timeouts


def stop(senders):
    for sender in senders:
        sender.stop.set()
    for sender in senders:
        sender.join(10)
        assert sender.error is None, sender.error


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_mute_on_oom(listener, tls, tls_contexts):
    server_context, client_context = tls_contexts if tls else (None, None)
    pool = SimpleMemoryPool(900, 900, strict=False)
    payloads = [os.urandom(900), os.urandom(900)]
    senders = start_senders(listener, [frame(p) for p in payloads], client_context)
    with Selector(pool) as selector:
        accept(listener, selector, ["x", "y"], server_context)
        first = poll_until(selector, lambda r: r)
        assert len(first) == 1
        assert pool.available_memory == 0
        # The other channel has read its size prefix by now (or does so within a few polls): refused.
        later = poll_until(selector, lambda r: selector.is_out_of_memory or r, timeout=5, poll_timeout=0.01)
        assert later == []
        assert selector.is_out_of_memory
        selector.poll(0.01)
        assert selector.completed_receives == []
        assert bytes(first[0].payload) in payloads
        first[0].close()
        assert pool.available_memory == 900
        second = poll_until(selector, lambda r: r)
        assert len(second) == 1
        assert {bytes(first_payload) for first_payload in payloads} == {bytes(p) for p in payloads}
        assert bytes(second[0].payload) in payloads and second[0].source != first[0].source
        assert pool.available_memory == 0
        assert not selector.is_out_of_memory
        second[0].close()
    assert pool.available_memory == 900
    stop(senders)


def test_release_wakes_a_blocked_poll(listener):
    """Beyond Kafka: the release that ends the memory drought wakes poll at once (Kafka waits ≤ 300 ms)."""
    pool = SimpleMemoryPool(900, 900)
    senders = start_senders(listener, [frame(os.urandom(900)), frame(os.urandom(900))])
    with Selector(pool) as selector:
        accept(listener, selector, ["x", "y"])
        first = poll_until(selector, lambda r: r)
        assert poll_until_out_of_memory(selector) == []
        in_select = threading.Event()
        real_select = selector._selector.select

        def select(timeout=None):
            in_select.set()
            return real_select(timeout)

        selector._selector.select = select
        releaser = threading.Thread(target=lambda: in_select.wait(10) and first[0].close())
        releaser.start()
        selector.poll(60.0)         # returns early only if the release wakes it
        releaser.join()
        assert selector.wakeups == 1
        completed = poll_until(selector, lambda r: r)
        assert len(completed) == 1
        completed[0].close()
    stop(senders)


def test_strict_pool_refusal_does_not_spin(listener):
    """A strict pool refuses while some memory is left: the mute holds until the receive fits."""
    pool = SimpleMemoryPool(1000, 1000, strict=True)
    hog = pool.try_allocate(600)
    with Selector(pool) as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["c"])
        client.sendall(frame(b"x" * 500))
        assert poll_until(selector, lambda r: selector.is_out_of_memory, poll_timeout=0.01) == []
        timeouts = record_select_timeouts(selector)
        selector.poll(0.05)
        selector.poll(0.05)
        assert timeouts == [0.05, 0.05] and selector.completed_receives == []     # waited: no retry loop
        pool.release(hog)
        done = poll_until(selector, lambda r: r)
        assert [bytes(r.payload) for r in done] == [b"x" * 500]
        done[0].close()
        client.close()


def test_explicit_mute_survives_memory_recovery(listener):
    pool = SimpleMemoryPool(900, 900)
    clients = {}
    with Selector(pool) as selector:
        for name in ("muted", "a", "b"):
            clients[name] = socket.create_connection(listener.getsockname())
            accept(listener, selector, [name])
        selector.mute("muted")
        clients["muted"].sendall(frame(b"m" * 10))
        clients["a"].sendall(frame(os.urandom(900)))
        clients["b"].sendall(frame(os.urandom(900)))
        first = poll_until(selector, lambda r: r)
        assert len(first) == 1 and first[0].source in ("a", "b")
        assert poll_until_out_of_memory(selector) == []
        first[0].close()
        second = poll_until(selector, lambda r: r)
        assert [r.source for r in second] == [{"a": "b", "b": "a"}[first[0].source]]
        second[0].close()
        # Memory recovery lifted the memory mute only: the explicitly muted channel stayed silent.
        assert poll_until(selector, lambda r: r, timeout=0.3, poll_timeout=0.05) == []
        assert selector.channel("muted").mute_state is ChannelMuteState.MUTED
        selector.unmute("muted")
        last = poll_until(selector, lambda r: r)
        assert [(r.source, bytes(r.payload)) for r in last] == [("muted", b"m" * 10)]
        last[0].close()
    assert pool.available_memory == 900
    for sock in clients.values():
        sock.close()


def test_explicit_mute_of_a_memory_muted_channel_is_kept(listener):
    pool = SimpleMemoryPool(900, 900)
    clients = {}
    with Selector(pool) as selector:
        for name in ("a", "b"):
            clients[name] = socket.create_connection(listener.getsockname())
            accept(listener, selector, [name])
            clients[name].sendall(frame(os.urandom(900)))
        first = poll_until(selector, lambda r: r)
        assert poll_until_out_of_memory(selector) == []
        waiting = {"a": "b", "b": "a"}[first[0].source]
        assert selector.channel(waiting).is_in_mutable_state()
        selector.mute(waiting)
        first[0].close()
        assert poll_until(selector, lambda r: r, timeout=0.3, poll_timeout=0.05) == []
        assert selector.channel(waiting).muted and not selector.is_out_of_memory
        selector.unmute(waiting)
        last = poll_until(selector, lambda r: r)
        assert [r.source for r in last] == [waiting]
        last[0].close()
    for sock in clients.values():
        sock.close()


def test_tls_decrypted_bytes_are_never_stranded(listener, tls_contexts):
    """Two frames in one TLS record: the second sits decrypted in OpenSSL once the socket is drained."""
    server_context, client_context = tls_contexts
    senders = start_senders(listener, [frame(b"one" * 100) + frame(b"two" * 100)], client_context)
    with Selector(SimpleMemoryPool(10_000, 10_000)) as selector:
        accept(listener, selector, ["t"], server_context)
        first = poll_until(selector, lambda r: r)
        assert [bytes(r.payload) for r in first] == [b"one" * 100]
        selector.mute("t")                  # as a server does until its response is sent
        assert selector.channel("t").has_bytes_buffered
        selector.poll(0.05)
        assert selector.completed_receives == []
        selector.unmute("t")
        timeouts = record_select_timeouts(selector)
        selector.poll(5.0)                  # no socket readiness will come: the buffered set must serve it
        assert timeouts == [0]
        assert [bytes(r.payload) for r in selector.completed_receives] == [b"two" * 100]
        for r in first + selector.completed_receives:
            r.close()
    stop(senders)


def test_tls_buffered_and_memory_muted_then_closed(listener, tls_contexts):
    """Kafka's testDisconnectWithIntermediateBufferedBytes: closing such a channel leaves nothing behind."""
    server_context, client_context = tls_contexts
    pool = SimpleMemoryPool(1000, 1000)
    senders = start_senders(listener, [frame(b"a" * 1000) + frame(b"b" * 500)], client_context)
    with Selector(pool) as selector:
        accept(listener, selector, ["t"], server_context)
        first = poll_until(selector, lambda r: r)
        assert pool.available_memory == 0
        # The second frame's prefix is read, memory is refused, its payload stays decrypted in OpenSSL.
        assert poll_until_out_of_memory(selector) == []
        channel = selector.channel("t")
        assert channel.muted and channel.has_bytes_buffered and channel.receive.waiting_for_memory
        # No busy loop: once a poll made no progress, the next ones honour their timeout.
        selector.poll(0.05)
        timeouts = record_select_timeouts(selector)
        selector.poll(0.05)
        selector.poll(0.05)
        assert timeouts == [0.05, 0.05] and selector.completed_receives == []
        selector.close("t")
        assert selector.channels == [] and not selector._buffered_read
        first[0].close()
        assert pool.available_memory == 1000 and pool.outstanding_count == 0
    stop(senders)


def test_tls_buffered_retry_that_gets_memory_lifts_the_memory_mute(listener, tls_contexts):
    """Memory returns while poll waits in select: the buffered retry gets it before any lift check."""
    server_context, client_context = tls_contexts
    pool = SimpleMemoryPool(100_000, 100_000)
    blocker = pool.try_allocate(100_000)
    payload = os.urandom(50_000)
    box = {}
    client_thread = threading.Thread(target=lambda: box.setdefault("sock", client_context.wrap_socket(
        socket.create_connection(listener.getsockname(), timeout=10), server_hostname="localhost")))
    client_thread.start()
    with Selector(pool) as selector:
        accept(listener, selector, ["t"], server_context)
        poll_until(selector, lambda r: selector.channel("t").ready, poll_timeout=0.01)
        client_thread.join(10)
        client = box["sock"]
        client.sendall(frame(payload)[:1004])   # one TLS record: the prefix and the first 1000 bytes
        assert poll_until(selector, lambda r: selector.is_out_of_memory, poll_timeout=0.01) == []
        channel = selector.channel("t")
        assert channel.muted and channel.has_bytes_buffered
        selector.poll(0.01)                     # no progress, so the next poll waits in select
        real_select = selector._selector.select

        def select_while_memory_returns(timeout):
            if not blocker.released:
                pool.release(blocker)
            return real_select(timeout)

        selector._selector.select = select_while_memory_returns
        selector.poll(1.0)
        assert channel.receive.memory_allocated and not channel.muted
        client.sendall(payload[1000:])
        done = poll_until(selector, lambda r: r)
        assert [bytes(r.payload) for r in done] == [payload]
        done[0].close()
        assert pool.available_memory == 100_000
        client.close()


def test_peer_disconnect_mid_receive_releases_memory(listener):
    pool = SimpleMemoryPool(10_000, 10_000)
    with Selector(pool) as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["half"])
        client.sendall(struct.pack(">i", 5000) + b"x" * 100)
        assert poll_until(selector, lambda r: pool.available_memory == 5000, timeout=5) == []
        client.close()
        poll_until(selector, lambda r: "half" in selector.disconnected, timeout=5)
        assert "half" in selector.disconnected
        assert pool.available_memory == 10_000 and selector.channels == []


@pytest.mark.parametrize("prefix", [-1, -(2 ** 31), 1001, 2 ** 31 - 1], ids=["-1", "min", "max+1", "huge"])
def test_invalid_size_prefix_closes_without_allocating(listener, prefix):
    pool = SimpleMemoryPool(10_000, 1000)
    with Selector(pool, max_receive_size=1000) as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["bad"])
        client.sendall(struct.pack(">i", prefix) + b"x" * 100)
        poll_until(selector, lambda r: selector.disconnected, timeout=5)
        assert isinstance(selector.disconnected.get("bad"), InvalidReceiveError)
        assert pool.available_memory == 10_000 and pool.outstanding_count == 0
        assert closed_by_peer(client)
        client.close()


def test_receive_limit_defaults_to_what_the_pool_can_hand_out(listener):
    pool = SimpleMemoryPool(10_000, 1000)
    with pytest.raises(ConfigError, match="max single allocation"):
        Selector(pool, max_receive_size=1001)
    with Selector(pool) as selector:
        assert selector.max_receive_size == 1000
        bad = socket.create_connection(listener.getsockname())
        good = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["bad", "good"])
        bad.sendall(struct.pack(">i", 5000) + b"x" * 100)     # more than the pool can ever grant
        good.sendall(frame(b"fine"))
        disconnected = {}       # over every poll: each poll reports only its own
        receives = poll_until(
            selector, lambda r: disconnected.update(selector.disconnected) or (r and "bad" in disconnected))
        assert [bytes(r.payload) for r in receives] == [b"fine"]
        assert isinstance(disconnected.get("bad"), InvalidReceiveError)
        receives[0].close()
        assert pool.available_memory == 10_000
        bad.close()
        good.close()


def test_unexpected_channel_error_closes_only_that_channel(listener, caplog):
    with Selector() as selector:
        bad = socket.create_connection(listener.getsockname())
        good = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["bad", "good"])

        class BrokenReceive:        # a bug in the middle of a channel's read
            def read_from(self, transport):
                raise RuntimeError("channel bug")

            def close(self):
                pass

        selector.channel("bad").receive = BrokenReceive()
        bad.sendall(frame(b"x"))
        good.sendall(frame(b"fine"))
        disconnected = {}       # over every poll: each poll reports only its own
        receives = poll_until(
            selector, lambda r: disconnected.update(selector.disconnected) or (r and "bad" in disconnected))
        assert [bytes(r.payload) for r in receives] == [b"fine"]
        assert isinstance(disconnected["bad"], RuntimeError) and "channel bug" in caplog.text
        bad.close()
        good.close()


@pytest.mark.parametrize("exception", [SystemExit, KeyboardInterrupt])
def test_a_channel_raising_an_interrupt_ends_the_poll_with_every_channels_results(exception, caplog):
    """A response's Send that raises SystemExit or KeyboardInterrupt closes its channel and the poll raises it,
    but only once every other ready channel's I/O is done: what they read is in the poll's results."""
    class InterruptingSend:
        destination = "failing"
        size = remaining = 10
        completed = False

        def write_to(self, transport):
            raise exception("raised by a response")

        def close(self):
            pass

    failing_client, failing = socket.socketpair()
    reading_client, reading = socket.socketpair()
    with Selector() as selector:
        selector.register("failing", failing)
        selector.register("reading", reading)
        selector.send(InterruptingSend())           # ready to write before the other channel's request comes
        reading_client.sendall(frame(b"request"))
        with pytest.raises(exception):
            selector.poll(1)
        assert [(r.source, bytes(r.payload)) for r in selector.completed_receives] == [("reading", b"request")]
        assert isinstance(selector.disconnected["failing"], exception) and selector.channel("failing") is None
    assert "raised by a response" in caplog.text
    failing_client.close()
    reading_client.close()


def test_connected_reports_channels_registered_before_the_poll(listener, tls_contexts):
    server_context, client_context = tls_contexts
    with Selector() as selector:
        plain = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["plain"])
        selector.poll(0)
        assert selector.connected == ["plain"]
        selector.poll(0)
        assert selector.connected == []
        senders = start_senders(listener, [b""], client_context)
        accept(listener, selector, ["tls"], server_context)
        connected = []
        poll_until(selector, lambda r: connected.extend(selector.connected) or connected, poll_timeout=0.01)
        assert connected == ["tls"]         # once the handshake completes
        plain.close()
        stop(senders)


def test_priority_channel_reads_while_pool_is_empty(listener):
    """KIP-81: a coordinator connection is never starved by bulk data holding the pool."""
    pool = SimpleMemoryPool(900, 900)
    bulk = start_senders(listener, [frame(os.urandom(900)), frame(os.urandom(900))])
    with Selector(pool) as selector:
        accept(listener, selector, ["bulk1", "bulk2"])
        held = poll_until(selector, lambda r: r)
        assert poll_until_out_of_memory(selector) == []
        heartbeat = start_senders(listener, [frame(b"heartbeat" * 50)])
        accept(listener, selector, ["coordinator"], priority=True)
        got = poll_until(selector, lambda r: r, timeout=5)
        assert [(r.source, bytes(r.payload)) for r in got] == [("coordinator", b"heartbeat" * 50)]
        assert isinstance(got[0].payload, bytearray)        # outside the pool
        assert pool.available_memory == 0
        got[0].close()
        held[0].close()
        rest = poll_until(selector, lambda r: r)
        rest[0].close()
    stop(bulk + heartbeat)


def test_sends_are_framed_and_completed(listener, tls_contexts):
    server_context, client_context = tls_contexts
    with Selector() as selector:
        accepted = []
        t = threading.Thread(target=lambda: accepted.append(listener.accept()[0]))
        t.start()
        selector.connect("server", listener.getsockname(), ssl_context=client_context,
                         server_hostname="localhost")
        t.join()
        peer = server_context.wrap_socket(accepted[0], server_side=True, do_handshake_on_connect=False)
        handshake = threading.Thread(target=peer.do_handshake)
        handshake.start()
        poll_until(selector, lambda r: selector.channel("server").ready, poll_timeout=0.05)
        handshake.join()
        payload = os.urandom(3 << 20)       # larger than the socket buffers: many partial writes
        selector.send(NetworkSend("server", payload))
        with pytest.raises(IllegalStateError):
            selector.send(NetworkSend("server", b"second"))
        received = []
        reader = threading.Thread(target=lambda: received.append(recv_frame(peer)))
        reader.start()
        sends = []
        deadline = time.monotonic() + 10
        while not sends and time.monotonic() < deadline:
            selector.poll(0.2)
            sends.extend(selector.completed_sends)
        reader.join()
        assert sends == ["server"] and received == [payload]
        peer.close()


class ScriptedTransport:
    """Hands out a byte stream in given chunk sizes, like a socket that has that much ready per call."""

    ready = True

    def __init__(self, data, chunks):
        self.data, self.chunks, self.pos = data, list(chunks), 0

    def read_into(self, view):
        limit = self.chunks.pop(0) if self.chunks else len(view)
        n = min(len(view), limit, len(self.data) - self.pos)
        view[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n


def test_receive_retries_allocation_on_later_reads():
    pool = SimpleMemoryPool(100, 100)
    hog = pool.try_allocate(100)
    receive = NetworkReceive("r", pool=pool)
    transport = ScriptedTransport(frame(b"p" * 60), [])
    receive.read_from(transport)
    assert receive.size == 60 and receive.waiting_for_memory and not receive.complete
    receive.read_from(transport)
    assert receive.waiting_for_memory
    pool.release(hog)
    receive.read_from(transport)
    assert receive.complete and bytes(receive.payload) == b"p" * 60
    assert pool.available_memory == 40
    receive.close()
    receive.close()
    assert pool.available_memory == 100


def test_a_transport_that_resizes_the_prefix_buffer_is_refused_not_read_past():
    class Shrinking:
        def read_into(self, buffer):
            if isinstance(buffer, bytearray):
                buffer.clear()              # a transport must only fill what it is given
            return 4

    receive = NetworkReceive("r")
    with pytest.raises(IllegalStateError, match="resized the size prefix"):
        receive.read_from(Shrinking())
    assert receive.size is None and not receive.memory_allocated


def test_empty_frame_uses_no_pool_memory():
    pool = SimpleMemoryPool(100, 100)
    receive = NetworkReceive("r", pool=pool)
    receive.read_from(ScriptedTransport(frame(b""), []))
    assert receive.complete and receive.payload == b"" and pool.available_memory == 100
    receive.close()


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=300), chunks=st.lists(st.integers(0, 50), max_size=40),
       mutate=st.one_of(st.none(), st.tuples(st.integers(0, 303), st.integers(0, 255))))
def test_receive_fuzz(payload, chunks, mutate):
    """Mutated real frames read in arbitrary pieces: the right bytes or InvalidReceiveError, no leak."""
    data = bytearray(frame(payload))
    if mutate is not None and mutate[0] < len(data):
        data[mutate[0]] = mutate[1]
    pool = SimpleMemoryPool(1000, 400)
    receive = NetworkReceive("fuzz", max_size=400, pool=pool)
    transport = ScriptedTransport(bytes(data), chunks)
    try:
        for _ in range(len(chunks) + 3):
            receive.read_from(transport)
            if receive.complete:
                break
    except InvalidReceiveError:
        size = struct.unpack(">i", data[:4])[0]
        assert size < 0 or size > 400
        assert pool.outstanding_count == 0
        return
    size = struct.unpack(">i", data[:4])[0]
    if receive.complete:
        assert bytes(receive.payload) == bytes(data[4:4 + size])
    else:
        assert size > len(data) - 4
    receive.close()
    assert pool.available_memory == 1000 and pool.outstanding_count == 0


_KAFKA_TRANSITIONS = {
    ("MUTED", "REQUEST_RECEIVED"): "MUTED_AND_RESPONSE_PENDING",
    ("MUTED_AND_RESPONSE_PENDING", "RESPONSE_SENT"): "MUTED",
    # KIP-219's throttling: muted until the response is sent and the throttle ended, in either order
    ("MUTED_AND_RESPONSE_PENDING", "THROTTLE_STARTED"): "MUTED_AND_THROTTLED_AND_RESPONSE_PENDING",
    ("MUTED_AND_THROTTLED_AND_RESPONSE_PENDING", "RESPONSE_SENT"): "MUTED_AND_THROTTLED",
    ("MUTED_AND_THROTTLED_AND_RESPONSE_PENDING", "THROTTLE_ENDED"): "MUTED_AND_RESPONSE_PENDING",
    ("MUTED_AND_THROTTLED", "THROTTLE_ENDED"): "MUTED",
}


@pytest.mark.parametrize("state", list(ChannelMuteState))
@pytest.mark.parametrize("event", list(ChannelMuteEvent))
def test_mute_state_machine(state, event):
    a, b = socket.socketpair()
    channel = KafkaChannel("c", PlaintextTransport(a))
    channel.mute_state = state
    expected = _KAFKA_TRANSITIONS.get((state.name, event.name))
    if expected is None:
        with pytest.raises(IllegalStateError):
            channel.handle_mute_event(event)
        assert channel.mute_state is state
    else:
        channel.handle_mute_event(event)
        assert channel.mute_state.name == expected
    # Only a plain MUTED channel may be unmuted; a pending response keeps it muted.
    assert channel.maybe_unmute() == (channel.mute_state is ChannelMuteState.NOT_MUTED)
    channel.close()
    b.close()


def test_one_request_in_flight_cycle():
    a, b = socket.socketpair()
    channel = KafkaChannel("c", PlaintextTransport(a))
    channel.mute()
    channel.handle_mute_event(ChannelMuteEvent.REQUEST_RECEIVED)
    assert not channel.maybe_unmute()
    channel.handle_mute_event(ChannelMuteEvent.RESPONSE_SENT)
    assert channel.maybe_unmute() and not channel.muted
    channel.close()
    b.close()


def test_one_completed_receive_per_channel_per_poll(listener):
    with Selector(SimpleMemoryPool(10_000, 1000)) as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["c"])
        client.sendall(frame(b"1" * 10) + frame(b"2" * 10) + frame(b"3" * 10))
        per_poll = []
        deadline = time.monotonic() + 5
        while sum(per_poll) < 3 and time.monotonic() < deadline:
            selector.poll(0.2)
            per_poll.append(len(selector.completed_receives))
            for r in selector.completed_receives:
                r.close()
        assert sum(per_poll) == 3 and max(per_poll) == 1
        client.close()


class RecordingRandom:
    def __init__(self):
        self.shuffles = 0

    def shuffle(self, items):
        self.shuffles += 1
        items.reverse()


def test_ready_channels_are_shuffled_only_when_memory_is_low(listener):
    pool = SimpleMemoryPool(1000, 1000)
    rng = RecordingRandom()
    with Selector(pool, rng=rng) as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["c"])
        client.sendall(frame(b"x" * 10))
        got = poll_until(selector, lambda r: r)
        assert rng.shuffles == 0                # 990 of 1000 bytes free: iteration order kept
        hog = pool.try_allocate(950)            # 40 bytes left, below 10% of the pool
        client.sendall(frame(b"y" * 10))
        got += poll_until(selector, lambda r: len(r) >= 1)
        assert rng.shuffles > 0
        for r in got:
            r.close()
        pool.release(hog)
        client.close()


def test_wakeup_from_another_thread_while_closing_is_silent():
    # A server's shutdown wakes processors whose poll thread may be closing the selector at that moment.
    errors = []
    for _ in range(300):
        selector = Selector()
        stop_waking = threading.Event()

        def wake_until_stopped(selector=selector, stop_waking=stop_waking):
            try:
                while not stop_waking.is_set():
                    selector.wakeup()
            except Exception as exc:        # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        waker = threading.Thread(target=wake_until_stopped)
        waker.start()
        selector.close()
        stop_waking.set()
        waker.join()
    assert errors == []


def test_no_wakeup_is_lost_while_another_one_is_pending():
    """A wakeup skips its write while one is pending: work queued before a drain is seen after it, and
    the first wakeup after a drain writes again, so a poll never sleeps through queued work."""
    selector = Selector()
    queued, seen = [], 0
    done = threading.Event()

    def produce():
        for i in range(20_000):
            queued.append(i)
            selector.wakeup()
        done.set()
        selector.wakeup()       # the loop may be polling again after the last item, before done was set

    longest = 0.0
    with switching_often():
        producer = threading.Thread(target=produce)
        producer.start()
        while not (done.is_set() and seen == len(queued)):
            if seen == len(queued):
                before = time.monotonic()
                selector.poll(5.0)          # returns at once if a wakeup is due
                longest = max(longest, time.monotonic() - before)
            seen = len(queued)
        producer.join()
    selector.close()
    assert longest < 3.0, f"a poll slept {longest:.2f} s through queued work (a wakeup was lost)"


def test_a_muted_channel_watched_for_close_reports_the_peer_leaving(listener):
    with Selector() as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["parked"])
        client.sendall(frame(b"request"))
        assert [bytes(r.payload) for r in poll_until(selector, lambda r: r)] == [b"request"]
        selector.mute("parked")
        selector.watch_close("parked")
        selector.poll(0.05)
        assert selector.disconnected == {} and selector.channel("parked") is not None
        client.close()
        gone = []
        poll_until(selector, lambda r: gone.extend(selector.disconnected) or gone)
        assert gone == ["parked"] and selector.channel("parked") is None


def test_a_pipelined_request_ends_the_close_watch_and_waits_for_the_unmute(listener):
    with Selector() as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["parked"])
        client.sendall(frame(b"first"))
        poll_until(selector, lambda r: r)
        selector.mute("parked")
        selector.watch_close("parked")
        client.sendall(frame(b"second"))        # pipelined while the first waits
        for _ in range(5):                        # not read, not reported as a close, not spinning
            selector.poll(0.05)
            assert selector.completed_receives == [] and selector.disconnected == {}
        assert "parked" not in selector._registered_events
        selector.unmute("parked")
        assert [bytes(r.payload) for r in poll_until(selector, lambda r: r)] == [b"second"]
        client.close()


def test_write_now_completes_a_small_send_without_a_poll(listener):
    with Selector() as selector:
        client = socket.create_connection(listener.getsockname())
        accept(listener, selector, ["c"])
        poll_until(selector, lambda r: selector.channel("c").ready, poll_timeout=0.01)
        assert selector.send(NetworkSend("c", b"answer"), write_now=True)
        client.settimeout(5)
        assert recv_frame(client) == b"answer"
        selector.poll(0)
        assert selector.completed_sends == []         # the caller knew at once
        big = NetworkSend("c", b"x" * (64 << 20))   # more than a socket buffer: the rest by polls
        assert not selector.send(big, write_now=True)
        reader = threading.Thread(target=lambda: recv_frame(client))
        reader.start()
        poll_until(selector, lambda r: selector.completed_sends == ["c"])
        reader.join()
        client.close()


def test_the_os_selector_reports_each_file_with_its_data_and_only_the_events_it_waits_for():
    from kmem._core import _Poller

    def ready(timeout):
        """``{data: events}`` (kqueue reports reading and writing apart)."""
        found = {}
        for data, events in poller.select(timeout):
            found[data] = found.get(data, 0) | events
        return found

    poller = _Poller()
    a, b = socket.socketpair()
    try:
        poller.register(a, 1, "a")                      # EVENT_READ
        assert ready(0) == {}                           # nothing to read yet
        b.sendall(b"x")
        assert ready(1) == {"a": 1}
        poller.modify(a, 2, "a-writing")                # EVENT_WRITE: readable bytes are no longer reported
        assert ready(0) == {"a-writing": 2}
        poller.modify(a, 3, "both")
        assert ready(0) == {"both": 3}
        b.close()                                       # the peer gone: reported, limited to what is waited for
        poller.modify(a, 1, "read only")
        assert ready(0) == {"read only": 1}
        with pytest.raises(ValueError):
            poller.modify(a, 4, "no such event")
        with pytest.raises(KeyError):
            poller.register(a, 1, "twice")
        a.close()
        poller.unregister(a)                            # closed first: nothing left to remove, no error
        assert ready(0) == {}
        with pytest.raises(KeyError):
            poller.unregister(a)
    finally:
        a.close()
        b.close()
        poller.close()


def test_a_channel_id_of_none_is_refused(listener):
    with Selector() as selector, socket.create_connection(listener.getsockname()):
        server_side, _ = listener.accept()
        with pytest.raises(InvalidArgumentError):
            selector.register(None, server_side)
        server_side.close()


def test_a_channel_reported_readable_and_writable_apart_is_read_and_written_in_one_poll(listener):
    """kqueue (macOS) reports a socket's reading and its writing as two events: one poll does both."""
    import select

    with Selector() as selector, socket.create_connection(listener.getsockname()) as client:
        accept(listener, selector, ["c"])
        selector.send(NetworkSend("c", b"answer"))         # queued: written once the socket is reported writable
        client.sendall(frame(b"question"))
        server_side = selector.channel("c").transport.sock
        assert select.select([server_side], [], [], 10)[0]   # the question is there to read
        real_select = selector._selector.select

        def apart(timeout=None):
            return [(data, bit) for data, events in real_select(timeout) for bit in (1, 2) if events & bit]

        selector._selector.select = apart
        selector.poll(1.0)
        assert [bytes(r.payload) for r in selector.completed_receives] == [b"question"]
        assert selector.completed_sends == ["c"]
        assert recv_frame(client) == b"answer"
