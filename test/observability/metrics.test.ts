// BatonMetrics against a stand-in stats source: vLLM's names, gauges read at
// scrape time, engine counters that only go up, per-request histograms, and
// step phases taken from the timing ring once each.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import type { EngineStats } from "../../src/engine/engine-core.js";
import { StepTimingRing } from "../../src/engine/step-timings.js";
import { BatonMetrics, oneTwoFiveBuckets } from "../../src/observability/metrics.js";
import { parseMetrics } from "./prom-text.js";

function stats(over: Partial<EngineStats> = {}): EngineStats {
  return {
    numRunning: 0,
    numWaiting: 0,
    numFreeBlocks: 100,
    numCachedBlocks: 0,
    numUsedBlocks: 0,
    numBlocks: 100,
    numPreemptions: 0,
    numSteps: 0,
    numPrefixQueryTokens: 0,
    numPrefixHitTokens: 0,
    numSinkErrors: 0,
    ...over,
  };
}

const M = 'model_name="m"';

describe("BatonMetrics", () => {
  test("gauges and engine counters read the engine at scrape time", async () => {
    const source = { stats: stats(), timings: new StepTimingRing(8) };
    const metrics = new BatonMetrics({ modelName: "m", engine: source });
    source.stats = stats({ numRunning: 3, numWaiting: 2, numFreeBlocks: 75, numPreemptions: 4, numPrefixQueryTokens: 10, numPrefixHitTokens: 6 });
    let m = parseMetrics(await metrics.render());
    assert.equal(m.get(`vllm:num_requests_running{${M}}`), 3);
    assert.equal(m.get(`vllm:num_requests_waiting{${M}}`), 2);
    assert.equal(m.get(`vllm:kv_cache_usage_perc{${M}}`), 0.25);
    assert.equal(m.get(`baton:kv_free_blocks{${M}}`), 75);
    assert.equal(m.get(`vllm:num_preemptions_total{${M}}`), 4);
    assert.equal(m.get(`vllm:prefix_cache_queries_total{${M}}`), 10);
    assert.equal(m.get(`vllm:prefix_cache_hits_total{${M}}`), 6);
    source.stats = stats({ numPreemptions: 5 });
    m = parseMetrics(await metrics.render());
    assert.equal(m.get(`vllm:num_preemptions_total{${M}}`), 5, "scraping twice does not double-count");
    assert.equal(m.get(`vllm:num_requests_running{${M}}`), 0);
  });

  test("request traces feed the latency histograms and token counters", async () => {
    const metrics = new BatonMetrics({ modelName: "m", engine: { stats: stats(), timings: new StepTimingRing(8) }, maxModelLen: 1000 });
    const empty = parseMetrics(await metrics.render());
    assert.equal(empty.get(`vllm:time_to_first_token_seconds_count{${M}}`), 0, "histograms exist before any request");
    const trace = metrics.begin(7, 1000, 12);
    trace.tokens(1, 1100);
    trace.tokens(1, 1150);
    trace.tokens(2, 1250);
    trace.finish("length", 1250);
    trace.finish("length", 1300); // ignored: already finished
    metrics.begin(3, 2000, 5).finish("abort", 2010);
    // A first output that carries two tokens: the second follows the first with no gap.
    const r3 = metrics.begin(2, 3000, 4);
    r3.tokens(2, 3100);
    r3.tokens(1, 3160);
    r3.finish("length", 3160);
    const m = parseMetrics(await metrics.render());
    assert.equal(m.get(`vllm:prompt_tokens_total{${M}}`), 9, "prompt tokens count once the prefill produced a token");
    assert.equal(m.get(`vllm:generation_tokens_total{${M}}`), 7);
    assert.equal(m.get(`vllm:time_to_first_token_seconds_count{${M}}`), 2);
    assert.ok(Math.abs((m.get(`vllm:time_to_first_token_seconds_sum{${M}}`) ?? 0) - 0.2) < 1e-9);
    // One observation per token after a request's first, however outputs group them: r1's two
    // tokens in one output share their gap (0.05, 0.05, 0.05); r3's second token came with its
    // first (0), its third 0.06 later.
    assert.equal(m.get(`vllm:inter_token_latency_seconds_count{${M}}`), 5);
    assert.ok(Math.abs((m.get(`vllm:inter_token_latency_seconds_sum{${M}}`) ?? 0) - 0.21) < 1e-9);
    assert.equal(m.get(`vllm:inter_token_latency_seconds_bucket{le="0.05",${M}}`), 4);
    assert.equal(m.get(`vllm:e2e_request_latency_seconds_count{${M}}`), 3);
    assert.equal(m.get(`vllm:request_success_total{${M},finished_reason="length"}`), 2);
    assert.equal(m.get(`vllm:request_success_total{${M},finished_reason="abort"}`), 1);
    assert.equal(m.get(`vllm:request_success_total{${M},finished_reason="stop"}`), 0);
    assert.equal(m.get(`vllm:time_to_first_token_seconds_bucket{le="0.1",${M}}`), 2);
    // Per finished request: prompt and generated tokens and max_tokens, in vLLM's 1-2-5 buckets up to max_model_len.
    assert.equal(m.get(`vllm:request_prompt_tokens_count{${M}}`), 3);
    assert.equal(m.get(`vllm:request_prompt_tokens_sum{${M}}`), 12);
    assert.equal(m.get(`vllm:request_generation_tokens_sum{${M}}`), 7);
    assert.equal(m.get(`vllm:request_params_max_tokens_sum{${M}}`), 21);
    assert.equal(m.get(`vllm:request_params_max_tokens_bucket{le="5",${M}}`), 2);
    assert.equal(m.get(`vllm:request_params_max_tokens_bucket{le="20",${M}}`), 3);
    assert.equal(m.get(`vllm:request_prompt_tokens_bucket{le="1000",${M}}`), 3);
    assert.equal(m.get(`vllm:request_prompt_tokens_bucket{le="2000",${M}}`), undefined, "buckets stop at max_model_len");
  });

  test("the request phases come from the engine's timing, once per request, in vLLM's latency buckets", async () => {
    const metrics = new BatonMetrics({ modelName: "m", engine: { stats: stats(), timings: new StepTimingRing(8) } });
    const trace = metrics.begin(4, 0, 8);
    trace.tokens(1, 10);
    trace.finish("stop", 20);
    trace.phases({ queueMs: 200, prefillMs: 700, decodeMs: 1500, inferenceMs: 2200 });
    trace.phases({ queueMs: 1, prefillMs: 1, decodeMs: 1, inferenceMs: 1 }); // ignored
    const m = parseMetrics(await metrics.render());
    for (const [name, seconds, le] of [
      ["queue", 0.2, "0.3"],
      ["prefill", 0.7, "0.8"],
      ["decode", 1.5, "1.5"],
      ["inference", 2.2, "2.5"],
    ] as const) {
      assert.equal(m.get(`vllm:request_${name}_time_seconds_count{${M}}`), 1, name);
      assert.ok(Math.abs((m.get(`vllm:request_${name}_time_seconds_sum{${M}}`) ?? 0) - seconds) < 1e-9, name);
      assert.equal(m.get(`vllm:request_${name}_time_seconds_bucket{le="${le}",${M}}`), 1, name);
    }
    assert.equal(m.get(`vllm:request_queue_time_seconds_bucket{le="0.3",${M}}`), 1);
    assert.equal(m.get(`vllm:request_queue_time_seconds_bucket{le="7680",${M}}`), 1, "vLLM's request latency buckets run to 7680 s");
  });

  test("oneTwoFiveBuckets is vLLM's build_1_2_5_buckets", () => {
    assert.deepEqual(oneTwoFiveBuckets(100), [1, 2, 5, 10, 20, 50, 100]);
    assert.deepEqual(oneTwoFiveBuckets(4096), [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]);
  });

  test("step phases come from the timing ring, each step once", async () => {
    const ring = new StepTimingRing(4);
    const metrics = new BatonMetrics({ modelName: "m", engine: { stats: stats(), timings: ring } });
    const step = (stepId: number) =>
      ring.record({ stepId, numRows: 1, numTokens: 1, scheduleMs: 0.1, buildMs: 0.2, roundTripMs: 5, processMs: 0.3, workerPrepareMs: 0, workerForwardMs: 0, workerSampleMs: 0 });
    step(0);
    step(1);
    let m = parseMetrics(await metrics.render());
    assert.equal(m.get(`baton:step_phase_seconds_count{${M},phase="schedule"}`), 2);
    assert.equal(m.get(`baton:step_phase_seconds_count{${M},phase="worker"}`), 2);
    step(2);
    m = parseMetrics(await metrics.render());
    assert.equal(m.get(`baton:step_phase_seconds_count{${M},phase="process"}`), 3);
    assert.ok(Math.abs((m.get(`baton:step_phase_seconds_sum{${M},phase="worker"}`) ?? 0) - 0.015) < 1e-9);
  });

  test("rejections are counted by reason", async () => {
    const metrics = new BatonMetrics({ modelName: "m", engine: { stats: stats(), timings: new StepTimingRing(4) } });
    metrics.reject("queue_full");
    metrics.reject("queue_full");
    metrics.reject("unauthorized");
    const m = parseMetrics(await metrics.render());
    assert.equal(m.get(`baton:requests_rejected_total{${M},reason="queue_full"}`), 2);
    assert.equal(m.get(`baton:requests_rejected_total{${M},reason="unauthorized"}`), 1);
    assert.equal(m.get(`baton:requests_rejected_total{${M},reason="unavailable"}`), 0);
  });
});
