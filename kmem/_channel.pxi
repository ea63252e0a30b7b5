# A connection as a selector sees it (kmem.network.channel): its transport, its receive and send in progress,
# and its mute state. The selector asks a channel a dozen things per request; compiled, each is a C call.

# selectors.EVENT_READ and selectors.EVENT_WRITE
cdef enum:
    CHANNEL_EVENT_READ = 1
    CHANNEL_EVENT_WRITE = 2

# Kafka's mute states and their transitions, from kmem.network.channel (which imports this module) when the
# first channel is made.
cdef object _NOT_MUTED = None
cdef object _MUTED = None
cdef dict _MUTE_TRANSITIONS = None


cdef _load_mute_states():
    global _NOT_MUTED, _MUTED, _MUTE_TRANSITIONS
    from kmem.network.channel import MUTE_TRANSITIONS, ChannelMuteState
    _NOT_MUTED, _MUTED = ChannelMuteState.NOT_MUTED, ChannelMuteState.MUTED
    _MUTE_TRANSITIONS = dict(MUTE_TRANSITIONS)


@cython.final
cdef class KafkaChannel:
    """A connection as the selector sees it.

    A *priority* channel (KIP-81) reads its frames into memory outside the pool, so it is never refused
    memory and never memory-muted: a coordinator or heartbeat connection keeps working when the pool is
    exhausted by bulk data.
    """

    cdef readonly object id
    cdef readonly object transport
    cdef readonly bint priority
    cdef readonly object pool
    cdef public long long max_receive_size
    cdef public object mute_state
    cdef public object receive
    cdef public object send
    cdef readonly bint closed
    cdef public object authenticator     # a SASL listener's: frames go to it until it is complete (kmem.network.sasl)
    cdef public object peer_principal    # on an SSL listener, its client certificate's (kmem.network.ssl_principal)
    cdef public object listener          # a server's: the listener it came in on (kmem.network.server.ListenerConfig)
    cdef public object on_close          # called once, when the channel closes
    cdef public object client_software   # (name, version) its ApiVersions v3+ gave (KIP-511), for its handler

    def __init__(self, channel_id, transport, pool=None, max_receive_size=NETWORK_UNLIMITED, priority=False):
        if _MUTE_TRANSITIONS is None:
            _load_mute_states()
        from kmem.network.sasl import ANONYMOUS
        from kmem.pool import NONE
        self.id = channel_id
        self.transport = transport
        self.priority = priority
        self.pool = NONE if priority or pool is None else pool
        self.max_receive_size = max_receive_size
        self.mute_state = _NOT_MUTED
        self.receive = None
        self.send = None
        self.closed = False
        self.authenticator = None
        self.peer_principal = ANONYMOUS
        self.listener = None
        self.on_close = None
        self.client_software = ("", "")

    @property
    def principal(self):
        """``User:<name>`` once SASL authenticated (None before), else ``peer_principal``: its client certificate's
        on an SSL listener, ``User:ANONYMOUS`` without one."""
        return self.peer_principal if self.authenticator is None else self.authenticator.principal

    @property
    def authenticating(self):
        return self.authenticator is not None and not self.authenticator.complete

    @property
    def ready(self):
        return self.is_ready()

    cdef inline bint is_ready(self) except -1:
        return type(self.transport) is PlaintextTransport or bool(self.transport.ready)

    @property
    def muted(self):
        return self.mute_state is not _NOT_MUTED

    @property
    def has_bytes_buffered(self):
        return self.bytes_buffered()

    cdef inline bint bytes_buffered(self) except -1:
        return type(self.transport) is not PlaintextTransport and bool(self.transport.has_bytes_buffered)

    cpdef bint is_in_mutable_state(self) except -1:
        """True when a memory mute may be applied or lifted: a receive has begun, has no memory yet, and
        the transport is ready (a TLS handshake cannot be paused)."""
        return self.receive is not None and not self.receive.memory_allocated and self.is_ready()

    cpdef mute(self):
        if self.mute_state is _NOT_MUTED:
            self.mute_state = _MUTED

    cpdef bint maybe_unmute(self) except -1:
        """Unmute unless a response is pending; returns whether the channel is unmuted."""
        if self.mute_state is _MUTED:
            self.mute_state = _NOT_MUTED
        return self.mute_state is _NOT_MUTED

    cpdef handle_mute_event(self, event):
        state = _MUTE_TRANSITIONS.get((self.mute_state, event))
        if state is None:
            from kmem.errors import IllegalStateError
            raise IllegalStateError(
                f"channel {self.id}: cannot handle {event.name} in mute state {self.mute_state.name}")
        self.mute_state = state

    @property
    def events(self):
        """What the selector should wait for on this channel's socket."""
        return self.wanted_events()

    cdef int wanted_events(self) except -1:
        cdef int events
        if not self.is_ready():
            return self.transport.events
        events = 0 if self.mute_state is not _NOT_MUTED else CHANNEL_EVENT_READ
        if self.send is not None:
            events |= CHANNEL_EVENT_WRITE
        return events

    cpdef bint prepare(self) except -1:
        """Advance the handshake; returns True when the channel became ready by this call."""
        if self.is_ready():
            return False
        self.transport.handshake()
        return self.is_ready()

    cpdef read(self):
        """Read towards the current receive; mutes the channel when the pool refuses memory."""
        if self.receive is None:
            self.receive = NetworkReceive(self.id, self.max_receive_size, self.pool)
        receive = self.receive
        if type(receive) is NetworkReceive:         # the usual one: its steps are C calls
            n = (<NetworkReceive>receive).read_from(self.transport)
            waiting = (<NetworkReceive>receive).is_waiting_for_memory()
        else:
            n = receive.read_from(self.transport)
            waiting = receive.waiting_for_memory
        if waiting and self.is_in_mutable_state():
            self.mute()
        return n

    cpdef maybe_complete_receive(self):
        """The finished receive (ownership passes to the caller), or None."""
        receive = self.receive
        if receive is None:
            return None
        if (<NetworkReceive>receive).is_complete() if type(receive) is NetworkReceive else receive.complete:
            self.receive = None
            return receive
        return None

    cpdef set_send(self, send):
        if self.send is not None:
            from kmem.errors import IllegalStateError
            raise IllegalStateError(f"channel {self.id}: a send is already in progress")
        self.send = send

    cpdef write(self):
        """Write towards the current send; returns it once completed, else None."""
        send = self.send
        if send is None:
            return None
        if type(send) is NetworkSend:               # the usual one: its steps are C calls
            (<NetworkSend>send).write_to(self.transport)
            completed = (<NetworkSend>send).remaining == 0
        else:
            send.write_to(self.transport)
            completed = send.completed
        if completed:
            self.send = None
            return send
        return None

    cpdef close(self):
        """Close the socket and release the memory of a partial receive and what an unfinished send holds
        (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.receive is not None:
            self.receive.close()
            self.receive = None
        if self.send is not None:
            from kmem.send import close_send
            close_send(self.send)
            self.send = None
        self.transport.close()
        if self.on_close is not None:
            self.on_close()

    def __repr__(self):
        return f"<KafkaChannel {self.id} {self.mute_state.name}{' priority' if self.priority else ''}>"


cdef object _sendfile_once = None


@cython.final
cdef class PlaintextTransport:
    """A plain TCP socket as a channel's transport (``kmem.network.transport``)."""

    ready = True
    has_bytes_buffered = False
    events = 0

    cdef readonly object sock

    def __init__(self, sock):
        self.sock = sock

    def handshake(self):
        """Nothing to negotiate."""

    cpdef read_into(self, view):
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        if n == 0 and len(view):
            raise EOFError("connection closed by peer")
        return n

    cpdef write(self, views):
        try:
            return self.sock.sendmsg(views)
        except (BlockingIOError, InterruptedError):
            return 0

    def send_file(self, fd, offset, count):
        """Zero-copy: the kernel moves the file's bytes to the socket."""
        global _sendfile_once
        if _sendfile_once is None:
            from kmem.send import sendfile_once
            _sendfile_once = sendfile_once
        return _sendfile_once(self.sock, fd, offset, count)

    def close(self):
        self.sock.close()


def tally_request_times(list row, times, long long sent_ns):
    """Add one request's times to ``row`` (a ``kmem.metrics.request_times()`` row: the count, then Kafka's
    TotalTimeMs, RequestQueueTimeMs, LocalTimeMs, RemoteTimeMs, ResponseQueueTimeMs and ResponseSendTimeMs in
    ns). ``times``: its five perf_counter_ns marks (read, dequeued, handled, response complete, response
    dequeued; a mark never reached counts as reached at the one before it); ``sent_ns``: its response sent."""
    cdef long long t[5]
    cdef int i
    for i in range(5):
        t[i] = times[i]
        if i and t[i] < t[i - 1]:
            t[i] = t[i - 1]
    row[0] += 1
    row[1] += sent_ns - t[0]
    row[2] += t[1] - t[0]
    row[3] += t[2] - t[1]
    row[4] += t[3] - t[2]
    row[5] += t[4] - t[3]
    row[6] += max(sent_ns - t[4], 0)
