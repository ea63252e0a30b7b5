"""Source generation: for each (message, version) a decode and an encode function specialised to that
version's layout, compiled once and cached.

The generated code is straight-line Python: runs of fixed-size fields are read and written by one
precompiled ``struct.Struct``; nested structs are inlined. A failure is named (the field's path) by a
second copy that sets ``f`` before each field, generated and run only after a failure.
Decoding reads a ``memoryview`` and never copies ``records`` (a slice of the input);
encoding appends to a ``bytearray`` and notes where record ``Send``s go instead of copying them.
"""
import functools
import struct
import threading
import uuid

from ..errors import InvalidArgumentError
from ..send import BytesSend
from .errors import CorruptMessageError, InvalidMessageError
from .schema import FIXED_FORMATS, ZERO_UUID

_MISSING = object()
_BYTES_LIKE = (bytes, bytearray, memoryview)
# records at most this large are copied into the response; larger ones go out as their own part
INLINE_RECORDS_MAX = 16 << 10


class _Bad(Exception):
    """Raised by generated code; turned into a CorruptMessageError / InvalidMessageError naming the field.
    ``pos``: the byte, when raised by a helper that read past where its caller stands."""

    def __init__(self, reason, pos=None):
        super().__init__(reason)
        self.pos = pos


def read_uvarint(data, pos):
    """An unsigned varint of at most 5 bytes (Kafka's ByteUtils.readUnsignedVarint) -> (value, pos)."""
    value = 0
    for shift in range(0, 35, 7):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
    raise _Bad("unsigned varint longer than 5 bytes")


def read_unknown_tags(data, pos):
    """A tagged-fields section none of whose tags is known -> ({tag: bytes} or None, pos); a failure is a
    ``_Bad`` whose ``pos`` is the byte where it happened."""
    tags = None
    try:
        count, pos = read_uvarint(data, pos)
        for _ in range(count):
            tag, pos = read_uvarint(data, pos)
            size, pos = read_uvarint(data, pos)
            if pos + size > len(data):
                raise _Bad(f"tagged field of {size} bytes past the end")
            if tags is None:
                tags = {}
            tags[tag] = bytes(data[pos:pos + size])
            pos += size
    except (IndexError, _Bad) as e:
        raise _Bad(str(e) if isinstance(e, _Bad) else "message ends early", pos) from None
    return tags, pos


def uvarint(value):
    if 0 <= value < 0x4000:                              # lengths below 16 KiB: one or two bytes
        return bytes((value,)) if value < 0x80 else bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0 or value > 0xFFFFFFFF:
        raise _Bad(f"length {value} does not fit an unsigned varint")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return out


def tagged_section(tags):
    """The tagged-fields section of ``{tag: encoded value}``, in ascending tag order."""
    out = bytearray(uvarint(len(tags)))
    for tag in sorted(tags):
        value = tags[tag]
        out += uvarint(tag)
        out += uvarint(len(value))
        out += value
    return out


def put_records(buf, splices, records, compact):
    """Write a records field: its length, then small bytes-like records inline; a Send, or bytes-like
    records larger than INLINE_RECORDS_MAX, is noted in ``splices`` as (offset in ``buf``, send).
    Returns the bytes so noted."""
    if isinstance(records, _BYTES_LIKE):
        view = memoryview(records).cast("B") if type(records) is memoryview else records
        size = len(view)
        buf += uvarint(size + 1) if compact else _I32.pack(size)
        if size <= INLINE_RECORDS_MAX:
            buf += view
            return 0
        splices.append((len(buf), BytesSend(view)))
        return size
    if getattr(records, "write_to", None) is None:
        try:
            view = memoryview(records).cast("B")
        except TypeError:
            raise _Bad(f"records must be bytes-like, None or a Send, not {type(records).__name__}") from None
        return put_records(buf, splices, view, compact)
    size = records.size
    buf += uvarint(size + 1) if compact else _I32.pack(size)
    splices.append((len(buf), records))
    return size


_I32 = struct.Struct(">i")


