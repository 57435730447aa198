// API fidelity with the official clients against the demo model: every
// parameter users bring from vLLM (sampling knobs, stop strings, n, logprobs,
// echo, prompt forms, chat roles and template options), the extra endpoints
// (/tokenize, /detokenize, /version, /generate), and the official Python
// client (test/e2e/openai_python_client.py) against the same server.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { parseMetrics } from "../observability/prom-text.js";
import { demoModelDir, postJson, python, repoRoot, startServer, type RunningServer } from "./harness.js";

const MODEL = "baton-demo";

interface TokenizeResponse {
  count: number;
  max_model_len: number;
  tokens: number[];
  token_strs: string[] | null;
}

type Extra = Record<string, unknown>;

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** Token counts only (cached_tokens depends on what ran before). */
function counts(usage: Usage | null | undefined): Usage | null {
  return usage ? { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens, total_tokens: usage.total_tokens } : null;
}

describe("API fidelity (demo model)", () => {
  let server: RunningServer;
  let client: OpenAI;
  let url: string;

  const tokenize = async (body: object): Promise<TokenizeResponse> => {
    const r = await postJson<TokenizeResponse>(`${url}/tokenize`, body);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body;
  };
  const detokenize = async (tokens: number[]): Promise<string> => (await postJson<{ prompt: string }>(`${url}/detokenize`, { tokens })).body.prompt;
  const completion = (params: Extra) => client.completions.create({ model: MODEL, ...params } as never) as Promise<OpenAI.Completions.Completion>;
  const streamCompletion = async (params: Extra) => {
    const stream = (await client.completions.create({ model: MODEL, ...params, stream: true } as never)) as unknown as AsyncIterable<OpenAI.Completions.Completion>;
    const texts = new Map<number, string[]>();
    const finish = new Map<number, string | null>();
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        texts.set(c.index, [...(texts.get(c.index) ?? []), c.text]);
        if (c.finish_reason) finish.set(c.index, c.finish_reason);
      }
      if (chunk.usage) usage = chunk.usage;
    }
    return { texts, finish, usage };
  };

  before(async () => {
    server = await startServer([demoModelDir, "--served-model-name", MODEL, "--max-num-batched-tokens", "256"]);
    url = server.url;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  test("completions: streamed text equals non-streamed text at temperature 0; usage matches the tokenizer", async () => {
    const params = { prompt: "The history of the sea", max_tokens: 14, temperature: 0, return_token_ids: true };
    const full = await completion(params);
    const choice = full.choices[0] as OpenAI.Completions.CompletionChoice & { token_ids: number[] };
    const streamed = await streamCompletion({ ...params, stream_options: { include_usage: true } });
    assert.equal(streamed.texts.get(0)?.join(""), choice.text);
    assert.deepEqual(counts(streamed.usage), counts(full.usage));
    assert.equal(full.usage?.prompt_tokens, (await tokenize({ model: MODEL, prompt: params.prompt })).count);
    assert.equal(full.usage?.completion_tokens, choice.token_ids.length);
    assert.equal(await detokenize(choice.token_ids), choice.text);
  });

  test("completions: max_tokens defaults to 16 (vLLM)", async () => {
    const full = await completion({ prompt: "Default length", temperature: 0, ignore_eos: true });
    assert.equal(full.usage?.completion_tokens, 16);
  });

  test("a stop string spanning tokens ends the request and never leaks into the stream", async () => {
    const prompt = "Stop strings across tokens:";
    const full = await completion({ prompt, max_tokens: 24, temperature: 0, ignore_eos: true, return_token_ids: true });
    const ids = (full.choices[0] as unknown as { token_ids: number[] }).token_ids;
    const text = full.choices[0]?.text ?? "";
    // Find a token boundary with two plain characters on each side, first occurrence in the text.
    let stop: string | null = null;
    let cut = -1;
    for (let k = 2; k < ids.length - 2 && stop === null; k++) {
      const boundary = (await detokenize(ids.slice(0, k))).length;
      const candidate = text.slice(boundary - 2, boundary + 2);
      if (candidate.length === 4 && !/[\ud800-\udfff\ufffd]/.test(candidate) && text.indexOf(candidate) === boundary - 2) {
        stop = candidate;
        cut = boundary - 2;
      }
    }
    assert.ok(stop !== null, `no usable token boundary in ${JSON.stringify(text)}`);
    const finishes = async (): Promise<Map<string, number>> => parseMetrics(await (await fetch(`${url}/metrics`)).text());
    const before = await finishes();
    const stopped = await completion({ prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stop: [stop, "never-appears-xyz"] });
    assert.equal(stopped.choices[0]?.text, text.slice(0, cut));
    assert.equal(stopped.choices[0]?.finish_reason, "stop");
    // Counted as vLLM counts it: a "stop" finish, not an abort.
    const after = await finishes();
    const delta = (reason: string): number => {
      const key = `vllm:request_success_total{model_name="${MODEL}",finished_reason="${reason}"}`;
      return (after.get(key) ?? 0) - (before.get(key) ?? 0);
    };
    assert.deepEqual([delta("stop"), delta("abort")], [1, 0]);
    assert.equal((stopped.choices[0] as unknown as { stop_reason: string }).stop_reason, stop);
    const streamed = await streamCompletion({ prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stop });
    const pieces = streamed.texts.get(0) ?? [];
    assert.equal(pieces.join(""), text.slice(0, cut), JSON.stringify(pieces));
    assert.equal(streamed.finish.get(0), "stop");
    // include_stop_str_in_output (vLLM) keeps it.
    const kept = await completion({ prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stop, include_stop_str_in_output: true });
    assert.equal(kept.choices[0]?.text, text.slice(0, cut) + stop);
  });

  test("stop_token_ids end the request with stop_reason = the id; ignore_eos and min_tokens", async () => {
    const prompt = "Stop token ids";
    const full = await completion({ prompt, max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true });
    const ids = (full.choices[0] as unknown as { token_ids: number[] }).token_ids;
    const at = ids.findIndex((id, i) => i >= 2 && ids.indexOf(id) === i);
    const stopId = ids[at] as number;
    const stopped = await completion({ prompt, max_tokens: 10, temperature: 0, ignore_eos: true, stop_token_ids: [stopId], return_token_ids: true });
    const choice = stopped.choices[0] as unknown as { token_ids: number[]; finish_reason: string; stop_reason: number };
    assert.deepEqual(choice.token_ids, ids.slice(0, at + 1));
    assert.equal(choice.finish_reason, "stop");
    assert.equal(choice.stop_reason, stopId);
    assert.equal(stopped.usage?.completion_tokens, at + 1);
    // min_tokens masks the stop id until that many tokens are out.
    const first = ids[0] as number;
    const min = await completion({ prompt, max_tokens: 8, temperature: 0, stop_token_ids: [first], min_tokens: 4, ignore_eos: true, return_token_ids: true });
    const minIds = (min.choices[0] as unknown as { token_ids: number[] }).token_ids;
    assert.ok(minIds.length >= 4, JSON.stringify(minIds));
    assert.ok(!minIds.slice(0, 4).includes(first));
  });

  test("n=3 gives three distinct choices; seeded, streamed the same; all sampling knobs accepted", async () => {
    const params = {
      prompt: "Three different endings:",
      max_tokens: 8,
      n: 3,
      temperature: 1.0,
      top_p: 0.95,
      top_k: 100,
      min_p: 0.01,
      presence_penalty: 0.3,
      frequency_penalty: 0.3,
      repetition_penalty: 1.05,
      seed: 42,
      ignore_eos: true,
      user: "someone",
    };
    const full = await completion(params);
    assert.deepEqual(full.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(new Set(full.choices.map((c) => c.text)).size, 3, JSON.stringify(full.choices));
    assert.equal(full.usage?.completion_tokens, 24);
    assert.equal(full.usage?.prompt_tokens, (await tokenize({ prompt: params.prompt })).count);
    const streamed = await streamCompletion(params);
    for (const c of full.choices) assert.equal(streamed.texts.get(c.index)?.join(""), c.text);
    const again = await completion(params);
    assert.deepEqual(again.choices.map((c) => c.text), full.choices.map((c) => c.text));
  });

  test("prompt forms: a string, a list of strings, token ids, a list of token-id lists", async () => {
    const a = "First prompt";
    const b = "Second prompt here";
    const idsA = (await tokenize({ prompt: a })).tokens;
    const idsB = (await tokenize({ prompt: b })).tokens;
    const base = { max_tokens: 5, temperature: 0, ignore_eos: true };
    const single = await completion({ ...base, prompt: a });
    const fromIds = await completion({ ...base, prompt: idsA });
    assert.equal(fromIds.choices[0]?.text, single.choices[0]?.text);
    const list = await completion({ ...base, prompt: [a, b], n: 2 });
    assert.deepEqual(list.choices.map((c) => c.index), [0, 1, 2, 3]);
    assert.equal(list.choices[0]?.text, single.choices[0]?.text);
    assert.equal(list.usage?.prompt_tokens, idsA.length + idsB.length);
    assert.equal(list.usage?.completion_tokens, 20);
    const idLists = await completion({ ...base, prompt: [idsA, idsB] });
    assert.deepEqual(idLists.choices.map((c) => c.text), [list.choices[0]?.text, list.choices[2]?.text]);
  });

  test("completions logprobs and echo", async () => {
    const prompt = "Echo me";
    const promptIds = (await tokenize({ prompt })).tokens;
    const r = await completion({ prompt, max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: 3, echo: true });
    const c = r.choices[0] as OpenAI.Completions.CompletionChoice;
    assert.ok(c.text.startsWith(prompt));
    const lp = c.logprobs as Required<OpenAI.Completions.CompletionChoice.Logprobs>;
    assert.equal(lp.tokens.length, promptIds.length + 4);
    assert.equal(lp.token_logprobs[0], null, "the first prompt token has no logprob");
    assert.equal(lp.top_logprobs[0], null);
    assert.ok(lp.token_logprobs.slice(1).every((v) => typeof v === "number"), "every other token has one");
    const generated = lp.token_logprobs.slice(promptIds.length) as number[];
    for (const [i, value] of generated.entries()) {
      const top = lp.top_logprobs[promptIds.length + i] as Record<string, number>;
      assert.ok(Object.keys(top).length >= 3 && Object.keys(top).length <= 4);
      // Greedy: the sampled token is the most likely one.
      assert.ok(Math.abs(Math.max(...Object.values(top)) - value) < 1e-6);
    }
    assert.equal(c.text, lp.tokens.join(""));
    assert.deepEqual(lp.text_offset.slice(0, 2), [0, (lp.tokens[0] as string).length]);
    const plain = await completion({ prompt, max_tokens: 4, temperature: 0, ignore_eos: true, logprobs: 0 });
    assert.equal(prompt + plain.choices[0]?.text, c.text);
    // logprobs 0: each position shows the chosen token alone (vLLM).
    const plainLogprobs = plain.choices[0]?.logprobs as Required<OpenAI.Completions.CompletionChoice.Logprobs>;
    assert.deepEqual(
      plainLogprobs.top_logprobs,
      plainLogprobs.tokens.map((t, i) => ({ [t]: plainLogprobs.token_logprobs[i] })),
    );
  });

  test("chat: every role, content parts, logprobs, streamed equals non-streamed, usage", async () => {
    const messages = [
      { role: "system", content: "You are terse." },
      { role: "user", content: [{ type: "text", text: "Call the tool." }, { type: "text", text: "Please." }] },
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "f", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "call_1", content: "42" },
      { role: "user", content: "And now?" },
    ] as OpenAI.Chat.ChatCompletionMessageParam[];
    const params = { model: MODEL, messages, max_completion_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 };
    const full = await client.chat.completions.create(params);
    const content = full.choices[0]?.logprobs?.content ?? [];
    assert.equal(content.length, full.usage?.completion_tokens);
    for (const entry of content) assert.equal(entry.top_logprobs.length, 2);
    // Tokens join to the content, and so do their bytes (a character split over tokens: "" then the character).
    assert.equal(content.map((e) => e.token).join(""), full.choices[0]?.message.content);
    assert.deepEqual(content.flatMap((e) => e.bytes ?? []), [...Buffer.from(full.choices[0]?.message.content ?? "", "utf8")]);
    assert.equal(full.usage?.prompt_tokens, (await tokenize({ messages })).count);
    const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = "";
    let streamedLogprobs: OpenAI.Chat.ChatCompletionTokenLogprob[] = [];
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      streamedLogprobs = streamedLogprobs.concat(chunk.choices[0]?.logprobs?.content ?? []);
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, full.choices[0]?.message.content);
    // cached_tokens differs: the second request hits the prefix cache.
    assert.deepEqual(counts(usage), counts(full.usage));
    assert.deepEqual(streamedLogprobs.map((e) => e.token), content.map((e) => e.token));
  });

  test("chat: n=3, chat_template_kwargs, add_generation_prompt and continue_final_message", async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Pick a number." }];
    const many = await client.chat.completions.create({ model: MODEL, messages, n: 3, max_tokens: 6, temperature: 1, seed: 5 });
    assert.deepEqual(many.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(new Set(many.choices.map((c) => c.message.content)).size, 3);

    const thinking = await tokenize({ messages });
    const noThinking = await tokenize({ messages, chat_template_kwargs: { enable_thinking: false } });
    assert.ok(noThinking.count > thinking.count, "enable_thinking=false adds the empty think block");
    const chat = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 2, temperature: 0, chat_template_kwargs: { enable_thinking: false } } as never) as OpenAI.Chat.ChatCompletion;
    assert.equal(chat.usage?.prompt_tokens, noThinking.count);
    const noGen = await tokenize({ messages, add_generation_prompt: false });
    assert.ok(noGen.count < thinking.count);

    const partial: OpenAI.Chat.ChatCompletionMessageParam[] = [...messages, { role: "assistant", content: "My number is" }];
    const cont = await tokenize({ messages: partial, add_generation_prompt: false, continue_final_message: true });
    assert.ok((await detokenize(cont.tokens)).endsWith("My number is"));
    const continued = await client.chat.completions.create({
      model: MODEL, messages: partial, max_tokens: 3, temperature: 0, add_generation_prompt: false, continue_final_message: true,
    } as never) as OpenAI.Chat.ChatCompletion;
    assert.equal(continued.usage?.prompt_tokens, cont.count);
  });

  test("/tokenize, /detokenize and /version have vLLM's shapes", async () => {
    const t = await tokenize({ model: MODEL, prompt: "hello world", return_token_strs: true });
    assert.deepEqual(Object.keys(t).sort(), ["count", "max_model_len", "token_strs", "tokens"]);
    assert.equal(t.count, t.tokens.length);
    assert.equal(t.max_model_len, 4096);
    assert.deepEqual(t.token_strs, ["hello", " world"]);
    assert.equal(await detokenize(t.tokens), "hello world");
    const version = (await (await fetch(`${url}/version`)).json()) as { version: string };
    assert.match(version.version, /^\d+\.\d+\.\d+/);
  });

  test("/generate: NDJSON stream of ids and text, equal to the non-stream form", async () => {
    const promptIds = (await tokenize({ prompt: "Native" })).tokens;
    const body = { prompt_token_ids: promptIds, prompt: " endpoint", max_tokens: 6, temperature: 0, ignore_eos: true, logprobs: 1 };
    const whole = await postJson<{ token_ids: number[]; text: string; prompt_token_ids: number[]; finish_reason: string; usage: Usage; logprobs: unknown[] }>(
      `${url}/generate`, { ...body, stream: false },
    );
    assert.equal(whole.status, 200, JSON.stringify(whole.body));
    assert.deepEqual(whole.body.prompt_token_ids.slice(0, promptIds.length), promptIds);
    assert.equal(whole.body.token_ids.length, 6);
    assert.equal(whole.body.logprobs.length, 6);
    const response = await fetch(`${url}/generate`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /ndjson/);
    const lines = (await response.text()).trim().split("\n").map((l) => JSON.parse(l) as { token_ids: number[]; text: string; finish_reason: string | null; usage?: Usage });
    const last = lines.pop();
    assert.deepEqual(lines.flatMap((l) => l.token_ids), whole.body.token_ids);
    assert.equal(lines.map((l) => l.text).join(""), whole.body.text);
    assert.equal(lines.at(-1)?.finish_reason, "length");
    assert.deepEqual(counts(last?.usage), counts(whole.body.usage));
  });

  test("the official Python client (openai in .venv) agrees", () => {
    const result = spawnSync(python, [join(repoRoot, "test", "e2e", "openai_python_client.py"), url, MODEL], { encoding: "utf8", timeout: 120_000 });
    assert.equal(result.status, 0, `${result.stdout}\n${result.stderr}`);
    const report = JSON.parse(result.stdout.trim().split("\n").at(-1) ?? "{}") as { ok: boolean; checks: number };
    assert.ok(report.ok && report.checks >= 14, result.stdout);
  });
});
