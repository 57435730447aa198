// The graph engine: the conductor joined to the engines that run the nodes.
// - kv_cache nodes run under an EngineCore each (scheduler, KV blocks, prefix
//   cache, stops), whose steps go to the lane of the worker hosting the node;
//   every sampled token becomes the conductor's kvToken event.
// - stateless nodes: the conductor's ready passes are batched per (node, walk)
//   and ride in the next step sent to the worker hosting them (WorkerLane);
//   their results become completePass / failPass events.
// - process_prompt runs on the worker of rank 0 the same way, and its result
//   admits the request.
// Everything is event-driven: the engine acts when a worker answers or a
// client submits or leaves; there is no polling timer.
//
// A plain LLM does not come here: its engine core serves it alone
// (src/engine-host/model-engine.ts). Text requests of a graph (a
// vision-language model's chat) do: submit() runs the model's process_prompt,
// the conductor starts the LLM node's engine-core request, and each token
// reaches the client through the conductor's client output, as
// RequestOutputs (with the engine core's logprobs and finish reason).

import { checkSubmittable, EMPTY_STATS, EngineCore, RequestRejectedError, type EngineConfig, type EngineStats } from "../engine/engine-core.js";
import type { StepTimingRing } from "../engine/step-timings.js";
import { EngineOutputs, type OutputSink } from "../engine/outputs.js";
import { LoraLoadError, type LoraAdapterRef } from "../engine/lora.js";
import type { EngineRequest, RequestId, RequestOutput, StopConditions } from "../engine/types.js";
import type { StepExecutor } from "../worker/types.js";
import { type CompiledClientOutput, type CompiledGraph, type CompiledNode } from "../graph/compile.js";
import type { StepMasks } from "../engine/step-masks.js";
import type { NamedValues, PassBatch, PassResult, PromptResult, ReadyMessage, SamplingParams, StepResultMessage, WireValue } from "../transport/messages.js";
import { Conductor, type ClientOutputMeta, type KvStart, type ReadyBatch } from "./conductor.js";
import type { Value, Values } from "./values.js";
import { planPublishing, type PublishPlan } from "./publish.js";
import { RemoteReads } from "./remote-reads.js";
import { WorkerLane, type AttachedWork, type LaneListener } from "./worker-lane.js";
import type { WorkerClient } from "../worker/types.js";
import { DisaggregatedCore, kvNodeRanks } from "../kv-connector/disaggregated-core.js";

/** What runs a kv_cache node: one engine core, or a prefill and a decode core joined by the KV connector. */
type KvNodeEngine = EngineCore | DisaggregatedCore;

/** A request for a graph's own outputs (audio, images...), as /generate and /v1/audio/speech make them. */
export interface GraphRequest {
  id: RequestId;
  /** Input for the model's process_prompt (run on the worker); null with `values`. */
  prompt: { text: string | null; inputModalities: string[]; outputModalities: string[] } | null;
  /** The prompt's values by name when the caller has them (token ids). */
  values?: ReadonlyMap<string, Values>;
  /** The model's own options (a voice...): process_prompt's kwargs and every pass's request kwargs. */
  modelKwargs: Record<string, unknown>;
  /** Sampling of the graph's kv_cache nodes. */
  sampling: SamplingParams;
  /** Tokens each kv_cache node may generate; null: the node's own limit. */
  maxTokens: number | null;
  priority: number;
  arrivalMs: number;
  /** Partitions that do not run for this request. */
  inactivePartitions?: string[];
  /** 53-bit hash of what the prompt holds beside its text (a voice prompt's reference audio): EngineRequest.inputHash. */
  inputHash?: number;
  /** process_prompt's kwargs beside modelKwargs that no pass needs (a voice prompt's audio bytes). */
  promptKwargs?: Record<string, unknown>;
}

export type GraphEvent =
  | { kind: "chunk"; name: string; modality: string; data: Uint8Array; metadata: Readonly<Record<string, unknown>> }
  | { kind: "done" }
  /** status: 400 when the request itself is at fault (its prompt cannot run), 503 when a worker it used died, else 500. */
  | { kind: "error"; message: string; status: 400 | 500 | 503 };

export type GraphEventCallback = (event: GraphEvent) => void;

/** Per-node numbers for /metrics and the dashboard. */
export interface NodeStats {
  node: string;
  /** Passes ready and waiting for a step (stateless), or requests waiting (kv_cache). */
  queueDepth: number;
  /** The last batch's round trip (stateless nodes; 0 before the first and for kv_cache nodes). */
  stepSeconds: number;
}

export interface NodeStepSample {
  node: string;
  seconds: number;
  /** Passes the batch ran in one forward (requests batched). */
  passes: number;
}

export interface GraphEngineOptions {
  graph: CompiledGraph;
  /** Workers by rank. */
  workers: readonly WorkerClient[];
  /** The rank that runs a node in a walk. */
  rankOf(node: string, walk: string): number;
  /** Text requests' outputs: one batch per engine-core step (a plain LLM's are its engine core's own). */
  onOutputs: OutputSink;
  /** The engine changed without an output to show for it (a stopped request freed its blocks): stats are stale. */
  onQuietChange?: () => void;
  /** Benchmarks: a timing layer between a lane and its worker. */
  wrapExecutor?: (rank: number, client: WorkerClient) => StepExecutor;
  /** Engine-core settings for kv_cache nodes; sizes come from their worker's Ready. */
  engine: Omit<EngineConfig, "maxModelLen" | "blockSize" | "numBlocks">;
  /**
   * Structured output: the grammar masks of the first kv_cache node's engine
   * core (the one text requests are checked against), made for its worker's
   * vocabulary; called once. Absent or null: requests with a grammar are refused.
   */
  stepMasks?: (ready: ReadyMessage) => StepMasks | null;
  /** Requests running at once (M*'s max_concurrent_requests); later ones wait in arrival order. Default: no limit. */
  maxConcurrentRequests?: number | null;
}