class _Source:
    def __init__(self, name, version):
        self.lines = []
        self.globals = {"_Bad": _Bad, "_uvarint": read_uvarint, "_enc_uvarint": uvarint,
                        "_tagged_section": tagged_section, "_unknown_tags": read_unknown_tags, "_put_records": put_records,
                        "_BYTES_LIKE": _BYTES_LIKE, "_UUID": uuid.UUID, "_unpack_from": struct.unpack_from,
                        "_pack": struct.pack, "_pack_varint2": struct.Struct(">BB").pack,
                        "_pack_varint3": struct.Struct(">BBB").pack,
                        "_ZERO_UUID": ZERO_UUID, "_MISSING": _MISSING}
        self.counter = 0
        self.name = f"{name}_v{version}"

    def var(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter}"

    def constant(self, prefix, value):
        name = self.var(f"_{prefix}")
        self.globals[name] = value
        return name

    def emit(self, indent, line):
        self.lines.append("    " * indent + line)

    def compile(self, function):
        code = compile("\n".join(self.lines) + "\n", f"<kmem.protocol {self.name}>", "exec")
        exec(code, self.globals)
        return self.globals[function]


def _fixed_runs(fields):
    """Group consecutive fixed-size fields so each run is one struct call."""
    runs, current = [], []
    for field in fields:
        if not field.is_array and field.type in FIXED_FORMATS:
            current.append(field)
            continue
        if current:
            runs.append(current)
            current = []
        runs.append(field)
    if current:
        runs.append(current)
    return runs


def _literal(src, value):
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    if value == []:
        return "[]"
    if value is ZERO_UUID:
        return "_ZERO_UUID"
    return src.constant("default", value)


def _default_expr(src, field):
    if field.struct is not None and not field.is_array and field.default_text != "null":
        shared = field.struct.cls._default
        return src.constant("default", shared) if shared is not None else f"{src.constant('cls', field.struct.cls)}()"
    return _literal(src, field.default())


class _FieldWriter:
    """What the decoder and the encoder generators share: the source being written, the version, and
    whether the copy being generated tracks the field path."""

    def __init__(self, src, version, flexible, track):
        self.src, self.version, self.flexible = src, version, flexible
        self.track = track           # set ``f`` before each field (the slower copy run to name a failure)

    def _where(self, indent, path):
        if self.track:
            self.src.emit(indent, f"f = {path!r}")


# ----------------------------------------------------------------------------------------------- decode

