// Structured output through the real server, worker and grammar engine, on
// the demo model's random weights (which write garbage unconstrained): varied
// JSON schemas all validate, regex / choice / EBNF outputs match, streaming
// equals non-streaming for a seed, the official openai clients parse the
// results, forced tool calls carry schema-valid arguments, and all of it holds
// without overlap scheduling and under preemption with prefix caching.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import fc from "fast-check";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { schemaErrors, type Schema } from "../structured/json-schema-check.js";
import { demoModelDir, postJson, python, repoRoot, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";
/** max_tokens on the server with a 384-token context. */
const TIGHT_MAX_TOKENS = 320;

// ------------------------------------------------------------ schemas

const NAMES = ["id", "name", "tags", "score", "meta", "ok", "kind", "items", "note", "level"];

/** A bounded schema (strings, arrays and integers with limits), so a random model's output always ends. */
const leaf: fc.Arbitrary<Schema> = fc.oneof(
  fc.record({ type: fc.constant("string"), maxLength: fc.integer({ min: 1, max: 10 }) }),
  fc.record({ type: fc.constant("string"), minLength: fc.constant(2), maxLength: fc.integer({ min: 2, max: 6 }) }),
  fc.record({ type: fc.constant("string"), enum: fc.uniqueArray(fc.string({ minLength: 1, maxLength: 6 }), { minLength: 1, maxLength: 4 }) }),
  fc.record({ type: fc.constant("string"), pattern: fc.constantFrom("^[a-z]{2,4}$", "^[0-9]{3}-[0-9]{2}$", "^(red|green|blue)$") }),
  fc.integer({ min: -50, max: 50 }).chain((min) => fc.record({ type: fc.constant("integer"), minimum: fc.constant(min), maximum: fc.integer({ min, max: min + 2000 }) })),
  fc.constant({ type: "boolean" }),
  fc.constant({ type: "null" }),
  fc.constant({ enum: [1, "two", true, null] }),
);

const schemaArb: fc.Arbitrary<Schema> = fc.letrec<{ node: Schema; object: Schema; array: Schema }>((tie) => ({
  node: fc.oneof({ maxDepth: 2, depthIdentifier: "schema" }, leaf, tie("object"), tie("array")),
  object: fc
    .uniqueArray(fc.constantFrom(...NAMES), { minLength: 1, maxLength: 4 })
    .chain((keys) =>
      fc.tuple(
        fc.tuple(...keys.map(() => tie("node"))),
        fc.subarray(keys),
      ).map(([values, required]) => ({
        type: "object",
        properties: Object.fromEntries(keys.map((k, i) => [k, values[i] as Schema])),
        required,
        additionalProperties: false,
      })),
    ),
  array: fc.record({ type: fc.constant("array"), items: tie("node"), minItems: fc.integer({ min: 0, max: 1 }), maxItems: fc.integer({ min: 1, max: 3 }) }),
})).object;

const SCHEMAS: Schema[] = fc.sample(schemaArb, { numRuns: 50, seed: 20251124 });

/** Runs `work` over `items` with at most `limit` at once, results in order. */
async function pool<T, R>(items: readonly T[], limit: number, work: (item: T, i: number) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        results[i] = await work(items[i] as T, i);
      }
    }),
  );
  return results;
}

interface Choice {
  text?: string;
  message?: { content: string | null; tool_calls?: { id: string; type: string; function: { name: string; arguments: string } }[] };
  finish_reason: string;
}
interface Completion {
  choices: Choice[];
  usage: { completion_tokens: number };
}

function textOf(choice: Choice | undefined): string {
  return choice?.text ?? choice?.message?.content ?? "";
}

