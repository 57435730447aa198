"""The wire codec: round trips, canonical numbers, field-naming errors, golden vectors."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from baton_worker import protocol
from baton_worker.protocol import ProtocolError
from protocol_samples import sample_messages

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "protocol" / "golden"


def plain_equal(got, want, where="value"):
    """Compares a decoded message's plain view to a golden JSON value; names the first mismatch."""
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: expected an object"
        extra = set(want) - set(got) - {"kind"}
        assert not extra, f"{where}: unknown fields {sorted(extra)}"
        for key, value in got.items():
            assert key in want, f"{where}.{key}: missing in JSON"
            plain_equal(value, want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            plain_equal(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), f"{where}: {got!r} != NaN"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def check_golden(bin_path: Path) -> None:
    spec = json.loads(bin_path.with_suffix(".json").read_text(encoding="utf-8"))
    data = bin_path.read_bytes()
    message = protocol.decode(data)
    assert type(message).__name__ == spec["message"]
    plain_equal(protocol.to_plain(message), spec["value"])
    assert protocol.encode(message) == data, "re-encoding the decoded message changed the bytes"
    # Building the message from the JSON description gives the same bytes too.
    assert protocol.encode(protocol.from_plain(spec["message"], spec["value"])) == data


def write_golden(directory: Path, name: str, message) -> Path:
    path = directory / f"{name}.msgpack"
    path.write_bytes(protocol.encode(message))
    value = protocol.to_plain(message)
    doc = {"message": type(message).__name__, "value": value}
    path.with_suffix(".json").write_text(json.dumps(doc), encoding="utf-8")
    return path


GOLDEN_FILES = sorted(GOLDEN.glob("*.msgpack")) if GOLDEN.is_dir() else []


@pytest.mark.parametrize("path", GOLDEN_FILES + [None], ids=[p.stem for p in GOLDEN_FILES] + ["own-samples"])
def test_golden_vectors(path, tmp_path):
    if path is None:
        # Our own samples in the golden format: keeps the checker honest even
        # before (or without) the TS-written vectors.
        for name, message in sample_messages().items():
            check_golden(write_golden(tmp_path, name, message))
    else:
        check_golden(path)


@pytest.mark.parametrize("name", list(sample_messages()))
def test_round_trip(name):
    message = sample_messages()[name]
    data = protocol.encode(message)
    decoded = protocol.decode(data)
    assert type(decoded) is type(message)
    plain_equal(protocol.to_plain(decoded), protocol.to_plain(message))
    assert protocol.encode(decoded) == data


def test_arrays_decode_zero_copy_little_endian():
    step = protocol.decode(protocol.encode(sample_messages()["step_two_added"]))
    assert step.new_block_ids.dtype == np.dtype("<i4")
    assert not step.new_block_ids.flags.writeable  # a view over the received bytes
    assert step.added[0].token_ids.tolist() == [1, 2, 3, 70000]
    assert step.sample.dtype == np.uint8


def test_wire_layout_follows_schema_order():
    wire = protocol.to_wire(sample_messages()["ready"])
    graph = {"version": 1, "nodes": [{"name": "llm", "engine": "kv_cache", "overlap": True}]}
    assert wire == ["ready", 2, 4096, 16, 32768, 151936, "Qwen3ForCausalLM", "bfloat16", "cuda:0", 4242, graph, None]
    assert msgpack.unpackb(protocol.encode(protocol.Shutdown())) == ["shutdown"]


@pytest.mark.parametrize(
    "value,packed",
    [
        (1.0, b"\x01"),
        (-0.0, b"\x00"),
        (255, b"\xcc\xff"),
        (-129, b"\xd1\xff\x7f"),
        (2**32 - 1, b"\xce\xff\xff\xff\xff"),
        (2**32, b"\xcb" + np.array([2.0**32], ">f8").tobytes()),
        (-(2**31), b"\xd2\x80\x00\x00\x00"),
        (-(2**31) - 1, b"\xcb" + np.array([-(2.0**31) - 1], ">f8").tobytes()),
        (0.5, b"\xcb" + np.array([0.5], ">f8").tobytes()),
    ],
)
def test_canonical_numbers(value, packed):
    assert msgpack.packb(protocol.canonical_number(value)) == packed


def test_float_field_integral_value_packs_as_int():
    timings = protocol.StepResult(0, np.zeros(0, np.int32), np.zeros(0, np.int32), None, None, None, None, protocol.StepTimings(2.0, 0.5, 0))
    assert protocol.to_wire(timings)[8] == [2, 0.5, 0]


def test_int_field_accepts_integral_float_and_rejects_fraction():
    assert protocol.decode(msgpack.packb(["ping", 3.0])).nonce == 3
    with pytest.raises(ProtocolError, match=r"^Ping\.nonce: expected int, got non-integral 3\.5"):
        protocol.decode(msgpack.packb(["ping", 3.5]))


def _step_wire():
    return protocol.to_wire(sample_messages()["step_two_added"])


@pytest.mark.parametrize(
    "mutate,error",
    [
        (lambda w: w[2][0][3].__setitem__(2, "5"), r"^Step\.added\[0\]\.sampling\.top_k: expected int, got str"),
        (lambda w: w[2][1][3].__setitem__(4, None) or w[2][1][3].__setitem__(0, None), r"^Step\.added\[1\]\.sampling\.temperature: expected a value, got nil"),
        (lambda w: w[2][0].__setitem__(1, [1, 2]), r"^Step\.added\[0\]\.token_ids: expected i32\[\] \(bin\), got array"),
        (lambda w: w.__setitem__(4, b"\x00\x01\x02"), r"^Step\.req_ids: i32\[\] byte length 3 is not a multiple of 4"),
        (lambda w: w.pop(), r"^Step: expected 14 fields, got 13"),
        (lambda w: w[2].__setitem__(0, {"req_id": 1}), r"^Step\.added\[0\]: expected AddedRequest \(array\), got map"),
        (lambda w: w.__setitem__(0, "stepp"), r"^message\.tag: unknown tag 'stepp'"),
        (lambda w: w.__setitem__(0, 5), r"^message\.tag: expected str, got int"),
        (lambda w: w.__setitem__(1, True), r"^Step\.step_id: expected int, got bool"),
    ],
)
def test_malformed_messages_name_the_field(mutate, error):
    wire = _step_wire()
    mutate(wire)
    with pytest.raises(ProtocolError, match=error):
        protocol.decode(msgpack.packb(wire, use_bin_type=True))


def test_garbage_and_non_array():
    with pytest.raises(ProtocolError, match=r"^message: not valid MessagePack"):
        protocol.decode(b"\xc1")
    with pytest.raises(ProtocolError, match=r"^message: expected a non-empty array"):
        protocol.decode(msgpack.packb({"a": 1}))
    with pytest.raises(ProtocolError, match=r"^message: expected a non-empty array"):
        protocol.decode(msgpack.packb([]))


def test_encode_rejects_nil_in_required_field():
    with pytest.raises(ProtocolError, match=r"^Pong\.nonce: is nil"):
        protocol.encode(protocol.Pong(None))


def test_schema_defaults_are_the_dataclass_defaults():
    doc = json.loads((REPO / "protocol" / "schema.json").read_text())
    assert protocol.PROTOCOL_VERSION == doc["protocol_version"]
    for name, defaults in doc["defaults"].items():
        cls = protocol.STRUCT_CLASSES.get(name, protocol.MESSAGE_CLASSES.get(name))
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if len(defaults) == len(fields):
            assert protocol.to_plain(cls()) == defaults
        for field_name, value in defaults.items():
            f = fields[field_name]
            made = f.default_factory() if f.default is dataclasses.MISSING else f.default
            assert (made.tolist() if isinstance(made, np.ndarray) else made) == value, (name, field_name)
    sampling = protocol.SamplingParams()
    assert isinstance(sampling.temperature, float) and isinstance(sampling.top_k, int)
    assert sampling.suppress_token_ids.dtype == np.int32
    assert protocol.SamplingParams().suppress_token_ids is not sampling.suppress_token_ids  # a fresh array each time


def test_every_schema_message_has_a_class_and_tag():
    doc = json.loads((REPO / "protocol" / "schema.json").read_text())
    for name, spec in doc["messages"].items():
        assert [f.name for f in dataclasses.fields(protocol.MESSAGE_CLASSES[name])] == [f for f, _ in spec["fields"]]
        assert protocol.SCHEMA.messages[name].tag == spec["tag"]
    for name, spec in doc["structs"].items():
        assert [f.name for f in dataclasses.fields(protocol.STRUCT_CLASSES[name])] == [f for f, _ in spec]


NODE = shutil.which("node")
GENERATOR = REPO / "scripts" / "gen-protocol.mjs"


@pytest.mark.skipif(NODE is None, reason="node is not on PATH")
def test_generated_wire_types_are_fresh():
    run = subprocess.run([NODE, str(GENERATOR), "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr + "(run node scripts/gen-protocol.mjs and commit the result)"


# ---------------------------------------------------------------- str[] and any
# No message has these types yet, so they are tested through a codec for a
# schema of one message, Probe, in the generated tables' shape.

PROBE_SPECS = {
    "Probe": (
        "probe",
        "worker",
        (
            ("names", "str[]", False, None),
            ("maybe_names", "str[]", True, None),
            ("graph", "any", False, None),
            ("maybe_graph", "any", True, None),
        ),
    )
}


@dataclass
class Probe:
    names: list[str]
    maybe_names: list[str] | None
    graph: Any
    maybe_graph: Any = None


PROBE = protocol.Codec(protocol.schema_from_tables(1, {}, PROBE_SPECS), {}, {"Probe": Probe})
GRAPH = {
    "nodes": [{"name": "llm", "engine": "kv_cache", "inputs": []}, {"name": "codec", "engine": "stateless", "inputs": ["llm"]}],
    "window": {"size": 28, "stride": 7},
    "weights": b"\x01\x02\x03",
    "ratio": 0.5,
    "unset": None,
}


@pytest.mark.parametrize(
    "message",
    [
        Probe(["llm", "ünïcödé ✓", ""], ["x"], GRAPH, [1, "two", None]),
        Probe(["llm"], None, GRAPH, None),
        Probe([], [], 7, "text"),
    ],
    ids=["values", "nil-in-nullable-forms", "empty-and-scalars"],
)
def test_str_list_and_any_round_trip(message):
    data = PROBE.encode(message)
    assert PROBE.decode(data) == message
    assert PROBE.encode(PROBE.decode(data)) == data


def test_str_list_and_any_wire_form():
    message = Probe(["a", "b"], None, {"a": [1, 2.5, None, True, "x", -0.0, 2.0**32, 1e-3], "b": b"\x01\x02"})
    wire = msgpack.unpackb(PROBE.encode(message))
    assert wire[:3] == ["probe", ["a", "b"], None]
    # The same hex is pinned in test/transport/codec.test.ts: msgpackr writes these bytes too.
    assert PROBE.encode(message).hex().endswith(
        "82a1619801cb4004000000000000c0c3a17800cb41f0000000000000cb3f50624dd2f1a9fca162c4020102c0"
    )
    # Numbers inside any follow the canonical rule; tuples and numpy scalars are accepted as their plain forms.
    assert PROBE.to_wire(Probe([], None, (np.int64(3), np.float32(0.5), 2.0)))[3] == [3, 0.5, 2]


@pytest.mark.parametrize(
    "frame,error",
    [
        (["probe", "llm", None, 1, None], r"^Probe\.names: expected str\[\] \(array\), got str"),
        (["probe", ["a", 2], None, 1, None], r"^Probe\.names\[1\]: expected str, got int"),
        (["probe", None, None, 1, None], r"^Probe\.names: expected a value, got nil"),
        (["probe", [], [None], 1, None], r"^Probe\.maybe_names\[0\]: expected str, got nil"),
        (["probe", [], None, None, None], r"^Probe\.graph: expected a value, got nil"),
        (["probe", [], None, {"a": [msgpack.Timestamp(0)]}, None], r"^Probe\.graph\.a\[0\]: expected a plain MessagePack value, got timestamp"),
        (["probe", [], None, [msgpack.ExtType(5, b"x")], None], r"^Probe\.graph\[0\]: expected a plain MessagePack value, got extension type 5"),
        (["probe", [], None, [{1: "x"}], None], r"^Probe\.graph\[0\]: expected map keys to be str, got int"),
        (["probe", [], None, 1, {b"k": 1}], r"^Probe\.maybe_graph: expected map keys to be str, got bin"),
    ],
)
def test_str_list_and_any_decode_errors_name_the_field(frame, error):
    with pytest.raises(ProtocolError, match=error):
        PROBE.decode(msgpack.packb(frame, use_bin_type=True))


@pytest.mark.parametrize(
    "message,error",
    [
        (Probe(["a", 1], None, 1), r"^Probe\.names\[1\]: expected str, got int"),
        (Probe("ab", None, 1), r"^Probe\.names: expected str\[\] \(list\), got str"),
        (Probe([], None, None), r"^Probe\.graph: is nil but the field is not nullable"),
        (Probe([], None, {"a": {1, 2}}), r"^Probe\.graph\.a: expected a plain MessagePack value .*, got set"),
        (Probe([], None, {1: "x"}), r"^Probe\.graph: expected dict keys to be str, got int"),
        (Probe([], None, 1, [np.zeros(2)]), r"^Probe\.maybe_graph\[0\]: expected a plain MessagePack value .*, got ndarray"),
    ],
)
def test_str_list_and_any_encode_errors_name_the_field(message, error):
    with pytest.raises(ProtocolError, match=error):
        PROBE.encode(message)


@pytest.mark.skipif(NODE is None, reason="node is not on PATH")
def test_generated_module_for_a_schema_with_str_list_and_any(tmp_path, monkeypatch):
    """gen-protocol's Python for a schema with the new types: annotations, defaults, and a working codec."""
    doc = json.loads((REPO / "protocol" / "schema.json").read_text())
    doc["messages"]["Probe"] = {"tag": "probe", "from": "worker", "fields": [["names", "str[]"], ["graph", "any"], ["maybe_graph", "any?"]]}
    doc["defaults"]["Probe"] = {"graph": {"nodes": ["llm"], "persist": True}, "maybe_graph": None}
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(doc))
    run = subprocess.run([NODE, str(GENERATOR), "--schema", str(schema), "--root", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    spec = importlib.util.spec_from_file_location("probe_wire_types", tmp_path / "python" / "baton_worker" / "wire_types.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up while building
    spec.loader.exec_module(module)

    assert [(f.name, f.type) for f in dataclasses.fields(module.Probe)] == [("names", "list[str]"), ("graph", "Any"), ("maybe_graph", "Any")]
    first, second = module.Probe(["a"]), module.Probe(["b"])
    assert first.graph == {"nodes": ["llm"], "persist": True} and first.maybe_graph is None
    assert first.graph is not second.graph  # a fresh default each time
    codec = protocol.Codec(
        protocol.schema_from_tables(module.PROTOCOL_VERSION, module.STRUCT_FIELDS, module.MESSAGE_SPECS),
        module.STRUCT_CLASSES,
        module.MESSAGE_CLASSES,
    )
    assert codec.decode(codec.encode(first)) == first
    assert msgpack.unpackb(codec.encode(first)) == ["probe", ["a"], {"nodes": ["llm"], "persist": True}, None]
