// The engine thread's entry point (a worker_threads Worker started by
// EngineThread): starts the model worker, runs the engine core's step loop,
// and posts each step's output batch to the main thread as it is. The HTTP
// frontend on the main thread (detokenizing, streaming to sockets) then never
// delays a step, and a step never waits for the frontend.
//
// The Python worker is spawned from this thread, so its parent-death signal
// (python/baton_worker/runtime/orphan.py) fires when this thread ends, and its
// parent-pid watch when the process does.

import { parentPort, workerData } from "node:worker_threads";
import { GraphEngine, type GraphEvent } from "../conductor/graph-engine.js";
import { DeploymentError } from "../config/deployment.js";
import { endingOutput } from "../engine/engine-core.js";
import { EngineOutputs } from "../engine/outputs.js";
import type { RequestId } from "../engine/types.js";
import { killAllWorkersSync, shutdownAllWorkers, type WorkerSupervisor } from "../worker/supervisor.js";
import { WorkerStartError } from "../worker/types.js";
import { applyWorkerEvent, currentWorkers, healthEventOf, startGraphWorkers } from "./graph-workers.js";
import type { EngineThreadInit, EngineToMainMessage, MainToEngineMessage, OutputsMessage, SubmitGraphMessage, SubmitMessage } from "./messages.js";
import { engineConfigOf, stopEngine } from "./in-process.js";
import { createModelEngine, type ModelEngine } from "./model-engine.js";
import { StepRecorder } from "./step-recorder.js";
import { stepMasks } from "../engine/step-masks.js";

const port = parentPort;
if (port === null) throw new Error("engine-host/thread-main.js runs only as a worker thread");
const init = workerData as EngineThreadInit;

function post(message: EngineToMainMessage, transfer: ArrayBuffer[] = []): void {
  port?.postMessage(message, transfer);
}

/** Posts the engine's output batches, with its stats and graph events, as one message per turn of this thread's event loop. */
class Outbox {
  private batches: EngineOutputs[] = [];
  private graph: { id: RequestId; event: GraphEvent }[] = [];
  private scheduled = false;
  private numStepsPosted = 0;
  numSubmitsTaken = 0;

  constructor(
    private readonly core: ModelEngine,
    private readonly recorder: StepRecorder | null,
  ) {}

  addEvent(id: RequestId, event: GraphEvent): void {
    this.graph.push({ id, event });
    this.schedule();
  }

  /** The engine's batch is the outbox's to send: its packed array moves to the main thread without a copy. */
  addOutputs(batch: EngineOutputs): void {
    this.batches.push(batch);
    this.schedule();
  }

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
    const timings = newSteps > 0 && this.core.timings !== null ? this.core.timings.recent(newSteps) : [];
    const batches = this.batches;
    const events = this.graph;
    const transfer: ArrayBuffer[] = batches.map((b) => b.plain.buffer as ArrayBuffer);
    for (const { event } of events) {
      // A chunk's bytes own their buffer (the decoder gives each its own copy) and move without a copy.
      if (event.kind === "chunk" && event.data.byteOffset === 0 && event.data.byteLength === event.data.buffer.byteLength) {
        if (!transfer.includes(event.data.buffer as ArrayBuffer)) transfer.push(event.data.buffer as ArrayBuffer);
      }
    }
    const message: OutputsMessage = {
      kind: "outputs",
      outputs: batches,
      stats,
      numSubmitsTaken: this.numSubmitsTaken,
      timings,
      records: this.recorder?.take() ?? [],
      graph: this.core instanceof GraphEngine
        ? { events, nodes: this.core.nodeStats(), nodeSteps: this.core.takeStepSamples(), heldTensors: this.core.heldTensors() }
        : null,
    };
    this.batches = [];
    this.graph = [];
    post(message, transfer);
    const last = timings[timings.length - 1];
    if (this.recorder !== null && last !== undefined) this.recorder.addPostMs(last.stepId, performance.now() - t0);
  }
}

let supervisors: WorkerSupervisor[] = [];
/** The grammar thread's port (structured output) until an engine core takes it. */
let grammarLink = init.grammar ?? null;
let core: ModelEngine | null = null;
let outbox: Outbox | null = null;
let closing = false;

