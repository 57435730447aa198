// A tiny executor that plays the workers and the engine core for conductor
// tests: it runs the passes the conductor hands out with per-node behaviours,
// produces sampled tokens for kv_cache nodes from a script, owns a tensor store
// per worker (to check that every tensor is released exactly once) and records
// what the client would see. It is the conductor's caller, not a mock of it.

import assert from "node:assert/strict";
import { compileGraph, type CompiledClientOutput, type CompiledGraph, type CompiledNode } from "../../src/graph/compile.js";
import type { ModelGraphLayout } from "../../src/graph/layout.js";
import {
  Conductor,
  type AdmitOptions,
  type ClientOutputMeta,
  type ConductorSink,
  type KvStart,
  type ReadyBatch,
  type ReadyPass,
} from "../../src/conductor/conductor.js";
import type { TensorValue, TokensValue, Value, Values } from "../../src/conductor/values.js";
import type { RequestId } from "../../src/engine/types.js";

interface PassResult {
  outputs?: Record<string, Values>;
  stops?: string[];
}

/** What a stateless node computes for one pass. */
export type Behaviour = (pass: ReadyPass, ex: Executor) => PassResult;

export interface ClientEvent {
  /** The request's label (see Executor.idOf). */
  requestId: string;
  output: CompiledClientOutput;
  values: Values;
  meta: ClientOutputMeta;
}

/** Next token of a kv_cache node for a request: the token id and a finish reason. */
export type TokenScript = (requestId: string, index: number) => { token: number; finish: string | null };

interface EngineRequest {
  requestId: RequestId;
  node: CompiledNode;
  produced: number;
}

export class Executor implements ConductorSink {
  readonly graph: CompiledGraph;
  readonly conductor: Conductor;
  readonly behaviours = new Map<string, Behaviour>();
  readonly tokenScripts = new Map<string, TokenScript>();
  /** Worker of each node (default 0). */
  placement: (node: string) => number = () => 0;
  /** Tensor store per worker: handle -> label. */
  readonly stores = new Map<number, Map<number, string>>();
  private nextHandle = 1;
  readonly labels = new Map<TensorValue, string>();
  readonly client: ClientEvent[] = [];
  readonly log: string[] = [];
  readonly done: string[] = [];
  readonly failed = new Map<string, string>();
  /** Runs per "node/walk". */
  readonly runs = new Map<string, number>();
  readonly passesSeen: ReadyPass[] = [];
  readonly batchesSeen: ReadyBatch[] = [];
  readonly releaseCalls: { worker: number; handles: readonly number[] }[] = [];
  readonly engine = new Map<string, EngineRequest>();
  private readonly ids = new Map<string, RequestId>();
  private readonly labelById = new Map<RequestId, string>();
  readonly kvStarts: KvStart[] = [];
  readonly kvStops: string[] = [];
  /** Passes of stepped kv_cache nodes (with a behaviour) waiting to run. */
  kvPending: KvStart[] = [];
  /** Passes taken but not yet completed (for tests that hold results back). */
  held: ReadyPass[] = [];
  holdBack: (pass: ReadyPass) => boolean = () => false;

  constructor(layout: ModelGraphLayout) {
    this.graph = compileGraph(layout);
    this.conductor = new Conductor(this.graph, this);
  }

  on(nodeName: string, behaviour: Behaviour): this {
    this.behaviours.set(nodeName, behaviour);
    return this;
  }

  // Values -----------------------------------------------------------------------

  tensor(label: string, worker = 0): TensorValue {
    const v: TensorValue = { kind: "tensor", handle: this.nextHandle++, worker, dtype: "float32", shape: [1], shm: null };
    let store = this.stores.get(worker);
    if (store === undefined) {
      store = new Map();
      this.stores.set(worker, store);
    }
    store.set(v.handle, label);
    this.labels.set(v, label);
    return v;
  }

  static tokens(...ids: number[]): TokensValue {
    return { kind: "tokens", ids: Int32Array.from(ids) };
  }

  label(v: Value): string {
    if (v.kind === "tensor") return this.labels.get(v) ?? `?${v.handle}`;
    if (v.kind === "tokens") return `t${[...v.ids].join(",")}`;
    return "empty";
  }

  labelsOf(values: Values): string[] {
    return values.map((v) => this.label(v));
  }

  /** Input values of a pass by name, as labels. */
  input(pass: ReadyPass, name: string): string[] {
    const i = pass.walkNode.inputNames.indexOf(name);
    assert.ok(i >= 0, `${pass.walkNode.node.name} has no input ${name}`);
    return this.labelsOf(pass.inputs[i]!);
  }

  liveTensors(): number {
    let n = 0;
    for (const store of this.stores.values()) n += store.size;
    return n;
  }

  // Request labels ---------------------------------------------------------------

  /** The conductor's numeric id of the request the tests call `label` (made on first use). */
  idOf(label: string): RequestId {
    let id = this.ids.get(label);
    if (id === undefined) {
      id = this.ids.size + 1;
      this.ids.set(label, id);
      this.labelById.set(id, label);
    }
    return id;
  }

  labelOf(id: RequestId): string {
    return this.labelById.get(id) ?? `#${id}`;
  }

  // Sink ---------------------------------------------------------------------------

