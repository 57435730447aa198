// The conductor: every request's walk state over one compiled graph, driven by
// events (admission, a pass's result, a sampled token, a failure, an abort),
// never by a timer. It decides readiness, loop iterations and stops, walk
// transitions, streaming chunks, completion and failure; the caller runs the
// passes it hands out (takeReady) and the engine core runs kv_cache nodes.
// docs/graph-semantics.md fixes the semantics; docs/graph-runtime.md says how
// this code implements them.
//
// Ownership of tensors: a tensor value that reaches the conductor (a pass
// result, a prompt value) is referenced by whatever holds it (an input slot, a
// queued pass, a loop cache, the persist store, a stream buffer). When the last
// reference goes, the conductor tells its owner through sink.release, batched
// per owner worker at the end of each call. Values handed to clientOutput are
// the sink's to forward; they stay valid until that call's releases.

import type { RequestId } from "../engine/types.js";
import { chunkStart, nextChunk, type StreamChunk } from "../graph/chunk-policy.js";
import {
  ROUTE_CLIENT,
  ROUTE_DROP,
  ROUTE_PERSIST,
  ROUTE_SLOT,
  ROUTE_STREAM,
  SECTION_LOOP,
  type CompiledClientOutput,
  type CompiledGraph,
  type CompiledLoop,
  type CompiledNode,
  type CompiledStep,
  type CompiledWalk,
  type CompiledWalkNode,
  type Route,
} from "../graph/compile.js";
import { RequestState, WN_DONE, WN_IDLE, WN_INACTIVE, WN_STARTED } from "./request-state.js";
import { NO_VALUES, type TensorValue, type Value, type Values } from "./values.js";

export interface ReadyPass {
  readonly passId: number;
  readonly requestId: RequestId;
  readonly walkNode: CompiledWalkNode;
  /** Aligned with walkNode.inputNames. */
  readonly inputs: readonly Values[];
  /** Aligned with walkNode.inputNames: the chunk of a streaming input, null for a normal one. */
  readonly chunks: readonly (StreamChunk | null)[];
  /** Iteration of each enclosing loop, outermost first. */
  readonly iterations: readonly number[];
}

/** Ready passes of one (node, walk), for the caller to run as one batch. */
export interface ReadyBatch {
  readonly batchId: number;
  readonly walkNode: CompiledWalkNode;
  readonly passes: readonly ReadyPass[];
}

export interface ClientOutputMeta {
  readonly walk: CompiledWalk;
  /** The walk node whose pass produced it, or null for a loop's output. */
  readonly walkNode: CompiledWalkNode | null;
  readonly loop: CompiledLoop | null;
  /** The streaming chunk that pass consumed, if any. */
  readonly chunk: StreamChunk | null;
}

export interface KvStart {
  readonly requestId: RequestId;
  readonly walkNode: CompiledWalkNode;
  readonly inputs: readonly Values[];
  /** The engine-core request already runs (e.g. decode after prefill): nothing to start. */
  readonly continuing: boolean;
}

export interface ConductorSink {
  /** In production order per request; requestDone comes after the last one. */
  clientOutput(requestId: RequestId, output: CompiledClientOutput, values: Values, meta: ClientOutputMeta): void;
  /**
   * clientOutput of one sampled token, as a decode loop's iteration gives it
   * (the id itself: no value is built for the hottest path of a plain LLM).
   */
  clientToken(requestId: RequestId, output: CompiledClientOutput, tokenId: number, meta: ClientOutputMeta): void;
  requestDone(requestId: RequestId): void;
  requestFailed(requestId: RequestId, message: string): void;
  /** The control plane no longer refers to these tensors of `worker`. */
  release(worker: number, handles: readonly number[]): void;
  /** A kv_cache node's pass is ready: start (or keep running) its engine-core request. */
  kvStart(start: KvStart): void;
  /** Stop the engine-core request of a kv_cache node (a loop stopped, the request ended). */
  kvStop(requestId: RequestId, node: CompiledNode): void;
}

export interface AdmitOptions {
  /** Partitions that do not run for this request (e.g. no audio asked for). */
  inactivePartitions?: readonly string[];
}

class ConductorError extends Error {
  override readonly name = "ConductorError";
}

interface PassRecord extends ReadyPass {
  readonly request: RequestState;
  batch: number;
}

interface BatchRecord {
  open: number;
  readonly passes: readonly PassRecord[];
}

