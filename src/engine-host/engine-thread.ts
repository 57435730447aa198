// The main thread's handle on an engine core running in its own thread
// (thread-main.ts). It looks like EngineCore to the frontend and the metrics
// (submit, abort, stats, timings) but the step loop, the scheduler, the KV
// block manager and the link to the Python worker live in the engine thread.
//
// Why: one event loop that also writes every token to every client socket
// makes the next step wait for those writes (at 256 streams, several times
// the engine's own cost per step). In its own thread the engine keeps
// stepping while the frontend streams. Each step's outputs cross as one
// batch, which the output processor (output-processor.ts) delivers.
//
// Requests are checked here before they are posted (same rules as
// EngineCore.submit, synchronously), so a refusal is still an exception at
// submit time.

import { once } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "node:worker_threads";
import { checkSubmittable, RequestRejectedError, type EngineConfig, type EngineStats, type SubmitLimits } from "../engine/engine-core.js";
import { EngineOutputs } from "../engine/outputs.js";
import { LoraLoadError, type LoraAdapterRef } from "../engine/lora.js";
import { StepTimingRing } from "../engine/step-timings.js";
import type { EngineRequest, OutputCallback, RequestId } from "../engine/types.js";
import type { GraphEventCallback, GraphRequest, NodeStats, NodeStepSample } from "../conductor/graph-engine.js";
import { compileModelGraph, type CompiledGraph } from "../graph/compile.js";
import type { ReadyMessage } from "../transport/messages.js";
import { WorkerStartError } from "../worker/types.js";
import type { EngineThreadInit, EngineToMainMessage, MainToEngineMessage, OutputsMessage, StepRecord } from "./messages.js";
import { OutputProcessor } from "./output-processor.js";
import { EngineStartError, type ServingEngine, type ServingEngineOptions } from "./types.js";
import type { WorkerHealthEvent } from "../worker/types.js";

export interface EngineThreadOptions extends ServingEngineOptions {
  /** Benchmarks: the engine thread times every step and reports it through onStepRecords. */
  recordSteps?: boolean;
  onStepRecords?: (records: StepRecord[], stats: EngineStats) => void;
  /** How long close() waits for the thread before terminating it (default 15000 ms). */
  closeTimeoutMs?: number;
}

const THREAD_MAIN_URL = new URL("./thread-main.js", import.meta.url);
/** How long an exit hook waits for a thread to kill its worker and close its sockets. */
const EXIT_NOW_WAIT_MS = 2_000;

/** Engine threads still running, for the process 'exit' hook. */
const liveThreads = new Set<Worker>();
let exitHookInstalled = false;

/**
 * Tells the thread to kill its worker and close its sockets, and waits (blocking)
 * until it has: a thread torn down with open ZeroMQ sockets aborts the whole
 * process (zeromq/zeromq.js#411), and 'exit' hooks cannot await.
 */
function exitNowSync(thread: Worker): void {
  const done = new SharedArrayBuffer(4);
  thread.postMessage({ kind: "exit-now", done } satisfies MainToEngineMessage);
  Atomics.wait(new Int32Array(done), 0, 0, EXIT_NOW_WAIT_MS);
}

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on("exit", () => {
    for (const thread of liveThreads) exitNowSync(thread);
  });
}

/** Resolves when the thread has exited, or after ms. */
async function exitedWithin(thread: Worker, ms: number): Promise<void> {
  if (!liveThreads.has(thread)) return;
  await Promise.race([once(thread, "exit"), sleep(ms, undefined, { ref: false })]);
}

/** Stops a thread (after giving it graceMs to end by itself): its worker and sockets first. */
async function stopThread(thread: Worker, graceMs = 0): Promise<void> {
  await exitedWithin(thread, graceMs);
  if (!liveThreads.has(thread)) return;
  const exited = exitedWithin(thread, EXIT_NOW_WAIT_MS);
  exitNowSync(thread);
  await exited;
  // Last resort (the thread did not answer): may abort the process if its sockets are open.
  if (liveThreads.has(thread)) await thread.terminate();
}

/** The engine core in its own thread; see the top of this file. */
export class EngineThread implements ServingEngine {
  readonly timings: StepTimingRing;
  private latest: EngineStats;
  private numSubmitsPosted = 0;
  private numSubmitsTaken = 0;
  private readonly outputs = new OutputProcessor(true);
  private readonly workerListeners: ((event: WorkerHealthEvent) => void)[] = [];
  /** Every model worker's process id, by rank (a restart changes its rank's). */
  private readonly workerPids: number[];
  private state: "running" | "closing" | "closed" = "running";
  private closing: Promise<void> | null = null;
  private readonly exited: Promise<void>;
  /** LoRA loads posted to the thread and not answered yet, by call id. */
  private readonly loraCalls = new Map<number, { resolve(): void; reject(error: Error): void }>();
  private nextCallId = 0;
  private readonly limits: SubmitLimits;
  readonly graph: CompiledGraph;
  private latestNodes: NodeStats[] = [];
  private nodeSteps: NodeStepSample[] = [];
  private latestHeldTensors = 0;