interface LiveRequest {
  readonly id: RequestId;
  /** A text request (submit): its outputs go to onOutputs; else a graph request's events to onEvent. */
  readonly text: boolean;
  readonly onEvent: GraphEventCallback | null;
  readonly engineRequest: EngineRequest;
  readonly modelKwargs: Record<string, unknown>;
  admitted: boolean;
  /** Text: tokens for the client since the last output. */
  pending: number[];
  /** In the engine's list of requests with something to flush. */
  touched: boolean;
  /** Counted against maxConcurrentRequests; a waiting request has its start here instead. */
  running: boolean;
  begin: (() => void) | null;
  /** The engine-core output being turned into conductor events, if any (not for a plain token: see onCoreToken). */
  coreOutput: RequestOutput | null;
  /** Prompt tokens its kv_cache node's engine core served from the prefix cache, as of its last output. */
  numCachedTokens: number;
  ended: boolean;
  endReason: RequestOutput["finishReason"];
  endError: string | null;
  /** kv_cache nodes whose engine-core request the conductor stopped. */
  kvStopped: boolean;
  /** Graph requests: the HTTP status of an error before any output (400: the request cannot run; 503: a worker died). */
  endStatus: 400 | 500 | 503;
  /** Text: RequestOutput.promptInfo until its first output carries it. */
  promptInfo: Record<string, number[]> | null;
}

const DEFAULT_STOP: StopConditions = { maxTokens: 1, eosTokenIds: [], stopTokenIds: [], ignoreEos: false, minTokens: 0 };

export class GraphEngine implements LaneListener {
  readonly graph: CompiledGraph;
  readonly conductor: Conductor;
  readonly lanes: readonly WorkerLane[];
  /** Engine core per kv_cache node id (null for stateless nodes). */
  private readonly cores: (KvNodeEngine | null)[];
  /** Every engine core with the lane it steps, for worker deaths and restarts. */
  private readonly coreLaneList: { core: EngineCore; lane: WorkerLane }[] = [];
  /** The lane of each kv_cache node's engine core, by node id. */
  private readonly coreLanes: (WorkerLane | null)[];
  private readonly primaryCore: KvNodeEngine | null;
  private readonly configs: (EngineConfig | null)[];
  private readonly live = new Map<RequestId, LiveRequest>();
  /** Where each (node id, walk id) runs. */
  private readonly rankOfWalkNode: number[];
  /** What each producer copies to shared memory for consumers on other ranks. */
  private readonly publish: PublishPlan;
  private readonly remoteReads: RemoteReads;
  /** kv_cache node id -> the most tokens one request may generate there (its loops' max_iters). */
  private readonly nodeTokenCap: number[];
  private readonly statelessLanes: WorkerLane[];
  private busy = false;
  private readonly deferred: (() => void)[] = [];
  /** Requests with client output to flush (each at most once: LiveRequest.touched). */
  private touched: LiveRequest[] = [];
  private flushing: LiveRequest[] = [];
  private inFlush = false;
  private readonly stepSamples: NodeStepSample[] = [];
  private readonly lastStepSeconds = new Map<string, number>();
  private closed = false;
  private readonly onQuietChange: () => void;
  private readonly onOutputs: OutputSink;
  private readonly maxConcurrent: number;
  private numRunning = 0;
  /** Requests over maxConcurrentRequests, in arrival order. */
  private readonly waiting: LiveRequest[] = [];

