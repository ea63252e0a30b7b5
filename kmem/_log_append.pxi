# A partition log's append (Kafka's UnifiedLog.append for a leader): under the log's lock, the validator's common
# case, the producer-state check, the roll decision, the ledger's reservation, the segment's write and the state's
# update in one call, made for every Produce, then the listeners; and a Produce's common case whole
# (KafkaApis.handleProduceRequest). kmem.broker.log.unified_log and kmem.broker.apis.handlers hold the errors'
# answers and what is rare (a transaction's verification and aborted-transaction index, the roll itself).


cdef object _ENOSPC = __import__("errno").ENOSPC


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


cdef object _flat_view(records):
    # ``records`` as the validator's byte_view makes them (a flat read-only unsigned-byte memoryview) when they
    # are one already, or bytes; else None (the validator converts them or says why)
    if type(records) is bytes:
        return memoryview(records)
    if type(records) is not memoryview or records.format != "B" or records.ndim != 1 or not records.c_contiguous:
        return None
    return records if records.readonly else records.toreadonly()


cdef class LogAppender:
    """``append(log, records, now, origin, transaction_open)``: validate ``records`` and append them to the
    partition log ``log`` (a ``PartitionLog``, its lock held), as its Python ``append`` asks: the validator's
    common case (``assign_common_case``, then ``finish_common_case`` for a compressed batch), else
    ``validate_each_batch`` (or, for records that are not a flat memoryview or bytes, ``validate_and_assign``);
    then its ``producers`` (``ProducerStatesCore``) check the batches, a duplicate answering with its first
    append's offsets; the active segment rolls first when Kafka's ``shouldRoll`` says so (``log.roll()``); room
    is reserved in the producer ledger; the aborted transactions the batches' markers complete go to the
    segment's ``.txnindex`` (``log._index_aborted``, taken out again when the write fails); the segment writes
    the batches (``SegmentCore.append``); then the log end offset moves and the producers' states are stored.
    Returns the ``result_class`` (``AppendResult``) to answer with; errors are raised (``LogError``,
    ``OSError``) with nothing appended. ``transaction_open``: the transactional batches' transactions must
    still be open (``log._check_transactions_open``)."""
    cdef object result_class, no_error, info_class, finish_common_case, validate_each_batch, validate_and_assign
    cdef object log_error, transaction_open

    def __init__(self, result_class, no_error, info_class, finish_common_case, validate_each_batch,
                 validate_and_assign, log_error, transaction_open):
        self.result_class, self.no_error, self.info_class = result_class, no_error, info_class
        self.finish_common_case, self.validate_each_batch = finish_common_case, validate_each_batch
        self.validate_and_assign = validate_and_assign
        self.log_error, self.transaction_open = log_error, transaction_open

    def append_to(self, log, records, origin, now_ms, verification_guard):
        """``PartitionLog.append`` whole: under the log's lock, once it is open, the verification ``guard`` (if any
        but ``transaction_open``) checked by ``log._check_verification``, then ``append`` at ``now_ms`` (None: the
        log's clock). A ``log_error`` is answered by ``log._refused(error)``, an ``OSError`` by
        ``log._storage_failed(error)`` and, once the lock is released, ``log._on_full_disk()`` when the disk is
        full. The log's listeners hear of an append that took, outside the lock."""
        cdef object lock = log._lock, failure = None, result
        cdef list listeners
        lock.acquire()
        try:
            if log._closed:
                log._check_open()
            now = log._clock() if now_ms is None else now_ms
            try:
                if verification_guard is not None and verification_guard is not self.transaction_open:
                    log._check_verification(verification_guard)
                result = self._append(log, records, now, origin, verification_guard is self.transaction_open)
            except self.log_error as e:
                return log._refused(e)
            except OSError as e:
                failure = e
                result = log._storage_failed(e)
            else:
                if result[6]:           # a duplicate: nothing appended
                    return result
                listeners = list(log._listeners)
        finally:
            lock.release()
        if failure is not None:
            if failure.errno == _ENOSPC:        # the log manager takes every partition's lock in turn
                log._on_full_disk()
            return result
        for listener in listeners:
            listener(log)
        return result

    cdef ValidatedRecords _validated(self, log, records, now, origin):
        cdef object view = _flat_view(records), config = log.config
        if view is None or origin not in ("client", "replication", "coordinator"):
            return self.validate_and_assign(records, next_offset=log.log_end_offset, config=config,
                                            leader_epoch=log.leader_epoch, origin=origin, now_ms=now)
        found = assign_common_case(view, log.log_end_offset, config, log.leader_epoch, origin, now, self.info_class)
        if found is None:
            return self.validate_each_batch(view, log.log_end_offset, config, log.leader_epoch, origin, now)
        if found[1]:            # compressed: its records need its codec
            return self.finish_common_case(view, found)
        return found[0]

    def append(self, log, records, now, origin, bint transaction_open):
        return self._append(log, records, now, origin, transaction_open)

    cdef object _append(self, log, records, now, origin, bint transaction_open):
        cdef ValidatedRecords validated = self._validated(log, records, now, origin)
        cdef ProducerStatesCore producers = log.producers
        cdef SegmentCore segment = log.segments[-1]       # its active segment
        cdef object config = log.config
        cdef dict updated
        cdef list completed
        if validated is None or producers is None or segment is None:     # typed: their fields are read in C
            raise TypeError("an append needs validated records, the log's producers and its active segment")
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
            segment = log.segments[-1]
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


