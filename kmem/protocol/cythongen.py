"""Source generation for the compiled codecs of the hot APIs: ``python -m kmem.protocol.cythongen`` writes
``kmem/_wire_codecs.pxi`` (checked in; ``tests/test_protocol_compiled.py`` checks that regenerating it gives
the same file) from the same Kafka JSON schemas ``codegen`` reads.

The compiled code decodes into, and encodes from, the classes ``codegen`` defines, byte for byte as the
generated Python does. It takes only the common shape: anything else (a short or malformed input, a value of
an unexpected type) raises ``WireFallback`` and ``kmem.protocol.api`` runs the Python codec, the reference,
which names the fault or handles the unusual value.
"""
import pathlib
import sys

from .codegen import INLINE_RECORDS_MAX
from .schema import ZERO_UUID

# the request header is read by hand (``_wire.pxi``); these are the APIs every busy broker serves, and those a
# transactional producer sends in every transaction (a consume-transform-produce loop's offsets included)
COMPILED_APIS = ("Produce", "Fetch", "Heartbeat", "ConsumerGroupHeartbeat", "AddPartitionsToTxn", "EndTxn",
                 "AddOffsetsToTxn", "TxnOffsetCommit")
TARGET = pathlib.Path(__file__).resolve().parent.parent / "_wire_codecs.pxi"

_READ = {"int8": "_rd_i8", "int16": "_rd_i16", "uint16": "_rd_u16", "int32": "_rd_i32", "int64": "_rd_i64",
         "float64": "_rd_f64"}
_WRITE = {"int8": "_put_i8", "int16": "_put_i16", "uint16": "_put_u16", "int32": "_put_i32", "int64": "_put_i64",
          "float64": "_put_f64", "bool": "_put_bool", "uuid": "_put_uuid"}
_SIZE = {"int8": 1, "int16": 2, "uint16": 2, "int32": 4, "int64": 8, "float64": 8}


class _Module:
    """The generated text: one function per distinct (struct layout, direction), shared across versions."""

    def __init__(self):
        self.functions = {}          # body text -> function name
        self.chunks = []
        self.structs = {}            # (message, struct) -> index into the bound classes
        self.entries = []            # (message, version, decode function, encode function)

    def struct_index(self, message, struct):
        return self.structs.setdefault((message.name, struct.name), len(self.structs))

    def function(self, prefix, signature, body):
        text = "\n".join(body)
        name = self.functions.get((prefix, text))
        if name is None:
            name = self.functions[(prefix, text)] = f"{prefix}{len(self.functions)}"
            self.chunks.append(f"cdef {signature.format(name=name)}:\n{text}\n")
        return name


class _Body:
    def __init__(self):
        self.lines, self.counter, self.typed = [], 0, {}

    def var(self, prefix, ctype=None):
        self.counter += 1
        name = f"{prefix}{self.counter}"
        if ctype:
            self.typed[name] = ctype
        return name

    def emit(self, indent, line):
        self.lines.append("    " * indent + line)

    def text(self):
        declared = [f"    cdef {ctype} {name}" for name, ctype in self.typed.items()]
        return declared + self.lines


def _literal(module, message, field, value):
    if value is ZERO_UUID:
        return "_ZERO_UUID"
    if value == [] and isinstance(value, list):
        return "[]"
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return repr(value)
    # a struct's default: its shared read-only instance, else a new one
    index = module.struct_index(message, field.struct)
    return f"_wire_default({index})"


def _default(module, message, field):
    if field.struct is not None and not field.is_array and field.default_text != "null":
        return f"_wire_default({module.struct_index(message, field.struct)})"
    if field.is_array:
        return "None" if field.default_text == "null" else "[]"
    return _literal(module, message, field, _scalar_default(field))


def _scalar_default(field):
    """``Field.default()`` without the classes (a struct's default is never asked for here)."""
    return None if field.struct is not None else field.default()


# ----------------------------------------------------------------------------------------------- decode

