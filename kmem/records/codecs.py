"""Kafka's four batch codecs with Kafka's framing, built on cramjam's raw codecs, libdeflate and zlib-ng.

- gzip: a standard gzip stream (concatenated members accepted on read). Deflated by libdeflate, inflated
  by zlib-ng (~2.7x zlib's speed), whose streaming inflate stops at the limit. KIP-390's level is zlib's
  scale: it asks for zlib's size at that level, which libdeflate reaches with less search, so each level
  runs at the fastest libdeflate level measured to stay within 5% of zlib's size on every kind of data
  tried and within 2% on record data (``LIBDEFLATE_LEVEL``). zlib-ng's own deflate was not chosen: its
  levels 4-6 are 3x zlib's size on periodic data; nor isa-l's: 10% over zlib 6 on English text.
- snappy: xerial framing (``82 'SNAPPY' 00``, version 1, compat 1, then ``[i32 BE length][raw block]``
  for 32 KiB input blocks); raw snappy (no framing) is accepted on read.
- lz4: Kafka's LZ4 frame (FLG 0x60: independent blocks, no checksums; BD 0x40: 64 KiB blocks). For
  magic 0 the header checksum is written the way Kafka < 0.10 did (KAFKA-3160: xxh32 over magic+FLG+BD)
  and ignored on read; any valid LZ4 frame (e.g. with a content size or checksum) is read.
- zstd: a standard zstd frame (v2 only).

Decompression is bounded: output beyond ``limit`` bytes (default ``MAX_DECOMPRESSED_BYTES``) raises
``DecompressionLimitError`` (a ``CorruptRecordError``) before more memory is spent, so a small batch cannot
expand into gigabytes (the records decoded from it and its down-converted form are bounded too: see
batches.py and convert.py).

Streaming, for a reader that rewrites a payload as it comes (the broker recompressing a batch):
``decompress_chunks`` yields the payload a piece at a time where the codec allows it (gzip in
``CHUNK_BYTES`` pieces, xerial snappy and lz4 frames of independent blocks a block at a time); zstd, raw
snappy and lz4 frames of linked blocks come whole, as cramjam decodes them only whole. ``compressor``
compresses a payload given in pieces: gzip with zlib's own deflate (libdeflate has no streaming API, and
zlib-ng's levels 4-6 are 3x zlib's size on periodic data), zstd with cramjam's stream, snappy and lz4 in
the same blocks as ``compress``.
"""
import enum
import struct
import zlib

import cramjam
import deflate
from zlib_ng import zlib_ng

from kmem import _core
from kmem.errors import (CorruptRecordError, DecompressionLimitError, InvalidArgumentError,
                         UnsupportedCompressionTypeError)

class CompressionType(enum.IntEnum):
    """Kafka's CompressionType: the codec id in a batch's attributes (``codec_name`` gives Kafka's name)."""
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


NONE, GZIP, SNAPPY, LZ4, ZSTD = CompressionType
CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")
# a batch's codec bits (0-7) as read: the CompressionType, or the bare int for ids that name no codec
BY_ATTRIBUTE = (*CompressionType, 5, 6, 7)

#: KIP-390's compression.gzip.level: 1 (fastest) to 9 (smallest); Kafka's default is zlib's, 6.
GZIP_LEVELS = range(1, 10)
GZIP_DEFAULT_LEVEL = 6
#: libdeflate's level for each KIP-390 level (index 1-9), from sizes measured against zlib's at that level
#: in 16 KiB and 1 MiB pieces: v1 entries of JSON and of words, JSON, words, prose, Python and C source, a
#: shared library, periodic data. The worst at each level stays within 5% (generated C source, where a
#: lower level falls 8% behind); record data is within 2% or smaller than zlib's.
LIBDEFLATE_LEVEL = (None, 1, 1, 1, 3, 5, 5, 6, 6, 6)

#: Largest decompressed size of one batch (Kafka batches are at most a few MiB uncompressed in practice).
MAX_DECOMPRESSED_BYTES = 64 << 20
#: Most bytes ``decompress_chunks`` yields at a time from a gzip stream.
CHUNK_BYTES = 256 << 10

XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 << 10
LZ4_MAGIC = b"\x04\x22\x4d\x18"
LZ4_FLG = 0x60
LZ4_BD = 0x40
LZ4_BLOCK = 64 << 10
LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}
LZ4_INDEPENDENT_BLOCKS = 0x20     # FLG bits
LZ4_BLOCK_CHECKSUM = 0x10
LZ4_CONTENT_SIZE = 0x08
LZ4_DICTIONARY_ID = 0x01
LZ4_STORED = 0x80000000           # a block length's flag: the block is not compressed
_BUFFER_FULL = "whole buffer"     # cramjam's message when the output buffer is too small


