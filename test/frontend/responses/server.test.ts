// /v1/responses through the real HTTP server, tokenizer, chat template,
// reasoning parser (deepseek_r1) and tool-call parser (hermes), over an engine
// that plays back scripted text: reasoning items, messages and function calls
// built from known output, the stream's events in order and equal to the
// collected response, reasoning_tokens, a failure mid-stream, a refusal at
// submission, the stored conversation in the next prompt, and cancel. The
// real engine and worker are covered end to end in test/e2e/responses.test.ts.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { RequestRejectedError } from "../../../src/engine/engine-core.js";
import type { EngineRequest, OutputCallback, RequestOutput } from "../../../src/engine/types.js";
import { buildServer } from "../../../src/frontend/server.js";
import { ChatTemplate } from "../../../src/text/chat-template.js";
import { TextTokenizer } from "../../../src/text/tokenizer.js";
import { qwenDir, qwenTokenizerPath } from "../../text/helpers.js";

const tokenizer = TextTokenizer.fromFile(qwenTokenizerPath);
const templateSource = (JSON.parse(readFileSync(join(qwenDir, "tokenizer_config.json"), "utf8")) as { chat_template: string }).chat_template;
const EOS = 151645;

interface Script {
  ids: number[];
  /** Fail (an engine error) instead of sending token `failAt`. */
  failAt?: number;
  /** Milliseconds between tokens (0: one per event-loop turn). */
  delayMs?: number;
}

/** Plays back the next script, one token per step; ends with EOS unless max tokens cut it first. */
class ScriptedEngine {
  next: Script = { ids: [] };
  refuse: string | null = null;
  readonly submitted: EngineRequest[] = [];
  readonly aborted = new Set<number>();

  submit(req: EngineRequest, onOutput: OutputCallback): void {
    if (this.refuse !== null) throw new RequestRejectedError(this.refuse);
    this.submitted.push(req);
    const script = this.next;
    const ownEnd = script.ids.length < req.stop.maxTokens;
    const ids = ownEnd ? [...script.ids, EOS] : script.ids.slice(0, req.stop.maxTokens);
    let i = 0;
    const output = (fields: Partial<RequestOutput>): RequestOutput => ({
      requestId: req.id,
      newTokenIds: [],
      logprobs: null,
      finished: false,
      finishReason: null,
      stopTokenId: null,
      numCachedTokens: 0,
      error: null,
      ...fields,
    });
    const step = (): void => {
      if (this.aborted.has(req.id)) return;
      if (i === script.failAt) {
        onOutput(output({ finished: true, finishReason: "error", error: "the worker fell over" }));
        return;
      }
      const id = ids[i++] as number;
      const finished = i === ids.length;
      onOutput(
        output({ newTokenIds: [id], finished, finishReason: finished ? (ownEnd ? "stop" : "length") : null, stopTokenId: finished && ownEnd ? EOS : null }),
      );
      if (!finished) later();
    };
    const later = (): void => {
      if (script.delayMs) setTimeout(step, script.delayMs);
      else setImmediate(step);
    };
    later();
  }

  abort(id: number): void {
    this.aborted.add(id);
  }
}

const engine = new ScriptedEngine();
const server = buildServer({
  engine,
  tokenizer,
  chatTemplate: new ChatTemplate(templateSource, { bosToken: null, eosToken: "<|im_end|>" }),
  servedModelName: "test-model",
  maxModelLen: 4096,
  eosTokenIds: [EOS],
  vocabSize: 151936,
  reasoningParser: "deepseek_r1",
  toolCallParser: "hermes",
  enableAutoToolChoice: true,
});
after(() => server.app.close());

interface Item {
  id: string;
  type: string;
  status: string;
  call_id?: string;
  name?: string;
  arguments?: string;
  content?: { type: string; text: string }[];
}
interface Body {
  id: string;
  status: string;
  output: Item[];
  usage: { input_tokens: number; output_tokens: number; output_tokens_details: { reasoning_tokens: number } };
  tool_choice: unknown;
  instructions: string | null;
  error: { code?: string; message: string } | null;
  deleted?: boolean;
  // An item list (input_items).
  data: Item[];
  has_more: boolean;
  last_id: string;
}
interface Event {
  type: string;
  sequence_number: number;
  delta?: string;
  item?: Item;
  response?: Body;
  arguments?: string;
  name?: string;
  output_index?: number;
}

