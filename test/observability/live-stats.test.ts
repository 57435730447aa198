// The dashboard's recent-sample windows: what falls inside a time window, the
// capacity bound, and the totals BatonMetrics' traces feed.

import assert from "node:assert/strict";
import { test } from "node:test";
import { RecentSamples } from "../../src/observability/live-stats.js";
import { BatonMetrics } from "../../src/observability/metrics.js";
import type { EngineStats } from "../../src/engine/engine-core.js";

test("RecentSamples keeps the newest samples and answers by time window, sorted", () => {
  const samples = new RecentSamples(4);
  samples.add(5, 100);
  samples.add(1, 200);
  samples.add(3, 300);
  assert.deepEqual(samples.since(0), [1, 3, 5]);
  assert.deepEqual(samples.since(200), [1, 3]);
  assert.deepEqual(samples.since(301), []);
  samples.add(9, 400);
  samples.add(2, 500); // over capacity: the oldest (5 at 100) goes
  assert.deepEqual(samples.since(0), [1, 2, 3, 9]);
});

test("BatonMetrics' request traces feed the live totals and latency samples", () => {
  const stats: EngineStats = {
    numRunning: 0, numWaiting: 0, numFreeBlocks: 8, numCachedBlocks: 0, numUsedBlocks: 0, numBlocks: 8,
    numPreemptions: 0, numSteps: 0, numPrefixQueryTokens: 0, numPrefixHitTokens: 0, numSinkErrors: 0,
  };
  const metrics = new BatonMetrics({ modelName: "m", engine: { stats, timings: { recent: () => [] } } });
  const trace = metrics.begin(7, 1000, 16);
  trace.tokens(1, 1040); // TTFT 40 ms
  trace.tokens(3, 1100); // 3 tokens, 20 ms apart on average
  trace.finish("length", 1100);
  const live = metrics.live;
  assert.equal(live.promptTokens, 7);
  assert.equal(live.generationTokens, 4);
  assert.equal(live.finishedRequests, 1);
  assert.deepEqual(live.ttftMs.since(0), [40]);
  assert.deepEqual(live.itlMs.since(0), [20, 20, 20]);
  assert.deepEqual(live.e2eMs.since(0), [100]);
});