  constructor(options: GraphEngineOptions) {
    const graph = options.graph;
    this.onQuietChange = options.onQuietChange ?? (() => {});
    this.onOutputs = options.onOutputs;
    this.maxConcurrent = options.maxConcurrentRequests ?? Infinity;
    this.graph = graph;
    this.lanes = options.workers.map((w, rank) => new WorkerLane(rank, w, this, options.wrapExecutor?.(rank, w) ?? w));
    this.rankOfWalkNode = graph.walkNodes.map((wn) => {
      const rank = options.rankOf(wn.node.name, graph.walks[wn.walk]!.name);
      if (this.lanes[rank] === undefined) throw new Error(`node ${wn.node.name} is placed on rank ${rank}, which has no worker`);
      return rank;
    });
    this.publish = planPublishing(graph, this.rankOfWalkNode, 0);
    this.remoteReads = new RemoteReads(this.lanes.length, (worker, handles) => this.lanes[worker]?.release(handles));
    this.configs = graph.nodes.map(() => null);
    let masksTaken = false;
    this.coreLanes = graph.nodes.map(() => null);
    this.cores = graph.nodes.map((node) => {
      if (node.engine !== "kv_cache") return null;
      const placed = kvNodeRanks(node.name, new Map(graph.walkNodes.filter((wn) => wn.node === node).map((wn) => [graph.walks[wn.walk]!.name, this.rankOfWalkNode[wn.id]!])));
      const configOf = (lane: WorkerLane): EngineConfig => {
        const ready = lane.ready;
        if (ready.num_blocks < 1) throw new Error(`the worker of rank ${lane.rank} hosts kv_cache node ${node.name} but has no KV cache`);
        return { ...options.engine, maxModelLen: ready.max_model_len, blockSize: ready.block_size, numBlocks: ready.num_blocks };
      };
      const onOutputs = (batch: EngineOutputs): void => this.onCoreOutputs(node, batch);
      if ("prefill" in placed) {
        // Prefill/decode disaggregation: the KV connector joins a core on each rank.
        const prefill = { lane: this.lanes[placed.prefill]!, config: configOf(this.lanes[placed.prefill]!) };
        const decode = { lane: this.lanes[placed.decode]!, config: configOf(this.lanes[placed.decode]!) };
        const pd = new DisaggregatedCore({ prefill, decode, onOutputs });
        this.configs[node.id] = { ...decode.config, maxModelLen: Math.min(decode.config.maxModelLen, prefill.config.maxModelLen) };
        this.coreLanes[node.id] = decode.lane;
        this.coreLaneList.push({ core: pd.prefill, lane: prefill.lane }, { core: pd.decode, lane: decode.lane });
        return pd;
      }
      const lane = this.lanes[placed.rank]!;
      const ready = lane.ready;
      const config = configOf(lane);
      this.configs[node.id] = config;
      this.coreLanes[node.id] = lane;
      const masks = masksTaken ? null : (options.stepMasks?.(ready) ?? null);
      masksTaken = true;
      const core = new EngineCore(lane, config, { onOutputs, masks });
      this.coreLaneList.push({ core, lane });
      return core;
    });
    this.primaryCore = this.cores.find((c) => c !== null) ?? null;
    this.nodeTokenCap = graph.nodes.map((node) => {
      let cap = Infinity;
      for (const wn of graph.walkNodes) {
        if (wn.node !== node) continue;
        for (const l of wn.loops) cap = Math.min(cap, graph.loops[l]!.maxIters);
      }
      return cap;
    });
    const statelessRanks = new Set<number>();
    for (const wn of graph.walkNodes) if (wn.node.engine === "stateless") statelessRanks.add(this.rankOfWalkNode[wn.id]!);
    this.statelessLanes = [...statelessRanks].map((r) => this.lanes[r]!);
    this.conductor = new Conductor(graph, {
      clientOutput: (id, output, values, meta) => this.onClientOutput(id, output, values, meta),
      clientToken: (id, output, tokenId) => this.onClientToken(id, output, tokenId),
      requestDone: (id) => this.onRequestEnded(id, null),
      requestFailed: (id, message) => this.onRequestEnded(id, message),
      release: (worker, handles) => this.remoteReads.released(worker, handles),
      kvStart: (start) => this.onKvStart(start),
      kvStop: (id) => this.onKvStop(id),
    });
  }

  /** The first kv_cache node's engine configuration (what the OpenAI frontend validates against). */
  get config(): EngineConfig | null {
    return this.configs.find((c) => c !== null) ?? null;
  }

  get stats(): EngineStats {
    const stats = this.primaryCore?.stats ?? EMPTY_STATS;
    // Requests held back by maxConcurrentRequests wait too.
    return this.waiting.length === 0 ? stats : { ...stats, numWaiting: stats.numWaiting + this.waiting.length };
  }

  get timings(): StepTimingRing | null {
    return this.primaryCore?.timings ?? null;
  }

  get activeRequests(): number {
    return this.live.size;
  }

  nodeStats(): NodeStats[] {
    const queued = new Map<string, number>();
    for (const lane of this.lanes) lane.queuedPasses(queued);
    return this.graph.nodes.map((node) => ({
      node: node.name,
      queueDepth: node.engine === "kv_cache" ? (this.cores[node.id]?.stats.numWaiting ?? 0) : (queued.get(node.name) ?? 0),
      stepSeconds: this.lastStepSeconds.get(node.name) ?? 0,
    }));
  }

  /** Stateless batches' round trips since the last call. */
  takeStepSamples(): NodeStepSample[] {
    return this.stepSamples.splice(0);
  }

  /** Tensors the control plane refers to, for leak checks. */
  heldTensors(): number {
    return this.conductor.numHeldTensors;
  }

  // ------------------------------------------------------------ submitting

  /**
   * A text request on a graph whose prompt is token ids (a plain LLM):
   * refused synchronously (RequestRejectedError) when it can never run.
   */
  submit(req: EngineRequest): void {
    this.checkNew(req.id);
    const config = this.config;
    if (config === null) throw new RequestRejectedError(`request ${req.id}: this model has no kv_cache node to generate text`);
    checkSubmittable(req, { ...config, vocabSize: this.lanes[0]!.ready.vocab_size });
    if (req.grammar != null && !this.primaryCore!.takesGrammars) {
      throw new RequestRejectedError(`request ${req.id}: structured outputs are not available on this engine`);
    }
    const live = this.track(req.id, true, null, req, {});
    if (this.graph.promptNames.length !== 1) {
      // A prompt of token ids and more (a vision-language model's images, a
      // transcription's audio): the model's process_prompt turns the ids and
      // the media into its prompt values.
      const media = req.media ?? null;
      const audio = media?.audio;
      const clips = media?.clips ?? [];
      this.start(live, () => {
        this.admitAfterPrompt.set(req.id, []);
        this.lanes[0]!.addPrompt({
          request_id: req.id,
          prompt: null,
          input_modalities: ["text", ...(media !== null && media.images.length > 0 ? ["image"] : []), ...(audio !== undefined || clips.length > 0 ? ["audio"] : [])],
          output_modalities: ["text"],
          kwargs: {
            token_ids: req.promptIds,
            images: media?.images ?? [],
            image_params: media?.params ?? [],
            image_token_counts: media?.spans.map((s) => s.length) ?? [],
            ...(audio !== undefined ? { audio: audio.data, audio_param: audio.param, audio_offset: audio.offset } : {}),
            ...(clips.length > 0 ? { audios: clips.map((c) => c.data), audio_params: clips.map((c) => c.param) } : {}),
          },
          publish: this.publish.prompts,
        });
      });
      return;
    }
    if ((req.media?.images.length ?? 0) > 0) throw new RequestRejectedError(`request ${req.id}: this model does not take images`);
    const prompt = new Map([[this.graph.promptNames[0]!, [{ kind: "tokens", ids: Int32Array.from(req.promptIds) } as Value]]]);
    this.start(live, () => {
      live.admitted = true;
      this.call(() => this.conductor.admit(req.id, prompt));
    });
  }