async function script(text: string, extra: Omit<Script, "ids"> = {}): Promise<number[]> {
  const ids = await tokenizer.encode(text, false);
  engine.next = { ids, ...extra };
  return ids;
}

async function request(method: "GET" | "POST" | "DELETE", url: string, body?: unknown): Promise<{ status: number; body: Body; text: string }> {
  const response = await server.app.inject({
    method,
    url,
    ...(body === undefined ? {} : { headers: { "content-type": "application/json" }, payload: JSON.stringify(body) }),
  });
  const text = response.body;
  return { status: response.statusCode, body: (text.startsWith("{") ? JSON.parse(text) : {}) as Body, text };
}

/** The SSE body's events; each `event:` line names its data's type. */
function events(text: string): Event[] {
  return text
    .split("\n\n")
    .filter((block) => block.trim() !== "")
    .map((block) => {
      const [eventLine, dataLine, ...rest] = block.split("\n");
      assert.equal(rest.length, 0, block);
      assert.ok(eventLine !== undefined && dataLine !== undefined && eventLine.startsWith("event: ") && dataLine.startsWith("data: "), block);
      const data = JSON.parse(dataLine.slice("data: ".length)) as Event;
      assert.equal(data.type, eventLine.slice("event: ".length));
      return data;
    });
}

/** The output without its random ids. */
function withoutIds(output: readonly Item[]): object[] {
  return output.map(({ id: _id, call_id: _callId, ...rest }) => rest);
}