  private constructor(
    private readonly thread: Worker,
    readonly ready: ReadyMessage,
    pids: readonly number[],
    readonly config: EngineConfig,
    private readonly options: EngineThreadOptions,
  ) {
    this.workerPids = [...pids];
    this.graph = compileModelGraph(ready.graph);
    this.timings = new StepTimingRing(config.timingCapacity ?? 1024);
    this.limits = { ...config, vocabSize: ready.vocab_size };
    this.latest = {
      numRunning: 0,
      numWaiting: 0,
      numFreeBlocks: config.numBlocks,
      numCachedBlocks: 0,
      numUsedBlocks: 0,
      numBlocks: config.numBlocks,
      numPreemptions: 0,
      numSteps: 0,
      numPrefixQueryTokens: 0,
      numPrefixHitTokens: 0,
      numSinkErrors: 0,
    };
    this.exited = once(thread, "exit").then(() => undefined);
    thread.on("message", (message: EngineToMainMessage) => this.onMessage(message));
    thread.on("error", (error: Error) => this.outputs.failAll(`the engine thread failed: ${error.message}`));
    void this.exited.then(() => {
      if (this.state === "running") this.outputs.failAll("the engine thread exited");
      this.state = "closed";
    });
  }

  /** Starts the thread, the model worker and the engine; rejects with WorkerStartError when the worker cannot start. */
  static async start(options: EngineThreadOptions): Promise<EngineThread> {
    const { onLoadProgress, ...worker } = options.worker;
    const init: EngineThreadInit = {
      worker: { ...worker, reportLoadProgress: onLoadProgress !== undefined },
      engine: options.engine,
      deployment: options.deployment ?? null,
      restart: options.restart ?? { maxRestarts: 0 },
      recordSteps: options.recordSteps ?? false,
    };
    const grammar = options.grammar ?? null;
    if (grammar !== null) init.grammar = { port: grammar.connectPort(), vocabSize: grammar.vocabSize };
    // Flags about the main entry point (e.g. --input-type of `node -e`) would make the thread's own start fail.
    const execArgv = process.execArgv.filter((arg) => !arg.startsWith("--input-type"));
    const thread = new Worker(THREAD_MAIN_URL, { workerData: init, execArgv, transferList: init.grammar ? [init.grammar.port] : [] });
    installExitHook();
    liveThreads.add(thread);
    thread.once("exit", () => liveThreads.delete(thread));
    // Stopping while the worker loads: the thread shuts it down and answers start-failed.
    const onAbort = (): void => thread.postMessage({ kind: "close" } satisfies MainToEngineMessage);
    options.signal?.addEventListener("abort", onAbort, { once: true });
    const first = await new Promise<EngineToMainMessage>((resolve, reject) => {
      const onMessage = (message: EngineToMainMessage): void => {
        if (message.kind === "load-progress") {
          onLoadProgress?.(message.done, message.total);
          return;
        }
        cleanup();
        resolve(message);
      };
      const onError = (error: Error): void => {
        cleanup();
        reject(new EngineStartError(`the engine thread failed: ${error.message}`));
      };
      const onExit = (code: number): void => {
        cleanup();
        reject(new EngineStartError(`the engine thread exited with code ${code} before it was ready`));
      };
      const cleanup = (): void => {
        thread.off("message", onMessage);
        thread.off("error", onError);
        thread.off("exit", onExit);
      };
      thread.on("message", onMessage);
      thread.on("error", onError);
      thread.on("exit", onExit);
    }).finally(() => options.signal?.removeEventListener("abort", onAbort));
    if (first.kind !== "ready") {
      // The thread ends by itself after start-failed; stop it only if it does not.
      await stopThread(thread, EXIT_NOW_WAIT_MS);
      if (first.kind === "start-failed" && first.stage === "worker") throw new WorkerStartError(first.message, first.exit);
      throw new EngineStartError(first.kind === "start-failed" ? first.message : `unexpected first message from the engine thread: ${first.kind}`);
    }
    return new EngineThread(thread, first.ready, first.pids, first.config, options);
  }

  /** The engine's counters as of its last step; requests posted but not yet taken count as waiting. */
  get stats(): EngineStats {
    const inTransit = this.numSubmitsPosted - this.numSubmitsTaken;
    return inTransit === 0 ? this.latest : { ...this.latest, numWaiting: this.latest.numWaiting + inTransit };
  }

  /** Rank 0's process id. */
  get pid(): number {
    return this.workerPids[0]!;
  }

