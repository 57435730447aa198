// messages.ts and python/baton_worker/wire_types.py are generated from
// protocol/schema.json by scripts/gen-protocol.mjs. These tests keep a stale
// generated file from landing, and show that the generator refuses a broken
// schema and writes what the schema says.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { createCodec } from "../../src/transport/codec.js";
import { PROTOCOL_VERSION, type ReadyMessage } from "../../src/transport/messages.js";
import { loadSchema, schemaFromTables, schemaPath } from "../../src/transport/schema.js";
import { generator, generatorPath } from "./fixtures.js";

type SchemaDoc = {
  protocol_version: number;
  structs: Record<string, [string, string][]>;
  messages: Record<string, { tag: string; from: string; fields: [string, string][] }>;
  defaults: Record<string, Record<string, unknown>>;
};

function doc(): SchemaDoc {
  return JSON.parse(readFileSync(schemaPath, "utf8")) as SchemaDoc;
}

const scratch = mkdtempSync(join(tmpdir(), "baton-gen-protocol-"));
after(() => rmSync(scratch, { recursive: true, force: true }));

function gen(...args: string[]): { status: number | null; stdout: string; stderr: string } {
  return spawnSync(process.execPath, [generatorPath, ...args], { encoding: "utf8" });
}

describe("generated files", () => {
  test("the committed messages.ts and wire_types.py are what gen-protocol writes from schema.json", () => {
    const run = gen("--check");
    assert.equal(run.status, 0, `${run.stderr}(run node scripts/gen-protocol.mjs and commit the result)`);
  });

  test("--check names each stale file and writes nothing; a plain run fixes them", () => {
    const root = mkdtempSync(join(scratch, "root-"));
    assert.equal(gen("--root", root).status, 0);
    assert.equal(gen("--check", "--root", root).status, 0);

    const tsFile = join(root, generator.TS_OUT);
    writeFileSync(tsFile, `${readFileSync(tsFile, "utf8")}// hand edit\n`);
    const handEdited = gen("--check", "--root", root);
    assert.equal(handEdited.status, 1);
    assert.match(handEdited.stderr, /src\/transport\/messages\.ts is stale/);
    assert.doesNotMatch(handEdited.stderr, /wire_types/);
    assert.match(readFileSync(tsFile, "utf8"), /hand edit/, "--check does not write");

    // A schema change makes both languages stale.
    const d = doc();
    d.messages.Ping!.fields.push(["sent_at", "float"]);
    const schemaFile = join(root, "schema.json");
    writeFileSync(schemaFile, JSON.stringify(d));
    const changed = gen("--check", "--root", root, "--schema", schemaFile);
    assert.equal(changed.status, 1);
    assert.match(changed.stderr, /messages\.ts is stale/);
    assert.match(changed.stderr, /python\/baton_worker\/wire_types\.py is stale/);

    assert.equal(gen("--root", root, "--schema", schemaFile).status, 0);
    assert.equal(gen("--check", "--root", root, "--schema", schemaFile).status, 0);
    assert.match(readFileSync(tsFile, "utf8"), /export interface PingMessage \{\n {2}kind: "Ping";\n {2}nonce: number;\n {2}sent_at: number;\n\}/);
    assert.match(readFileSync(join(root, generator.PY_OUT), "utf8"), /class Ping:\n {4}nonce: int\n {4}sent_at: float\n/);
  });

  test("a broken schema is refused, naming the file and the place", () => {
    const d = doc();
    d.messages.Ping!.fields[0]![1] = "uint128";
    const schemaFile = join(mkdtempSync(join(scratch, "bad-")), "schema.json");
    writeFileSync(schemaFile, JSON.stringify(d));
    const run = gen("--check", "--schema", schemaFile);
    assert.equal(run.status, 2);
    assert.equal(run.stderr.trim(), `gen-protocol: ${schemaFile}: messages.Ping.fields.nonce: unknown type "uint128"`);
  });

  test("the types and the codec come from one file: PROTOCOL_VERSION and the tables agree with schema.json", () => {
    const d = doc();
    assert.equal(PROTOCOL_VERSION, d.protocol_version);
    assert.deepStrictEqual(schemaFromTables(generator.parseSchemaDocument(d).tables), loadSchema());
  });
});

