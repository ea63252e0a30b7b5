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