def codec_id(codec):
    """The attribute value (0-4) of a codec given by name or id."""
    if isinstance(codec, str) and codec.lower() in CODEC_NAMES:
        return CompressionType(CODEC_NAMES.index(codec.lower()))
    if isinstance(codec, int) and not isinstance(codec, bool) and 0 <= codec < len(CODEC_NAMES):
        return CompressionType(codec)
    raise InvalidArgumentError(f"unknown compression codec {codec!r}; expected one of {CODEC_NAMES}")


def codec_name(codec):
    """The name of a codec id; an id that names no codec (5-7 fit in the attribute bits) as itself."""
    return CODEC_NAMES[codec] if 0 <= codec < len(CODEC_NAMES) else str(codec)


def compress(codec, data, magic, gzip_level=GZIP_DEFAULT_LEVEL):
    """``data`` compressed with ``codec`` (an id) in Kafka's framing for ``magic``; gzip at ``gzip_level``."""
    if codec == GZIP:
        return deflate.gzip_compress(data, LIBDEFLATE_LEVEL[gzip_level])
    if codec in (SNAPPY, LZ4):
        blocks = compressor(codec, magic)
        return b"".join((blocks.compress(data), blocks.flush()))
    if codec == ZSTD:
        if magic < 2:
            raise UnsupportedCompressionTypeError("zstd compression requires magic 2 (v2 batches)")
        return bytes(cramjam.zstd.compress(data))
    raise InvalidArgumentError(f"cannot compress with codec {codec}")


def decompress(codec, data, magic, limit=MAX_DECOMPRESSED_BYTES, position=None):
    """Decompress one batch's payload; returns a bytes-like object of at most ``limit`` bytes.

    Malformed input raises ``CorruptRecordError`` naming ``position`` (the batch's byte position), output
    beyond ``limit`` ``DecompressionLimitError``.
    """
    try:
        if codec == GZIP:
            return _gunzip(data, limit, position)
        if codec == SNAPPY:
            return _unsnappy(data, limit, position)
        if codec == LZ4:
            return _unlz4(data, magic, limit, position)
        if codec == ZSTD:
            return _unzstd(data, magic, limit, position)
    except (cramjam.DecompressionError, zlib_ng.error) as e:
        raise _undecodable(codec, e, position) from None
    raise CorruptRecordError(f"unknown compression codec {codec}", position)


def decompress_chunks(codec, data, magic, limit=MAX_DECOMPRESSED_BYTES, position=None):
    """``decompress`` a piece at a time: yields bytes-like pieces that join to what it returns (gzip at most
    ``CHUNK_BYTES`` each, snappy and lz4 a block each, zstd, raw snappy and linked lz4 blocks whole) and
    raises what it raises, as soon as the data read so far shows it."""
    try:
        if codec == GZIP:
            yield from _gunzip_chunks(data, limit, position)
        elif codec == SNAPPY:
            yield from _snappy_blocks(data, limit, position)
        elif codec == LZ4:
            yield from _unlz4_blocks(data, magic, limit, position)
        elif codec == ZSTD:
            yield _unzstd(data, magic, limit, position)
        else:
            raise CorruptRecordError(f"unknown compression codec {codec}", position)
    except (cramjam.DecompressionError, zlib_ng.error) as e:
        raise _undecodable(codec, e, position) from None


def _undecodable(codec, error, position):
    return CorruptRecordError(f"cannot decompress {CODEC_NAMES[codec]} data: {error}", position)


def _too_large(limit, position):
    return DecompressionLimitError(f"decompressed data exceeds the limit of {limit} bytes", position)


def _bounded_into(decompress_into, data, size, limit, position):
    """Decompress into a buffer grown 4x at a time up to ``limit + 1`` bytes (the one before is freed
    first); filling that one means too large."""
    size = min(size, limit + 1)
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(data, out)
        except cramjam.DecompressionError as e:
            if _BUFFER_FULL not in str(e):
                raise
            n = size
        if n < size:
            return memoryview(out)[:n]
        if size > limit:
            raise _too_large(limit, position)
        out = None
        size = size * 4 if size * 4 < limit else limit + 1


def _unzstd(data, magic, limit, position):
    if magic < 2:
        raise CorruptRecordError(f"zstd is not a valid codec for magic {magic}", position)
    return _bounded_into(cramjam.zstd.decompress_into, data, max(64 << 10, 8 * len(data)), limit, position)