export class Conductor {
  private readonly requests = new Map<RequestId, RequestState>();
  private readonly passes = new Map<number, PassRecord>();
  /** Sum of every live request's refs.size, kept as they change (the gauge is read every step). */
  private heldCount = 0;
  private readonly batches = new Map<number, BatchRecord>();
  private readonly readyQueues: PassRecord[][];
  private readonly readyWalkNodes: number[] = [];
  private nextPassId = 1;
  private nextBatchId = 1;
  private busy = false;
  private readonly releases = new Map<number, number[]>();
  private releasesPending = false;
  /** Client-output meta of a kv_cache walk node's passes (no chunk): one object per walk node. */
  private readonly plainMeta: ClientOutputMeta[];
  /** Per partition: kv_cache nodes in its walks. */
  private readonly partitionKvNodes: number[][];
  /** Per kv_cache walk node: one reusable output list per output name (all carry the sampled token). */
  private readonly kvOutputScratch: Values[][];
  /** Per loop capture: 1 for accumulated_outputs. */
  private readonly captureAccumulates: Uint8Array;
  /**
   * Per walk node: the loop it is the engine-carried body of (an LLM's decode
   * loop) when its token goes only to the client, to itself through the engine
   * core, or nowhere, and neither it nor the loop captures anything; else -1.
   * Such a token is one client output and an iteration count (see kvToken).
   */
  private readonly carriedLoopOf: Int32Array;
  /** Per walk node of carriedLoopOf: the client outputs its token goes to. */
  private readonly carriedClientOutputs: (readonly CompiledClientOutput[])[];

  constructor(
    readonly graph: CompiledGraph,
    private readonly sink: ConductorSink,
  ) {
    for (const p of graph.partitions) {
      if (p.pythonTransitions) throw new ConductorError(`partition ${p.name} uses Python transitions, which this conductor does not run yet`);
    }
    this.readyQueues = graph.walkNodes.map(() => []);
    this.plainMeta = graph.walkNodes.map((wn) => Object.freeze({ walk: graph.walks[wn.walk]!, walkNode: wn, loop: null, chunk: null }));
    this.partitionKvNodes = graph.partitions.map((p) => {
      const ids = new Set<number>();
      for (const w of p.walks) {
        const walk = graph.walks[w]!;
        for (let i = walk.walkNodeStart; i < walk.walkNodeEnd; i++) {
          const node = graph.walkNodes[i]!.node;
          if (node.engine === "kv_cache") ids.add(node.id);
        }
      }
      return [...ids];
    });
    this.kvOutputScratch = graph.walkNodes.map((wn) => wn.outputNames.map(() => NO_VALUES));
    this.captureAccumulates = new Uint8Array(graph.captureCount);
    for (const l of graph.loops) for (const c of l.captures) this.captureAccumulates[c.id] = c.accumulate ? 1 : 0;
    this.carriedLoopOf = new Int32Array(graph.walkNodes.length).fill(-1);
    this.carriedClientOutputs = graph.walkNodes.map(() => []);
    for (const loop of graph.loops) {
      const wn = graph.walkNodes[loop.engineCarriedBody];
      if (wn === undefined || loop.captures.length > 0 || wn.captures.length > 0) continue;
      const routes = wn.outputRoutes.flat();
      const plain = routes.every((r) => r.kind === ROUTE_CLIENT || r.kind === ROUTE_DROP || (r.kind === ROUTE_SLOT && r.engineCarried));
      if (!plain) continue;
      this.carriedLoopOf[wn.id] = loop.id;
      this.carriedClientOutputs[wn.id] = routes.filter((r) => r.kind === ROUTE_CLIENT).map((r) => graph.clientOutputs[r.target]!);
    }
  }

  get activeRequests(): number {
    return this.requests.size;
  }

  has(requestId: RequestId): boolean {
    return this.requests.has(requestId);
  }

  /** Tensors live requests refer to, all together (a gauge read every step: no allocation). */
  get numHeldTensors(): number {
    return this.heldCount;
  }

  /** Tensors a live request refers to (for leak checks). */
  heldTensors(requestId: RequestId): readonly TensorValue[] {
    return [...(this.requests.get(requestId)?.refs.keys() ?? [])];
  }

  // Public events ---------------------------------------------------------------

  /**
   * Admits a request: its prompt values by name (process_prompt's result) and
   * each partition's start step. A prompt name no step reads is released.
   */
  admit(requestId: RequestId, prompt: ReadonlyMap<string, Values>, options: AdmitOptions = {}): void {
    if (this.requests.has(requestId)) throw new ConductorError(`request ${requestId} is already admitted`);
    const inactive = options.inactivePartitions ?? [];
    for (const name of inactive) {
      if (!this.graph.partitionByName.has(name)) throw new ConductorError(`request ${requestId}: unknown partition ${name}`);
    }
    this.enter();
    try {
      const req = new RequestState(requestId, this.graph);
      this.requests.set(requestId, req);
      for (const values of prompt.values()) this.adopt(req, values);
      this.graph.promptNames.forEach((name, id) => {
        const values = prompt.get(name);
        if (values !== undefined) {
          req.prompt[id] = values;
          this.hold(req, values);
        }
      });
      for (const values of prompt.values()) this.settle(req, values);
      const starting: number[] = [];
      for (const p of this.graph.partitions) {
        if (p.start === null || inactive.includes(p.name)) {
          req.partitionDone[p.id] = 1;
          req.partitionsLeft--;
        } else starting.push(p.id);
      }
      for (const p of this.graph.partitions) {
        if (req.partitionDone[p.id] === 1) this.endOutgoingStreams(req, p.id);
      }
      for (const p of starting) {
        if (!req.alive) break;
        this.runStep(req, p, this.graph.partitions[p]!.start!);
      }
      if (req.alive && req.partitionsLeft === 0) this.finishRequest(req);
    } finally {
      this.exit();
    }
  }

