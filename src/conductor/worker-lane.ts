// One model worker as the graph engine sees it: the steps sent to it, in
// order, and the graph work waiting for the next one (prompts to process,
// stateless pass batches, tensor releases, ended requests).
//
// Graph work rides in the next step that goes to the worker: the engine
// core's (a worker hosting a kv_cache node sends one every engine step) or,
// when none is in flight, a step of its own with no rows. So the seam is
// crossed once per worker per step whatever the number of requests, and a
// stateless node's pass runs in the same worker call as the decode rows of
// the step it was ready for.
//
// Grammar masks (structured output) follow the engine core's step as a
// StepMask naming the step's id; the lane renumbers steps, so it translates
// the core's id to the wire id it sent that step under. The worker waits for
// a mask only in a step with mask_rows, which the lane's own steps never have.
// When the worker dies, the lane drops what only the dead worker could use
// (tensor releases, ended requests) and fails the graph work still waiting;
// after a restart it sends to the new worker (replaceClient).

import type { RequestId } from "../engine/types.js";
import type { StepExecutor } from "../worker/types.js";
import type { KvTransfer, PassBatch, PromptRequest, ReadyMessage, StepMaskMessage, StepMessage, StepResultMessage } from "../transport/messages.js";
import type { WorkerClient } from "../worker/types.js";

/** The graph work a step carried, for matching its results (or failing them). */
export interface AttachedWork {
  readonly prompts: readonly PromptRequest[];
  /** The batches as the conductor made them. */
  readonly batches: readonly PassBatch[];
  /** What the worker ran: one forward per entry (mergeBatches). */
  readonly sent: readonly PassBatch[];
}

export interface LaneListener {
  /** The step's result arrived (before the engine core sees its rows). */
  stepDone(lane: WorkerLane, work: AttachedWork, result: StepResultMessage, roundTripMs: number): void;
  /** The worker did not answer the step (it died, or broke the protocol). */
  stepFailed(lane: WorkerLane, work: AttachedWork, error: Error): void;
}

const NO_INTS = new Int32Array(0);
const NO_BYTES = new Uint8Array(0);
const NO_WORK: AttachedWork = Object.freeze({ prompts: [], batches: [], sent: [] });

export class WorkerLane implements StepExecutor {
  private prompts: PromptRequest[] = [];
  private batches: PassBatch[] = [];
  private releases: number[] = [];
  private finished: RequestId[] = [];
  /** KV blocks this (prefill) worker sends to a decode worker (KV connector). */
  private kvSends: KvTransfer[] = [];
  private inFlight = 0;
  /** Wire step ids: the lane numbers every step it sends (the engine core's and its own), strictly increasing. */
  private nextWireStepId = 0;
  /** Engine-core step id -> wire step id, for the core's steps in flight (a worker hosts one kv_cache node, so one core). */
  private readonly wireIds = new Map<number, number>();
  private kickScheduled = false;
  /** The worker died and no new one is here yet. */
  private down = false;

  constructor(
    /** The worker's rank in the deployment (0 without one). */
    readonly rank: number,
    private workerClient: WorkerClient,
    private readonly listener: LaneListener,
    /** What sends the steps: the client, or a benchmark's timing layer around it. */
    private executor: StepExecutor = workerClient,
  ) {}

  get client(): WorkerClient {
    return this.workerClient;
  }

  get ready(): ReadyMessage {
    return this.workerClient.ready;
  }

  /**
   * The worker died: tensor handles and request ids meant for it mean nothing
   * to the next one, so they are dropped; prompts and passes still waiting fail.
   */
  workerLost(error: Error): void {
    this.down = true;
    this.releases = [];
    this.finished = [];
    const work: AttachedWork = { prompts: this.prompts, batches: this.batches, sent: this.batches };
    this.prompts = [];
    this.batches = [];
    if (work.prompts.length > 0 || work.batches.length > 0) this.listener.stepFailed(this, work, error);
  }

  /** A restarted worker takes over (steps still in flight to the old one have failed by now). */
  replaceClient(client: WorkerClient, executor: StepExecutor = client): void {
    this.workerClient = client;
    this.executor = executor;
    this.down = false;
    this.kick();
  }

  /** Steps sent and not answered yet. */
  get stepsInFlight(): number {
    return this.inFlight;
  }

  addPrompt(prompt: PromptRequest): void {
    this.prompts.push(prompt);
    this.kick();
  }

  addBatch(batch: PassBatch): void {
    this.batches.push(batch);
    this.kick();
  }

  release(handles: readonly number[]): void {
    // Handles of a dead worker: its store is gone with it.
    if (this.down) return;
    for (const h of handles) this.releases.push(h);
    this.kick();
  }

  /** KV connector: the worker sends these blocks (its peer loads them under the same transfer ids). */
  addKvSends(sends: readonly KvTransfer[]): void {
    if (this.down) return;
    for (const s of sends) this.kvSends.push(s);
    this.kick();
  }

  requestEnded(requestId: RequestId): void {
    if (this.down) return;
    this.finished.push(requestId);
    this.kick();
  }

  /** Passes waiting for a step, per node name. */
  queuedPasses(into: Map<string, number>): void {
    for (const b of this.batches) into.set(b.node, (into.get(b.node) ?? 0) + b.passes.length);
  }

