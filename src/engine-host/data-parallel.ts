// Data parallel (--data-parallel-size N): N replicas, each a whole
// ServingEngine (an engine core in its own thread, or on the main loop with
// --no-engine-thread, with its own model worker and its own KV cache), behind
// one frontend. Each request goes to one replica, chosen by the router
// (src/router/router.ts) when it is submitted, and stays there: its outputs,
// its abort, and, when that replica's worker dies, its migration (the
// replica's own engine carries it over to the restarted worker under
// --max-request-migrations). New requests are routed around a replica whose
// worker is down; one that gave up (--max-worker-restarts) is never routed to
// again.
//
// Server-level numbers (stats for admission and the dashboard) are the sum
// over replicas; /metrics reads each replica's own (`replicas`) and labels
// them engine="i".

import { EngineStartError, type DataParallelOptions, type ServingEngine, type ServingEngineOptions } from "./types.js";
import type { WorkerHealthEvent } from "../worker/types.js";
import { EMPTY_STATS, type EngineConfig, type EngineStats } from "../engine/engine-core.js";
import type { StepTiming } from "../engine/step-timings.js";
import type { EngineRequest, OutputCallback, RequestId } from "../engine/types.js";
import { loadOnAll, type LoraAdapterRef } from "../engine/lora.js";
import { addSpecDecodeStats, emptySpecDecodeStats } from "../engine/speculation.js";
import type { GraphEventCallback, GraphRequest, NodeStats, NodeStepSample } from "../conductor/graph-engine.js";
import type { CompiledGraph } from "../graph/compile.js";
import type { ReadyMessage } from "../transport/messages.js";
import { ROUTE_REASONS, createRouter, type ReplicaRouter, type RouteReason, type RouterPolicy } from "../router/router.js";

/** Starts one replica (the placement start.ts chooses). */
export type ReplicaStarter = (options: ServingEngineOptions) => Promise<ServingEngine>;

/** A replica's state as the router sees it. */
interface ReplicaState {
  /** Ranks whose worker is down now. */
  readonly downRanks: Set<number>;
  /** Its workers gave up restarting: never routed to again. */
  gone: boolean;
  /** Requests routed to it and not finished. */
  load: number;
  /** Requests routed to it, by why. */
  readonly routed: Map<RouteReason, number>;
}

/** The stats that add up across replicas. */
type CountKey = Exclude<keyof EngineStats, "prefillKv" | "specDecode">;


/**
 * The CUDA device a replica's worker sees: the i-th of CUDA_VISIBLE_DEVICES
 * when it is set, else device i with --device cuda; nothing with --device auto
 * or cpu (each worker then uses what it finds).
 */
export function replicaCudaDevice(replica: number, device: string, env: NodeJS.ProcessEnv = process.env): string | null {
  if (device === "cpu") return null;
  const visible = env.CUDA_VISIBLE_DEVICES?.split(",").filter((d) => d.trim() !== "");
  if (visible !== undefined && visible.length > 0) return visible[replica % visible.length] as string;
  return device === "cuda" ? String(replica) : null;
}

export class DataParallelEngine implements ServingEngine {
  private readonly states: ReplicaState[];
  /** Live request id -> its replica. */
  private readonly placement = new Map<RequestId, number>();
  private readonly listeners: ((event: WorkerHealthEvent) => void)[] = [];
  private closing: Promise<void> | null = null;
  readonly timings: { recent(limit?: number): StepTiming[] };

  private constructor(
    readonly replicas: readonly ServingEngine[],
    private readonly router: ReplicaRouter,
    policy: RouterPolicy,
  ) {
    const reasons = ROUTE_REASONS.filter((r) => (policy === "round-robin") === (r === "round_robin"));
    this.states = replicas.map(() => ({ downRanks: new Set<number>(), gone: false, load: 0, routed: new Map(reasons.map((r) => [r, 0])) }));
    replicas.forEach((replica, i) => replica.onWorkerEvent((event) => this.onReplicaEvent(i, event)));
    // The dashboard's step phases: every replica's recent steps together.
    this.timings = { recent: (limit?: number) => replicas.flatMap((r) => r.timings.recent(limit)) };
  }