  /** A request for the graph's own outputs; events come through onEvent, the last one "done" or "error". */
  submitGraph(req: GraphRequest, onEvent: GraphEventCallback): void {
    this.checkNew(req.id);
    if (req.prompt === null && req.values === undefined) throw new RequestRejectedError(`request ${req.id}: neither a prompt nor prompt values`);
    for (const name of req.inactivePartitions ?? []) {
      if (!this.graph.partitionByName.has(name)) throw new RequestRejectedError(`request ${req.id}: unknown partition ${name}`);
    }
    const stop: StopConditions = { ...DEFAULT_STOP, maxTokens: req.maxTokens ?? Number.MAX_SAFE_INTEGER };
    const engineRequest: EngineRequest = { id: req.id, promptIds: [], sampling: req.sampling, stop, priority: req.priority, arrivalMs: req.arrivalMs };
    if (req.inputHash !== undefined) engineRequest.inputHash = req.inputHash;
    const live = this.track(req.id, false, onEvent, engineRequest, req.modelKwargs);
    const inactive = req.inactivePartitions ?? [];
    const values = req.values;
    if (values !== undefined) {
      this.start(live, () => {
        live.admitted = true;
        this.call(() => this.conductor.admit(req.id, values, { inactivePartitions: inactive }));
      });
      return;
    }
    const prompt = req.prompt!;
    this.start(live, () => {
      this.admitAfterPrompt.set(req.id, inactive);
      this.lanes[0]!.addPrompt({
        request_id: req.id,
        prompt: prompt.text,
        input_modalities: prompt.inputModalities,
        output_modalities: prompt.outputModalities,
        kwargs: req.promptKwargs === undefined ? req.modelKwargs : { ...req.modelKwargs, ...req.promptKwargs },
        publish: this.publish.prompts,
      });
    });
  }

  /** Runs the request's start now, or once fewer than maxConcurrentRequests run. */
  private start(live: LiveRequest, begin: () => void): void {
    if (this.numRunning >= this.maxConcurrent) {
      live.begin = begin;
      this.waiting.push(live);
      return;
    }
    this.numRunning++;
    live.running = true;
    begin();
  }

  private startWaiting(): void {
    while (this.numRunning < this.maxConcurrent && this.waiting.length > 0) {
      const live = this.waiting.shift()!;
      const begin = live.begin!;
      live.begin = null;
      this.numRunning++;
      live.running = true;
      begin();
    }
  }

  private readonly admitAfterPrompt = new Map<RequestId, string[]>();

  /** LoRA adapters apply to plain LLMs only (the worker refuses them for graph models too). */
  loadLora(ref: LoraAdapterRef): Promise<void> {
    return Promise.reject(new LoraLoadError(`adapter ${ref.name}: LoRA adapters are served for plain LLMs only, not for a graph of models`));
  }

  unloadLora(): void {}

  /** The client went away: everything the request holds is freed; its last output says "abort". */
  abort(requestId: RequestId): void {
    const req = this.live.get(requestId);
    if (req === undefined) return;
    const admitted = req.admitted;
    this.end(req, "abort", null);
    if (admitted) this.call(() => this.conductor.abort(requestId));
  }

  /** Ends live requests ("abort"), refuses new ones, resolves once no step is running. */
  async close(): Promise<void> {
    this.closed = true;
    for (const req of [...this.live.values()]) this.end(req, "abort", "the engine is shutting down");
    await Promise.all(this.cores.map((c) => c?.close()));
  }

  checkIntegrity(): void {
    for (const c of this.cores) c?.checkIntegrity();
  }

  private checkNew(id: RequestId): void {
    if (this.closed) throw new RequestRejectedError(`request ${id}: the engine is shutting down`);
    if (this.goneReason !== null) throw new RequestRejectedError(`request ${id}: ${this.goneReason}`);
    if (this.live.has(id)) throw new RequestRejectedError(`request ${id}: a request with this id is already running`);
  }

  private track(
    id: RequestId,
    text: boolean,
    onEvent: GraphEventCallback | null,
    engineRequest: EngineRequest,
    modelKwargs: Record<string, unknown>,
  ): LiveRequest {
    const live: LiveRequest = {
      id,
      text,
      onEvent,
      engineRequest,
      modelKwargs,
      admitted: false,
      pending: [],
      touched: false,
      running: false,
      begin: null,
      coreOutput: null,
      numCachedTokens: 0,
      ended: false,
      endReason: null,
      endError: null,
      kvStopped: false,
      endStatus: 500,
      promptInfo: null,
    };
    this.live.set(id, live);
    return live;
  }

  // ------------------------------------------------------------ conductor calls

  /** Runs a conductor call, then what its sink deferred: outputs, new passes, engine-core stops. */
  private call(fn: () => void): void {
    if (this.busy) {
      this.deferred.push(fn);
      return;
    }
    this.busy = true;
    try {
      fn();
      for (let i = 0; i < this.deferred.length; i++) this.deferred[i]!();
      this.deferred.length = 0;
    } finally {
      this.busy = false;
    }
    this.flushTouched();
    this.dispatchReady();
  }

