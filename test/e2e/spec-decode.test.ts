// Speculative decoding (n-gram prompt lookup, and a draft model) through the
// real server and worker: greedy output equals transformers generate token for
// token while drafts are proposed, partly accepted and partly rejected, under
// preemption (a KV cache too small for every request at once) and prefix-cache
// hits (prompts sent twice); vLLM's spec_decode counters say so; 200 clients
// that leave mid-stream leave no KV block behind. A draft model that is the
// target itself has every draft accepted.

import assert from "node:assert/strict";
import { cpSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { makeRandomModel, postJson, promptIdsOf, removeDir, startServer, tempDir, transformersGreedy, type CompletionWithIds, type RunningServer } from "./harness.js";

const dir = tempDir("spec");
after(() => removeDir(dir));

// Token-id prompts that repeat a pattern, so the n-gram proposer finds matches. A tied-embedding model
// (variant 3) tends to continue what it reads, so some drafts are accepted and some rejected.
function patterned(seed: number, width: number, times: number): number[] {
  let x = seed;
  const next = (): number => (x = (x * 1103515245 + 12345) % 2147483648) % 5000;
  const pattern = Array.from({ length: width }, next);
  return [next(), ...Array.from({ length: times }, () => pattern).flat()];
}
const PROMPTS: number[][] = [patterned(1, 2, 8), patterned(2, 1, 10), patterned(3, 3, 6), patterned(4, 4, 4), patterned(5, 5, 3), patterned(6, 2, 5)];
const MAX_TOKENS = 24;

async function metric(server: RunningServer, name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name) && !l.startsWith(`${name}_`));
  assert.ok(line !== undefined, `metric ${name} missing`);
  return Number(line.split(" ").at(-1));
}

/** Every prompt twice (the second finds the first's blocks cached), greedy; each answer must equal transformers'. */
async function greedyEqualsTransformers(server: RunningServer, prompts: number[][]): Promise<void> {
  const asks = [...prompts, ...prompts];
  const responses = await Promise.all(
    asks.map((prompt) => postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model: "spec", prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true })),
  );
  for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
  const promptIds = responses.map((r) => promptIdsOf(r.body));
  const expected = transformersGreedy(dir, promptIds.slice(0, prompts.length), MAX_TOKENS);
  responses.forEach((r, i) => assert.deepEqual(r.body.choices[0]?.token_ids, expected[i % prompts.length], `prompt ${i}`));
}