  /** Ready stateless passes, grouped per (node, walk). kv_cache passes go to sink.kvStart instead. */
  takeReady(): ReadyBatch[] {
    const batches: ReadyBatch[] = [];
    for (const wnId of this.readyWalkNodes) {
      const queue = this.readyQueues[wnId]!;
      const passes = queue.filter((p) => this.passes.has(p.passId));
      queue.length = 0;
      if (passes.length === 0) continue;
      const batchId = this.nextBatchId++;
      for (const p of passes) p.batch = batchId;
      this.batches.set(batchId, { open: passes.length, passes });
      batches.push({ batchId, walkNode: this.graph.walkNodes[wnId]!, passes });
    }
    this.readyWalkNodes.length = 0;
    return batches;
  }

  /**
   * A pass's result: its outputs by name (a declared output that is missing is
   * delivered empty; an undeclared one is released) and the loops it stops.
   * A result for a pass the conductor no longer knows (its request failed or
   * was aborted) is released and ignored.
   */
  completePass(passId: number, outputs: ReadonlyMap<string, Values>, stops: readonly string[] = []): void {
    this.enter();
    try {
      const pass = this.passes.get(passId);
      if (pass === undefined) {
        for (const values of outputs.values()) this.releaseLoose(values);
        return;
      }
      this.closePass(pass);
      const req = pass.request;
      for (const values of pass.inputs) this.drop(req, values);
      this.completeWithOutputs(req, pass.walkNode, outputs, stops, pass.chunks);
    } finally {
      this.exit();
    }
  }

  /**
   * A kv_cache node sampled a token for a request: completes the node's pass in
   * flight (every output edge of the node carries the token). A finish reason
   * (EOS, stop id, max tokens) stops the loop that pass is in at this iteration;
   * outside any loop it ends the partition with its walk. Tokens after a stop are
   * discarded. A frame model's token comes with its whole frame, which is
   * then what the outputs carry.
   */
  kvToken(requestId: RequestId, node: CompiledNode, tokenId: number, finish: string | null, frame: Int32Array | null = null): void {
    this.enter();
    try {
      const req = this.requests.get(requestId);
      if (req === undefined || req.kvRunning[node.id] === 0) return;
      if (finish === null && frame === null && this.carriedIteration(req, node, tokenId)) return;
      const wn = this.takeKvPass(req, node, finish);
      if (wn === null) return;
      const outputs = this.kvOutputScratch[wn.id]!;
      const values: Values = [{ kind: "tokens", ids: frame ?? Int32Array.of(tokenId) }];
      for (let o = 0; o < outputs.length; o++) outputs[o] = values;
      this.completeWalkNode(req, wn, outputs, this.plainMeta[wn.id]!);
    } finally {
      this.exit();
    }
  }

  /**
   * A decode-loop token that neither stops nor ends the loop: what the general
   * path (complete the pass, route, end the iteration, carry the next one)
   * comes to, done directly: the client outputs, then the next iteration,
   * whose pass the engine core already runs. False when the general path applies.
   */
  private carriedIteration(req: RequestState, node: CompiledNode, tokenId: number): boolean {
    const wnId = req.kvWalkNode[node.id]!;
    if (wnId < 0) return false;
    const loop = this.carriedLoopOf[wnId]!;
    if (loop < 0 || req.kvInputs[node.id] !== null || this.isLastIteration(req, loop)) return false;
    const wn = this.graph.walkNodes[wnId]!;
    if (!this.slotsEmpty(req, wn)) return false;
    const outputs = this.carriedClientOutputs[wnId]!;
    for (let i = 0; i < outputs.length; i++) this.sink.clientToken(req.id, outputs[i]!, tokenId, this.plainMeta[wnId]!);
    ++req.iter[loop]!;
    return true;
  }

  /**
   * A kv_cache node's pass whose result is tensors rather than one sampled
   * token (BAGEL's LLM in a denoising loop): outputs by name, loops it stops.
   */
  kvComplete(requestId: RequestId, node: CompiledNode, outputs: ReadonlyMap<string, Values>, stops: readonly string[] = []): void {
    this.enter();
    try {
      const req = this.requests.get(requestId);
      const wn = req === undefined || req.kvRunning[node.id] === 0 ? null : this.takeKvPass(req, node, null);
      if (req === undefined || wn === null || !req.alive) {
        for (const values of outputs.values()) this.releaseLoose(values);
        return;
      }
      this.completeWithOutputs(req, wn, outputs, stops, null);
    } finally {
      this.exit();
    }
  }

