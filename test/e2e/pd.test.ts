// Prefill/decode disaggregation end to end: `baton serve models/demo
// --deployment examples/pd.yaml` (prefill on rank 0, decode on rank 1, KV
// blocks moved by the KV connector over torch.distributed gloo) against the
// same model on one worker, both with chunked prefill.
// - a KV load that fails (BATON_TEST_KV_LOAD_FAIL=1: the decode worker's
//   first load fails after its bytes arrive) is recomputed on the decode side:
//   the request succeeds with the same tokens;
// - greedy output of concurrent requests is token-exact with one worker, and
//   /metrics counts the bytes transferred;
// - after 200 requests whose clients disconnect at random moments, every KV
//   block is free again on both sides (the KV free-blocks gauges), none held.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { demoModelDir, repoRoot, startServer, type RunningServer } from "./harness.js";
import { metric, promptIds, streamCompletion, waitFor } from "../reliability/helpers.js";

const BLOCKS = 256;
// 16-token chunks: prompts longer than that prefill in several steps.
const COMMON = ["--num-gpu-blocks-override", String(BLOCKS), "--max-num-batched-tokens", "16", "--log-level", "warn"];
const PD = ["--deployment", join(repoRoot, "examples", "pd.yaml")];

async function greedy(url: string, prompts: number[][], maxTokens: number): Promise<number[][]> {
  const results = await Promise.all(prompts.map((p) => streamCompletion(url, p, maxTokens)));
  for (const r of results) assert.equal(r.status, 200, JSON.stringify(r.error));
  return results.map((r) => r.tokenIds);
}

/** A streamed request whose client goes away after `afterMs` (or when it ends, whichever first). */
async function disconnectingRequest(url: string, prompt: number[], maxTokens: number, afterMs: number): Promise<void> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), afterMs);
  try {
    const response = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
      signal: controller.signal,
    });
    const reader = response.body!.getReader();
    for (;;) {
      const { done } = await reader.read();
      if (done) break;
    }
  } catch {
    // The disconnect itself.
  } finally {
    clearTimeout(timer);
  }
}

describe("prefill/decode disaggregation (--deployment examples/pd.yaml)", { timeout: 240_000 }, () => {
  let single: RunningServer | null = null;
  let pd: RunningServer | null = null;

  before(async () => {
    const started = await Promise.allSettled([
      startServer([demoModelDir, ...COMMON]),
      startServer([demoModelDir, ...PD, ...COMMON], 120_000, { ...process.env, BATON_TEST_KV_LOAD_FAIL: "1" }),
    ]);
    single = started[0]!.status === "fulfilled" ? started[0].value : null;
    pd = started[1]!.status === "fulfilled" ? started[1].value : null;
    const failed = started.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed !== undefined) throw failed.reason;
  });

  after(async () => {
    await Promise.all([single?.stop(), pd?.stop()]);
  });

  test("a failed KV load is recomputed on the decode side: same tokens, no error", async () => {
    const prompt = promptIds(7, 40);
    const [expected] = await greedy(single!.url, [prompt], 12);
    const [got] = await greedy(pd!.url, [prompt], 12);
    assert.deepEqual(got, expected);
    assert.match(pd!.output(), /KV load 0 failed: BATON_TEST_KV_LOAD_FAIL/);
    // Nothing was received for it.
    assert.equal(await metric(pd!.url, "baton:kv_transfer_bytes_total"), 0);
  });

  test("greedy output of concurrent requests is token-exact with one worker; bytes are transferred", async () => {
    const prompts = Array.from({ length: 8 }, (_, i) => promptIds(500 + i, 12 + 9 * i));
    const expected = await greedy(single!.url, prompts, 16);
    const got = await greedy(pd!.url, prompts, 16);
    assert.deepEqual(got, expected);
    for (const ids of got) assert.equal(ids.length, 16);
    // Loads after the first moved every prompt's blocks: at least one block each.
    const bytes = (await metric(pd!.url, "baton:kv_transfer_bytes_total")) ?? 0;
    assert.ok(bytes > 0, `transferred ${bytes} bytes`);
    console.log(`PD: ${bytes} KV bytes transferred for 8 prompts of 12..75 tokens`);
    // Seeded sampling too: the decode side draws from the output positions the first token left off at.
    const seeded = { temperature: 0.9, seed: 11, ignore_eos: true };
    const sampled = async (url: string) => (await Promise.all(prompts.slice(0, 3).map((p) => streamCompletion(url, p, 12, { tokens: 0 }, seeded)))).map((r) => r.tokenIds);
    assert.deepEqual(await sampled(pd!.url), await sampled(single!.url));
    // The same prompts again: the prefill side serves them from its prefix cache, same tokens.
    assert.deepEqual(await greedy(pd!.url, prompts, 16), expected);
    assert.ok(((await metric(pd!.url, "vllm:prefix_cache_hits_total")) ?? 0) > 0);
  });

  test("after 200 random client disconnects every block is free on both sides", async () => {
    let seed = 12345;
    const random = (): number => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return seed / 2 ** 32;
    };
    const total = 200;
    let next = 0;
    const lane = async (): Promise<void> => {
      while (next < total) {
        const i = next++;
        const prompt = promptIds(9000 + i, 8 + Math.floor(random() * 40));
        await disconnectingRequest(pd!.url, prompt, 4 + Math.floor(random() * 12), Math.floor(random() * 400));
      }
    };
    await Promise.all(Array.from({ length: 8 }, lane));
    const settled = await waitFor(
      "every KV block free on both sides",
      async () => {
        const decodeFree = await metric(pd!.url, "baton:kv_free_blocks");
        const prefillFree = await metric(pd!.url, "baton:kv_prefill_free_blocks");
        const held = await metric(pd!.url, "baton:kv_prefill_held_blocks");
        return decodeFree === BLOCKS && prefillFree === BLOCKS && held === 0 ? { decodeFree, prefillFree } : null;
      },
      20_000,
      100,
    );
    assert.deepEqual(settled, { decodeFree: BLOCKS, prefillFree: BLOCKS });
    // And it still serves, token-exactly.
    const prompt = promptIds(42, 30);
    assert.deepEqual(await greedy(pd!.url, [prompt], 8), await greedy(single!.url, [prompt], 8));
  });
});
