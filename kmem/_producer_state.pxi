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
