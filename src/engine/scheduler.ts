// The scheduler (vLLM V1 style): no prefill or decode phase. Each step has a
// token budget and a sequence cap; running requests get tokens first (decodes
// and continuing prefill chunks, in admission order), then waiting requests
// are admitted in queue order, each with as large a chunk as the budget and
// the free blocks allow. A request samples in a step iff that step brings its
// computed tokens up to all the tokens it knows.
//
// When a running request cannot get a block, the lowest-priority (then most
// recently admitted) running request is preempted by recomputation: it gives
// its blocks back, forgets its progress and goes back to the front of the
// waiting queue; the worker drops it and later gets it again as a new request.
//
// Overlap scheduling: a request's sampled tokens still in flight
// (Request.numInFlightSamples) count as known, so its next decode row can be
// scheduled before the token comes back (the worker feeds it from its own
// token list). A request whose in-flight tokens already reach maxTokens or
// the length limit gets no further row; a stop token is only seen one step
// late, and the engine core drops the extra token.
//
// KV connector, consumer side (prefill/decode disaggregation, src/kv-connector):
// a request whose prompt KV was computed on another worker is admitted by
// allocating blocks for those tokens (after any local prefix-cache hit) and
// naming them in the step's kvLoads instead of giving it a row; it waits in
// `loading` (counted against maxNumSeqs, never preempted) until the worker
// reports the load (completeLoad): then it runs as if it had computed those
// tokens, or, when the load failed, goes back to the waiting queue to be
// computed here. A loading request that ends frees its blocks at once and
// its transfer id goes out in kvCancels, so the worker does not write the
// late bytes into blocks that may have a new owner.
//
// Pooling requests (Request.pooling) are prefill only. One that needs its
// whole prompt in one row (a bidirectional encoder) is admitted only when the
// step's budget takes all of it, and waits at the head of the queue otherwise.

import type { KVCacheManager } from "./block-manager.js";
import type { Request } from "./request.js";
import type { RequestId } from "./types.js";
import type { SchedulerConfig } from "./types.js";

/** One step's decisions, as plain data; step-builder turns it into the wire message. */
export interface SchedulerOutput {
  /** Requests with a row this step, in row order (parallel to the arrays below). */
  requests: Request[];
  /** Positions each row runs, its draft tokens included. */
  numNewTokens: number[];
  /** Speculative decoding: draft tokens each row verifies after its known tokens (they are the last numDrafts of numNewTokens). */
  numDrafts: number[];
  /** The drafts of the rows with any, row after row. */
  draftIds: number[];
  /** Set from the step's result: drafts each row accepted (the engine core fills it before updateAfterStep). */
  numAccepted: number[];
  /** Each row's numComputedTokens before this step: where its tokens start. */
  numComputedBefore: number[];
  /** 1 when the row samples (it reaches all its known tokens), else 0. */
  sample: number[];
  /** Requests the worker must add before the rows run: first admission, or resumed after preemption. */
  added: Request[];
  /** Requests the worker must drop first (finished, aborted or preempted since the last step). */
  removed: RequestId[];
  /** Requests preempted while building this step. */
  preempted: Request[];
  numScheduledTokens: number;
  /** Remote KV loads started this step (KV connector, consumer side). */
  kvLoads: KvLoad[];
  /** Transfer ids of loads whose request ended while loading. */
  kvCancels: number[];
}

/** One remote KV load: the local blocks `blockIds` receive the peer's `remoteBlockIds`, in order. */
export interface KvLoad {
  request: Request;
  transferId: number;
  blockIds: number[];
  remoteBlockIds: number[];
  numTokens: number;
}

export class Scheduler {
  /** Queue order: priority (lower first), then arrival; preempted requests go to the front of their priority. */
  readonly waiting: Request[] = [];
  /** Admission order; preemption takes from the back. */
  readonly running: Request[] = [];
  numPreemptions = 0;
  /** Prompt tokens looked up in the prefix cache at first admission, and how many hit. */
  numPrefixQueryTokens = 0;
  numPrefixHitTokens = 0;

