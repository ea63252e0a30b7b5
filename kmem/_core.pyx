# cython: language_level=3
"""kmem's compiled core: loops over bytes and integers, no policy.

One extension module built from included parts (as msgpack and pyroaring do); the Python modules in
``kmem`` validate arguments, hold configuration and decide, and call down into these parts. Every part's
cimports are here and the types the parts share are in ``_core.pxd``, so the parts can be included in
any order.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.long cimport PyLong_Check
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove, memset

include "_pool.pxi"
include "_bloom.pxi"
include "_mapping.pxi"
include "_search.pxi"
include "_segment_files.pxi"
include "_checksums.pxi"
include "_record_format.pxi"
include "_record_encode.pxi"
include "_record_convert.pxi"
include "_record_decode.pxi"
include "_record_rebuild.pxi"
include "_record_validate.pxi"
include "_offset_map.pxi"
include "_producer_state.pxi"
include "_segment_append.pxi"
include "_log_append.pxi"
include "_wire.pxi"
include "_framing.pxi"
include "_channel.pxi"
include "_requests.pxi"
include "_dispatch.pxi"
include "_selector.pxi"