  /** Ends the kv_cache node's pass in flight; null (and the request failed) if there is none. */
  private takeKvPass(req: RequestState, node: CompiledNode, finish: string | null): CompiledWalkNode | null {
    const wnId = req.kvWalkNode[node.id]!;
    if (wnId < 0) {
      this.fail(req, `${node.name} reported a result while no pass of it was in flight`);
      return null;
    }
    const wn = this.graph.walkNodes[wnId]!;
    req.kvWalkNode[node.id] = -1;
    if (finish !== null) {
      req.kvRunning[node.id] = 0;
      if (wn.loop >= 0) req.stop[wn.loop] = 1;
      else req.partitionEngineFinished[this.graph.walks[wn.walk]!.partition] = 1;
    }
    const inputs = req.kvInputs[node.id];
    req.kvInputs[node.id] = null;
    if (inputs !== null && inputs !== undefined) for (const values of inputs) this.drop(req, values);
    return wn;
  }

  private completeWithOutputs(
    req: RequestState,
    wn: CompiledWalkNode,
    outputs: ReadonlyMap<string, Values>,
    stops: readonly string[],
    chunks: readonly (StreamChunk | null)[] | null,
  ): void {
    for (const values of outputs.values()) this.adopt(req, values);
    for (const name of stops) {
      for (const l of wn.loops) if (this.graph.loops[l]!.name === name) req.stop[l] = 1;
    }
    const aligned = wn.outputNames.map((name) => outputs.get(name) ?? NO_VALUES);
    let chunk: StreamChunk | null = null;
    if (chunks !== null) {
      let final = false;
      for (let i = 0; i < chunks.length; i++) {
        const c = chunks[i]!;
        if (c === null) continue;
        chunk ??= c;
        if (c.final) {
          req.streams[this.graph.slotConnection[wn.slotStart + i]!]!.finalConsumed = true;
          final = true;
        }
      }
      // The partition is done with this pass: loops around the consumer end at this iteration.
      if (final && this.streamsDone(req, this.graph.walks[wn.walk]!.partition)) for (const l of wn.loops) req.stop[l] = 1;
    }
    const meta = chunk === null ? this.plainMeta[wn.id]! : { walk: this.graph.walks[wn.walk]!, walkNode: wn, loop: null, chunk };
    this.completeWalkNode(req, wn, aligned, meta);
    for (const values of outputs.values()) this.settle(req, values);
  }

  /** A per-request failure (input preparation, check_stop, postprocess): fails that request only. */
  failRequest(requestId: RequestId, message: string): void {
    this.enter();
    try {
      const req = this.requests.get(requestId);
      if (req !== undefined) this.fail(req, message);
    } finally {
      this.exit();
    }
  }

  /** A pass failed for its own request only. */
  failPass(passId: number, message: string): void {
    this.enter();
    try {
      const pass = this.passes.get(passId);
      if (pass !== undefined) this.fail(pass.request, message);
    } finally {
      this.exit();
    }
  }

  /** A forward failed: every request with a pass in that batch fails. */
  failBatch(batchId: number, message: string): void {
    this.enter();
    try {
      const batch = this.batches.get(batchId);
      if (batch === undefined) return;
      this.batches.delete(batchId);
      for (const p of batch.passes) if (this.passes.has(p.passId)) this.fail(p.request, message);
    } finally {
      this.exit();
    }
  }

  /** The client went away: frees everything the request holds, reports nothing else. */
  abort(requestId: RequestId): void {
    this.enter();
    try {
      const req = this.requests.get(requestId);
      if (req !== undefined) this.remove(req);
    } finally {
      this.exit();
    }
  }

  // Call boundary: no re-entry from the sink; releases flushed once per call ----

  private enter(): void {
    if (this.busy) throw new ConductorError("the conductor was called back from its own sink");
    this.busy = true;
  }

  private exit(): void {
    this.busy = false;
    if (!this.releasesPending) return;
    this.releasesPending = false;
    for (const [worker, handles] of this.releases) {
      if (handles.length === 0) continue;
      const batch = handles.slice();
      handles.length = 0;
      this.sink.release(worker, batch);
    }
  }

  // References ---------------------------------------------------------------------

  private releaseTensor(v: TensorValue): void {
    let list = this.releases.get(v.worker);
    if (list === undefined) {
      list = [];
      this.releases.set(v.worker, list);
    }
    list.push(v.handle);
    this.releasesPending = true;
  }

  /** Values arriving from outside: the request answers for them from now on. */
  private adopt(req: RequestState, values: Values): void {
    for (let i = 0; i < values.length; i++) {
      const v = values[i]!;
      if (v.kind === "tensor" && !req.refs.has(v)) {
        req.refs.set(v, 0);
        this.heldCount++;
      }
    }
  }

  /** Adopted values nothing took are released. */
  private settle(req: RequestState, values: Values): void {
    for (let i = 0; i < values.length; i++) {
      const v = values[i]!;
      if (v.kind === "tensor" && req.refs.get(v) === 0) {
        req.refs.delete(v);
        this.heldCount--;
        this.releaseTensor(v);
      }
    }
  }

  private hold(req: RequestState, values: Values): void {
    for (let i = 0; i < values.length; i++) {
      const v = values[i]!;
      if (v.kind !== "tensor") continue;
      const n = req.refs.get(v);
      if (n === undefined) this.heldCount++;
      req.refs.set(v, (n ?? 0) + 1);
    }
  }

