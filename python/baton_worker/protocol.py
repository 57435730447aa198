"""Wire codec for the engine <-> worker protocol, driven by protocol/schema.json.

The schema file is the single source of truth. This module reads it at import
time (path: <repo>/protocol/schema.json, or $BATON_SCHEMA) and checks that the
dataclasses below list exactly the schema's fields in the schema's order, so
drift between the two fails loudly at start-up instead of corrupting messages.

Encoding rules (see the schema's "about"):
- a message is a MessagePack array [tag, field_1, ...]; a struct is [field_1, ...];
- i32[] / f32[] / u8[] are raw little-endian bytes (MessagePack bin); decoding
  gives read-only numpy views over the received bytes (np.frombuffer, no copy);
- canonical numbers: an integer-valued number in [-2^31, 2^32) is packed as the
  smallest MessagePack int, anything else as float64. JS msgpackr does exactly
  that, so both languages produce identical bytes for identical messages.

Anything malformed raises ProtocolError whose message starts with the field
path, e.g. "Step.added[0].sampling.top_k: expected int, got str".
Never pickle: only msgpack primitives are ever produced or accepted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np


class ProtocolError(Exception):
    """A message that does not match the schema; `field` is where decoding stopped."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# ---------------------------------------------------------------- dataclasses
# Field names and order mirror schema.json; _check_against_schema() enforces it.


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    suppress_token_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    logprobs: int = -1


@dataclass
class AddedRequest:
    req_id: int
    token_ids: np.ndarray
    num_prompt_tokens: int
    sampling: SamplingParams


@dataclass
class StepTimings:
    prepare_ms: float = 0.0
    forward_ms: float = 0.0
    sample_ms: float = 0.0


@dataclass
class Step:
    step_id: int
    added: list[AddedRequest]
    removed: np.ndarray
    req_ids: np.ndarray
    num_new_tokens: np.ndarray
    num_computed: np.ndarray
    new_block_counts: np.ndarray
    new_block_ids: np.ndarray
    sample: np.ndarray


@dataclass
class Ping:
    nonce: int


@dataclass
class Shutdown:
    pass


@dataclass
class Ready:
    protocol_version: int
    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    architecture: str
    dtype: str
    device: str
    worker_pid: int


@dataclass
class StepResult:
    step_id: int
    req_ids: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray | None
    top_counts: np.ndarray | None
    top_ids: np.ndarray | None
    top_logprobs: np.ndarray | None
    timings: StepTimings


@dataclass
class Pong:
    nonce: int


@dataclass
class Fatal:
    message: str


STRUCT_CLASSES: dict[str, type] = {
    "SamplingParams": SamplingParams,
    "AddedRequest": AddedRequest,
    "StepTimings": StepTimings,
}
MESSAGE_CLASSES: dict[str, type] = {
    "Step": Step,
    "Ping": Ping,
    "Shutdown": Shutdown,
    "Ready": Ready,
    "StepResult": StepResult,
    "Pong": Pong,
    "Fatal": Fatal,
}

# ---------------------------------------------------------------- schema

_ARRAY_DTYPES = {"i32[]": np.dtype("<i4"), "f32[]": np.dtype("<f4"), "u8[]": np.dtype("u1")}
_SCALARS = {"int", "float", "str", "bool"}


@dataclass(frozen=True)
class WireType:
    kind: str  # "int" | "float" | "str" | "bool" | "i32[]" | "f32[]" | "u8[]" | "int[]" | "struct" | "struct[]"
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


def default_schema_path() -> Path:
    override = os.environ.get("BATON_SCHEMA")
    if override:
        return Path(override)
    # python/baton_worker/protocol.py -> repo root is two levels above the package.
    return Path(__file__).resolve().parents[2] / "protocol" / "schema.json"


def _parse_type(text: str, struct_names: set[str], where: str) -> WireType:
    nullable = text.endswith("?")
    base = text[:-1] if nullable else text
    if base in _SCALARS or base in _ARRAY_DTYPES or base == "int[]":
        return WireType(base, nullable)
    if base.endswith("[]") and base[:-2] in struct_names:
        return WireType("struct[]", nullable, base[:-2])
    if base in struct_names:
        return WireType("struct", nullable, base)
    raise ValueError(f"schema {where}: unknown type {text!r}")


def _parse_fields(raw: Any, struct_names: set[str], where: str) -> list[tuple[str, WireType]]:
    return [(name, _parse_type(type_text, struct_names, f"{where}.{name}")) for name, type_text in raw]


def parse_schema(doc: dict) -> Schema:
    struct_names = set(doc["structs"])
    structs = {name: _parse_fields(raw, struct_names, f"structs.{name}") for name, raw in doc["structs"].items()}
    messages: dict[str, MessageSpec] = {}
    for name, raw in doc["messages"].items():
        fields = _parse_fields(raw["fields"], struct_names, f"messages.{name}")
        messages[name] = MessageSpec(name, raw["tag"], raw["from"], fields)
    by_tag = {spec.tag: spec for spec in messages.values()}
    return Schema(int(doc["protocol_version"]), structs, messages, by_tag)


def load_schema(path: Path | None = None) -> Schema:
    path = path or default_schema_path()
    with open(path, encoding="utf-8") as f:
        return parse_schema(json.load(f))