  private dispatchReady(): void {
    const batches = this.conductor.takeReady();
    for (const batch of batches) {
      const rank = this.rankOfWalkNode[batch.walkNode.id]!;
      const wire = this.wireBatch(batch);
      if (this.lanes.length > 1) this.remoteReads.sent(rank, wire);
      this.lanes[rank]!.addBatch(wire);
    }
  }

  private wireBatch(batch: ReadyBatch): PassBatch {
    const wn = batch.walkNode;
    return {
      batch_id: batch.batchId,
      node: wn.node.name,
      walk: this.graph.walks[wn.walk]!.name,
      passes: batch.passes.map((p) => ({
        pass_id: p.passId,
        request_id: p.requestId,
        inputs: wn.inputNames.map((name, i) => ({ name, values: wireValues(p.inputs[i]!) })),
        chunks: p.chunks.flatMap((c, i) =>
          c === null ? [] : [{ name: wn.inputNames[i]!, index: c.index, start: c.start, context_count: c.contextCount, final: c.final }],
        ),
        request_kwargs: this.live.get(p.requestId)?.modelKwargs ?? {},
      })),
      publish: this.publish.outputs[wn.id]!,
    };
  }

  // ------------------------------------------------------------ conductor sink

  private onClientOutput(requestId: RequestId, _output: CompiledClientOutput, values: Values, _meta: ClientOutputMeta): void {
    const req = this.live.get(requestId);
    if (req === undefined) return;
    if (req.text) {
      for (let i = 0; i < values.length; i++) {
        const v = values[i]!;
        if (v.kind !== "tokens") continue;
        const ids = v.ids;
        for (let j = 0; j < ids.length; j++) req.pending.push(ids[j]!);
      }
      this.touch(req);
      return;
    }
    for (const v of values) {
      if (v.kind === "bytes") req.onEvent!({ kind: "chunk", name: _output.name, modality: v.modality, data: v.data, metadata: v.metadata });
      else if (v.kind === "tokens") {
        req.onEvent!({ kind: "chunk", name: _output.name, modality: _output.modality, data: new Uint8Array(0), metadata: { token_ids: [...v.ids] } });
      }
    }
  }

  private onClientToken(requestId: RequestId, output: CompiledClientOutput, tokenId: number): void {
    // Usually the request whose engine-core output is being passed to the conductor.
    const current = this.currentOutput;
    const req = current !== null && current.id === requestId ? current : this.live.get(requestId);
    if (req === undefined) return;
    if (req.text) {
      req.pending.push(tokenId);
      this.touch(req);
    } else req.onEvent!({ kind: "chunk", name: output.name, modality: output.modality, data: new Uint8Array(0), metadata: { token_ids: [tokenId] } });
  }

  private onRequestEnded(requestId: RequestId, error: string | null): void {
    const req = this.live.get(requestId);
    if (req === undefined) return;
    if (error === null) this.end(req, req.coreOutput?.finishReason ?? "length", null);
    else this.end(req, "error", error);
  }

  private onKvStart(start: KvStart): void {
    if (start.continuing) return;
    const req = this.live.get(start.requestId);
    if (req === undefined) return;
    const node = start.walkNode.node;
    const core = this.cores[node.id]!;
    const ids: number[] = [];
    for (const v of start.inputs[0] ?? []) {
      if (v.kind !== "tokens") {
        this.deferred.push(() => this.conductor.failRequest(req.id, `kv_cache node ${node.name} takes token ids, not a ${v.kind}`));
        return;
      }
      for (const t of v.ids) ids.push(t);
    }
    // The inputs after the token ids are tensors on the node's worker, each in the role the model declares
    // (kv_inputs): image features replacing the image tokens' embeddings, multimodal rotary positions, or
    // the encoder output the decoder cross-attends (AddedRequest.embeds / .positions / .encoder_states).
    let base = req.engineRequest;
    for (let at = 1; at < start.inputs.length; at++) {
      const role = node.kvInputs[at - 1];
      for (const v of start.inputs[at] ?? []) {
        if (role === undefined || v.kind !== "tensor" || v.worker !== this.coreLanes[node.id]!.rank) {
          const what = v.kind === "tensor" ? `a tensor of worker ${v.worker}` : `a ${v.kind}`;
          const why = role === undefined ? `declares no role for its input ${at}` : `takes its ${role} as a tensor of its own worker, not ${what}`;
          this.deferred.push(() => this.conductor.failRequest(req.id, `kv_cache node ${node.name} ${why}`));
          return;
        }
        if (role === "embeds") base = { ...base, embedsHandle: v.handle };
        else if (role === "positions") base = { ...base, positionsHandle: v.handle };
        else base = { ...base, encoderStatesHandle: v.handle, numCrossTokens: v.shape[0] ?? 0 };
      }
    }
    const config = this.configs[node.id]!;
    const cap = Math.min(base.stop.maxTokens, this.nodeTokenCap[node.id]!, Math.max(1, config.maxModelLen - ids.length));
    if (req.text && base.media?.hash !== undefined) {
      // process_prompt expanded the prompt's placeholders (the audio's token count comes from its decoded
      // length): the engine takes the worker's ids, their blocks rooted in the media's hash, since the
      // frontend's spans no longer say where the media sit, and the length left for output shrinks.
      if (ids.length >= config.maxModelLen) {
        req.endStatus = 400;
        const message = `the prompt is ${ids.length} tokens once its audio and images are expanded, not below the model's maximum length ${config.maxModelLen}`;
        this.deferred.push(() => this.conductor.failRequest(req.id, message));
        return;
      }
      base = { ...base, promptIds: ids, inputHash: base.media.hash, media: { ...base.media, spans: [] }, stop: { ...base.stop, maxTokens: cap } };
    }
    const engineRequest: EngineRequest =
      req.text
        ? base
        : { ...base, promptIds: ids, stop: { ...base.stop, maxTokens: cap, eosTokenIds: [...node.stopTokenIds] }, ...(node.frameWidth > 0 ? { frameWidth: node.frameWidth } : {}) };
    try {
      core.submit(engineRequest);
    } catch (error) {
      const message = (error as Error).message;
      if (req.onEvent !== null) req.endStatus = 400;
      this.deferred.push(() => this.conductor.failRequest(req.id, message));
    }
  }

