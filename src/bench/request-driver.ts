// Sends a workload the way `vllm bench serve` does: requests arrive all at once
// (--request-rate inf) or by a gamma process of the given rate (burstiness 1:
// Poisson; below 1 burstier, above 1 steadier), and at most --max-concurrency
// are in flight; a request that arrives when all slots are busy waits for one.

import { setTimeout as sleep } from "node:timers/promises";
import type { BenchPrompt } from "./dataset.js";
import type { Endpoint, RequestOutcome, StreamClient, StreamRequest } from "./openai-stream.js";
import { SeededRandom } from "./random.js";

/** Optional request fields that not every server accepts (transformers serve rejects unknown fields). */
export interface RequestExtras {
  /** ignore_eos: output lengths exactly max_tokens. */
  ignoreEos: boolean;
  /** return_token_ids: exact tokens per chunk. */
  returnTokenIds: boolean;
}

export interface RequestSettings {
  baseUrl: URL;
  endpoint: Endpoint;
  model: string;
  temperature: number;
  extras: RequestExtras;
  headers: Record<string, string>;
  /** Fields added to every body (--extra-body); the benchmark's own fields win. */
  extraBody?: Record<string, unknown>;
}

export function buildRequest(settings: RequestSettings, prompt: BenchPrompt): StreamRequest {
  const body: Record<string, unknown> = {
    ...settings.extraBody,
    model: settings.model,
    max_tokens: prompt.outputTokens,
    temperature: settings.temperature,
    stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true },
  };
  if (settings.endpoint === "/v1/completions") body.prompt = prompt.prompt;
  else body.messages = [{ role: "user", content: prompt.prompt }];
  if (settings.extras.ignoreEos) body.ignore_eos = true;
  if (settings.extras.returnTokenIds) body.return_token_ids = true;
  return { url: new URL(settings.endpoint.slice(1), withTrailingSlash(settings.baseUrl)), endpoint: settings.endpoint, body, headers: settings.headers };
}

/** new URL("v1/x", base) keeps base's path only when it ends in "/". */
export function withTrailingSlash(url: URL): URL {
  return url.pathname.endsWith("/") ? url : new URL(`${url.href}/`);
}

export interface Schedule {
  /** Requests per second; Infinity sends them all at once. */
  requestRate: number;
  burstiness: number;
  /** null: unlimited. */
  maxConcurrency: number | null;
  seed: number;
}

/** Start offsets in ms of each request (all 0 at an infinite rate). */
export function arrivalOffsetsMs(count: number, schedule: Schedule): number[] {
  if (!Number.isFinite(schedule.requestRate)) return new Array<number>(count).fill(0);
  const rng = new SeededRandom(schedule.seed ^ 0x5bd1e995);
  // Gamma(shape k, scale 1/(rate k)) has mean 1/rate whatever k, so the rate holds and k sets the burstiness.
  const scale = 1 / (schedule.requestRate * schedule.burstiness);
  const offsets: number[] = [];
  let at = 0;
  for (let i = 0; i < count; i++) {
    offsets.push(at * 1000);
    at += rng.gamma(schedule.burstiness, scale);
  }
  return offsets;
}

/** A counting semaphore for --max-concurrency. */
class Slots {
  private free: number;
  private readonly waiting: (() => void)[] = [];

  constructor(size: number) {
    this.free = size;
  }

  async acquire(): Promise<void> {
    if (this.free > 0) {
      this.free--;
      return;
    }
    await new Promise<void>((resolve) => this.waiting.push(resolve));
  }

  release(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.free++;
  }
}

export interface WorkloadRun {
  outcomes: RequestOutcome[];
  startMs: number;
  endMs: number;
}

export async function runWorkload(
  client: StreamClient,
  settings: RequestSettings,
  prompts: readonly BenchPrompt[],
  schedule: Schedule,
  onDone: (done: number, total: number) => void = () => {},
): Promise<WorkloadRun> {
  const offsets = arrivalOffsetsMs(prompts.length, schedule);
  const slots = schedule.maxConcurrency === null ? null : new Slots(schedule.maxConcurrency);
  const startMs = performance.now();
  let done = 0;
  const outcomes = await Promise.all(
    prompts.map(async (prompt, i) => {
      const wait = startMs + (offsets[i] as number) - performance.now();
      if (wait > 0) await sleep(wait);
      await slots?.acquire();
      try {
        return await client.send(buildRequest(settings, prompt));
      } finally {
        slots?.release();
        onDone(++done, prompts.length);
      }
    }),
  );
  let endMs = startMs;
  for (const o of outcomes) endMs = Math.max(endMs, o.endMs);
  return { outcomes, startMs, endMs };
}
