// Codec round trips, the canonical number encoding, typed-array views, and
// ProtocolErrors that name the offending field.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Packr } from "msgpackr";
import { decode, decodeEngineMessage, decodeWorkerMessage, encode } from "../../src/transport/codec.js";
import { ProtocolError, type StepMessage, type WireMessage } from "../../src/transport/messages.js";
import { everyKind, probeCodec, result, step, type ProbeMessage } from "./fixtures.js";

// Same options as the codec: plain MessagePack, so we can build malformed frames.
const raw = new Packr({ useRecords: false, mapsAsObjects: true, moreTypes: false, useFloat32: 0 });

function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("hex");
}

/** Encodes a valid message, lets `edit` damage the unpacked array, and repacks it. */
function damaged(message: WireMessage, edit: (frame: unknown[]) => void): Buffer {
  const frame = raw.unpack(encode(message)) as unknown[];
  edit(frame);
  return raw.pack(frame);
}

function assertProtocolError(bytes: Uint8Array, field: string, pattern: RegExp): void {
  assert.throws(
    () => decode(bytes),
    (error: unknown) => {
      assert.ok(error instanceof ProtocolError, `expected ProtocolError, got ${String(error)}`);
      assert.equal(error.field, field);
      assert.match(error.message, pattern);
      assert.ok(error.message.startsWith(field), `message names the field first: ${error.message}`);
      return true;
    },
  );
}

describe("round trips", () => {
  for (const message of everyKind) {
    test(`${message.kind} decodes to what was encoded`, () => {
      const bytes = encode(message);
      assert.deepStrictEqual(decode(bytes), message);
      assert.equal(hex(encode(decode(bytes))), hex(bytes), "re-encoding gives the same bytes");
    });
  }

  test("a message is [tag, fields...] in schema order", () => {
    assert.deepStrictEqual(raw.unpack(encode({ kind: "Ping", nonce: 5 })), ["ping", 5]);
    assert.deepStrictEqual(raw.unpack(encode({ kind: "Shutdown" })), ["shutdown"]);
    const frame = raw.unpack(encode(result({ logprobs: null }))) as unknown[];
    assert.equal(frame[0], "result");
    assert.equal(frame[4], null, "logprobs is the 4th field");
    assert.deepStrictEqual(frame[8], [0.2, 4.5, 1], "timings is a struct array");
  });

  test("numeric arrays are raw little-endian bin", () => {
    const frame = raw.unpack(encode(step({ removed: Int32Array.from([1, -2]) }))) as unknown[];
    assert.equal(hex(frame[3] as Uint8Array), "01000000feffffff");
    const res = raw.unpack(encode(result({ logprobs: Float32Array.from([1.5]) }))) as unknown[];
    assert.equal(hex(res[4] as Uint8Array), "0000c03f");
  });

  test("direction-checked decoders reject the other side's messages", () => {
    assert.equal(decodeWorkerMessage(encode({ kind: "Pong", nonce: 1 })).kind, "Pong");
    assert.equal(decodeEngineMessage(encode({ kind: "Ping", nonce: 1 })).kind, "Ping");
    assert.throws(() => decodeWorkerMessage(encode({ kind: "Ping", nonce: 1 })), /Ping is not a worker message/);
    assert.throws(() => decodeEngineMessage(encode({ kind: "Pong", nonce: 1 })), /Pong is not an engine message/);
  });
});

