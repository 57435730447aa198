// `baton bench overhead`: what the control plane costs per decode step, with
// the model taken out. A real Python worker runs in the dummy-null load format
// (real process, real ZeroMQ messages, the forward replaced by "last token +
// 1"), the real engine core drives it, and the real HTTP server (fastify, in
// this process) streams every token as an SSE chunk to B real HTTP clients
// (in a child process, so reading the streams does not run on the server's
// event loop). Each request is a /v1/completions stream with a long max_tokens
// and ignore_eos, so the measured steps are decode steps at batch B.
//
// Per step (sync scheduling: one step in flight, so phases add up):
//   schedule, build      the engine core's timing ring (Scheduler.schedule, buildStepMessage)
//   encode, decode       msgpack encode of the Step / decode of the StepResult (transport/channel.ts codecTimings)
//   worker_round_trip    executeStep to its result minus encode and decode: ZeroMQ ipc both ways,
//                        the Python worker (its own time reported as worker_ms) and promise resolution
//   process              the engine applying results: stop checks, output callbacks (the frontend's
//                        Generation.onOutput and the detokenizer push included)
//   detokenize           the detokenizer's batch on the event loop (text/detokenizer.ts detokenizerTimings)
//   stream               the rest of the step: delta callbacks, SSE chunk JSON, res.write to the
//                        sockets, and the event-loop turn before the next step (measured as step
//                        minus every other phase)
//   step                 from one executeStep call to the next
// engine_core = schedule + build + process.

import { fork, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { readModelDir } from "../config/model-dir.js";
import { EngineCore, type EngineConfig } from "../engine/engine-core.js";
import type { StepExecutor } from "../engine/types.js";
import { buildServer, type BatonServer } from "../frontend/server.js";
import { detokenizerTimings } from "../text/detokenizer.js";
import { TextTokenizer } from "../text/tokenizer.js";
import { codecTimings } from "../transport/channel.js";
import type { StepMessage, StepResultMessage } from "../transport/messages.js";
import { startWorker } from "../worker/supervisor.js";
import type { WorkerClient } from "../worker/types.js";

export const PHASES = ["schedule", "build", "encode", "worker_round_trip", "decode", "process", "detokenize", "stream", "step"] as const;
export type Phase = (typeof PHASES)[number];

export interface Percentiles {
  p50: number;
  p99: number;
  mean: number;
}

export interface BatchResult {
  batch_size: number;
  steps: number;
  engine_core_ms_p50: number;
  engine_core_ms_p99: number;
  step_ms_p50: number;
  step_ms_p99: number;
  /** Tokens streamed per second over the measured steps. */
  tokens_per_s: number;
  /** The worker's own time per step (prepare + forward + sample), inside worker_round_trip. */
  worker_ms_p50: number;
  /** Most steps the engine had in flight at once (2 with overlap scheduling). */
  max_in_flight: number;
  phases: Record<Phase, Percentiles>;
}

export interface OverheadOptions {
  /** A model directory with tokenizer.json (the weights are not loaded). */
  modelDir: string;
  batchSizes: number[];
  /** Measured steps per batch size. */
  steps: number;
  /** Steps skipped once all B requests are running. */
  warmupSteps?: number;
  promptLen?: number;
  /** Passed to EngineConfig when defined (overlap scheduling on/off). */
  asyncScheduling?: boolean;
  python?: string;
  /** Progress lines (stderr). */
  log?: (line: string) => void;
}

const BLOCK_SIZE = 16;

export function percentiles(values: readonly number[]): Percentiles {
  if (values.length === 0) return { p50: Number.NaN, p99: Number.NaN, mean: Number.NaN };
  const sorted = Float64Array.from(values).sort();
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] as number;
  let sum = 0;
  for (const v of sorted) sum += v;
  return { p50: at(0.5), p99: at(0.99), mean: sum / sorted.length };
}

interface StepRecord {
  callMs: number;
  encodeMs: number;
  decodeMs: number;
  detokBusyAtCall: number;
  tokens: number;
  workerMs: number;
}