  /** Requests waiting for their remote KV, by transfer id. */
  readonly loading = new Map<number, Request>();
  /** Whether the worker has a LoRA adapter (its requests wait until it does); set by the engine core. */
  loraReady: (loraId: number) => boolean = () => true;
  private nextTransferId = 0;
  private pendingCancels: number[] = [];
  private pendingRemoved: RequestId[] = [];
  /** Finished requests are dropped from waiting/running lazily, once per step. */
  private hasFinishedInQueues = false;
  /** Longest a request may grow (prompt + output): the smaller of maxModelLen and the whole cache + 1. */
  private readonly maxLen: number;

  constructor(
    readonly config: SchedulerConfig,
    readonly kv: KVCacheManager,
  ) {
    for (const key of ["maxNumSeqs", "maxNumBatchedTokens", "maxModelLen", "blockSize", "numBlocks"] as const) {
      const value = config[key];
      if (!Number.isInteger(value) || value < 1) throw new RangeError(`${key} must be a positive integer, got ${value}`);
    }
    this.maxLen = Math.min(config.maxModelLen, config.numBlocks * config.blockSize + 1);
  }

  get numWaiting(): number {
    this.compact();
    return this.waiting.length + this.loading.size;
  }

  get numRunning(): number {
    this.compact();
    return this.running.length;
  }

  get hasUnfinished(): boolean {
    return this.numWaiting + this.numRunning > 0;
  }

  /** Queues a new request behind every request of the same or better priority. */
  addRequest(request: Request): void {
    request.status = "waiting";
    let at = this.waiting.length;
    while (at > 0 && (this.waiting[at - 1] as Request).priority > request.priority) at--;
    this.waiting.splice(at, 0, request);
  }

  schedule(): SchedulerOutput {
    this.compact();
    const out: SchedulerOutput = {
      requests: [],
      numNewTokens: [],
      numDrafts: [],
      draftIds: [],
      numAccepted: [],
      numComputedBefore: [],
      sample: [],
      added: [],
      removed: this.pendingRemoved,
      preempted: [],
      numScheduledTokens: 0,
      kvLoads: [],
      kvCancels: this.pendingCancels,
    };
    this.pendingRemoved = [];
    this.pendingCancels = [];
    let budget = this.config.maxNumBatchedTokens;

    for (let i = 0; i < this.running.length && budget > 0; ) {
      const request = this.running[i] as Request;
      const known = request.numTokensWithInFlight;
      // Its in-flight token(s) end it on length: nothing more to compute.
      const done = request.numInFlightSamples > 0 && (request.numOutputTokens + request.numInFlightSamples >= request.maxTokens || known >= this.maxLen);
      const numNew = done ? 0 : Math.min(known - request.numComputedTokens, budget);
      if (numNew <= 0) {
        i++;
        continue;
      }
      const numDraft = numNew === 1 ? this.draftsFor(request, budget - 1) : 0;
      let gotBlocks = true;
      while (!this.kv.allocate(request, request.numComputedTokens + numNew + numDraft)) {
        const victimIndex = this.pickVictim();
        const victim = this.running[victimIndex] as Request;
        budget += this.unscheduleRow(out, victim);
        this.running.splice(victimIndex, 1);
        this.preempt(victim, out);
        if (victimIndex < i) i--;
        if (victim === request) {
          gotBlocks = false;
          break;
        }
      }
      if (!gotBlocks) continue; // the request left running; i already names the next one
      budget -= this.pushRow(out, request, numNew, numDraft);
      i++;
    }

    // No admissions in a step that had to preempt: blocks are short (vLLM does the same).
    if (out.preempted.length === 0) this.admitWaiting(out, budget);

    for (let i = 0; i < out.requests.length; i++) {
      const request = out.requests[i] as Request;
      // Advanced now, not after the step, so the next step can be scheduled while this one runs.
      // Drafts count once the result says which were accepted (acceptDrafts).
      request.numComputedTokens += (out.numNewTokens[i] as number) - (out.numDrafts[i] as number);
      if (out.sample[i] === 1) request.numInFlightSamples++;
      out.numScheduledTokens += out.numNewTokens[i] as number;
    }
    return out;
  }

  /** The step for `out` has executed: full blocks it computed may now serve prefix-cache hits. */
  updateAfterStep(out: SchedulerOutput): void {
    for (let i = 0; i < out.requests.length; i++) {
      const request = out.requests[i] as Request;
      // Its sampled token is back (the engine appends or drops it next).
      if (out.sample[i] === 1) request.numInFlightSamples--;
      if (request.status !== "running") continue;
      // A row's accepted drafts are committed once their tokens are appended (commitDrafts).
      this.kv.commitComputed(request, (out.numComputedBefore[i] as number) + (out.numNewTokens[i] as number) - (out.numDrafts[i] as number));
    }
  }

