// One dashboard snapshot: what the server is doing now, computed from
// in-process state (the engine's stats and step-timing ring, the request
// recorder's recent samples, the worker's pid and death), never by parsing
// /metrics. Rates (tokens/s, steps/s, the prefix-cache hit rate) are the
// change of cumulative counters over the last RATE_WINDOW_MS of snapshots;
// latency percentiles are over the samples of the last LATENCY_WINDOW_MS.
// The page (dashboard.js) renders exactly this shape.

import { performance } from "node:perf_hooks";
import { percentile } from "../../observability/statistics.js";
import type { StepTiming } from "../../engine/step-timings.js";
import type { LiveRequestStats } from "../../observability/live-stats.js";
import type { EngineStatsSource } from "../../observability/metrics.js";
import type { WorkerHealthEvent } from "../../worker/types.js";

const RATE_WINDOW_MS = 2_000;
const LATENCY_WINDOW_MS = 60_000;
/** Step phases are summarized over this many of the newest steps. */
const STEP_WINDOW = 256;
const MAX_HISTORY = 256;

/** A graph node's queue (the graph runtime fills these; a plain LLM has none). */
interface NodeQueue {
  node: string;
  queueDepth: number;
  stepSeconds: number;
}

interface LatencySummary {
  count: number;
  p50: number;
  p90: number;
  p99: number;
}

interface PhaseSummary {
  phase: StepPhase;
  meanMs: number;
  p50Ms: number;
  p99Ms: number;
}

export interface DashboardSnapshot {
  /** Wall clock (Date.now()) when taken. */
  timeMs: number;
  model: string;
  uptimeS: number;
  requests: { running: number; waiting: number };
  kvBlocks: { used: number; cached: number; free: number; total: number; usage: number };
  /** Hit rate in prompt tokens: over the rate window (null when nothing was looked up) and since start. */
  prefixCache: { hitRate: number | null; lifetimeHitRate: number | null; queriedTokens: number; hitTokens: number };
  throughput: { promptTokensPerS: number; generationTokensPerS: number; requestsPerS: number; stepsPerS: number };
  totals: { promptTokens: number; generationTokens: number; finishedRequests: number; steps: number; preemptions: number };
  /** Over the last LATENCY_WINDOW_MS; null where there is no sample. */
  latency: { windowS: number; ttftMs: LatencySummary | null; itlMs: LatencySummary | null; e2eMs: LatencySummary | null };
  steps: { count: number; meanRows: number; meanTokens: number; phases: PhaseSummary[] };
  /** state: restarting after a death, dead once restarts gave up; exit: how the last death happened. */
  worker: { pid: number; alive: boolean; state: "alive" | "restarting" | "dead"; exit: string | null; restarts: number };
  nodes: NodeQueue[];
}

/** What the dashboard's routes read. */
export interface DashboardSource {
  snapshot(): DashboardSnapshot;
}

/** The engine as the dashboard sees it (ServingEngine satisfies it). */
interface DashboardEngine extends EngineStatsSource {
  readonly pid: number;
  onWorkerEvent(listener: (event: WorkerHealthEvent) => void): void;
}

export interface DashboardFeedOptions {
  modelName: string;
  engine: DashboardEngine;
  requests: LiveRequestStats;
  /** Per-node queues of a graph of models; default none. */
  nodes?: () => readonly NodeQueue[];
}

/** The engine's step phases, in the order of a step, with the timing ring's field for each. */
const PHASE_FIELDS = [
  ["schedule", "scheduleMs"],
  ["build", "buildMs"],
  ["roundTrip", "roundTripMs"],
  ["process", "processMs"],
  ["workerPrepare", "workerPrepareMs"],
  ["workerForward", "workerForwardMs"],
  ["workerSample", "workerSampleMs"],
] as const satisfies readonly (readonly [string, keyof StepTiming])[];
type StepPhase = (typeof PHASE_FIELDS)[number][0];

/** Cumulative counters at one moment, for rates. */
interface CounterSample {
  atMs: number;
  promptTokens: number;
  generationTokens: number;
  finishedRequests: number;
  steps: number;
  prefixQueryTokens: number;
  prefixHitTokens: number;
}

function summarize(sorted: readonly number[]): LatencySummary | null {
  if (sorted.length === 0) return null;
  return { count: sorted.length, p50: percentile(sorted, 50), p90: percentile(sorted, 90), p99: percentile(sorted, 99) };
}

function perSecond(now: number, then: number, ms: number): number {
  return ms > 0 ? ((now - then) / ms) * 1000 : 0;
}

export class DashboardFeed implements DashboardSource {
  private readonly startedMs = performance.now();
  private readonly history: CounterSample[] = [];
  private workerState: DashboardSnapshot["worker"]["state"] = "alive";
  private lastDeath: string | null = null;
  private restarts = 0;

