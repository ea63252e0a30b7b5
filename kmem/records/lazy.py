"""Lazy chunked down-conversion (KIP-283): convert a fetch response's records a chunk at a time while
they are being sent, so the memory used is bounded by the chunk size rather than the fetch size.

``LazyDownConvertRecords`` fixes the number of bytes it will send, S, up front (SPEC.md §6):

- convert the first source batch whose conversion is not empty; S = max(source size, its size), and that
  chunk is kept for the send;
- batches exist but none converts (e.g. only transaction markers): S = 12;
- no complete batch: S = 0.

``LazyDownConvertRecordsSend.write_to(channel)`` then writes exactly S bytes, one write per call and at
most one chunk converted per call: converted output beyond S is cut (clients drop the partial batch);
output short of S is padded with "overflow" batches that every client parses as a truncated batch.
"""
import struct

from kmem import _core
from kmem.errors import InvalidArgumentError
from kmem.records import codecs
from kmem.records.batches import LOG_OVERHEAD, MemoryRecords, as_byte_view
from kmem.records.convert import RecordConversionStats, down_convert

DEFAULT_CHUNK_SIZE = 128 << 10       # Kafka's maximum read size for one chunk
MAX_OVERFLOW_SIZE = 128 << 10
MIN_V2_BATCH_SIZE = 61


def _readable(records):
    """``records`` as an object with ``size_in_bytes`` and ``read(position, size)``."""
    if hasattr(records, "read") and hasattr(records, "size_in_bytes"):
        return records
    return MemoryRecords(records if isinstance(records, MemoryRecords) else as_byte_view(records))


class LazyDownConvertRecords:
    """Records to be down-converted to ``to_magic`` only as they are sent.

    ``records``: ``FileRecords``, ``MemoryRecords`` or bytes-like. ``first_offset`` is the fetch offset
    (records of uncompressed batches below it are dropped). ``size_in_bytes`` is S. Raises
    ``UnsupportedCompressionTypeError`` at construction when the first batch is zstd (a broker answers
    UNSUPPORTED_COMPRESSION_TYPE).
    """

    def __init__(self, records, to_magic, first_offset=0, chunk_size=DEFAULT_CHUNK_SIZE, *,
                 max_decompressed_bytes=codecs.MAX_DECOMPRESSED_BYTES):
        if to_magic not in (0, 1):
            raise InvalidArgumentError(f"lazy down-conversion targets magic 0 or 1, not {to_magic}")
        if chunk_size < 1:
            raise InvalidArgumentError(f"chunk size must be positive, not {chunk_size}")
        self.records = _readable(records)
        self.to_magic = to_magic
        self.first_offset = first_offset
        self.chunk_size = chunk_size
        self.max_decompressed_bytes = max_decompressed_bytes
        # S: convert single batches until one gives output; that chunk is kept for the send.
        self._first_chunk = next(self._converted_chunks(0, 0), None)
        if self._first_chunk is not None:
            self.size_in_bytes = max(self.records.size_in_bytes, len(self._first_chunk[0]))
        else:
            has_batch = self._next_batch_span(0, 0) is not None
            self.size_in_bytes = LOG_OVERHEAD if has_batch else 0

    def __len__(self):
        return self.size_in_bytes

    def chunks(self):
        """``(converted bytes, stats)`` per chunk, each covering at least one whole source batch and
        otherwise at most ``chunk_size`` bytes of input; empty conversions are skipped. The chunk kept
        while computing S comes first and conversion resumes right after its source batch, so every
        batch is emitted exactly once (Kafka's iterator skips exactly one source batch instead, which
        emits a data batch twice when leading batches convert to nothing)."""
        if self._first_chunk is None:
            return
        converted, stats, next_position = self._first_chunk
        self._first_chunk = None     # handed over: the send owns it from now on
        yield converted, stats
        del converted
        for converted, stats, _ in self._converted_chunks(next_position, self.chunk_size):
            yield converted, stats
            del converted            # not held while the next chunk is converted

    def to_send(self):
        return LazyDownConvertRecordsSend(self)

    def _next_batch_span(self, position, max_read):
        """``(bytes, end position)`` of the complete batches from ``position`` that fit in ``max_read``
        bytes (at least one), or None when no complete batch is left."""
        source = self.records
        window = as_byte_view(source.read(position, max(max_read, LOG_OVERHEAD)))
        end = 0
        while (entry := _core.entry_at(window, end)) is not None:
            end += entry[0]
        if end == 0:       # the first batch is larger than the window (or truncated)
            if len(window) < LOG_OVERHEAD:
                return None
            total = LOG_OVERHEAD + struct.unpack_from(">i", window, 8)[0]
            window = as_byte_view(source.read(position, total))
            if _core.entry_at(window, 0) is None:
                return None
            end = total
        return window[:end], position + end

    def _converted_chunks(self, position, max_read):
        # Each step holds one input window and its output at most: names are dropped as soon as unused.
        while (span := self._next_batch_span(position, max_read)) is not None:
            window, position = span
            del span
            converted = down_convert(window, self.to_magic, self.first_offset,
                                     max_decompressed_bytes=self.max_decompressed_bytes)
            del window
            output, stats = converted.records, converted.stats
            del converted
            if output.size_in_bytes:
                yield output.buffer, stats, position
            del output


def overflow_batch(remaining):
    """Padding for ``remaining`` bytes still owed: offset -1 and a length no client can read to the end
    of (max(remaining + 1, 61)), so parsers stop there. Kafka's layout, up to 128 KiB at a time."""
    size = max(LOG_OVERHEAD, min(remaining + 1, MAX_OVERFLOW_SIZE))
    batch = bytearray(size)
    struct.pack_into(">qi", batch, 0, -1, max(remaining + 1, MIN_V2_BATCH_SIZE))
    return memoryview(batch)


def write_once(channel, data):
    """One write of ``data`` to a socket (``send``) or any object with ``write``; 0 when it would block."""
    try:
        if hasattr(channel, "send"):
            return channel.send(data)
        return channel.write(data) or 0
    except (BlockingIOError, InterruptedError):
        return 0


class LazyDownConvertRecordsSend:
    """Writes exactly ``size`` (= S) bytes of lazily converted records to a channel.

    Each ``write_to(channel)`` makes at most one write and converts at most one chunk; call it until
    ``completed``. ``stats`` accumulates the conversion stats of every chunk converted.
    """

    def __init__(self, lazy_records):
        self.size = lazy_records.size_in_bytes
        self.remaining = self.size
        self.stats = RecordConversionStats()
        self._chunks = lazy_records.chunks()
        self._pending = memoryview(b"")

    @property
    def completed(self):
        return self.remaining <= 0

    def write_to(self, channel):
        """Write once; returns the bytes written (0 when the channel is full or the send is done)."""
        if self.remaining <= 0:
            return 0
        if not self._pending:
            self._pending = None      # let the previous chunk go before converting the next
            chunk = next(self._chunks, None)
            if chunk is None:
                self._pending = overflow_batch(self.remaining)
            else:
                self._pending, stats = chunk
                self.stats.add(stats)
            self._pending = self._pending[:self.remaining]
        written = write_once(channel, self._pending)
        self._pending = self._pending[written:]
        self.remaining -= written
        return written