  /** The worker accepted `accepted` of row `row`'s drafts: their KV is valid, the rest is recomputed later. */
  acceptDrafts(out: SchedulerOutput, row: number, accepted: number): void {
    out.numAccepted[row] = accepted;
    (out.requests[row] as Request).numComputedTokens += accepted;
  }

  /** After the accepted drafts' tokens were appended: the full blocks they completed may serve prefix-cache hits. */
  commitDrafts(out: SchedulerOutput): void {
    for (let i = 0; i < out.requests.length; i++) {
      const request = out.requests[i] as Request;
      if ((out.numAccepted[i] ?? 0) > 0 && request.status === "running") this.kv.commitComputed(request, request.numComputedTokens);
    }
  }

  /**
   * Drafts a decode row verifies this step: the worker's proposals, at most
   * numSpeculativeTokens, within the step's budget, and never so many that
   * accepting all of them (plus the token after them) passes max_tokens or
   * the model's length.
   */
  private draftsFor(request: Request, budget: number): number {
    const k = this.config.numSpeculativeTokens ?? 0;
    if (k === 0 || request.draftIds.length === 0 || request.numInFlightSamples > 0) return 0;
    const room = Math.min(request.maxTokens - request.numOutputTokens, this.maxLen - request.numTokens) - 1;
    return Math.max(0, Math.min(request.draftIds.length, k, budget, room));
  }

  /** Ends a request: drops it from the queues, frees its blocks, tells the worker next step. False if already finished. */
  finishRequest(request: Request, keepBlocks = false): boolean {
    if (request.status === "finished") return false;
    if (request.status === "loading") {
      this.loading.delete(request.kvTransferId);
      this.pendingCancels.push(request.kvTransferId);
    }
    // keepBlocks: a producer's blocks stay taken until its KV is sent (EngineCore.releaseHeld).
    if (!keepBlocks) this.kv.free(request);
    if (request.onWorker) this.removeFromWorker(request, this.pendingRemoved);
    request.status = "finished";
    this.hasFinishedInQueues = true;
    return true;
  }

  /** Removals (and load cancels) of a step that was not sent go out with the next one. */
  deferRemoved(ids: readonly RequestId[], kvCancels: readonly number[] = []): void {
    this.pendingRemoved.push(...ids);
    this.pendingCancels.push(...kvCancels);
  }

  /**
   * The worker finished load `transferId`: the request runs from the loaded
   * tokens on, or (failed) goes back to the waiting queue to compute them.
   * Null when no live request waits for that load (it ended meanwhile).
   */
  completeLoad(transferId: number, ok: boolean): Request | null {
    const request = this.loading.get(transferId);
    if (request === undefined) return null;
    this.loading.delete(transferId);
    request.kvTransferId = -1;
    if (ok && request.kvTransfer?.role === "consumer") {
      const numTokens = request.kvTransfer.numTokens;
      request.kvLoad = "done";
      request.numComputedTokens = numTokens;
      this.kv.commitComputed(request, numTokens);
      request.status = "running";
      this.running.push(request);
    } else {
      request.kvLoad = "failed";
      this.requeue(request, this.pendingRemoved);
    }
    return request;
  }

  /**
   * The worker was replaced and knows no request: every running request goes
   * back to the waiting queue (in order, ahead of the rest) to be recomputed,
   * and the prefix cache is forgotten. Not counted as preemption.
   */
  resetWorkerState(): void {
    this.compact();
    for (let i = this.running.length - 1; i >= 0; i--) {
      const request = this.running[i] as Request;
      this.requeue(request, this.pendingRemoved);
    }
    this.running.length = 0;
    // Loads into the lost worker's cache are gone with it: those requests compute their KV on the next one.
    for (const request of this.loading.values()) {
      request.kvLoad = "failed";
      request.kvTransferId = -1;
      this.requeue(request, this.pendingRemoved);
    }
    this.loading.clear();
    this.pendingCancels = [];
    this.kv.resetPrefixCache();
  }