def _decode_struct(module, message, struct, version, flexible):
    body = _Body()
    fields = [f for f in struct.fields if f.present(version)]
    tagged = [f for f in fields if flexible and f.is_tagged(version)]
    values = {}
    for field in fields:
        if field not in tagged:
            values[field.name] = _decode_field(module, message, body, field, version, flexible, 1)
    unknown = "None"
    if flexible:
        unknown = body.var("ut")
        body.emit(1, f"{unknown} = None")
        for field in tagged:
            values[field.name] = name = body.var("v")
            body.emit(1, f"{name} = {_default(module, message, field)}")
        count, tag, size, stop = (body.var("n", "int64_t"), body.var("tag", "int64_t"), body.var("sz", "int64_t"),
                                  body.var("te", "Py_ssize_t"))
        body.emit(1, f"{count} = _rd_uvarint(r)")
        body.emit(1, f"for {body.var('i', 'int64_t')} in range({count}):")
        body.emit(2, f"{tag} = _rd_uvarint(r)")
        body.emit(2, f"{size} = _rd_uvarint(r)")
        body.emit(2, f"if {size} > r.end - r.pos: _wire_fallback()")
        body.emit(2, f"{stop} = r.pos + {size}")
        keyword = "if"
        for field in tagged:
            body.emit(2, f"{keyword} {tag} == {field.tag}:")
            keyword = "elif"
            decoded = _decode_field(module, message, body, field, version, flexible, 3)
            body.emit(3, f"{values[field.name]} = {decoded}")
            body.emit(3, f"if r.pos != {stop}: _wire_fallback()")
        inner = 2
        if tagged:
            body.emit(2, "else:")
            inner = 3
        body.emit(inner, f"if {unknown} is None: {unknown} = {{}}")
        body.emit(inner, f"{unknown}[{tag}] = PyBytes_FromStringAndSize(<const char*>r.p + r.pos, {size})")
        body.emit(inner, f"r.pos = {stop}")
    args = [values.get(f.name) or _default(module, message, f) for f in struct.fields]
    body.emit(1, f"return _wire_class({module.struct_index(message, struct)})({', '.join(args + [unknown])})")
    return module.function("_wd", "object {name}(_Rd* r, object view)", body.text())


def _decode_length(body, field, flexible, indent, wide):
    target = body.var("n", "int64_t")
    if field.compact(flexible):
        body.emit(indent, f"{target} = _rd_uvarint(r) - 1")
    else:
        body.emit(indent, f"{target} = {'_rd_i32' if wide else '_rd_i16'}(r)")
    return target


def _decode_null(body, field, version, length, target, indent):
    """A negative length: -1 is None where the field is nullable, anything else the reference's refusal.
    Returns the indent of the code for a length of 0 or more."""
    if not field.is_nullable(version):
        body.emit(indent, f"if {length} < 0: _wire_fallback()")
        return indent
    body.emit(indent, f"if {length} == -1: {target} = None")
    body.emit(indent, f"elif {length} < 0: _wire_fallback()")
    body.emit(indent, "else:")
    return indent + 1


def _decode_field(module, message, body, field, version, flexible, indent):
    target = body.var("v")
    if field.is_array:
        count = _decode_length(body, field, flexible, indent, wide=True)
        inner = _decode_null(body, field, version, count, target, indent)
        body.emit(inner, f"if {count} > r.end - r.pos: _wire_fallback()")
        items = body.var("items")
        body.emit(inner, f"{items} = []")
        body.emit(inner, f"for {body.var('i', 'int64_t')} in range({count}):")
        if field.struct is not None:
            function = _decode_struct(module, message, field.struct, version, flexible)
            body.emit(inner + 1, f"{items}.append({function}(r, view))")
        else:
            item = _decode_scalar(body, field.element, field, version, flexible, inner + 1)
            body.emit(inner + 1, f"{items}.append({item})")
        body.emit(inner, f"{target} = {items}")
        return target
    if field.struct is not None:
        function = _decode_struct(module, message, field.struct, version, flexible)
        if field.is_nullable(version):
            body.emit(indent, f"{target} = None if _rd_u8(r) > 127 else {function}(r, view)")
        else:
            body.emit(indent, f"{target} = {function}(r, view)")
        return target
    return _decode_scalar(body, field.type, field, version, flexible, indent, target)


