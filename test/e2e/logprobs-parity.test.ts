// Logprobs parity: the logprobs Baton returns (chat and completions, greedy
// and sampled) equal transformers' log-softmax over prompt + output on the
// same random float32 weights, within 1e-4.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { makeRandomModel, postJson, python, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";

const TOLERANCE = 1e-4;
const K = 5;

interface Reference {
  chosen: number[];
  top_ids: number[][];
  top_logprobs: number[][];
}

function reference(modelDir: string, cases: { prompt: number[]; output: number[]; k: number }[]): Reference[] {
  const dir = tempDir("lp-ref");
  try {
    writeFileSync(join(dir, "in.json"), JSON.stringify({ cases }));
    const result = spawnSync(python, [join(repoRoot, "test", "e2e", "logprobs-reference.py"), modelDir, join(dir, "in.json"), join(dir, "out.json")], {
      encoding: "utf8",
    });
    assert.equal(result.status, 0, result.stderr);
    return (JSON.parse(readFileSync(join(dir, "out.json"), "utf8")) as { cases: Reference[] }).cases;
  } finally {
    removeDir(dir);
  }
}

describe("logprobs equal transformers' log-softmax (random qwen3, float32)", () => {
  let dir: string;
  let server: RunningServer;
  let client: OpenAI;

  before(async () => {
    dir = tempDir("lp-model");
    makeRandomModel("qwen3", dir, 0);
    server = await startServer([dir, "--served-model-name", "lp", "--dtype", "float32"]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  after(async () => {
    await server?.stop();
    removeDir(dir);
  });

  test("completions (greedy and seeded sampling) and chat", async () => {
    const cases: { prompt: number[]; output: number[]; k: number }[] = [];
    const got: { chosen: number[]; top: number[][] | null }[] = [];

    for (const [prompt, extra] of [
      [[9707, 11, 1879, 0, 576, 3974, 13876], { temperature: 0 }],
      [[785, 3974, 13876, 38835, 34208, 916, 279], { temperature: 1.0, seed: 3 }],
    ] as const) {
      const r = (await client.completions.create({
        model: "lp", prompt: [...prompt], max_tokens: 8, logprobs: K, ignore_eos: true, ...extra, return_token_ids: true,
      } as never)) as OpenAI.Completions.Completion;
      const choice = r.choices[0] as OpenAI.Completions.CompletionChoice & { token_ids: number[] };
      cases.push({ prompt: [...prompt], output: choice.token_ids, k: K });
      const lp = choice.logprobs as Required<OpenAI.Completions.CompletionChoice.Logprobs>;
      assert.equal(lp.token_logprobs.length, choice.token_ids.length);
      // The top dicts are compared by value (their keys are token strings).
      got.push({ chosen: lp.token_logprobs as number[], top: lp.top_logprobs.map((d) => Object.values(d as Record<string, number>)) });
    }

    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Hello there" }];
    const chat = await client.chat.completions.create({ model: "lp", messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: K, return_token_ids: true, ignore_eos: true } as never) as OpenAI.Chat.ChatCompletion & { prompt_token_ids: number[] };
    const chatChoice = chat.choices[0] as OpenAI.Chat.ChatCompletion.Choice & { token_ids: number[] };
    const chatPrompt = (await postJson<{ tokens: number[] }>(`${server.url}/tokenize`, { messages })).body.tokens;
    assert.deepEqual(chat.prompt_token_ids, chatPrompt);
    cases.push({ prompt: chatPrompt, output: chatChoice.token_ids, k: K });
    const content = chatChoice.logprobs?.content ?? [];
    got.push({ chosen: content.map((e) => e.logprob), top: null });
    const chatTopValues = content.map((e) => e.top_logprobs.map((t) => t.logprob));

    const refs = reference(dir, cases);
    let compared = 0;
    refs.forEach((ref, c) => {
      const mine = got[c]!;
      assert.equal(mine.chosen.length, ref.chosen.length);
      ref.chosen.forEach((expected, i) => {
        assert.ok(Math.abs((mine.chosen[i] as number) - expected) < TOLERANCE, `case ${c} token ${i}: ${mine.chosen[i]} vs ${expected}`);
        compared++;
        // Top-k values: completions' dict holds the top k (plus the sampled token); chat's list is exactly the top k.
        const refTop = ref.top_logprobs[i] as number[];
        const values = c < 2 ? [...(mine.top?.[i] ?? [])].sort((a, b) => b - a).slice(0, K) : (chatTopValues[i] as number[]);
        assert.equal(values.length, K);
        values.forEach((v, j) => assert.ok(Math.abs(v - (refTop[j] as number)) < TOLERANCE, `case ${c} token ${i} top ${j}: ${v} vs ${refTop[j]}`));
      });
    });
    assert.ok(compared >= 20);
  });

  test("chat prompt_logprobs (streamed and not) equal transformers' over the rendered prompt", async () => {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: "Score every token of this prompt, please." }];
    const promptIds = (await postJson<{ tokens: number[] }>(`${server.url}/tokenize`, { messages })).body.tokens;
    const body = { model: "lp", messages, max_tokens: 2, temperature: 0, prompt_logprobs: K };
    type Entry = Record<string, { logprob: number; rank: number; decoded_token: string }> | null;
    const full = await postJson<{ prompt_logprobs: Entry[]; usage: { prompt_tokens_details: { cached_tokens: number } } }>(`${server.url}/v1/chat/completions`, body);
    assert.equal(full.status, 200);
    const got = full.body.prompt_logprobs;
    assert.equal(got.length, promptIds.length);
    assert.equal(got[0], null);
    const response = await fetch(`${server.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
    const chunks = (await response.text()).split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)) as { prompt_logprobs?: Entry[] });
    const streamed = chunks.filter((c) => c.prompt_logprobs !== undefined);
    assert.equal(streamed.length, 1, "once, on the first chunk with tokens");
    assert.deepEqual(streamed[0]?.prompt_logprobs, got);
    // The reference: the first output token's logprobs over prompt + [x] are the prompt's, shifted by one.
    const ref = reference(dir, [{ prompt: promptIds.slice(0, 1), output: promptIds.slice(1), k: K }])[0]!;
    for (let p = 1; p < promptIds.length; p++) {
      const entry = got[p]!;
      const own = entry[String(promptIds[p])]!;
      assert.ok(Math.abs(own.logprob - (ref.chosen[p - 1] as number)) < TOLERANCE, `position ${p}: ${own.logprob} vs ${ref.chosen[p - 1]}`);
      const top = Object.values(entry).map((v) => v.logprob).sort((a, b) => b - a).slice(0, K);
      (ref.top_logprobs[p - 1] as number[]).forEach((v, j) => assert.ok(Math.abs((top[j] as number) - v) < TOLERANCE, `position ${p} top ${j}`));
    }
  });

  test("completions echo + logprobs, streamed: tokens join to the text and text_offset indexes it", async () => {
    const prompt = "Café au lait, naïve 世界 🙂 — tokens that split characters.";
    const response = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "lp", prompt, max_tokens: 12, temperature: 0, ignore_eos: true, echo: true, logprobs: 2, stream: true }),
    });
    type Chunk = { choices: { text: string; logprobs: { tokens: string[]; text_offset: number[]; token_logprobs: (number | null)[] } | null }[] };
    const chunks = (await response.text()).split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)) as Chunk);
    const text = chunks.map((c) => c.choices[0]?.text ?? "").join("");
    const tokens = chunks.flatMap((c) => c.choices[0]?.logprobs?.tokens ?? []);
    const offsets = chunks.flatMap((c) => c.choices[0]?.logprobs?.text_offset ?? []);
    assert.ok(text.startsWith(prompt));
    assert.equal(tokens.join(""), text);
    // Offsets count code points (Python's len()), so index the text as a code-point array.
    const points = [...text];
    tokens.forEach((token, i) => assert.equal(points.slice(offsets[i], (offsets[i] as number) + [...token].length).join(""), token, `token ${i}`));
  });
});
