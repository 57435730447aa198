// The engine core on the main event loop, driving the model worker directly
// (serve --no-engine-thread). Simplest placement; the frontend's streaming
// then runs between the engine's steps.

import { setTimeout as sleep } from "node:timers/promises";
import { EngineCore, type EngineConfig, type EngineStats } from "../engine/engine-core.js";
import { compileModelGraph } from "../graph/compile.js";
import { checkServableGraph } from "./servable-graph.js";
import { stepMasks } from "../structured/engine-link.js";
import type { StepTimingRing } from "../engine/step-timings.js";
import type { EngineRequest, OutputCallback, StepExecutor } from "../engine/types.js";
import type { ReadyMessage } from "../transport/messages.js";
import { shutdownAllWorkers, startWorker } from "../worker/supervisor.js";
import type { WorkerClient, WorkerExit } from "../worker/types.js";
import { EngineStartError, type ServingEngine, type ServingEngineOptions } from "./types.js";

export class InProcessEngine implements ServingEngine {
  private closing: Promise<void> | null = null;

  private constructor(
    readonly core: EngineCore,
    private readonly worker: WorkerClient,
    readonly config: EngineConfig,
  ) {}

  /**
   * Starts the worker and the engine core. `wrap` lets a benchmark put a
   * timing layer between the two.
   */
  static async start(options: ServingEngineOptions, wrap: (worker: WorkerClient) => StepExecutor = (w) => w): Promise<InProcessEngine> {
    const onAbort = (): void => void shutdownAllWorkers().catch(() => {});
    options.signal?.addEventListener("abort", onAbort, { once: true });
    let worker: WorkerClient;
    try {
      worker = await startWorker(options.worker);
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
    }
    const ready = worker.ready;
    const config: EngineConfig = { ...options.engine, maxModelLen: ready.max_model_len, blockSize: ready.block_size, numBlocks: ready.num_blocks };
    try {
      checkServableGraph(compileModelGraph(ready.graph));
      const grammar = options.grammar ?? null;
      const masks = stepMasks(grammar === null ? null : { port: grammar.connectPort(), vocabSize: grammar.vocabSize }, ready.vocab_size);
      return new InProcessEngine(new EngineCore(wrap(worker), config, { masks }), worker, config);
    } catch (error) {
      await worker.shutdown().catch(() => {});
      throw new EngineStartError(`cannot start the engine: ${(error as Error).message}`);
    }
  }

  get ready(): ReadyMessage {
    return this.worker.ready;
  }

  get pid(): number {
    return this.worker.pid;
  }

  get stats(): EngineStats {
    return this.core.stats;
  }

  get timings(): StepTimingRing {
    return this.core.timings;
  }

  submit(req: EngineRequest, onOutput: OutputCallback): void {
    this.core.submit(req, onOutput);
  }

  abort(requestId: string): void {
    this.core.abort(requestId);
  }

  onWorkerDeath(listener: (exit: WorkerExit) => void): void {
    this.worker.onDeath(listener);
  }

  close(): Promise<void> {
    this.closing ??= stopEngine(this.core, this.worker);
    return this.closing;
  }
}

/** How long stopping waits for the step in flight before shutting the worker down anyway. */
const STEP_GRACE_MS = 5_000;

/**
 * Ends the engine's live requests ("abort", after the step in flight, waiting
 * at most STEP_GRACE_MS for it), then shuts the model worker down. Never rejects.
 */
export async function stopEngine(core: EngineCore | null, worker: WorkerClient | null): Promise<void> {
  if (core !== null) await Promise.race([core.close().catch(() => {}), sleep(STEP_GRACE_MS, undefined, { ref: false })]);
  await worker?.shutdown().catch(() => {});
}