class _Decoder(_FieldWriter):
    def struct(self, struct, target, indent, path):
        src, version = self.src, self.version
        fields = [f for f in struct.fields if f.present(version)]
        untagged = [f for f in fields if not (self.flexible and f.is_tagged(version))]
        tagged = [f for f in fields if self.flexible and f.is_tagged(version)]
        values = {}
        for run in _fixed_runs(untagged):
            if isinstance(run, list):
                fmt = ">" + "".join(FIXED_FORMATS[f.type] for f in run)
                unpack = src.constant("unpack", _struct_of(fmt).unpack_from)
                names = [src.var("v") for _ in run]
                self._where(indent, self._path(path, run))
                src.emit(indent, f"{', '.join(names)}, = {unpack}(data, pos)")
                src.emit(indent, f"pos += {_struct_of(fmt).size}")
                for field, name in zip(run, names):
                    if field.type == "uuid":
                        src.emit(indent, f"{name} = _UUID(bytes={name})")
                    values[field.name] = name
            else:
                values[run.name] = self.field(run, indent, path)
        unknown = "None"
        if self.flexible:
            unknown = src.var("ut")
            for field in tagged:
                values[field.name] = name = src.var("v")
                src.emit(indent, f"{name} = {_default_expr(src, field)}")
            self._where(indent, path + "<tagged fields>")
            if not tagged and not self.track:    # the usual section: empty, else a short helper call
                src.emit(indent, f"if data[pos]: {unknown}, pos = _unknown_tags(data, pos)")
                src.emit(indent, f"else: {unknown}, pos = None, pos + 1")
        if tagged or (self.flexible and self.track):     # inline: a failure names its exact byte
            src.emit(indent, f"{unknown} = None")
            count, tag, size, stop = src.var("n"), src.var("tag"), src.var("sz"), src.var("te")
            self._uvarint(count, indent)
            src.emit(indent, f"for _ in range({count}) if {count} else ():")
            self._uvarint(tag, indent + 1)
            self._uvarint(size, indent + 1)
            src.emit(indent + 1, f"{stop} = pos + {size}")
            src.emit(indent + 1,
                     f"if {stop} > end: raise _Bad('tagged field of ' + str({size}) + ' bytes past the end')")
            keyword = "if"
            for field in tagged:
                src.emit(indent + 1, f"{keyword} {tag} == {field.tag}:")
                keyword = "elif"
                decoded = self.field(field, indent + 2, path)
                src.emit(indent + 2, f"{values[field.name]} = {decoded}")
                src.emit(indent + 2, f"if pos != {stop}: raise _Bad('tagged field size ' + str({size}) + ' is wrong')")
            if tagged:
                src.emit(indent + 1, "else:")
            body = indent + 2 if tagged else indent + 1
            src.emit(body, f"if {unknown} is None: {unknown} = {{}}")
            src.emit(body, f"{unknown}[{tag}] = bytes(data[pos:{stop}])")
            src.emit(body, f"pos = {stop}")
        args = [values.get(f.name) or _default_expr(src, f) for f in struct.fields]
        cls = src.constant("cls", struct.cls)
        src.emit(indent, f"{target} = {cls}({', '.join(args + [unknown])})")

    @staticmethod
    def _path(path, run):
        names = [f.name for f in run]
        return path + (names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}")

    def _uvarint(self, target, indent):
        self.src.emit(indent, f"{target} = data[pos]")
        self.src.emit(indent, "pos += 1")
        self.src.emit(indent, f"if {target} > 127: {target}, pos = _uvarint(data, pos - 1)")

    def _length(self, field, target, indent, wide):
        """Read a length or count (-1 = null) into ``target``."""
        src = self.src
        if field.compact(self.flexible):
            self._uvarint(target, indent)
            src.emit(indent, f"{target} -= 1")
        else:
            fmt = ">i" if wide else ">h"
            src.emit(indent, f"{target}, = {src.constant('unpack', _struct_of(fmt).unpack_from)}(data, pos)")
            src.emit(indent, f"pos += {4 if wide else 2}")

    def _null_check(self, field, length, target, indent):
        """Emit ``if length < 0: target = None / raise``, then ``else:``; returns the else-body indent."""
        src = self.src
        src.emit(indent, f"if {length} < 0:")
        if field.is_nullable(self.version):
            src.emit(indent + 1, f"if {length} != -1: raise _Bad('negative length ' + str({length}))")
            src.emit(indent + 1, f"{target} = None")
        else:
            src.emit(indent + 1, f"raise _Bad('null (length ' + str({length}) + ') in a non-nullable field')")
        src.emit(indent, "else:")
        return indent + 1

    def field(self, field, indent, path):
        """Emit the decoding of one field; returns the variable holding its value."""
        src = self.src
        target = src.var("v")
        here = path + field.name
        self._where(indent, here)
        if field.is_array:
            count = src.var("n")
            self._length(field, count, indent, wide=True)
            body = self._null_check(field, count, target, indent)
            # every element takes a byte at least: a count beyond the bytes left is refused unallocated
            src.emit(body, f"if {count} > end - pos: "
                           f"raise _Bad(str({count}) + ' elements cannot fit in ' + str(end - pos) + ' bytes')")
            element = field.element
            if element in FIXED_FORMATS and element != "uuid" and element != "bool":
                size = _struct_of(">" + FIXED_FORMATS[element]).size
                fmt = FIXED_FORMATS[element]
                src.emit(body, f"{target} = list(_unpack_from('>' + str({count}) + {fmt!r}, data, pos))")
                src.emit(body, f"pos += {count} * {size}")
            else:
                items = src.var("items")
                src.emit(body, f"{items} = []")
                src.emit(body, f"for _ in range({count}):")
                if field.struct is not None:
                    item = src.var("item")
                    self.struct(field.struct, item, body + 1, here + "[].")
                else:
                    item = self.scalar(element, field, body + 1, here + "[]")
                src.emit(body + 1, f"{items}.append({item})")
                src.emit(body, f"{target} = {items}")
            return target
        if field.struct is not None:
            if field.is_nullable(self.version):
                marker = src.var("m")
                src.emit(indent, f"{marker} = data[pos]")
                src.emit(indent, "pos += 1")
                src.emit(indent, f"if {marker} > 127: {target} = None")
                src.emit(indent, "else:")
                self.struct(field.struct, target, indent + 1, here + ".")
            else:
                self.struct(field.struct, target, indent, here + ".")
            return target
        return self.scalar(field.type, field, indent, here, target)

    def scalar(self, kind, field, indent, here, target=None):
        src = self.src
        target = target or src.var("v")
        if kind in FIXED_FORMATS:
            fmt = ">" + FIXED_FORMATS[kind]
            src.emit(indent, f"{target}, = {src.constant('unpack', _struct_of(fmt).unpack_from)}(data, pos)")
            src.emit(indent, f"pos += {_struct_of(fmt).size}")
            if kind == "uuid":
                src.emit(indent, f"{target} = _UUID(bytes={target})")
            return target
        length, stop = src.var("n"), src.var("e")
        self._length(field, length, indent, wide=kind != "string")
        body = self._null_check(field, length, target, indent)
        if kind == "string" and field.compact(self.flexible):
            # as Kafka's readers: a string holds at most 32767 bytes in every version, compact ones too
            src.emit(body, f"if {length} > 32767: raise _Bad('string of ' + str({length}) + ' bytes (at most 32767)')")
        src.emit(body, f"{stop} = pos + {length}")
        src.emit(body, f"if {stop} > end: raise _Bad(str({length}) + ' bytes announced, ' + str(end - pos) + ' left')")
        if kind == "string":
            src.emit(body, f"{target} = str(data[pos:{stop}], 'utf-8')")
        elif kind == "bytes":
            src.emit(body, f"{target} = bytes(data[pos:{stop}])")
        else:                                                   # records: a view, never a copy
            src.emit(body, f"{target} = data[pos:{stop}]")
        src.emit(body, f"pos = {stop}")
        return target


