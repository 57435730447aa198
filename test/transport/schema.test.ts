// messages.ts and protocol/schema.json must agree: the codec refuses to load
// otherwise. These tests show the check passes today and catches each kind of drift.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";
import { PROTOCOL_VERSION, type PingMessage, type StepTimings } from "../../src/transport/messages.js";
import { checkSchemaAgreement, mirror, schemaDisagreements } from "../../src/transport/schema-check.js";
import { loadSchema, parseSchema, schemaPath } from "../../src/transport/schema.js";
import { createCodec } from "../../src/transport/codec.js";

type SchemaDoc = {
  protocol_version: number;
  structs: Record<string, [string, string][]>;
  messages: Record<string, { tag: string; from: string; fields: [string, string][] }>;
};

function doc(): SchemaDoc {
  return JSON.parse(readFileSync(schemaPath, "utf8")) as SchemaDoc;
}

function drift(edit: (d: SchemaDoc) => void): string[] {
  const d = doc();
  edit(d);
  return schemaDisagreements(parseSchema(d));
}

describe("schema.json and messages.ts", () => {
  test("agree today", () => {
    assert.deepStrictEqual(schemaDisagreements(loadSchema()), []);
    assert.doesNotThrow(() => checkSchemaAgreement(loadSchema()));
    assert.equal(loadSchema().protocolVersion, PROTOCOL_VERSION);
  });

  test("every message and struct of the schema is known", () => {
    assert.deepStrictEqual([...loadSchema().messages.keys()].sort(), ["Fatal", "Ping", "Pong", "Ready", "Shutdown", "Step", "StepResult"]);
    assert.deepStrictEqual([...loadSchema().structs.keys()].sort(), ["AddedRequest", "SamplingParams", "StepTimings"]);
  });

  test("reordered fields are caught", () => {
    const problems = drift((d) => {
      const f = d.messages.Step!.fields;
      [f[3], f[4]] = [f[4]!, f[3]!];
    });
    assert.equal(problems.length, 1);
    assert.match(problems[0]!, /^message Step: schema.json has \[step_id: int, added: AddedRequest\[\], removed: i32\[\], num_new_tokens: i32\[\], req_ids/);
  });

  test("a renamed struct field is caught", () => {
    assert.match(drift((d) => (d.structs.SamplingParams![2]![0] = "topk")).join("\n"), /struct SamplingParams/);
  });

  test("a changed type is caught", () => {
    assert.match(drift((d) => (d.messages.StepResult!.fields[3]![1] = "f32[]")).join("\n"), /message StepResult: .*logprobs: f32\[\],.*logprobs: f32\[\]\?/);
  });

  test("a new message or struct in the schema is caught", () => {
    const problems = drift((d) => {
      d.messages.Abort = { tag: "abort", from: "engine", fields: [["req_id", "int"]] };
      d.structs.Extra = [["x", "int"]];
    });
    assert.deepStrictEqual(problems.sort(), ["message Abort: in schema.json but not in messages.ts", "struct Extra: in schema.json but not in messages.ts"]);
  });

  test("a removed message, a flipped direction and a new version are caught", () => {
    const problems = drift((d) => {
      delete d.messages.Pong;
      d.messages.Ping!.from = "worker";
      d.protocol_version = PROTOCOL_VERSION + 1;
    });
    assert.equal(problems.length, 3, problems.join("\n"));
    assert.ok(problems.some((p) => p.includes("message Pong: in messages.ts but not in schema.json")));
    assert.ok(problems.some((p) => p.includes("message Ping: schema.json says from worker")));
    assert.ok(problems.some((p) => p.startsWith("protocol_version")));
  });

  test("checkSchemaAgreement throws a message listing the problems", () => {
    const d = doc();
    d.structs.StepTimings!.push(["queue_ms", "float"]);
    assert.throws(() => checkSchemaAgreement(parseSchema(d)), /disagree:\n {2}struct StepTimings: .*queue_ms: float/);
  });

  test("the codec follows the schema it is given", () => {
    // Proves field order comes from the file: swapping two fields swaps them on the wire.
    const d = doc();
    const f = d.messages.Ready!.fields;
    [f[1], f[2]] = [f[2]!, f[1]!];
    const swapped = createCodec(parseSchema(d));
    const ready = {
      kind: "Ready" as const,
      protocol_version: 1,
      num_blocks: 100,
      block_size: 16,
      max_model_len: 64,
      vocab_size: 10,
      architecture: "A",
      dtype: "float32",
      device: "cpu",
      worker_pid: 1,
    };
    assert.notDeepEqual(swapped.encode(ready), createCodec(loadSchema()).encode(ready));
    assert.deepStrictEqual(swapped.decode(swapped.encode(ready)), ready);
  });
});

describe("schema parsing", () => {
  test("unknown types are rejected with the place they appear", () => {
    const d = doc();
    d.messages.Ping!.fields[0]![1] = "uint128";
    assert.throws(() => parseSchema(d), /messages\.Ping\.fields\.nonce: unknown type "uint128"/);
  });

  test("duplicate tags and recursive structs are rejected", () => {
    const d1 = doc();
    d1.messages.Pong!.tag = "ping";
    assert.throws(() => parseSchema(d1), /duplicate tag ping/);
    const d2 = doc();
    d2.structs.StepTimings!.push(["inner", "StepTimings"]);
    assert.throws(() => parseSchema(d2), /recursive struct StepTimings -> StepTimings/);
  });
});

describe("compile-time mirror of messages.ts", () => {
  // These lines only have to compile (or fail to, where marked): if the type
  // check in schema-check.ts stopped catching drift, tsc would report an unused
  // expect-error directive and the build would fail.
  test("wrong tables do not type-check", () => {
    mirror<PingMessage>()({ nonce: "int" });
    // @ts-expect-error a field of the interface is missing
    mirror<StepTimings>()({ prepare_ms: "float", forward_ms: "float" });
    // @ts-expect-error an extra field
    mirror<PingMessage>()({ nonce: "int", extra: "int" });
    // @ts-expect-error str does not decode to number
    mirror<PingMessage>()({ nonce: "str" });
    // @ts-expect-error a nullable wire type for a non-nullable field
    mirror<PingMessage>()({ nonce: "int?" });
    assert.ok(true);
  });
});
