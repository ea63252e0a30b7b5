# The compiled codecs' readers and writers (the per-message functions are generated: _wire_codecs.pxi).
#
# Every read is bounds-checked. A compiled codec takes only the common shape of a message: on a short or
# malformed input, or a value of an unexpected type, it raises WireFallback and kmem.protocol.api runs the
# Python codec on the same input, which is the reference: it names the fault, or handles the unusual value.

# module-level C names: kept out of the module's namespace (its public surface is kmem/_core.pyi)
cdef object _UUID = __import__("uuid").UUID
cdef object _ZERO_UUID = _UUID(int=0)


class WireFallback(Exception):
    """The compiled codec does not take this input or value: the Python codec decides."""


cdef int _wire_fallback() except -1:
    raise WireFallback()


cdef struct _Rd:
    const unsigned char* p
    Py_ssize_t pos
    Py_ssize_t end


cdef inline int _rd_need(_Rd* r, Py_ssize_t n) except -1:
    if n > r.end - r.pos:
        _wire_fallback()
    return 0


cdef inline uint64_t _rd_be(_Rd* r, int width) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t value = 0
    cdef int i
    _rd_need(r, width)
    for i in range(width):
        value = (value << 8) | r.p[r.pos + i]
    r.pos += width
    return value


cdef inline int64_t _rd_u8(_Rd* r) except? -1:
    _rd_need(r, 1)
    r.pos += 1
    return r.p[r.pos - 1]


cdef inline int64_t _rd_i8(_Rd* r) except? -1:
    return <int8_t>_rd_u8(r)


cdef inline int64_t _rd_i16(_Rd* r) except? -1:
    return <int16_t><uint16_t>_rd_be(r, 2)


cdef inline int64_t _rd_u16(_Rd* r) except? -1:
    return <uint16_t>_rd_be(r, 2)


cdef inline int64_t _rd_i32(_Rd* r) except? -1:
    return <int32_t><uint32_t>_rd_be(r, 4)


cdef inline int64_t _rd_i64(_Rd* r) except? -1:
    return <int64_t>_rd_be(r, 8)


cdef inline double _rd_f64(_Rd* r) except? -1.0:
    cdef uint64_t bits = _rd_be(r, 8)
    cdef double value
    memcpy(&value, &bits, 8)
    return value


cdef object _rd_uuid(_Rd* r):
    _rd_need(r, 16)
    r.pos += 16
    return _UUID(bytes=PyBytes_FromStringAndSize(<const char*>r.p + r.pos - 16, 16))


cdef inline int64_t _rd_uvarint(_Rd* r) except -1:
    """An unsigned varint of at most 5 bytes (Kafka's ByteUtils.readUnsignedVarint)."""
    cdef int64_t value = 0
    cdef int shift
    cdef unsigned char byte
    for shift in range(0, 35, 7):
        _rd_need(r, 1)
        byte = r.p[r.pos]
        r.pos += 1
        value |= <int64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            return value
    _wire_fallback()
    return -1


@cython.final
@cython.internal
cdef class _WireOut:
    """The bytes being encoded, and the record Sends noted instead of copied: (offset in the final
    buffer, send), ``base`` being where this output will start in it."""
    cdef char* p
    cdef Py_ssize_t len, cap, base
    cdef list splices
    cdef int64_t spliced

    def __cinit__(self, Py_ssize_t base):
        self.p = NULL
        self.len = self.cap = 0
        self.base = base
        self.splices = []
        self.spliced = 0

    def __dealloc__(self):
        free(self.p)

    cdef int splice(self, send, size) except -1:
        self.splices.append((self.base + self.len, send))
        self.spliced += _wire_int(size)
        return 0

    cdef bytes tagged_value(self):
        if self.splices:
            _wire_fallback()
        return PyBytes_FromStringAndSize(self.p, self.len)


cdef inline char* _room(_WireOut w, Py_ssize_t n) except NULL:
    """Room for ``n`` more bytes at the end; the caller writes them and adds ``n`` to ``w.len``."""
    cdef Py_ssize_t cap
    cdef char* grown
    if w.len + n > w.cap:
        cap = max(w.cap * 2, w.len + n, 256)
        grown = <char*>realloc(w.p, cap)
        if grown == NULL:
            raise MemoryError()
        w.p, w.cap = grown, cap
    return w.p + w.len


cdef inline int64_t _wire_int(value) except? -1:
    # struct.pack takes ints (bool and IntEnum too); anything else is the reference's to refuse or take
    if not PyLong_Check(value):
        _wire_fallback()
    return value