  clientOutput(id: RequestId, output: CompiledClientOutput, values: Values, meta: ClientOutputMeta): void {
    const requestId = this.labelOf(id);
    this.client.push({ requestId, output, values, meta });
    this.log.push(`client ${requestId} ${output.name}=${this.labelsOf(values).join("+")}`);
  }

  clientToken(id: RequestId, output: CompiledClientOutput, tokenId: number, meta: ClientOutputMeta): void {
    this.clientOutput(id, output, [Executor.tokens(tokenId)], meta);
  }

  requestDone(id: RequestId): void {
    const requestId = this.labelOf(id);
    this.done.push(requestId);
    this.log.push(`done ${requestId}`);
  }

  requestFailed(id: RequestId, message: string): void {
    const requestId = this.labelOf(id);
    assert.ok(!this.failed.has(requestId), `request ${requestId} failed twice`);
    this.failed.set(requestId, message);
    this.log.push(`failed ${requestId}: ${message}`);
  }

  release(worker: number, handles: readonly number[]): void {
    this.releaseCalls.push({ worker, handles });
    const store = this.stores.get(worker);
    for (const h of handles) {
      assert.ok(store?.has(h) === true, `worker ${worker} released handle ${h}, which it does not hold (twice?)`);
      store.delete(h);
    }
  }

  kvStart(start: KvStart): void {
    this.kvStarts.push(start);
    if (this.behaviours.has(start.walkNode.node.name)) {
      // A kv_cache node stepped per pass (not decoding on its own token).
      this.kvPending.push(start);
      this.log.push(`kvStart ${this.labelOf(start.requestId)}/${start.walkNode.node.name} stepped`);
      return;
    }
    const key = `${this.labelOf(start.requestId)}/${start.walkNode.node.name}`;
    this.log.push(`kvStart ${key} ${start.continuing ? "continuing" : "new"}`);
    if (start.continuing) assert.ok(this.engine.has(key), `continuing ${key}, which the engine does not run`);
    else {
      assert.ok(!this.engine.has(key), `starting ${key} twice`);
      this.engine.set(key, { requestId: start.requestId, node: start.walkNode.node, produced: 0 });
    }
  }

  kvStop(id: RequestId, node: CompiledNode): void {
    const key = `${this.labelOf(id)}/${node.name}`;
    this.kvStops.push(key);
    this.log.push(`kvStop ${key}`);
    this.engine.delete(key);
  }

  // Driving --------------------------------------------------------------------------

  admit(label: string, prompt: Record<string, Values> = {}, options: AdmitOptions = {}): void {
    this.conductor.admit(this.idOf(label), new Map(Object.entries(prompt)), options);
  }

  /** Runs one pass's behaviour and reports its result. */
  runPass(pass: ReadyPass): void {
    const name = pass.walkNode.node.name;
    const key = `${name}/${this.graph.walks[pass.walkNode.walk]!.name}`;
    this.runs.set(key, (this.runs.get(key) ?? 0) + 1);
    const behaviour = this.behaviours.get(name);
    assert.ok(behaviour !== undefined, `no behaviour for node ${name}`);
    const result = behaviour(pass, this);
    this.conductor.completePass(pass.passId, new Map(Object.entries(result.outputs ?? {})), result.stops ?? []);
  }

  /** One step: every ready batch runs, then every running engine request samples one token. Returns whether anything ran. */
  step(): boolean {
    const batches = this.conductor.takeReady();
    for (const b of batches) {
      this.batchesSeen.push(b);
      for (const pass of b.passes) {
        this.passesSeen.push(pass);
        if (this.holdBack(pass)) this.held.push(pass);
        else this.runPass(pass);
      }
    }
    let ran = batches.length > 0;
    const stepped = this.kvPending;
    this.kvPending = [];
    for (const start of stepped) {
      const pass: ReadyPass = {
        passId: -1,
        requestId: start.requestId,
        walkNode: start.walkNode,
        inputs: start.inputs,
        chunks: start.inputs.map(() => null),
        iterations: [],
      };
      const name = start.walkNode.node.name;
      const key = `${name}/${this.graph.walks[start.walkNode.walk]!.name}`;
      this.runs.set(key, (this.runs.get(key) ?? 0) + 1);
      const result = this.behaviours.get(name)!(pass, this);
      this.conductor.kvComplete(start.requestId, start.walkNode.node, new Map(Object.entries(result.outputs ?? {})), result.stops ?? []);
      ran = true;
    }
    for (const [key, req] of [...this.engine]) {
      if (!this.engine.has(key)) continue;
      const script = this.tokenScripts.get(req.node.name);
      assert.ok(script !== undefined, `no token script for ${req.node.name}`);
      const { token, finish } = script(this.labelOf(req.requestId), req.produced++);
      if (finish !== null) this.engine.delete(key);
      ran = true;
      this.conductor.kvToken(req.requestId, req.node, token, finish);
    }
    return ran;
  }

  /** Steps until nothing is left to run. */
  run(maxSteps = 10_000): void {
    for (let i = 0; i < maxSteps; i++) if (!this.step()) return;
    assert.fail(`still running after ${maxSteps} steps`);
  }

  clientOf(requestId: string, name?: string): string[] {
    return this.client
      .filter((c) => c.requestId === requestId && (name === undefined || c.output.name === name)).map((c) => this.labelsOf(c.values).join("+"));
  }

  runsOf(nodeName: string, walk: string): number {
    return this.runs.get(`${nodeName}/${walk}`) ?? 0;
  }
}

