// Clients that go away: 500 streams cut at random points (and a batch of
// non-streamed requests cut mid-generation), 32 at a time. Every request asks
// for far more tokens than it gets before its client leaves, so one that was
// not aborted would still be running at the end. Afterwards the engine holds
// nothing: /metrics shows no running or waiting request and as many free KV
// blocks as at the start, and the aborts are counted. (The demo model is slow
// on a small CPU, so cuts come within the first few tokens.)

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { parseMetrics } from "../observability/prom-text.js";
import { startServer, type RunningServer } from "./harness.js";

const M = 'model_name="baton-demo"';
const CONCURRENCY = 32;

let server: RunningServer;
before(async () => {
  // A small cache, so that leaked blocks would show and requests compete for blocks.
  server = await startServer(["--max-num-seqs", "32", "--num-gpu-blocks-override", "512"]);
});
after(async () => {
  await server?.stop();
});

async function scrape(): Promise<Map<string, number>> {
  return parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
}

/** A seeded generator, so a failure can be replayed. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Outcome = "cut-before-headers" | "cut-mid-stream" | "completed";

/** Far more than any request gets before it is cut. */
const MAX_TOKENS = 1000;

/** One streamed request, cut after `cutAfterChunks` SSE reads (or before the headers when < 0). */
async function cutStream(i: number, random: () => number): Promise<Outcome> {
  const controller = new AbortController();
  const cutAfterChunks = Math.floor(random() * 6) - 1;
  const chat = random() < 0.5;
  const words = 1 + Math.floor(random() * 30);
  const prompt = `request ${i}: ${"lorem ipsum ".repeat(words)}`;
  const body = chat
    ? { model: "baton-demo", messages: [{ role: "user", content: prompt }], max_tokens: MAX_TOKENS, ignore_eos: true, stream: true }
    : { model: "baton-demo", prompt, max_tokens: MAX_TOKENS, ignore_eos: true, stream: true };
  const path = chat ? "/v1/chat/completions" : "/v1/completions";
  try {
    const pending = fetch(`${server.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (cutAfterChunks < 0) {
      // Abort while the request is being admitted, tokenized or queued.
      setTimeout(() => controller.abort(), Math.floor(random() * 5));
    }
    const response = await pending;
    assert.equal(response.status, 200);
    const reader = response.body!.getReader();
    for (let n = 0; ; n++) {
      if (n === cutAfterChunks) {
        controller.abort();
        return "cut-mid-stream";
      }
      const { done } = await reader.read();
      if (done) return "completed";
    }
  } catch (error) {
    if ((error as Error).name === "AbortError") return "cut-before-headers";
    throw error;
  }
}

/** A non-streamed request abandoned after a random delay. */
async function cutCollected(i: number, random: () => number): Promise<Outcome> {
  const controller = new AbortController();
  setTimeout(() => controller.abort(), Math.floor(random() * 300));
  try {
    const response = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "baton-demo", prompt: `collected ${i}`, max_tokens: MAX_TOKENS, ignore_eos: true }),
      signal: controller.signal,
    });
    await response.arrayBuffer();
    return "completed";
  } catch (error) {
    if ((error as Error).name === "AbortError") return "cut-before-headers";
    throw error;
  }
}

async function runPool(count: number, job: (i: number) => Promise<Outcome>): Promise<Map<Outcome, number>> {
  const tally = new Map<Outcome, number>();
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < count) {
      const outcome = await job(next++);
      tally.set(outcome, (tally.get(outcome) ?? 0) + 1);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, lane));
  return tally;
}

/** /metrics once the engine has settled (aborts apply within a step). */
async function settled(): Promise<Map<string, number>> {
  let m = await scrape();
  for (let i = 0; i < 100; i++) {
    if (m.get(`vllm:num_requests_running{${M}}`) === 0 && m.get(`vllm:num_requests_waiting{${M}}`) === 0) break;
    await new Promise((r) => setTimeout(r, 20));
    m = await scrape();
  }
  return m;
}

test("500 streams and 64 collected requests cut at random points leak no KV blocks", async () => {
  const start = await scrape();
  const freeAtStart = start.get(`baton:kv_free_blocks{${M}}`);
  assert.equal(freeAtStart, 512);
  const random = rng(Number(process.env.BATON_TEST_SEED ?? 12345));

  const streams = await runPool(500, (i) => cutStream(i, random));
  const collected = await runPool(64, (i) => cutCollected(i, random));
  const m = await settled();

  assert.equal(m.get(`vllm:num_requests_running{${M}}`), 0, "no request left running");
  assert.equal(m.get(`vllm:num_requests_waiting{${M}}`), 0, "no request left waiting");
  assert.equal(m.get(`baton:kv_free_blocks{${M}}`), freeAtStart, "every KV block is free again");
  assert.equal(m.get(`vllm:kv_cache_usage_perc{${M}}`), 0);
  const aborted = (m.get(`vllm:request_success_total{${M},finished_reason="abort"}`) ?? 0) - (start.get(`vllm:request_success_total{${M},finished_reason="abort"}`) ?? 0);
  const midStream = streams.get("cut-mid-stream") ?? 0;
  assert.ok(midStream > 250, `most streams were cut mid-way (${JSON.stringify([...streams])})`);
  assert.equal(streams.get("completed") ?? 0, 0);
  assert.equal(collected.get("completed") ?? 0, 0);
  // Every request cut after its headers had reached the engine; some cut earlier had too.
  assert.ok(aborted >= midStream && aborted <= 564, `the engine aborted the cut requests (${aborted} aborts, ${midStream} cut mid-stream)`);

  // And the server still serves.
  const response = await fetch(`${server.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "baton-demo", prompt: "still there?", max_tokens: 3 }),
  });
  assert.equal(response.status, 200);
  await response.arrayBuffer();
});
