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
``CorruptRecordError`` before more memory is spent, so a small batch cannot expand into gigabytes (the
records decoded from it and its down-converted form are bounded too: see batches.py and convert.py).
"""
import enum
import struct

import cramjam
import deflate
from zlib_ng import zlib_ng

from kmem import _core
from kmem.errors import CorruptRecordError, InvalidArgumentError, UnsupportedCompressionTypeError

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

XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 << 10
LZ4_MAGIC = b"\x04\x22\x4d\x18"
LZ4_FLG = 0x60
LZ4_BD = 0x40
LZ4_BLOCK = 64 << 10
LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}
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
    if codec == SNAPPY:
        view = memoryview(data)
        parts = [XERIAL_HEADER]
        for i in range(0, len(view), XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(view[i:i + XERIAL_BLOCK]))
            parts += (struct.pack(">i", len(block)), block)
        return b"".join(parts)
    if codec == LZ4:
        return _lz4_frame(data, magic)
    if codec == ZSTD:
        if magic < 2:
            raise UnsupportedCompressionTypeError("zstd compression requires magic 2 (v2 batches)")
        return bytes(cramjam.zstd.compress(data))
    raise InvalidArgumentError(f"cannot compress with codec {codec}")


def decompress(codec, data, magic, limit=MAX_DECOMPRESSED_BYTES, position=None):
    """Decompress one batch's payload; returns a bytes-like object of at most ``limit`` bytes.

    Malformed input or output beyond ``limit`` raises ``CorruptRecordError`` naming ``position``
    (the batch's byte position).
    """
    try:
        if codec == GZIP:
            return _gunzip(data, limit, position)
        if codec == SNAPPY:
            return _unsnappy(data, limit, position)
        if codec == LZ4:
            return _unlz4(data, magic, limit, position)
        if codec == ZSTD:
            if magic < 2:
                raise CorruptRecordError(f"zstd is not a valid codec for magic {magic}", position)
            return _bounded_into(cramjam.zstd.decompress_into, data, max(64 << 10, 8 * len(data)), limit, position)
    except (cramjam.DecompressionError, zlib_ng.error) as e:
        raise CorruptRecordError(f"cannot decompress {CODEC_NAMES[codec]} data: {e}", position) from None
    raise CorruptRecordError(f"unknown compression codec {codec}", position)


def _too_large(limit, position):
    return CorruptRecordError(f"decompressed data exceeds the limit of {limit} bytes", position)


def _bounded_into(decompress_into, data, size, limit, position):
    """Decompress into a buffer grown up to ``limit + 1`` bytes; filling that one means too large."""
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
        size = min(size * 4, limit + 1)


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


def _unsnappy(data, limit, position):
    view = memoryview(data)
    if len(view) < 16 or view[:8] != XERIAL_HEADER[:8]:
        return _snappy_block(view, limit, position)
    parts, total, pos = [], 0, 16
    while pos < len(view):
        if len(view) - pos < 4:
            raise CorruptRecordError("xerial snappy block length is truncated", position)
        (length,) = struct.unpack_from(">i", view, pos)
        if length < 0 or length > len(view) - pos - 4:
            raise CorruptRecordError(f"invalid xerial snappy block length {length}", position)
        block = _snappy_block(view[pos + 4:pos + 4 + length], limit - total, position)
        total += len(block)
        parts.append(block)
        pos += 4 + length
    return b"".join(parts)


def _snappy_block(view, limit, position):
    if cramjam.snappy.decompress_raw_len(view) > limit:
        raise _too_large(limit, position)
    return bytes(cramjam.snappy.decompress_raw(view))


def _lz4_frame(data, magic):
    descriptor = bytes((LZ4_FLG, LZ4_BD))
    checked = LZ4_MAGIC + descriptor if magic == 0 else descriptor     # KAFKA-3160 for magic 0
    parts = [LZ4_MAGIC, descriptor, bytes(((_core.xxh32_short(checked) >> 8) & 0xFF,))]
    view = memoryview(data)
    for i in range(0, len(view), LZ4_BLOCK):
        chunk = view[i:i + LZ4_BLOCK]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) >= len(chunk):
            parts += (struct.pack("<I", len(chunk) | 0x80000000), chunk)
        else:
            parts += (struct.pack("<I", len(block)), block)
    parts.append(b"\0\0\0\0")
    return b"".join(parts)


def _unlz4(data, magic, limit, position):
    """Read an LZ4 frame: check its layout and size it from its block count, then let cramjam decode it."""
    view = memoryview(data)
    if len(view) < 7 or view[:4] != LZ4_MAGIC:
        raise CorruptRecordError("not an LZ4 frame", position)
    flg, bd = view[4], view[5]
    if flg >> 6 != 1 or (bd >> 4) & 7 not in LZ4_BLOCK_SIZES:
        raise CorruptRecordError("unsupported LZ4 frame descriptor", position)
    header_end = 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    if len(view) < header_end:
        raise CorruptRecordError("LZ4 frame header is truncated", position)
    checksum = (_core.xxh32_short(view[4:header_end - 1]) >> 8) & 0xFF
    if magic == 0 and view[header_end - 1] != checksum:
        # Kafka before 0.10 wrote a wrong header checksum (KAFKA-3160); magic 0 readers skip it.
        view = memoryview(bytes(view[:header_end - 1]) + bytes((checksum,)) + bytes(view[header_end:]))
    block_max = LZ4_BLOCK_SIZES[(bd >> 4) & 7]
    block_checksum = 4 if flg & 0x10 else 0
    blocks, pos = 0, header_end
    while True:
        if len(view) - pos < 4:
            raise CorruptRecordError("LZ4 frame is truncated", position)
        (length,) = struct.unpack_from("<I", view, pos)
        if length == 0:
            break
        length &= 0x7FFFFFFF
        if length > block_max:
            raise CorruptRecordError("LZ4 block larger than the frame's block size", position)
        pos += 4 + length + block_checksum
        blocks += 1
    return _bounded_into(cramjam.lz4.decompress_into, view, max(blocks * block_max, 1), limit, position)
