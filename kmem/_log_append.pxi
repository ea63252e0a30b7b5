# A partition log's append once its records are validated (Kafka's UnifiedLog.append past analyzeAndValidate):
# the producer-state check, the roll decision, the ledger's reservation, the segment's write and the state's
# update in one call, made for every Produce. kmem.broker.log.unified_log holds the lock, the errors' handling
# and what is rare (a transaction's verification and aborted-transaction index, the roll itself).


cdef bint _reached_roll_ms(SegmentCore segment, int64_t largest_timestamp, int64_t now, int64_t segment_ms):
    # Kafka's LogSegment.shouldRoll by time: since the segment's first batch's largest timestamp, else since
    # its creation; past segment.ms less the segment's jitter. Python's arithmetic where int64 would overflow.
    cdef int64_t waited
    cdef object first = segment.rolling_based_timestamp, segment_object = segment
    if first is None and segment.size:                  # a segment opened again: its first batch is read
        waited_object = segment_object.time_waited_for_roll(now, largest_timestamp)
    elif first is not None and first >= 0:
        if not sub_overflow(largest_timestamp, first, &waited):
            return waited > segment_ms - segment_object.roll_jitter_ms
        waited_object = largest_timestamp - first
    else:
        waited_object = now - segment_object.created_ms
    return waited_object > segment_ms - segment_object.roll_jitter_ms


cdef class LogAppender:
    """``append(log, validated, now, origin, transaction_open)``: append ``validated`` (``ValidatedRecords``)
    to the partition log ``log`` (a ``PartitionLog``, its lock held): its ``producers`` (``ProducerStatesCore``)
    check the batches, a duplicate answers with its first append's offsets; the active segment rolls first when
    Kafka's ``shouldRoll`` says so (``log.roll()``); room is reserved in the producer ledger; the aborted
    transactions the batches' markers complete go to the segment's ``.txnindex`` (``log._index_aborted``, taken
    out again when the write fails); the segment writes the batches (``SegmentCore.append``); then the log end
    offset moves and the producers' states are stored. Returns the ``result_class`` (``AppendResult``) to answer
    with; errors are raised (``LogError``, ``OSError``) with nothing appended. ``transaction_open``: the
    transactional batches' transactions must still be open (``log._check_transactions_open``)."""
    cdef object result_class, no_error

    def __init__(self, result_class, no_error):
        self.result_class, self.no_error = result_class, no_error

    def append(self, log, ValidatedRecords validated not None, int64_t now, origin, bint transaction_open):
        cdef ProducerStatesCore producers = log.producers
        cdef SegmentCore segment = log.active
        cdef object config = log.config
        cdef dict updated
        cdef list completed
        if transaction_open:
            log._check_transactions_open(validated.batches)
        duplicate, updated, completed = producers.check(validated.batches, origin)
        if duplicate is not None:
            return tuple.__new__(self.result_class, (self.no_error, duplicate.first_offset, duplicate.last_offset,
                                                     duplicate.timestamp, log.log_start_offset, None, True, ()))
        if (_reached_roll_ms(segment, validated.max_timestamp, now, config.segment_ms) and segment.size > 0) \
                or segment.size > config.segment_bytes - validated.size \
                or segment.offset_index.entries >= segment.offset_index.max_entries \
                or segment.time_index.entries >= segment.time_index.max_entries \
                or not _relative_fits(validated.last_offset, segment.base_offset):
            log.roll()
            segment = log.active
        producers.reserve(updated)
        indexed = log._index_aborted(segment, completed) if completed else False
        try:
            segment.append(validated.last_offset, validated.max_timestamp, validated.offset_of_max_timestamp,
                           validated.pieces)
        except BaseException:
            if indexed is not False:
                segment.txn_index.rewind(indexed)
            raise
        log.log_end_offset = validated.last_offset + 1
        producers.apply(updated)
        return tuple.__new__(self.result_class, (self.no_error, validated.first_offset, validated.last_offset,
                                                 validated.log_append_time, log.log_start_offset, None, False, ()))
