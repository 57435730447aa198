// `baton bench overhead`: what the control plane costs per decode step, with
// the model taken out. A real Python worker runs in the dummy-null load format
// (real process, real ZeroMQ messages, the forward replaced by "last token +
// 1"), the real engine core drives it, and the real HTTP server (fastify, in
// this process) streams every token as an SSE chunk to B real HTTP clients
// (in a child process, so reading the streams does not run on the server's
// event loop). Each request is a /v1/completions stream with a long max_tokens
// and ignore_eos, so the measured steps are decode steps at batch B.
// (--load-format auto runs the model's real forward instead.)
//
// Two placements of the engine core (serve's --engine-thread):
// - engine thread (default): the engine core and the worker link run in their
//   own thread; the main thread detokenizes and streams concurrently. A step
//   is then: schedule, build, encode, worker_round_trip, decode, process, post
//   (packing the step's outputs and posting them to the main thread).
// - main thread: everything on one event loop; a step also holds the
//   frontend's work for the previous step's outputs: detokenize, and stream
//   (delta callbacks, SSE chunk JSON, res.write per socket, the event-loop
//   turn; measured as step minus every other phase).
//
// Phases per step (one step in flight: overlap scheduling is off here so that
// they add up to the step):
//   schedule, build      the engine core's timing ring (Scheduler.schedule, buildStepMessage)
//   encode, decode       msgpack encode of the Step / decode of the StepResult (transport/channel.ts codecTimings)
//   worker_round_trip    executeStep to its result minus encode and decode: ZeroMQ ipc both ways,
//                        the Python worker (its own time reported as worker_ms) and promise resolution
//   process              the engine applying results: stop checks, output callbacks
//   step                 from one executeStep call to the next
// engine_core = schedule + build + process (+ post). main_thread_busy is the
// main event loop's utilization over the measured steps.
//
// CPU over the same window, in cores (CPU seconds per wall second): this
// process (HTTP server, detokenizer, SSE, engine thread), the Python worker
// and the clients' process. Tokens received per server core is the front
// end's ceiling per core when the worker costs (almost) nothing.

import { fork, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { readModelDir, requireTokenizer } from "../config/model-dir.js";
import type { EngineStats } from "../engine/engine-core.js";
import { EngineThread } from "../engine-host/engine-thread.js";
import { InProcessEngine } from "../engine-host/in-process.js";
import type { EngineSettings, ServingEngine } from "../engine-host/types.js";
import type { StepRecord } from "../engine-host/messages.js";
import { StepRecorder } from "../engine-host/step-recorder.js";
import { buildServer, type BatonServer } from "../frontend/server.js";
import { detokenizerTimings } from "../text/detokenizer.js";
import { TextTokenizer } from "../text/tokenizer.js";
import type { LoadFormat, WorkerOptions } from "../worker/types.js";

/** Phases of a step in each placement (see the top of this file). */
export const THREAD_PHASES = ["schedule", "build", "encode", "worker_round_trip", "decode", "process", "post", "step"] as const;
export const MAIN_PHASES = ["schedule", "build", "encode", "worker_round_trip", "decode", "process", "detokenize", "stream", "step"] as const;
type Phase = (typeof THREAD_PHASES)[number] | (typeof MAIN_PHASES)[number];

interface Percentiles {
  p50: number;
  p99: number;
  mean: number;
}

export interface BatchResult {
  batch_size: number;
  engine_thread: boolean;
  steps: number;
  engine_core_ms_p50: number;
  engine_core_ms_p99: number;
  step_ms_p50: number;
  step_ms_p99: number;
  /** Tokens generated per second over the measured steps. */
  tokens_per_s: number;
  /** Tokens the clients received per second over the same window. */
  delivered_tokens_per_s: number;
  /** The worker's own time per step (prepare + forward + sample), inside worker_round_trip. */
  worker_ms_p50: number;
  /** Fraction of the measured window the main event loop was busy (0..1). */
  main_thread_busy: number;
  /** Most steps the engine had in flight at once (2 with overlap scheduling). */
  max_in_flight: number;
  /** CPU used over the measured window, in cores: this process (server and engine thread), the worker, the clients. */
  server_cpu_cores: number;
  worker_cpu_cores: number;
  clients_cpu_cores: number;
  /** delivered_tokens_per_s / server_cpu_cores: streamed tokens per second per core of the front end. */
  delivered_tokens_per_server_core: number;
  phases: Partial<Record<Phase, Percentiles>>;
}

export interface OverheadOptions {
  /** A model directory with tokenizer.json (the weights are loaded only with loadFormat "auto"). */
  modelDir: string;
  batchSizes: number[];
  /** Measured steps per batch size. */
  steps: number;
  /** Steps skipped once all B requests are running. */
  warmupSteps?: number;
  promptLen?: number;
  /** Overlap scheduling (EngineConfig.asyncScheduling); default off so phases add up. */
  asyncScheduling?: boolean;
  /** Engine core in its own thread (default) or on the main thread. */
  engineThread?: boolean;
  /** "dummy-null" (default): no model; "auto": the model's real forward. */
  loadFormat?: LoadFormat;
  python?: string;
  /** Progress lines (stderr). */
  log?: (line: string) => void;
}

const BLOCK_SIZE = 16;
const MAX_MODEL_LEN = 4096;

function percentiles(values: readonly number[]): Percentiles {
  if (values.length === 0) return { p50: Number.NaN, p99: Number.NaN, mean: Number.NaN };
  const sorted = Float64Array.from(values).sort();
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] as number;
  let sum = 0;
  for (const v of sorted) sum += v;
  return { p50: at(0.5), p99: at(0.99), mean: sum / sorted.length };
}

