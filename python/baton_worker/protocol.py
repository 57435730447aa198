"""Wire codec for the engine <-> worker protocol, driven by protocol/schema.json.

The schema file is the single source of truth. scripts/gen-protocol.mjs turns it
into wire_types.py: the message and struct dataclasses (re-exported here, so
`from baton_worker.protocol import Step` keeps working) and the field tables this
codec runs from. The package therefore needs no schema file at run time, and the
dataclasses and the codec cannot disagree.

Encoding rules (see the schema's "about"):
- a message is a MessagePack array [tag, field_1, ...]; a struct is [field_1, ...];
- i32[] / f32[] / u8[] are raw little-endian bytes (MessagePack bin); decoding
  gives read-only numpy views over the received bytes (np.frombuffer, no copy);
- str[] is an array of str; any is any plain MessagePack value (maps with str keys,
  no extension types), passed through as decoded;
- canonical numbers: an integer-valued number in [-2^31, 2^32) is packed as the
  smallest MessagePack int, anything else as float64 (inside any too). JS msgpackr
  does exactly that, so both languages produce identical bytes for identical messages.

Anything malformed raises ProtocolError whose message starts with the field
path, e.g. "Step.added[0].sampling.top_k: expected int, got str".
Never pickle: only msgpack primitives are ever produced or accepted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from . import wire_types
from .wire_types import *  # noqa: F403  (every struct and message dataclass, PROTOCOL_VERSION)
from .wire_types import MESSAGE_CLASSES, PROTOCOL_VERSION, STRUCT_CLASSES


class ProtocolError(Exception):
    """A message that does not match the schema; `field` is where decoding stopped."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# ---------------------------------------------------------------- schema

_ARRAY_DTYPES = {"i32[]": np.dtype("<i4"), "f32[]": np.dtype("<f4"), "u8[]": np.dtype("u1")}


@dataclass(frozen=True)
class WireType:
    kind: str  # "int" | "float" | "str" | "bool" | "any" | "i32[]" | "f32[]" | "u8[]" | "int[]" | "str[]" | "struct" | "struct[]"
    nullable: bool
    struct: str | None = None


@dataclass(frozen=True)
class MessageSpec:
    name: str
    tag: str
    sender: str
    fields: list[tuple[str, WireType]]


@dataclass(frozen=True)
class Schema:
    protocol_version: int
    structs: dict[str, list[tuple[str, WireType]]]
    messages: dict[str, MessageSpec]
    by_tag: dict[str, MessageSpec]


def schema_from_tables(protocol_version: int, struct_fields: dict, message_specs: dict) -> Schema:
    """A Schema from tables shaped like wire_types.STRUCT_FIELDS / MESSAGE_SPECS."""

    def fields(specs: tuple) -> list[tuple[str, WireType]]:
        return [(name, WireType(kind, nullable, struct)) for name, kind, nullable, struct in specs]

    structs = {name: fields(specs) for name, specs in struct_fields.items()}
    messages = {name: MessageSpec(name, tag, sender, fields(specs)) for name, (tag, sender, specs) in message_specs.items()}
    return Schema(protocol_version, structs, messages, {spec.tag: spec for spec in messages.values()})


SCHEMA = schema_from_tables(PROTOCOL_VERSION, wire_types.STRUCT_FIELDS, wire_types.MESSAGE_SPECS)

# ---------------------------------------------------------------- numbers

_INT_MIN = -(2**31)
_INT_END = 2**32


def canonical_number(value: int | float) -> int | float:
    """msgpackr's rule: integral values in [-2^31, 2^32) as ints, else float64."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("bool is not a number")
    if isinstance(value, (int, np.integer)):
        value = int(value)
        return value if _INT_MIN <= value < _INT_END else float(value)
    value = float(value)
    if math.isfinite(value) and value.is_integer() and _INT_MIN <= value < _INT_END:
        return int(value)
    return value


def _type_name(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bin"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, msgpack.Timestamp):
        return "timestamp"
    if isinstance(value, msgpack.ExtType):
        return f"extension type {value.code}"
    return type(value).__name__


# ---------------------------------------------------------------- any

_ANY_VALUE = "a plain MessagePack value (None, bool, number, str, bytes, list, or dict with str keys)"


def _any_to_wire(value: Any, where: str) -> Any:
    """An `any` value ready to pack: numbers made canonical, everything else as it is."""
    if value is None or isinstance(value, (bool, str, bytes, bytearray, memoryview)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return canonical_number(value)
    if isinstance(value, (list, tuple)):
        return [_any_to_wire(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(where, f"expected dict keys to be str, got {_type_name(key)}")
            out[key] = _any_to_wire(item, f"{where}.{key}")
        return out
    raise ProtocolError(where, f"expected {_ANY_VALUE}, got {_type_name(value)}")


def _check_any(value: Any, where: str) -> Any:
    """A decoded `any` value, returned as decoded once it is known to be plain data."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_any(item, f"{where}[{i}]")
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ProtocolError(where, f"expected map keys to be str, got {_type_name(key)}")
            _check_any(item, f"{where}.{key}")
        return value
    raise ProtocolError(where, f"expected a plain MessagePack value, got {_type_name(value)}")


