// What the rest of Baton sees of a running engine core and its model worker,
// whichever thread the engine core runs on (start.ts chooses).

import type { Deployment } from "../config/deployment.js";
import type { RouterOptions } from "../router/router.js";
import type { GraphEventCallback, GraphRequest, NodeStats, NodeStepSample } from "../conductor/graph-engine.js";
import type { EngineConfig } from "../engine/engine-core.js";
import type { EngineHandle } from "../engine/types.js";
import type { LoraAdapterRef } from "../engine/lora.js";
import type { CompiledGraph } from "../graph/compile.js";
import type { EngineStatsSource } from "../observability/metrics.js";
import type { GrammarService } from "../structured/grammar-service.js";
import type { ReadyMessage } from "../transport/messages.js";
import type { RestartPolicy } from "../worker/supervisor.js";
import type { WorkerHealthEvent, WorkerOptions } from "../worker/types.js";

/** Engine settings the user chooses; block size, block count and max model length come from the worker's Ready. */
export type EngineSettings = Omit<EngineConfig, "maxModelLen" | "blockSize" | "numBlocks">;

export interface ServingEngine extends EngineHandle, EngineStatsSource {
  /** Rank 0's Ready. */
  readonly ready: ReadyMessage;
  /** The kv_cache node's engine configuration (the LLM's, for a plain LLM). */
  readonly config: EngineConfig;
  /** The model's graph (a plain LLM: node llm, walks prefill and decode). */
  readonly graph: CompiledGraph;
  /** Rank 0's process id (the current incarnation's). */
  readonly pid: number;
  /** Every worker's process id, by rank (current incarnations). */
  readonly pids: readonly number[];
  /** A request for the graph's own outputs (audio...); refused synchronously with RequestRejectedError. */
  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void;
  /** Per-node queue depths, as of the last step. */
  nodeStats(): NodeStats[];
  /** Stateless batches' round trips since the last call. */
  takeNodeSteps(): NodeStepSample[];
  /** Tensors the control plane refers to, as of the last step (leak checks). */
  readonly heldTensors: number;
  /** Loads a LoRA adapter on every worker (rejects with LoraLoadError naming the problem). */
  loadLora(ref: LoraAdapterRef): Promise<void>;
  /** New requests may no longer use the adapter; the workers drop it once its requests end. */
  unloadLora(id: number): void;
  /** Every worker death, restart and give-up (not a shutdown), for health, logs and the dashboard. */
  onWorkerEvent(listener: (event: WorkerHealthEvent) => void): void;
  /** Ends live requests ("abort"), then shuts the model worker down. Idempotent. */
  close(): Promise<void>;
}

export interface DataParallelOptions {
  /** Replicas (engine cores, each with its own worker); at least 2. */
  size: number;
  router: RouterOptions;
}

export interface ServingEngineOptions {
  worker: WorkerOptions;
  engine: EngineSettings;
  /** `--deployment`: which worker rank runs which nodes; null or absent: one worker runs all. */
  deployment?: Deployment | null;
  /** The engine core in its own thread (default true). */
  engineThread?: boolean;
  /** Restarting dead workers (--max-worker-restarts); absent: a death is final. */
  restart?: RestartPolicy;
  /** Aborting it while the worker loads stops the start (it then rejects). */
  signal?: AbortSignal;
  /** Structured output: the grammar thread the engine core asks for token masks (absent: requests with a grammar are refused). */
  grammar?: GrammarService | null;
  /** --data-parallel-size > 1: that many replicas behind a router (data-parallel.ts); absent: one engine. */
  dataParallel?: DataParallelOptions | null;
}

/** The engine could start its worker but not itself (e.g. a configuration the worker's Ready contradicts). */
export class EngineStartError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "EngineStartError";
  }
}
