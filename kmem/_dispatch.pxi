# A request's dispatch (kmem.broker.apis.dispatch.RequestDispatcher), the steps made for every request: decoded,
# its version checked and counted, its times measured and, for the APIs a handler answers alone (Produce, Fetch,
# ...) with no authorizer and no client quota set, its handler called and its answer encoded. Python holds the rest:
# the authorizer's checks, the quotas, the io threads, the APIs called apart and what to answer when a handler fails.

cdef object _protocol = None        # kmem.protocol, imported on first use (it imports this module)
cdef enum:
    _FETCH = 1                      # Fetch's api key


cdef class DispatchCore:
    """``__call__(request)``: the encoded answer of a request, None (an acks=0 Produce) or what the network layer
    defers. The subclass sets ``handlers`` (its ``served`` versions and, for a Fetch, ``fetch_sent``),
    ``request_times``, ``served`` (a ``Counter`` by (api key, version), counted here without a lock: each count
    is one step under the GIL), ``checks`` (None without an authorizer), ``quota_store`` (None without quotas),
    ``direct_methods`` (``{api key: handler(header, body)}`` of the APIs answered here; those of
    ``after_response_apis`` also get ``write_markers``, the request's ``after_response``), ``delayed_fetch`` (the
    class of a Fetch's answer that waits), and gives ``_unsupported``, ``_refuse``, ``_dispatch`` (the rest of a
    request's way), ``_defer`` (a handler's answer that waits) and ``_error_answer`` (the answer of a handler that
    raised, or None)."""
    cdef public object handlers, request_times, served, checks, quota_store, delayed_fetch
    cdef public dict direct_methods
    cdef public frozenset after_response_apis

    def __call__(self, request):
        global _protocol
        started = perf_counter_ns()
        if _protocol is None:
            _protocol = __import__("kmem.protocol", fromlist=["decode_request"])
        try:
            header, body = _protocol.decode_request(request.payload)
        except _protocol.UnsupportedVersionError as e:
            return self._unsupported(e)
        api = header.api_key
        versions = self.handlers.served.get(api)
        if versions is None or not versions[0] <= header.api_version <= versions[1]:
            self._refuse(header)
        self.count_served(header)
        request.measure(self.request_times, api)
        method = self.direct_methods.get(api)
        if method is None or self.checks is not None or (self.quota_store is not None and self.quota_store.quotas):
            return self._dispatch(request, header, body, started)
        try:
            if api in self.after_response_apis:
                response = method(header, body, write_markers=request.after_response)
            else:
                response = method(header, body)
            if response is None or isinstance(response, self.delayed_fetch):
                delayed = response
            else:
                if api == _FETCH and not from_follower(header, body):
                    self.handlers.fetch_sent(response)      # a consumer's Fetch: its bytes out counted as they go
                return _protocol.encode_response(header, response)
        except Exception:
            answer = self._error_answer(header)
            if answer is None:
                raise
            return answer
        if delayed is None:
            return None
        return self._defer(request, header, body, delayed, started)

    cpdef count_served(self, header):
        """One more request of ``header``'s API and version answered."""
        key = (int(header.api_key), header.api_version)
        found = PyDict_GetItem(self.served, key)
        PyDict_SetItem(self.served, key, 1 if found is NULL else <object>found + 1)


cpdef bint from_follower(header, body):
    """Whether a request is a follower's Fetch (``replica_id`` 0 or more), which Kafka exempts from the client
    quotas and from BytesOutPerSec."""
    if header.api_key != _FETCH:
        return False
    return (body.replica_state.replica_id if header.api_version >= 15 else body.replica_id) >= 0