/** The JSON-schema request of schema i: chat with response_format, or completions with structured_outputs / guided_json. */
function schemaRequest(schema: Schema, i: number, maxTokens = 400): { path: string; body: Record<string, unknown> } {
  const common = { model: MODEL, max_tokens: maxTokens, temperature: 1, seed: 1000 + i };
  if (i % 3 === 0) {
    return {
      path: "/v1/chat/completions",
      body: { ...common, messages: [{ role: "user", content: `Fill schema ${i}` }], response_format: { type: "json_schema", json_schema: { name: `s${i}`, schema, strict: true } } },
    };
  }
  const form = i % 3 === 1 ? { structured_outputs: { json: schema } } : { guided_json: JSON.stringify(schema) };
  return { path: "/v1/completions", body: { ...common, prompt: `Record ${i}:`, ...form } };
}

async function checkSchemaOutputs(url: string, schemas: readonly Schema[], concurrency: number, maxTokens = 400): Promise<string[]> {
  return pool(schemas, concurrency, async (schema, i) => {
    const { path, body } = schemaRequest(schema, i, maxTokens);
    const { status, body: response } = await postJson<Completion>(`${url}${path}`, body);
    assert.equal(status, 200, JSON.stringify(response));
    const choice = response.choices[0];
    const text = textOf(choice);
    assert.equal(choice?.finish_reason, "stop", `schema ${i} ${JSON.stringify(schema)}: the JSON ends before max_tokens: ${text}`);
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (error) {
      assert.fail(`schema ${i} ${JSON.stringify(schema)}: not JSON: ${text} (${(error as Error).message})`);
    }
    assert.deepEqual(schemaErrors(value, schema), [], `schema ${i} ${JSON.stringify(schema)}: ${text}`);
    return text;
  });
}

async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name));
  return Number(line?.split(" ").pop() ?? Number.NaN);
}

// ------------------------------------------------------------ the default server (overlap on)