def _decode_scalar(body, kind, field, version, flexible, indent, target=None):
    target = target or body.var("v")
    if kind in _READ:
        body.emit(indent, f"{target} = {_READ[kind]}(r)")
        return target
    if kind == "bool":
        body.emit(indent, f"{target} = _rd_u8(r) != 0")
        return target
    if kind == "uuid":
        body.emit(indent, f"{target} = _rd_uuid(r)")
        return target
    length = _decode_length(body, field, flexible, indent, wide=kind != "string")
    inner = _decode_null(body, field, version, length, target, indent)
    if kind == "string" and field.compact(flexible):
        body.emit(inner, f"if {length} > 32767: _wire_fallback()")
    body.emit(inner, f"if {length} > r.end - r.pos: _wire_fallback()")
    if kind == "string":
        body.emit(inner, f"{target} = PyUnicode_DecodeUTF8(<const char*>r.p + r.pos, {length}, NULL)")
    elif kind == "bytes":
        body.emit(inner, f"{target} = PyBytes_FromStringAndSize(<const char*>r.p + r.pos, {length})")
    else:                                                       # records: a view of the input, never a copy
        body.emit(inner, f"{target} = view[r.pos:r.pos + {length}]")
    body.emit(inner, f"r.pos += {length}")
    return target


# ----------------------------------------------------------------------------------------------- encode

def _encode_struct(module, message, struct, version, flexible):
    body = _Body()
    fields = [f for f in struct.fields if f.present(version)]
    tagged = [f for f in fields if flexible and f.is_tagged(version)]
    for field in fields:
        if field not in tagged:
            _encode_field(module, message, body, field, f"o.{field.name}", "w", version, flexible, 1)
    if flexible:
        tags = body.var("tags")
        body.emit(1, f"{tags} = o.unknown_tags")
        for field in tagged:
            value = body.var("t")
            body.emit(1, f"{value} = o.{field.name}")
            body.emit(1, f"if {_not_default(module, message, field, value, version)}:")
            out = body.var("tw")
            body.emit(2, f"{out} = _WireOut(0)")
            _encode_field(module, message, body, field, value, out, version, flexible, 2)
            body.emit(2, f"{tags} = dict({tags} or ())")
            body.emit(2, f"{tags}[{field.tag}] = {out}.tagged_value()")
        body.emit(1, f"if {tags}: _put_tagged(w, {tags})")
        body.emit(1, "else: _put_u8(w, 0)")
    body.emit(1, "return 0")
    return module.function("_we", "int {name}(_WireOut w, object o) except -1", body.text())


def _not_default(module, message, field, value, version):
    """Kafka writes a tagged field only when it differs from its default (as ``codegen`` decides)."""
    if field.is_array:
        return f"{value} is None or {value}" if field.default_text != "null" else f"{value} is not None"
    if field.struct is not None:
        if field.default_text == "null":
            return f"{value} is not None"
        index = module.struct_index(message, field.struct)
        checks = [f"{value} is None", f"{value}.unknown_tags"]
        for inner in field.struct.fields:
            if inner.present(version):
                default = _default(module, message, inner)
                checks.append(f"{value}.{inner.name} != {default}")
        return f"_wire_differs({index}, {value}) and ({' or '.join(checks)})"
    return f"{value} != {_literal(module, message, field, _scalar_default(field))}"


def _encode_length(body, field, flexible, length, out, indent, wide):
    if field.compact(flexible):
        body.emit(indent, f"_put_uvarint({out}, {length} + 1)")
    else:
        body.emit(indent, f"{'_put_i32' if wide else '_put_i16'}({out}, {length})")


def _encode_null(body, field, version, flexible, out, indent, wide):
    """The bytes of None in a nullable field; None elsewhere is the reference's refusal."""
    if not field.is_nullable(version):
        body.emit(indent, "_wire_fallback()")
    elif field.compact(flexible):
        body.emit(indent, f"_put_u8({out}, 0)")
    else:
        body.emit(indent, f"{'_put_i32' if wide else '_put_i16'}({out}, -1)")


def _encode_field(module, message, body, field, expr, out, version, flexible, indent):
    value = body.var("x")
    body.emit(indent, f"{value} = {expr}")
    if field.is_array:
        body.emit(indent, f"if {value} is None:")
        _encode_null(body, field, version, flexible, out, indent + 1, wide=True)
        body.emit(indent, f"elif type({value}) is not list: _wire_fallback()")
        body.emit(indent, "else:")
        _encode_length(body, field, flexible, f"len(<list>{value})", out, indent + 1, wide=True)
        item = body.var("item")
        body.emit(indent + 1, f"for {item} in <list>{value}:")
        if field.struct is not None:
            function = _encode_struct(module, message, field.struct, version, flexible)
            body.emit(indent + 2, f"{function}({out}, {item})")
        else:
            _encode_scalar(body, field.element, field, item, out, version, flexible, indent + 2)
        return
    if field.struct is not None:
        function = _encode_struct(module, message, field.struct, version, flexible)
        if field.is_nullable(version):
            body.emit(indent, f"if {value} is None: _put_u8({out}, 0xff)")
            body.emit(indent, "else:")
            body.emit(indent + 1, f"_put_u8({out}, 1)")
            body.emit(indent + 1, f"{function}({out}, {value})")
        else:
            body.emit(indent, f"{function}({out}, {value})")
        return
    _encode_scalar(body, field.type, field, value, out, version, flexible, indent)