  /**
   * Starts every replica at once. A plain LLM only: a graph of models is
   * refused (EngineStartError) once the first replica has told its graph.
   * Rejects with the first replica's failure; nothing is left running then.
   */
  static async start(options: ServingEngineOptions, dataParallel: DataParallelOptions, startReplica: ReplicaStarter): Promise<DataParallelEngine> {
    if (options.deployment) throw new EngineStartError("--data-parallel-size > 1 cannot be combined with --deployment");
    const { onLoadProgress, ...worker } = options.worker;
    const starts = Array.from({ length: dataParallel.size }, (_, i) => {
      const device = replicaCudaDevice(i, worker.device);
      return startReplica({
        ...options,
        worker: {
          ...worker,
          // The replicas' workers share this host's cores.
          hostWorkers: (worker.hostWorkers ?? 1) * dataParallel.size,
          // One progress bar: the first replica's.
          ...(i === 0 && onLoadProgress !== undefined ? { onLoadProgress } : {}),
          ...(device === null ? {} : { env: { CUDA_VISIBLE_DEVICES: device } }),
        },
      });
    });
    const settled = await Promise.allSettled(starts);
    const started = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed !== undefined) {
      await Promise.all(started.map((r) => r.close().catch(() => {})));
      throw failed.reason;
    }
    const first = started[0] as ServingEngine;
    const kvNodes = first.graph.nodes.filter((n) => n.engine === "kv_cache");
    const textOnly = first.graph.clientOutputs.every((c) => c.modality === "text");
    if (first.graph.nodes.length !== 1 || kvNodes.length !== 1 || !textOnly) {
      await Promise.all(started.map((r) => r.close().catch(() => {})));
      const nodes = first.graph.nodes.map((n) => n.name).join(", ");
      throw new EngineStartError(
        `--data-parallel-size > 1 serves plain LLMs only; this model is a graph of models (nodes ${nodes}); serve it with --data-parallel-size 1`,
      );
    }
    // The router caps what it believes each replica caches at what its KV cache holds.
    const capacity = started.map((r) => r.config.numBlocks * r.config.blockSize);
    return new DataParallelEngine(started, createRouter(dataParallel.router, capacity), dataParallel.router.policy);
  }

  get ready(): ReadyMessage {
    return (this.replicas[0] as ServingEngine).ready;
  }

  get config(): EngineConfig {
    return (this.replicas[0] as ServingEngine).config;
  }

  get graph(): CompiledGraph {
    return (this.replicas[0] as ServingEngine).graph;
  }

  get pid(): number {
    return (this.replicas[0] as ServingEngine).pid;
  }

  /** Every replica's workers, replica by replica. */
  get pids(): readonly number[] {
    return this.replicas.flatMap((r) => r.pids);
  }

  /** The sum over replicas (the KV blocks of all of them). */
  get stats(): EngineStats {
    const total = { ...EMPTY_STATS };
    for (const replica of this.replicas) {
      const s = replica.stats;
      for (const key of Object.keys(total) as CountKey[]) total[key] = (total[key] ?? 0) + (s[key] ?? 0);
      if (s.specDecode !== undefined) total.specDecode = addSpecDecodeStats(total.specDecode ?? emptySpecDecodeStats(), s.specDecode);
    }
    return total;
  }

  get heldTensors(): number {
    return this.replicas.reduce((sum, r) => sum + r.heldTensors, 0);
  }

  /** Whether replica i takes new requests now. */
  serving(i: number): boolean {
    const state = this.states[i];
    return state !== undefined && !state.gone && state.downRanks.size === 0;
  }

  /** Requests routed to each replica and not finished. */
  get loads(): readonly number[] {
    return this.states.map((s) => s.load);
  }

  /** Requests routed to each replica so far, by why (baton:router_requests_total). */
  routedCounts(): { replica: number; reason: RouteReason; count: number }[] {
    return this.states.flatMap((s, replica) => [...s.routed].map(([reason, count]) => ({ replica, reason, count })));
  }

  submit(req: EngineRequest, onOutput: OutputCallback): void {
    const serving = this.states.map((_, i) => this.serving(i));
    const { replica, reason } = this.router.route(routingKey(req), serving, this.loads);
    const state = this.states[replica] as ReplicaState;
    this.placement.set(req.id, replica);
    state.load++;
    let open = true;
    const finish = (): void => {
      if (!open) return;
      open = false;
      state.load--;
      if (this.placement.get(req.id) === replica) this.placement.delete(req.id);
    };
    try {
      (this.replicas[replica] as ServingEngine).submit(req, (output) => {
        if (output.finished) finish();
        onOutput(output);
      });
    } catch (error) {
      finish();
      throw error;
    }
    state.routed.set(reason, (state.routed.get(reason) ?? 0) + 1);
  }

  /** Not reached for the graphs of models DP refuses; routed to the least loaded serving replica. */
  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void {
    const serving = this.states.map((_, i) => i).filter((i) => this.serving(i));
    const ids = serving.length > 0 ? serving : this.states.map((_, i) => i);
    const replica = ids.reduce((best, i) => ((this.states[i] as ReplicaState).load < (this.states[best] as ReplicaState).load ? i : best));
    const state = this.states[replica] as ReplicaState;
    this.placement.set(req.id, replica);
    state.load++;
    let open = true;
    (this.replicas[replica] as ServingEngine).submitGraph(req, (event) => {
      if (event.kind !== "chunk" && open) {
        open = false;
        state.load--;
        this.placement.delete(req.id);
      }
      onEvent(event);
    });
  }

  /** On every replica: a request of the adapter may go to any of them. */
  loadLora(ref: LoraAdapterRef): Promise<void> {
    return loadOnAll(this.replicas, ref);
  }

  unloadLora(id: number): void {
    for (const r of this.replicas) r.unloadLora(id);
  }

  abort(requestId: RequestId, reason?: "stop"): void {
    const replica = this.placement.get(requestId);
    if (replica !== undefined) this.replicas[replica]?.abort(requestId, reason);
  }

  /** Per node, summed over replicas. */
  nodeStats(): NodeStats[] {
    const byNode = new Map<string, NodeStats>();
    for (const replica of this.replicas) {
      for (const n of replica.nodeStats()) {
        const seen = byNode.get(n.node);
        if (seen === undefined) byNode.set(n.node, { ...n });
        else {
          seen.queueDepth += n.queueDepth;
          seen.stepSeconds = Math.max(seen.stepSeconds, n.stepSeconds);
        }
      }
    }
    return [...byNode.values()];
  }

  takeNodeSteps(): NodeStepSample[] {
    return this.replicas.flatMap((r) => r.takeNodeSteps());
  }

  onWorkerEvent(listener: (event: WorkerHealthEvent) => void): void {
    this.listeners.push(listener);
  }

  close(): Promise<void> {
    this.closing ??= Promise.all(this.replicas.map((r) => r.close().catch(() => {}))).then(() => {});
    return this.closing;
  }

  private onReplicaEvent(replica: number, event: WorkerHealthEvent): void {
    const state = this.states[replica] as ReplicaState;
    switch (event.kind) {
      case "down":
        state.downRanks.add(event.rank);
        // Its engine forgets its prefix cache (the new worker's KV is empty).
        this.router.forget(replica);
        break;
      case "up":
        state.downRanks.delete(event.rank);
        break;
      case "gave-up":
        state.gone = true;
        this.router.forget(replica);
        break;
    }
    for (const listener of this.listeners) listener({ ...event, replica });
  }
}

/**
 * What the cache-aware router matches: the prompt, behind a mark of its LoRA
 * adapter (a negative id no token has), so an adapter's requests meet the
 * replica whose cache holds that adapter's prefixes, never another adapter's.
 */
export function routingKey(req: Pick<EngineRequest, "promptIds" | "loraId">): readonly number[] {
  const lora = req.loraId ?? 0;
  return lora === 0 ? req.promptIds : [-1 - lora, ...req.promptIds];
}