describe("canonical numbers", () => {
  // schema.json "about": integral values in [-2^31, 2^32) use the smallest int
  // encoding; everything else is float64. Python's codec must produce the same.
  const ints: [number, string][] = [
    [0, "00"],
    [127, "7f"],
    [128, "cc80"],
    [255, "ccff"],
    [256, "cd0100"],
    [65535, "cdffff"],
    [65536, "ce00010000"],
    [2 ** 32 - 1, "ceffffffff"],
    [2 ** 32, "cb41f0000000000000"],
    [-1, "ff"],
    [-32, "e0"],
    [-33, "d0df"],
    [-128, "d080"],
    [-129, "d1ff7f"],
    [-32768, "d18000"],
    [-32769, "d2ffff7fff"],
    [-(2 ** 31), "d280000000"],
    [-(2 ** 31) - 1, "cbc1e0000000200000"],
  ];
  for (const [value, expected] of ints) {
    test(`int ${value} packs as ${expected}`, () => {
      assert.equal(hex(encode({ kind: "Ping", nonce: value })), `92a470696e67${expected}`);
      assert.equal((decode(encode({ kind: "Ping", nonce: value })) as { nonce: number }).nonce, value);
    });
  }

  test("float fields: integral values are ints, others float64", () => {
    const bytes = encode(result({ timings: { prepare_ms: 1.0, forward_ms: 0.7, sample_ms: -3 } }));
    assert.ok(hex(bytes).includes("9301cb3fe6666666666666fd"), hex(bytes));
  });

  test("decoders accept float64-coded ints and int-coded floats", () => {
    // Ping nonce 5 sent as float64 5.0, and timings sent as ints.
    assert.deepStrictEqual(decode(Buffer.from("92a470696e67cb4014000000000000", "hex")), { kind: "Ping", nonce: 5 });
    const frame = raw.unpack(encode(result())) as unknown[];
    frame[8] = [1, 2, 3];
    assert.deepStrictEqual((decode(raw.pack(frame)) as { timings: unknown }).timings, { prepare_ms: 1, forward_ms: 2, sample_ms: 3 });
  });

  test("64-bit integers from other encoders are accepted when safe", () => {
    // uint64 5 and int64 -5, as a non-canonical encoder might write them.
    assert.deepStrictEqual(decode(Buffer.from("92a470696e67cf0000000000000005", "hex")), { kind: "Ping", nonce: 5 });
    assert.deepStrictEqual(decode(Buffer.from("92a470696e67d3fffffffffffffffb", "hex")), { kind: "Ping", nonce: -5 });
  });
});

describe("typed arrays", () => {
  test("decoded arrays are typed-array views over the frame when aligned, copies when not", () => {
    const bytes = encode(step({ removed: Int32Array.from([11, 22, 33]) }));
    let views = 0;
    let copies = 0;
    for (let shift = 0; shift < 4; shift++) {
      // Place the same frame at every alignment inside a larger buffer.
      const backing = new ArrayBuffer(bytes.length + 8);
      const frame = new Uint8Array(backing, shift, bytes.length);
      frame.set(bytes);
      const message = decode(frame) as StepMessage;
      assert.ok(message.removed instanceof Int32Array);
      assert.deepStrictEqual(Array.from(message.removed), [11, 22, 33]);
      assert.equal(message.removed.byteOffset % 4, 0);
      if (message.removed.buffer === backing) views++;
      else copies++;
      assert.ok(message.sample instanceof Uint8Array && !(message.sample instanceof Buffer));
      assert.equal(message.sample.buffer, backing, "u8[] is always a view");
    }
    assert.equal(views, 1, "exactly one shift aligns the i32 payload");
    assert.equal(copies, 3);
  });

  test("a Buffer is accepted for u8[]", () => {
    const bytes = encode(step({ sample: Buffer.from([1, 0]) }));
    assert.deepStrictEqual(Array.from((decode(bytes) as StepMessage).sample), [1, 0]);
  });
});