def _gunzip(data, limit, position):
    parts, total, rest = [], 0, bytes(data)
    while rest:
        d = zlib_ng.decompressobj(wbits=31)
        chunk = d.decompress(rest, limit + 1 - total)
        total += len(chunk)
        parts.append(chunk)
        if total > limit:
            raise _too_large(limit, position)
        if not d.eof:
            raise CorruptRecordError("gzip data is truncated", position)
        rest = d.unused_data
    if not parts:
        raise CorruptRecordError("gzip data is empty", position)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _gunzip_chunks(data, limit, position):
    """``_gunzip`` in pieces of at most ``CHUNK_BYTES``."""
    rest, total = memoryview(data), 0
    if not rest:
        raise CorruptRecordError("gzip data is empty", position)
    while rest:
        d = zlib_ng.decompressobj(wbits=31)
        while not d.eof:
            chunk = d.decompress(rest, CHUNK_BYTES)
            rest = d.unconsumed_tail
            if chunk:
                total += len(chunk)
                if total > limit:
                    raise _too_large(limit, position)
                yield chunk
            elif not rest and not d.eof:
                raise CorruptRecordError("gzip data is truncated", position)
        rest = d.unused_data


def _unsnappy(data, limit, position):
    return b"".join(_snappy_blocks(data, limit, position))


def _snappy_blocks(data, limit, position):
    """The blocks of a xerial snappy stream decompressed one at a time (raw snappy is one block)."""
    view = memoryview(data)
    if len(view) < 16 or view[:8] != XERIAL_HEADER[:8]:
        yield _snappy_block(view, limit, position)
        return
    total, pos = 0, 16
    while pos < len(view):
        if len(view) - pos < 4:
            raise CorruptRecordError("xerial snappy block length is truncated", position)
        (length,) = struct.unpack_from(">i", view, pos)
        if length < 0 or length > len(view) - pos - 4:
            raise CorruptRecordError(f"invalid xerial snappy block length {length}", position)
        block = _snappy_block(view[pos + 4:pos + 4 + length], limit, position, total)
        total += len(block)
        pos += 4 + length
        yield block


def _snappy_block(view, limit, position, before=0):
    """One raw snappy block, refused when it would take the ``before`` bytes decompressed so far past ``limit``."""
    if before + cramjam.snappy.decompress_raw_len(view) > limit:
        raise _too_large(limit, position)
    return bytes(cramjam.snappy.decompress_raw(view))


def _lz4_block(chunk):
    block = cramjam.lz4.compress_block(chunk, store_size=False)
    if len(block) >= len(chunk):
        return struct.pack("<I", len(chunk) | LZ4_STORED), chunk
    return struct.pack("<I", len(block)), block


def _lz4_header(view, position):
    """``(FLG, block size, header length, header checksum as computed)`` of an LZ4 frame, its layout checked."""
    if len(view) < 7 or view[:4] != LZ4_MAGIC:
        raise CorruptRecordError("not an LZ4 frame", position)
    flg, bd = view[4], view[5]
    if flg >> 6 != 1 or (bd >> 4) & 7 not in LZ4_BLOCK_SIZES:
        raise CorruptRecordError("unsupported LZ4 frame descriptor", position)
    header_end = 7 + (8 if flg & LZ4_CONTENT_SIZE else 0) + (4 if flg & LZ4_DICTIONARY_ID else 0)
    if len(view) < header_end:
        raise CorruptRecordError("LZ4 frame header is truncated", position)
    checksum = (_core.xxh32_short(view[4:header_end - 1]) >> 8) & 0xFF
    return flg, LZ4_BLOCK_SIZES[(bd >> 4) & 7], header_end, checksum


def _lz4_blocks(view, flg, block_max, pos, position):
    """``(block, stored)`` for each block of an LZ4 frame from ``pos``, their lengths checked."""
    block_checksum = 4 if flg & LZ4_BLOCK_CHECKSUM else 0      # not verified, as Kafka's reader
    while True:
        if len(view) - pos < 4:
            raise CorruptRecordError("LZ4 frame is truncated", position)
        (length,) = struct.unpack_from("<I", view, pos)
        if length == 0:
            return
        stored, length = bool(length & LZ4_STORED), length & ~LZ4_STORED
        if length > block_max:
            raise CorruptRecordError("LZ4 block larger than the frame's block size", position)
        if length > len(view) - pos - 4:
            raise CorruptRecordError("LZ4 frame is truncated", position)
        yield view[pos + 4:pos + 4 + length], stored
        pos += 4 + length + block_checksum


