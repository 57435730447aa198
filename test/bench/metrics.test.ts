// The load generator's arithmetic and prompts without a server: vLLM's metric
// definitions (numpy percentiles, ITL of multi-token deliveries, TPOT), the
// arrival process's rate, and prompts of exact token lengths with the demo
// model's tokenizer.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { buildDataset, exactLengthPrompt, loadBenchTokenizer } from "../../src/bench/dataset.js";
import { computeMetrics, interTokenGapsMs, latencyStats } from "../../src/bench/metrics.js";
import type { RequestOutcome } from "../../src/bench/openai-stream.js";
import { SeededRandom } from "../../src/bench/random.js";
import { arrivalOffsetsMs } from "../../src/bench/request-driver.js";
import { demoModelDir } from "../e2e/harness.js";

function outcome(startMs: number, chunks: [number, number][], endMs: number, usage: number | null): RequestOutcome {
  return {
    success: true,
    error: "",
    startMs,
    chunkTimesMs: chunks.map(([t]) => t),
    chunkTokens: chunks.map(([, k]) => k),
    usagePromptTokens: 10,
    usageOutputTokens: usage,
    endMs,
    generatedText: "",
    status: 200,
  };
}

test("percentiles, median and std follow numpy's defaults", () => {
  const s = latencyStats([4, 1, 3, 2, 10], [99, 90, 25]);
  assert.equal(s.mean, 4);
  assert.equal(s.median, 3);
  // numpy.std([1, 2, 3, 4, 10]) (population)
  assert.ok(Math.abs(s.std - 3.1622776601683795) < 1e-12);
  // numpy.percentile([1, 2, 3, 4, 10], [99, 90, 25]) = [9.76, 7.6, 2.0]
  assert.ok(Math.abs((s.percentiles["99"] ?? 0) - 9.76) < 1e-9);
  assert.ok(Math.abs((s.percentiles["90"] ?? 0) - 7.6) < 1e-9);
  assert.equal(s.percentiles["25"], 2);
  assert.deepEqual(latencyStats([], [99]), { mean: 0, median: 0, std: 0, percentiles: { "99": 0 } });
});

test("a delivery of k tokens after a gap g counts k gaps of g/k; TPOT uses the server's usage", () => {
  const o = outcome(0, [[100, 1], [110, 1], [140, 3]], 150, 5);
  assert.deepEqual(interTokenGapsMs(o), [10, 10, 10, 10]);
  const m = computeMetrics([o], [{ promptTokens: 10 }], 0, 200, [99]);
  assert.equal(m.totalOutputTokens, 5);
  assert.equal(m.latency.ttft.mean, 100);
  assert.equal(m.latency.e2el.mean, 150);
  assert.equal(m.latency.tpot.mean, (150 - 100) / 4);
  assert.equal(m.durationS, 0.2);
  assert.equal(m.outputThroughput, 25);
  // Without usage the chunk counts stand.
  assert.equal(computeMetrics([outcome(0, [[5, 2], [9, 2]], 10, null)], [{ promptTokens: 3 }], 0, 10, [99]).totalOutputTokens, 4);
  // Failed requests count as failed and add no tokens.
  const failed = { ...outcome(0, [], 5, null), success: false, error: "HTTP 500" };
  const mixed = computeMetrics([o, failed], [{ promptTokens: 10 }, { promptTokens: 10 }], 0, 200, [99]);
  assert.equal(mixed.completed, 1);
  assert.equal(mixed.failed, 1);
  assert.deepEqual(mixed.errors, ["", "HTTP 500"]);
});

test("arrivals: all at once at rate inf, else a gamma process with the asked mean rate", () => {
  assert.deepEqual(arrivalOffsetsMs(3, { requestRate: Number.POSITIVE_INFINITY, burstiness: 1, maxConcurrency: null, seed: 0 }), [0, 0, 0]);
  for (const burstiness of [0.5, 1, 4]) {
    const offsets = arrivalOffsetsMs(20_001, { requestRate: 50, burstiness, maxConcurrency: null, seed: 1 });
    const meanGapMs = (offsets.at(-1) ?? 0) / 20_000;
    assert.ok(Math.abs(meanGapMs - 20) < 1, `burstiness ${burstiness}: mean gap ${meanGapMs} ms, want 20`);
    assert.deepEqual(offsets, arrivalOffsetsMs(20_001, { requestRate: 50, burstiness, maxConcurrency: null, seed: 1 }), "seeded");
  }
});

const noDemo = !existsSync(join(demoModelDir, "tokenizer.json")) && "no demo model (npm run setup)";

test("random prompts encode to exactly the asked length, are distinct, and repeat with the seed", { skip: noDemo }, async () => {
  const bench = loadBenchTokenizer(demoModelDir);
  const rng = new SeededRandom(5);
  for (const length of [1, 2, 7, 128, 500]) {
    const text = await exactLengthPrompt(bench, rng, length);
    assert.equal((await bench.tokenizer.encode(text, true)).length, length);
  }
  const options = { name: "random" as const, count: 40, seed: 9, tokenizer: bench, randomInputLen: 32, randomOutputLen: 8, randomRangeRatio: 0, datasetPath: null, fixedOutputLen: null };
  const prompts = await buildDataset(options);
  assert.equal(new Set(prompts.map((p) => p.prompt)).size, 40);
  for (const p of prompts) assert.equal((await bench.tokenizer.encode(p.prompt, true)).length, 32);
  assert.deepEqual(await buildDataset(options), prompts);
  const other = await buildDataset({ ...options, seed: 10 });
  assert.equal(other.filter((p) => prompts.some((q) => q.prompt === p.prompt)).length, 0, "another seed shares no prompt");
});