  private onKvStop(requestId: RequestId): void {
    const req = this.live.get(requestId);
    if (req !== undefined) req.kvStopped = true;
    // Outside the conductor call: the core's abort output comes back synchronously.
    for (const core of this.cores) if (core !== null) queueMicrotask(() => core.abort(requestId));
  }

  // ------------------------------------------------------------ engine-core outputs

  /**
   * One engine-core batch (a step's outputs) as one conductor call: every
   * token goes to the conductor, then client outputs are flushed and ready
   * passes handed out once for the whole step.
   */
  private onCoreOutputs(node: CompiledNode, batch: EngineOutputs): void {
    if (this.busy) {
      this.takeCoreOutputs(node, batch);
      return;
    }
    this.call(() => {
      this.inCoreStep = true;
      try {
        this.takeCoreOutputs(node, batch);
      } finally {
        this.inCoreStep = false;
      }
    });
  }

  private takeCoreOutputs(node: CompiledNode, batch: EngineOutputs): void {
    const plain = batch.plain;
    for (let i = 0, at = 0; i < batch.numPlain; i++, at += 3) this.onCoreToken(node, plain[at] as number, plain[at + 1] as number, plain[at + 2] as number);
    for (const out of batch.rich) this.onCoreOutput(node, out);
  }

  /** A packed output: one token of a request that goes on, nothing else to keep for the client. */
  private onCoreToken(node: CompiledNode, id: RequestId, token: number, numCachedTokens: number): void {
    const req = this.live.get(id);
    if (req === undefined || req.ended || req.kvStopped) return;
    req.numCachedTokens = numCachedTokens;
    this.currentOutput = req;
    if (this.inCoreStep) this.conductor.kvToken(id, node, token, null);
    else this.call(() => this.conductor.kvToken(id, node, token, null));
    this.currentOutput = null;
    this.flushTouched();
  }

  /** Inside onCoreOutputs: the conductor is not running, its sink's follow-ups are deferred to the call's end. */
  private inCoreStep = false;
  /** The request whose engine-core output onCoreOutput is handling. */
  private currentOutput: LiveRequest | null = null;

  private onCoreOutput(node: CompiledNode, out: RequestOutput): void {
    const req = this.live.get(out.requestId);
    if (req === undefined || req.ended || req.kvStopped) {
      if (out.finished) this.onQuietChange();
      return;
    }
    const n = out.newTokenIds.length;
    // Kept until the client output is flushed: its logprobs, finish and timing go with the tokens.
    req.coreOutput = out;
    req.numCachedTokens = out.numCachedTokens;
    if (n > 0) {
      this.currentOutput = req;
      if (this.inCoreStep) this.kvTokens(node, out);
      else this.call(() => this.kvTokens(node, out));
      this.currentOutput = null;
    } else if (out.finished) {
      // Ended without a token: the worker failed, or the engine aborted it (closing, or not carried over a worker death).
      if (out.finishReason === "abort") {
        this.end(req, "abort", out.error);
        // The conductor forgets it too (and frees what it holds).
        if (req.admitted) this.call(() => this.conductor.abort(out.requestId));
      } else this.call(() => this.conductor.failRequest(out.requestId, out.error ?? "the engine failed"));
    }
    // Text requests keep it until their client output is flushed; graph requests' events do not use it.
    if (!this.busy || !req.text) req.coreOutput = null;
    this.flushTouched();
  }

  private kvTokens(node: CompiledNode, out: RequestOutput): void {
    const n = out.newTokenIds.length;
    const frames = out.frames;
    const width = frames === undefined ? 0 : frames.length / n;
    for (let i = 0; i < n; i++) {
      const finish = i === n - 1 && out.finished ? out.finishReason : null;
      const frame = frames === undefined ? null : frames.subarray(i * width, (i + 1) * width);
      this.conductor.kvToken(out.requestId, node, out.newTokenIds[i]!, finish, frame);
    }
  }

  // ------------------------------------------------------------ worker results

  stepDone(lane: WorkerLane, work: AttachedWork, result: StepResultMessage, roundTripMs: number): void {
    for (const b of work.sent) {
      this.stepSamples.push({ node: b.node, seconds: roundTripMs / 1000, passes: b.passes.length });
      this.lastStepSeconds.set(b.node, roundTripMs / 1000);
    }
    if (this.stepSamples.length > 4096) this.stepSamples.splice(0, this.stepSamples.length - 4096);
    const prompts = new Map(result.prompt_results.map((r) => [r.request_id, r]));
    const passes = new Map(result.pass_results.map((r) => [r.pass_id, r]));
    for (const p of work.prompts) this.onPromptResult(lane, p.request_id, prompts.get(p.request_id));
    for (const b of work.batches) {
      for (const p of b.passes) this.onPassResult(lane, p.pass_id, passes.get(p.pass_id));
    }
    if (this.lanes.length > 1) for (const b of work.batches) this.remoteReads.answered(lane.rank, b);
  }