  private drop(req: RequestState, values: Values): void {
    for (let i = 0; i < values.length; i++) {
      const v = values[i]!;
      if (v.kind !== "tensor") continue;
      const n = req.refs.get(v);
      if (n === undefined) continue; // already released with the whole request
      if (n <= 1) {
        req.refs.delete(v);
        this.heldCount--;
        this.releaseTensor(v);
      } else req.refs.set(v, n - 1);
    }
  }

  private releaseLoose(values: Values): void {
    for (const v of values) if (v.kind === "tensor") this.releaseTensor(v);
  }

  // Passes -------------------------------------------------------------------------

  private closePass(pass: PassRecord): void {
    this.passes.delete(pass.passId);
    pass.request.livePasses.delete(pass.passId);
    const batch = this.batches.get(pass.batch);
    if (batch !== undefined && --batch.open === 0) this.batches.delete(pass.batch);
  }

  private checkReady(req: RequestState, wnId: number): void {
    if (req.wnState[wnId] !== WN_IDLE || req.normalMissing[wnId]! > 0) return;
    if (req.streamMissing[wnId]! > 0) {
      this.feedStreams(req, wnId);
      if (req.streamMissing[wnId]! > 0) return;
    }
    this.startPass(req, wnId);
  }

  private startPass(req: RequestState, wnId: number): void {
    const graph = this.graph;
    const wn = graph.walkNodes[wnId]!;
    req.wnState[wnId] = WN_STARTED;
    const count = wn.inputNames.length;
    const inputs: Values[] = new Array<Values>(count);
    let chunks: (StreamChunk | null)[] | null = null;
    for (let i = 0; i < count; i++) {
      const slot = wn.slotStart + i;
      inputs[i] = req.cur[slot] ?? NO_VALUES;
      req.cur[slot] = null;
      const chunk = req.chunkOf[slot]!;
      if (chunk !== null) {
        chunks ??= new Array<StreamChunk | null>(count).fill(null);
        chunks[i] = chunk;
        req.chunkOf[slot] = null;
      }
    }
    if (wn.node.engine === "kv_cache") {
      const node = wn.node.id;
      req.kvWalkNode[node] = wnId;
      req.kvInputs[node] = inputs;
      if (req.engineCarried[wnId] === 1) {
        req.engineCarried[wnId] = 0;
        return;
      }
      const continuing = req.kvRunning[node] === 1;
      req.kvRunning[node] = 1;
      this.sink.kvStart({ requestId: req.id, walkNode: wn, inputs, continuing });
      return;
    }
    const pass: PassRecord = {
      passId: this.nextPassId++,
      requestId: req.id,
      walkNode: wn,
      inputs,
      chunks: chunks ?? inputs.map(() => null),
      iterations: wn.loops.map((l) => req.iter[l]!),
      request: req,
      batch: 0,
    };
    this.passes.set(pass.passId, pass);
    req.livePasses.add(pass.passId);
    const queue = this.readyQueues[wnId]!;
    if (queue.length === 0) this.readyWalkNodes.push(wnId);
    queue.push(pass);
  }

  // Delivery -----------------------------------------------------------------------

  /** A value list for a normal input slot: current slot, next-iteration slot, then the queue. */
  private deliver(req: RequestState, slot: number, values: Values, check: boolean): void {
    this.hold(req, values);
    const wnId = this.graph.slotWalkNode[slot]!;
    if (req.wnState[wnId] === WN_IDLE && req.cur[slot] === null) {
      req.cur[slot] = values;
      req.normalMissing[wnId]!--;
      const caches = this.graph.slotExternalCaches[slot]!;
      for (let i = 0; i < caches.length; i++) {
        const c = caches[i]!;
        if (req.externalCache[c] === null) {
          req.externalCache[c] = values;
          this.hold(req, values);
        }
      }
      if (check) this.checkReady(req, wnId);
    } else if (req.next[slot] === null) {
      req.next[slot] = values;
    } else {
      const queue = req.queue[slot];
      if (queue === undefined) req.queue[slot] = [values];
      else queue.push(values);
    }
  }

  private isLastIteration(req: RequestState, loop: number): boolean {
    return req.stop[loop] === 1 || req.iter[loop]! + 1 >= this.graph.loops[loop]!.maxIters;
  }

  private route(req: RequestState, routes: readonly Route[], values: Values, meta: ClientOutputMeta): void {
    for (let i = 0; i < routes.length; i++) {
      const r = routes[i]!;
      switch (r.kind) {
        case ROUTE_SLOT:
          // The engine core feeds a kv_cache node its own token; after the last
          // iteration a loop-back edge goes nowhere.
          if (r.engineCarried || (r.loopBackOf >= 0 && this.isLastIteration(req, r.loopBackOf))) break;
          this.deliver(req, r.target, values, true);
          break;
        case ROUTE_CLIENT:
          this.sink.clientOutput(req.id, this.graph.clientOutputs[r.target]!, values, meta);
          break;
        case ROUTE_STREAM:
          this.streamAppend(req, r.target, values);
          break;
        case ROUTE_PERSIST: {
          const held = req.persist[r.target];
          req.persist[r.target] = held === null || held === undefined ? values : [...held, ...values];
          this.hold(req, values);
          break;
        }
        default:
          break; // ROUTE_DROP
      }
      if (!req.alive) return;
    }
  }