# ----------------------------------------------------------------------------------------------- encode

class _Encoder(_FieldWriter):
    def struct(self, struct, obj, buf, indent, path):
        src, version = self.src, self.version
        fields = [f for f in struct.fields if f.present(version)]
        untagged = [f for f in fields if not (self.flexible and f.is_tagged(version))]
        tagged = [f for f in fields if self.flexible and f.is_tagged(version)]
        runs = _fixed_runs(untagged)
        i = 0
        while i < len(runs):
            run = runs[i]
            following = runs[i + 1] if i + 1 < len(runs) else None
            if isinstance(run, list) and not self.track and getattr(following, "is_array", False):
                after = runs[i + 2] if i + 2 < len(runs) and isinstance(runs[i + 2], list) else []
                i += 3 if after else 2
                records = runs[i] if after and i < len(runs) and self._fixed_length_records(runs[i]) else None
                i += records is not None
                self._runs_around_array(run, following, after, records, obj, buf, indent, path)
            elif isinstance(run, list):
                self._run(run, obj, buf, indent, path)
                i += 1
            else:
                self.field(run, f"{obj}.{run.name}", buf, indent, path)
                i += 1
        if not self.flexible:
            return
        tags = src.var("tags")
        src.emit(indent, f"{tags} = {obj}.unknown_tags")
        for field in tagged:
            value = src.var("t")
            self._where(indent, path + field.name)
            src.emit(indent, f"{value} = {obj}.{field.name}")
            src.emit(indent, f"if {self._not_default(field, value)}:")
            out = src.var("tb")
            src.emit(indent + 1, f"{out} = bytearray()")
            self.field(field, value, out, indent + 1, path)
            src.emit(indent + 1, f"{tags} = dict({tags} or ())")
            src.emit(indent + 1, f"{tags}[{field.tag}] = {out}")
        self._where(indent, path + "<tagged fields>")
        src.emit(indent, f"if {tags}: {buf} += _tagged_section({tags})")
        src.emit(indent, f"else: {buf}.append(0)")

    @staticmethod
    def _run_format(run):
        return "".join(FIXED_FORMATS[f.type] for f in run)

    @staticmethod
    def _run_args(run, obj):
        return [f"{obj}.{f.name}.bytes" if f.type == "uuid" else f"{obj}.{f.name}" for f in run]

    def _run(self, run, obj, buf, indent, path):
        """One struct call for a run of fixed-size fields."""
        pack = self.src.constant("pack", _struct_of(">" + self._run_format(run)).pack)
        self._where(indent, _Decoder._path(path, run))
        self.src.emit(indent, f"{buf} += {pack}({', '.join(self._run_args(run, obj))})")

    def _fixed_length_records(self, field):
        return not isinstance(field, list) and field.type == "records" and not field.compact(self.flexible)

    def _runs_around_array(self, before, array, after, records, obj, buf, indent, path):
        """Fixed runs before and after an array that is usually empty (a partition's aborted transactions):
        when it is empty, or null where allowed, its count joins both runs in one struct call, and so does
        the size of the ``records`` field that may follow when they are a Send (a broker's Fetch)."""
        src = self.src
        value = src.var("x")
        src.emit(indent, f"{value} = {obj}.{array.name}")
        count_format, empty, null = ("B", 1, 0) if array.compact(self.flexible) else ("i", 0, -1)
        if array.is_nullable(self.version):
            fused, count = f"not {value}", f"{null} if {value} is None else {empty}"
        else:                                # None goes the general way, which refuses it
            fused, count = f"{value} is not None and not {value}", str(empty)
        fmt = ">" + self._run_format(before) + count_format + self._run_format(after)
        args = self._run_args(before, obj) + [count] + self._run_args(after, obj)
        if records is None:
            src.emit(indent, f"if {fused}:")
        else:
            send, size = src.var("x"), src.var("rs")
            src.emit(indent, f"{send} = {obj}.{records.name}")
            src.emit(indent, f"if {fused} and hasattr({send}, 'write_to'):")
            src.emit(indent + 1, f"{size} = {send}.size")
            pack = src.constant("pack", _struct_of(fmt + "i").pack)
            src.emit(indent + 1, f"{buf} += {pack}({', '.join(args + [size])})")
            src.emit(indent + 1, f"_splice((len({buf}), {send}))")
            src.emit(indent + 1, f"spliced += {size}")
            src.emit(indent, f"elif {fused}:")
        src.emit(indent + 1, f"{buf} += {src.constant('pack', _struct_of(fmt).pack)}({', '.join(args)})")
        if records is not None:
            self.field(records, send, buf, indent + 1, path)
        src.emit(indent, "else:")
        self._run(before, obj, buf, indent + 1, path)
        self.field(array, value, buf, indent + 1, path)
        if after:
            self._run(after, obj, buf, indent + 1, path)
        if records is not None:
            self.field(records, send, buf, indent + 1, path)

    def _not_default(self, field, value):
        """Kafka writes a tagged field only when it differs from its default."""
        default = field.default()
        if field.is_array:
            return f"{value} is None or {value}" if default == [] else f"{value} is not None"
        if field.struct is not None:
            if default is None:
                return f"{value} is not None"
            checks = [f"{value} is None", f"{value}.unknown_tags"]
            for inner in field.struct.fields:
                if inner.present(self.version):
                    checks.append(f"{value}.{inner.name} != {_literal(self.src, inner.default())}")
            shared = field.struct.cls._default
            if shared is None:
                return " or ".join(checks)
            return f"{value} is not {self.src.constant('default', shared)} and ({' or '.join(checks)})"
        return f"{value} != {_literal(self.src, default)}"

    def _length(self, field, length, buf, indent, wide):
        src = self.src
        if field.compact(self.flexible):
            size = src.var("sz")
            src.emit(indent, f"{size} = {length} + 1")
            src.emit(indent, f"if {size} < 128: {buf}.append({size})")
            src.emit(indent, f"elif {size} < 16384: {buf} += _pack_varint2({size} & 127 | 128, {size} >> 7)")
            src.emit(indent, f"elif {size} < 2097152: "
                             f"{buf} += _pack_varint3({size} & 127 | 128, {size} >> 7 & 127 | 128, {size} >> 14)")
            src.emit(indent, f"else: {buf} += _enc_uvarint({size})")
        else:
            src.emit(indent, f"{buf} += {src.constant('pack', _struct_of('>i' if wide else '>h').pack)}({length})")

    def _null(self, field, value, buf, indent):
        """Emit the null case of a nullable field, then ``else:``; returns the else-body indent."""
        self.src.emit(indent, f"if {value} is None:")
        return self._null_body(field, buf, indent)

    def _null_body(self, field, buf, indent, last=True):
        src = self.src
        if field.is_nullable(self.version):
            if field.compact(self.flexible):
                src.emit(indent + 1, f"{buf}.append(0)")
            else:
                minus_one = b"\xff" * (2 if field.element == "string" and not field.is_array else 4)
                src.emit(indent + 1, f"{buf} += {minus_one!r}")
        else:
            src.emit(indent + 1, "raise _Bad('None in a non-nullable field')")
        if last:
            src.emit(indent, "else:")
        return indent + 1

    def field(self, field, expr, buf, indent, path):
        src = self.src
        here = path + field.name
        self._where(indent, here)
        value = src.var("x")
        src.emit(indent, f"{value} = {expr}")
        if field.is_array:
            empty = b"\x01" if field.compact(self.flexible) else b"\x00" * 4
            src.emit(indent, f"if {value} is None:")
            self._null_body(field, buf, indent, last=False)
            src.emit(indent, f"elif not {value}: {buf} += {empty!r}")
            src.emit(indent, "else:")
            body = indent + 1
            self._length(field, f"len({value})", buf, body, wide=True)
            element = field.element
            if element in FIXED_FORMATS and element != "uuid":
                src.emit(body, f"{buf} += _pack('>' + str(len({value})) + {FIXED_FORMATS[element]!r}, *{value})")
            else:
                item = src.var("item")
                src.emit(body, f"for {item} in {value}:")
                if field.struct is not None:
                    self.struct(field.struct, item, buf, body + 1, here + "[].")
                else:
                    self.scalar(element, field, item, buf, body + 1)
            return
        if field.struct is not None:
            if field.is_nullable(self.version):
                src.emit(indent, f"if {value} is None: {buf} += b'\\xff'")
                src.emit(indent, "else:")
                src.emit(indent + 1, f"{buf} += b'\\x01'")
                self.struct(field.struct, value, buf, indent + 1, here + ".")
            else:
                self.struct(field.struct, value, buf, indent, here + ".")
            return
        self.scalar(field.type, field, value, buf, indent)

    def scalar(self, kind, field, value, buf, indent):
        src = self.src
        if kind in FIXED_FORMATS:
            pack = src.constant("pack", _struct_of(">" + FIXED_FORMATS[kind]).pack)
            src.emit(indent, f"{buf} += {pack}({value}.bytes)" if kind == "uuid" else f"{buf} += {pack}({value})")
            return
        if kind == "records":
            # the two common cases inline: small bytes (a client's batch), a Send (a broker's records)
            src.emit(indent, f"if {value} is None:")
            self._null_body(field, buf, indent, last=False)
            body = indent
            size = src.var("rs")
            src.emit(body, f"elif type({value}) is bytes and len({value}) <= {INLINE_RECORDS_MAX}:")
            self._length(field, f"len({value})", buf, body + 1, wide=True)
            src.emit(body + 1, f"{buf} += {value}")
            src.emit(body, f"elif hasattr({value}, 'write_to'):")
            src.emit(body + 1, f"{size} = {value}.size")
            self._length(field, size, buf, body + 1, wide=True)
            src.emit(body + 1, f"_splice((len({buf}), {value}))")
            src.emit(body + 1, f"spliced += {size}")
            src.emit(body, "else:")
            src.emit(body + 1, f"spliced += _put_records({buf}, splices, {value}, {field.compact(self.flexible)})")
            return
        body = self._null(field, value, buf, indent)
        raw = src.var("b")
        if kind == "string":
            src.emit(body, f"{raw} = {value}.encode('utf-8')")
            src.emit(body, f"if len({raw}) > 32767: "
                           f"raise _Bad('string of ' + str(len({raw})) + ' UTF-8 bytes (at most 32767)')")
        else:
            src.emit(body, f"if not isinstance({value}, _BYTES_LIKE): raise _Bad('bytes-like value expected')")
            src.emit(body, f"{raw} = memoryview({value}).cast('B')")
        self._length(field, f"len({raw})", buf, body, wide=kind != "string")
        src.emit(body, f"{buf} += {raw}")


