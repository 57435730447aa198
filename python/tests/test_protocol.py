"""The wire codec: round trips, canonical numbers, field-naming errors, golden vectors."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

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
    assert wire == ["ready", 1, 4096, 16, 32768, 151936, "Qwen3ForCausalLM", "bfloat16", "cuda:0", 4242]
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
    assert protocol.to_wire(timings)[-1] == [2, 0.5, 0]


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
        (lambda w: w.pop(), r"^Step: expected 9 fields, got 8"),
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


def test_dataclasses_mirror_schema():
    doc = json.loads((REPO / "protocol" / "schema.json").read_text())
    assert protocol.PROTOCOL_VERSION == doc["protocol_version"]
    for name, spec in doc["messages"].items():
        fields = [f.name for f in dataclasses.fields(protocol.MESSAGE_CLASSES[name])]
        assert fields == [f for f, _ in spec["fields"]]
        assert protocol.SCHEMA.messages[name].tag == spec["tag"]
    for name, spec in doc["structs"].items():
        assert [f.name for f in dataclasses.fields(protocol.STRUCT_CLASSES[name])] == [f for f, _ in spec]


def test_schema_drift_fails_loudly(tmp_path):
    doc = json.loads((REPO / "protocol" / "schema.json").read_text())
    doc["messages"]["Ping"]["fields"].append(["extra", "int"])
    with pytest.raises(RuntimeError, match="Ping: dataclass fields"):
        protocol._check_against_schema(protocol.parse_schema(doc))
