# A request's bookkeeping on the network thread, made for every request: its fields and times
# (kmem.network.server.Request) and the per-thread rows its times and the broker's meters are added to
# (kmem.metrics.Tallies). The decisions (what a request's times mean, when a row is read) stay in Python.

cdef object perf_counter_ns = __import__("time").perf_counter_ns     # the marks' clock, as Python code reads it
cdef object _NO_PRINCIPAL = object()


cdef class RequestCore:
    """A complete request handed to the handler (see ``kmem.network.server.Request``): who sent it, on which
    listener, its receive, and perf_counter_ns at Kafka's RequestChannel marks: read, dequeued by its thread,
    handled, response complete, response dequeued by the network thread (0: not yet)."""
    cdef public object connection_id, processor, principal, listener_name, _receive, _tallies, _metrics_key
    cdef public list times

    def __init__(self, connection_id, processor, receive, principal=_NO_PRINCIPAL, listener_name="PLAINTEXT"):
        now = perf_counter_ns()
        if principal is _NO_PRINCIPAL:
            from kmem.network.sasl import ANONYMOUS
            principal = ANONYMOUS
        self.connection_id, self.processor, self._receive = connection_id, processor, receive
        self.principal = principal      # who sent it: User:<name> on a SASL listener, else User:ANONYMOUS
        self.listener_name = listener_name      # the listener it came in on (Kafka's RequestContext.listenerName)
        self.times = [now, now, 0, 0, 0]

    @property
    def payload(self):
        return self._receive.payload

    def release(self):
        self._receive.close()

    def measure(self, tallies, key):
        """Tally this request's times, once its response is sent, into row ``key`` of ``tallies`` (a
        ``kmem.metrics.request_times()``: the count, then the times of ``kmem.metrics.REQUEST_TIMES``): Kafka's
        ``RequestMetrics`` ``TotalTimeMs`` and its parts. Called by the handler, on the network thread."""
        self._tallies, self._metrics_key = tallies, key
        self.processor.measured[self.connection_id] = self

    def tally(self, long long sent_ns):
        """Add this request's times (its response sent at ``sent_ns``) to its row; a mark never reached
        counts as reached at the one before it (``tally_request_times``: every request's)."""
        tally_request_times(self._tallies.row(self._metrics_key), self.times, sent_ns)


cdef class TalliesCore:
    """``row(key)`` of ``kmem.metrics.Tallies``: the calling thread's list of ``_width`` integers for ``key``,
    made the first time that thread asks for it; each thread's ``{key: row}`` is its ``_local.table``, listed
    in ``_tables`` (under ``_lock``) for the readers."""
    cdef public Py_ssize_t _width
    cdef public object _local, _lock
    cdef public list _tables

    cpdef list row(self, key):
        cdef dict table
        cdef list found
        try:
            table = self._local.table
        except AttributeError:
            table = {}
            self._local.table = table
            with self._lock:
                self._tables.append(table)
        found = table.get(key)
        if found is None:
            found = [0] * self._width
            table[key] = found
        return found


cdef class ProcessorCore:
    """The steps of a network processor (``kmem.network.server._Processor``) made for every request: each
    complete receive handed to the handler as a request (its channel muted until its response is sent; a SASL
    channel's frames to its authenticator), the handler's answer framed and sent, and the channel unmuted once
    it is. The subclass sets the attributes: its ``server`` and ``selector``, its requests ``measured``, the
    ``throttles`` to start and the ids ``_closing`` once answered and ``_deferred``, and the Python pieces these
    steps use (``request_class``, ``deferred_class``, ``close_marker``, ``network_send``, ``close_send``, the
    mute events and state, ``_log``), and gives ``_authenticate``, ``_reauthenticate_or_expire`` and
    ``_start_throttle``."""
    cdef public object server, selector, request_class, deferred_class, close_marker, network_send, close_send
    cdef public object request_received, response_sent, muted, _log
    cdef public dict measured, throttles, _deferred
    cdef public set _closing

    cpdef _process_completed_receives(self):
        cdef KafkaChannel channel
        selector = self.selector
        for receive in selector.completed_receives:
            connection_id = receive.source
            channel = selector.channel(connection_id)
            if channel is None:         # closed in the same poll (e.g. EOF right after the request)
                receive.close()
                continue
            selector.mute(connection_id)
            channel.handle_mute_event(self.request_received)
            authenticator = channel.authenticator
            if authenticator is None:
                self._handle(self.request_class(connection_id, self, receive, channel.peer_principal,
                                                channel.listener.name))
            elif not authenticator.complete:
                self._authenticate(channel, receive)
            elif authenticator.session_expires_at is None or not self._reauthenticate_or_expire(channel, receive):
                self._handle(self.request_class(connection_id, self, receive, channel.principal,
                                                channel.listener.name))

    cpdef _handle(self, request):
        cdef bint keep_payload = False
        try:
            response = self.server.handler(request)
            if isinstance(response, self.deferred_class):
                keep_payload = response.keeps_payload
                if not keep_payload:        # an io thread marks those
                    request.times[2] = perf_counter_ns()
                if not response.done:
                    self._deferred[request.connection_id] = response
                    self.selector.watch_close(request.connection_id)
                send = response
            else:
                request.times[2] = perf_counter_ns()
                # Framed before the payload is released, so a response that views the request's memory
                # keeps that memory alive until it is sent.
                send = None if response is None else self.network_send(request.connection_id, response)
        except BaseException:
            # Whatever it is: an asyncio handler's CancelledError, even KeyboardInterrupt or SystemExit
            # (signals go to the main thread, so here they come from the handler's own code). It ends this
            # connection, not the processor; close() is how a server stops.
            self._log.exception("request handler failed for %r; closing the connection", request)
            send = self.close_marker
        finally:
            if not keep_payload:
                self.server.release(request)
        if not isinstance(send, self.deferred_class):
            self._respond_now(request.connection_id, send)

    cpdef _respond_now(self, connection_id, send):
        cdef KafkaChannel channel
        request = self.measured.get(connection_id)
        if request is not None:
            request.times[4] = perf_counter_ns()
        throttle_ms = self.throttles.pop(connection_id, 0)
        channel = self.selector.channel(connection_id)
        if channel is None:
            self.close_send(send)       # the client left while its request was handled
            return
        if throttle_ms and send is not self.close_marker:
            self._start_throttle(channel, throttle_ms)
        if send is self.close_marker:
            self.selector.close(connection_id)
        elif send is None:
            self._response_sent(connection_id)
        elif self.selector.send(send, write_now=True):
            self._response_sent(connection_id)

    cpdef _process_completed_sends(self):
        for connection_id in self.selector.completed_sends:
            self._response_sent(connection_id)

    cpdef _response_sent(self, connection_id):
        cdef KafkaChannel channel
        request = self.measured.pop(connection_id, None)
        if request is not None:
            request.tally(perf_counter_ns())
        channel = self.selector.channel(connection_id)
        if channel is None:
            return
        if connection_id in self._closing:
            self._closing.discard(connection_id)
            self.selector.close(connection_id)
            return
        channel.handle_mute_event(self.response_sent)
        if channel.mute_state is self.muted:
            self.selector.unmute(connection_id)