describe("speculative decoding: n-gram", () => {
  let server: RunningServer;
  before(async () => {
    makeRandomModel("llama", dir, 3);
    server = await startServer([
      dir,
      "--served-model-name", "spec",
      "--speculative-config", JSON.stringify({ method: "ngram", num_speculative_tokens: 3, prompt_lookup_max: 3, prompt_lookup_min: 1 }),
      "--max-num-batched-tokens", "24",
      "--block-size", "4",
      // 12 requests of up to ~45 tokens with their drafts do not fit at once: some are preempted.
      "--num-gpu-blocks-override", "48",
    ]);
  });
  after(() => server?.stop());

  test("greedy tokens equal transformers generate, with drafts accepted and rejected, preemption and prefix hits", async () => {
    await greedyEqualsTransformers(server, PROMPTS);
    const drafted = await metric(server, "vllm:spec_decode_num_draft_tokens_total");
    const accepted = await metric(server, "vllm:spec_decode_num_accepted_tokens_total");
    assert.ok(accepted > 0, `no draft accepted (${drafted} drafted)`);
    assert.ok(accepted < drafted, `every draft accepted (${accepted} of ${drafted}): rejection is not exercised`);
    assert.ok((await metric(server, "vllm:num_preemptions_total")) > 0, "no preemption happened");
    assert.ok((await metric(server, "vllm:prefix_cache_hits_total")) > 0, "no prefix-cache hit");
  });

  test("sampled rows speculate too: a seeded request is reproducible alone and among others", async () => {
    const before = await metric(server, "vllm:spec_decode_num_drafts_total");
    const ask = (seed: number) =>
      postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model: "spec", prompt: PROMPTS[1], max_tokens: MAX_TOKENS, temperature: 0.8, top_p: 0.95, seed, return_token_ids: true });
    const alone = await ask(7);
    const together = await Promise.all([ask(7), ask(8), ask(9), ask(7)]);
    for (const r of [alone, ...together]) assert.equal(r.status, 200, JSON.stringify(r.body));
    const ids = (r: typeof alone): number[] | undefined => r.body.choices[0]?.token_ids;
    assert.deepEqual(ids(together[0]!), ids(alone));
    assert.deepEqual(ids(together[3]!), ids(alone));
    assert.ok((await metric(server, "vllm:spec_decode_num_drafts_total")) > before, "no sampled row verified drafts");
  });

  test("rows asking for logprobs speculate too: tokens as transformers', one logprob per token, the greedy token the likeliest", async () => {
    type WithLogprobs = CompletionWithIds & { choices: { logprobs: { token_logprobs: number[]; top_logprobs: Record<string, number>[] } }[] };
    const before = await metric(server, "vllm:spec_decode_num_drafts_total");
    const responses = await Promise.all(
      PROMPTS.map((prompt) => postJson<WithLogprobs>(`${server.url}/v1/completions`, { model: "spec", prompt, max_tokens: MAX_TOKENS, temperature: 0, logprobs: 2, return_token_ids: true })),
    );
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const expected = transformersGreedy(dir, responses.map((r) => promptIdsOf(r.body)), MAX_TOKENS);
    responses.forEach((r, i) => {
      const choice = r.body.choices[0]!;
      assert.deepEqual(choice.token_ids, expected[i], `prompt ${i}`);
      assert.equal(choice.logprobs.token_logprobs.length, MAX_TOKENS);
      choice.logprobs.token_logprobs.forEach((lp, j) => {
        const top = Object.values(choice.logprobs.top_logprobs[j]!);
        assert.ok(top.length >= 1 && top.length <= 2, `prompt ${i} token ${j}: ${top.length} alternatives`);
        assert.ok(Math.abs(lp - Math.max(...top)) < 1e-6, `prompt ${i} token ${j}: logprob ${lp}, alternatives ${top}`);
      });
    });
    // Every request asked for logprobs, so the drafts verified were theirs.
    assert.ok((await metric(server, "vllm:spec_decode_num_drafts_total")) > before, "no logprobs row verified drafts");
  });

  test("200 clients that leave mid-stream free every KV block", async () => {
    for (let start = 0; start < 200; start += 25) {
      await Promise.all(
        Array.from({ length: 25 }, (_, j) => start + j).map(
          (i) =>
            new Promise<void>((resolve) => {
              const req = httpRequest(`${server.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
                let events = 0;
                res.on("data", () => {
                  if (++events >= i % 7) req.destroy();
                });
                res.on("close", () => resolve());
                res.on("error", () => resolve());
              });
              req.on("error", () => resolve());
              req.end(JSON.stringify({ model: "spec", prompt: PROMPTS[i % PROMPTS.length], max_tokens: 16, temperature: 0, stream: true }));
              if (i % 5 === 0) setTimeout(() => req.destroy(), i % 11);
            }),
        ),
      );
    }
    const deadline = Date.now() + 20_000;
    for (;;) {
      const [running, usage] = [await metric(server, "vllm:num_requests_running"), await metric(server, "vllm:kv_cache_usage_perc")];
      if (running === 0 && usage === 0) break;
      assert.ok(Date.now() < deadline, `still held after the disconnects: running ${running}, kv usage ${usage}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    // It still answers as transformers does.
    const again = await postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model: "spec", prompt: PROMPTS[0], max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true });
    const expected = transformersGreedy(dir, [promptIdsOf(again.body)], MAX_TOKENS);
    assert.deepEqual(again.body.choices[0]?.token_ids, expected[0]);
  });
});

describe("speculative decoding: a draft model", () => {
  const draftDir = tempDir("spec-draft");
  after(() => removeDir(draftDir));

  test("another model drafts: greedy tokens equal transformers, drafts accepted and rejected, preemption and prefix hits", async () => {
    if (!existsSync(join(dir, "config.json"))) makeRandomModel("llama", dir, 3);
    // The target's first layer and its head (an early-exit self-draft): it agrees with the target on some tokens.
    cpSync(dir, draftDir, { recursive: true });
    const config = JSON.parse(readFileSync(join(draftDir, "config.json"), "utf8")) as { num_hidden_layers: number };
    writeFileSync(join(draftDir, "config.json"), JSON.stringify({ ...config, num_hidden_layers: 1 }));
    const server = await startServer([
      dir,
      "--served-model-name", "spec",
      "--speculative-config", JSON.stringify({ method: "draft_model", model: draftDir, num_speculative_tokens: 3 }),
      "--max-num-batched-tokens", "24",
      "--block-size", "4",
      "--num-gpu-blocks-override", "48",
    ]);
    try {
      await greedyEqualsTransformers(server, PROMPTS);
      const drafted = await metric(server, "vllm:spec_decode_num_draft_tokens_total");
      const accepted = await metric(server, "vllm:spec_decode_num_accepted_tokens_total");
      assert.ok(accepted > 0 && accepted < drafted, `accepted ${accepted} of ${drafted}`);
      assert.ok((await metric(server, "vllm:num_preemptions_total")) > 0, "no preemption happened");
    } finally {
      server.stop();
    }
  });

  test("the target as its own draft: every draft accepted", async () => {
    if (!existsSync(join(dir, "config.json"))) makeRandomModel("llama", dir, 3);
    const server = await startServer([
      dir,
      "--served-model-name", "spec",
      "--speculative-config", JSON.stringify({ method: "draft_model", model: dir, num_speculative_tokens: 4 }),
      "--block-size", "4",
    ]);
    try {
      await greedyEqualsTransformers(server, PROMPTS.slice(0, 3));
      const drafted = await metric(server, "vllm:spec_decode_num_draft_tokens_total");
      const accepted = await metric(server, "vllm:spec_decode_num_accepted_tokens_total");
      assert.ok(drafted > 0 && accepted >= 0.95 * drafted, `accepted ${accepted} of ${drafted}`);
    } finally {
      server.stop();
    }
  });
});
