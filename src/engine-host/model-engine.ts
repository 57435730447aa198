// The engines of one served model, as its host (the engine thread, or the main
// thread with --no-engine-thread) drives them.
//
// The engine core is the engine: a plain LLM (the one-node graph: node `llm`,
// walks prefill and decode, token ids in, text tokens out) is served by its
// engine core alone (LlmEngine below), and a text request goes straight to
// it. A graph of models is served by the graph engine (src/conductor), a
// client of the engine cores of its kv_cache nodes that also runs the
// stateless nodes and the model's process_prompt; text requests of such a
// model (a vision-language model's chat) go through it.

import { GraphEngine, type GraphEngineOptions, type GraphEventCallback, type GraphRequest, type NodeStats, type NodeStepSample } from "../conductor/graph-engine.js";
import { WorkerLane, type LaneListener } from "../conductor/worker-lane.js";
import { EngineCore, RequestRejectedError, type EngineConfig, type EngineStats } from "../engine/engine-core.js";
import type { StepTimingRing } from "../engine/step-timings.js";
import { loadOnAll, type LoraAdapterRef } from "../engine/lora.js";
import type { EngineRequest, RequestId } from "../engine/types.js";
import type { CompiledGraph } from "../graph/compile.js";
import { DisaggregatedCore, kvNodeRanks } from "../kv-connector/disaggregated-core.js";
import type { WorkerClient } from "../worker/types.js";

export interface ModelEngine {
  readonly graph: CompiledGraph;
  /** The engine configuration text requests are checked against (the LLM's); null without a kv_cache node. */
  readonly config: EngineConfig | null;
  readonly stats: EngineStats;
  readonly timings: StepTimingRing | null;
  /** A text request, its outputs to the onOutputs the engine was made with; refused synchronously (RequestRejectedError) when it can never run. */
  submit(req: EngineRequest): void;
  /** A request for the graph's own outputs (audio, images). */
  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void;
  abort(requestId: RequestId): void;
  /** Loads a LoRA adapter on every engine core of the model (rejects with LoraLoadError naming the problem). */
  loadLora(ref: LoraAdapterRef): Promise<void>;
  /** New requests may no longer use the adapter; the workers drop it once its requests end. */
  unloadLora(id: number): void;
  nodeStats(): NodeStats[];
  takeStepSamples(): NodeStepSample[];
  heldTensors(): number;
  /** Rank `rank`'s worker died and is being restarted. */
  workerLost(rank: number, reason: string): void;
  /** Rank `rank`'s restarted worker is Ready. */
  workerRestarted(rank: number, client: WorkerClient): void;
  /** Rank `rank`'s worker will not come back. */
  workerGone(rank: number, reason: string): void;
  /** Ends live requests ("abort"), refuses new ones, resolves once no step is running. */
  close(): Promise<void>;
  checkIntegrity(): void;
}

/** Whether the graph is a plain LLM: one kv_cache node fed the prompt's token ids, whose tokens are the client's text. */
function isPlainLlm(graph: CompiledGraph): boolean {
  return (
    graph.nodes.length === 1 &&
    graph.nodes[0]!.engine === "kv_cache" &&
    graph.promptNames.length === 1 &&
    graph.clientOutputs.length === 1 &&
    graph.clientOutputs[0]!.modality === "text"
  );
}

export function createModelEngine(options: GraphEngineOptions): ModelEngine {
  return isPlainLlm(options.graph) ? new LlmEngine(options) : new GraphEngine(options);
}

/** A lane of a plain LLM carries only the KV connector's sends: it has no graph work to report. */
const NO_GRAPH_WORK: LaneListener = { stepDone() {}, stepFailed() {} };

/**
 * A plain LLM: one engine core on the worker hosting `llm`, or, when its
 * prefill and decode walks are placed on two ranks, a prefill and a decode
 * core joined by the KV connector.
 */
class LlmEngine implements ModelEngine {
  readonly graph: CompiledGraph;
  readonly config: EngineConfig;
  private readonly engine: EngineCore | DisaggregatedCore;
  /** Every engine core with the rank it steps on, and the lane between them when there is one (KV sends). */
  private readonly cores: { core: EngineCore; rank: number; lane: WorkerLane | null }[];
  private readonly wrapExecutor: GraphEngineOptions["wrapExecutor"];