def plain_produce_records(records, int version):
    """Whether Kafka's checks of one partition's records in a Produce of ``version`` (``ProduceRequest.
    validateRecords`` and ``RequestUtils.hasTransactionalRecords``: ``check_produce_records`` of
    kmem.broker.apis.handlers) certainly find nothing: none at all, or, in Produce v7+, a flat run of bytes whose
    first entry is a complete v2 batch that is not transactional, with no second complete entry. False leaves
    the records to that check (it says what it finds)."""
    cdef const unsigned char[::1] data
    cdef int64_t n, first, second
    if records is None:
        return True
    view = _flat_view(records) if version >= 7 else None
    if view is None:
        return False
    data = view
    n = data.shape[0]
    if n < V2_HEADER or data[V2_MAGIC] != 2 or data[V2_ATTRIBUTES + 1] & ATTR_TRANSACTIONAL:
        return False
    first = LOG_OVERHEAD + <int64_t>be32(&data[V2_LENGTH])
    if first < V2_HEADER or first > n:
        return False
    if n - first < LOG_OVERHEAD:
        return True
    second = LOG_OVERHEAD + <int64_t>be32(&data[first + V2_LENGTH])
    return second > n - first           # a second entry, incomplete (or of a size below zero: not one)


cdef class ProduceLane:
    """Kafka's ``KafkaApis.handleProduceRequest`` for its common case, in one call (``produce``): acks 0, 1 or -1,
    and every partition listed once, of a topic that exists and is not internal, its records plain
    (``plain_produce_records``: nothing for Kafka's request checks to refuse, nothing transactional to verify).
    Each partition is appended by its log's ``append`` (one core call itself) and answered; a refused append is
    answered by ``Handlers.answer_refused_append(result, appended, topic, partition, here, everywhere)``.
    ``answer_appended`` fills a partition's answer to an append that took, for both paths. Anything else is
    ``Handlers.produce``'s."""
    cdef object response_class, topic_class, partition_class, internal_topics, all_topics, illegal_state
    cdef object unknown_partition
    cdef Py_ssize_t total_produce, messages_in, bytes_in

    def __init__(self, response_class, internal_topics, all_topics, meters, illegal_state, unknown_partition):
        self.response_class = response_class
        self.topic_class = response_class.TopicProduceResponse
        self.partition_class = response_class.PartitionProduceResponse
        self.internal_topics, self.all_topics, self.illegal_state = internal_topics, all_topics, illegal_state
        self.total_produce, self.messages_in, self.bytes_in = meters
        self.unknown_partition = unknown_partition

    def produce(self, handlers, int version, request):
        """The response (None for acks=0), or False when ``request`` is not the common case: nothing was done."""
        cdef list logs = []
        cdef set listed = set()
        acks = request.acks
        if acks != 1 and acks != -1 and acks != 0:
            return False
        get_partition = handlers.logs.get_partition
        for topic in request.topic_data:
            name = topic.name
            if name in self.internal_topics:
                return False
            for data in topic.partition_data:
                records = data.records
                if records is None or not plain_produce_records(records, version):
                    return False
                key = (name, data.index)
                if key in listed:
                    return False
                listed.add(key)
                partition_log = get_partition(name, data.index)
                if partition_log is None:
                    return False
                logs.append(partition_log)
        stats = handlers.topic_stats
        everywhere = stats.row(self.all_topics)
        responses = []
        cdef Py_ssize_t i = 0
        for topic in request.topic_data:
            name = topic.name
            answered = []
            responses.append(self.topic_class(name=name, partition_responses=answered))
            here = stats.row(name) if topic.partition_data else None
            for data in topic.partition_data:
                result = self.partition_class(index=data.index, error_code=0, base_offset=-1, log_append_time_ms=-1,
                                              log_start_offset=-1)
                answered.append(result)
                everywhere[self.total_produce] += 1
                here[self.total_produce] += 1
                partition_log = logs[i]
                i += 1
                try:
                    appended = partition_log.append(data.records)
                except self.illegal_state:            # the topic was deleted meanwhile
                    result.error_code = self.unknown_partition
                    continue
                if appended.error_code:
                    handlers.answer_refused_append(result, appended, name, data.index, here, everywhere)
                else:
                    self.answer_appended(result, appended, len(data.records), here, everywhere)
        return None if acks == 0 else self.response_class(throttle_time_ms=0, responses=responses)

    cpdef answer_appended(self, result, appended, Py_ssize_t size, here, everywhere):
        """``result`` (a partition's answer) filled from ``appended`` (an ``AppendResult`` without error), its
        records (``size`` bytes) counted where a retry already in the log was not."""
        cdef int64_t records
        result.log_start_offset = appended.log_start_offset
        result.base_offset = appended.base_offset
        result.log_append_time_ms = appended.log_append_time
        if not appended.duplicate:
            records = appended.last_offset - appended.base_offset + 1
            here[self.messages_in] += records
            everywhere[self.messages_in] += records
            here[self.bytes_in] += size
            everywhere[self.bytes_in] += size
