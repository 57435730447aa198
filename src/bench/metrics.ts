// Turns the requests' outcomes into vLLM's serving metrics, with its
// definitions: TTFT is the first token's arrival after the request was sent;
// ITL is the gap between token arrivals (a chunk of k tokens after a gap g
// counts k gaps of g/k); TPOT is (E2EL - TTFT) / (output tokens - 1) per
// request of more than one token; throughputs are over the benchmark's wall
// time; std is the population standard deviation and percentiles interpolate
// linearly (numpy's defaults).

import type { RequestOutcome } from "./openai-stream.js";
import { mean, percentile } from "../observability/statistics.js";

export const LATENCY_METRICS = ["ttft", "tpot", "itl", "e2el"] as const;
export type LatencyMetric = (typeof LATENCY_METRICS)[number];

export interface LatencyStats {
  mean: number;
  median: number;
  std: number;
  /** Keyed by the percentile as written in the flag ("99", "99.9"). */
  percentiles: Record<string, number>;
}

interface ThroughputPoint {
  /** Seconds since the benchmark started (bucket start). */
  t: number;
  outputTokensPerS: number;
  /** The most requests in flight during the bucket. */
  running: number;
}

export interface BenchMetrics {
  completed: number;
  failed: number;
  durationS: number;
  totalInputTokens: number;
  totalOutputTokens: number;
  requestThroughput: number;
  outputThroughput: number;
  totalTokenThroughput: number;
  /** Most output tokens in any 1-second window (vLLM's max_output_tokens_per_s). */
  maxOutputTokensPerS: number;
  maxConcurrentRequests: number;
  latency: Record<LatencyMetric, LatencyStats>;
  /** Per request, in dataset order (failed ones: 0). */
  inputLens: number[];
  outputLens: number[];
  ttftsS: number[];
  itlsS: number[][];
  e2elsS: number[];
  errors: string[];
  generatedTexts: string[];
  /** Output tokens/s and requests in flight over time, for the chart. */
  timeline: ThroughputPoint[];
}

export function latencyStats(values: readonly number[], percentiles: readonly number[]): LatencyStats {
  const sorted = [...values].sort((a, b) => a - b);
  const m = mean(sorted);
  let squares = 0;
  for (const v of sorted) squares += (v - m) * (v - m);
  return {
    mean: m,
    median: percentile(sorted, 50),
    std: sorted.length === 0 ? 0 : Math.sqrt(squares / sorted.length),
    percentiles: Object.fromEntries(percentiles.map((p) => [String(p), percentile(sorted, p)])),
  };
}

export interface PromptLengths {
  /** Prompt tokens by the client's tokenizer, when known (the server's usage wins). */
  promptTokens: number | null;
}

export function outputTokensOf(outcome: RequestOutcome): number {
  if (outcome.usageOutputTokens !== null) return outcome.usageOutputTokens;
  let n = 0;
  for (const k of outcome.chunkTokens) n += k;
  return n;
}

/** Gaps between token arrivals of one request, in ms (a chunk of k tokens: k gaps of g/k). */
export function interTokenGapsMs(outcome: RequestOutcome): number[] {
  const gaps: number[] = [];
  for (let i = 1; i < outcome.chunkTimesMs.length; i++) {
    const k = outcome.chunkTokens[i] as number;
    const gap = ((outcome.chunkTimesMs[i] as number) - (outcome.chunkTimesMs[i - 1] as number)) / k;
    for (let j = 0; j < k; j++) gaps.push(gap);
  }
  return gaps;
}

/**
 * @param outcomes one per prompt, in dataset order
 * @param benchStartMs / benchEndMs the benchmark's wall-clock window (performance.now())
 */