  constructor(private readonly options: DashboardFeedOptions) {
    options.engine.onWorkerEvent((event) => {
      if (event.kind === "up") {
        this.workerState = "alive";
        this.restarts++;
        return;
      }
      const exit = event.exit;
      this.workerState = event.kind === "down" ? "restarting" : "dead";
      this.lastDeath = `${exit.signal ?? `exit code ${exit.code}`}${exit.message === "" ? "" : `: ${exit.message}`}`;
    });
  }

  snapshot(): DashboardSnapshot {
    const { engine, requests } = this.options;
    const now = performance.now();
    const stats = engine.stats;
    const sample: CounterSample = {
      atMs: now,
      promptTokens: requests.promptTokens,
      generationTokens: requests.generationTokens,
      finishedRequests: requests.finishedRequests,
      steps: stats.numSteps,
      prefixQueryTokens: stats.numPrefixQueryTokens,
      prefixHitTokens: stats.numPrefixHitTokens,
    };
    const base = this.rateBase(sample);
    const span = now - base.atMs;
    const queried = sample.prefixQueryTokens - base.prefixQueryTokens;
    return {
      timeMs: Date.now(),
      model: this.options.modelName,
      uptimeS: (now - this.startedMs) / 1000,
      requests: { running: stats.numRunning, waiting: stats.numWaiting },
      kvBlocks: {
        used: stats.numBlocks - stats.numFreeBlocks,
        cached: stats.numCachedBlocks,
        free: stats.numFreeBlocks,
        total: stats.numBlocks,
        usage: stats.numBlocks === 0 ? 0 : 1 - stats.numFreeBlocks / stats.numBlocks,
      },
      prefixCache: {
        hitRate: queried > 0 ? (sample.prefixHitTokens - base.prefixHitTokens) / queried : null,
        lifetimeHitRate: stats.numPrefixQueryTokens > 0 ? stats.numPrefixHitTokens / stats.numPrefixQueryTokens : null,
        queriedTokens: stats.numPrefixQueryTokens,
        hitTokens: stats.numPrefixHitTokens,
      },
      throughput: {
        promptTokensPerS: perSecond(sample.promptTokens, base.promptTokens, span),
        generationTokensPerS: perSecond(sample.generationTokens, base.generationTokens, span),
        requestsPerS: perSecond(sample.finishedRequests, base.finishedRequests, span),
        stepsPerS: perSecond(sample.steps, base.steps, span),
      },
      totals: {
        promptTokens: requests.promptTokens,
        generationTokens: requests.generationTokens,
        finishedRequests: requests.finishedRequests,
        steps: stats.numSteps,
        preemptions: stats.numPreemptions,
      },
      latency: {
        windowS: LATENCY_WINDOW_MS / 1000,
        ttftMs: summarize(requests.ttftMs.since(now - LATENCY_WINDOW_MS)),
        itlMs: summarize(requests.itlMs.since(now - LATENCY_WINDOW_MS)),
        e2eMs: summarize(requests.e2eMs.since(now - LATENCY_WINDOW_MS)),
      },
      steps: stepSummary(engine.timings.recent(STEP_WINDOW)),
      worker: { pid: engine.pid, alive: this.workerState === "alive", state: this.workerState, exit: this.lastDeath, restarts: this.restarts },
      nodes: [...(this.options.nodes?.() ?? [])],
    };
  }

  /**
   * Records `sample` and returns the one rates are taken against: the oldest
   * within the rate window, else the newest before it (a first look after a
   * long pause averages over the pause), else `sample` itself (rates 0).
   */
  private rateBase(sample: CounterSample): CounterSample {
    const history = this.history;
    while (history.length > 1 && (history[1] as CounterSample).atMs <= sample.atMs - RATE_WINDOW_MS) history.shift();
    const base = history[0] ?? sample;
    history.push(sample);
    // A client polling in a loop must not grow this without bound.
    if (history.length > MAX_HISTORY) history.splice(0, history.length - MAX_HISTORY);
    return base;
  }
}

function stepSummary(recent: readonly StepTiming[]): DashboardSnapshot["steps"] {
  let rows = 0;
  let tokens = 0;
  for (const t of recent) {
    rows += t.numRows;
    tokens += t.numTokens;
  }
  const phases = PHASE_FIELDS.map(([phase, field]): PhaseSummary => {
    const values = recent.map((t) => t[field]).sort((a, b) => a - b);
    let sum = 0;
    for (const v of values) sum += v;
    return { phase, meanMs: values.length === 0 ? 0 : sum / values.length, p50Ms: percentile(values, 50), p99Ms: percentile(values, 99) };
  });
  const n = recent.length;
  return { count: n, meanRows: n === 0 ? 0 : rows / n, meanTokens: n === 0 ? 0 : tokens / n, phases };
}