  constructor(options: GraphEngineOptions) {
    this.graph = options.graph;
    this.wrapExecutor = options.wrapExecutor;
    const node = options.graph.nodes[0]!;
    const placed = kvNodeRanks(node.name, new Map(options.graph.walks.map((w) => [w.name, options.rankOf(node.name, w.name)])));
    // The deployment's max_concurrent_requests is the scheduler's running limit here: later requests wait in its queue.
    const maxRunning = options.maxConcurrentRequests ?? Infinity;
    const settings = { ...options.engine, maxNumSeqs: Math.min(options.engine.maxNumSeqs, maxRunning) };
    const configOf = (worker: WorkerClient, rank: number): EngineConfig => {
      const ready = worker.ready;
      if (ready.num_blocks < 1) throw new Error(`the worker of rank ${rank} hosts kv_cache node ${node.name} but has no KV cache`);
      return { ...settings, maxModelLen: ready.max_model_len, blockSize: ready.block_size, numBlocks: ready.num_blocks };
    };
    const workerOf = (rank: number): WorkerClient => {
      const worker = options.workers[rank];
      if (worker === undefined) throw new Error(`node ${node.name} is placed on rank ${rank}, which has no worker`);
      return worker;
    };
    if ("prefill" in placed) {
      // Prefill/decode disaggregation: the KV connector joins a core on each rank; their lanes carry its sends.
      const side = (rank: number): { lane: WorkerLane; config: EngineConfig } => {
        const worker = workerOf(rank);
        return { lane: new WorkerLane(rank, worker, NO_GRAPH_WORK, this.wrapExecutor?.(rank, worker) ?? worker), config: configOf(worker, rank) };
      };
      const prefill = side(placed.prefill);
      const decode = side(placed.decode);
      const pd = new DisaggregatedCore({ prefill, decode, onOutputs: options.onOutputs });
      this.engine = pd;
      this.config = { ...decode.config, maxModelLen: Math.min(decode.config.maxModelLen, prefill.config.maxModelLen) };
      this.cores = [
        { core: pd.prefill, rank: placed.prefill, lane: prefill.lane },
        { core: pd.decode, rank: placed.decode, lane: decode.lane },
      ];
      return;
    }
    const rank = placed.rank;
    const worker = workerOf(rank);
    this.config = configOf(worker, rank);
    const core = new EngineCore(this.wrapExecutor?.(rank, worker) ?? worker, this.config, { masks: options.stepMasks?.(worker.ready) ?? null, onOutputs: options.onOutputs });
    this.engine = core;
    this.cores = [{ core, rank, lane: null }];
  }

  get stats(): EngineStats {
    return this.engine.stats;
  }

  get timings(): StepTimingRing {
    return this.engine.timings;
  }

  submit(req: EngineRequest): void {
    if ((req.media?.images.length ?? 0) > 0) throw new RequestRejectedError(`request ${req.id}: this model does not take images`);
    this.engine.submit(req);
  }

  submitGraph(req: GraphRequest): void {
    throw new RequestRejectedError(`request ${req.id}: a plain LLM has no graph outputs; use the text endpoints`);
  }

  abort(requestId: RequestId): void {
    this.engine.abort(requestId);
  }

  loadLora(ref: LoraAdapterRef): Promise<void> {
    return loadOnAll(this.cores.map((c) => c.core), ref);
  }

  unloadLora(id: number): void {
    for (const c of this.cores) c.core.unloadLora(id);
  }

  /** The engine's own stats say all there is: a plain LLM has no graph nodes to report. */
  nodeStats(): NodeStats[] {
    return [];
  }

  takeStepSamples(): NodeStepSample[] {
    return [];
  }

  heldTensors(): number {
    return 0;
  }

  workerLost(rank: number, reason: string): void {
    const message = `the model worker of rank ${rank} died: ${reason}`;
    for (const c of this.cores) {
      if (c.rank !== rank) continue;
      c.lane?.workerLost(new Error(message));
      c.core.executorLost(message);
    }
  }

  workerRestarted(rank: number, client: WorkerClient): void {
    for (const c of this.cores) {
      if (c.rank !== rank) continue;
      if (c.lane !== null) {
        c.lane.replaceClient(client);
        c.core.replaceExecutor(c.lane);
      } else c.core.replaceExecutor(client);
    }
  }

  workerGone(rank: number, reason: string): void {
    for (const c of this.cores) if (c.rank === rank) c.core.executorGone(reason);
    // The other side of a disaggregated pair cannot serve alone: it ends too.
    for (const c of this.cores) if (c.rank !== rank) c.core.executorGone(reason);
  }

  close(): Promise<void> {
    return this.engine.close();
  }

  checkIntegrity(): void {
    this.engine.checkIntegrity();
  }
}
