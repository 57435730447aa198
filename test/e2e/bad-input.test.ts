// Every bad request gets a precise error in OpenAI's shape
// {"error": {"message", "type", "param", "code"}} with the right status, from
// the real server (CLI + worker), and the server keeps serving: a normal
// request succeeds after every batch of bad ones.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { demoModelDir, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";
const VOCAB = 151936;
const MAX_MODEL_LEN = 4096;
const BODY_LIMIT = 1024 * 1024;

type Body = Record<string, unknown> | { raw: string | Buffer; contentType?: string };

interface Case {
  name: string;
  path: string;
  body: Body;
  status: number;
  param?: string | null;
  message?: RegExp;
  method?: "GET" | "POST";
}

const C = "/v1/completions";
const H = "/v1/chat/completions";
const cmp = (patch: Record<string, unknown>): Record<string, unknown> => ({ model: MODEL, prompt: "hello", max_tokens: 2, ...patch });
const chat = (patch: Record<string, unknown>): Record<string, unknown> => ({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 2, ...patch });
const raw = (text: string | Buffer, contentType = "application/json"): Body => ({ raw: text, contentType });
const ids = (n: number): number[] => Array.from({ length: n }, (_, i) => 100 + (i % 1000));

const cases: Case[] = [
  // The body itself.
  { name: "malformed JSON", path: C, body: raw("{"), status: 400, message: /invalid JSON/ },
  { name: "truncated JSON", path: C, body: raw('{"prompt": "x"'), status: 400, message: /invalid JSON/ },
  { name: "trailing garbage after JSON", path: C, body: raw('{"prompt": "x"} x'), status: 400, message: /invalid JSON/ },
  { name: "single quotes", path: C, body: raw("{'prompt': 'x'}"), status: 400, message: /invalid JSON/ },
  { name: "empty body", path: C, body: raw(""), status: 400, message: /empty/ },
  { name: "body is an array", path: C, body: raw("[1, 2]"), status: 400, message: /must be a JSON object/ },
  { name: "body is a string", path: C, body: raw('"hello"'), status: 400, message: /must be a JSON object/ },
  { name: "body is a number", path: C, body: raw("5"), status: 400, message: /must be a JSON object/ },
  { name: "body is null", path: H, body: raw("null"), status: 400, message: /must be a JSON object/ },
  { name: "invalid UTF-8 in a string", path: C, body: raw(Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')])), status: 400, message: /UTF-8/ },
  { name: "overlong UTF-8 encoding", path: H, body: raw(Buffer.concat([Buffer.from('{"x": "'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}')])), status: 400, message: /UTF-8/ },
  { name: "truncated UTF-8 sequence", path: C, body: raw(Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xe2, 0x82]), Buffer.from('"}')])), status: 400, message: /UTF-8/ },
  { name: "body over the size limit", path: C, body: raw(JSON.stringify(cmp({ prompt: "x".repeat(BODY_LIMIT + 10) }))), status: 413 },
  { name: "huge token-id list over the size limit", path: C, body: raw(JSON.stringify(cmp({ prompt: ids(300_000) }))), status: 413 },
  { name: "wrong content type", path: C, body: raw("prompt=x", "text/plain"), status: 415 },
  // Pooling routes on a generating model.
  { name: "embeddings on a generating model", path: "/v1/embeddings", body: { input: "the cat" }, status: 400, message: /generates text; \/v1\/embeddings needs a pooling model/ },
  { name: "score on a generating model", path: "/score", body: { text_1: "a", text_2: "b" }, status: 400, message: /generates text; \/score needs a pooling model/ },
  { name: "rerank on a generating model", path: "/rerank", body: { query: "a", documents: ["b"] }, status: 400, message: /generates text; \/rerank needs a pooling model/ },
  // Model.
  { name: "unknown model", path: C, body: cmp({ model: "gpt-4" }), status: 404, param: "model", message: /gpt-4.*does not exist/ },
  { name: "unknown model (chat)", path: H, body: chat({ model: "llama" }), status: 404, param: "model" },
  { name: "model a number", path: C, body: cmp({ model: 7 }), status: 400, param: "model", message: /model must be a string/ },
  // Completion prompts.
  { name: "prompt missing", path: C, body: { model: MODEL, max_tokens: 2 }, status: 400, param: "prompt", message: /prompt is required/ },
  { name: "prompt a number", path: C, body: cmp({ prompt: 5 }), status: 400, param: "prompt" },
  { name: "prompt an object", path: C, body: cmp({ prompt: { text: "x" } }), status: 400, param: "prompt" },
  { name: "prompt an empty list", path: C, body: cmp({ prompt: [] }), status: 400, param: "prompt", message: /must not be empty/ },
  { name: "prompt an empty string", path: C, body: cmp({ prompt: "" }), status: 400, param: "prompt", message: /empty/ },
  { name: "prompt ids negative", path: C, body: cmp({ prompt: [1, -3] }), status: 400, param: "prompt[1]" },
  { name: "prompt ids over the vocabulary", path: C, body: cmp({ prompt: [1, VOCAB] }), status: 400, param: "prompt[1]", message: /between 0 and 151935/ },
  { name: "prompt ids fractional", path: C, body: cmp({ prompt: [1.5] }), status: 400, param: "prompt[0]" },
  { name: "prompt list mixing strings and numbers", path: C, body: cmp({ prompt: ["a", 1] }), status: 400, param: "prompt[1]" },
  { name: "prompt list with an empty id list", path: C, body: cmp({ prompt: [[1], []] }), status: 400, param: "prompt[1]" },
  { name: "prompt + max_tokens over max_model_len", path: C, body: cmp({ prompt: ids(4090), max_tokens: 10 }), status: 400, param: "max_tokens", message: /maximum context length is 4096 tokens.*4100 tokens \(4090 in the prompt, 10 for the completion\)/ },
  { name: "prompt longer than the context", path: C, body: cmp({ prompt: ids(5000) }), status: 400, param: "prompt", message: /4096 tokens.*5000 tokens/ },
  // Sampling parameters.
  { name: "max_tokens a string", path: C, body: cmp({ max_tokens: "4" }), status: 400, param: "max_tokens", message: /must be an integer/ },
  { name: "max_tokens zero without echo", path: C, body: cmp({ max_tokens: 0 }), status: 400, param: "max_tokens", message: /at least 1 \(0 is allowed only with echo\)/ },
  { name: "max_tokens negative", path: C, body: cmp({ max_tokens: -5 }), status: 400, param: "max_tokens" },
  { name: "max_tokens fractional", path: C, body: cmp({ max_tokens: 1.5 }), status: 400, param: "max_tokens", message: /integer/ },
  { name: "temperature negative", path: C, body: cmp({ temperature: -1 }), status: 400, param: "temperature", message: /at least 0/ },
  { name: "temperature a string", path: C, body: cmp({ temperature: "hot" }), status: 400, param: "temperature", message: /must be a number/ },
  { name: "temperature a boolean", path: H, body: chat({ temperature: true }), status: 400, param: "temperature" },
  { name: "top_p zero", path: C, body: cmp({ top_p: 0 }), status: 400, param: "top_p" },
  { name: "top_p above 1", path: C, body: cmp({ top_p: 1.5 }), status: 400, param: "top_p", message: /\(0, 1\]/ },
  { name: "top_k below -1", path: C, body: cmp({ top_k: -2 }), status: 400, param: "top_k" },
  { name: "top_k fractional", path: C, body: cmp({ top_k: 2.5 }), status: 400, param: "top_k" },
  { name: "min_p negative", path: C, body: cmp({ min_p: -0.1 }), status: 400, param: "min_p" },
  { name: "min_p above 1", path: C, body: cmp({ min_p: 2 }), status: 400, param: "min_p" },
  { name: "presence_penalty above 2", path: C, body: cmp({ presence_penalty: 3 }), status: 400, param: "presence_penalty" },
  { name: "frequency_penalty below -2", path: H, body: chat({ frequency_penalty: -3 }), status: 400, param: "frequency_penalty" },
  { name: "repetition_penalty zero", path: C, body: cmp({ repetition_penalty: 0 }), status: 400, param: "repetition_penalty" },
  { name: "seed a string", path: C, body: cmp({ seed: "42" }), status: 400, param: "seed" },
  { name: "seed fractional", path: C, body: cmp({ seed: 1.5 }), status: 400, param: "seed" },
  { name: "stop a number", path: C, body: cmp({ stop: 5 }), status: 400, param: "stop" },
  { name: "stop an empty string", path: C, body: cmp({ stop: "" }), status: 400, param: "stop" },
  { name: "stop list with an empty string", path: C, body: cmp({ stop: ["a", ""] }), status: 400, param: "stop[1]" },
  { name: "stop list with a number", path: H, body: chat({ stop: ["a", 1] }), status: 400, param: "stop", message: /stop must be a non-empty string or a list of non-empty strings/ },
  { name: "stop_token_ids negative", path: C, body: cmp({ stop_token_ids: [-1] }), status: 400, param: "stop_token_ids[0]" },
  { name: "stop_token_ids not a list", path: C, body: cmp({ stop_token_ids: "x" }), status: 400, param: "stop_token_ids" },
  { name: "stop_token_ids over the vocabulary", path: C, body: cmp({ stop_token_ids: [VOCAB + 5] }), status: 400, param: "stop_token_ids[0]" },
  { name: "ignore_eos a string", path: C, body: cmp({ ignore_eos: "yes" }), status: 400, param: "ignore_eos", message: /boolean/ },
  { name: "min_tokens negative", path: C, body: cmp({ min_tokens: -1 }), status: 400, param: "min_tokens" },
  { name: "min_tokens above max_tokens", path: C, body: cmp({ min_tokens: 5, max_tokens: 2 }), status: 400, param: "min_tokens", message: /min_tokens \(5\) must not exceed max_tokens \(2\)/ },
  { name: "n zero", path: C, body: cmp({ n: 0 }), status: 400, param: "n" },
  { name: "n too large", path: C, body: cmp({ n: 1000 }), status: 400, param: "n", message: /at most 128/ },
  { name: "n a string", path: H, body: chat({ n: "2" }), status: 400, param: "n" },
  { name: "n times prompts too large", path: C, body: cmp({ prompt: Array.from({ length: 20 }, () => "x"), n: 10 }), status: 400, param: "n" },
  { name: "best_of above n", path: C, body: cmp({ best_of: 3 }), status: 400, param: "best_of" },
  { name: "logprobs above 20", path: C, body: cmp({ logprobs: 21 }), status: 400, param: "logprobs" },
  { name: "logprobs negative", path: C, body: cmp({ logprobs: -1 }), status: 400, param: "logprobs" },
  { name: "logprobs a boolean on completions", path: C, body: cmp({ logprobs: true }), status: 400, param: "logprobs", message: /integer/ },
  { name: "echo a string", path: C, body: cmp({ echo: "yes" }), status: 400, param: "echo" },
  { name: "logit_bias a list", path: C, body: cmp({ logit_bias: [1, 5] }), status: 400, param: "logit_bias", message: /must be an object/ },
  { name: "logit_bias key not a token id", path: C, body: cmp({ logit_bias: { abc: 5 } }), status: 400, param: "logit_bias.abc", message: /token ids between 0 and 151935/ },
  { name: "logit_bias key over the vocabulary", path: H, body: chat({ logit_bias: { [String(VOCAB)]: 5 } }), status: 400, param: `logit_bias.${VOCAB}` },
  { name: "logit_bias key negative", path: C, body: cmp({ logit_bias: { "-3": 5 } }), status: 400, param: "logit_bias.-3" },
  { name: "logit_bias one token twice", path: C, body: cmp({ logit_bias: { "7": 1, "007": 2 } }), status: 400, param: "logit_bias.007", message: /token 7 twice/ },
  { name: "logit_bias value above 100", path: C, body: cmp({ logit_bias: { "7": 101 } }), status: 400, param: "logit_bias.7", message: /\[-100, 100\]/ },
  { name: "logit_bias value a string", path: H, body: chat({ logit_bias: { "7": "up" } }), status: 400, param: "logit_bias.7", message: /number/ },
  { name: "allowed_token_ids empty", path: C, body: cmp({ allowed_token_ids: [] }), status: 400, param: "allowed_token_ids", message: /must not be empty/ },
  { name: "allowed_token_ids over the vocabulary", path: C, body: cmp({ allowed_token_ids: [3, VOCAB] }), status: 400, param: "allowed_token_ids[1]" },
  { name: "allowed_token_ids only stop tokens under min_tokens", path: C, body: cmp({ allowed_token_ids: [9], stop_token_ids: [9], min_tokens: 2, max_tokens: 4 }), status: 400, param: "allowed_token_ids", message: /min_tokens \(2\) forbids/ },
  { name: "allowed_token_ids with a JSON schema", path: H, body: chat({ allowed_token_ids: [3], response_format: { type: "json_object" } }), status: 400, param: "allowed_token_ids", message: /structured output/ },
  { name: "suffix not supported", path: C, body: cmp({ suffix: "end" }), status: 400, param: "suffix" },
  { name: "user a number", path: C, body: cmp({ user: 5 }), status: 400, param: "user" },
  { name: "stream a number", path: C, body: cmp({ stream: 1 }), status: 400, param: "stream" },
  { name: "stream_options without stream", path: C, body: cmp({ stream_options: { include_usage: true } }), status: 400, param: "stream_options" },
  { name: "include_usage a string", path: H, body: chat({ stream: true, stream_options: { include_usage: "y" } }), status: 400, param: "stream_options.include_usage" },
  // Chat messages and options.
  { name: "messages missing", path: H, body: { model: MODEL }, status: 400, param: "messages" },
  { name: "messages empty", path: H, body: chat({ messages: [] }), status: 400, param: "messages", message: /must not be empty/ },
  { name: "messages not a list", path: H, body: chat({ messages: "hi" }), status: 400, param: "messages" },
  { name: "message not an object", path: H, body: chat({ messages: ["hi"] }), status: 400, param: "messages[0]" },
  { name: "message without a role", path: H, body: chat({ messages: [{ content: "x" }] }), status: 400, param: "messages[0].role" },
  { name: "role a number", path: H, body: chat({ messages: [{ role: 1, content: "x" }] }), status: 400, param: "messages[0].role" },
  { name: "unknown role", path: H, body: chat({ messages: [{ role: "user", content: "x" }, { role: "wizard", content: "y" }] }), status: 400, param: "messages[1].role", message: /unknown role "wizard"/ },
  { name: "prompt_logprobs above 20", path: C, body: cmp({ prompt_logprobs: 21 }), status: 400, param: "prompt_logprobs" },
  { name: "prompt_logprobs negative (chat)", path: H, body: chat({ prompt_logprobs: -1 }), status: 400, param: "prompt_logprobs" },
  { name: "content a number", path: H, body: chat({ messages: [{ role: "user", content: 5 }] }), status: 400, param: "messages[0].content" },
  { name: "image content part", path: H, body: chat({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }), status: 400, param: "messages[0].content[0]" },
  { name: "text part without text", path: H, body: chat({ messages: [{ role: "user", content: [{ type: "text" }] }] }), status: 400, param: "messages[0].content[0]" },
  { name: "chat logprobs an integer", path: H, body: chat({ logprobs: 1 }), status: 400, param: "logprobs", message: /boolean/ },
  { name: "top_logprobs above 20", path: H, body: chat({ logprobs: true, top_logprobs: 21 }), status: 400, param: "top_logprobs" },
  { name: "top_logprobs without logprobs", path: H, body: chat({ top_logprobs: 2 }), status: 400, param: "top_logprobs" },
  { name: "max_completion_tokens zero", path: H, body: chat({ max_completion_tokens: 0 }), status: 400, param: "max_completion_tokens" },
  { name: "max_completion_tokens over the context", path: H, body: chat({ max_tokens: undefined, max_completion_tokens: 5000 }), status: 400, param: "max_completion_tokens", message: /maximum context length is 4096 tokens/ },
  { name: "chat_template_kwargs a list", path: H, body: chat({ chat_template_kwargs: [] }), status: 400, param: "chat_template_kwargs" },
  { name: "add_generation_prompt a string", path: H, body: chat({ add_generation_prompt: "no" }), status: 400, param: "add_generation_prompt" },
  { name: "continue_final_message with add_generation_prompt", path: H, body: chat({ continue_final_message: true }), status: 400, param: "continue_final_message" },
  { name: "continue_final_message after a user message", path: H, body: chat({ continue_final_message: true, add_generation_prompt: false }), status: 400, param: "messages" },
  { name: "tools without --enable-auto-tool-choice", path: H, body: chat({ tools: [{ type: "function", function: { name: "f" } }] }), status: 400, param: "tool_choice" },
  { name: "response_format of an unknown type", path: H, body: chat({ response_format: { type: "xml" } }), status: 400, param: "response_format.type" },
  {
    name: "a JSON schema the grammar engine cannot use",
    path: H,
    body: chat({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "nonsense" } } } }),
    status: 400,
    param: "response_format.json_schema.schema",
  },
  // Other routes.
  { name: "tokenize without prompt", path: "/tokenize", body: { model: MODEL }, status: 400, param: "prompt" },
  { name: "tokenize prompt a number", path: "/tokenize", body: { prompt: 5 }, status: 400, param: "prompt" },
  { name: "tokenize unknown model", path: "/tokenize", body: { model: "x", prompt: "a" }, status: 404, param: "model" },
  { name: "detokenize tokens a string", path: "/detokenize", body: { tokens: "x" }, status: 400, param: "tokens" },
  { name: "detokenize token over the vocabulary", path: "/detokenize", body: { tokens: [1, VOCAB] }, status: 400, param: "tokens[1]" },
  { name: "generate without a prompt", path: "/generate", body: { max_tokens: 2 }, status: 400, param: "prompt_token_ids" },
  { name: "generate bad prompt_token_ids", path: "/generate", body: { prompt_token_ids: [1, "a"] }, status: 400, param: "prompt_token_ids[1]" },
  { name: "generate n 2", path: "/generate", body: { prompt: "x", n: 2 }, status: 400, param: "n" },
  { name: "unknown route", path: "/v1/nothing", body: {}, status: 404 },
  { name: "wrong method", path: "/v1/completions", body: {}, status: 405, method: "GET" },
];

interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | number | null };
}

describe("bad input: precise errors, and the server keeps serving", () => {
  let server: RunningServer;

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--max-request-body-bytes", String(BODY_LIMIT)]);
  });

  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  async function send(c: Case): Promise<{ status: number; text: string }> {
    const isRaw = "raw" in c.body;
    const headers: Record<string, string> = {};
    let body: string | Blob | undefined;
    if (c.method !== "GET") {
      headers["content-type"] = isRaw ? ((c.body as { contentType?: string }).contentType ?? "application/json") : "application/json";
      const rawBody = isRaw ? (c.body as { raw: string | Buffer }).raw : JSON.stringify(c.body);
      body = typeof rawBody === "string" ? rawBody : new Blob([new Uint8Array(rawBody)]);
    }
    const response = await fetch(`${server.url}${c.path}`, { method: c.method ?? "POST", headers, body });
    return { status: response.status, text: await response.text() };
  }

  async function assertServes(): Promise<void> {
    const response = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, prompt: "still here", max_tokens: 3, temperature: 0, ignore_eos: true, an_unknown_field: { x: 1 } }),
    });
    assert.equal(response.status, 200);
    const body = (await response.json()) as { usage: { completion_tokens: number } };
    assert.equal(body.usage.completion_tokens, 3);
  }

  test(`the table has at least 60 cases (${cases.length})`, () => {
    assert.ok(cases.length >= 60);
    assert.equal(new Set(cases.map((c) => c.name)).size, cases.length, "case names are unique");
  });

  cases.forEach((c, i) => {
    test(`${c.name} -> ${c.status}`, async () => {
      const { status, text } = await send(c);
      assert.equal(status, c.status, text);
      const body = JSON.parse(text) as ErrorBody;
      assert.deepEqual(Object.keys(body), ["error"], text);
      assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"], text);
      assert.equal(typeof body.error.message, "string");
      assert.ok(body.error.message.length > 0);
      assert.equal(body.error.type, c.status === 404 ? "not_found_error" : "invalid_request_error", text);
      if (c.param !== undefined) assert.equal(body.error.param, c.param, text);
      if (c.message) assert.match(body.error.message, c.message);
      if (i % 20 === 19) await assertServes();
    });
  });

  test("a normal request succeeds after all of them (unknown fields ignored)", async () => {
    await assertServes();
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);
  });

  test("unknown fields are logged at warn level once per field name", async () => {
    await assertServes();
    await assertServes();
    const warnings = server
      .output()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { level: string; field?: string; route?: string })
      .filter((l) => l.field === "an_unknown_field");
    assert.equal(warnings.length, 1, "once, however many requests carry it");
    assert.equal(warnings[0]?.level, "warn");
    assert.equal(warnings[0]?.route, "/v1/completions");
  });

  test("a known path with the wrong method is 405 with Allow", async () => {
    for (const [method, path, allow] of [
      ["GET", "/v1/completions", "POST"],
      ["DELETE", "/v1/chat/completions", "POST"],
      ["POST", "/v1/models", "GET, HEAD"],
      ["PUT", "/v1/models/baton-demo", "GET, HEAD"],
      ["POST", "/health", "GET, HEAD"],
    ] as const) {
      const response = await fetch(`${server.url}${path}`, { method });
      assert.equal(response.status, 405, `${method} ${path}`);
      assert.equal(response.headers.get("allow"), allow, `${method} ${path}`);
      const body = (await response.json()) as ErrorBody;
      assert.match(body.error.message, new RegExp(`${method} is not allowed on ${path}`));
    }
    assert.equal((await fetch(`${server.url}/v1/nothing`, { method: "POST" })).status, 404, "an unknown path stays 404");
  });
});
