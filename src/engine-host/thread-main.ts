// The engine thread's entry point (a worker_threads Worker started by
// EngineThread): starts the model worker, runs the engine core's step loop,
// and sends each step's outputs to the main thread as one batch. The HTTP
// frontend on the main thread (detokenizing, streaming to sockets) then never
// delays a step, and a step never waits for the frontend.
//
// The Python worker is spawned from this thread, so its parent-death signal
// (python/baton_worker/orphan.py) fires when this thread ends, and its
// parent-pid watch when the process does.

import { parentPort, workerData } from "node:worker_threads";
import { EngineCore, endingOutput, type EngineConfig } from "../engine/engine-core.js";
import { compileModelGraph } from "../graph/compile.js";
import { checkServableGraph } from "./servable-graph.js";
import type { RequestOutput } from "../engine/types.js";
import { killAllWorkersSync, shutdownAllWorkers, startWorker } from "../worker/supervisor.js";
import { WorkerStartError, type WorkerClient } from "../worker/types.js";
import type { EngineThreadInit, EngineToMainMessage, MainToEngineMessage, OutputsMessage, RichOutput, SubmitMessage } from "./messages.js";
import { stopEngine } from "./in-process.js";
import { StepRecorder } from "./step-recorder.js";
import { stepMasks } from "../structured/engine-link.js";

const port = parentPort;
if (port === null) throw new Error("engine-host/thread-main.js runs only as a worker thread");
const init = workerData as EngineThreadInit;

function post(message: EngineToMainMessage, transfer: ArrayBuffer[] = []): void {
  port?.postMessage(message, transfer);
}

/** Collects the outputs of one step and posts them together (one message per step). */
class Outbox {
  private plain: number[] = [];
  private rich: RichOutput[] = [];
  private scheduled = false;
  private numStepsPosted = 0;
  numSubmitsTaken = 0;

  constructor(
    private readonly core: EngineCore,
    private readonly recorder: StepRecorder | null,
  ) {}

  add(handle: number, output: RequestOutput): void {
    const ids = output.newTokenIds;
    if (ids.length === 1 && output.logprobs === null && !output.finished && output.error === null) {
      this.plain.push(handle, ids[0] as number, output.numCachedTokens);
    } else {
      const { requestId: _id, ...rest } = output;
      this.rich.push({ handle, output: rest });
    }
    this.schedule();
  }

  /** The engine calls every output callback of a step synchronously; the batch goes after them. */
  schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => this.flush());
  }

  private flush(): void {
    const t0 = performance.now();
    this.scheduled = false;
    const stats = this.core.stats;
    const newSteps = stats.numSteps - this.numStepsPosted;
    this.numStepsPosted = stats.numSteps;
    const timings = newSteps > 0 ? this.core.timings.recent(newSteps) : [];
    const plain = Int32Array.from(this.plain);
    const message: OutputsMessage = {
      kind: "outputs",
      plain,
      rich: this.rich,
      stats,
      numSubmitsTaken: this.numSubmitsTaken,
      timings,
      records: this.recorder?.take() ?? [],
    };
    this.plain = [];
    this.rich = [];
    post(message, [plain.buffer as ArrayBuffer]);
    const last = timings[timings.length - 1];
    if (this.recorder !== null && last !== undefined) this.recorder.addPostMs(last.stepId, performance.now() - t0);
  }
}

let worker: WorkerClient | null = null;
let core: EngineCore | null = null;
let outbox: Outbox | null = null;
let closing = false;
/** Engine request id of each live handle. */
const requestIds = new Map<number, string>();

async function start(): Promise<void> {
  let started: WorkerClient;
  try {
    started = await startWorker({
      ...init.worker,
      onLoadProgress: init.worker.reportLoadProgress ? (done, total) => post({ kind: "load-progress", done, total }) : undefined,
    });
  } catch (error) {
    const exit = error instanceof WorkerStartError ? error.exit : null;
    post({ kind: "start-failed", stage: "worker", message: (error as Error).message, exit });
    port?.close();
    return;
  }
  if (closing) {
    // close() came while the worker loaded.
    await started.shutdown().catch(() => {});
    post({ kind: "start-failed", stage: "worker", message: "the engine was closed before the model worker was ready", exit: null });
    return;
  }
  worker = started;
  const ready = started.ready;
  const config: EngineConfig = { ...init.engine, maxModelLen: ready.max_model_len, blockSize: ready.block_size, numBlocks: ready.num_blocks };
  const recorder = init.recordSteps ? new StepRecorder(started) : null;
  if (recorder !== null) recorder.recording = true;
  try {
    checkServableGraph(compileModelGraph(ready.graph));
    core = new EngineCore(recorder ?? started, config, { masks: stepMasks(init.grammar ?? null, ready.vocab_size) });
  } catch (error) {
    await started.shutdown().catch(() => {});
    post({ kind: "start-failed", stage: "engine", message: `cannot start the engine: ${(error as Error).message}`, exit: null });
    port?.close();
    return;
  }
  outbox = new Outbox(core, recorder);
  started.onDeath((exit) => post({ kind: "worker-died", exit }));
  post({ kind: "ready", ready, pid: started.pid, config });
}

function submit({ handle, request }: SubmitMessage): void {
  const engine = core;
  const box = outbox;
  if (engine === null || box === null) return;
  box.numSubmitsTaken++;
  try {
    engine.submit(request, (output) => {
      if (output.finished) requestIds.delete(handle);
      box.add(handle, output);
    });
    requestIds.set(handle, request.id);
  } catch (error) {
    // The main thread checks what it can before posting; whatever slips through ends the request here.
    box.add(handle, endingOutput(request.id, "error", (error as Error).message));
  }
}

async function close(): Promise<void> {
  if (closing) return;
  closing = true;
  // A worker still loading: stop it now rather than wait for it.
  if (worker === null) await shutdownAllWorkers().catch(() => {});
  await starting;
  await stopEngine(core, worker);
  outbox?.schedule();
  // Let the last outputs go out first.
  setImmediate(() => {
    post({ kind: "closed" });
    port?.close();
  });
}

port.on("message", (message: MainToEngineMessage) => {
  switch (message.kind) {
    case "submit":
      submit(message);
      break;
    case "abort": {
      const id = requestIds.get(message.handle);
      if (id !== undefined) core?.abort(id);
      break;
    }
    case "close":
      void close();
      break;
    case "exit-now":
      exitNow(message.done);
      break;
  }
});

/** See ExitNowMessage. */
function exitNow(done: SharedArrayBuffer | null): void {
  killAllWorkersSync();
  if (done !== null) {
    const flag = new Int32Array(done);
    Atomics.store(flag, 0, 1);
    Atomics.notify(flag, 0);
  }
  process.exit(0);
}

// A bug that escapes everything else: end requests with an error, never leave sockets open.
process.on("uncaughtException", (error: Error) => {
  post({ kind: "thread-failed", message: `the engine thread failed: ${error.message}` });
  exitNow(null);
});

const starting = start().catch((error: unknown) => {
  post({ kind: "start-failed", stage: "engine", message: `the engine thread failed: ${(error as Error).message}`, exit: null });
  port.close();
});