interface ClientCount {
  tokens: number;
  atMs: number;
}

/** Linux's USER_HZ: /proc/<pid>/stat counts CPU time in these ticks. */
const CLOCK_TICKS_PER_S = 100;

/** CPU time (ms) another process has used so far; NaN where /proc cannot tell. */
function processCpuMs(pid: number | undefined): number {
  if (pid === undefined) return Number.NaN;
  try {
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS_PER_S;
  } catch {
    return Number.NaN;
  }
}

interface CpuSample {
  wallMs: number;
  serverMs: number;
  workerMs: number;
  clientsMs: number;
}

interface CpuCores {
  server: number;
  worker: number;
  clients: number;
}

/** The streaming clients' child process. */
class Clients {
  private constructor(private readonly child: ChildProcess) {}

  get pid(): number | undefined {
    return this.child.pid;
  }

  static start(): Clients {
    const script = join(dirname(fileURLToPath(import.meta.url)), "sse-clients.js");
    return new Clients(fork(script, [], { stdio: ["ignore", "ignore", "inherit", "ipc"] }));
  }

  private nextCount = 0;

  private next(type: string, seq?: number): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const onMessage = (message: Record<string, unknown>): void => {
        if (message.type === "error") {
          cleanup();
          reject(new Error(`a benchmark client failed: ${String(message.message)}`));
        } else if (message.type === type && (seq === undefined || message.seq === seq)) {
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

  /** Tokens the clients have received so far, and when (on their clock). */
  async count(): Promise<ClientCount> {
    const seq = this.nextCount++;
    const counted = this.next("counted", seq);
    this.child.send({ type: "count", seq });
    return (await counted) as unknown as ClientCount;
  }

  async close(): Promise<{ bytes: number; events: number; tokens: number }> {
    const closed = this.next("closed");
    this.child.send({ type: "close" });
    return (await closed) as unknown as { bytes: number; events: number; tokens: number };
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
        // return_token_ids lets the clients count the tokens they receive.
    bodies.push(JSON.stringify({ model, prompt, max_tokens: maxTokens, ignore_eos: true, stream: true, temperature: 0, return_token_ids: true }));
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

/**
 * Which steps are measured: once all B requests run, `warmup` steps pass, then
 * `steps` steps are kept. Fed one step at a time, with the engine's stats as
 * of then.
 */
class MeasureWindow {
  private phase: "admit" | "warmup" | "measure" | "done" = "admit";
  private left = 0;
  readonly records: StepRecord[] = [];
  /** Main-thread placement: the detokenizer's busy time when each measured step was called. */
  readonly detokAtCall = new Map<number, number>();
  private elu: ReturnType<typeof performance.eventLoopUtilization> | null = null;
  mainBusy = Number.NaN;
  /** What the clients had received when measuring started and ended. */
  private counts: Promise<ClientCount>[] = [];
  private cpu: CpuSample[] = [];
  readonly done: Promise<void>;
  private finish: () => void = () => {};

  constructor(
    private readonly b: number,
    private readonly warmup: number,
    private readonly steps: number,
    private readonly countClients: () => Promise<ClientCount>,
    private readonly sampleCpu: () => CpuSample,
  ) {
    this.done = new Promise((resolve) => (this.finish = resolve));
  }

  /** Tokens per second the clients received while steps were measured. */
  async deliveredPerSecond(): Promise<number> {
    const [first, last] = await Promise.all(this.counts);
    if (first === undefined || last === undefined) return Number.NaN;
    return ((last.tokens - first.tokens) / (last.atMs - first.atMs)) * 1000;
  }

  /** CPU cores each process used while steps were measured. */
  cpuCores(): CpuCores {
    const [first, last] = this.cpu;
    if (first === undefined || last === undefined) return { server: Number.NaN, worker: Number.NaN, clients: Number.NaN };
    const wall = last.wallMs - first.wallMs;
    return { server: (last.serverMs - first.serverMs) / wall, worker: (last.workerMs - first.workerMs) / wall, clients: (last.clientsMs - first.clientsMs) / wall };
  }

  /** One more step; true while steps are measured. */
  onStep(stats: Pick<EngineStats, "numRunning" | "numWaiting">): boolean {
    if (this.phase === "admit") {
      if (stats.numRunning === this.b && stats.numWaiting === 0) {
        this.phase = "warmup";
        this.left = this.warmup;
      }
    } else if (this.phase === "warmup") {
      if (--this.left <= 0) {
        this.phase = "measure";
        this.left = this.steps;
        this.elu = performance.eventLoopUtilization();
        this.counts.push(this.countClients());
        this.cpu.push(this.sampleCpu());
      }
    } else if (this.phase === "measure") {
      if (--this.left <= 0) {
        this.phase = "done";
        if (this.elu !== null) this.mainBusy = performance.eventLoopUtilization(this.elu).utilization;
        this.counts.push(this.countClients());
        this.cpu.push(this.sampleCpu());
        this.finish();
      }
    }
    return this.phase === "measure";
  }
}

/** The engine core under test, in either placement. */
interface EngineUnderTest {
  engine: ServingEngine;
  /** Adds the measured step records taken so far to the window (main-thread placement: from its recorder). */
  collect(window: MeasureWindow): void;
}

/** Engine core and worker link in their own thread; step records come with the outputs. */
async function threadedEngine(worker: WorkerOptions, settings: EngineSettings, current: () => MeasureWindow | null): Promise<EngineUnderTest> {
  const engine = await EngineThread.start({
    worker,
    engine: settings,
    recordSteps: true,
    onStepRecords: (records, stats) => {
      const window = current();
      for (const record of records) if (window?.onStep(stats) === true) window.records.push(record);
    },
  });
  return { engine, collect: () => {} };
}

/** Everything on this event loop; the recorder wraps the worker here. */
async function mainThreadEngine(worker: WorkerOptions, settings: EngineSettings, current: () => MeasureWindow | null): Promise<EngineUnderTest> {
  let recorder: StepRecorder | null = null;
  const engine = await InProcessEngine.start({ worker, engine: settings }, (client) => (recorder = new StepRecorder(client)));
  const rec = recorder as unknown as StepRecorder;
  rec.recording = true;
  rec.onStep = (stepId) => {
    const window = current();
    if (window?.onStep(engine.stats) === true) window.detokAtCall.set(stepId, detokenizerTimings.busyMs);
  };
  const collect = (window: MeasureWindow): void => {
    for (const record of rec.take()) if (window.detokAtCall.has(record.stepId)) window.records.push(record);
  };
  return { engine, collect };
}

/** Runs the workload for each batch size on one worker, engine and server. */
export async function runOverhead(options: OverheadOptions): Promise<BatchResult[]> {
  const log = options.log ?? (() => {});
  const warmup = options.warmupSteps ?? 20;
  const promptLen = options.promptLen ?? 8;
  const maxB = Math.max(...options.batchSizes);
  const threaded = options.engineThread ?? true;
  const info = readModelDir(options.modelDir);
  const tokenizer = TextTokenizer.fromFile(requireTokenizer(info), { bosTokenId: info.bosTokenId, addBosToken: info.tokenizer.addBosToken });
  const workerOptions: WorkerOptions = {
    modelDir: info.dir,
    blockSize: BLOCK_SIZE,
    numBlocks: maxB * Math.ceil(MAX_MODEL_LEN / BLOCK_SIZE) + 16,
    maxModelLen: MAX_MODEL_LEN,
    dtype: "auto",
    device: options.loadFormat === "auto" ? "auto" : "cpu",
    seed: 0,
    loadFormat: options.loadFormat ?? "dummy-null",
    forwardOutput: false,
    ...(options.python !== undefined ? { python: options.python } : {}),
  };
  const settings = {
    maxNumSeqs: maxB,
    maxNumBatchedTokens: Math.max(2048, maxB * promptLen),
    enablePrefixCaching: true,
    asyncScheduling: options.asyncScheduling ?? false,
    timingCapacity: Math.max(4096, 2 * (options.steps + warmup)),
  };

  let window: MeasureWindow | null = null;
  const underTest = await (threaded ? threadedEngine : mainThreadEngine)(workerOptions, settings, () => window);
  const engine = underTest.engine;
  const ready = engine.ready;
  let server: BatonServer | null = null;
  let clients: Clients | null = null;
  try {
    server = buildServer({
      engine,
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
      // One extra step closes the last measured step's period.
      const running = clients;
      const sampleCpu = (): CpuSample => {
        const usage = process.cpuUsage();
        return { wallMs: performance.now(), serverMs: (usage.user + usage.system) / 1000, workerMs: processCpuMs(engine.pid), clientsMs: processCpuMs(running.pid) };
      };
      const current = new MeasureWindow(b, warmup, options.steps + 1, () => running.count(), sampleCpu);
      window = current;
      const t0 = performance.now();
      await clients.open(port, requestBodies(b, promptLen, maxTokens, "bench", tokenizer.vocabSize));
      await current.done;
      const wallMs = performance.now() - t0;
      window = null;
      underTest.collect(current);
      await clients.close();
      await waitFor(() => engine.stats.numRunning === 0 && engine.stats.numWaiting === 0, 60_000, "the aborted requests to leave the engine");
      const result = summarize(b, threaded, engine, current);
      result.delivered_tokens_per_s = await current.deliveredPerSecond();
      const cores = current.cpuCores();
      result.server_cpu_cores = cores.server;
      result.worker_cpu_cores = cores.worker;
      result.clients_cpu_cores = cores.clients;
      result.delivered_tokens_per_server_core = result.delivered_tokens_per_s / cores.server;
      log(
        `B=${b}: step p50 ${result.step_ms_p50.toFixed(3)} ms, engine core p50 ${result.engine_core_ms_p50.toFixed(3)} ms, ` +
          `${Math.round(result.tokens_per_s)} tok/s generated, ${Math.round(result.delivered_tokens_per_s)} tok/s received, main thread ${(result.main_thread_busy * 100).toFixed(0)}% busy, ` +
          `CPU cores: server ${result.server_cpu_cores.toFixed(2)}, worker ${result.worker_cpu_cores.toFixed(2)}, clients ${result.clients_cpu_cores.toFixed(2)} (${(wallMs / 1000).toFixed(1)} s)`,
      );
      results.push(result);
    }
    return results;
  } finally {
    clients?.stop();
    if (server !== null) await server.app.close().catch(() => {});
    await engine.close().catch(() => {});
  }
}

function summarize(b: number, threaded: boolean, engine: ServingEngine, window: MeasureWindow): BatchResult {
  const ring = new Map(engine.timings.recent().map((t) => [t.stepId, t]));
  const records = [...window.records].sort((x, y) => x.stepId - y.stepId);
  const names = threaded ? THREAD_PHASES : MAIN_PHASES;
  const series = new Map<Phase, number[]>(names.map((p) => [p, []]));
  const push = (phase: Phase, value: number): void => void series.get(phase)?.push(value);
  const core: number[] = [];
  const worker: number[] = [];
  let tokens = 0;
  let spanMs = 0;
  let maxInFlight = 0;
  for (let i = 0; i + 1 < records.length; i++) {
    const rec = records[i] as StepRecord;
    const next = records[i + 1] as StepRecord;
    const t = ring.get(rec.stepId);
    const tNext = ring.get(next.stepId);
    if (t === undefined || tNext === undefined || !Number.isFinite(rec.stepMs)) continue;
    // Step k's period holds its round trip and processing and step k+1's scheduling and build.
    const schedule = tNext.scheduleMs;
    const build = tNext.buildMs;
    push("schedule", schedule);
    push("build", build);
    push("encode", rec.encodeMs);
    push("worker_round_trip", Math.max(0, t.roundTripMs - rec.encodeMs - rec.decodeMs));
    push("decode", rec.decodeMs);
    push("process", t.processMs);
    push("step", rec.stepMs);
    if (threaded) {
      push("post", rec.postMs);
      core.push(schedule + build + t.processMs + rec.postMs);
    } else {
      const atCall = window.detokAtCall.get(rec.stepId);
      const atNext = window.detokAtCall.get(next.stepId);
      const detok = atCall !== undefined && atNext !== undefined ? atNext - atCall : 0;
      push("detokenize", detok);
      push("stream", Math.max(0, rec.stepMs - (t.roundTripMs + t.processMs + detok + schedule + build)));
      core.push(schedule + build + t.processMs);
    }
    worker.push(rec.workerMs);
    tokens += rec.tokens;
    spanMs += rec.stepMs;
    maxInFlight = Math.max(maxInFlight, rec.inFlight);
  }
  const phases: Partial<Record<Phase, Percentiles>> = {};
  for (const [name, values] of series) phases[name] = percentiles(values);
  const coreP = percentiles(core);
  const step = phases.step as Percentiles;
  return {
    batch_size: b,
    engine_thread: threaded,
    steps: series.get("step")?.length ?? 0,
    engine_core_ms_p50: coreP.p50,
    engine_core_ms_p99: coreP.p99,
    step_ms_p50: step.p50,
    step_ms_p99: step.p99,
    tokens_per_s: (tokens / spanMs) * 1000,
    delivered_tokens_per_s: Number.NaN,
    worker_ms_p50: percentiles(worker).p50,
    main_thread_busy: window.mainBusy,
    max_in_flight: maxInFlight,
    server_cpu_cores: Number.NaN,
    worker_cpu_cores: Number.NaN,
    clients_cpu_cores: Number.NaN,
    delivered_tokens_per_server_core: Number.NaN,
    phases,
  };
}

export interface CompareResult {
  batch_size: number;
  /** What was switched: "async" (overlap scheduling) or "engine-thread". */
  what: string;
  /** Tokens the clients received per second. */
  off_tokens_per_s: number;
  on_tokens_per_s: number;
  /** on / off received throughput. */
  ratio: number;
  off_step_ms_p50: number;
  on_step_ms_p50: number;
}

/** The same workload with a setting off, then on (a fresh worker and engine each). */
export async function runCompare(what: "async" | "engine-thread", options: OverheadOptions): Promise<CompareResult[]> {
  const set = (on: boolean): OverheadOptions => (what === "async" ? { ...options, asyncScheduling: on } : { ...options, engineThread: on });
  const off = await runOverhead(set(false));
  const on = await runOverhead(set(true));
  return off.map((s, i) => {
    const a = on[i] as BatchResult;
    return {
      batch_size: s.batch_size,
      what,
      off_tokens_per_s: s.delivered_tokens_per_s,
      on_tokens_per_s: a.delivered_tokens_per_s,
      ratio: a.delivered_tokens_per_s / s.delivered_tokens_per_s,
      off_step_ms_p50: s.step_ms_p50,
      on_step_ms_p50: a.step_ms_p50,
    };
  });
}
