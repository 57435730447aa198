// The graph engine on the main event loop, driving the model workers directly
// (serve --no-engine-thread). Simplest placement; the frontend's streaming
// then runs between the engine's steps.

import { setTimeout as sleep } from "node:timers/promises";
import { GraphEngine, type GraphEventCallback, type GraphRequest, type NodeStats, type NodeStepSample } from "../conductor/graph-engine.js";
import type { EngineConfig, EngineStats } from "../engine/engine-core.js";
import { StepTimingRing } from "../engine/step-timings.js";
import { stepMasks } from "../structured/engine-link.js";
import type { EngineRequest, OutputCallback, StepExecutor } from "../engine/types.js";
import type { CompiledGraph } from "../graph/compile.js";
import type { ReadyMessage } from "../transport/messages.js";
import { shutdownAllWorkers } from "../worker/supervisor.js";
import type { WorkerClient, WorkerExit } from "../worker/types.js";
import { startGraphWorkers } from "./graph-workers.js";
import { EngineStartError, type ServingEngine, type ServingEngineOptions } from "./types.js";

export class InProcessEngine implements ServingEngine {
  private closing: Promise<void> | null = null;
  private readonly emptyTimings = new StepTimingRing(1);

  private constructor(
    readonly engine: GraphEngine,
    private readonly workers: readonly WorkerClient[],
    readonly config: EngineConfig,
  ) {}

  /**
   * Starts the workers and the graph engine. `wrap` lets a benchmark put a
   * timing layer between the engine and a worker.
   */
  static async start(options: ServingEngineOptions, wrap?: (worker: WorkerClient) => StepExecutor): Promise<InProcessEngine> {
    const onAbort = (): void => void shutdownAllWorkers().catch(() => {});
    options.signal?.addEventListener("abort", onAbort, { once: true });
    let started;
    try {
      started = await startGraphWorkers(options.worker, options.deployment ?? null);
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
    }
    try {
      const grammar = options.grammar ?? null;
      const engine = new GraphEngine({
        graph: started.graph,
        workers: started.workers,
        rankOf: started.rankOf,
      maxConcurrentRequests: options.deployment?.maxConcurrentRequests ?? null,
        engine: options.engine,
        wrapExecutor: wrap === undefined ? undefined : (_rank, client) => wrap(client),
        stepMasks: (ready) => stepMasks(grammar === null ? null : { port: grammar.connectPort(), vocabSize: grammar.vocabSize }, ready.vocab_size),
      });
      return new InProcessEngine(engine, started.workers, engineConfigOf(engine, started.workers[0]!.ready, options));
    } catch (error) {
      await Promise.all(started.workers.map((w) => w.shutdown().catch(() => {})));
      throw new EngineStartError(`cannot start the engine: ${(error as Error).message}`);
    }
  }

  get ready(): ReadyMessage {
    return this.workers[0]!.ready;
  }

  get graph(): CompiledGraph {
    return this.engine.graph;
  }

  get pid(): number {
    return this.workers[0]!.pid;
  }

  get pids(): readonly number[] {
    return this.workers.map((w) => w.pid);
  }

  get stats(): EngineStats {
    return this.engine.stats;
  }

  get timings(): StepTimingRing {
    return this.engine.timings ?? this.emptyTimings;
  }

  get heldTensors(): number {
    return this.engine.heldTensors();
  }

  submit(req: EngineRequest, onOutput: OutputCallback): void {
    this.engine.submit(req, onOutput);
  }

  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void {
    this.engine.submitGraph(req, onEvent);
  }

  abort(requestId: string): void {
    this.engine.abort(requestId);
  }

  nodeStats(): NodeStats[] {
    return this.engine.nodeStats();
  }

  takeNodeSteps(): NodeStepSample[] {
    return this.engine.takeStepSamples();
  }

  onWorkerDeath(listener: (exit: WorkerExit) => void): void {
    let told = false;
    for (const w of this.workers) {
      w.onDeath((exit) => {
        if (told) return;
        told = true;
        listener(exit);
      });
    }
  }

  close(): Promise<void> {
    this.closing ??= stopEngine(this.engine, this.workers);
    return this.closing;
  }
}

/** The engine configuration the frontend validates against: the kv_cache node's, else rank 0's sizes. */
export function engineConfigOf(engine: GraphEngine, ready: ReadyMessage, options: ServingEngineOptions): EngineConfig {
  return engine.config ?? { ...options.engine, maxModelLen: ready.max_model_len, blockSize: ready.block_size, numBlocks: ready.num_blocks };
}

/** How long stopping waits for the step in flight before shutting the workers down anyway. */
const STEP_GRACE_MS = 5_000;

/**
 * Ends the engine's live requests ("abort", after the step in flight, waiting
 * at most STEP_GRACE_MS for it), then shuts the model workers down. Never rejects.
 */
export async function stopEngine(engine: GraphEngine | null, workers: readonly WorkerClient[]): Promise<void> {
  if (engine !== null) await Promise.race([engine.close().catch(() => {}), sleep(STEP_GRACE_MS, undefined, { ref: false })]);
  await Promise.all(workers.map((w) => w.shutdown().catch(() => {})));
}
