# One idempotent producer's state in a partition (Kafka's ProducerStateEntry): its epoch, the metadata of its
# last batches, its open transaction. The check of a client's data batch against it and the batch's addition
# are one call, made for every idempotent append; kmem.broker.log.producer_state holds the decisions around it
# (where states are kept, the errors' messages, transaction markers).

cdef enum:
    PRODUCER_BATCHES = 5          # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN

# What check_and_add found when it did not add the batch (a duplicate answers 1 + its index in batch_fields()).
PRODUCER_EPOCH_FENCED = -1        # an epoch below the producer's: INVALID_PRODUCER_EPOCH
NEW_EPOCH_NOT_AT_ZERO = -2        # a known producer's new epoch must start at sequence 0: OUT_OF_ORDER_SEQUENCE_NUMBER
SEQUENCE_OUT_OF_ORDER = -3        # the first sequence does not follow the last: OUT_OF_ORDER_SEQUENCE_NUMBER


cdef struct ProducerBatch:
    int64_t first_seq, last_seq, last_offset, offset_delta, timestamp


cdef inline bint _in_sequence(int64_t last_seq, int64_t next_seq):
    # the sequence wraps after 2**31 - 1
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == 0x7FFFFFFF)


cdef class ProducerStateCore:
    """The fields of a producer's state and its last ``PRODUCER_BATCHES`` batches, oldest first, as
    ``(first sequence, last sequence, last offset, offset delta, max timestamp)``."""
    cdef readonly int64_t producer_id
    cdef public int64_t epoch, coordinator_epoch, current_txn_first_offset, timestamp
    cdef ProducerBatch batches_kept[PRODUCER_BATCHES]
    cdef int kept

    def __init__(self, int64_t producer_id, int64_t epoch=-1, batches=(), int64_t coordinator_epoch=-1,
                 int64_t current_txn_first_offset=-1, int64_t timestamp=-1):
        self.producer_id, self.epoch, self.coordinator_epoch = producer_id, epoch, coordinator_epoch
        self.current_txn_first_offset, self.timestamp = current_txn_first_offset, timestamp
        self.kept = 0
        for first_seq, last_seq, last_offset, offset_delta, batch_timestamp in batches:
            self._keep(first_seq, last_seq, last_offset, offset_delta, batch_timestamp)

    cdef void _keep(self, int64_t first_seq, int64_t last_seq, int64_t last_offset, int64_t offset_delta,
                    int64_t timestamp):
        if self.kept == PRODUCER_BATCHES:
            memmove(&self.batches_kept[0], &self.batches_kept[1], (PRODUCER_BATCHES - 1) * sizeof(ProducerBatch))
            self.kept -= 1
        self.batches_kept[self.kept] = ProducerBatch(first_seq, last_seq, last_offset, offset_delta, timestamp)
        self.kept += 1

    def batch_fields(self):
        """The batches kept, oldest first: a tuple of 5-tuples."""
        cdef ProducerBatch* b
        cdef int i
        cdef list fields = []
        for i in range(self.kept):
            b = &self.batches_kept[i]
            fields.append((b.first_seq, b.last_seq, b.last_offset, b.offset_delta, b.timestamp))
        return tuple(fields)

    @property
    def last_seq(self):
        return self.batches_kept[self.kept - 1].last_seq if self.kept else -1

    @property
    def last_offset(self):
        return self.batches_kept[self.kept - 1].last_offset if self.kept else -1

    def copy(self):
        """A copy of the same class (a subclass's too), to change while the original stays."""
        cdef ProducerStateCore other = type(self).__new__(type(self))
        other.producer_id, other.epoch, other.coordinator_epoch = self.producer_id, self.epoch, self.coordinator_epoch
        other.current_txn_first_offset, other.timestamp = self.current_txn_first_offset, self.timestamp
        other.batches_kept = self.batches_kept
        other.kept = self.kept
        return other

    def entry_fields(self):
        """The eight fields of the ledger's entry for this state (``ProducerEntry``'s order): the last batch's
        sequence, offset and offset delta, or -1, -1, 0 without one."""
        cdef ProducerBatch* last
        if not self.kept:
            return (self.producer_id, self.epoch, -1, -1, 0, self.timestamp, self.coordinator_epoch,
                    self.current_txn_first_offset)
        last = &self.batches_kept[self.kept - 1]
        return (self.producer_id, self.epoch, last.last_seq, last.last_offset, last.offset_delta, self.timestamp,
                self.coordinator_epoch, self.current_txn_first_offset)

    def start_epoch(self, int64_t epoch):
        """A batch of ``epoch`` is added: a new epoch forgets the batches of the old one."""
        if epoch != self.epoch:
            self.kept = 0
            self.epoch = epoch

    def check_and_add(self, batch, bint from_client, bint replication, bint known):
        """Kafka's ``ProducerAppendInfo`` for a data batch (a ``BatchInfo``, not a transaction marker): 0 when
        it is added (this state then ends with it); 1 + the index of the kept batch it duplicates (a client's
        batch of the current epoch with the same first and last sequence); or, changing nothing,
        PRODUCER_EPOCH_FENCED (unless ``replication``), NEW_EPOCH_NOT_AT_ZERO or SEQUENCE_OUT_OF_ORDER (a
        client's batch of a ``known`` producer; an unknown one may start anywhere)."""
        cdef int64_t epoch = batch.producer_epoch, first_seq = batch.base_sequence
        cdef int64_t last_seq = batch.last_sequence, base_offset, last_offset, max_timestamp
        cdef int i
        if from_client and epoch == self.epoch:
            for i in range(self.kept):
                if self.batches_kept[i].first_seq == first_seq and self.batches_kept[i].last_seq == last_seq:
                    return i + 1
        if epoch < self.epoch and not replication:
            return PRODUCER_EPOCH_FENCED
        if from_client and known and self.epoch != -1:
            if epoch != self.epoch:
                if first_seq != 0:
                    return NEW_EPOCH_NOT_AT_ZERO
            elif not _in_sequence(self.batches_kept[self.kept - 1].last_seq if self.kept else -1, first_seq):
                return SEQUENCE_OUT_OF_ORDER
        base_offset, last_offset, max_timestamp = batch.base_offset, batch.last_offset, batch.max_timestamp
        if epoch != self.epoch:
            self.kept = 0
            self.epoch = epoch
        self.timestamp = max_timestamp
        self._keep(first_seq, last_seq, last_offset, last_offset - base_offset, max_timestamp)
        if batch.is_transactional and self.current_txn_first_offset == -1:
            self.current_txn_first_offset = base_offset
        return 0