  private completeWalkNode(req: RequestState, wn: CompiledWalkNode, outputs: readonly Values[], meta: ClientOutputMeta): void {
    req.wnState[wn.id] = WN_DONE;
    for (let i = 0; i < wn.captures.length; i++) {
      const c = wn.captures[i]!;
      this.capture(req, c.capture, outputs[c.output]!);
    }
    for (let o = 0; o < outputs.length; o++) {
      this.route(req, wn.outputRoutes[o]!, outputs[o]!, meta);
      if (!req.alive) return;
    }
    this.sectionComplete(req, wn.section);
  }

  private capture(req: RequestState, captureId: number, values: Values): void {
    const old = req.captured[captureId] ?? null;
    if (this.captureAccumulates[captureId] === 1) {
      req.captured[captureId] = old === null ? values : [...old, ...values];
    } else {
      req.captured[captureId] = values;
      if (old !== null) this.drop(req, old);
    }
    this.hold(req, values);
  }

  // Completion: sections, loops, walks, partitions, requests ---------------------

  private sectionComplete(req: RequestState, sectionId: number): void {
    const sections = this.graph.sections;
    let id = sectionId;
    for (;;) {
      const parent = sections[id]!.parent;
      if (parent < 0) {
        this.walkComplete(req, sections[id]!.walk);
        return;
      }
      const p = sections[parent]!;
      if (p.kind === SECTION_LOOP) {
        this.loopIterationEnd(req, p.loop);
        return;
      }
      if (++req.doneChildren[parent]! < p.children.length) return;
      id = parent;
    }
  }

  private loopIterationEnd(req: RequestState, loopId: number): void {
    const loop = this.graph.loops[loopId]!;
    if (this.isLastIteration(req, loopId)) {
      this.finishLoop(req, loop);
      if (req.alive) this.sectionComplete(req, loop.section);
    } else this.advanceLoop(req, loop);
  }

  private clearSlot(req: RequestState, slot: number): void {
    const cur = req.cur[slot];
    if (cur !== null && cur !== undefined) this.drop(req, cur);
    const next = req.next[slot];
    if (next !== null && next !== undefined) this.drop(req, next);
    const queue = req.queue[slot];
    if (queue !== undefined) for (const values of queue) this.drop(req, values);
    req.cur[slot] = null;
    req.next[slot] = null;
    req.queue[slot] = undefined;
    req.chunkOf[slot] = null;
  }

  private finishLoop(req: RequestState, loop: CompiledLoop): void {
    const graph = this.graph;
    // The engine core would go on decoding: a loop ended by anything but its
    // finish reason stops it.
    for (let w = loop.walkNodeStart; w < loop.walkNodeEnd; w++) {
      const node = graph.walkNodes[w]!.node;
      if (node.engine === "kv_cache" && req.kvRunning[node.id] === 1) this.stopKv(req, node);
    }
    for (const slot of loop.loopBackSlots) this.clearSlot(req, slot);
    const meta: ClientOutputMeta = { walk: graph.walks[loop.walk]!, walkNode: null, loop, chunk: null };
    for (const o of loop.outputs) {
      this.route(req, o.routes, req.captured[o.capture] ?? NO_VALUES, meta);
      if (!req.alive) return;
    }
    for (const pc of loop.parentCaptures) this.capture(req, pc.to, req.captured[pc.from] ?? NO_VALUES);
    for (const c of loop.captures) this.clearCapture(req, c.id);
    for (let i = 0; i < loop.externalSlots.length; i++) this.clearExternal(req, loop.externalCacheStart + i);
  }

  private clearCapture(req: RequestState, id: number): void {
    const values = req.captured[id];
    if (values !== null && values !== undefined) this.drop(req, values);
    req.captured[id] = null;
  }

  private clearExternal(req: RequestState, id: number): void {
    const values = req.externalCache[id];
    if (values !== null && values !== undefined) this.drop(req, values);
    req.externalCache[id] = null;
  }

