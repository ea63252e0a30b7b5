"""Lazy chunked down-conversion (KIP-283): convert a fetch response's records a chunk at a time while
they are being sent, so the memory used is bounded by the chunk size rather than the fetch size.

``LazyDownConvertRecords`` fixes the number of bytes it will send, S, up front (as Kafka's
LazyDownConversionRecords does):

- convert the first source batch whose conversion is not empty; S = max(source size, its size), and that
  chunk is kept for the send;
- batches exist but none converts (e.g. only transaction markers): S = 12;
- no complete batch: S = 0.

``LazyDownConvertRecordsSend`` (a ``kmem.send.Send``) then writes exactly S bytes, one write and at most
one chunk converted per ``write_to`` call: converted output beyond S is cut (clients drop the partial
batch); output short of S is padded with "overflow" batches that every client parses as a truncated batch. A
zstd batch met after the first chunk ends the conversion the same way (Kafka's
LazyDownConversionRecordsSend): the client reads what it got and fetches again from that batch, which
then fails at construction.
"""
import logging
import struct

from kmem.errors import UnsupportedCompressionTypeError
from kmem.records import codecs
from kmem.records.arguments import byte_view, check_choice, check_int, check_limit, check_long
from kmem.records.batches import LOG_OVERHEAD, MemoryRecords
from kmem.records.convert import RecordConversionStats, down_convert
from kmem.records.files import read_entries
from kmem.send import as_transport

DEFAULT_CHUNK_SIZE = 128 << 10       # Kafka's maximum read size for one chunk
MAX_OVERFLOW_SIZE = 128 << 10
MIN_V2_BATCH_SIZE = 61

log = logging.getLogger(__name__)


def _readable(records):
    """``records`` as an object with ``size_in_bytes`` and ``read(position, size)``."""
    if hasattr(records, "read") and hasattr(records, "size_in_bytes"):
        return records
    return MemoryRecords(records if isinstance(records, MemoryRecords) else byte_view("records", records))


class LazyDownConvertRecords:
    """Records to be down-converted to ``to_magic`` only as they are sent.

    ``records``: ``FileRecords``, ``MemoryRecords`` or bytes-like. ``first_offset`` is the fetch offset
    (records of uncompressed batches below it are dropped); converted gzip batches are recompressed at
    ``gzip_level`` (KIP-390). ``size_in_bytes`` is S. Raises
    ``UnsupportedCompressionTypeError`` at construction when the first batch is zstd (a broker answers
    UNSUPPORTED_COMPRESSION_TYPE).
    """

    def __init__(self, records, to_magic, first_offset=0, chunk_size=DEFAULT_CHUNK_SIZE, *,
                 max_decompressed_bytes=codecs.MAX_DECOMPRESSED_BYTES, gzip_level=codecs.GZIP_DEFAULT_LEVEL):
        self.to_magic = check_choice("to_magic", to_magic, (0, 1))
        self.first_offset = check_long("first_offset", first_offset)
        self.chunk_size = check_int("chunk_size", chunk_size, 1, (1 << 31) - 1)
        self.max_decompressed_bytes = check_limit("max_decompressed_bytes", max_decompressed_bytes)
        self.gzip_level = check_choice("gzip_level", gzip_level, codecs.GZIP_LEVELS)
        self.records = _readable(records)
        # S: convert single batches until one gives output; that chunk is kept for the first send.
        self._first_chunk = next(self._converted_chunks(0, 0), None)
        self._converts = self._first_chunk is not None
        if self._converts:
            self.size_in_bytes = max(self.records.size_in_bytes, len(self._first_chunk[0]))
        else:
            has_batch = read_entries(self.records, 0, 0) is not None
            self.size_in_bytes = LOG_OVERHEAD if has_batch else 0

    def __len__(self):
        return self.size_in_bytes

    def chunks(self):
        """``(converted bytes, stats)`` per chunk, each covering at least one whole source batch and
        otherwise at most ``chunk_size`` bytes of input; empty conversions are skipped. The chunk kept
        while computing S comes first and conversion resumes right after its source batch, so every
        batch is emitted exactly once (Kafka's iterator skips exactly one source batch instead, which
        emits a data batch twice when leading batches convert to nothing). Once that chunk is handed
        over, iterating again converts again from the first batch, as Kafka's iterator does."""
        if not self._converts:
            return
        first, self._first_chunk = self._first_chunk, None     # handed over: the send owns it from now on
        position = 0
        if first is not None:
            converted, stats, position = first
            del first
            yield converted, stats
            del converted
        for converted, stats, _ in self._converted_chunks(position, self.chunk_size):
            yield converted, stats
            del converted            # not held while the next chunk is converted

    def to_send(self):
        return LazyDownConvertRecordsSend(self)

    def _converted_chunks(self, position, max_read):
        # Each step holds one input window and its output at most: names are dropped as soon as unused.
        while (span := read_entries(self.records, position, max_read)) is not None:
            window, position = span
            del span
            converted = down_convert(window, self.to_magic, self.first_offset,
                                     max_decompressed_bytes=self.max_decompressed_bytes, gzip_level=self.gzip_level)
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


class LazyDownConvertRecordsSend:
    """Writes exactly ``size`` (= S) bytes of lazily converted records: a ``kmem.send.Send``.

    Each ``write_to(transport)`` makes at most one write and converts at most one chunk; call it until
    ``completed``. It holds one converted chunk at a time, whatever S. ``transport`` may also be a socket,
    a TLS socket or an object with ``write`` (see ``kmem.send.as_transport``). ``stats`` accumulates the
    conversion stats of every chunk converted. Once completed, or on ``close()``, it lets go of the
    ``LazyDownConvertRecords`` (and so of records only they refer to, such as a ``FileRecords``).
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

    def write_to(self, transport):
        """Write once; returns the bytes written (0 when the transport is full or the send is done)."""
        if self.remaining <= 0:
            return 0
        if not self._pending:
            self._pending = None      # let the previous chunk go before converting the next
            try:
                chunk = next(self._chunks, None)
            except UnsupportedCompressionTypeError:
                # S is committed and part of it may be out: pad the rest (the failed generator converts
                # nothing more) and let the client fetch again from the zstd batch.
                log.info("zstd batch cannot be down-converted: padding the last %d of %d bytes",
                         self.remaining, self.size)
                chunk = None
            if chunk is None:
                self._pending = overflow_batch(self.remaining)
            else:
                self._pending, stats = chunk
                self.stats.add(stats)
            self._pending = self._pending[:self.remaining]
        written = as_transport(transport).write([self._pending])
        self._pending = self._pending[written:]
        self.remaining -= written
        if self.remaining <= 0:
            self.close()
        return written

    def close(self):
        """Let go of the source records and the chunk in hand (idempotent)."""
        if self._chunks is not None:
            self._chunks.close()
            self._chunks = None
        self._pending = memoryview(b"")