const TOOLS = [{ type: "function", name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
const CALL_TEXT = '</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

describe("/v1/responses over a scripted engine", () => {
  test("reasoning then an answer: a reasoning item and a message; reasoning_tokens counts the think block", async () => {
    const ids = await script("Two plus two is four.</think>\n\nIt is 4.");
    const { status, body } = await request("POST", "/v1/responses", { model: "test-model", input: "2+2?" });
    assert.equal(status, 200, JSON.stringify(body));
    assert.equal(body.status, "completed");
    assert.deepEqual(withoutIds(body.output), [
      { type: "reasoning", status: "completed", summary: [], content: [{ type: "reasoning_text", text: "Two plus two is four." }] },
      { type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "It is 4.", annotations: [], logprobs: [] }] },
    ]);
    assert.match(body.output[0]?.id ?? "", /^rs_/);
    const answerStart = (await Promise.all(ids.map((id) => tokenizer.decode([id], false)))).findIndex((t, i, all) => i > 0 && all.slice(0, i).join("").includes("</think>") && t.trim() !== "");
    assert.equal(body.usage.output_tokens, ids.length + 1);
    assert.equal(body.usage.output_tokens_details.reasoning_tokens, answerStart);
    assert.equal(body.usage.input_tokens, engine.submitted.at(-1)?.promptIds.length);
  });

  test("streamed: the same items through events in order, sequence numbers 0..n-1", async () => {
    await script("Two plus two is four.</think>\n\nIt is 4.");
    const collected = (await request("POST", "/v1/responses", { input: "2+2?" })).body;
    const { status, text } = await request("POST", "/v1/responses", { input: "2+2?", stream: true });
    assert.equal(status, 200);
    const all = events(text);
    assert.deepEqual(
      all.map((e) => e.sequence_number),
      all.map((_, i) => i),
    );
    // Runs of deltas folded into one entry.
    const kinds = all.map((e) => e.type).filter((t, i, list) => !(t.endsWith(".delta") && list[i - 1] === t));
    assert.deepEqual(kinds, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    const reasoning = all.filter((e) => e.type === "response.reasoning_text.delta").map((e) => e.delta as string);
    assert.equal(reasoning.join(""), "Two plus two is four.");
    assert.ok(reasoning.length > 1, "reasoning arrives in pieces");
    assert.equal(all.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta as string).join(""), "It is 4.");
    const added = all.find((e) => e.type === "response.output_item.added") as Event;
    assert.deepEqual(withoutIds(added.item ? [added.item] : []), [{ type: "reasoning", status: "in_progress", summary: [], content: [] }]);
    const final = all.at(-1)?.response as Body;
    assert.deepEqual(withoutIds(final.output), withoutIds(collected.output));
    assert.deepEqual(final.usage.output_tokens_details, collected.usage.output_tokens_details);
    assert.equal(final.id, all[0]?.response?.id);
    // Stored: GET gives the final response.
    const got = await request("GET", `/v1/responses/${final.id as string}`);
    assert.deepEqual(got.body, final);
  });

  test("tool_choice auto: a call in the model's own format (hermes) is a function_call item, streamed and not", async () => {
    await script(CALL_TEXT);
    const { body } = await request("POST", "/v1/responses", { input: "Weather in Paris?", tools: TOOLS });
    assert.equal(body.status, "completed");
    assert.equal(body.tool_choice, "auto");
    assert.deepEqual(withoutIds(body.output), [
      { type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Checking.\n", annotations: [], logprobs: [] }] },
      { type: "function_call", status: "completed", name: "get_weather", arguments: '{"city": "Paris"}' },
    ]);
    assert.match(body.output[1]?.call_id ?? "", /^call_/);

    await script(CALL_TEXT);
    const all = events((await request("POST", "/v1/responses", { input: "Weather in Paris?", tools: TOOLS, stream: true })).text);
    const args = all.filter((e) => e.type === "response.function_call_arguments.delta").map((e) => e.delta as string);
    const done = all.find((e) => e.type === "response.function_call_arguments.done") as Event;
    assert.equal(args.join(""), '{"city": "Paris"}');
    assert.equal(done.arguments, args.join(""));
    assert.equal(done.name, "get_weather");
    assert.equal(done.output_index, 1);
    assert.deepEqual(withoutIds(all.at(-1)?.response?.output ?? []), withoutIds(body.output));
  });

  test("previous_response_id: the stored conversation (call and output) is in the next prompt", async () => {
    await script(CALL_TEXT);
    const first = (await request("POST", "/v1/responses", { input: "Weather in Paris?", tools: TOOLS })).body;
    const call = first.output[1] as Item;
    await script("It is sunny.");
    const second = await request("POST", "/v1/responses", {
      previous_response_id: first.id,
      input: [{ type: "function_call_output", call_id: call.call_id, output: '{"temperature_c": 21}' }],
      instructions: "Answer in one line.",
    });
    assert.equal(second.status, 200, JSON.stringify(second.body));
    const prompt = await tokenizer.decode(engine.submitted.at(-1)?.promptIds ?? [], false);
    assert.ok(prompt.startsWith("<|im_start|>system\nAnswer in one line.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>"), prompt);
    assert.ok(prompt.includes('<|im_start|>assistant\nChecking.\n'), prompt);
    assert.ok(prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'), prompt);
    assert.ok(prompt.includes('<tool_response>\n{"temperature_c": 21}\n</tool_response>'), prompt);
    // The previous turn's instructions are not carried over; this one's are.
    assert.equal(second.body.instructions, "Answer in one line.");
    const items = (await request("GET", `/v1/responses/${second.body.id as string}/input_items?order=asc&limit=2`)).body;
    assert.deepEqual(
      items.data.map((i) => i.type),
      ["message", "message"],
    );
    assert.equal(items.has_more, true);
    const rest = (await request("GET", `/v1/responses/${second.body.id as string}/input_items?order=asc&after=${items.last_id as string}`)).body;
    assert.deepEqual(
      rest.data.map((i) => i.type),
      ["function_call", "function_call_output"],
    );
    assert.equal(rest.has_more, false);
  });

  test("an engine failure mid-stream: an error event, then response.failed; collected, a 500; stored as failed", async () => {
    await script("Some reasoning that never ends", { failAt: 3 });
    const all = events((await request("POST", "/v1/responses", { input: "x", stream: true })).text);
    assert.deepEqual(
      all.slice(-2).map((e) => e.type),
      ["error", "response.failed"],
    );
    const failed = all.at(-1)?.response as Body;
    assert.equal(failed.status, "failed");
    assert.deepEqual(failed.error, { code: "server_error", message: "the worker fell over" });
    assert.equal(failed.output[0]?.status, "incomplete");

    await script("Some reasoning that never ends", { failAt: 3 });
    const collected = await request("POST", "/v1/responses", { input: "x" });
    assert.equal(collected.status, 500);
    assert.equal(collected.body.error?.message, "the worker fell over");
  });

  test("a request the engine refuses at once is a plain 400, streamed or not", async () => {
    engine.refuse = "the prompt needs more KV-cache blocks than the engine has";
    try {
      for (const stream of [false, true]) {
        const { status, body } = await request("POST", "/v1/responses", { input: "x", stream });
        assert.equal(status, 400);
        assert.match(body.error?.message ?? "", /KV-cache blocks/);
      }
    } finally {
      engine.refuse = null;
    }
  });

  test("input_image parts: images for a vision model (in the engine request), a 400 naming the part for a model without", async () => {
    const image = { type: "input_image", image_url: "data:image/png;base64,iVBORw0KGgo=", detail: "auto" };
    const input = [{ role: "user", content: [{ type: "input_text", text: "What is this?" }, image] }];
    const refused = await request("POST", "/v1/responses", { input });
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error?.message, "input[0].content[1]: this model does not take images");

    const vision = buildServer({
      engine,
      tokenizer,
      chatTemplate: new ChatTemplate(templateSource, { bosToken: null, eosToken: "<|im_end|>" }),
      servedModelName: "test-vlm",
      maxModelLen: 4096,
      eosTokenIds: [EOS],
      vocabSize: 151936,
      vision: { imageToken: "<|image_pad|>", imageTokenId: 151655, tokensPerImage: 3 },
    });
    try {
      await script("A picture.");
      const response = await vision.app.inject({ method: "POST", url: "/v1/responses", headers: { "content-type": "application/json" }, payload: JSON.stringify({ input }) });
      assert.equal(response.statusCode, 200, response.body);
      const media = engine.submitted.at(-1)?.media;
      assert.equal(media?.images.length, 1);
      assert.deepEqual(Array.from(media?.images[0] ?? []), [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
      assert.equal(engine.submitted.at(-1)?.promptIds.filter((id) => id === 151655).length, 3);
    } finally {
      await vision.app.close();
    }
  });

  test("background: cancel aborts the engine request and keeps the output so far", async () => {
    await script("a b c d e f g h i j k l m n o p q r s t u v w x y z ".repeat(20), { delayMs: 5 });
    const created = (await request("POST", "/v1/responses", { input: "x", background: true })).body;
    assert.equal(created.status, "queued");
    const engineId = engine.submitted.at(-1)?.id as number;
    let polled = created;
    while (polled.output.length === 0) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      polled = (await request("GET", `/v1/responses/${created.id as string}`)).body;
    }
    assert.equal(polled.status, "in_progress");
    const cancelled = (await request("POST", `/v1/responses/${created.id as string}/cancel`)).body;
    assert.equal(cancelled.status, "cancelled");
    assert.ok(engine.aborted.has(engineId));
    assert.equal(cancelled.output[0]?.status, "incomplete");
    assert.ok(cancelled.usage.output_tokens > 0);
    const text = cancelled.output[0]?.content?.[0]?.text;
    await new Promise((resolve) => setTimeout(resolve, 30));
    const after = (await request("GET", `/v1/responses/${created.id as string}`)).body;
    assert.equal(after.output[0]?.content?.[0]?.text, text, "nothing more arrives");
    // Streamed in the background: queued first, in progress with the first output.
    await script("Short.</think>\n\nDone.");
    const streamed = events((await request("POST", "/v1/responses", { input: "x", background: true, stream: true })).text);
    assert.deepEqual(
      streamed.slice(0, 4).map((e) => [e.type, e.response?.status ?? e.item?.type]),
      [
        ["response.created", "queued"],
        ["response.queued", "queued"],
        ["response.in_progress", "in_progress"],
        ["response.output_item.added", "reasoning"],
      ],
    );
    assert.equal(streamed.at(-1)?.response?.status, "completed");
    // Deleting a running background response cancels it too.
    await script("z ".repeat(200), { delayMs: 5 });
    const other = (await request("POST", "/v1/responses", { input: "x", background: true })).body;
    const otherEngineId = engine.submitted.at(-1)?.id as number;
    assert.equal((await request("DELETE", `/v1/responses/${other.id as string}`)).body.deleted, true);
    assert.ok(engine.aborted.has(otherEngineId));
    assert.equal((await request("GET", `/v1/responses/${other.id as string}`)).status, 404);
  });
});