  /** The worker was replaced: it knows no wire id, so no removal is owed to it. */
  forgetRemoved(): void {
    this.pendingRemoved = [];
  }

  /** Takes a waiting request out of the queue (held back by the engine core); false if it was not waiting there. */
  withdraw(request: Request): boolean {
    const at = this.waiting.indexOf(request);
    if (at < 0) return false;
    this.waiting.splice(at, 1);
    return true;
  }

  /** Puts a request the engine held back at the front of its priority in the waiting queue. */
  requeueFront(request: Request): void {
    this.requeue(request, this.pendingRemoved);
  }

  // ------------------------------------------------------------ internals

  private admitWaiting(out: SchedulerOutput, budget: number): void {
    const blockSize = this.kv.blockSize;
    const adapters = (this.config.maxLoras ?? 0) > 0 ? this.runningAdapters() : null;
    // Index of the request considered: a request whose adapter cannot join the running ones is passed over, not waited on.
    let at = 0;
    while (at < this.waiting.length && budget > 0 && this.running.length + this.loading.size < this.config.maxNumSeqs) {
      const request = this.waiting[at] as Request;
      if (request.loraId !== 0 && !this.loraReady(request.loraId)) {
        at++;
        continue;
      }
      if (adapters !== null && request.loraId !== 0 && !adapters.has(request.loraId)) {
        if (adapters.size >= (this.config.maxLoras as number)) {
          at++;
          continue;
        }
        adapters.add(request.loraId);
      }
      // Preempted with a sampled token still in flight: wait for it (its tokens must be complete when re-added).
      if (request.numInFlightSamples > 0) break;
      if (request.kvLoad === "pending") {
        const started = this.startLoad(request, out);
        if (started === null) break;
        if (started) continue;
        // Everything the peer has is cached here: admitted as usual below.
      }
      // Prompt tokens served from the cache have no logits (prompt logprobs) and no hidden states (most pooling).
      const readsCache = this.kv.enablePrefixCaching && request.readsPrefixCache;
      const cached = readsCache ? this.kv.findCachedPrefix(request) : [];
      const numCachedTokens = cached.length * blockSize;
      const numNew = Math.min(request.numTokens - numCachedTokens, budget);
      if (numNew < request.numTokens - numCachedTokens && request.pooling?.wholePrompt === true) break;
      if (!this.kv.allocate(request, numCachedTokens + numNew, cached)) break;
      this.waiting.splice(at, 1);
      if (request.numCachedTokens < 0) {
        // First admission only: a resumed request's hits are its own earlier blocks.
        request.numCachedTokens = numCachedTokens;
        request.firstScheduledMs = performance.now();
        // Counted in tokens, and only for lookups that happened (vLLM).
        if (readsCache) {
          this.numPrefixQueryTokens += request.numPromptTokens;
          this.numPrefixHitTokens += numCachedTokens;
        }
      }
      request.numComputedTokens = numCachedTokens;
      request.status = "running";
      this.running.push(request);
      budget -= this.pushRow(out, request, numNew);
    }
  }

  /** The LoRA adapters of the running and loading requests (what this step's rows may use already). */
  private runningAdapters(): Set<number> {
    const ids = new Set<number>();
    for (const r of this.running) if (r.loraId !== 0) ids.add(r.loraId);
    for (const r of this.loading.values()) if (r.loraId !== 0) ids.add(r.loraId);
    return ids;
  }

  /**
   * Allocates a consumer request's blocks for its remote tokens and starts
   * loading those not served by the local prefix cache. True: loading; false:
   * nothing left to load (it is admitted normally); null: no blocks now.
   */
  private startLoad(request: Request, out: SchedulerOutput): boolean | null {
    const params = request.kvTransfer;
    if (params?.role !== "consumer") return false;
    const blockSize = this.kv.blockSize;
    const numBlocks = Math.ceil(params.numTokens / blockSize);
    // Full blocks only (findCachedPrefix), never past what the peer computed.
    const cached = this.kv.findCachedPrefix(request).slice(0, Math.floor(params.numTokens / blockSize));
    if (cached.length >= numBlocks || params.remoteBlockIds.length < numBlocks) {
      request.kvLoad = cached.length >= numBlocks ? "done" : "failed";
      return false;
    }
    if (!this.kv.allocate(request, params.numTokens, cached)) return null;
    this.waiting.splice(this.waiting.indexOf(request), 1);
    if (request.numCachedTokens < 0) {
      request.numCachedTokens = cached.length * blockSize;
      request.firstScheduledMs = performance.now();
      this.numPrefixQueryTokens += request.numPromptTokens;
      this.numPrefixHitTokens += cached.length * blockSize;
    }
    const transferId = this.nextTransferId++;
    request.kvLoad = "loading";
    request.kvTransferId = transferId;
    request.numComputedTokens = 0;
    request.status = "loading";
    this.loading.set(transferId, request);
    out.kvLoads.push({
      request,
      transferId,
      blockIds: request.blockIds.slice(cached.length, numBlocks),
      remoteBlockIds: params.remoteBlockIds.slice(cached.length, numBlocks),
      numTokens: params.numTokens,
    });
    return true;
  }

