"""The byte loops under down-conversion beside the libraries that could replace them (issue 18).

- CRC-32 of 1 MiB: kmem's core (PCLMULQDQ folding, 256-bit VPCLMULQDQ with AVX2 where present) against
  zlib, isa-l and zlib-ng.
- gzip of 1 MiB of v1 entries (1 KiB values of words): kmem's codec (libdeflate at the level giving
  zlib's size at KIP-390's ``gzip_level``, Kafka's default 6: libdeflate 5) against zlib (what aiokafka
  and kafka-python use), cramjam (kmem's codec in issue 18's "today"), zlib-ng, libdeflate and isa-l at
  their levels; the compressed size of each is printed beside its speed. On this data every level
  looks alike; ``LIBDEFLATE_LEVEL`` is chosen on harder data (keyed JSON records, source code).
- gunzip of the same: kmem's bounded inflate (zlib-ng) against zlib.

Peers that are not installed are skipped (``pip install isal zlib-ng deflate``, the ``bench`` extra).

    .venv/bin/pytest bench/bench_records_codecs.py      (a table of ns/op and MB/s per group at the end)
"""
import zlib

import cramjam
import pytest
from bench_records import make_input

from kmem import _core
from kmem.records import codecs, down_convert

DATA = bytes(down_convert(make_input(1024, "none"), 1).records.buffer)[:1 << 20]


def _module(name):
    return pytest.importorskip(name)


def _gzip_with(module, level):
    def compress():
        c = module.compressobj(level, module.DEFLATED, 31)
        return c.compress(DATA) + c.flush()
    return compress


CRC32 = {
    "kmem": lambda: lambda: _core.crc32(DATA),
    "zlib": lambda: lambda: zlib.crc32(DATA),
    "isa-l": lambda: (lambda m: lambda: m.crc32(DATA))(_module("isal.isal_zlib")),
    "zlib-ng": lambda: (lambda m: lambda: m.crc32(DATA))(_module("zlib_ng.zlib_ng")),
}

GZIP = {    # contender: (level, factory)
    "kmem": (6, lambda: lambda: codecs.compress(codecs.GZIP, DATA, 1)),
    "zlib (aiokafka)": (6, lambda: _gzip_with(zlib, 6)),
    "kmem level 1": (1, lambda: lambda: codecs.compress(codecs.GZIP, DATA, 1, gzip_level=1)),
    "cramjam (kmem in issue 18)": (6, lambda: lambda: bytes(cramjam.gzip.compress(DATA, level=6))),
    "zlib-ng": (6, lambda: _gzip_with(_module("zlib_ng.zlib_ng"), 6)),
    "zlib-ng level 1": (1, lambda: _gzip_with(_module("zlib_ng.zlib_ng"), 1)),
    "libdeflate": (6, lambda: (lambda m: lambda: m.gzip_compress(DATA, 6))(_module("deflate"))),
    "libdeflate level 5": (5, lambda: (lambda m: lambda: m.gzip_compress(DATA, 5))(_module("deflate"))),
    "libdeflate level 4": (4, lambda: (lambda m: lambda: m.gzip_compress(DATA, 4))(_module("deflate"))),
    "libdeflate level 1": (1, lambda: (lambda m: lambda: m.gzip_compress(DATA, 1))(_module("deflate"))),
    "isa-l level 1": (1, lambda: _gzip_with(_module("isal.isal_zlib"), 1)),
}


@pytest.mark.parametrize("contender", CRC32)
def test_crc32(compare, contender):
    crc = CRC32[contender]()
    assert crc() == zlib.crc32(DATA)
    compare("CRC-32 of 1 MiB", contender, crc, unit_bytes=len(DATA))


@pytest.mark.parametrize("contender", GZIP)
def test_gzip(compare, contender):
    level, factory = GZIP[contender]
    compress = factory()
    size = len(compress())
    assert zlib.decompress(compress(), 31) == DATA
    compare(f"gzip of 1 MiB of v1 entries (zlib level 6: {len(_gzip_with(zlib, 6)()):,} B)",
            f"{contender}" if contender == "kmem" else f"{contender} ({size:,} B)", compress, unit_bytes=len(DATA))


GUNZIP = {
    "kmem": lambda data: lambda: codecs.decompress(codecs.GZIP, data, 1),
    "zlib (aiokafka)": lambda data: lambda: zlib.decompress(data, 31),
}


@pytest.mark.parametrize("contender", GUNZIP)
def test_gunzip(compare, contender):
    inflate = GUNZIP[contender](_gzip_with(zlib, 6)())
    assert bytes(inflate()) == DATA
    compare("gunzip of 1 MiB of v1 entries", contender, inflate, unit_bytes=len(DATA))
