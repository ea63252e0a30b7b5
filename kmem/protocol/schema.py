"""Kafka's JSON message schemas, read from the installed kafka-python package (which ships them, Apache
licensed, under ``kafka/protocol/schemas/resources``), turned into a small field model for the code
generator. Only the facts are used: names, types, version ranges, nullability, tags, defaults."""
import functools
import importlib.util
import json
import pathlib
import re
import uuid

from ..errors import KmemError
from .bundled_schemas import SCHEMAS

ALL_VERSIONS = (0, 32767)
NO_VERSIONS = (1, 0)                  # an empty range

FIXED_FORMATS = {"int8": "b", "int16": "h", "uint16": "H", "int32": "i", "int64": "q", "float64": "d",
                 "bool": "?", "uuid": "16s"}
ZERO_UUID = uuid.UUID(int=0)


def parse_versions(text):
    """'0+', '3', '1-4', 'none' -> (low, high); an empty range is (1, 0)."""
    if text is None:
        return None
    text = str(text).strip()
    if text in ("", "none"):
        return NO_VERSIONS
    if text.endswith("+"):
        return int(text[:-1]), ALL_VERSIONS[1]
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def in_range(version, versions):
    return versions is not None and versions[0] <= version <= versions[1]


def snake_case(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Field:
    """One field of a message or of a struct inside it."""

    def __init__(self, spec, common_structs):
        self.json_name = spec["name"]
        self.name = snake_case(self.json_name)
        self.type = spec["type"].strip()
        self.versions = parse_versions(spec.get("versions"))
        self.nullable = parse_versions(spec.get("nullableVersions"))
        self.tag = spec.get("tag")
        self.tagged = parse_versions(spec.get("taggedVersions"))
        # RequestHeader.ClientId keeps its int16 length in flexible versions ("flexibleVersions": "none")
        self.flexible = parse_versions(spec.get("flexibleVersions"))
        self.default_text = spec.get("default")
        self.is_array = self.type.startswith("[]")
        self.element = self.type[2:] if self.is_array else self.type
        self.struct = None
        if self.element not in FIXED_FORMATS and self.element not in ("string", "bytes", "records"):
            fields = spec.get("fields")
            if fields is not None:
                self.struct = Struct(self.element, fields, common_structs)
            else:
                # a common struct is one type however many fields use it (AddPartitionsToTxnTopic: two)
                common = common_structs.get(self.element)
                if common is None:
                    raise KmemError(f"schema: struct type {self.element} of field {self.json_name} is not defined")
                if not isinstance(common, Struct):
                    common = common_structs[self.element] = Struct(self.element, common, common_structs)
                self.struct = common

    def present(self, version):
        return in_range(version, self.versions)

    def is_tagged(self, version):
        return self.tag is not None and in_range(version, self.tagged)

    def is_nullable(self, version):
        return in_range(version, self.nullable)

    def compact(self, flexible):
        return flexible and self.flexible != NO_VERSIONS

    def default(self):
        """The default value as Kafka's generated classes define it (a new list or struct, except the
        shared read-only default of a struct of scalars)."""
        text = self.default_text
        if self.is_array:
            return None if text == "null" else []
        if self.struct is not None:
            if text == "null":
                return None
            return self.struct.cls._default or self.struct.cls()
        kind = self.type
        if kind == "bool":
            return text is True or str(text).lower() == "true"
        if kind in ("int8", "int16", "uint16", "int32", "int64"):
            if text in (None, ""):
                return 0
            return int(text, 16) if str(text).lower().startswith("0x") else int(text)
        if kind == "float64":
            return float(text or 0.0)
        if kind == "uuid":
            return ZERO_UUID
        if kind == "string":
            return None if text == "null" else (text or "")
        if kind == "bytes":
            return None if text == "null" else b""
        return None                                                     # records: null by default


class Struct:
    """A message, or a struct type inside one; ``cls`` is its Python class once generated."""

    def __init__(self, name, fields, common_structs):
        self.name = name
        self.fields = [Field(spec, common_structs) for spec in fields]
        self.cls = None

    def structs(self):
        """Every struct type below this one, innermost first, each once."""
        seen = {}
        for field in self.fields:
            if field.struct is not None:
                for inner in field.struct.structs():
                    seen.setdefault(inner.name, inner)
                seen.setdefault(field.struct.name, field.struct)
        return list(seen.values())


class Message(Struct):
    def __init__(self, spec):
        common = {s["name"]: s["fields"] for s in spec.get("commonStructs", [])}
        super().__init__(spec["name"], spec.get("fields", []), common)
        self.api_key = spec.get("apiKey")
        self.kind = spec["type"]
        self.valid_versions = parse_versions(spec.get("validVersions"))
        self.flexible_versions = parse_versions(spec.get("flexibleVersions")) or NO_VERSIONS

    def is_flexible(self, version):
        # Kafka: any version from the first flexible one on, even past the valid range (header choice)
        low, high = self.flexible_versions
        return low <= high and version >= low


def schema_dir():
    spec = importlib.util.find_spec("kafka")
    if spec is None or not spec.submodule_search_locations:
        raise KmemError("kmem.protocol needs kafka-python >= 3.0 (it reads Kafka's JSON schemas from it)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "protocol" / "schemas" / "resources"
    if not path.is_dir():
        raise KmemError(f"kafka-python at {path.parent.parent.parent} has no JSON schemas: kafka-python >= 3.0 needed")
    return path


_COMMENT = re.compile(r"^\s*//.*$", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def load(name):
    """The parsed schema of message ``name`` (e.g. 'FetchRequest'), read once: kmem's own table
    (``kmem.protocol.bundled_schemas``) for the messages kafka-python does not ship."""
    if name in SCHEMAS:
        return Message(SCHEMAS[name])
    text = (schema_dir() / f"{name}.json").read_text(encoding="utf-8")
    return Message(json.loads(_COMMENT.sub("", text)))
