// OpenAI's Responses API through the real server and worker on the demo
// model, driven by the official `openai` clients (TypeScript here, Python in
// responses_python_client.py): plain and streamed creates, a tool loop that
// continues with previous_response_id (the stored history is in the prompt),
// structured output through text.format, background responses polled and
// cancelled, GET / DELETE / input_items, and the 400s and 404s of bad input.
// The random weights write gibberish; calls and JSON come from forced tool
// choices and grammars, which make them deterministic in shape.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { schemaErrors, type Schema } from "../structured/json-schema-check.js";
import { demoModelDir, postJson, python, repoRoot, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";

const WEATHER: OpenAI.Responses.FunctionTool = {
  type: "function",
  name: "get_weather",
  description: "Current weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Oslo", "Lima"] } }, required: ["city"], additionalProperties: false },
  strict: true,
};

const PET: Schema = {
  type: "object",
  properties: { name: { type: "string", maxLength: 8 }, legs: { type: "integer", minimum: 0, maximum: 4 } },
  required: ["name", "legs"],
  additionalProperties: false,
};

type ErrorBody = { error: { message: string; type: string; param: string | null; code: string | null } };

function messageText(response: OpenAI.Responses.Response): string {
  return response.output
    .flatMap((item) => (item.type === "message" ? item.content : []))
    .map((part) => (part.type === "output_text" ? part.text : ""))
    .join("");
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

describe("Responses API against the demo model", () => {
  let server: RunningServer | null = null;
  let client: OpenAI;
  let url: string;

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]);
    url = server.url;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    assert.equal(await server?.stop(), 0);
  });

  const post = <T>(path: string, body: unknown) => postJson<T>(`${url}${path}`, body);

  test("create: a response object with a message, usage and the request echoed; instructions are a system message first", async () => {
    const response = await client.responses.create({
      model: MODEL,
      instructions: "You are terse.",
      input: "Say something about the sea.",
      max_output_tokens: 8,
      temperature: 0,
      metadata: { run: "e2e" },
      user: "tester",
    });
    assert.match(response.id, /^resp_[0-9a-f]+$/);
    assert.equal(response.object, "response");
    assert.equal(response.model, MODEL);
    assert.equal(response.status, "incomplete");
    assert.deepEqual(response.incomplete_details, { reason: "max_output_tokens" });
    assert.equal(response.output.length, 1);
    const message = response.output[0];
    assert.ok(message?.type === "message" && message.role === "assistant" && message.status === "incomplete", JSON.stringify(message));
    assert.match(message.id, /^msg_/);
    assert.deepEqual(message.content[0]?.type === "output_text" && message.content[0].annotations, []);
    assert.ok(response.output_text.length > 0);
    assert.equal(response.output_text, messageText(response));
    assert.equal(response.usage?.output_tokens, 8);
    assert.equal(response.usage?.total_tokens, (response.usage?.input_tokens ?? 0) + 8);
    assert.equal(response.usage?.output_tokens_details.reasoning_tokens, 0);
    assert.equal(typeof response.usage?.input_tokens_details.cached_tokens, "number");
    assert.deepEqual(
      [response.instructions, response.metadata, response.temperature, response.top_p, response.max_output_tokens, (response as { store?: boolean }).store, response.user, response.tool_choice, response.text?.format?.type],
      ["You are terse.", { run: "e2e" }, 0, 1, 8, true, "tester", "none", "text"],
    );
    // The prompt is the chat of the same conversation, token for token.
    const { body: tokens } = await post<{ count: number }>("/tokenize", {
      model: MODEL,
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: "Say something about the sea." },
      ],
    });
    assert.equal(response.usage?.input_tokens, tokens.count);
    const chat = await client.chat.completions.create({
      model: MODEL,
      messages: [
        { role: "system", content: "You are terse." },
        { role: "user", content: "Say something about the sea." },
      ],
      max_tokens: 8,
      temperature: 0,
    });
    assert.equal(response.output_text, chat.choices[0]?.message.content);
  });

  test("stream: typed events in order with consecutive sequence numbers; the deltas join to the final text", async () => {
    const params = { model: MODEL, input: [{ role: "user" as const, content: "Count to ten." }], max_output_tokens: 10, temperature: 0 };
    const full = await client.responses.create(params);
    const stream = await client.responses.create({ ...params, stream: true });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const event of stream) events.push(event);
    assert.deepEqual(
      events.map((e) => e.sequence_number),
      events.map((_, i) => i),
    );
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 4), ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]);
    assert.deepEqual(types.slice(-4), ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]);
    assert.ok(types.slice(4, -4).every((t) => t === "response.output_text.delta"), types.join(" "));
    let deltas = "";
    let done = "";
    let last: OpenAI.Responses.Response | null = null;
    for (const event of events) {
      if (event.type === "response.output_text.delta") {
        assert.equal(event.output_index, 0);
        assert.equal(event.content_index, 0);
        deltas += event.delta;
      }
      if (event.type === "response.output_text.done") done = event.text;
      if (event.type === "response.incomplete") last = event.response;
    }
    const created = events[0];
    assert.ok(created?.type === "response.created" && created.response.status === "in_progress");
    assert.equal(deltas, done);
    assert.equal(deltas, messageText(full));
    assert.ok(last !== null);
    assert.equal(messageText(last), deltas);
    assert.equal(last.usage?.output_tokens, 10);
    assert.equal(last.id, created.response.id);
    // The client's own accumulator rebuilds the same response from the events.
    const helper = client.responses.stream(params);
    const final = await helper.finalResponse();
    assert.equal(final.output_text, deltas);
  });

  test("a tool loop: a forced call, then its output continues the stored conversation without resending it", async () => {
    const first = await client.responses.create({
      model: MODEL,
      input: "What is the weather in Paris?",
      tools: [WEATHER],
      tool_choice: { type: "function", name: "get_weather" },
      max_output_tokens: 40,
      temperature: 0,
    });
    assert.equal(first.status, "completed");
    const call = first.output.find((item) => item.type === "function_call");
    assert.ok(call?.type === "function_call", JSON.stringify(first.output));
    assert.equal(call.name, "get_weather");
    assert.match(call.call_id, /^call_/);
    assert.match(call.id ?? "", /^fc_/);
    assert.ok(["Paris", "Oslo", "Lima"].includes((JSON.parse(call.arguments) as { city: string }).city), call.arguments);
    assert.deepEqual(first.tools.map((t) => t.type === "function" && t.name), ["get_weather"]);

    const output: OpenAI.Responses.ResponseInputItem.FunctionCallOutput = { type: "function_call_output", call_id: call.call_id, output: '{"temperature_c": 21}' };
    const second = await client.responses.create({ model: MODEL, previous_response_id: first.id, input: [output], max_output_tokens: 6, temperature: 0 });
    assert.equal(second.previous_response_id, first.id);
    assert.equal(second.usage?.output_tokens, 6);
    // The same conversation resent in full gives the same prompt.
    const resent = await client.responses.create({
      model: MODEL,
      input: [{ role: "user", content: "What is the weather in Paris?" }, { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments }, output],
      max_output_tokens: 6,
      temperature: 0,
    });
    assert.equal(second.usage?.input_tokens, resent.usage?.input_tokens);
    assert.ok((second.usage?.input_tokens ?? 0) > 20);
    assert.equal(second.output_text, resent.output_text);
    // The stored conversation: the first turn's input and output, then this turn's input.
    const items = await client.responses.inputItems.list(second.id, { order: "asc" });
    assert.deepEqual(
      items.data.map((item) => item.type),
      ["message", "function_call", "function_call_output"],
    );
  });

  test("a streamed forced call: its arguments arrive as deltas that join to the done event", async () => {
    const stream = await client.responses.create({
      model: MODEL,
      input: "Weather in Oslo?",
      tools: [WEATHER],
      tool_choice: "required",
      parallel_tool_calls: false,
      max_output_tokens: 60,
      temperature: 0,
      stream: true,
    });
    let args = "";
    let done: OpenAI.Responses.ResponseFunctionCallArgumentsDoneEvent | null = null;
    let added: OpenAI.Responses.ResponseOutputItemAddedEvent | null = null;
    let completed: OpenAI.Responses.Response | null = null;
    for await (const event of stream) {
      if (event.type === "response.output_item.added") added = event;
      if (event.type === "response.function_call_arguments.delta") args += event.delta;
      if (event.type === "response.function_call_arguments.done") done = event;
      if (event.type === "response.completed") completed = event.response;
    }
    assert.ok(added?.item.type === "function_call" && added.item.arguments === "" && added.item.status === "in_progress", JSON.stringify(added));
    assert.ok(done !== null && completed !== null);
    assert.equal(done.name, "get_weather");
    assert.equal(done.arguments, args);
    const call = completed.output[0];
    assert.ok(call?.type === "function_call" && call.arguments === args && call.status === "completed");
    assert.equal(completed.output.length, 1, "parallel_tool_calls false: one call");
  });

  test("structured output: text.format json_schema gives JSON of the schema", async () => {
    const response = await client.responses.create({
      model: MODEL,
      input: "Describe a pet.",
      text: { format: { type: "json_schema", name: "pet", schema: PET, strict: true } },
      max_output_tokens: 100,
      temperature: 0,
    });
    assert.equal(response.status, "completed", JSON.stringify(response.output));
    const value: unknown = JSON.parse(response.output_text);
    assert.deepEqual(schemaErrors(value, PET), []);
    assert.deepEqual(response.text?.format, { type: "json_schema", name: "pet", schema: PET, strict: true });
    const object = await client.responses.create({ model: MODEL, input: "Any JSON object.", text: { format: { type: "json_object" } }, max_output_tokens: 60, temperature: 0 });
    if (object.status === "completed") assert.equal(typeof JSON.parse(object.output_text), "object");
  });

  test("background: queued at once, polled to its end; a long one is cancelled and keeps what it wrote", async () => {
    const short = await client.responses.create({ model: MODEL, input: "Hi", max_output_tokens: 6, temperature: 0, background: true });
    assert.equal(short.status, "queued");
    assert.equal(short.background, true);
    let polled = await client.responses.retrieve(short.id);
    for (let i = 0; i < 200 && (polled.status === "queued" || polled.status === "in_progress"); i++) {
      await sleep(50);
      polled = await client.responses.retrieve(short.id);
    }
    assert.equal(polled.status, "incomplete");
    assert.equal(polled.usage?.output_tokens, 6);

    // No max_output_tokens: it would run to the end of the context.
    const long = await client.responses.create({ model: MODEL, input: "Tell a long story.", temperature: 0, background: true });
    let seen = await client.responses.retrieve(long.id);
    for (let i = 0; i < 200 && seen.output_text.length === 0; i++) {
      await sleep(50);
      seen = await client.responses.retrieve(long.id);
    }
    assert.equal(seen.status, "in_progress");
    const cancelled = await client.responses.cancel(long.id);
    assert.equal(cancelled.status, "cancelled");
    const tokens = cancelled.usage?.output_tokens ?? 0;
    assert.ok(tokens > 0 && tokens < 4000, String(tokens));
    await sleep(300);
    const after = await client.responses.retrieve(long.id);
    assert.equal(after.status, "cancelled");
    assert.equal(after.usage?.output_tokens, tokens, "the engine request was aborted");
    assert.equal((await client.responses.cancel(long.id)).status, "cancelled", "cancel again: the same response");

    const { status, body } = await post<ErrorBody>("/v1/responses", { model: MODEL, input: "x", background: true, store: false });
    assert.equal(status, 400);
    assert.equal(body.error.param, "background");
  });

  test("GET, DELETE and cancel by id; an unknown id is a 404", async () => {
    const created = await client.responses.create({ model: MODEL, input: "Hello", max_output_tokens: 3, temperature: 0 });
    const got = await client.responses.retrieve(created.id);
    assert.deepEqual({ ...got, output_text: undefined }, { ...created, output_text: undefined });
    const cancel = await fetch(`${url}/v1/responses/${created.id}/cancel`, { method: "POST" });
    assert.equal(cancel.status, 400, "only background responses can be cancelled");
    const deleted = await fetch(`${url}/v1/responses/${created.id}`, { method: "DELETE" });
    assert.deepEqual(await deleted.json(), { id: created.id, object: "response", deleted: true });
    for (const [method, path] of [
      ["GET", `/v1/responses/${created.id}`],
      ["DELETE", `/v1/responses/${created.id}`],
      ["POST", `/v1/responses/${created.id}/cancel`],
      ["GET", `/v1/responses/${created.id}/input_items`],
    ] as const) {
      const response = await fetch(`${url}${path}`, { method });
      assert.equal(response.status, 404, `${method} ${path}`);
      const body = (await response.json()) as ErrorBody;
      assert.equal(body.error.message, `Response with id '${created.id}' not found.`);
    }
    await assert.rejects(client.responses.retrieve("resp_missing"), (error: unknown) => error instanceof OpenAI.NotFoundError);
    // store: false keeps nothing.
    const unstored = await client.responses.create({ model: MODEL, input: "Hello", max_output_tokens: 2, store: false });
    assert.equal((unstored as { store?: boolean }).store, false);
    assert.equal((await fetch(`${url}/v1/responses/${unstored.id}`)).status, 404);
  });

  test("bad input is a 400 naming the parameter", async () => {
    const cases: [unknown, string, RegExp][] = [
      [{ input: [{ type: "web_search_call", id: "ws_1" }] }, "input[0].type", /unsupported input item type "web_search_call"/],
      [{ input: [{ type: "function_call_output", call_id: "call_nope", output: "1" }] }, "input[0].call_id", /No tool call found for function call output with call_id call_nope/],
      [{ input: "hi", previous_response_id: "resp_unknown" }, "previous_response_id", /^Previous response with id 'resp_unknown' not found\.$/],
      [{ input: [{ role: "robot", content: "hi" }] }, "input[0].role", /role/],
      [{ input: [{ role: "user", content: [{ type: "input_audio" }] }] }, "input[0].content[0].type", /unknown content part type/],
      [{ input: "hi", tools: [{ type: "web_search" }] }, "tools[0].type", /only "function" tools/],
      [{ input: "hi", tools: [WEATHER], tool_choice: { type: "function", name: "get_time" } }, "tool_choice.name", /get_time/],
      [{ input: "hi", temperature: 3 }, "temperature", /in \[0, 2\]/],
      [{ input: "hi", max_output_tokens: 0 }, "max_output_tokens", /at least 1/],
      [{ input: "hi", text: { format: { type: "json_schema", name: "x" } } }, "text.format.schema", /schema/],
      [{ input: "hi", text: { format: { type: "json_schema", name: "x", schema: { type: "nonsense" } } } }, "text.format.schema", /grammar/],
      [{ input: "hi", max_output_tokens: 5000 }, "max_output_tokens", /maximum context length/],
      [{}, "input", /input is required/],
    ];
    for (const [body, param, message] of cases) {
      const { status, body: error } = await post<ErrorBody>("/v1/responses", { model: MODEL, ...(body as object) });
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(error.error.type, "invalid_request_error");
      assert.equal(error.error.param, param, JSON.stringify(error));
      assert.match(error.error.message, message);
    }
    const wrongModel = await post<ErrorBody>("/v1/responses", { model: "nope", input: "hi" });
    assert.equal(wrongModel.status, 404);
  });

  test("the official Python client: plain, streamed, tool loop, structured output, background", () => {
    const result = spawnSync(python, [join(repoRoot, "test", "e2e", "responses_python_client.py"), url, MODEL], { encoding: "utf8", timeout: 120_000 });
    assert.equal(result.status, 0, `${result.stdout}\n${result.stderr}`);
    const line = result.stdout.trim().split("\n").pop() ?? "";
    const report = JSON.parse(line) as { ok: boolean; checks: number };
    assert.equal(report.ok, true);
    assert.ok(report.checks >= 10, line);
  });
});