describe("structured output against the demo model", () => {
  let server: RunningServer | null = null;
  let url = "";
  let client: OpenAI;
  const seeded: string[] = [];

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL]);
    url = server.url;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    assert.equal(await server?.stop(), 0);
  });

  test("50 requests with varied JSON schemas, 16 at a time, all return JSON that validates", async () => {
    seeded.push(...(await checkSchemaOutputs(url, SCHEMAS, 16)));
  });

  test("json_object: a JSON object", async () => {
    const response = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Anything" }],
      response_format: { type: "json_object" },
      max_tokens: 300,
      n: 3,
      seed: 5,
    });
    // A random-weight model may write a string until max_tokens: such a choice is cut
    // (finish_reason length) and is an object's beginning; every finished one parses.
    let finished = 0;
    for (const choice of response.choices) {
      const text = choice.message.content ?? "";
      if (choice.finish_reason === "length") {
        assert.ok(text.startsWith("{"), text);
        continue;
      }
      assert.equal(choice.finish_reason, "stop");
      const value: unknown = JSON.parse(text);
      assert.equal(typeof value, "object");
      assert.ok(value !== null && !Array.isArray(value));
      finished += 1;
    }
    assert.ok(finished > 0, "no choice finished within max_tokens");
  });

  test("regex, choice and EBNF outputs match, streamed and not", async () => {
    const cases: { field: Record<string, unknown>; check: RegExp }[] = [
      { field: { structured_outputs: { regex: "[a-z]{3,8}@[a-z]{2,5}\\.(com|org)" } }, check: /^[a-z]{3,8}@[a-z]{2,5}\.(com|org)$/ },
      { field: { guided_regex: "\\d{3}-\\d{4}" }, check: /^\d{3}-\d{4}$/ },
      { field: { guided_choice: ["alpha", "beta", "gamma ray"] }, check: /^(alpha|beta|gamma ray)$/ },
      { field: { structured_outputs: { choice: ["yes", "no"] } }, check: /^(yes|no)$/ },
      { field: { guided_grammar: 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]{0,2}' }, check: /^\([1-9][0-9]{0,2}(\+[1-9][0-9]{0,2})*\)$/ },
      { field: { structured_outputs: { grammar: 'root ::= item ("," item){0,3}\nitem ::= "x" | "y" [0-9]' } }, check: /^(x|y[0-9])(,(x|y[0-9])){0,3}$/ },
    ];
    for (const [i, c] of cases.entries()) {
      for (const seed of [1, 2, 3]) {
        const body = { model: MODEL, prompt: `Case ${i}`, max_tokens: 200, temperature: 1, seed, ...c.field };
        const { body: full } = await postJson<Completion>(`${url}/v1/completions`, body);
        assert.match(textOf(full.choices[0]), c.check, JSON.stringify(c.field));
        assert.equal(full.choices[0]?.finish_reason, "stop");
        const streamed = await streamText(`${url}/v1/completions`, { ...body, stream: true });
        assert.equal(streamed, textOf(full.choices[0]));
      }
    }
  });

  test("streaming gives the same text as non-streaming for the same seed, n = 2 included", async () => {
    const schema = SCHEMAS[7] as Schema;
    const body = {
      model: MODEL,
      messages: [{ role: "user", content: "Same seed" }],
      max_tokens: 400,
      temperature: 1,
      seed: 77,
      n: 2,
      response_format: { type: "json_schema", json_schema: { name: "same", schema } },
    };
    const { body: full } = await postJson<Completion>(`${url}/v1/chat/completions`, body);
    const stream = await client.chat.completions.create({ ...(body as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming), stream: true });
    const texts = ["", ""];
    for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.delta.content ?? "";
    assert.deepEqual(texts, full.choices.map(textOf));
    for (const text of texts) assert.deepEqual(schemaErrors(JSON.parse(text), schema), []);
  });

  test("a stop string ends a constrained output early", async () => {
    const body = { model: MODEL, prompt: "Stop", max_tokens: 100, seed: 3, guided_regex: "[a-z]{4}X[a-z]{4}", stop: ["X"] };
    const { body: full } = await postJson<Completion>(`${url}/v1/completions`, body);
    assert.match(textOf(full.choices[0]), /^[a-z]{4}$/);
    assert.equal(full.choices[0]?.finish_reason, "stop");
  });

  test("a schema or grammar the engine cannot compile is a 400 naming the problem", async () => {
    const bad: [Record<string, unknown>, string, RegExp][] = [
      [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "nonsense" } } } }, "response_format.json_schema.schema", /Unsupported type "nonsense"/],
      [{ structured_outputs: { regex: "a(+" } }, "structured_outputs.regex", /parenthesis is not closed/],
      [{ guided_grammar: 'root ::= "a" | ' }, "guided_grammar", /EBNF parser error at line 1/],
    ];
    for (const [field, param, message] of bad) {
      // Twice: a failed compile is remembered, and the engine still serves.
      for (let k = 0; k < 2; k++) {
        const { status, body } = await postJson<{ error: { message: string; param: string } }>(`${url}/v1/chat/completions`, {
          model: MODEL,
          messages: [{ role: "user", content: "x" }],
          ...field,
        });
        assert.equal(status, 400);
        assert.equal(body.error.param, param);
        assert.match(body.error.message, message);
      }
    }
    const ok = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "x" }], max_tokens: 3 });
    assert.equal(ok.choices.length, 1);
  });

  test("the openai npm client's chat.completions.parse returns the parsed object", async () => {
    const Person = z.object({ name: z.string().max(10), age: z.number().int().min(0).max(120), tags: z.array(z.enum(["a", "b"])).max(2) });
    const completion = await client.chat.completions.parse({
      model: MODEL,
      messages: [{ role: "user", content: "A person" }],
      response_format: zodResponseFormat(Person, "person"),
      max_tokens: 300,
      seed: 11,
    });
    const parsed = completion.choices[0]?.message.parsed;
    assert.ok(parsed, JSON.stringify(completion.choices[0]?.message));
    assert.ok(Person.safeParse(parsed).success, JSON.stringify(parsed));
  });

  test("the openai Python client's parse returns the parsed object", () => {
    const result = spawnSync(python, [join(repoRoot, "test", "e2e", "structured_python_client.py"), url, MODEL], { encoding: "utf8", timeout: 120_000 });
    assert.equal(result.status, 0, result.stderr + result.stdout);
    assert.match(result.stdout, /"ok": true/);
  });

  // ---------------------------------------------------------- forced tool calls

  const WEATHER: OpenAI.Chat.ChatCompletionTool = {
    type: "function",
    function: {
      name: "get_weather",
      parameters: {
        type: "object",
        properties: { city: { type: "string", enum: ["Paris", "Oslo", "Lima"] }, days: { type: "integer", minimum: 1, maximum: 7 } },
        required: ["city", "days"],
        additionalProperties: false,
      },
    },
  };
  const TIME: OpenAI.Chat.ChatCompletionTool = {
    type: "function",
    function: { name: "get_time", parameters: { type: "object", properties: { zone: { type: "string", maxLength: 6 } }, required: ["zone"], additionalProperties: false } },
  };

  function checkCall(call: { type: string; function: { name: string; arguments: string } } | undefined): void {
    assert.ok(call !== undefined && call.type === "function");
    const tool = [WEATHER, TIME].find((t) => t.type === "function" && t.function.name === call.function.name);
    assert.ok(tool !== undefined && tool.type === "function", call.function.name);
    assert.deepEqual(schemaErrors(JSON.parse(call.function.arguments), tool.function.parameters as Schema), [], call.function.arguments);
  }

  test("tool_choice naming a function: schema-valid arguments, streamed name first then argument fragments", async () => {
    const body = {
      model: MODEL,
      messages: [{ role: "user" as const, content: "Weather?" }],
      tools: [WEATHER, TIME],
      tool_choice: { type: "function" as const, function: { name: "get_weather" } },
      max_tokens: 200,
      seed: 21,
    };
    const full = await client.chat.completions.create(body);
    const message = full.choices[0]?.message;
    assert.equal(message?.content, null);
    assert.equal(message?.tool_calls?.length, 1);
    const call = message?.tool_calls?.[0];
    assert.ok(call?.type === "function" && call.function.name === "get_weather" && /^call_/.test(call.id));
    checkCall(call);

    const stream = await client.chat.completions.create({ ...body, stream: true });
    const deltas: OpenAI.Chat.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    let finish: string | null = null;
    for await (const chunk of stream) {
      deltas.push(...(chunk.choices[0]?.delta.tool_calls ?? []));
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(finish, full.choices[0]?.finish_reason);
    const [first, ...rest] = deltas;
    assert.deepEqual(
      { index: first?.index, type: first?.type, name: first?.function?.name, arguments: first?.function?.arguments },
      { index: 0, type: "function", name: "get_weather", arguments: "" },
    );
    assert.ok(typeof first?.id === "string" && first.id.startsWith("call_"));
    assert.ok(rest.length >= 1 && rest.every((d) => d.index === 0 && d.id === undefined && d.function?.name === undefined && (d.function?.arguments ?? "") !== ""));
    assert.equal(rest.map((d) => d.function?.arguments).join(""), call?.type === "function" ? call.function.arguments : "");
  });

  test("tool_choice required: calls of the offered functions with valid parameters; parallel_tool_calls false gives one", async () => {
    for (const seed of [1, 2, 3, 4]) {
      const full: OpenAI.Chat.ChatCompletion = await client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: "Use a tool" }],
        tools: [WEATHER, TIME],
        tool_choice: "required",
        max_tokens: 300,
        seed,
        parallel_tool_calls: seed % 2 === 0,
      });
      const calls = full.choices[0]?.message.tool_calls ?? [];
      assert.equal(full.choices[0]?.finish_reason, "tool_calls");
      assert.ok(calls.length >= 1);
      if (seed % 2 === 1) assert.equal(calls.length, 1);
      for (const call of calls) checkCall(call.type === "function" ? call : undefined);
      assert.equal(new Set(calls.map((c: OpenAI.Chat.ChatCompletionMessageToolCall) => c.id)).size, calls.length);
    }
  });

  test("a full round trip: a forced call, its result, and the next turn's call", async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in some city?" }];
    const first = await client.chat.completions.create({ model: MODEL, messages, tools: [WEATHER], tool_choice: "required", max_tokens: 200, seed: 8 });
    const call = first.choices[0]?.message.tool_calls?.[0];
    assert.ok(call?.type === "function");
    messages.push(first.choices[0]?.message as OpenAI.Chat.ChatCompletionMessageParam);
    messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature_c: 21 }) });
    const second = await client.chat.completions.create({
      model: MODEL,
      messages,
      tools: [WEATHER, TIME],
      tool_choice: { type: "function", function: { name: "get_time" } },
      max_tokens: 200,
      seed: 9,
    });
    const next = second.choices[0]?.message.tool_calls?.[0];
    checkCall(next?.type === "function" ? next : undefined);
  });

  describe("without overlap scheduling, and under preemption with prefix caching", () => {
    let tight: RunningServer | null = null;

    before(async () => {
      // 24 blocks of 16 tokens (a context of 384): 24 concurrent requests cannot all hold their KV, so some are preempted.
      tight = await startServer([demoModelDir, "--served-model-name", MODEL, "--no-async-scheduling", "--num-gpu-blocks-override", "24", "--max-num-seqs", "32"]);
    });

    after(async () => {
      assert.equal(await tight?.stop(), 0);
    });

    test("the same seeds give the same outputs as with overlap", async () => {
      const again = await pool(SCHEMAS.slice(0, 8), 1, async (schema, i) => {
        const { path, body } = schemaRequest(schema, i, TIGHT_MAX_TOKENS);
        const { body: response } = await postJson<Completion>(`${tight?.url}${path}`, body);
        return textOf(response.choices[0]);
      });
      assert.deepEqual(again, seeded.slice(0, 8));
    });

    test("24 concurrent constrained requests sharing a prompt prefix all validate, with preemptions", async () => {
      const before = await metric(tight?.url ?? "", "vllm:num_preemptions_total");
      await checkSchemaOutputs(tight?.url ?? "", SCHEMAS.slice(10, 34), 24, TIGHT_MAX_TOKENS);
      const after = await metric(tight?.url ?? "", "vllm:num_preemptions_total");
      assert.ok(after > before, `expected preemptions (before ${before}, after ${after})`);
    });
  });
});