@functools.lru_cache(maxsize=None)
def _struct_of(fmt):
    return struct.Struct(fmt)


def define_class(struct, api_key=None):
    """Create the Python class of a schema struct (every field of every version, ``unknown_tags`` last)."""
    src = _Source(struct.name, 0)
    names = [f.name for f in struct.fields]
    params, body = [], []
    for field in struct.fields:
        default = field.default()
        if isinstance(default, list) or (field.struct is not None and default is not None):
            params.append(f"{field.name}=_MISSING")
            body.append(f"    self.{field.name} = {_default_expr(src, field)} "
                        f"if {field.name} is _MISSING else {field.name}")
        else:
            params.append(f"{field.name}={_literal(src, default)}")
            body.append(f"    self.{field.name} = {field.name}")
    src.lines = [f"def __init__(self, {', '.join(params + ['unknown_tags=None'])}):", *body,
                 "    self.unknown_tags = unknown_tags"]
    init = src.compile("__init__")
    namespace = {"__slots__": tuple(names) + ("unknown_tags",), "__init__": init, "__eq__": _eq,
                 "__repr__": _repr, "__hash__": None, "_fields": tuple(names),
                 "__doc__": f"Kafka's {struct.name}: fields {', '.join(names)} (snake_case of the schema's names); "
                            "``unknown_tags`` maps tagged fields this schema does not know to their raw bytes."}
    if api_key is not None:
        namespace["API_KEY"] = api_key
        namespace["KIND"] = "Request" if struct.kind == "request" else "Response"
    cls = struct.cls = type(struct.name, (), namespace)
    cls._base = cls
    cls._default = None
    if api_key is None and all(f.struct is None and not f.is_array for f in struct.fields):
        # A struct of scalars gets one shared, read-only default instance: an unset tagged struct
        # (e.g. FetchResponse's diverging_epoch) then costs no allocation and an identity test to skip.
        frozen = type(struct.name, (cls,), {"__slots__": (), "__setattr__": _read_only, "__delattr__": _read_only})
        shared = object.__new__(frozen)
        for field in struct.fields:
            object.__setattr__(shared, field.name, field.default())
        object.__setattr__(shared, "unknown_tags", None)
        cls._default = shared
    return cls