export function computeMetrics(
  outcomes: readonly RequestOutcome[],
  prompts: readonly PromptLengths[],
  benchStartMs: number,
  benchEndMs: number,
  percentiles: readonly number[],
): BenchMetrics {
  const durationS = Math.max(1e-9, (benchEndMs - benchStartMs) / 1000);
  const ttfts: number[] = [];
  const tpots: number[] = [];
  const itls: number[] = [];
  const e2els: number[] = [];
  const inputLens: number[] = [];
  const outputLens: number[] = [];
  const ttftsS: number[] = [];
  const itlsS: number[][] = [];
  const e2elsS: number[] = [];
  let completed = 0;
  let totalInput = 0;
  let totalOutput = 0;
  outcomes.forEach((o, i) => {
    const promptTokens = o.usagePromptTokens ?? prompts[i]?.promptTokens ?? 0;
    if (!o.success) {
      inputLens.push(promptTokens);
      outputLens.push(0);
      ttftsS.push(0);
      itlsS.push([]);
      e2elsS.push(0);
      return;
    }
    completed++;
    const output = outputTokensOf(o);
    const ttft = (o.chunkTimesMs[0] as number) - o.startMs;
    const e2el = o.endMs - o.startMs;
    const gaps = interTokenGapsMs(o);
    totalInput += promptTokens;
    totalOutput += output;
    ttfts.push(ttft);
    e2els.push(e2el);
    if (output > 1) tpots.push((e2el - ttft) / (output - 1));
    for (const g of gaps) itls.push(g);
    inputLens.push(promptTokens);
    outputLens.push(output);
    ttftsS.push(ttft / 1000);
    itlsS.push(gaps.map((g) => g / 1000));
    e2elsS.push(e2el / 1000);
  });
  const { timeline, maxOutputTokensPerS, maxConcurrentRequests } = throughputOverTime(outcomes, benchStartMs, benchEndMs);
  return {
    completed,
    failed: outcomes.length - completed,
    durationS,
    totalInputTokens: totalInput,
    totalOutputTokens: totalOutput,
    requestThroughput: completed / durationS,
    outputThroughput: totalOutput / durationS,
    totalTokenThroughput: (totalInput + totalOutput) / durationS,
    maxOutputTokensPerS,
    maxConcurrentRequests,
    latency: {
      ttft: latencyStats(ttfts, percentiles),
      tpot: latencyStats(tpots, percentiles),
      itl: latencyStats(itls, percentiles),
      e2el: latencyStats(e2els, percentiles),
    },
    inputLens,
    outputLens,
    ttftsS,
    itlsS,
    e2elsS,
    errors: outcomes.map((o) => o.error),
    generatedTexts: outcomes.map((o) => o.generatedText),
    timeline,
  };
}

/** Token arrivals and requests in flight bucketed over the run (about 40 buckets, at least 250 ms each). */
function throughputOverTime(
  outcomes: readonly RequestOutcome[],
  startMs: number,
  endMs: number,
): { timeline: ThroughputPoint[]; maxOutputTokensPerS: number; maxConcurrentRequests: number } {
  const spanMs = Math.max(1, endMs - startMs);
  const bucketMs = Math.max(250, spanMs / 40);
  const buckets = Math.max(1, Math.ceil(spanMs / bucketMs));
  const tokens = new Float64Array(buckets);
  const perSecond = new Float64Array(Math.max(1, Math.ceil(spanMs / 1000)));
  // +1 at a request's start, -1 at its end; a prefix sum gives requests in flight.
  const events: [number, number][] = [];
  for (const o of outcomes) {
    events.push([o.startMs, 1], [o.endMs, -1]);
    o.chunkTimesMs.forEach((t, i) => {
      const k = o.chunkTokens[i] as number;
      const b = Math.min(buckets - 1, Math.max(0, Math.floor((t - startMs) / bucketMs)));
      const s = Math.min(perSecond.length - 1, Math.max(0, Math.floor((t - startMs) / 1000)));
      tokens[b] = (tokens[b] as number) + k;
      perSecond[s] = (perSecond[s] as number) + k;
    });
  }
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let running = 0;
  let maxRunning = 0;
  let e = 0;
  const timeline: ThroughputPoint[] = [];
  for (let b = 0; b < buckets; b++) {
    const at = startMs + b * bucketMs;
    let peakInBucket = running;
    for (; e < events.length && (events[e] as [number, number])[0] < at + bucketMs; e++) {
      running += (events[e] as [number, number])[1];
      peakInBucket = Math.max(peakInBucket, running);
    }
    maxRunning = Math.max(maxRunning, peakInBucket);
    timeline.push({ t: (b * bucketMs) / 1000, outputTokensPerS: (tokens[b] as number) / (bucketMs / 1000), running: peakInBucket });
  }
  return { timeline, maxOutputTokensPerS: Math.max(...perSecond), maxConcurrentRequests: maxRunning };
}