/** Wraps the worker: times each executeStep and what the codec did for it. */
class TimedExecutor implements StepExecutor {
  readonly records = new Map<number, StepRecord>();
  recording = false;
  inFlight = 0;
  maxInFlight = 0;
  onStep: (() => void) | null = null;

  constructor(private readonly inner: WorkerClient) {}

  get ready() {
    return this.inner.ready;
  }

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    const callMs = performance.now();
    const detokBusyAtCall = detokenizerTimings.busyMs;
    const promise = this.inner.executeStep(step);
    const encodeMs = codecTimings.encodeMs;
    this.inFlight++;
    if (this.inFlight > this.maxInFlight) this.maxInFlight = this.inFlight;
    this.onStep?.();
    const recording = this.recording;
    return promise.then(
      (result) => {
        this.inFlight--;
        if (recording) {
          const t = result.timings;
          this.records.set(step.step_id, {
            callMs,
            encodeMs,
            decodeMs: codecTimings.decodeMs,
            detokBusyAtCall,
            tokens: result.token_ids.length,
            workerMs: t.prepare_ms + t.forward_ms + t.sample_ms,
          });
        }
        return result;
      },
      (error: unknown) => {
        this.inFlight--;
        throw error;
      },
    );
  }
}

/** The streaming clients' child process. */
class Clients {
  private constructor(private readonly child: ChildProcess) {}

  static start(): Clients {
    const script = join(dirname(fileURLToPath(import.meta.url)), "sse-clients.js");
    return new Clients(fork(script, [], { stdio: ["ignore", "ignore", "inherit", "ipc"] }));
  }

  private next(type: string): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const onMessage = (message: Record<string, unknown>): void => {
        if (message.type === "error") {
          cleanup();
          reject(new Error(`a benchmark client failed: ${String(message.message)}`));
        } else if (message.type === type) {
          cleanup();
          resolve(message);
        }
      };
      const onExit = (): void => {
        cleanup();
        reject(new Error("the benchmark clients' process exited"));
      };
      const cleanup = (): void => {
        this.child.off("message", onMessage);
        this.child.off("exit", onExit);
      };
      this.child.on("message", onMessage);
      this.child.on("exit", onExit);
    });
  }

  async open(port: number, bodies: string[]): Promise<void> {
    const opened = this.next("opened");
    this.child.send({ type: "open", port, bodies });
    await opened;
  }

  async close(): Promise<{ bytes: number; events: number }> {
    const closed = this.next("closed");
    this.child.send({ type: "close" });
    return (await closed) as unknown as { bytes: number; events: number };
  }

  stop(): void {
    this.child.kill("SIGKILL");
  }
}

function requestBodies(b: number, promptLen: number, maxTokens: number, model: string, vocab: number): string[] {
  const bodies: string[] = [];
  for (let r = 0; r < b; r++) {
    // Distinct prompts (no prefix-cache sharing) spread over the vocabulary, so the
    // null worker's "last + 1" outputs walk through varied text.
    const start = 1000 + ((r * 9973) % Math.max(1, vocab - 2000 - promptLen));
    const prompt = Array.from({ length: promptLen }, (_, i) => start + i);
    bodies.push(JSON.stringify({ model, prompt, max_tokens: maxTokens, ignore_eos: true, stream: true, temperature: 0 }));
  }
  return bodies;
}

function waitFor(condition: () => boolean, timeoutMs: number, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const timer = setInterval(() => {
      if (condition()) {
        clearInterval(timer);
        resolve();
      } else if (Date.now() - started > timeoutMs) {
        clearInterval(timer);
        reject(new Error(`timed out waiting for ${what}`));
      }
    }, 2);
  });
}