  private advanceLoop(req: RequestState, loop: CompiledLoop): void {
    const graph = this.graph;
    req.iter[loop.id]!++;
    for (const c of loop.captures) if (!c.accumulate) this.clearCapture(req, c.id);
    // The LLM's decode loop: the engine core already computes the next
    // iteration's pass; nothing else to reset or deliver.
    const carried = loop.engineCarriedBody;
    if (carried >= 0) {
      const wn = graph.walkNodes[carried]!;
      const node = wn.node.id;
      if (req.kvRunning[node] === 1 && this.slotsEmpty(req, wn)) {
        req.wnState[carried] = WN_STARTED;
        req.kvWalkNode[node] = carried;
        req.kvInputs[node] = null;
        return;
      }
    }
    for (let s = loop.sectionStart; s < loop.sectionEnd; s++) req.doneChildren[s] = 0;
    for (let l = loop.id + 1; l < loop.loopEnd; l++) {
      req.iter[l] = 0;
      req.stop[l] = 0;
    }
    for (let w = loop.walkNodeStart; w < loop.walkNodeEnd; w++) {
      const wn = graph.walkNodes[w]!;
      req.wnState[w] = WN_IDLE;
      let missing = 0;
      for (let i = 0; i < wn.inputNames.length; i++) {
        const slot = wn.slotStart + i;
        if (graph.slotConnection[slot]! >= 0) continue;
        const cur = req.cur[slot];
        if (cur !== null && cur !== undefined) this.drop(req, cur); // cannot happen: every body node ran
        req.cur[slot] = req.next[slot] ?? null;
        const queue = req.queue[slot];
        req.next[slot] = queue === undefined ? null : (queue.shift() ?? null);
        if (queue !== undefined && queue.length === 0) req.queue[slot] = undefined;
        if (req.cur[slot] === null) missing++;
      }
      if (wn.node.engine === "kv_cache" && req.kvRunning[wn.node.id] === 1 && wn.engineCarriedSlots.length > 0) {
        for (const slot of wn.engineCarriedSlots) if (req.cur[slot] === null) missing--;
        req.engineCarried[w] = 1;
      }
      req.normalMissing[w] = missing;
      req.streamMissing[w] = wn.streamSlots.length;
    }
    for (let i = 0; i < loop.externalSlots.length; i++) {
      const values = req.externalCache[loop.externalCacheStart + i];
      if (values !== null && values !== undefined) this.deliver(req, loop.externalSlots[i]!, values, false);
    }
    for (let w = loop.walkNodeStart; w < loop.walkNodeEnd && req.alive; w++) this.checkReady(req, w);
  }

  /** Every incoming stream that can end (not continue-after-done) had its final chunk consumed, and there is one. */
  private streamsDone(req: RequestState, partition: number): boolean {
    let done = false;
    for (const c of this.graph.partitions[partition]!.incoming) {
      if (this.graph.connections[c]!.policy.continue_after_done) continue;
      if (!req.streams[c]!.finalConsumed) return false;
      done = true;
    }
    return done;
  }

  private slotsEmpty(req: RequestState, wn: CompiledWalkNode): boolean {
    for (let slot = wn.slotStart; slot < wn.slotStart + wn.inputNames.length; slot++) {
      if (req.cur[slot] !== null || req.next[slot] !== null || req.queue[slot] !== undefined) return false;
    }
    return true;
  }

  private walkComplete(req: RequestState, walkId: number): void {
    const graph = this.graph;
    const walk = graph.walks[walkId]!;
    for (let slot = walk.slotStart; slot < walk.slotEnd; slot++) this.clearSlot(req, slot);
    for (let w = walk.walkNodeStart; w < walk.walkNodeEnd; w++) {
      req.wnState[w] = WN_INACTIVE;
      req.engineCarried[w] = 0;
    }
    const p = graph.partitions[walk.partition]!;
    const step = p.after[walkId] ?? null;
    if (this.streamsDone(req, p.id) || req.partitionEngineFinished[p.id] === 1 || step === null) {
      if (step !== null) for (const id of step.release) this.releasePersist(req, id);
      this.partitionDone(req, p.id);
      return;
    }
    this.runStep(req, p.id, step);
  }

  /** Starts the step's walk (or ends the partition), hands it its inputs, releases what it says. */
  private runStep(req: RequestState, partition: number, step: CompiledStep): void {
    const graph = this.graph;
    if (step.walk < 0) {
      for (const id of step.release) this.releasePersist(req, id);
      this.partitionDone(req, partition);
      return;
    }
    const walk = graph.walks[step.walk]!;
    req.partitionWalk[partition] = walk.id;
    for (let s = walk.sectionStart; s < walk.sectionEnd; s++) req.doneChildren[s] = 0;
    for (let l = walk.loopStart; l < walk.loopEnd; l++) {
      req.iter[l] = 0;
      req.stop[l] = 0;
    }
    for (let w = walk.walkNodeStart; w < walk.walkNodeEnd; w++) {
      const wn = graph.walkNodes[w]!;
      req.wnState[w] = WN_IDLE;
      req.engineCarried[w] = 0;
      req.normalMissing[w] = wn.normalInputs;
      req.streamMissing[w] = wn.streamSlots.length;
    }
    for (const input of step.inputs) {
      const values = (input.prompt >= 0 ? req.prompt[input.prompt] : req.persist[input.persist]) ?? NO_VALUES;
      this.deliver(req, input.slot, values, false);
    }
    for (const id of step.release) this.releasePersist(req, id);
    for (let w = walk.walkNodeStart; w < walk.walkNodeEnd && req.alive; w++) this.checkReady(req, w);
  }