async function start(): Promise<void> {
  let started;
  try {
    started = await startGraphWorkers(
      {
        ...init.worker,
        onLoadProgress: init.worker.reportLoadProgress ? (done, total) => post({ kind: "load-progress", done, total }) : undefined,
      },
      init.deployment,
      init.restart,
      (event) => {
        if (core === null) return;
        applyWorkerEvent(core, event);
        outbox?.schedule();
        post({ kind: "worker-event", event: healthEventOf(event) });
      },
    );
  } catch (error) {
    const exit = error instanceof WorkerStartError ? error.exit : null;
    const stage = error instanceof WorkerStartError || error instanceof DeploymentError ? "worker" : "engine";
    post({ kind: "start-failed", stage, message: (error as Error).message, exit });
    port?.close();
    return;
  }
  if (closing) {
    // close() came while the workers loaded.
    await Promise.all(started.supervisors.map((s) => s.stop()));
    post({ kind: "start-failed", stage: "worker", message: "the engine was closed before the model worker was ready", exit: null });
    return;
  }
  supervisors = started.supervisors;
  const workers = currentWorkers(supervisors);
  const recorder = init.recordSteps ? new StepRecorder(workers[0]!) : null;
  if (recorder !== null) recorder.recording = true;
  try {
    core = createModelEngine({
      graph: started.graph,
      workers,
      rankOf: started.rankOf,
      maxConcurrentRequests: init.deployment?.maxConcurrentRequests ?? null,
      engine: init.engine,
      onOutputs: (batch) => outbox?.addOutputs(batch),
      onQuietChange: () => outbox?.schedule(),
      wrapExecutor: recorder === null ? undefined : (rank, client) => (rank === 0 ? recorder : client),
      stepMasks: (ready) => {
        // One port to the grammar thread came with the thread: it serves one engine core.
        const grammar = grammarLink;
        grammarLink = null;
        return stepMasks(grammar, ready.vocab_size);
      },
    });
  } catch (error) {
    await Promise.all(started.supervisors.map((s) => s.stop()));
    post({ kind: "start-failed", stage: "engine", message: `cannot start the engine: ${(error as Error).message}`, exit: null });
    port?.close();
    return;
  } finally {
    // Not taken (no kv_cache node, or the start failed): nothing will ask for masks.
    grammarLink?.port.close();
    grammarLink = null;
  }
  const ready = workers[0]!.ready;
  const config = engineConfigOf(core, ready, { worker: init.worker, engine: init.engine });
  outbox = new Outbox(core, recorder);
  post({ kind: "ready", ready, pids: workers.map((w) => w.pid), config });
}

function submit({ request }: SubmitMessage): void {
  const engine = core;
  const box = outbox;
  if (engine === null || box === null) return;
  box.numSubmitsTaken++;
  try {
    engine.submit(request);
  } catch (error) {
    // The main thread checks what it can before posting; whatever slips through ends the request here.
    const ending = new EngineOutputs(0);
    ending.add(endingOutput(request.id, "error", (error as Error).message));
    box.addOutputs(ending);
  }
}

function submitGraph({ request }: SubmitGraphMessage): void {
  const engine = core;
  const box = outbox;
  if (engine === null || box === null) return;
  box.numSubmitsTaken++;
  try {
    engine.submitGraph(request, (event) => box.addEvent(request.id, event));
  } catch (error) {
    box.addEvent(request.id, { kind: "error", message: (error as Error).message, status: 400 });
  }
}

async function close(): Promise<void> {
  if (closing) return;
  closing = true;
  // A worker still loading: stop it now rather than wait for it.
  if (supervisors.length === 0) await shutdownAllWorkers().catch(() => {});
  await starting;
  await stopEngine(core, supervisors);
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
    case "submit-graph":
      submitGraph(message);
      break;
    case "abort":
      core?.abort(message.id);
      // The stats the main thread reads (held tensors, free blocks) change with an abort too.
      outbox?.schedule();
      break;
    case "lora-load": {
      const { callId, ref } = message;
      const loaded = core === null ? Promise.reject(new Error("the engine is not running")) : core.loadLora(ref);
      loaded.then(
        () => post({ kind: "lora-loaded", callId, error: null }),
        (error: Error) => post({ kind: "lora-loaded", callId, error: error.message }),
      );
      break;
    }
    case "lora-unload":
      core?.unloadLora(message.id);
      break;
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