  get pids(): readonly number[] {
    return this.workerPids;
  }

  get heldTensors(): number {
    return this.latestHeldTensors;
  }

  nodeStats(): NodeStats[] {
    return this.latestNodes;
  }

  takeNodeSteps(): NodeStepSample[] {
    const steps = this.nodeSteps;
    this.nodeSteps = [];
    return steps;
  }

  get alive(): boolean {
    return this.state === "running";
  }

  submit(req: EngineRequest, onOutput: OutputCallback): void {
    if (this.state !== "running") throw new RequestRejectedError(`request ${req.id}: the engine is shutting down`);
    if (this.outputs.has(req.id)) throw new RequestRejectedError(`request ${req.id}: a request with this id is already running`);
    checkSubmittable(req, this.limits);
    this.outputs.addText(req.id, onOutput);
    this.numSubmitsPosted++;
    this.post({ kind: "submit", request: req });
  }

  /** Checked in the engine thread: a refusal arrives as an error event (status 400). */
  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void {
    if (this.state !== "running") throw new RequestRejectedError(`request ${req.id}: the engine is shutting down`);
    if (this.outputs.has(req.id)) throw new RequestRejectedError(`request ${req.id}: a request with this id is already running`);
    this.outputs.addGraph(req.id, onEvent);
    this.numSubmitsPosted++;
    this.post({ kind: "submit-graph", request: req });
  }

  abort(requestId: RequestId): void {
    if (!this.outputs.has(requestId) || this.state === "closed") return;
    this.post({ kind: "abort", id: requestId });
  }

  loadLora(ref: LoraAdapterRef): Promise<void> {
    if (this.state !== "running") return Promise.reject(new LoraLoadError(`adapter ${ref.name}: the engine is shutting down`));
    const callId = this.nextCallId++;
    return new Promise((resolve, reject) => {
      this.loraCalls.set(callId, { resolve, reject });
      this.post({ kind: "lora-load", callId, ref });
    });
  }

  unloadLora(id: number): void {
    if (this.state === "running") this.post({ kind: "lora-unload", id });
  }

  onWorkerEvent(listener: (event: WorkerHealthEvent) => void): void {
    this.workerListeners.push(listener);
  }

  /** Ends live requests ("abort"), shuts the model worker and the thread down. Idempotent. */
  close(): Promise<void> {
    this.closing ??= this.doClose();
    return this.closing;
  }

  private async doClose(): Promise<void> {
    if (this.state === "running") {
      this.state = "closing";
      this.post({ kind: "close" });
    }
    // The thread ends by itself once its worker is down; stop it if it does not in time.
    await stopThread(this.thread, this.options.closeTimeoutMs ?? 15_000);
    this.state = "closed";
    // Whatever the engine did not end (it was terminated) ends here.
    this.outputs.failAll("the engine was shut down", "abort");
    for (const call of this.loraCalls.values()) call.reject(new LoraLoadError("the engine was shut down"));
    this.loraCalls.clear();
  }

  // ------------------------------------------------------------ from the thread

  private onMessage(message: EngineToMainMessage): void {
    switch (message.kind) {
      case "outputs":
        this.onOutputs(message);
        break;
      case "worker-event": {
        const event = message.event;
        if (event.kind === "up") this.workerPids[event.rank] = event.pid;
        for (const listener of this.workerListeners) listener(event);
        break;
      }
      case "thread-failed":
        this.outputs.failAll(message.message);
        break;
      case "lora-loaded": {
        const call = this.loraCalls.get(message.callId);
        this.loraCalls.delete(message.callId);
        if (message.error === null) call?.resolve();
        else call?.reject(new LoraLoadError(message.error));
        break;
      }
      case "closed":
      case "ready":
      case "start-failed":
      case "load-progress":
        break;
    }
  }

  private onOutputs(message: OutputsMessage): void {
    this.latest = message.stats;
    this.numSubmitsTaken = message.numSubmitsTaken;
    for (const timing of message.timings) this.timings.record(timing);
    if (this.options.onStepRecords !== undefined && message.records.length > 0) this.options.onStepRecords(message.records, message.stats);
    for (const batch of message.outputs) this.outputs.process(EngineOutputs.of(batch));
    const graph = message.graph;
    if (graph !== null) {
      this.latestNodes = graph.nodes;
      this.latestHeldTensors = graph.heldTensors;
      for (const s of graph.nodeSteps) this.nodeSteps.push(s);
      if (this.nodeSteps.length > 4096) this.nodeSteps.splice(0, this.nodeSteps.length - 4096);
      for (const { id, event } of graph.events) this.outputs.event(id, event);
    }
  }

  private post(message: MainToEngineMessage): void {
    this.thread.postMessage(message);
  }
}