# ---------------------------------------------------------------- codec


class Codec:
    """Encodes and decodes the messages of one schema as its dataclasses.

    The module's encode/decode/to_wire/from_wire/from_plain use the codec of
    protocol/schema.json; tests build others for schemas of their own.
    """

    def __init__(self, schema: Schema, struct_classes: dict[str, type], message_classes: dict[str, type]):
        self.schema = schema
        self._struct_classes = struct_classes
        self._message_classes = message_classes
        self._name_of_class = {cls: name for name, cls in message_classes.items()}

    # -------------------------------------------------------------- encoding

    def to_wire(self, message: Any) -> list:
        """The msgpack-ready array for a message dataclass: [tag, fields...]."""
        name = self._name_of_class.get(type(message))
        if name is None:
            raise ProtocolError(type(message).__name__, "is not a protocol message")
        spec = self.schema.messages[name]
        return [spec.tag, *self._encode_fields(message, spec.fields, name)]

    def encode(self, message: Any) -> bytes:
        return msgpack.packb(self.to_wire(message), use_bin_type=True)

    def _encode_fields(self, obj: Any, fields: list[tuple[str, WireType]], where: str) -> list:
        return [self._encode_value(getattr(obj, name), wire, f"{where}.{name}") for name, wire in fields]

    def _encode_value(self, value: Any, wire: WireType, where: str) -> Any:
        if value is None:
            if not wire.nullable:
                raise ProtocolError(where, "is nil but the field is not nullable")
            return None
        kind = wire.kind
        if kind in ("int", "float"):
            try:
                return canonical_number(value)
            except TypeError:
                raise ProtocolError(where, f"expected {kind}, got {type(value).__name__}") from None
        if kind == "str":
            if not isinstance(value, str):
                raise ProtocolError(where, f"expected str, got {type(value).__name__}")
            return value
        if kind == "bool":
            return bool(value)
        if kind in _ARRAY_DTYPES:
            return np.ascontiguousarray(value, dtype=_ARRAY_DTYPES[kind]).tobytes()
        if kind == "int[]":
            return [canonical_number(v) for v in value]
        if kind == "str[]":
            if not isinstance(value, (list, tuple)):
                raise ProtocolError(where, f"expected str[] (list), got {_type_name(value)}")
            for i, v in enumerate(value):
                if not isinstance(v, str):
                    raise ProtocolError(f"{where}[{i}]", f"expected str, got {_type_name(v)}")
            return list(value)
        if kind == "any":
            return _any_to_wire(value, where)
        if kind == "struct":
            return self._encode_fields(value, self.schema.structs[wire.struct], where)
        if kind == "struct[]":
            fields = self.schema.structs[wire.struct]
            return [self._encode_fields(v, fields, f"{where}[{i}]") for i, v in enumerate(value)]
        raise ProtocolError(where, f"unsupported wire type {kind}")

    # -------------------------------------------------------------- decoding

    def decode(self, data: bytes) -> Any:
        try:
            # strict_map_key off: only `any` holds maps, and it names a non-str key itself.
            value = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
        except Exception as error:  # msgpack raises several unrelated types
            raise ProtocolError("message", f"not valid MessagePack ({type(error).__name__}: {error})") from None
        return self.from_wire(value)

    def from_wire(self, value: Any) -> Any:
        """A message dataclass from an already-unpacked [tag, fields...] array."""
        if not isinstance(value, list) or not value:
            raise ProtocolError("message", f"expected a non-empty array [tag, ...], got {_type_name(value)}")
        tag = value[0]
        if not isinstance(tag, str):
            raise ProtocolError("message.tag", f"expected str, got {_type_name(tag)}")
        spec = self.schema.by_tag.get(tag)
        if spec is None:
            raise ProtocolError("message.tag", f"unknown tag {tag!r}")
        return self._decode_fields(value[1:], spec.fields, self._message_classes[spec.name], spec.name)

    def _decode_fields(self, values: list, fields: list[tuple[str, WireType]], cls: type, where: str) -> Any:
        if len(values) != len(fields):
            raise ProtocolError(where, f"expected {len(fields)} fields, got {len(values)}")
        kwargs = {name: self._decode_value(v, wire, f"{where}.{name}") for v, (name, wire) in zip(values, fields)}
        return cls(**kwargs)

    def _decode_struct(self, value: Any, struct: str, where: str) -> Any:
        if not isinstance(value, list):
            raise ProtocolError(where, f"expected {struct} (array), got {_type_name(value)}")
        return self._decode_fields(value, self.schema.structs[struct], self._struct_classes[struct], where)

    def _decode_value(self, value: Any, wire: WireType, where: str) -> Any:
        if value is None:
            if wire.nullable:
                return None
            raise ProtocolError(where, "expected a value, got nil")
        kind = wire.kind
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProtocolError(where, f"expected int, got {_type_name(value)}")
            if isinstance(value, float):
                if not (math.isfinite(value) and value.is_integer()):
                    raise ProtocolError(where, f"expected int, got non-integral {value!r}")
                value = int(value)
            return value
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProtocolError(where, f"expected float, got {_type_name(value)}")
            return float(value)
        if kind == "str":
            if not isinstance(value, str):
                raise ProtocolError(where, f"expected str, got {_type_name(value)}")
            return value
        if kind == "bool":
            if not isinstance(value, bool):
                raise ProtocolError(where, f"expected bool, got {_type_name(value)}")
            return value
        if kind in _ARRAY_DTYPES:
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise ProtocolError(where, f"expected {kind} (bin), got {_type_name(value)}")
            dtype = _ARRAY_DTYPES[kind]
            if len(value) % dtype.itemsize:
                raise ProtocolError(where, f"{kind} byte length {len(value)} is not a multiple of {dtype.itemsize}")
            return np.frombuffer(value, dtype=dtype)
        if kind == "int[]":
            if not isinstance(value, list):
                raise ProtocolError(where, f"expected int[] (array), got {_type_name(value)}")
            return [self._decode_value(v, _INT, f"{where}[{i}]") for i, v in enumerate(value)]
        if kind == "str[]":
            if not isinstance(value, list):
                raise ProtocolError(where, f"expected str[] (array), got {_type_name(value)}")
            for i, v in enumerate(value):
                if not isinstance(v, str):
                    raise ProtocolError(f"{where}[{i}]", f"expected str, got {_type_name(v)}")
            return value
        if kind == "any":
            return _check_any(value, where)
        if kind == "struct":
            return self._decode_struct(value, wire.struct, where)
        if kind == "struct[]":
            if not isinstance(value, list):
                raise ProtocolError(where, f"expected {wire.struct}[] (array), got {_type_name(value)}")
            return [self._decode_struct(v, wire.struct, f"{where}[{i}]") for i, v in enumerate(value)]
        raise ProtocolError(where, f"unsupported wire type {kind}")

    # -------------------------------------------------------------- JSON view

    def from_plain(self, name: str, value: dict) -> Any:
        """A message dataclass from the JSON description used by protocol/golden/*.json."""
        spec = self.schema.messages[name]
        return self._build(self._message_classes[name], spec.fields, value, name)

    def _build(self, cls: type, fields: list[tuple[str, WireType]], value: dict, where: str) -> Any:
        kwargs = {}
        for name, wire in fields:
            if name not in value:
                raise ProtocolError(f"{where}.{name}", "missing")
            kwargs[name] = self._build_value(value[name], wire, f"{where}.{name}")
        return cls(**kwargs)

    def _build_value(self, value: Any, wire: WireType, where: str) -> Any:
        if value is None:
            return None
        if wire.kind in _ARRAY_DTYPES:
            return np.asarray(value, dtype=_ARRAY_DTYPES[wire.kind])
        if wire.kind in ("struct", "struct[]"):
            cls, fields = self._struct_classes[wire.struct], self.schema.structs[wire.struct]
            if wire.kind == "struct":
                return self._build(cls, fields, value, where)
            return [self._build(cls, fields, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value


_INT = WireType("int", False)

_CODEC = Codec(SCHEMA, STRUCT_CLASSES, MESSAGE_CLASSES)
to_wire = _CODEC.to_wire
encode = _CODEC.encode
from_wire = _CODEC.from_wire
decode = _CODEC.decode
from_plain = _CODEC.from_plain


def to_plain(obj: Any) -> Any:
    """A JSON-like view (dicts, lists, numbers) of a decoded message, for tests and logs."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj
