// Request validation through the real HTTP server (fastify inject): every bad
// request is answered with a 4xx OpenAI-shaped error before anything reaches
// the engine. The engine here refuses to be called: no request in this file
// may get that far. Generation itself is covered end to end with the real
// engine and worker (test/e2e).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import type { EngineRequest } from "../../src/engine/types.js";
import { buildServer } from "../../src/frontend/server.js";
import { parseChatRequest, parseCompletionRequest } from "../../src/frontend/request-validation.js";
import { resolveMaxTokens, toSamplingParams } from "../../src/frontend/sampling.js";
import { ChatTemplate } from "../../src/text/chat-template.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import { qwenDir, qwenTokenizerPath } from "../text/helpers.js";

const tokenizer = TextTokenizer.fromFile(qwenTokenizerPath);
const templateSource = (JSON.parse(readFileSync(join(qwenDir, "tokenizer_config.json"), "utf8")) as { chat_template: string }).chat_template;
const MAX_MODEL_LEN = 64;
const VOCAB = 151936;

const unreachableEngine = {
  submit(req: EngineRequest): void {
    throw new Error(`the engine must not be reached in validation tests (request ${req.id})`);
  },
  abort(): void {},
};

function server(withTemplate = true) {
  return buildServer({
    engine: unreachableEngine,
    tokenizer,
    chatTemplate: withTemplate ? new ChatTemplate(templateSource, { bosToken: null, eosToken: "<|im_end|>" }) : null,
    servedModelName: "test-model",
    maxModelLen: MAX_MODEL_LEN,
    eosTokenIds: [151645],
    vocabSize: VOCAB,
  });
}

const app = server();
const noTemplate = server(false);
after(async () => {
  await app.app.close();
  await noTemplate.app.close();
});

interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | number | null };
}

async function post(path: string, body: unknown, target = app, raw = false) {
  const response = await target.app.inject({
    method: "POST",
    url: path,
    headers: { "content-type": "application/json" },
    payload: raw ? (body as string) : JSON.stringify(body),
  });
  return { status: response.statusCode, body: response.json() as ErrorBody };
}

function assertError(result: { status: number; body: ErrorBody }, status: number, message: RegExp, param?: string): void {
  assert.equal(result.status, status, JSON.stringify(result.body));
  const { error } = result.body;
  assert.equal(typeof error.message, "string");
  assert.match(error.message, message);
  assert.equal(typeof error.type, "string");
  assert.ok("param" in error && "code" in error, "OpenAI error shape has param and code");
  if (param !== undefined) assert.equal(error.param, param);
}

describe("completions: 400 for bad parameters", () => {
  const base = { model: "test-model", prompt: "hello", max_tokens: 4 };
  const cases: [string, Record<string, unknown>, RegExp, string][] = [
    ["prompt missing", { model: "test-model" }, /prompt is required/, "prompt"],
    ["prompt a number", { prompt: 5 }, /prompt must be a string, a list of strings, a list of token ids/, "prompt"],
    ["prompt ids out of range", { prompt: [1, VOCAB] }, /prompt\[1\].*between 0 and/, "prompt[1]"],
    ["prompt ids not integers", { prompt: [1, 2.5] }, /prompt\[1\]/, "prompt[1]"],
    ["empty id prompt", { prompt: [] }, /must not be empty/, "prompt"],
    ["mixed prompt list", { prompt: ["a", 5] }, /prompt\[1\] must be a string or a list of token ids/, "prompt[1]"],
    ["max_tokens a string", { max_tokens: "4" }, /max_tokens must be an integer/, "max_tokens"],
    ["max_tokens zero", { max_tokens: 0 }, /max_tokens must be at least 1/, "max_tokens"],
    ["temperature negative", { temperature: -0.5 }, /temperature must be at least 0/, "temperature"],
    ["temperature a string", { temperature: "hot" }, /temperature must be a number/, "temperature"],
    ["top_p zero", { top_p: 0 }, /top_p must be in \(0, 1\]/, "top_p"],
    ["top_k fraction", { top_k: 1.5 }, /top_k must be an integer/, "top_k"],
    ["top_k below -1", { top_k: -2 }, /top_k must be/, "top_k"],
    ["min_p above 1", { min_p: 1.5 }, /min_p must be in \[0, 1\]/, "min_p"],
    ["seed fraction", { seed: 1.5 }, /seed must be an integer/, "seed"],
    ["stop_token_ids not a list", { stop_token_ids: 5 }, /stop_token_ids must be a list/, "stop_token_ids"],
    ["stop_token_ids out of range", { stop_token_ids: [-1] }, /stop_token_ids\[0\]/, "stop_token_ids[0]"],
    ["ignore_eos a string", { ignore_eos: "yes" }, /ignore_eos must be a boolean/, "ignore_eos"],
    ["min_tokens above max_tokens", { min_tokens: 5 }, /min_tokens \(5\) must not exceed max_tokens \(4\)/, "min_tokens"],
    ["stream a number", { stream: 1 }, /stream must be a boolean/, "stream"],
    ["stream_options without stream", { stream_options: { include_usage: true } }, /only allowed when stream is true/, "stream_options"],
    ["include_usage a string", { stream: true, stream_options: { include_usage: "y" } }, /include_usage must be a boolean/, "stream_options.include_usage"],
    ["return_token_ids a string", { return_token_ids: "true" }, /return_token_ids must be a boolean/, "return_token_ids"],
    ["empty stop string", { stop: [""] }, /stop\[0\] must be a non-empty string/, "stop[0]"],
    ["n zero", { n: 0 }, /n must be at least 1/, "n"],
    ["logprobs above 20", { logprobs: 21 }, /logprobs must be in \[0, 20\]/, "logprobs"],
    ["model not a string", { model: 7 }, /model must be a string/, "model"],
  ];
  for (const [name, patch, message, param] of cases) {
    test(name, async () => {
      const body = { ...base, ...patch };
      if (name === "prompt missing") delete (body as Record<string, unknown>).prompt;
      assertError(await post("/v1/completions", body), 400, message, param);
    });
  }

  test("prompt + max_tokens over max_model_len names both numbers", async () => {
    const result = await post("/v1/completions", { ...base, prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], max_tokens: 60 });
    assertError(result, 400, /maximum context length is 64 tokens.*70 tokens \(10 in the prompt, 60 for the completion\)/, "max_tokens");
  });

  test("a prompt that fills the context leaves no room", async () => {
    const result = await post("/v1/completions", { model: "test-model", prompt: Array.from({ length: 64 }, () => 1) });
    assertError(result, 400, /maximum context length is 64 tokens.*prompt has 64 tokens/, "prompt");
  });

  test("unknown model is 404", async () => {
    assertError(await post("/v1/completions", { ...base, model: "gpt-4" }), 404, /gpt-4.*does not exist/, "model");
  });

  test("invalid JSON is 400 in OpenAI shape", async () => {
    assertError(await post("/v1/completions", "{ not json", app, true), 400, /JSON/);
  });

  test("a body that is not an object is 400", async () => {
    assertError(await post("/v1/completions", [1, 2]), 400, /must be a JSON object/);
  });
});

describe("chat completions: 400 for bad parameters", () => {
  const base = { model: "test-model", messages: [{ role: "user", content: "hi" }], max_tokens: 4 };
  const cases: [string, Record<string, unknown>, RegExp, string][] = [
    ["messages missing", { messages: undefined }, /messages must be a list/, "messages"],
    ["messages empty", { messages: [] }, /must not be empty/, "messages"],
    ["message without role", { messages: [{ content: "x" }] }, /messages\[0\]\.role/, "messages[0].role"],
    ["content a number", { messages: [{ role: "user", content: 1 }] }, /messages\[0\]\.content/, "messages[0].content"],
    ["image content (a model without vision)", { messages: [{ role: "user", content: [{ type: "image_url" }] }] }, /this model does not take images/, "messages[0].content[0]"],
    ["max_completion_tokens negative", { max_completion_tokens: -1 }, /max_completion_tokens must be at least 1/, "max_completion_tokens"],
    ["chat_template_kwargs a list", { chat_template_kwargs: [] }, /chat_template_kwargs must be an object/, "chat_template_kwargs"],
    ["a tool without a function", { tools: [{ type: "function" }] }, /tools\[0\]\.function must be an object/, "tools[0].function"],
    ["a tool name with spaces", { tools: [{ type: "function", function: { name: "get weather" } }] }, /1 to 64 letters/, "tools[0].function.name"],
    [
      "a function given twice",
      { tools: [{ type: "function", function: { name: "f" } }, { type: "function", function: { name: "f" } }] },
      /given twice/,
      "tools[1].function.name",
    ],
    [
      "a named tool_choice not among tools",
      { tools: [{ type: "function", function: { name: "f" } }], tool_choice: { type: "function", function: { name: "g" } } },
      /names function "g", which is not among tools \(f\)/,
      "tool_choice.function.name",
    ],
    ["tool_choice required without tools", { tool_choice: "required" }, /needs tools/, "tool_choice"],
    ["tool_choice an unknown word", { tools: [{ type: "function", function: { name: "f" } }], tool_choice: "any" }, /must be "none", "auto"/, "tool_choice"],
    [
      "tools (auto by default) on a server without --enable-auto-tool-choice",
      { tools: [{ type: "function", function: { name: "f" } }] },
      /"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser/,
      "tool_choice",
    ],
    ["legacy functions", { functions: [{ name: "f" }] }, /functions are not supported; use tools/, "functions"],
    ["response_format of an unknown type", { response_format: { type: "xml" } }, /response_format type "xml" is not supported/, "response_format.type"],
    ["json_schema without a schema", { response_format: { type: "json_schema", json_schema: { name: "x" } } }, /schema is required/, "response_format.json_schema.schema"],
    ["guided_json that is not JSON", { guided_json: "{not json" }, /guided_json is not valid JSON/, "guided_json"],
    ["guided_choice empty", { guided_choice: [] }, /non-empty list of non-empty strings/, "guided_choice"],
    ["structured_outputs with two kinds", { structured_outputs: { regex: "a", choice: ["b"] } }, /takes one of .*got regex and choice/, "structured_outputs"],
    ["two structured output fields", { response_format: { type: "json_object" }, guided_regex: "a+" }, /one structured output; got response_format and guided_regex/, "guided_regex"],
    ["structured output on a server without a grammar engine", { guided_regex: "a+" }, /structured outputs are not available/, "guided_regex"],
    [
      "a forced tool choice with response_format",
      { tools: [{ type: "function", function: { name: "f" } }], tool_choice: "required", response_format: { type: "json_object" } },
      /cannot be combined with tool_choice "required"/,
      "response_format",
    ],
    ["unknown role", { messages: [{ role: "narrator", content: "x" }] }, /unknown role "narrator" \(expected one of system, developer, user, assistant, tool, function\)/, "messages[0].role"],
  ];
  for (const [name, patch, message, param] of cases) {
    test(name, async () => {
      assertError(await post("/v1/chat/completions", { ...base, ...patch }), 400, message, param);
    });
  }

  test("max_completion_tokens over the context names it", async () => {
    const result = await post("/v1/chat/completions", { ...base, max_tokens: undefined, max_completion_tokens: 1000 });
    assertError(result, 400, /maximum context length is 64 tokens/, "max_completion_tokens");
  });

  test("a model without a chat template is a clear 400", async () => {
    assertError(await post("/v1/chat/completions", base, noTemplate), 400, /has no chat template/);
  });
});

describe("other routes", () => {
  test("GET /v1/models lists the served model", async () => {
    const response = await app.app.inject({ method: "GET", url: "/v1/models" });
    assert.equal(response.statusCode, 200);
    const body = response.json() as { object: string; data: { id: string; object: string; owned_by: string; max_model_len: number }[] };
    assert.equal(body.object, "list");
    assert.deepEqual(
      body.data.map(({ id, object, owned_by, max_model_len }) => ({ id, object, owned_by, max_model_len })),
      [{ id: "test-model", object: "model", owned_by: "baton", max_model_len: MAX_MODEL_LEN }],
    );
  });

  test("GET /v1/models/<other> is 404", async () => {
    const response = await app.app.inject({ method: "GET", url: "/v1/models/nope" });
    assert.equal(response.statusCode, 404);
  });

  test("health is 200 ok, then 503 with the reason once unavailable", async () => {
    const s = server(false);
    try {
      let response = await s.app.inject({ method: "GET", url: "/health" });
      assert.equal(response.statusCode, 200);
      assert.deepEqual(response.json(), { status: "ok" });
      s.setUnavailable("the model worker died");
      response = await s.app.inject({ method: "GET", url: "/health" });
      assert.equal(response.statusCode, 503);
      assert.match(response.body, /worker died/);
      // New requests are refused with 503 too, not sent to a dead engine.
      const result = await post("/v1/completions", { model: "test-model", prompt: "hi", max_tokens: 2 }, s);
      assertError(result, 503, /worker died/);
    } finally {
      await s.app.close();
    }
  });

  test("unknown routes are 404 in OpenAI shape", async () => {
    const response = await app.app.inject({ method: "GET", url: "/v1/nothing" });
    assert.equal(response.statusCode, 404);
    assert.match((response.json() as ErrorBody).error.message, /no route/);
  });
});

describe("parameter mapping", () => {
  const limits = { maxModelLen: 100, eosTokenIds: [7, 8] };

  test("defaults: temperature 1, penalties off, no logprobs", () => {
    const req = parseCompletionRequest({ prompt: "x" }, { vocabSize: VOCAB });
    const params = toSamplingParams(req, limits);
    assert.equal(params.temperature, 1);
    assert.equal(params.top_p, 1);
    assert.equal(params.top_k, 0);
    assert.equal(params.presence_penalty, 0);
    assert.equal(params.frequency_penalty, 0);
    assert.equal(params.repetition_penalty, 1);
    assert.equal(params.logprobs, -1);
    assert.equal(params.seed, null);
    assert.deepEqual([...params.suppress_token_ids], []);
  });

  test("temperature 0 is greedy and turns the truncation knobs off", () => {
    const req = parseCompletionRequest({ prompt: "x", temperature: 0, top_p: 0.5, top_k: 5, min_p: 0.2 }, { vocabSize: VOCAB });
    const params = toSamplingParams(req, limits);
    assert.deepEqual([params.temperature, params.top_p, params.top_k, params.min_p], [0, 1, 0, 0]);
  });

  test("min_tokens suppresses EOS and stop token ids (not EOS with ignore_eos)", () => {
    const req = parseCompletionRequest({ prompt: "x", min_tokens: 3, max_tokens: 5, stop_token_ids: [9, 7] }, { vocabSize: VOCAB });
    assert.deepEqual([...toSamplingParams(req, limits).suppress_token_ids], [7, 8, 9]);
    const ignoring = parseCompletionRequest({ prompt: "x", min_tokens: 3, ignore_eos: true, stop_token_ids: [9] }, { vocabSize: VOCAB });
    assert.deepEqual([...toSamplingParams(ignoring, limits).suppress_token_ids], [9]);
  });

  test("logit_bias and allowed_token_ids reach the worker as id and value columns", () => {
    const req = parseChatRequest(
      { messages: [{ role: "user", content: "x" }], logit_bias: { "50": 2.5, "3": -100 }, allowed_token_ids: [9, 3, 9, 50] },
      { vocabSize: VOCAB },
    );
    const params = toSamplingParams(req, limits);
    assert.deepEqual([...params.logit_bias_ids], [3, 50]); // integer-like keys come in numeric order
    assert.deepEqual([...params.logit_bias_values], [-100, 2.5]);
    assert.deepEqual([...params.allowed_token_ids], [9, 3, 50]);
    const plain = toSamplingParams(parseCompletionRequest({ prompt: "x" }, { vocabSize: VOCAB }), limits);
    assert.deepEqual([plain.logit_bias_ids.length, plain.logit_bias_values.length, plain.allowed_token_ids.length], [0, 0, 0]);
  });

  test("max_tokens defaults to 16 for completions (vLLM) and to the room left in the context for chat", () => {
    assert.equal(parseCompletionRequest({ prompt: "x" }, { vocabSize: VOCAB }).maxTokens, 16);
    const req = parseChatRequest({ messages: [{ role: "user", content: "x" }] }, { vocabSize: VOCAB });
    assert.equal(resolveMaxTokens(req, 30, limits), 70);
  });

  test("a list of one string prompt is that prompt; null means default", () => {
    const req = parseCompletionRequest({ prompt: ["hi"], temperature: null, stream: null }, { vocabSize: VOCAB });
    assert.deepEqual(req.prompts, ["hi"]);
    assert.equal(req.temperature, 1);
    assert.equal(req.stream, false);
  });

  test("chat: max_completion_tokens wins over max_tokens", () => {
    const req = parseChatRequest({ messages: [{ role: "user", content: "x" }], max_tokens: 5, max_completion_tokens: 9 }, { vocabSize: VOCAB });
    assert.equal(req.maxTokens, 9);
    assert.equal(req.maxTokensParam, "max_completion_tokens");
  });

  test("echo: max_tokens 0 returns the prompt alone (one token is generated and dropped); prompt logprobs follow logprobs", () => {
    const only = parseCompletionRequest({ prompt: "x", echo: true, max_tokens: 0, logprobs: 2 }, { vocabSize: VOCAB });
    assert.deepEqual([only.echoOnly, only.maxTokens, only.promptLogprobs], [true, 1, 2]);
    const explicit = parseCompletionRequest({ prompt: "x", echo: true, logprobs: 1, prompt_logprobs: 5 }, { vocabSize: VOCAB });
    assert.deepEqual([explicit.echoOnly, explicit.promptLogprobs], [false, 5]);
    assert.equal(parseCompletionRequest({ prompt: "x", logprobs: 3 }, { vocabSize: VOCAB }).promptLogprobs, -1, "no echo, no prompt logprobs");
    assert.equal(parseCompletionRequest({ prompt: "x", prompt_logprobs: 0 }, { vocabSize: VOCAB }).promptLogprobs, 0);
    assert.equal(parseChatRequest({ messages: [{ role: "user", content: "x" }], prompt_logprobs: 4 }, { vocabSize: VOCAB }).promptLogprobs, 4);
  });

  test("unknown top-level fields are named, known ones are not", () => {
    const req = parseCompletionRequest({ prompt: "x", temprature: 0.5, echo: false, extra_thing: 1 }, { vocabSize: VOCAB });
    assert.deepEqual(req.ignoredFields, ["temprature", "extra_thing"]);
    const chat = parseChatRequest({ messages: [{ role: "user", content: "x" }], logprobs: true, top_logprobs: 1, prompt_logprobs: 1 }, { vocabSize: VOCAB });
    assert.deepEqual(chat.ignoredFields, []);
  });
});

describe("a text model on the image route", () => {
  test("/v1/images/generations is a 400 saying the model does not generate images", async () => {
    const { status, body } = await post("/v1/images/generations", { prompt: "a red fox", n: 1 });
    assert.equal(status, 400);
    assert.match(body.error.message, /model test-model does not generate images/);
  });
});