def _unlz4(data, magic, limit, position):
    """Read an LZ4 frame: check its layout and size it from its block count, then let cramjam decode it."""
    view = memoryview(data)
    flg, block_max, header_end, checksum = _lz4_header(view, position)
    if magic == 0 and view[header_end - 1] != checksum:
        # Kafka before 0.10 wrote a wrong header checksum (KAFKA-3160); magic 0 readers skip it.
        view = memoryview(bytes(view[:header_end - 1]) + bytes((checksum,)) + bytes(view[header_end:]))
    blocks = sum(1 for _ in _lz4_blocks(view, flg, block_max, header_end, position))
    return _bounded_into(cramjam.lz4.decompress_into, view, max(blocks * block_max, 1), limit, position)


def _unlz4_blocks(data, magic, limit, position):
    """An LZ4 frame a block at a time when its blocks are independent (as Kafka writes them), else whole."""
    view = memoryview(data)
    flg, block_max, header_end, checksum = _lz4_header(view, position)
    if not flg & LZ4_INDEPENDENT_BLOCKS:
        yield _unlz4(view, magic, limit, position)
        return
    if magic != 0 and view[header_end - 1] != checksum:     # magic 0: KAFKA-3160, as in _unlz4
        raise CorruptRecordError("LZ4 frame header checksum does not match", position)
    total = 0
    for block, stored in _lz4_blocks(view, flg, block_max, header_end, position):
        if stored:
            out = block
        else:
            out = bytearray(block_max)
            # output_len says the block has no size prefix; without it cramjam takes the block's first four
            # bytes for one whenever they fit the buffer, and decodes the rest into other bytes
            out = memoryview(out)[:cramjam.lz4.decompress_block_into(block, out, output_len=block_max)]
        total += len(out)
        if total > limit:
            raise _too_large(limit, position)
        yield out


class _Blocks:
    """A stream compressor for Kafka's framings of independent blocks (xerial snappy, the LZ4 frame):
    ``header``, then each ``block_size`` bytes of input as the parts ``encode(block)`` returns, then
    ``trailer``."""

    def __init__(self, header, block_size, encode, trailer):
        self._header, self._block_size, self._encode, self._trailer = header, block_size, encode, trailer
        self._pending = bytearray()      # input short of a block

    def compress(self, data):
        view, parts = memoryview(data), [self._header]
        self._header = b""
        if self._pending:
            taken = self._block_size - len(self._pending)
            self._pending += view[:taken]
            view = view[taken:]
            if len(self._pending) < self._block_size:
                return b"".join(parts)
            parts += self._encode(self._pending)
            self._pending = bytearray()
        whole = len(view) - len(view) % self._block_size
        for i in range(0, whole, self._block_size):
            parts += self._encode(view[i:i + self._block_size])
        self._pending += view[whole:]
        return b"".join(parts)

    def flush(self):
        parts = [self._header, *(self._encode(self._pending) if self._pending else ()), self._trailer]
        self._header, self._pending = b"", bytearray()
        return b"".join(parts)


class _Zstd:
    def __init__(self):
        self._stream = cramjam.zstd.Compressor()

    def compress(self, data):
        self._stream.compress(data if type(data) is bytes else bytes(data))      # it takes bytes only
        return bytes(self._stream.flush())

    def flush(self):
        return bytes(self._stream.finish())


class _Uncompressed:
    def compress(self, data):
        return data

    def flush(self):
        return b""


def _xerial_block(chunk):
    block = cramjam.snappy.compress_raw(chunk)
    return struct.pack(">i", len(block)), block


def compressor(codec, magic=2, gzip_level=GZIP_DEFAULT_LEVEL):
    """A stream compressor for ``codec`` in Kafka's framing for ``magic``: ``compress(data)`` returns the
    output so far (maybe nothing), ``flush()`` the rest; the outputs joined are one payload."""
    if codec == NONE:
        return _Uncompressed()
    if codec == GZIP:
        return zlib.compressobj(gzip_level, zlib.DEFLATED, 31)
    if codec == SNAPPY:
        return _Blocks(XERIAL_HEADER, XERIAL_BLOCK, _xerial_block, b"")
    if codec == LZ4:
        descriptor = bytes((LZ4_FLG, LZ4_BD))
        checked = LZ4_MAGIC + descriptor if magic == 0 else descriptor     # KAFKA-3160 for magic 0
        header = LZ4_MAGIC + descriptor + bytes(((_core.xxh32_short(checked) >> 8) & 0xFF,))
        return _Blocks(header, LZ4_BLOCK, _lz4_block, b"\0\0\0\0")
    if codec == ZSTD:
        if magic < 2:
            raise UnsupportedCompressionTypeError("zstd compression requires magic 2 (v2 batches)")
        return _Zstd()
    raise InvalidArgumentError(f"cannot compress with codec {codec}")