cdef class ProducerStatesCore:
    """The per-append part of a partition's producer state (``ProducerStateManager``): where states are kept and
    the check, reservation and storing of an append's batches, one call each. ``_cache``: an ``OrderedDict``
    of at most ``cache_entries`` states, least recently used first; ``_stale``: states written since the last
    expiry check whose timestamp is already expired (kept until the next); ``_ongoing``: the first offset of
    each open transaction. The subclass gives the rest: ``state_class`` (a ``ProducerStateCore`` with
    ``from_entry``), ``_marker(state, batch, replication)`` for a transaction marker and ``_refused(state,
    batch, verdict)`` for the error of a refused batch."""
    cdef public object ledger, _cache, state_class, entry_class
    cdef public dict _stale, _ongoing
    cdef public int64_t _checked_at, expiration_ms
    cdef public Py_ssize_t cache_entries
    cdef readonly LedgerLock _lock

    def __init__(self, ledger, cache, state_class, entry_class, int64_t checked_at, int64_t expiration_ms,
                 Py_ssize_t cache_entries):
        self.ledger, self._cache, self.state_class, self.entry_class = ledger, cache, state_class, entry_class
        self._stale, self._ongoing = {}, {}
        self._checked_at, self.expiration_ms, self.cache_entries = checked_at, expiration_ms, cache_entries
        self._lock = LedgerLock()

    cpdef bint expired(self, ProducerStateCore state) except -1:
        """Past ``expiration_ms`` at the last expiry check and in no transaction (the ledger's rule)."""
        if state is None:
            raise TypeError("expired() needs a producer state, not None")
        return state.current_txn_first_offset < 0 and self._checked_at - state.timestamp >= self.expiration_ms

    cpdef state(self, producer_id):
        """The producer's state (None if unknown or expired); a copy the caller may change."""
        cdef ProducerStateCore state
        self._lock.take()
        try:
            state = self._stale.get(producer_id)
            if state is not None:
                return state.copy()
            state = self._cache.get(producer_id)
            if state is not None:
                self._cache.move_to_end(producer_id)
        finally:
            self._lock.give()
        if state is not None:
            return None if self.expired(state) else state.copy()
        entry = self.ledger.read(producer_id)
        return None if entry is None else self.state_class.from_entry(entry)

    def check(self, batches, origin="client"):
        """Check the batches of one append (``BatchInfo``s; ``origin``: the validator's ``"client"``,
        ``"replication"`` or ``"coordinator"``); returns ``(duplicate BatchMetadata or None, {pid:
        new state}, [CompletedTxn of the transactions its markers close])``. Raises ``LogError`` with
        INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER or, for a marker of an older coordinator epoch
        than the producer's last one, TRANSACTION_COORDINATOR_FENCED."""
        cdef dict updated = {}
        cdef list completed = []
        cdef bint client = origin == "client", replication = origin == "replication", known
        cdef ProducerStateCore state
        cdef int verdict
        for batch in batches:
            pid = batch.producer_id
            if pid < 0:
                continue
            state = updated.get(pid)
            if state is None:
                state = self.state(pid)
            known = state is not None
            if not known:
                state = self.state_class(pid)
            if batch.is_control:
                txn = self._marker(state, batch, replication)
                if txn is not None:
                    completed.append(txn)
            else:
                verdict = state.check_and_add(batch, client, replication, known)
                if verdict > 0:
                    return state.batches[verdict - 1], {}, []
                if verdict:
                    raise self._refused(state, batch, verdict)
            updated[pid] = state
        return None, updated, completed

    def reserve(self, dict updated):
        """Make room in the ledger for the states ``check`` returned, before their batches are written:
        ``apply`` then does no I/O that can fail. Raises OSError (nothing changed) or, for more producers
        than one append may carry, INVALID_RECORD (``LogError``)."""
        if len(updated) > self.ledger.max_reservation:
            from kmem.broker.codes import ErrorCode, LogError
            raise LogError(ErrorCode.INVALID_RECORD, f"{len(updated)} producers in one append: at most "
                                                     f"{self.ledger.max_reservation}")
        if updated:             # batches without a producer id (the coordinators' own, plain ones) need no room
            self.ledger.reserve(len(updated))

    def apply(self, dict updated):
        """Store the states ``check`` returned, once their batches are in the log (after ``reserve``)."""
        cdef ProducerStateCore state
        for state in updated.values():
            self.ledger.update(tuple.__new__(self.entry_class, state.entry_fields()))
            self._remember(state)

    cpdef _remember(self, ProducerStateCore state):
        cdef object pid
        if state is None:
            raise TypeError("_remember() needs a producer state, not None")
        pid = state.producer_id
        self._lock.take()
        try:
            if self.expired(state):         # kept until the next check, as Kafka keeps it
                self._stale[pid] = state
            else:
                self._stale.pop(pid, None)
            self._cache[pid] = state
            self._cache.move_to_end(pid)
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
            if state.current_txn_first_offset != -1:
                self._ongoing[pid] = state.current_txn_first_offset
            else:
                self._ongoing.pop(pid, None)
        finally:
            self._lock.give()