  stepFailed(lane: WorkerLane, work: AttachedWork, error: Error): void {
    const message = `worker ${lane.rank} failed: ${error.message}`;
    for (const p of work.prompts) {
      const req = this.live.get(p.request_id);
      this.admitAfterPrompt.delete(p.request_id);
      if (req !== undefined && !req.admitted) this.end(req, "error", message);
    }
    for (const b of work.batches) this.call(() => this.conductor.failBatch(b.batch_id, message));
    if (this.lanes.length > 1) for (const b of work.batches) this.remoteReads.answered(lane.rank, b);
  }

  private onPromptResult(lane: WorkerLane, requestId: RequestId, result: PromptResult | undefined): void {
    const inactive = this.admitAfterPrompt.get(requestId) ?? [];
    this.admitAfterPrompt.delete(requestId);
    const req = this.live.get(requestId);
    const values = result === undefined ? new Map<string, Values>() : fromNamedValues(result.values, lane.rank);
    if (req === undefined || req.admitted || result === undefined || result.error !== null) {
      // Gone meanwhile (its tensors are freed), or refused by process_prompt.
      const handles = [...values.values()].flatMap((vs) => vs.flatMap((v) => (v.kind === "tensor" ? [v.handle] : [])));
      if (handles.length > 0) lane.release(handles);
      if (req !== undefined && !req.admitted) {
        req.endStatus = 400;
        // A text request's client sees the model's own words (e.g. "messages[0].content[1]: ..."), not the hook's name.
        const refused = req.text ? (result?.error ?? "").replace(/^process_prompt: \w+: /, "") : `process_prompt: ${result?.error}`;
        this.end(req, "error", result === undefined ? `worker ${lane.rank} did not answer the prompt` : refused);
      }
      return;
    }
    req.admitted = true;
    if (req.text) req.promptInfo = promptInfoOf(values, this.graph.promptNames);
    this.call(() => this.conductor.admit(requestId, values, { inactivePartitions: inactive }));
  }

  private onPassResult(lane: WorkerLane, passId: number, result: PassResult | undefined): void {
    if (result === undefined) {
      this.call(() => this.conductor.failPass(passId, `worker ${lane.rank} did not answer pass ${passId}`));
      return;
    }
    if (result.error !== null) {
      const error = result.error;
      this.call(() => this.conductor.failPass(passId, error));
      return;
    }
    const outputs = fromNamedValues(result.outputs, lane.rank);
    for (const chunk of result.client_chunks) {
      const list = (outputs.get(chunk.name) ?? []) as Value[];
      list.push({ kind: "bytes", modality: chunk.modality, data: chunk.data, metadata: (chunk.metadata ?? {}) as Record<string, unknown> });
      outputs.set(chunk.name, list);
    }
    this.call(() => this.conductor.completePass(passId, outputs, result.stops));
  }

  // ------------------------------------------------------------ worker deaths and restarts

  private goneReason: string | null = null;

  /**
   * Rank `rank`'s worker died (`reason`: one line) and its supervisor is restarting it. Graph
   * requests end with a 503 error (what they hold on that worker is gone; the
   * conductor releases what they hold on the others); text requests of the
   * kv_cache nodes it hosts are carried over by their engine cores, which
   * recompute them on the restarted worker (or end them, past
   * --max-request-migrations).
   */
  workerLost(rank: number, reason: string): void {
    const message = `the model worker of rank ${rank} died: ${reason}`;
    // A text request of a graph whose prompt values live in workers (a vision-language
    // model's image features) cannot be recomputed on a fresh worker either.
    const tensorPrompts = this.graph.promptNames.length !== 1;
    const graphRequests = [...this.live.values()].filter((r) => (r.onEvent !== null || tensorPrompts) && !r.ended);
    for (const req of graphRequests) req.endStatus = 503;
    this.lanes[rank]!.workerLost(new Error(message));
    for (const req of graphRequests) {
      if (req.ended) continue;
      if (req.admitted) this.call(() => this.conductor.failRequest(req.id, message));
      else this.end(req, "error", message);
    }
    this.coresOn(rank).forEach((core) => core.executorLost(message));
  }

  /** Rank `rank`'s restarted worker is Ready: its lane sends to it, its engine cores recompute their requests on it. */
  workerRestarted(rank: number, client: WorkerClient): void {
    const lane = this.lanes[rank]!;
    lane.replaceClient(client);
    this.coresOn(rank).forEach((core) => core.replaceExecutor(lane));
  }

  /** Rank `rank`'s worker will not come back: everything still live ends, new requests are refused. */
  workerGone(rank: number, reason: string): void {
    this.goneReason = reason;
    this.coresOn(rank).forEach((core) => core.executorGone(reason));
    for (const req of [...this.live.values()]) {
      req.endStatus = 503;
      if (req.admitted) this.call(() => this.conductor.failRequest(req.id, this.goneReason!));
      else this.end(req, "error", this.goneReason);
    }
  }

  private coresOn(rank: number): EngineCore[] {
    return this.coreLaneList.filter((c) => c.lane.rank === rank).map((c) => c.core);
  }

  // ------------------------------------------------------------ endings

  private end(req: LiveRequest, reason: RequestOutput["finishReason"], error: string | null): void {
    if (req.ended) return;
    req.ended = true;
    req.endReason = reason;
    req.endError = error;
    this.forget(req);
    if (req.text) {
      this.touch(req);
      if (!this.busy) this.flushTouched();
      return;
    }
    const event: GraphEvent = error === null && reason !== "abort" ? { kind: "done" } : { kind: "error", message: error ?? "aborted", status: req.endStatus };
    callSafely(req.onEvent!, event);
  }