def _check_against_schema(schema: Schema) -> None:
    """The dataclasses must list exactly the schema's fields, in order."""
    pairs = [(name, STRUCT_CLASSES.get(name), fields) for name, fields in schema.structs.items()]
    pairs += [(name, MESSAGE_CLASSES.get(name), spec.fields) for name, spec in schema.messages.items()]
    for name, cls, fields in pairs:
        if cls is None:
            raise RuntimeError(f"schema defines {name} but baton_worker.protocol has no dataclass for it")
        ours = [f.name for f in dataclasses.fields(cls)]
        theirs = [field_name for field_name, _ in fields]
        if ours != theirs:
            raise RuntimeError(f"{name}: dataclass fields {ours} differ from schema fields {theirs}")


SCHEMA = load_schema()
_check_against_schema(SCHEMA)
PROTOCOL_VERSION = SCHEMA.protocol_version
_NAME_OF_CLASS = {cls: name for name, cls in MESSAGE_CLASSES.items()}

# ---------------------------------------------------------------- encoding

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


def _encode_value(value: Any, wire: WireType, where: str) -> Any:
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
    if kind == "struct":
        return _encode_struct(value, wire.struct, where)
    if kind == "struct[]":
        return [_encode_struct(v, wire.struct, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ProtocolError(where, f"unsupported wire type {kind}")


def _encode_fields(obj: Any, fields: list[tuple[str, WireType]], where: str) -> list:
    return [_encode_value(getattr(obj, name), wire, f"{where}.{name}") for name, wire in fields]


def _encode_struct(obj: Any, struct: str, where: str) -> list:
    return _encode_fields(obj, SCHEMA.structs[struct], where)


def to_wire(message: Any) -> list:
    """The msgpack-ready array for a message dataclass: [tag, fields...]."""
    name = _NAME_OF_CLASS.get(type(message))
    if name is None:
        raise ProtocolError(type(message).__name__, "is not a protocol message")
    spec = SCHEMA.messages[name]
    return [spec.tag, *_encode_fields(message, spec.fields, name)]


def encode(message: Any) -> bytes:
    return msgpack.packb(to_wire(message), use_bin_type=True)


# ---------------------------------------------------------------- decoding


def _type_name(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bin"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def _decode_value(value: Any, wire: WireType, where: str) -> Any:
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
        return [_decode_value(v, WireType("int", False), f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "struct":
        return _decode_struct(value, wire.struct, where)
    if kind == "struct[]":
        if not isinstance(value, list):
            raise ProtocolError(where, f"expected {wire.struct}[] (array), got {_type_name(value)}")
        return [_decode_struct(v, wire.struct, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ProtocolError(where, f"unsupported wire type {kind}")


def _decode_fields(values: list, fields: list[tuple[str, WireType]], cls: type, where: str) -> Any:
    if len(values) != len(fields):
        raise ProtocolError(where, f"expected {len(fields)} fields, got {len(values)}")
    kwargs = {name: _decode_value(v, wire, f"{where}.{name}") for v, (name, wire) in zip(values, fields)}
    return cls(**kwargs)


def _decode_struct(value: Any, struct: str, where: str) -> Any:
    if not isinstance(value, list):
        raise ProtocolError(where, f"expected {struct} (array), got {_type_name(value)}")
    return _decode_fields(value, SCHEMA.structs[struct], STRUCT_CLASSES[struct], where)


def from_wire(value: Any) -> Any:
    """A message dataclass from an already-unpacked [tag, fields...] array."""
    if not isinstance(value, list) or not value:
        raise ProtocolError("message", f"expected a non-empty array [tag, ...], got {_type_name(value)}")
    tag = value[0]
    if not isinstance(tag, str):
        raise ProtocolError("message.tag", f"expected str, got {_type_name(tag)}")
    spec = SCHEMA.by_tag.get(tag)
    if spec is None:
        raise ProtocolError("message.tag", f"unknown tag {tag!r}")
    return _decode_fields(value[1:], spec.fields, MESSAGE_CLASSES[spec.name], spec.name)


def decode(data: bytes) -> Any:
    try:
        value = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as error:  # msgpack raises several unrelated types
        raise ProtocolError("message", f"not valid MessagePack ({type(error).__name__}: {error})") from None
    return from_wire(value)


# ---------------------------------------------------------------- JSON view


def to_plain(obj: Any) -> Any:
    """A JSON-like view (dicts, lists, numbers) of a decoded message, for tests and logs."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj


def from_plain(name: str, value: dict) -> Any:
    """A message dataclass from the JSON description used by protocol/golden/*.json."""
    spec = SCHEMA.messages[name]
    return _build(MESSAGE_CLASSES[name], spec.fields, value, name)


def _build(cls: type, fields: list[tuple[str, WireType]], value: dict, where: str) -> Any:
    kwargs = {}
    for name, wire in fields:
        if name not in value:
            raise ProtocolError(f"{where}.{name}", "missing")
        kwargs[name] = _build_value(value[name], wire, f"{where}.{name}")
    return cls(**kwargs)


def _build_value(value: Any, wire: WireType, where: str) -> Any:
    if value is None:
        return None
    if wire.kind in _ARRAY_DTYPES:
        return np.asarray(value, dtype=_ARRAY_DTYPES[wire.kind])
    if wire.kind == "struct":
        return _build(STRUCT_CLASSES[wire.struct], SCHEMA.structs[wire.struct], value, where)
    if wire.kind == "struct[]":
        return [
            _build(STRUCT_CLASSES[wire.struct], SCHEMA.structs[wire.struct], v, f"{where}[{i}]")
            for i, v in enumerate(value)
        ]
    return value
