# Kafka's network selector (kmem.network.selector): many non-blocking channels in one thread, with Kafka's
# memory-pressure behaviour. It runs once per turn of a network thread and handles every request's channel
# a dozen times; compiled, it keeps the same state and decisions without an interpreted frame per step.

# the standard modules it uses, held in C globals (kmem._core's namespace stays its own)
cdef object _collections = __import__("collections")
cdef object _itertools = __import__("itertools")
cdef object _random = __import__("random")
cdef object _selectors = __import__("selectors")
cdef object _socket = __import__("socket")
cdef object _monotonic = __import__("time").monotonic

# Below this share of the pool, ready channels are handled in random order so the same sockets do not
# always win the remaining memory (Kafka's lowMemThreshold).
SELECTOR_LOW_MEMORY_FRACTION = 0.1

cdef object _selector_log = __import__("logging").getLogger("kmem.network.selector")
cdef object _select = __import__("select")
# epoll's flags (Linux's values where the module has none: it is then not used)
cdef int _EPOLLIN = getattr(_select, "EPOLLIN", 1)
cdef int _EPOLLOUT = getattr(_select, "EPOLLOUT", 4)


cdef class _Poller:
    """The OS selector a ``Selector`` waits in, with the ``selectors`` module's ``register(fileobj, events,
    data)``, ``modify``, ``unregister`` and ``close``; ``select(timeout)`` returns ``(data, events)`` pairs. Where
    the system has epoll, its own, whose events it reads in the core (the standard ``EpollSelector`` reads them in
    Python, at every turn of a network thread); elsewhere the standard module's default selector."""
    cdef object _epoll
    cdef object _fallback
    cdef dict _registered       # fd -> (data, events)
    cdef dict _fds              # file object -> its fd when registered (a closed socket's fileno() is -1)
    cdef dict __dict__          # so that a test can wrap select()

    def __init__(self):
        self._registered, self._fds = {}, {}
        if hasattr(_select, "epoll"):
            self._epoll = _select.epoll()
        else:
            self._fallback = _selectors.DefaultSelector()

    def register(self, fileobj, int events, data):
        if self._fallback is not None:
            self._fallback.register(fileobj, events, data)
            return
        fd = fileobj.fileno()
        if fd in self._registered:      # as the selectors module refuses it: its number reused while registered
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        self._epoll.register(fd, _epoll_events(events))
        self._registered[fd] = (data, events)
        self._fds[fileobj] = fd

    def modify(self, fileobj, int events, data):
        if self._fallback is not None:
            self._fallback.modify(fileobj, events, data)
            return
        fd = self._fds[fileobj]
        self._epoll.modify(fd, _epoll_events(events))
        self._registered[fd] = (data, events)

    def unregister(self, fileobj):
        if self._fallback is not None:
            self._fallback.unregister(fileobj)
            return
        fd = self._fds.pop(fileobj)
        del self._registered[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass        # closed since it was registered: the kernel dropped it already

    def select(self, timeout=None):
        """``(data, events)`` of each registered file ready within ``timeout`` seconds (None: no limit), its
        events limited to those it was registered for (an error or a hang-up counts as both)."""
        cdef unsigned int flags
        cdef int got
        if self._fallback is not None:
            return [(key.data, events) for key, events in self._fallback.select(timeout)]
        # epoll.poll rounds a timeout up to whole milliseconds: it never returns early
        fired = self._epoll.poll(-1 if timeout is None else max(timeout, 0), max(len(self._registered), 1))
        ready = []
        for fd, flags in fired:
            found = self._registered.get(fd)
            if found is None:
                continue
            data, events = found
            got = ((CHANNEL_EVENT_WRITE if flags & ~_EPOLLIN else 0)
                   | (CHANNEL_EVENT_READ if flags & ~_EPOLLOUT else 0))
            ready.append((data, got & events))
        return ready

    def close(self):
        if self._fallback is not None:
            self._fallback.close()
        else:
            self._epoll.close()
            self._registered.clear()
            self._fds.clear()


cdef int _epoll_events(int events) except -1:
    if events & ~(CHANNEL_EVENT_READ | CHANNEL_EVENT_WRITE) or not events:
        raise ValueError(f"invalid events: {events!r}")
    return (_EPOLLIN if events & CHANNEL_EVENT_READ else 0) | (_EPOLLOUT if events & CHANNEL_EVENT_WRITE else 0)


cdef object _selector_connection_errors():
    """What ends a channel as its peer's doing (logged quietly): the socket's errors, a closed peer, TLS
    errors, a malformed frame."""
    import ssl
    from kmem.errors import InvalidReceiveError
    return (OSError, EOFError, ssl.SSLError, InvalidReceiveError)


cdef class Selector:
    """Kafka's network selector over epoll (``_Poller``).

    Not thread-safe, except ``wakeup()`` which any thread may call. Timeouts are in seconds.
    ``connections_max_idle_ms`` (Kafka's name and unit) closes channels with no socket progress for that
    long; ``None`` or a negative value disables it.

    ``max_receive_size`` defaults to the pool's ``max_single_allocation`` (a larger frame could never get
    memory, so its channel is closed as invalid) and may not exceed it. With the unbounded default pool it
    stays ``UNLIMITED``: a peer's size prefix may then allocate up to 2 GiB, so set it for untrusted peers.
    """

    cdef readonly object pool
    cdef public object max_receive_size
    cdef object _idle_seconds
    cdef object _rng
    cdef double _low_memory_threshold
    cdef readonly object _selector
    cdef object _waker
    cdef dict _channels
    cdef readonly dict _registered_events
    cdef set _explicitly_muted
    cdef readonly set _watching_close
    cdef set _dirty
    cdef readonly set _buffered_read
    cdef object _idle
    cdef bint _out_of_memory
    cdef object _memory_needed
    cdef bint _strict_pool
    cdef bint _made_read_progress_last_poll
    cdef bint _closed
    cdef public list completed_receives
    cdef public list completed_sends
    cdef public list connected
    cdef public dict disconnected
    cdef list _connected_since_poll
    cdef object _pool_listener

    def __init__(self, pool=None, *, max_receive_size=NETWORK_UNLIMITED, connections_max_idle_ms=None, rng=None):
        from kmem.network.waker import Waker
        if pool is None:
            from kmem.pool import NONE as pool
        self.pool = pool
        pool_limit = getattr(pool, "max_single_allocation", None)
        if pool_limit is not None:
            if max_receive_size == NETWORK_UNLIMITED:
                max_receive_size = pool_limit
            elif max_receive_size > pool_limit:
                from kmem.errors import ConfigError
                raise ConfigError(f"max_receive_size {max_receive_size} exceeds the pool's max single "
                                  f"allocation {pool_limit}")
        self.max_receive_size = max_receive_size
        self._idle_seconds = (connections_max_idle_ms / 1000.0
                              if connections_max_idle_ms is not None and connections_max_idle_ms >= 0 else None)
        self._rng = rng or _random.Random()
        self._low_memory_threshold = SELECTOR_LOW_MEMORY_FRACTION * pool.size
        self._selector = _Poller()
        self._waker = Waker(self._selector)      # registered with None for its data, which no channel id is
        self._channels = {}
        self._registered_events = {}          # channel id -> events the OS selector waits for (absent: none)
        self._explicitly_muted = set()
        self._watching_close = set()          # muted ids whose socket is watched for the peer's EOF only
        # Ids whose watched events may have changed (mutes, unmutes): the OS selector learns them at the
        # next poll, so a mute and an unmute between two polls (a request answered at once) cost nothing.
        self._dirty = set()
        self._buffered_read = set()           # ids whose transport holds bytes the socket will not announce
        self._idle = _collections.OrderedDict()  # id -> last activity, oldest first; explicit mutes excluded
        self._out_of_memory = False
        self._memory_needed = 0     # while out of memory: what the least demanding refused receive needs
        self._strict_pool = getattr(pool, "strict", False)
        self._made_read_progress_last_poll = False
        self._closed = False
        self.completed_receives = []
        self.completed_sends = []
        self.connected = []
        self.disconnected = {}
        self._connected_since_poll = []     # ready at register(): reported by the next poll, as Kafka does
        # One bound method kept, so that remove_listener finds the very object add_listener got.
        self._pool_listener = self._memory_returned
        pool.add_listener(self._pool_listener)

    # -- channels --------------------------------------------------------------------------------------

    def register(self, channel_id, sock, *, ssl_context=None, server_side=True, server_hostname=None,
                 priority=False):
        """Adopt a connected socket as channel ``channel_id``, any hashable value but None (TLS when
        ``ssl_context`` is given)."""
        self._check_open()
        if channel_id is None:
            from kmem.errors import InvalidArgumentError
            raise InvalidArgumentError("a channel's id cannot be None")
        if channel_id in self._channels:
            from kmem.errors import IllegalStateError
            raise IllegalStateError(f"channel {channel_id} is already registered")
        sock.setblocking(False)
        if sock.family in (_socket.AF_INET, _socket.AF_INET6):
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        if ssl_context is None:
            transport = PlaintextTransport(sock)
        else:
            from kmem.network.transport import TlsTransport
            transport = TlsTransport(sock, ssl_context, server_side, server_hostname)
        channel = KafkaChannel(channel_id, transport, self.pool, self.max_receive_size, priority)
        self._channels[channel_id] = channel
        if transport.ready:
            self._connected_since_poll.append(channel_id)
        self._touch(channel_id)
        self._sync_events(channel)
        return channel

    def connect(self, channel_id, address, *, ssl_context=None, server_hostname=None, priority=False,
                timeout=10.0):
        """Connect to ``address`` (a blocking TCP connect, then non-blocking I/O) and register the socket."""
        sock = _socket.create_connection(address, timeout=timeout)
        try:
            return self.register(channel_id, sock, ssl_context=ssl_context, server_side=False,
                                 server_hostname=server_hostname, priority=priority)
        except BaseException:
            sock.close()
            raise

    def channel(self, channel_id):
        return self._channels.get(channel_id)

    @property
    def channels(self):
        return list(self._channels.values())

    def least_recently_active(self, eligible):
        """The channel ``eligible(channel)`` accepts whose socket made progress the longest ago (Kafka's
        ``lowestPriorityChannel``; those waiting for us come after the others), or None."""
        waiting_for_us = (channel_id for channel_id in self._channels if channel_id not in self._idle)
        for channel_id in _itertools.chain(self._idle, waiting_for_us):
            channel = self._channels[channel_id]
            if eligible(channel):
                return channel
        return None

    @property
    def is_out_of_memory(self):
        """True while some channel is memory-muted and the selector has not yet seen the pool recover."""
        return self._out_of_memory

    def send(self, send, *, write_now=False):
        """Queue a ``NetworkSend`` on its destination channel (one send at a time per channel).

        ``write_now``: write what the socket takes at once, without waiting for a poll; True when that
        completed the send (then it is not reported in ``completed_sends``). A small response then costs
        no wait for writability and no change of what the OS selector watches."""
        cdef KafkaChannel channel = self._existing(send.destination)
        channel.set_send(send)
        if write_now and channel.is_ready():
            completed = self._guarded(channel, channel.write)
            if channel.closed:
                return False
            if completed is not None:
                self._dirty.add(channel.id)
                if channel.id not in self._explicitly_muted:    # else it waits on us again, as before
                    self._touch(channel.id)
                return True
        self._touch(channel.id)     # now the client must read it: its idle clock runs
        self._sync_events(channel)
        return False

    def mute(self, channel_id):
        """Stop reading from a channel until ``unmute`` (memory recovery does not lift this mute)."""
        cdef KafkaChannel channel = self._existing(channel_id)
        self._explicitly_muted.add(channel_id)
        if channel.send is None:
            self._idle.pop(channel_id, None)    # waiting on us, not on the client
        channel.mute()
        self._dirty.add(channel_id)

    def unmute(self, channel_id):
        cdef KafkaChannel channel = self._existing(channel_id)
        if self._unmute(channel):
            self._explicitly_muted.discard(channel_id)
            self._watching_close.discard(channel_id)
            self._touch(channel_id)

    def watch_close(self, channel_id):
        """While ``channel_id`` stays explicitly muted, report the peer closing it (in ``disconnected``)
        instead of ignoring its socket: a request parked for minutes must not outlive its client. Bytes
        the client sends meanwhile (a pipelined request) end the watch: they wait for the unmute."""
        channel = self._existing(channel_id)
        if channel_id in self._explicitly_muted:
            self._watching_close.add(channel_id)
            self._dirty.add(channel.id)

    def close(self, channel_id=None):
        """Close one channel, or (no argument) every channel and the selector itself."""
        if channel_id is not None:
            found = self._channels.get(channel_id)
            if found is not None:
                self._close_channel(found, None)
            return
        if self._closed:
            return
        self._closed = True
        self.pool.remove_listener(self._pool_listener)
        for channel in list(self._channels.values()):
            self._close_channel(channel, None)
        self._selector.close()
        self._waker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- wakeups ---------------------------------------------------------------------------------------

    def wakeup(self):
        """Make a blocked (or the next) ``poll`` return at once. Safe from any thread."""
        self._waker.wakeup()

    @property
    def wakeups(self):
        """How many polls a wakeup interrupted (or shortened)."""
        return self._waker.count

    def _memory_returned(self, pool):
        # Unconditional: checking our out-of-memory flag from this (releasing) thread could race with
        # the poll thread that is about to set it.
        self.wakeup()

    # -- polling ---------------------------------------------------------------------------------------

    def poll(self, timeout):
        """Do the I/O that is possible within ``timeout`` seconds (0: none waiting, None: no limit)."""
        cdef KafkaChannel channel
        # Each step is skipped when it has nothing to do: this runs once per request on a busy connection.
        self._check_open()
        self.completed_receives = []
        self.completed_sends = []
        self.connected = []
        self.disconnected = {}
        if self._connected_since_poll:
            self.connected = [c for c in self._connected_since_poll if c in self._channels]
            self._connected_since_poll = []
        if self._out_of_memory and self.pool.available_memory >= self._memory_needed:
            self._lift_memory_mutes()       # only once a retry can succeed, or refusals would spin
        if self._dirty:
            channels = self._channels
            for channel_id in self._dirty:
                channel = channels.get(channel_id)
                if channel is not None:
                    self._sync_events(channel)
            self._dirty.clear()
        if self._buffered_read and self._made_read_progress_last_poll:
            timeout = 0     # buffered bytes can progress without the socket: do not wait for it
        if self._idle:
            timeout = self._limit_by_idle_expiry(timeout)
        self._made_read_progress_last_poll = False
        ready = {}
        for channel_id, mask in self._selector.select(timeout):
            if channel_id is None:
                self._waker.drain()
            else:       # kqueue reports reading and writing apart
                ready[channel_id] = ready.get(channel_id, 0) | mask
        interrupt = None
        if self._buffered_read:
            buffered = [channel_id for channel_id in self._buffered_read if channel_id not in ready]
            self._buffered_read = set()
            interrupt = self._handle(buffered, {})
        if ready:
            interrupt = self._handle(list(ready), ready) or interrupt
        if self._idle:
            self._close_idle()
        if interrupt is not None:
            raise interrupt     # once every channel's I/O of this poll is done and its results are in

    cdef _lift_memory_mutes(self):
        cdef KafkaChannel channel
        for channel in list(self._channels.values()):
            if channel.is_in_mutable_state() and channel.id not in self._explicitly_muted:
                if self._unmute(channel):
                    self._touch(channel.id)     # its wait for memory was not the client's idleness
        self._out_of_memory = False

    cdef bint _unmute(self, KafkaChannel channel) except -1:
        unmuted = channel.maybe_unmute()
        if unmuted:
            self._dirty.add(channel.id)
            if channel.bytes_buffered():
                # The socket will not announce these bytes again: read them on the next poll, promptly.
                self._buffered_read.add(channel.id)
                self._made_read_progress_last_poll = True
        return unmuted

    cdef _handle(self, channel_ids, masks):
        """Each channel's I/O; a KeyboardInterrupt or SystemExit one raised is returned (the others' I/O done
        first, so that nothing this poll read, wrote or saw closed is missing from its results), else None."""
        if not self._out_of_memory and self.pool.available_memory < self._low_memory_threshold:
            self._rng.shuffle(channel_ids)
        cdef KafkaChannel channel
        channels = self._channels
        interrupt = None
        for channel_id in channel_ids:
            channel = channels.get(channel_id)
            if channel is None:
                continue
            try:
                self._handle_channel(channel, masks.get(channel_id, 0))
            except BaseException as exc:
                self._failed(channel, exc)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    interrupt = exc
        return interrupt

    cdef _guarded(self, channel, action):
        """``action()``'s result; an error in it closes ``channel`` (and None is returned) instead of reaching
        the caller, but KeyboardInterrupt and SystemExit, which still propagate."""
        try:
            return action()
        except BaseException as exc:
            self._failed(channel, exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        return None

    cdef _failed(self, KafkaChannel channel, exc):
        """``channel``'s I/O raised ``exc``: the channel is closed."""
        if not isinstance(exc, _selector_connection_errors()):
            # A bug, a failed malloc, a send's own error (even a CancelledError): it ends this channel,
            # not the poll (and the other channels').
            _selector_log.exception("closing channel %s after an unexpected error", channel.id, exc_info=exc)
        self._close_channel(channel, exc)

    cdef _handle_channel(self, KafkaChannel channel, int mask):
        if not channel.is_ready():
            if channel.prepare():
                self.connected.append(channel.id)
                self._touch(channel.id)
        explicitly_muted = channel.id in self._explicitly_muted
        if explicitly_muted and channel.id in self._watching_close and mask & CHANNEL_EVENT_READ:
            self._check_peer_closed(channel)
        if (channel.is_ready() and (mask & CHANNEL_EVENT_READ or channel.bytes_buffered())
                and not explicitly_muted):
            self._attempt_read(channel)
        if channel.bytes_buffered() and not explicitly_muted:
            self._buffered_read.add(channel.id)
        if channel.is_ready() and mask & CHANNEL_EVENT_WRITE and channel.send is not None:
            send = channel.send
            remaining = send.remaining
            if channel.write() is not None:
                self.completed_sends.append(send.destination)
            if send.remaining < remaining:
                self._touch(channel.id)     # the client reads its response: progress
        self._sync_events(channel)

    cdef _check_peer_closed(self, KafkaChannel channel):
        """A muted channel watched for its peer's EOF is readable: closed (raise), or it sent bytes. The peek is
        at the TCP socket (socket.socket's own recv), below OpenSSL on a TLS channel: an SSLSocket takes no flags,
        and what is undecrypted is still bytes, not a close."""
        try:
            if not _socket.socket.recv(channel.transport.sock, 1, _socket.MSG_PEEK):
                raise EOFError("connection closed by peer")
        except (BlockingIOError, InterruptedError):
            return          # readable, then not (nothing to peek): still open
        self._watching_close.discard(channel.id)       # a pipelined request: it waits for the unmute
        self._sync_events(channel)

    cdef _attempt_read(self, KafkaChannel channel):
        if channel.read():
            self._touch(channel.id)
            self._made_read_progress_last_poll = True
            receive = channel.maybe_complete_receive()
            if receive is not None:
                self.completed_receives.append(receive)
        if channel.mute_state is _NOT_MUTED:
            return
        # Not explicitly muted, so this is a memory mute.
        if channel.is_in_mutable_state():
            # The channel muted itself: the pool refused its receive. A strict pool refuses sizes above
            # what is available, others only an empty pool.
            needed = channel.receive.size if self._strict_pool else 1
            self._memory_needed = min(self._memory_needed, needed) if self._out_of_memory else needed
            self._out_of_memory = True
            # Waiting for our memory is not the client's idleness (and pins nothing): its idle clock
            # restarts when the mute is lifted.
            self._idle.pop(channel.id, None)
        elif self._unmute(channel):
            # A retry of bytes buffered in the transport (TLS) got the memory: _lift_memory_mutes would
            # no longer see this channel as memory-muted, so its mute ends here.
            self._touch(channel.id)

    # -- bookkeeping -----------------------------------------------------------------------------------

    cdef _sync_events(self, KafkaChannel channel):
        """Make the OS selector wait for what the channel needs now (unregistered when nothing)."""
        events = 0 if channel.closed else channel.wanted_events()
        if not events and channel.id in self._watching_close and not channel.closed:
            events = CHANNEL_EVENT_READ
        current = self._registered_events.get(channel.id, 0)
        if events == current:
            return
        sock = channel.transport.sock
        if not current:
            self._selector.register(sock, events, channel.id)
            self._registered_events[channel.id] = events
        elif events:
            self._selector.modify(sock, events, channel.id)
            self._registered_events[channel.id] = events
        else:
            self._selector.unregister(sock)
            del self._registered_events[channel.id]

    cdef _touch(self, channel_id):
        if self._idle_seconds is None:
            return
        # Idleness is the client's: exempt only channels that wait for us (explicitly muted, no send).
        if channel_id in self._explicitly_muted and (<KafkaChannel>self._channels[channel_id]).send is None:
            self._idle.pop(channel_id, None)
        else:
            self._idle[channel_id] = _monotonic()
            self._idle.move_to_end(channel_id)

    cdef _limit_by_idle_expiry(self, timeout):
        """``timeout`` shortened to when the least recently active channel expires (``_idle`` not empty)."""
        until_expiry = max(0.0, next(iter(self._idle.values())) + self._idle_seconds - _monotonic())
        return until_expiry if timeout is None else min(timeout, until_expiry)

    cdef _close_idle(self):
        deadline = _monotonic() - self._idle_seconds
        while self._idle:
            channel_id, last_active = next(iter(self._idle.items()))
            if last_active > deadline:
                break
            self._close_channel(self._channels[channel_id], TimeoutError("connection idle for too long"))

    cdef _close_channel(self, KafkaChannel channel, reason):
        channel_id = channel.id
        if self._registered_events.pop(channel_id, 0):
            self._selector.unregister(channel.transport.sock)
        channel.close()
        del self._channels[channel_id]
        self._explicitly_muted.discard(channel_id)
        self._watching_close.discard(channel_id)
        self._dirty.discard(channel_id)
        self._buffered_read.discard(channel_id)
        self._idle.pop(channel_id, None)
        self.disconnected[channel_id] = reason

    cdef KafkaChannel _existing(self, channel_id):
        channel = self._channels.get(channel_id)
        if channel is None:
            from kmem.errors import InvalidArgumentError
            raise InvalidArgumentError(f"no channel {channel_id!r} in this selector")
        return channel

    cdef _check_open(self):
        if self._closed:
            from kmem.errors import IllegalStateError
            raise IllegalStateError("selector is closed")

    def __repr__(self):
        return f"<Selector channels={len(self._channels)} out_of_memory={self._out_of_memory}>"