def _read_only(self, name, value=None):
    raise InvalidArgumentError(f"this {type(self).__name__} is the shared default and cannot change: "
                               f"assign a new {type(self).__name__}(...) to the field instead")


def _eq(self, other):
    if getattr(type(other), "_base", None) is not self._base:
        return NotImplemented
    return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)


def _repr(self):
    return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self._fields)})"


_DEFINING = threading.Lock()


def build_classes(message):
    with _DEFINING:                  # classes are created once, even when two threads ask first
        return _build_classes(message)


def _build_classes(message):
    for inner in message.structs():
        if inner.cls is None:
            define_class(inner)
    cls = message.cls or define_class(message, message.api_key)
    for inner in message.structs():
        setattr(cls, inner.name, inner.cls)
    return cls


def decoder(message, version):
    """``decode(data, pos) -> (message object, pos)`` for one version; ``data`` a memoryview of bytes.

    The copy that tracks the field being read, to name it in the CorruptMessageError, is generated and
    run (on the same bytes) only after a failure."""
    build_classes(message)
    located = []                     # the tracking copy, compiled at the first failure

    def locate(data, start, error):
        if not located:
            located.append(_decoder_source(message, version, track=True))
        try:
            located[0](data, start)
        except CorruptMessageError as named:
            return named
        return _corrupt(message.name, version, None, start, error)

    return _decoder_source(message, version, track=False, locate=locate)


