// The graph engine on the main event loop, driving the model workers directly
// (serve --no-engine-thread). Simplest placement; the frontend's streaming
// then runs between the engine's steps.

import { setTimeout as sleep } from "node:timers/promises";
import type { GraphEventCallback, GraphRequest, NodeStats, NodeStepSample } from "../conductor/graph-engine.js";
import { RequestRejectedError, type EngineConfig, type EngineStats } from "../engine/engine-core.js";
import { StepTimingRing } from "../engine/step-timings.js";
import { stepMasks } from "../engine/step-masks.js";
import type { LoraAdapterRef } from "../engine/lora.js";
import type { EngineRequest, OutputCallback, RequestId } from "../engine/types.js";
import type { StepExecutor } from "../worker/types.js";
import type { CompiledGraph } from "../graph/compile.js";
import type { ReadyMessage } from "../transport/messages.js";
import type { WorkerSupervisor } from "../worker/supervisor.js";
import type { WorkerClient } from "../worker/types.js";
import { applyWorkerEvent, currentWorkers, healthEventOf, startGraphWorkers } from "./graph-workers.js";
import { EngineStartError, type ServingEngine, type ServingEngineOptions } from "./types.js";
import { createModelEngine, type ModelEngine } from "./model-engine.js";
import { OutputProcessor } from "./output-processor.js";
import type { WorkerHealthEvent } from "../worker/types.js";

export class InProcessEngine implements ServingEngine {
  private closing: Promise<void> | null = null;
  private readonly emptyTimings = new StepTimingRing(1);
  private readonly listeners: ((event: WorkerHealthEvent) => void)[] = [];

  private constructor(
    readonly engine: ModelEngine,
    private readonly supervisors: readonly WorkerSupervisor[],
    readonly config: EngineConfig,
    private readonly outputs: OutputProcessor,
  ) {}

  /**
   * Starts the workers and the graph engine. `wrap` lets a benchmark put a
   * timing layer between the engine and a worker.
   */
  static async start(options: ServingEngineOptions, wrap?: (worker: WorkerClient) => StepExecutor): Promise<InProcessEngine> {
    let host: InProcessEngine | null = null;
    const started = await startGraphWorkers(
      options.worker,
      options.deployment ?? null,
      options.restart ?? { maxRestarts: 0 },
      (event) => {
        if (host === null) return;
        applyWorkerEvent(host.engine, event);
        const health = healthEventOf(event);
        for (const listener of host.listeners) listener(health);
      },
      options.signal,
    );
    try {
      const grammar = options.grammar ?? null;
      const workers = currentWorkers(started.supervisors);
      const outputs = new OutputProcessor(false);
      const engine = createModelEngine({
        graph: started.graph,
        workers,
        rankOf: started.rankOf,
      maxConcurrentRequests: options.deployment?.maxConcurrentRequests ?? null,
        engine: options.engine,
        onOutputs: (batch) => outputs.process(batch),
        wrapExecutor: wrap === undefined ? undefined : (_rank, client) => wrap(client),
        stepMasks: (ready) => stepMasks(grammar === null ? null : { port: grammar.connectPort(), vocabSize: grammar.vocabSize }, ready.vocab_size),
      });
      host = new InProcessEngine(engine, started.supervisors, engineConfigOf(engine, workers[0]!.ready, options), outputs);
      return host;
    } catch (error) {
      await Promise.all(started.supervisors.map((s) => s.stop()));
      throw new EngineStartError(`cannot start the engine: ${(error as Error).message}`);
    }
  }

  private get workers(): WorkerClient[] {
    return currentWorkers(this.supervisors);
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
    if (this.outputs.has(req.id)) throw new RequestRejectedError(`request ${req.id}: a request with this id is already running`);
    this.engine.submit(req);
    this.outputs.addText(req.id, onOutput);
  }

  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void {
    this.engine.submitGraph(req, onEvent);
  }

  abort(requestId: RequestId): void {
    this.engine.abort(requestId);
  }

  loadLora(ref: LoraAdapterRef): Promise<void> {
    return this.engine.loadLora(ref);
  }

  unloadLora(id: number): void {
    this.engine.unloadLora(id);
  }

  nodeStats(): NodeStats[] {
    return this.engine.nodeStats();
  }

  takeNodeSteps(): NodeStepSample[] {
    return this.engine.takeStepSamples();
  }

  onWorkerEvent(listener: (event: WorkerHealthEvent) => void): void {
    this.listeners.push(listener);
  }

  close(): Promise<void> {
    this.closing ??= stopEngine(this.engine, this.supervisors);
    return this.closing;
  }
}

/** The engine configuration the frontend validates against: the kv_cache node's, else rank 0's sizes. */
export function engineConfigOf(engine: ModelEngine, ready: ReadyMessage, options: ServingEngineOptions): EngineConfig {
  return engine.config ?? { ...options.engine, maxModelLen: ready.max_model_len, blockSize: ready.block_size, numBlocks: ready.num_blocks };
}

/** How long stopping waits for the step in flight before shutting the workers down anyway. */
const STEP_GRACE_MS = 5_000;

/**
 * Ends the engine's live requests ("abort", after the step in flight, waiting
 * at most STEP_GRACE_MS for it), then stops restarting and shuts the model
 * workers down. Never rejects.
 */
export async function stopEngine(engine: ModelEngine | null, supervisors: readonly WorkerSupervisor[]): Promise<void> {
  if (engine !== null) await Promise.race([engine.close().catch(() => {}), sleep(STEP_GRACE_MS, undefined, { ref: false })]);
  await Promise.all(supervisors.map((s) => s.stop().catch(() => {})));
}