/** Runs the workload for each batch size on one worker, engine and server. */
export async function runOverhead(options: OverheadOptions): Promise<BatchResult[]> {
  const log = options.log ?? (() => {});
  const warmup = options.warmupSteps ?? 20;
  const promptLen = options.promptLen ?? 8;
  const maxB = Math.max(...options.batchSizes);
  const info = readModelDir(options.modelDir);
  const tokenizer = TextTokenizer.fromFile(info.tokenizerPath, { bosTokenId: info.bosTokenId, addBosToken: info.tokenizer.addBosToken });
  const maxModelLen = 4096;
  const worker = await startWorker({
    modelDir: info.dir,
    blockSize: BLOCK_SIZE,
    numBlocks: maxB * Math.ceil(maxModelLen / BLOCK_SIZE) + 16,
    maxModelLen,
    dtype: "auto",
    device: "cpu",
    seed: 0,
    loadFormat: "dummy-null",
    forwardOutput: false,
    ...(options.python !== undefined ? { python: options.python } : {}),
  });
  const executor = new TimedExecutor(worker);
  let server: BatonServer | null = null;
  let clients: Clients | null = null;
  let engine: EngineCore | null = null;
  try {
    const ready = worker.ready;
    const config: EngineConfig = {
      maxNumSeqs: maxB,
      maxNumBatchedTokens: Math.max(2048, maxB * promptLen),
      maxModelLen: ready.max_model_len,
      blockSize: ready.block_size,
      numBlocks: ready.num_blocks,
      enablePrefixCaching: true,
      timingCapacity: Math.max(4096, 2 * (options.steps + warmup)),
    };
    // The engine's overlap flag (EngineConfig.asyncScheduling); an engine without it ignores it.
    if (options.asyncScheduling !== undefined) (config as EngineConfig & { asyncScheduling?: boolean }).asyncScheduling = options.asyncScheduling;
    const core = new EngineCore(executor, config);
    engine = core;
    server = buildServer({
      engine: core,
      tokenizer,
      chatTemplate: null,
      servedModelName: "bench",
      maxModelLen: ready.max_model_len,
      eosTokenIds: info.eosTokenIds,
      vocabSize: ready.vocab_size,
    });
    await server.app.listen({ host: "127.0.0.1", port: 0 });
    const port = (server.app.server.address() as AddressInfo).port;
    clients = Clients.start();

    const results: BatchResult[] = [];
    for (const b of options.batchSizes) {
      const maxTokens = ready.max_model_len - promptLen;
      if (options.steps + warmup + 64 > maxTokens) throw new Error(`--steps ${options.steps} is too many for max_model_len ${ready.max_model_len}`);
      executor.records.clear();
      executor.maxInFlight = 0;
      // Admission, then warmup, then the measured window, counted in executeStep calls.
      let phase: "admit" | "warmup" | "measure" | "done" = "admit";
      let left = 0;
      let finished: () => void = () => {};
      const measured = new Promise<void>((resolve) => (finished = resolve));
      executor.onStep = () => {
        if (phase === "admit") {
          const stats = core.stats;
          if (stats.numRunning === b && stats.numWaiting === 0) {
            phase = "warmup";
            left = warmup;
          }
        } else if (phase === "warmup") {
          if (--left <= 0) {
            phase = "measure";
            left = options.steps + 1;
            core.timings.clear();
            executor.recording = true;
          }
        } else if (phase === "measure") {
          // One extra call closes the last measured step's period.
          if (--left <= 0) {
            phase = "done";
            executor.recording = false;
            finished();
          }
        }
      };
      const t0 = performance.now();
      await clients.open(port, requestBodies(b, promptLen, maxTokens, "bench", tokenizer.vocabSize));
      await measured;
      const wallMs = performance.now() - t0;
      executor.onStep = null;
      await clients.close();
      await waitFor(() => core.stats.numRunning === 0 && core.stats.numWaiting === 0, 60_000, "the aborted requests to leave the engine");
      const result = summarize(b, core, executor);
      log(
        `B=${b}: step p50 ${result.step_ms_p50.toFixed(3)} ms, engine core p50 ${result.engine_core_ms_p50.toFixed(3)} ms, ` +
          `${Math.round(result.tokens_per_s)} tok/s (${(wallMs / 1000).toFixed(1)} s)`,
      );
      results.push(result);
    }
    return results;
  } finally {
    clients?.stop();
    if (server !== null) await server.app.close().catch(() => {});
    if (engine !== null) await engine.close().catch(() => {});
    await worker.shutdown().catch(() => {});
  }
}

function summarize(b: number, engine: EngineCore, executor: TimedExecutor): BatchResult {
  const ring = new Map(engine.timings.recent().map((t) => [t.stepId, t]));
  const ids = [...executor.records.keys()].sort((x, y) => x - y);
  const series: Record<Phase, number[]> = Object.fromEntries(PHASES.map((p) => [p, [] as number[]])) as Record<Phase, number[]>;
  const core: number[] = [];
  const worker: number[] = [];
  let tokens = 0;
  for (let i = 0; i + 1 < ids.length; i++) {
    const id = ids[i] as number;
    const rec = executor.records.get(id) as StepRecord;
    const next = executor.records.get(ids[i + 1] as number) as StepRecord;
    const t = ring.get(id);
    const tNext = ring.get(ids[i + 1] as number);
    if (t === undefined || tNext === undefined) continue;
    const step = next.callMs - rec.callMs;
    const detok = next.detokBusyAtCall - rec.detokBusyAtCall;
    // Step k's period holds its round trip and processing and step k+1's scheduling and build.
    const schedule = tNext.scheduleMs;
    const build = tNext.buildMs;
    const rtt = Math.max(0, t.roundTripMs - rec.encodeMs - rec.decodeMs);
    series.schedule.push(schedule);
    series.build.push(build);
    series.encode.push(rec.encodeMs);
    series.worker_round_trip.push(rtt);
    series.decode.push(rec.decodeMs);
    series.process.push(t.processMs);
    series.detokenize.push(detok);
    series.stream.push(Math.max(0, step - (t.roundTripMs + t.processMs + detok + schedule + build)));
    series.step.push(step);
    core.push(schedule + build + t.processMs);
    worker.push(rec.workerMs);
    tokens += rec.tokens;
  }
  const first = executor.records.get(ids[0] as number);
  const last = executor.records.get(ids[ids.length - 1] as number);
  const spanMs = first !== undefined && last !== undefined ? last.callMs - first.callMs : Number.NaN;
  const phases = Object.fromEntries(PHASES.map((p) => [p, percentiles(series[p])])) as Record<Phase, Percentiles>;
  const coreP = percentiles(core);
  return {
    batch_size: b,
    steps: series.step.length,
    engine_core_ms_p50: coreP.p50,
    engine_core_ms_p99: coreP.p99,
    step_ms_p50: phases.step.p50,
    step_ms_p99: phases.step.p99,
    tokens_per_s: (tokens / spanMs) * 1000,
    worker_ms_p50: percentiles(worker).p50,
    max_in_flight: executor.maxInFlight,
    phases,
  };
}

export interface CompareResult {
  batch_size: number;
  sync_tokens_per_s: number;
  async_tokens_per_s: number;
  /** async / sync throughput. */
  ratio: number;
  sync_step_ms_p50: number;
  async_step_ms_p50: number;
  /** Steps in flight at once with overlap on; 1 means the engine did not overlap. */
  async_max_in_flight: number;
}

/** The same workload with overlap scheduling off, then on (a fresh worker and engine each). */
export async function runCompareAsync(options: Omit<OverheadOptions, "asyncScheduling">): Promise<CompareResult[]> {
  const off = await runOverhead({ ...options, asyncScheduling: false });
  const on = await runOverhead({ ...options, asyncScheduling: true });
  return off.map((s, i) => {
    const a = on[i] as BatchResult;
    return {
      batch_size: s.batch_size,
      sync_tokens_per_s: s.tokens_per_s,
      async_tokens_per_s: a.tokens_per_s,
      ratio: a.tokens_per_s / s.tokens_per_s,
      sync_step_ms_p50: s.step_ms_p50,
      async_step_ms_p50: a.step_ms_p50,
      async_max_in_flight: a.max_in_flight,
    };
  });
}