cdef inline int _put_be(_WireOut w, uint64_t value, int width) except -1:
    cdef char* at = _room(w, width)
    cdef int i
    for i in range(width):
        at[i] = <char>(value >> (8 * (width - 1 - i)))
    w.len += width
    return 0


cdef inline int _put_ranged(_WireOut w, value, int64_t low, int64_t high, int width) except -1:
    cdef int64_t number = _wire_int(value)
    if number < low or number > high:
        _wire_fallback()
    return _put_be(w, <uint64_t>number, width)


cdef inline int _put_u8(_WireOut w, int value) except -1:
    _room(w, 1)[0] = <char>value
    w.len += 1
    return 0


cdef inline int _put_i8(_WireOut w, value) except -1:
    return _put_ranged(w, value, -0x80, 0x7F, 1)


cdef inline int _put_i16(_WireOut w, value) except -1:
    return _put_ranged(w, value, -0x8000, 0x7FFF, 2)


cdef inline int _put_u16(_WireOut w, value) except -1:
    return _put_ranged(w, value, 0, 0xFFFF, 2)


cdef inline int _put_i32(_WireOut w, value) except -1:
    return _put_ranged(w, value, -0x80000000, 0x7FFFFFFF, 4)


cdef inline int _put_i64(_WireOut w, value) except -1:
    return _put_be(w, <uint64_t>_wire_int(value), 8)


cdef inline int _put_f64(_WireOut w, value) except -1:
    cdef double number = value
    cdef uint64_t bits
    memcpy(&bits, &number, 8)
    return _put_be(w, bits, 8)


cdef inline int _put_bool(_WireOut w, bint value) except -1:
    return _put_u8(w, 1 if value else 0)


cdef int _put_uuid(_WireOut w, value) except -1:
    raw = value.bytes
    if type(raw) is not bytes or len(<bytes>raw) != 16:
        _wire_fallback()
    return _put_raw(w, <bytes>raw)


cdef inline int _put_raw(_WireOut w, bytes raw) except -1:
    cdef Py_ssize_t size = len(raw)
    memcpy(_room(w, size), PyBytes_AS_STRING(raw), size)
    w.len += size
    return 0


cdef inline int _put_uvarint(_WireOut w, value) except -1:
    cdef int64_t number = _wire_int(value)
    if number < 0 or number > 0xFFFFFFFF:
        _wire_fallback()
    while number > 0x7F:
        _put_u8(w, (number & 0x7F) | 0x80)
        number >>= 7
    return _put_u8(w, <int>number)


cdef int _put_tagged(_WireOut w, tags) except -1:
    """A tagged-fields section, tags ascending (codegen.tagged_section)."""
    if type(tags) is not dict:
        _wire_fallback()
    _put_uvarint(w, len(<dict>tags))
    for tag in sorted(<dict>tags):
        value = (<dict>tags)[tag]
        if type(value) is not bytes:
            _wire_fallback()
        _put_uvarint(w, tag)
        _put_uvarint(w, len(<bytes>value))
        _put_raw(w, <bytes>value)
    return 0


ctypedef object (*_wire_decoder)(_Rd*, object)
ctypedef int (*_wire_encoder)(_WireOut, object) except -1

cdef tuple _WIRE_CLASSES = ()
cdef tuple _WIRE_DEFAULTS = ()
cdef tuple _WIRE_MAKERS = ()


cdef extern from *:
    """
    #include <structmember.h>
    /* The byte offset in an instance of the slot that ``descr`` (a class's __slots__ member) describes, or -1
       when it is not a plain object slot. */
    static Py_ssize_t kmem_slot_offset(PyObject* descr) {
        PyMemberDef* member;
        if (Py_TYPE(descr) != &PyMemberDescr_Type)
            return -1;
        member = ((PyMemberDescrObject*)descr)->d_member;
        return member->type == T_OBJECT_EX && !(member->flags & READONLY) ? member->offset : -1;
    }
    /* An instance of ``cls`` whose slots at ``offsets`` hold ``values`` (a tuple of as many), made as
       object.__new__ makes it and filled as an __init__ assigning each would fill it. */
    static PyObject* kmem_slots_new(PyObject* cls, const Py_ssize_t* offsets, PyObject* values) {
        Py_ssize_t i;
        PyObject* instance = ((PyTypeObject*)cls)->tp_alloc((PyTypeObject*)cls, 0);
        if (instance == NULL)
            return NULL;
        for (i = 0; i < PyTuple_GET_SIZE(values); i++) {
            PyObject* value = PyTuple_GET_ITEM(values, i);
            Py_INCREF(value);
            *(PyObject**)((char*)instance + offsets[i]) = value;
        }
        return instance;
    }
    """
    Py_ssize_t kmem_slot_offset(object descr)
    object kmem_slots_new(object cls, const Py_ssize_t* offsets, tuple values)