  /** A row of numNew known tokens and numDraft drafts after them; returns the positions it takes from the budget. */
  private pushRow(out: SchedulerOutput, request: Request, numNew: number, numDraft = 0): number {
    if (!request.onWorker) {
      request.onWorker = true;
      out.added.push(request);
    }
    out.requests.push(request);
    out.numNewTokens.push(numNew + numDraft);
    out.numDrafts.push(numDraft);
    out.numAccepted.push(0);
    for (let d = 0; d < numDraft; d++) out.draftIds.push(request.draftIds[d] as number);
    // Proposals are for one step: the result brings the next ones.
    request.draftIds = NO_DRAFTS;
    out.numComputedBefore.push(request.numComputedTokens);
    out.sample.push(request.numComputedTokens + numNew >= request.numTokensWithInFlight ? 1 : 0);
    return numNew + numDraft;
  }

  /** Takes a request's row out of this step (it is being preempted); returns the tokens it had. */
  private unscheduleRow(out: SchedulerOutput, request: Request): number {
    const row = out.requests.indexOf(request);
    if (row < 0) return 0;
    const numNew = out.numNewTokens[row] as number;
    const numDraft = out.numDrafts[row] as number;
    if (numDraft > 0) {
      let at = 0;
      for (let r = 0; r < row; r++) at += out.numDrafts[r] as number;
      out.draftIds.splice(at, numDraft);
    }
    out.requests.splice(row, 1);
    out.numNewTokens.splice(row, 1);
    out.numDrafts.splice(row, 1);
    out.numAccepted.splice(row, 1);
    out.numComputedBefore.splice(row, 1);
    out.sample.splice(row, 1);
    const added = out.added.indexOf(request);
    if (added >= 0) out.added.splice(added, 1);
    return numNew;
  }

  /** Index in running of the request to preempt: highest priority value, then most recently admitted. */
  private pickVictim(): number {
    let victim = this.running.length - 1;
    for (let i = victim - 1; i >= 0; i--) {
      if ((this.running[i] as Request).priority > (this.running[victim] as Request).priority) victim = i;
    }
    return victim;
  }

  private preempt(request: Request, out: SchedulerOutput): void {
    this.requeue(request, out.removed);
    request.numPreemptions++;
    this.numPreemptions++;
    out.preempted.push(request);
  }

  /** Frees the request's blocks and progress and puts it at the front of its priority in waiting. */
  private requeue(request: Request, removed: RequestId[]): void {
    this.kv.free(request);
    request.draftIds = NO_DRAFTS;
    if (request.onWorker) this.removeFromWorker(request, removed);
    request.numComputedTokens = 0;
    request.status = "waiting";
    let at = 0;
    while (at < this.waiting.length && (this.waiting[at] as Request).priority < request.priority) at++;
    this.waiting.splice(at, 0, request);
  }

  /**
   * The worker drops removed requests before adding requests, so a preempted
   * request may come back in the very step that removes it.
   */
  private removeFromWorker(request: Request, removed: RequestId[]): void {
    removed.push(request.id);
    request.onWorker = false;
  }

  private compact(): void {
    if (!this.hasFinishedInQueues) return;
    this.hasFinishedInQueues = false;
    compactInPlace(this.waiting);
    compactInPlace(this.running);
  }
}

function compactInPlace(requests: Request[]): void {
  let kept = 0;
  for (const request of requests) if (request.status !== "finished") requests[kept++] = request;
  requests.length = kept;
}

const NO_DRAFTS: readonly number[] = [];