describe("gen-protocol output", () => {
  function withProbe(): SchemaDoc {
    const d = doc();
    d.messages.Probe = {
      tag: "probe",
      from: "worker",
      fields: [
        ["names", "str[]"],
        ["maybe_names", "str[]?"],
        ["graph", "any"],
        ["maybe_graph", "any?"],
        ["timings", "StepTimings?"],
      ],
    };
    d.defaults.Probe = { graph: { nodes: ["llm"], flags: { persist: true } }, maybe_graph: null, timings: null };
    return d;
  }

  test("TS: str[] is string[], any is unknown, ? adds | null, and the message joins its sender's union", () => {
    const ts = generator.generateTypeScript(generator.parseSchemaDocument(withProbe()));
    assert.match(
      ts,
      /export interface ProbeMessage \{\n {2}kind: "Probe";\n {2}names: string\[\];\n {2}maybe_names: string\[\] \| null;\n {2}graph: unknown;\n {2}maybe_graph: unknown;\n {2}timings: StepTimings \| null;\n\}/,
    );
    assert.match(ts, /export type WorkerToEngineMessage = ReadyMessage \| StepResultMessage \| PongMessage \| FatalMessage \| ProbeMessage;/);
    assert.match(ts, /export type EngineToWorkerMessage = StepMessage \| StepMaskMessage \| PingMessage \| ShutdownMessage;/);
    assert.match(ts, /^\/\/ Generated from protocol\/schema\.json by scripts\/gen-protocol\.mjs — do not edit\./);
  });

  test("Python: fields in schema order with the schema's defaults", () => {
    const py = generator.generatePython(generator.parseSchemaDocument(withProbe()));
    assert.match(
      py,
      /class Probe:\n {4}names: list\[str\]\n {4}maybe_names: list\[str\] \| None\n {4}graph: Any = dataclasses\.field\(default_factory=lambda: \{"nodes": \["llm"\], "flags": \{"persist": True\}\}\)\n {4}maybe_graph: Any = None\n {4}timings: StepTimings \| None = None\n/,
    );
    // JSON cannot tell 1.0 from 1: a float field's default is still written as a float.
    assert.match(py, /class SamplingParams:\n(.*\n)*? {4}temperature: float = 1\.0\n {4}top_p: float = 1\.0\n {4}top_k: int = 0\n/);
    assert.match(py, /suppress_token_ids: np\.ndarray = dataclasses\.field\(default_factory=lambda: np\.zeros\(0, np\.int32\)\)/);
  });

  const refused: [string, (d: SchemaDoc) => void, RegExp][] = [
    ["a duplicate tag", (d) => (d.messages.Pong!.tag = "ping"), /^messages\.Pong\.tag: duplicate tag ping$/],
    ["a recursive struct", (d) => d.structs.StepTimings!.push(["inner", "StepTimings"]), /^structs\.StepTimings: recursive struct StepTimings -> StepTimings$/],
    ["a duplicate field", (d) => d.messages.Ping!.fields.push(["nonce", "int"]), /^messages\.Ping\.fields: duplicate field nonce$/],
    ["a field named kind", (d) => d.messages.Ping!.fields.push(["kind", "str"]), /^messages\.Ping\.fields\.kind: kind is reserved/],
    ["a Python keyword as a field", (d) => d.messages.Ping!.fields.push(["from", "str"]), /^messages\.Ping\.fields\.from: .*no Python keyword/],
    ["a message named like a struct", (d) => (d.messages.StepTimings = { tag: "t", from: "worker", fields: [] }), /^messages\.StepTimings: StepTimings is also a struct/],
    ["a default of the wrong type", (d) => (d.defaults.SamplingParams!.top_k = 0.5), /^defaults\.SamplingParams\.top_k: 0\.5 is not a int$/],
    ["nil as default of a field that is not nullable", (d) => (d.defaults.StepTimings!.sample_ms = null), /^defaults\.StepTimings\.sample_ms: null is not a float$/],
    ["a default for a missing field", (d) => (d.defaults.StepTimings!.queue_ms = 0), /^defaults\.StepTimings\.queue_ms: StepTimings has no such field$/],
    ["a default for an unknown struct", (d) => (d.defaults.Nope = {}), /^defaults\.Nope: no struct or message of that name$/],
    ["a struct default other than nil", (d) => (d.defaults.StepResult = { timings: { prepare_ms: 0, forward_ms: 0, sample_ms: 0 } }), /^defaults\.StepResult\.timings: a struct field's only default is nil/],
    ["a defaulted field before one without", (d) => delete d.defaults.SamplingParams!.logprobs, /^defaults\.SamplingParams\.logprobs: needs a default/],
    ["an i32[] default out of range", (d) => (d.defaults.SamplingParams!.suppress_token_ids = [2 ** 31]), /^defaults\.SamplingParams\.suppress_token_ids: \[2147483648\] is not a i32\[\]$/],
  ];
  for (const [name, edit, pattern] of refused) {
    test(`refuses ${name}`, () => {
      const d = doc();
      edit(d);
      assert.throws(() => generator.parseSchemaDocument(d), { message: pattern });
    });
  }

  test("the codec follows the schema it is given: swapping two fields swaps them on the wire", () => {
    const d = doc();
    const f = d.messages.Ready!.fields;
    [f[1], f[2]] = [f[2]!, f[1]!];
    const swapped = createCodec(schemaFromTables(generator.parseSchemaDocument(d).tables));
    const ready: ReadyMessage = {
      kind: "Ready",
      protocol_version: 1,
      num_blocks: 100,
      block_size: 16,
      max_model_len: 64,
      vocab_size: 10,
      architecture: "A",
      dtype: "float32",
      device: "cpu",
      worker_pid: 1,
      graph: {},
      pooling: null,
    };
    assert.notDeepEqual(swapped.encode(ready), createCodec(loadSchema()).encode(ready));
    assert.deepStrictEqual(swapped.decode(swapped.encode(ready)), ready);
  });
});