def _decoder_source(message, version, track, locate=None):
    src = _Source(message.name, version)
    src.emit(0, "def decode(data, pos):")
    src.emit(1, "end = len(data)")
    src.emit(1, "f = None" if track else "start = pos")
    src.emit(1, "try:")
    _Decoder(src, version, message.is_flexible(version), track).struct(message, "obj", 2, "")
    src.emit(1, "except _CAUGHT as e:")
    if track:
        src.emit(2, f"raise _corrupt({message.name!r}, {version}, f, pos, e) from None")
    else:
        src.emit(2, "raise _locate(data, start, e) from None")
    src.emit(1, "return obj, pos")
    src.globals["_CAUGHT"] = (_Bad, struct.error, IndexError, ValueError, TypeError)
    src.globals["_corrupt"] = _corrupt
    src.globals["_locate"] = locate
    return src.compile("decode")


def encoder(message, version):
    """``encode(obj, buf, splices)``: appends the body to ``buf``; record Sends (and large records) are
    appended to ``splices`` as (offset in ``buf``, send) instead, and their bytes counted in the return value.

    The copy that tracks the field being written, to name it in the InvalidMessageError, is generated
    and run only after a failure."""
    build_classes(message)
    located = []                     # the tracking copy, compiled at the first failure

    def locate(obj, error):
        if not located:
            located.append(_encoder_source(message, version, track=True))
        try:
            located[0](obj, bytearray(), [])
        except InvalidMessageError as named:
            return named
        return _invalid(message.name, version, None, error)

    return _encoder_source(message, version, track=False, locate=locate)