def _encode_scalar(body, kind, field, value, out, version, flexible, indent):
    if kind in _WRITE:
        body.emit(indent, f"{_WRITE[kind]}({out}, {value})")
        return
    body.emit(indent, f"if {value} is None:")
    _encode_null(body, field, version, flexible, out, indent + 1, wide=kind != "string")
    if kind == "records":
        # small bytes (a client's batch) inline, a Send (a broker's records) spliced in; anything else
        # (a large or other bytes-like value) is the reference's
        body.emit(indent, f"elif type({value}) is bytes and len(<bytes>{value}) <= {INLINE_RECORDS_MAX}:")
        _encode_length(body, field, flexible, f"len(<bytes>{value})", out, indent + 1, wide=True)
        body.emit(indent + 1, f"_put_raw({out}, <bytes>{value})")
        body.emit(indent, f"elif hasattr({value}, 'write_to'):")
        size = body.var("rs")
        body.emit(indent + 1, f"{size} = {value}.size")
        _encode_length(body, field, flexible, size, out, indent + 1, wide=True)
        body.emit(indent + 1, f"{out}.splice({value}, {size})")
        body.emit(indent, "else: _wire_fallback()")
        return
    exact = "str" if kind == "string" else "bytes"
    body.emit(indent, f"elif type({value}) is not {exact}: _wire_fallback()")
    body.emit(indent, "else:")
    raw = body.var("b")
    if kind == "string":
        body.emit(indent + 1, f"{raw} = PyUnicode_AsUTF8String({value})")
        body.emit(indent + 1, f"if len(<bytes>{raw}) > 32767: _wire_fallback()")
    else:
        body.emit(indent + 1, f"{raw} = {value}")
    _encode_length(body, field, flexible, f"len(<bytes>{raw})", out, indent + 1, wide=kind != "string")
    body.emit(indent + 1, f"_put_raw({out}, <bytes>{raw})")


# ----------------------------------------------------------------------------------------------- module

def generate():
    from .api import SUPPORTED_VERSIONS, ApiKey, message as load_message

    module = _Module()
    for name in COMPILED_APIS:
        api_key = next(key for key in ApiKey if key.message_name == name)
        low, high = SUPPORTED_VERSIONS[api_key]
        for kind in ("Request", "Response"):
            message = load_message(api_key, kind)
            for version in range(low, high + 1):
                flexible = message.is_flexible(version)
                module.entries.append((message.name, version,
                                       _decode_struct(module, message, message, version, flexible),
                                       _encode_struct(module, message, message, version, flexible)))
    lines = ["# Generated by `python -m kmem.protocol.cythongen` from Kafka's JSON message schemas: do not edit.",
             "# The compiled codecs of the hot APIs (see kmem/protocol/cythongen.py); helpers in _wire.pxi.", ""]
    lines += module.chunks
    lines.append("# the classes each compiled function builds or reads, in index order: (message, struct)")
    lines.append("WIRE_STRUCTS = (")
    lines += [f"    {key!r}," for key in module.structs]
    lines.append(")")
    lines.append("")
    lines.append("# (message, version) -> the index of its functions in _WIRE_DECODE and _WIRE_ENCODE")
    lines.append("WIRE_CODECS = {")
    lines += [f"    ({name!r}, {version}): {index}," for index, (name, version, _, _) in enumerate(module.entries)]
    lines.append("}")
    lines.append(f"cdef _wire_decoder _WIRE_DECODE[{len(module.entries)}]")
    lines.append(f"cdef _wire_encoder _WIRE_ENCODE[{len(module.entries)}]")
    for index, (_, _, decode, encode) in enumerate(module.entries):
        lines.append(f"_WIRE_DECODE[{index}] = {decode}")
        lines.append(f"_WIRE_ENCODE[{index}] = {encode}")
    lines.append(f"cdef Py_ssize_t _WIRE_COUNT = {len(module.entries)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET
    target.write_text(generate(), encoding="utf-8")