describe("malformed input names the field", () => {
  const cases: [string, () => Uint8Array, string, RegExp][] = [
    ["bytes that are not MessagePack", () => Buffer.from([0xc1]), "message", /expected array/],
    ["trailing garbage", () => Buffer.concat([encode({ kind: "Ping", nonce: 1 }), Buffer.from([1])]), "message", /not valid MessagePack/],
    ["a truncated frame", () => encode(step()).subarray(0, 40), "message", /not valid MessagePack/],
    ["an empty frame", () => new Uint8Array(0), "message", /not valid MessagePack/],
    ["a map instead of an array", () => raw.pack({ kind: "ping" }), "message", /expected array \[tag, \.\.\.fields\], got map/],
    ["an empty array", () => raw.pack([]), "message", /got array\(0\)/],
    ["a non-string tag", () => raw.pack([7, 1]), "tag", /expected string, got int/],
    ["an unknown tag", () => raw.pack(["explode", 1]), "tag", /unknown message tag "explode"/],
    ["a missing field", () => raw.pack(["ping"]), "Ping", /expected 1 fields after the tag, got 0/],
    ["an extra field", () => raw.pack(["pong", 1, 2]), "Pong", /expected 1 fields after the tag, got 2/],
    [
      "a string where an int belongs, deep inside a struct",
      () => damaged(step(), (f) => (((f[2] as unknown[][])[0]![3] as unknown[])[2] = "40")),
      "Step.added[0].sampling.top_k",
      /expected int, got string/,
    ],
    ["a fractional int", () => raw.pack(["ping", 1.5]), "Ping.nonce", /expected int, got float/],
    ["an int beyond 2^53", () => Buffer.from("92a470696e67cf0020000000000001", "hex"), "Ping.nonce", /outside the safe integer range/],
    ["nil in a non-nullable field", () => damaged(step(), (f) => (f[4] = null)), "Step.req_ids", /expected i32\[\] \(bin\), got nil/],
    ["an i32[] whose length is not a multiple of 4", () => damaged(step(), (f) => (f[3] = Buffer.alloc(7))), "Step.removed", /multiple of 4 bytes\), got 7 bytes/],
    ["a number list instead of bin", () => damaged(result(), (f) => (f[4] = [-0.5, -1.5])), "StepResult.logprobs", /expected f32\[\] \(bin\), got array\(2\)/],
    [
      "a struct with too few fields",
      () => damaged(step(), (f) => ((f[2] as unknown[][])[1]![3] as unknown[]).pop()),
      "Step.added[1].sampling",
      /expected SamplingParams with 14 fields, got 13/,
    ],
    ["a struct that is not an array", () => damaged(result(), (f) => (f[8] = "fast")), "StepResult.timings", /expected StepTimings \(array of 3\), got string/],
    ["a struct list that is not a list", () => damaged(step(), (f) => (f[2] = 3)), "Step.added", /expected array of AddedRequest, got int/],
    ["bin where a string belongs", () => raw.pack(["fatal", Buffer.from("oops")]), "Fatal.message", /expected string, got bin\(4 bytes\)/],
    ["a string where a float belongs", () => damaged(step(), (f) => (((f[2] as unknown[][])[0]![3] as unknown[])[0] = "hot")), "Step.added[0].sampling.temperature", /expected float, got string/],
    ["a MessagePack extension value", () => Buffer.from("92a470696e67d6ffffffffff", "hex"), "Ping.nonce", /expected int, got timestamp/],
  ];
  for (const [name, bytes, field, pattern] of cases) {
    test(name, () => assertProtocolError(bytes(), field, pattern));
  }

  test("encode rejects values that do not fit their field, naming it", () => {
    const bad = step();
    bad.added[0]!.sampling.top_k = 1.5;
    assert.throws(() => encode(bad), { name: "ProtocolError", message: "Step.added[0].sampling.top_k: expected int, got float" });
    assert.throws(() => encode(step({ removed: [1, 2] as unknown as Int32Array })), {
      name: "ProtocolError",
      message: "Step.removed: expected Int32Array, got array(2)",
    });
    assert.throws(() => encode({ kind: "Fatal" } as unknown as WireMessage), { name: "ProtocolError", message: "Fatal.message: missing" });
    assert.throws(() => encode({ kind: "Nope" } as unknown as WireMessage), { name: "ProtocolError", field: "kind" });
  });
});