def _encoder_source(message, version, track, locate=None):
    src = _Source(message.name, version)
    src.emit(0, "def encode(obj, buf, splices):")
    src.emit(1, "f = None")
    src.emit(1, "_splice = splices.append")
    src.emit(1, "spliced = 0")
    src.emit(1, "try:")
    _Encoder(src, version, message.is_flexible(version), track).struct(message, "obj", "buf", 2, "")
    src.emit(2, "return spliced")
    src.emit(1, "except _CAUGHT as e:")
    if track:
        src.emit(2, f"raise _invalid({message.name!r}, {version}, f, e) from None")
    else:
        src.emit(2, "raise _locate(obj, e) from None")
    src.globals["_CAUGHT"] = (_Bad, struct.error, TypeError, AttributeError, ValueError, OverflowError)
    src.globals["_invalid"] = _invalid
    src.globals["_locate"] = locate
    return src.compile("encode")


def _corrupt(name, version, field, pos, error):
    if isinstance(error, IndexError):
        reason = "message ends early"
    elif isinstance(error, struct.error):
        reason = f"message ends early ({error})"
    elif isinstance(error, UnicodeDecodeError):
        reason = f"invalid UTF-8 ({error.reason})"
    else:
        reason = str(error)
    return CorruptMessageError(name, version, field, pos, reason)


def _invalid(name, version, field, error):
    reason = str(error) if isinstance(error, _Bad) else f"{type(error).__name__}: {error}"
    return InvalidMessageError(name, version, field, reason)