@cython.final
@cython.internal
cdef class _SlotMaker:
    """``cls(*values)`` for a generated message class whose ``__init__`` only assigns its arguments to its
    ``__slots__`` in order: the compiled decoders pass every field, so the slots are filled directly, without
    a Python frame per message."""
    cdef object cls
    cdef Py_ssize_t count
    cdef Py_ssize_t* offsets

    def __cinit__(self, cls, list offsets):
        cdef Py_ssize_t i
        self.cls = cls
        self.count = len(offsets)
        self.offsets = <Py_ssize_t*>malloc(max(1, self.count) * sizeof(Py_ssize_t))
        if self.offsets == NULL:
            raise MemoryError()
        for i in range(self.count):
            self.offsets[i] = offsets[i]

    def __dealloc__(self):
        free(self.offsets)

    def __call__(self, *values):
        if len(values) != self.count:
            return self.cls(*values)
        return kmem_slots_new(self.cls, self.offsets, values)


cdef object _slot_maker(cls):
    """A ``_SlotMaker`` of ``cls``, or ``cls`` itself when its slots are not all plain object slots."""
    offsets = []
    for name in cls.__slots__:
        descr = cls.__dict__.get(name)
        offset = -1 if descr is None else kmem_slot_offset(descr)
        if offset < 0:
            return cls
        offsets.append(offset)
    return _SlotMaker(cls, offsets)


def bind_wire_classes(classes, defaults):
    """The classes of ``WIRE_STRUCTS`` and their shared defaults (None where a struct has none), from
    kmem.protocol.codegen: the compiled codecs build and read these."""
    global _WIRE_CLASSES, _WIRE_DEFAULTS, _WIRE_MAKERS
    _WIRE_CLASSES, _WIRE_DEFAULTS = tuple(classes), tuple(defaults)
    _WIRE_MAKERS = tuple(_slot_maker(cls) for cls in _WIRE_CLASSES)


cdef inline object _wire_class(Py_ssize_t index):
    """What builds a message of class ``index`` from all its fields in order (its ``_SlotMaker``)."""
    return _WIRE_MAKERS[index]


cdef object _wire_default(Py_ssize_t index):
    shared = _WIRE_DEFAULTS[index]
    return shared if shared is not None else _WIRE_CLASSES[index]()


cdef inline bint _wire_differs(Py_ssize_t index, value):
    shared = _WIRE_DEFAULTS[index]
    return shared is None or value is not shared


include "_wire_codecs.pxi"


cdef object _rd_client_id(_Rd* r):
    """A request header's client id (a nullable string); WireFallback on a bad length, UnicodeDecodeError on bad
    UTF-8."""
    cdef int64_t length = _rd_i16(r)
    if length == -1:
        return None
    if length < 0:
        _wire_fallback()
    _rd_need(r, length)
    client_id = PyUnicode_DecodeUTF8(<const char*>r.p + r.pos, length, NULL)
    r.pos += length
    return client_id


def wire_request_header(view):
    """``(api_key, api_version, correlation_id, client_id, pos after it)`` of a request header v1 or v2 at
    the start of ``view`` (a memoryview of bytes); the tagged fields of v2 are the caller's, which knows
    the API's versions. Raises WireFallback (or another exception) on anything the Python codec must judge."""
    cdef Py_buffer buffer
    cdef _Rd reader
    PyObject_GetBuffer(view, &buffer, PyBUF_SIMPLE)
    try:
        reader.p = <const unsigned char*>buffer.buf
        reader.pos = 0
        reader.end = buffer.len
        api_key, api_version, correlation_id = _rd_i16(&reader), _rd_i16(&reader), _rd_i32(&reader)
        client_id = _rd_client_id(&reader)
    finally:
        PyBuffer_Release(&buffer)
    return api_key, api_version, correlation_id, client_id, reader.pos