  /** Sends a step (the engine core's, or the lane's own), carrying the graph work waiting. */
  executeStep(message: StepMessage): Promise<StepResultMessage> {
    const work = this.attach(message);
    // The engine core counts its own steps; the worker sees the lane's numbering, the core gets its id back.
    const coreStepId = message.step_id;
    const wireStepId = this.nextWireStepId++;
    message.step_id = wireStepId;
    // Only the core's steps can have masks to follow (its ids are >= 0; the lane's own are -1).
    if (coreStepId >= 0) this.wireIds.set(coreStepId, wireStepId);
    this.inFlight++;
    const sentAt = performance.now();
    let sent: Promise<StepResultMessage>;
    try {
      sent = this.executor.executeStep(message);
    } catch (error) {
      sent = Promise.reject(error);
    }
    // Encoded synchronously above: the caller keeps its own id on its message.
    message.step_id = coreStepId;
    return sent.then(
      (result) => {
        this.inFlight--;
        this.wireIds.delete(coreStepId);
        result.step_id = coreStepId;
        if (work !== NO_WORK) this.listener.stepDone(this, work, result, performance.now() - sentAt);
        this.kick();
        return result;
      },
      (error: unknown) => {
        this.inFlight--;
        this.wireIds.delete(coreStepId);
        if (work !== NO_WORK) this.listener.stepFailed(this, work, error instanceof Error ? error : new Error(String(error)));
        this.kick();
        throw error;
      },
    );
  }

  /**
   * The grammar masks of the engine core's step `mask.step_id`, sent under
   * that step's wire id. A step no longer in flight has no worker waiting
   * for its mask (it answered, or failed): the mask is dropped.
   */
  sendStepMask(mask: StepMaskMessage): void {
    const wireStepId = this.wireIds.get(mask.step_id);
    if (wireStepId === undefined) return;
    this.executor.sendStepMask?.({ ...mask, step_id: wireStepId });
  }

  private attach(message: StepMessage): AttachedWork {
    if (this.kvSends.length > 0) {
      message.kv = { sends: this.kvSends, loads: message.kv?.loads ?? [], cancels: message.kv?.cancels ?? NO_INTS };
      this.kvSends = [];
    }
    if (this.releases.length === 0 && this.finished.length === 0 && this.prompts.length === 0 && this.batches.length === 0) return NO_WORK;
    const sent = mergeBatches(this.batches);
    const work: AttachedWork = { prompts: this.prompts, batches: this.batches, sent };
    message.graph = { prompts: this.prompts, batches: sent, releases: Int32Array.from(this.releases), finished_requests: Int32Array.from(this.finished) };
    this.prompts = [];
    this.batches = [];
    this.releases = [];
    this.finished = [];
    return work.prompts.length === 0 && work.batches.length === 0 ? NO_WORK : work;
  }

  private hasWork(): boolean {
    return this.prompts.length > 0 || this.batches.length > 0 || this.releases.length > 0 || this.finished.length > 0 || this.kvSends.length > 0;
  }

  /**
   * After the current turn: when nothing is in flight to this worker (no
   * engine-core step will carry the work), send a step of the lane's own.
   */
  private kick(): void {
    if (this.kickScheduled || !this.hasWork()) return;
    this.kickScheduled = true;
    setImmediate(() => {
      this.kickScheduled = false;
      if (this.inFlight > 0 || !this.hasWork()) return;
      if (!this.workerClient.alive && this.prompts.length === 0 && this.batches.length === 0) {
        // Nothing to free on a dead worker; passes and prompts still go, to fail at once instead of waiting.
        this.releases = [];
        this.finished = [];
        this.kvSends = [];
        return;
      }
      this.executeStep(graphOnlyStep()).catch(() => {});
    });
  }
}

/**
 * One batch per (node, walk) for a step: the passes of batches the conductor
 * handed out at different moments (requests admitted apart, passes completed
 * by different steps) run as one forward on the worker, not one per batch.
 * A request's passes stay in order: a batch with a request already in the
 * merged one (two stream chunks of one request) starts a new one after it.
 */
export function mergeBatches(batches: readonly PassBatch[]): PassBatch[] {
  if (batches.length < 2) return batches.slice();
  const merged: PassBatch[] = [];
  const open = new Map<string, { batch: PassBatch; requests: Set<RequestId> }>();
  for (const b of batches) {
    const key = `${b.node}\u0000${b.walk}`;
    const target = open.get(key);
    if (target !== undefined && !b.passes.some((p) => target.requests.has(p.request_id))) {
      target.batch.passes.push(...b.passes);
      for (const p of b.passes) target.requests.add(p.request_id);
      continue;
    }
    const batch: PassBatch = { ...b, passes: [...b.passes] };
    merged.push(batch);
    open.set(key, { batch, requests: new Set(b.passes.map((p) => p.request_id)) });
  }
  return merged;
}

/** A step with no rows: it carries only graph work. */
function graphOnlyStep(): StepMessage {
  return {
    kind: "Step",
    step_id: -1,
    added: [],
    removed: NO_INTS,
    req_ids: NO_INTS,
    num_new_tokens: NO_INTS,
    num_computed: NO_INTS,
    new_block_counts: NO_INTS,
    new_block_ids: NO_INTS,
    sample: NO_BYTES,
    mask_rows: NO_INTS,
    graph: null,
    kv: null,
    lora: null,
    spec: null,
  };
}