async function streamText(url: string, body: unknown): Promise<string> {
  const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const raw = await response.text();
  let text = "";
  for (const line of raw.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: Choice[] };
    text += textOf(chunk.choices[0]);
  }
  return text;
}

describe("a grammar failure fails its own request only", () => {
  let server: RunningServer | null = null;

  before(async () => {
    // dummy-null: no model; each token is the last + 1, whatever the mask says, so the grammar rejects it.
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--load-format", "dummy-null"]);
  });

  after(async () => {
    assert.equal(await server?.stop(), 0);
  });

  test("the constrained request ends with an error naming the rejected token; its batch-mates finish", async () => {
    const url = server?.url ?? "";
    const constrained = postJson<{ error?: { message: string } }>(`${url}/v1/completions`, {
      model: MODEL,
      prompt: "Pick one",
      max_tokens: 20,
      guided_choice: ["yes", "no"],
    });
    const plain = Array.from({ length: 4 }, (_, i) => postJson<Completion>(`${url}/v1/completions`, { model: MODEL, prompt: `Plain ${i}`, max_tokens: 20, ignore_eos: true }));
    const failed = await constrained;
    assert.equal(failed.status, 500);
    assert.match(failed.body.error?.message ?? "", /structured output: the grammar rejected generated token \d+/);
    for (const r of await Promise.all(plain)) {
      assert.equal(r.status, 200);
      assert.equal(r.body.usage.completion_tokens, 20);
    }
    const after = await postJson<Completion>(`${url}/v1/completions`, { model: MODEL, prompt: "Still serving", max_tokens: 5, ignore_eos: true });
    assert.equal(after.status, 200);
  });
});