  /** Drops the request from the engine's tables and tells stateless workers it ended. */
  private forget(req: LiveRequest): void {
    if (!this.live.delete(req.id)) return;
    if (req.running) {
      req.running = false;
      this.numRunning--;
      this.startWaiting();
    } else if (req.begin !== null) {
      req.begin = null;
      this.waiting.splice(this.waiting.indexOf(req), 1);
    }
    this.admitAfterPrompt.delete(req.id);
    for (const lane of this.statelessLanes) lane.requestEnded(req.id);
  }

  private touch(req: LiveRequest): void {
    if (req.touched) return;
    req.touched = true;
    this.touched.push(req);
  }

  private flushTouched(): void {
    if (this.busy || this.inFlush || this.touched.length === 0) return;
    this.inFlush = true;
    try {
      // Swapped, not copied: a client callback may touch requests again (they go to the next round).
      while (this.touched.length > 0) {
        const list = this.touched;
        this.touched = this.flushing;
        this.flushing = list;
        this.flushList(list);
        list.length = 0;
      }
    } finally {
      this.inFlush = false;
    }
  }

  /** The touched text requests' outputs, as one batch to onOutputs. */
  private flushList(list: readonly LiveRequest[]): void {
    const batch = new EngineOutputs(list.length);
    for (let r = 0; r < list.length; r++) {
      const req = list[r]!;
      req.touched = false;
      const core = req.coreOutput;
      req.coreOutput = null;
      const pending = req.pending;
      if (pending.length === 0 && !req.ended) continue;
      if (pending.length === 1 && !req.ended && req.promptInfo === null && (core === null || (core.logprobs === null && core.promptLogprobs === undefined))) {
        batch.addToken(req.id, pending[0] as number, req.numCachedTokens);
        pending.length = 0;
        continue;
      }
      const tokens = pending.slice();
      pending.length = 0;
      const output: RequestOutput = {
        requestId: req.id,
        newTokenIds: tokens,
        logprobs: core !== null && core.logprobs !== null && core.logprobs.length === tokens.length ? core.logprobs : null,
        finished: req.ended,
        finishReason: req.ended ? req.endReason : null,
        stopTokenId: req.ended && core !== null ? core.stopTokenId : null,
        numCachedTokens: req.numCachedTokens,
        error: req.ended ? req.endError : null,
      };
      // A refused input is the client's 400; a lost worker, for requests that cannot be recomputed, a 503.
      if (req.ended && req.endError !== null && (req.endStatus === 400 || (req.endStatus === 503 && this.graph.promptNames.length !== 1))) {
        output.errorStatus = req.endStatus;
      }
      // What the engine core reports beside the tokens (prompt logprobs, the request's phase times) passes through.
      if (core?.promptLogprobs !== undefined) output.promptLogprobs = core.promptLogprobs;
      if (core?.timing !== undefined) output.timing = core.timing;
      if (req.promptInfo !== null) {
        output.promptInfo = req.promptInfo;
        req.promptInfo = null;
      }
      batch.add(output);
    }
    if (batch.size === 0) return;
    try {
      this.onOutputs(batch);
    } catch {
      // The owner's sink must not stop the engine.
    }
  }
}

// ------------------------------------------------------------ wire values

/** The integer prompt values no walk reads: what process_prompt tells the client (RequestOutput.promptInfo); null: none. */
function promptInfoOf(values: ReadonlyMap<string, Values>, read: readonly string[]): Record<string, number[]> | null {
  let info: Record<string, number[]> | null = null;
  for (const [name, list] of values) {
    if (read.includes(name)) continue;
    for (const v of list) if (v.kind === "tokens") (info ??= {})[name] = Array.from(v.ids);
  }
  return info;
}

function wireValues(values: Values): WireValue[] {
  const out: WireValue[] = [];
  for (const v of values) {
    switch (v.kind) {
      case "tokens":
        out.push({ form: "tokens", handle: 0, worker: 0, ids: v.ids, dtype: "", shape: [], segment: "", offset: 0, nbytes: 0 });
        break;
      case "tensor":
        out.push({
          form: "tensor",
          handle: v.handle,
          worker: v.worker,
          ids: NO_IDS,
          dtype: v.dtype,
          shape: [...v.shape],
          segment: v.shm?.segment ?? "",
          offset: v.shm?.offset ?? 0,
          nbytes: v.shm?.nbytes ?? 0,
        });
        break;
      case "empty":
        out.push({ form: "empty", handle: 0, worker: 0, ids: NO_IDS, dtype: "", shape: [], segment: "", offset: 0, nbytes: 0 });
        break;
      case "bytes":
        // Client renderings never travel back to a worker.
        break;
    }
  }
  return out;
}

function fromNamedValues(named: readonly NamedValues[], rank: number): Map<string, Values> {
  const map = new Map<string, Values>();
  for (const { name, values } of named) {
    map.set(
      name,
      values.map((w): Value => {
        switch (w.form) {
          case "tokens":
            return { kind: "tokens", ids: w.ids };
          case "tensor":
            return {
              kind: "tensor",
              handle: w.handle,
              worker: rank,
              dtype: w.dtype,
              shape: w.shape,
              shm: w.segment === "" ? null : { segment: w.segment, offset: w.offset, nbytes: w.nbytes },
            };
          default:
            return { kind: "empty" };
        }
      }),
    );
  }
  return map;
}

function callSafely<T>(fn: (arg: T) => void, arg: T): void {
  try {
    fn(arg);
  } catch {
    // A client's callback must not stop the engine.
  }
}

const NO_IDS = new Int32Array(0);