def wire_decode(Py_ssize_t index, view, Py_ssize_t pos):
    """``(message, pos after it)``: the body at ``pos`` of ``view`` (a memoryview of bytes) by the compiled
    decoder ``index`` of ``WIRE_CODECS``; records are views of ``view``. Raises WireFallback (or another
    exception) on anything the Python codec must judge."""
    cdef Py_buffer buffer
    cdef _Rd reader
    if index < 0 or index >= _WIRE_COUNT:
        raise IndexError(f"no compiled codec {index}")
    PyObject_GetBuffer(view, &buffer, PyBUF_SIMPLE)
    try:
        if pos < 0 or pos > buffer.len:
            _wire_fallback()
        reader.p = <const unsigned char*>buffer.buf
        reader.pos = pos
        reader.end = buffer.len
        message = _WIRE_DECODE[index](&reader, view)
    finally:
        PyBuffer_Release(&buffer)
    return message, reader.pos


def wire_decode_request(payload, dict requests, header_class):
    """``(header_class(api key, version, correlation id, client id), body)`` of a request payload the core reads
    whole: its API and version in ``requests`` (``{api key << 16 | version: (ApiKey, flexible header, index of
    its compiled codec in WIRE_CODECS)}``), no tagged field in its header, a body its compiled decoder takes (its
    records views of a memoryview of ``payload``). None for any other, which the Python codec reads (and whose
    faults it names)."""
    cdef Py_buffer buffer
    cdef _Rd reader
    cdef int64_t api_key, api_version, correlation_id
    view = memoryview(payload)
    if view.ndim != 1 or view.format != "B":
        return None
    PyObject_GetBuffer(view, &buffer, PyBUF_SIMPLE)
    try:
        reader.p = <const unsigned char*>buffer.buf
        reader.pos = 0
        reader.end = buffer.len
        if reader.end < 10:
            return None
        api_key, api_version, correlation_id = _rd_i16(&reader), _rd_i16(&reader), _rd_i32(&reader)
        plan = requests.get((api_key << 16) | api_version)
        if plan is None:
            return None
        key, flexible, index = plan
        try:
            client_id = _rd_client_id(&reader)
        except (WireFallback, UnicodeDecodeError):
            return None
        if flexible:
            if reader.pos >= reader.end or reader.p[reader.pos] != 0:
                return None
            reader.pos += 1
        try:
            body = _WIRE_DECODE[<Py_ssize_t>index](&reader, view)
        except Exception:
            return None
    finally:
        PyBuffer_Release(&buffer)
    return header_class(key, api_version, correlation_id, client_id), body


def wire_encode_response(header, body, dict responses):
    """The payload of ``body`` answering the request of ``header`` (its version and correlation id) written whole
    by the core: ``bytes``, or ``(bytes, [(offset, record Send)], bytes of the Sends)`` when it holds Sends.
    None where ``(type(body), version)`` is not in ``responses`` (``{...: (ApiKey, flexible header, index of its
    compiled codec)}``), the request was of another API or a value is one the compiled encoder leaves to the
    Python codec, which then writes it (or names the fault)."""
    cdef Py_ssize_t head
    cdef _WireOut out
    cdef char* p
    version = header.api_version
    plan = responses.get((type(body), version))
    if plan is None:
        return None
    api_key, flexible, index = plan
    correlation_id = header.correlation_id
    if api_key != header.api_key or not PyLong_Check(correlation_id) or not -2**31 <= correlation_id < 2**31:
        return None
    head = 5 if flexible else 4
    out = _WireOut(head)
    try:
        _WIRE_ENCODE[<Py_ssize_t>index](out, body)
    except Exception:
        return None
    data = PyBytes_FromStringAndSize(NULL, head + out.len)
    p = PyBytes_AS_STRING(data)
    put32(<unsigned char*>p, correlation_id)
    if flexible:
        p[4] = 0
    if out.len:
        memcpy(p + head, out.p, out.len)
    if out.splices:
        return data, out.splices, out.spliced
    return data


def wire_encode(Py_ssize_t index, message, bytearray buf, list splices):
    """Append ``message``'s body to ``buf`` by the compiled encoder ``index`` of ``WIRE_CODECS``, noting
    record Sends in ``splices`` as (offset in ``buf``, send); returns the bytes so noted. On an exception
    (WireFallback: a value the Python codec must judge) ``buf`` and ``splices`` are untouched."""
    if index < 0 or index >= _WIRE_COUNT:
        raise IndexError(f"no compiled codec {index}")
    cdef Py_ssize_t start = len(buf)
    cdef _WireOut out = _WireOut(start)
    _WIRE_ENCODE[index](out, message)
    PyByteArray_Resize(buf, start + out.len)
    memcpy(PyByteArray_AS_STRING(buf) + start, out.p, out.len)
    if out.splices:
        splices.extend(out.splices)
    return out.spliced