  private releasePersist(req: RequestState, id: number): void {
    const values = req.persist[id];
    if (values !== null && values !== undefined) this.drop(req, values);
    req.persist[id] = null;
  }

  private partitionDone(req: RequestState, partition: number): void {
    if (req.partitionDone[partition] === 1) return;
    req.partitionDone[partition] = 1;
    req.partitionWalk[partition] = -1;
    req.partitionsLeft--;
    for (const node of this.partitionKvNodes[partition]!) {
      if (req.kvRunning[node] === 1) this.stopKv(req, this.graph.nodes[node]!);
    }
    const p = this.graph.partitions[partition]!;
    for (const c of p.incoming) this.dropStream(req, c);
    this.endOutgoingStreams(req, partition);
    if (req.alive && req.partitionsLeft === 0) this.finishRequest(req);
  }

  private stopKv(req: RequestState, node: CompiledNode): void {
    req.kvRunning[node.id] = 0;
    req.kvWalkNode[node.id] = -1;
    const inputs = req.kvInputs[node.id];
    req.kvInputs[node.id] = null;
    if (inputs !== null && inputs !== undefined) for (const values of inputs) this.drop(req, values);
    this.sink.kvStop(req.id, node);
  }

  private finishRequest(req: RequestState): void {
    this.remove(req);
    this.sink.requestDone(req.id);
  }

  private fail(req: RequestState, message: string): void {
    this.remove(req);
    this.sink.requestFailed(req.id, message);
  }

  /** Forgets a request: its passes are void, its engine requests stopped, its tensors released. */
  private remove(req: RequestState): void {
    if (!req.alive) return;
    req.alive = false;
    this.requests.delete(req.id);
    for (const passId of req.livePasses) {
      const pass = this.passes.get(passId);
      if (pass !== undefined) this.closePass(pass);
    }
    req.livePasses.clear();
    for (let node = 0; node < req.kvRunning.length; node++) {
      if (req.kvRunning[node] === 1) {
        req.kvRunning[node] = 0;
        this.sink.kvStop(req.id, this.graph.nodes[node]!);
      }
    }
    for (const v of req.refs.keys()) this.releaseTensor(v);
    this.heldCount -= req.refs.size;
    req.refs.clear();
  }

  // Streams ------------------------------------------------------------------------

  private streamAppend(req: RequestState, connection: number, values: Values): void {
    const conn = this.graph.connections[connection]!;
    if (req.partitionDone[conn.to] === 1 || values.length === 0) return;
    const st = req.streams[connection]!;
    for (const v of values) st.items.push(v);
    st.produced += values.length;
    this.hold(req, values);
    this.feedConnection(req, connection);
  }

  private endOutgoingStreams(req: RequestState, partition: number): void {
    for (const c of this.graph.partitions[partition]!.outgoing) {
      const st = req.streams[c]!;
      if (st.ended) continue;
      st.ended = true;
      if (req.partitionDone[this.graph.connections[c]!.to] === 0) this.feedConnection(req, c);
      if (!req.alive) return;
    }
  }

  private dropStream(req: RequestState, connection: number): void {
    const st = req.streams[connection]!;
    for (const v of st.items) if (v.kind === "tensor") this.drop(req, [v]);
    st.base += st.items.length;
    st.items.length = 0;
  }

  /** New items or the end: the consumer's current walk may take a chunk. */
  private feedConnection(req: RequestState, connection: number): void {
    const conn = this.graph.connections[connection]!;
    const walk = req.partitionWalk[conn.to]!;
    if (walk < 0) return;
    for (const slot of conn.consumerSlots) {
      const wnId = this.graph.slotWalkNode[slot]!;
      if (this.graph.walkNodes[wnId]!.walk === walk) this.checkReady(req, wnId);
      if (!req.alive) return;
    }
  }

  /** Fills the walk node's empty streaming slots with chunks, if their policies yield one. */
  private feedStreams(req: RequestState, wnId: number): void {
    const wn = this.graph.walkNodes[wnId]!;
    for (const slot of wn.streamSlots) {
      if (req.cur[slot] !== null) continue;
      const connection = this.graph.slotConnection[slot]!;
      const st = req.streams[connection]!;
      if (st.finalTaken) continue;
      const policy = this.graph.connections[connection]!.policy;
      const chunk = nextChunk(policy, st.nextIndex, st.produced, st.ended ? st.produced : null);
      if (chunk === null) continue;
      const from = chunk.start - st.base;
      const values = st.items.slice(from, from + chunk.count);
      this.hold(req, values);
      req.cur[slot] = values;
      req.chunkOf[slot] = chunk;
      req.streamMissing[wnId]!--;
      st.nextIndex++;
      if (chunk.final) st.finalTaken = true;
      // Items before the next chunk's start are never needed again.
      const keepFrom = chunk.final ? st.produced : Math.min(chunkStart(policy, st.nextIndex), st.produced);
      if (keepFrom > st.base) {
        const gone = st.items.splice(0, keepFrom - st.base);
        st.base = keepFrom;
        this.drop(req, gone);
      }
    }
  }
}