describe("str[] and any", () => {
  const probe = probeCodec();
  const encodeProbe = (message: ProbeMessage): Buffer => probe.encode(message as unknown as WireMessage);
  const decodeProbe = (bytes: Uint8Array): ProbeMessage => probe.decode(bytes) as unknown as ProbeMessage;
  const graph = {
    nodes: [{ name: "llm", engine: "kv_cache", inputs: [] }, { name: "codec", engine: "stateless", inputs: ["llm"] }],
    window: { size: 28, stride: 7 },
    weights: Uint8Array.from([1, 2, 3]),
    ratio: 0.5,
    unset: null,
    __proto__key: { "__proto__": 1 },
  };
  const message = (overrides: Partial<ProbeMessage> = {}): ProbeMessage => ({
    kind: "Probe",
    names: ["llm", "ünïcödé ✓", ""],
    maybe_names: ["x"],
    graph,
    maybe_graph: [1, "two", null],
    ...overrides,
  });

  for (const [name, value] of [
    ["values", message()],
    ["nil in the nullable forms", message({ maybe_names: null, maybe_graph: null })],
    ["empty lists and scalars as any", message({ names: [], maybe_names: [], graph: 7, maybe_graph: "text" })],
  ] as const) {
    test(`round trip: ${name}`, () => {
      const bytes = encodeProbe(value);
      assert.deepStrictEqual(decodeProbe(bytes), value);
      assert.equal(hex(encodeProbe(decodeProbe(bytes))), hex(bytes));
    });
  }

  test("a __proto__ key inside any stays an ordinary key", () => {
    const decoded = decodeProbe(raw.pack(["probe", [], null, new Map([["__proto__", 1]]), null])).graph as Record<string, unknown>;
    assert.equal(Object.getPrototypeOf(decoded), Object.prototype);
    assert.deepStrictEqual(Object.keys(decoded), ["__proto__"]);
  });

  test("str[] is an array of str; any is the value's own MessagePack, canonical numbers included", () => {
    const frame = raw.unpack(encodeProbe(message({ maybe_names: null, graph: { a: [1, 2.5, null, true, "x", -0, 2 ** 32, 1e-3], b: Uint8Array.from([1, 2]) } })));
    assert.deepStrictEqual((frame as unknown[]).slice(0, 3), ["probe", ["llm", "ünïcödé ✓", ""], null]);
    // The same hex is pinned in python/tests/test_protocol.py: both languages write these bytes.
    assert.ok(
      hex(encodeProbe(message({ graph: { a: [1, 2.5, null, true, "x", -0, 2 ** 32, 1e-3], b: Uint8Array.from([1, 2]) } }))).includes(
        "82a1619801cb4004000000000000c0c3a17800cb41f0000000000000cb3f50624dd2f1a9fca162c4020102",
      ),
    );
    assert.ok(decodeProbe(encodeProbe(message())).graph !== graph, "decoding builds new values");
    const weights = (decodeProbe(encodeProbe(message())).graph as { weights: Uint8Array }).weights;
    assert.ok(weights instanceof Uint8Array && !(weights instanceof Buffer), "bin inside any is a plain Uint8Array");
  });

  const malformed: [string, unknown[], string, RegExp][] = [
    ["str[] that is not an array", ["probe", "llm", null, 1, null], "Probe.names", /expected array of string, got string/],
    ["a non-string inside str[]", ["probe", ["a", 2], null, 1, null], "Probe.names[1]", /expected string, got int/],
    ["nil in str[]", ["probe", null, null, 1, null], "Probe.names", /expected array of string, got nil/],
    ["nil inside str[]?", ["probe", [], [null], 1, null], "Probe.maybe_names[0]", /expected string, got nil/],
    ["nil in any", ["probe", [], null, null, null], "Probe.graph", /expected a value \(any; nil needs any\?\), got nil/],
    ["an extension value inside any", ["probe", [], null, { a: [new Date(0)] }, null], "Probe.graph.a[0]", /expected a plain MessagePack value, got timestamp/],
    ["a map with an int key inside any", ["probe", [], null, [new Map([[1, "x"]])], null], "Probe.graph[0]", /expected map keys to be strings, got int/],
    ["an int beyond 2^53 inside any?", ["probe", [], null, 1, [2n ** 60n]], "Probe.maybe_graph[0]", /outside the safe integer range/],
  ];
  for (const [name, frame, field, pattern] of malformed) {
    test(`decode names the field: ${name}`, () => {
      assert.throws(
        () => probe.decode(raw.pack(frame)),
        (error: unknown) => error instanceof ProtocolError && error.field === field && pattern.test(error.message) && error.message.startsWith(field),
      );
    });
  }

  const unencodable: [string, Partial<ProbeMessage>, string][] = [
    ["a number in str[]", { names: ["a", 1 as unknown as string] }, "Probe.names[1]: expected string, got int"],
    ["nil for str[]", { names: null as unknown as string[] }, "Probe.names: expected array of string, got nil"],
    ["nil for any", { graph: null }, "Probe.graph: expected a value (any; nil needs any?), got nil"],
    ["undefined inside any", { graph: { a: undefined } }, "Probe.graph.a: expected a plain MessagePack value (nil, bool, number, string, Uint8Array, array, or object), got undefined"],
    ["a typed array other than Uint8Array", { maybe_graph: [new Int32Array(2)] }, "Probe.maybe_graph[0]: expected a plain MessagePack value (nil, bool, number, string, Uint8Array, array, or object), got Int32Array"],
    ["a Map", { graph: new Map() }, "Probe.graph: expected a plain MessagePack value (nil, bool, number, string, Uint8Array, array, or object), got map"],
    ["a bigint", { graph: { n: 5n } }, "Probe.graph.n: expected a plain MessagePack value (nil, bool, number, string, Uint8Array, array, or object), got int64"],
  ];
  for (const [name, overrides, error] of unencodable) {
    test(`encode names the field: ${name}`, () => {
      assert.throws(() => encodeProbe(message(overrides)), { name: "ProtocolError", message: error });
    });
  }
});
