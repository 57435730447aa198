// The engine core's step loop: while there is work, schedule -> build the
// wire step -> await the worker -> apply its sampled tokens (stop checks,
// freeing finished requests' blocks, one output per request per step that
// produced a token or finished, the step's outputs as one batch to the
// core's owner: outputs.ts). Idle, with no timer or busy loop, when
// no request is live; submit() wakes it.
//
// Behaviours worth knowing:
// - submit() throws RequestRejectedError (synchronously, no output) for a
//   request that can never run: duplicate live id, empty prompt, a token
//   outside the vocabulary, maxTokens < 1, a prompt longer than maxModelLen
//   or than the whole KV cache.
// - A request can grow up to min(maxModelLen, numBlocks * blockSize + 1)
//   tokens, then finishes with "length": a request alone in the cache can
//   always finish, so preemption cannot livelock.
// - abort() while a step is in flight applies after that step's result is
//   processed (its sampled token is dropped); the request gets one final
//   output with finishReason "abort". Unknown or finished ids are ignored.
// - If executeStep rejects or answers out of sync, every live request ends
//   with finishReason "error" and the error message, all blocks are freed and
//   the prefix cache is forgotten. The engine stays usable: new requests go
//   to the same executor (and fail the same way while it is dead) until
//   replaceExecutor() hands it a new worker.
// - Request migration (maxRequestMigrations set): when the rejection says the
//   worker is gone (ExecutorLostError), or its owner calls executorLost(),
//   live requests are not failed. The engine holds every request's tokens, so
//   it frees their blocks, sends no step until replaceExecutor() brings the
//   restarted worker, and then recomputes them as after a preemption: their
//   outputs simply continue. Who is charged, who ends and how suspects come
//   back is recovery.ts's.
// - close() stops admissions, ends live requests with "abort" (after the step
//   in flight) and resolves when the loop is idle. It does not stop the worker.
//
// Overlap ("async") scheduling, on by default (asyncScheduling: false turns
// it off): up to two steps are outstanding at the worker. The loop sends step
// N, builds and sends N+1 at once, then awaits N; after processing N's result
// it sends N+2 and awaits N+1, and so on, so the worker never waits for the
// control plane. At most one step is in flight while the scheduler runs.
// - The scheduler advances numComputedTokens at schedule time and counts a
//   sampled row's token as known (Request.numInFlightSamples) before it comes
//   back; the worker appends it to its own token list at step N and reads it
//   as N+1's input (steps execute strictly in order).
// - Stop checks lag one step: a request that stops at N may have a row in
//   N+1; that token is dropped and never emitted, and the request ends once.
//   Length limits are seen at schedule time (no row past maxTokens).
// - Blocks are freed (finish, abort, preemption) when the engine processes a
//   result, possibly while the next step still holds a row of the request.
//   That is safe because a freed block can only be handed out in a step sent
//   later, which the worker runs after the in-flight one; prefix-cache
//   commits happen only for steps whose result came back, and never cover
//   the position an in-flight row writes.
// - A preempted request whose sampled token is still in flight keeps it (the
//   token is valid) and is not re-admitted before it arrives.
// Outputs are the same with and without overlap; only the timing differs.
//
// Prompt logprobs (EngineRequest.promptLogprobs >= 0): such a request skips
// prefix-cache hits (cached positions have no logits), so the worker scores
// every prompt position as its chunks run; logprobs.ts gathers the entries.
//
// Pooling models (the worker's Ready.pooling): every request is prefill only
// (EngineRequest.pooling, required there and refused elsewhere); the step
// whose row ends its prompt answers with its pooled vector
// (StepResult.pooled), and the request ends with one output carrying it. The
// scheduler does not chunk an encoder's prompt (pooling.ts), and the
// encoder's engine has no prefix cache (its worker keeps no KV: its blocks
// are bookkeeping only).
//
// Structured output (a request with a grammar, given a StepMasks): a step's
// grammar-constrained rows are marked in the Step, and their masks go to the
// worker in a StepMask once every earlier step's result is processed (right
// after the previous step's tokens are applied, so the mask is made while
// the worker runs the step's forward pass). engine/step-masks.ts explains
// why; a request whose mask cannot be made ends with "error" after the step.
//
// KV connector (prefill/decode disaggregation, src/kv-connector): on the
// prefill side a producer request that ends on length keeps its blocks
// (held) until the owner calls releaseHeld() once its KV has been sent; on
// the decode side the scheduler starts remote loads (SchedulerOutput.kvLoads,
// told to options.connector once their step is sent), a step with no rows is
// still sent while loads are outstanding (the worker answers it when one
// finishes or after a short wait), and the loads the worker reports finished
// make their requests run, or compute their prompt here when the load failed.

import { setImmediate as yieldToEventLoop } from "node:timers/promises";
import type { StepMessage, StepResultMessage } from "../transport/messages.js";
import { BlockManager } from "./block-manager.js";
import { Request } from "./request.js";
import { Scheduler, type KvLoad, type SchedulerOutput } from "./scheduler.js";
import { collectPromptLogprobs, tokenLogprob } from "./logprobs.js";
import { WorkerLossRecovery } from "./recovery.js";
import { buildStepMessage } from "./step-builder.js";
import { LoraAdapters, LoraLoadError, type LoraAdapterRef } from "./lora.js";
import { draftCount, DraftReader, Speculation, type SpecDecodeStats } from "./speculation.js";
import { StepTimingRing } from "./step-timings.js";
import { checkStop, type StopResult } from "./stop-checker.js";
import type { MaskPlan, StepMasks } from "./step-masks.js";
import { EngineOutputs, type OutputSink } from "./outputs.js";
import { type EngineRequest, type FinishReason, type RequestId, type RequestOutput, type RequestTiming, type SchedulerConfig, type TokenLogprob } from "./types.js";
import { ExecutorLostError, type StepExecutor } from "../worker/types.js";

export interface EngineConfig extends SchedulerConfig {
  /** Overlap scheduling: build and send step N+1 while the worker runs N (default on). */
  asyncScheduling?: boolean;
  /** Block-granular prefix caching (default on). */
  enablePrefixCaching?: boolean;
  /** Steps kept in the timing ring buffer (default 1024). */
  timingCapacity?: number;
  /**
   * How often one request may be carried over to a restarted worker
   * (--max-request-migrations; 0: requests on a lost worker end, the others
   * wait for the next one). Absent: the engine does not expect a restart, and
   * a lost worker fails every live request.
   */
  maxRequestMigrations?: number;
}

export interface EngineStats {
  numRunning: number;
  numWaiting: number;
  /** Blocks an allocation can take: free plus evictable cached ones. */
  numFreeBlocks: number;
  /** Unreferenced blocks whose KV is kept for prefix hits (part of numFreeBlocks). */
  numCachedBlocks: number;
  numUsedBlocks: number;
  numBlocks: number;
  numPreemptions: number;
  numSteps: number;
  /** Prompt tokens looked up in the prefix cache, and how many were served from it. */
  numPrefixQueryTokens: number;
  numPrefixHitTokens: number;
  /** Output batches whose sink threw (the engine goes on). */
  numSinkErrors: number;
  /** Bytes of KV received from other workers (KV connector). */
  numKvTransferBytes?: number;
  /** Speculative decoding's counters (absent: it is off). */
  specDecode?: SpecDecodeStats;
  /** Prefill/decode disaggregation: the prefill side's KV blocks (the rest of these stats are the decode side's). */
  prefillKv?: { numFreeBlocks: number; numBlocks: number; numHeldBlocks: number };
}

/** The stats of an engine with nothing in it (and the zero to sum replicas' stats from). */
export const EMPTY_STATS: Readonly<EngineStats> = {
  numRunning: 0,
  numWaiting: 0,
  numFreeBlocks: 0,
  numCachedBlocks: 0,
  numUsedBlocks: 0,
  numBlocks: 0,
  numPreemptions: 0,
  numSteps: 0,
  numPrefixQueryTokens: 0,
  numPrefixHitTokens: 0,
  numSinkErrors: 0,
};

/** The engine core's owner hears about its remote KV loads (KV connector, consumer side). */
export interface KvLoadListener {
  /** These loads went out in a step to the worker: the peer must send their blocks. */
  loadsStarted(loads: readonly KvLoad[]): void;
  /** The worker finished a load (ok: its KV is in the cache); `error` says why it failed. */
  loadFinished(transferId: number, ok: boolean, error: string | null): void;
}

export interface EngineCoreOptions {
  /**
   * Where the outputs go: one batch per step, synchronously as the step's
   * result is processed (and one for endings outside a step: an abort, a
   * lost worker). The graph engine hands a batch to the conductor as one
   * call, the engine thread posts it to the main thread as one message.
   */
  onOutputs: OutputSink;
  /** Grammar masks for structured output (engine/step-masks.ts); absent or null: requests with a grammar are refused. */
  masks?: StepMasks | null;
  /** KV connector, consumer side: who sends the blocks this engine's requests load. */
  kvLoads?: KvLoadListener;
}

/** A step sent to the worker whose result has not been processed yet. */
interface InFlightStep {
  out: SchedulerOutput;
  message: StepMessage;
  /** Its grammar-constrained rows, whose masks follow once the steps before it are processed. */
  masks: MaskPlan | null;
  result: Promise<StepResultMessage>;
  scheduleMs: number;
  buildMs: number;
  sentAt: number;
}

const PENDING: Promise<StepResultMessage> = new Promise(() => {});

/** submit() refused a request; the message says why. */
export class RequestRejectedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RequestRejectedError";
  }
}

export class EngineCore {
  readonly timings: StepTimingRing;
  private readonly config: EngineConfig;
  private readonly blockManager: BlockManager;
  private readonly scheduler: Scheduler;
  /** Longest a request may grow (prompt + output). */
  private readonly maxLen: number;
  private readonly requests = new Map<RequestId, Request>();
  private executor: StepExecutor;
  /** What a submitted request is checked against (the vocabulary is the executor's). */
  private limits: SubmitLimits;
  private nextExecutor: StepExecutor | null = null;
  private nextStepId = 0;
  private numSteps = 0;
  private numSinkErrors = 0;
  private looping = false;
  private loopDone: Promise<void> = Promise.resolve();
  /** Steps sent and not yet processed, oldest first. */
  private readonly inFlight: InFlightStep[] = [];
  /** Most steps outstanding at once: 2 with overlap scheduling, else 1. */
  private readonly maxInFlight: number;
  private pendingAborts: RequestId[] = [];
  /** Requests to end with "error" once the step in flight is processed (their grammar mask failed). */
  private pendingFailures = new Map<RequestId, string>();
  private closed = false;
  private readonly onOutputs: OutputSink;
  /** This step's outputs so far; handed to onOutputs by flushOutputs(). */
  private outputs = new EngineOutputs();
  private flushScheduled = false;
  /** Grammar masks for structured output; null: requests with a grammar are refused. */
  private readonly masks: StepMasks | null;
  /** Set while the executor's worker is gone: no step is sent until replaceExecutor(). */
  private lostReason: string | null = null;
  /** The worker is gone for good (executorGone): new requests are refused. */
  private goneReason: string | null = null;
  /** Worker deaths: who is carried over, who is charged, suspects re-admitted one at a time. */
  private readonly recovery: WorkerLossRecovery;
  /** Producer requests that ended on length and keep their blocks until releaseHeld(). */
  private readonly held = new Map<RequestId, Request>();
  private readonly kvLoads: KvLoadListener | null;
  private numKvTransferBytes = 0;
  /** LoRA adapters on the worker (--max-loras > 0). */
  private readonly adapters = new LoraAdapters();
  /** Speculative decoding (null: off). */
  private readonly speculation: Speculation | null;

  constructor(executor: StepExecutor, config: EngineConfig, options: EngineCoreOptions) {
    this.masks = options.masks ?? null;
    this.kvLoads = options.kvLoads ?? null;
    this.config = config;
    this.onOutputs = options.onOutputs;
    this.executor = executor;
    // An encoder keeps no KV, so nothing could be served from a cache.
    const caches = (config.enablePrefixCaching ?? true) && executor.ready.pooling?.causal !== false;
    this.blockManager = new BlockManager(config.numBlocks, config.blockSize, caches);
    this.scheduler = new Scheduler(config, this.blockManager);
    this.scheduler.loraReady = (id) => this.adapters.ready(id);
    this.timings = new StepTimingRing(config.timingCapacity ?? 1024);
    this.maxLen = Math.min(config.maxModelLen, config.numBlocks * config.blockSize + 1);
    this.speculation = (config.numSpeculativeTokens ?? 0) > 0 ? new Speculation() : null;
    // A step's drafts come from the previous step's result: speculation runs one step at a time.
    this.maxInFlight = config.asyncScheduling === false || this.speculation !== null ? 1 : 2;
    this.checkExecutor(executor);
    this.limits = { ...config, vocabSize: executor.ready.vocab_size };
    this.recovery = new WorkerLossRecovery(config.maxRequestMigrations ?? 0);
  }

  /** Whether requests with a grammar (structured output) can run here. */
  get takesGrammars(): boolean {
    return this.masks !== null;
  }

  get stats(): EngineStats {
    const blocks = this.blockManager.counts();
    return {
      numRunning: this.scheduler.numRunning,
      numWaiting: this.scheduler.numWaiting + this.recovery.numHeldBack,
      numFreeBlocks: blocks.free + blocks.cached,
      numCachedBlocks: blocks.cached,
      numUsedBlocks: blocks.inUse,
      numBlocks: this.blockManager.numBlocks,
      numPreemptions: this.scheduler.numPreemptions,
      numSteps: this.numSteps,
      numPrefixQueryTokens: this.scheduler.numPrefixQueryTokens,
      numPrefixHitTokens: this.scheduler.numPrefixHitTokens,
      numSinkErrors: this.numSinkErrors,
      numKvTransferBytes: this.numKvTransferBytes,
      ...(this.speculation === null ? {} : { specDecode: { ...this.speculation.stats, acceptedPerPosition: [...this.speculation.stats.acceptedPerPosition] } }),
    };
  }

  /** Queues a request (its outputs come through onOutputs); throws RequestRejectedError if it can never run. */
  submit(req: EngineRequest): void {
    this.validate(req);
    const request = new Request(req);
    this.requests.set(request.id, request);
    this.adapters.requestStarted(request.loraId);
    this.scheduler.addRequest(request);
    this.wake();
  }

  abort(requestId: RequestId): void {
    if (!this.requests.has(requestId)) return;
    if (this.inFlight.length > 0) this.pendingAborts.push(requestId);
    else {
      this.finishAborted(requestId, null);
      this.flushOutputs();
      // It may have been the suspect on probation: the next one goes.
      this.recovery.releaseNext(this.scheduler);
      this.wake();
    }
  }

  /**
   * The worker behind the executor died; its owner restarts it and calls
   * replaceExecutor(). No step is sent meanwhile; steps in flight are given
   * up, and live requests are carried over or ended (see the top of the file).
   */
  executorLost(reason: string): void {
    if (this.lostReason !== null) return;
    this.lostReason = firstLine(reason);
    // With steps in flight the loop recovers once their rejections are in.
    if (this.inFlight.length === 0) this.recoverFromLoss();
  }

  /** The worker will not come back: every live request ends ("abort", `reason`), new ones are refused. */
  executorGone(reason: string): void {
    this.goneReason = firstLine(reason);
    this.lostReason ??= this.goneReason;
    this.pendingAborts = [];
    this.recovery.clear();
    this.adapters.failAll(this.goneReason);
    const live = [...this.requests.values()];
    for (const request of live) this.finish(request);
    this.blockManager.resetPrefixCache();
    for (const request of live) this.emit(endOutput(request, "abort", this.goneReason));
    this.flushOutputs();
  }

  /**
   * Hands the engine a new worker (e.g. after a restart). Live requests are
   * recomputed from scratch on it; takes effect at the next step boundary.
   */
  replaceExecutor(executor: StepExecutor): void {
    if (this.goneReason !== null) throw new Error(`the engine's worker is gone: ${this.goneReason}`);
    this.checkExecutor(executor);
    this.nextExecutor = executor;
    if (this.inFlight.length === 0) this.swapExecutor();
    this.wake();
  }

  /** Ends live requests ("abort"), refuses new ones, resolves once no step is running. */
  async close(): Promise<void> {
    this.closed = true;
    this.adapters.failAll("the engine is shutting down");
    for (const id of [...this.requests.keys()]) {
      if (this.inFlight.length > 0) this.pendingAborts.push(id);
      else this.finishAborted(id, "the engine is shutting down");
    }
    this.flushOutputs();
    await this.loopDone;
  }

  /**
   * Loads a LoRA adapter on the worker (with the next step, ahead of its rows);
   * resolves once the worker has it, rejects with LoraLoadError naming the problem.
   */
  loadLora(ref: LoraAdapterRef): Promise<void> {
    if ((this.config.maxLoras ?? 0) === 0) return Promise.reject(new LoraLoadError(`adapter ${ref.name}: LoRA is off (--enable-lora)`));
    if (this.closed || this.goneReason !== null) return Promise.reject(new LoraLoadError(`adapter ${ref.name}: ${this.goneReason ?? "the engine is shutting down"}`));
    const loaded = this.adapters.load(ref);
    this.wake();
    return loaded;
  }

  /** New requests may no longer use the adapter; the worker drops it once the requests using it end. */
  unloadLora(id: number): void {
    this.adapters.unload(id);
    this.wake();
  }

  /** Blocks of a held producer request (KV connector): what the peer loads. Null when none is held under `requestId`. */
  heldBlocks(requestId: RequestId): readonly number[] | null {
    return this.held.get(requestId)?.blockIds ?? null;
  }

  /** The held request's KV has been sent (or will never be): its blocks are freed (prefix-cached ones stay cached). */
  releaseHeld(requestId: RequestId): void {
    const request = this.held.get(requestId);
    if (request === undefined) return;
    this.held.delete(requestId);
    this.blockManager.free(request);
    this.wake();
  }

  /** Blocks held for producer requests whose KV has not been sent yet. */
  get numHeldBlocks(): number {
    let n = 0;
    for (const request of this.held.values()) n += request.blockIds.length;
    return n;
  }

  /** The KV block bookkeeping check (tests, debugging); throws when broken. */
  checkIntegrity(): void {
    this.blockManager.checkIntegrity();
  }

  // ------------------------------------------------------------ step loop

  /** Whether a step must go out: requests to run, or adapters to load or unload. */
  private get hasWork(): boolean {
    return this.scheduler.hasUnfinished || this.adapters.hasWork;
  }

  private wake(): void {
    if (this.looping || this.lostReason !== null || !this.hasWork) return;
    this.looping = true;
    this.loopDone = this.runLoop();
  }

  private async runLoop(): Promise<void> {
    try {
      for (;;) {
        if (this.nextExecutor !== null && this.inFlight.length === 0) this.swapExecutor();
        this.recovery.releaseNext(this.scheduler);
        // Keep the worker fed: with overlap, step N+1 goes out before N's result is awaited.
        // (A new executor waits until nothing is in flight on the old one; a lost one gets nothing.)
        while (this.inFlight.length < this.maxInFlight && this.nextExecutor === null && this.lostReason === null && this.hasWork) {
          if (!this.launch()) break;
        }
        const head = this.inFlight[0];
        if (head === undefined) {
          // Decided synchronously with the exit, so a submit can never fall between them.
          // While the worker is lost, replaceExecutor() wakes the loop again.
          if (!this.hasWork || this.lostReason !== null) break;
          continue;
        }
        await this.complete(head);
        // Let I/O (new requests, aborts) in between steps even when the executor answers at once.
        await yieldToEventLoop();
      }
    } catch (error) {
      // A bug in the engine itself: end every request rather than leave clients hanging.
      this.failAll(error);
      await this.drainInFlight();
    } finally {
      this.looping = false;
    }
  }

  /** Schedules, builds and sends one step; false when nothing could be scheduled. */
  private launch(): boolean {
    const t0 = performance.now();
    const out = this.scheduler.schedule();
    const t1 = performance.now();
    // Remote loads outstanding and nothing in flight: a step with no rows asks the worker how they stand.
    const pollLoads = this.scheduler.loading.size > 0 && this.inFlight.length === 0;
    if (out.requests.length === 0 && out.kvLoads.length === 0 && !pollLoads && !this.adapters.hasWork) {
      // With a step in flight this is normal (every running request waits for a token that ends it).
      if (this.inFlight.length > 0) this.scheduler.deferRemoved(out.removed, out.kvCancels);
      else this.failUnschedulable(out);
      return false;
    }
    const stepId = this.nextStepId++;
    const message = buildStepMessage(out, stepId, this.adapters.takeWork(stepId));
    const masks = this.masks?.plan(out.requests, message) ?? null;
    const t2 = performance.now();
    // In flight from here on: an abort coming in while the executor takes the step waits for its result.
    const step: InFlightStep = { out, message, masks, result: PENDING, scheduleMs: t1 - t0, buildMs: t2 - t1, sentAt: t2 };
    this.inFlight.push(step);
    try {
      step.result = this.executor.executeStep(message);
    } catch (error) {
      step.result = Promise.reject(error);
    }
    // Nothing before it in flight: every token its masks depend on is known.
    if (masks !== null && this.inFlight.length === 1) this.runMasks(masks);
    // Awaited in order later; a rejection must not count as unhandled meanwhile.
    step.result.catch(() => {});
    if (out.kvLoads.length > 0) this.kvLoads?.loadsStarted(out.kvLoads);
    return true;
  }

  /** Awaits the oldest step in flight and applies its result. */
  private async complete(step: InFlightStep): Promise<void> {
    let result: StepResultMessage;
    try {
      result = await step.result;
      checkResult(step.message, result, this.executor.ready.pooling?.dimensions ?? null);
    } catch (error) {
      this.inFlight.shift();
      this.adapters.stepLost(step.message, firstLine((error as Error).message ?? String(error)));
      if (this.migrates && (error instanceof ExecutorLostError || this.lostReason !== null)) {
        this.lostReason ??= firstLine((error as Error).message);
        await this.drainLost(step);
        return;
      }
      // Should the worker still be alive, it never applied this step's removals: resend them.
      this.scheduler.deferRemoved(step.out.removed, step.out.kvCancels);
      this.failAll(error);
      await this.drainInFlight();
      return;
    }
    this.inFlight.shift();
    this.recovery.stepAnswered(step.out.added);
    const failedAdapters = this.adapters.stepAnswered(step.message, result);
    const t3 = performance.now();
    if (step.message.spec !== null) this.speculation?.acceptDrafts(this.scheduler, step.out, step.message, result);
    this.scheduler.updateAfterStep(step.out);
    if (result.kv_loaded.length > 0 || result.kv_load_failed.length > 0) this.applyLoadResults(result);
    this.applyPendingAborts();
    this.processResult(step.out, step.message, result);
    if (step.message.spec !== null) this.scheduler.commitDrafts(step.out);
    // A reload on a restarted worker failed: the requests waiting for that adapter cannot run.
    if (failedAdapters.size > 0) {
      for (const request of [...this.requests.values()]) {
        const why = failedAdapters.get(request.loraId);
        if (why !== undefined) this.finishFailed(request.id, why);
      }
    }
    // The next step's constrained rows can have their masks now (the worker is running its forward pass).
    const next = this.inFlight[0];
    if (next?.masks && !next.masks.started) this.runMasks(next.masks);
    this.flushOutputs();
    const t4 = performance.now();
    this.numSteps++;
    this.timings.record({
      stepId: step.message.step_id,
      numRows: step.out.requests.length,
      numTokens: step.out.numScheduledTokens,
      scheduleMs: step.scheduleMs,
      buildMs: step.buildMs,
      roundTripMs: t3 - step.sentAt,
      processMs: t4 - t3,
      workerPrepareMs: result.timings.prepare_ms,
      workerForwardMs: result.timings.forward_ms,
      workerSampleMs: result.timings.sample_ms,
    });
  }

  /** Whether worker loss is recovered from (maxRequestMigrations set, even to 0) rather than failing everything. */
  private get migrates(): boolean {
    return this.config.maxRequestMigrations !== undefined;
  }

  /** The worker is gone: waits out the steps still in flight (their results are lost), then recovers. */
  private async drainLost(first: InFlightStep): Promise<void> {
    this.recovery.noteLostStep(first.out.added);
    while (this.inFlight.length > 0) {
      const step = this.inFlight.shift() as InFlightStep;
      await step.result.catch(() => undefined);
      this.adapters.stepLost(step.message, "the model worker died");
      this.recovery.noteLostStep(step.out.added);
    }
    this.recoverFromLoss();
  }

  /**
   * After a worker death, with nothing in flight: charges the migration (recovery.ts), ends
   * what may not be carried over, puts every other request back in the
   * waiting queue to be recomputed on the next worker, holds suspects back.
   */
  private recoverFromLoss(): void {
    const reason = this.lostReason ?? "the model worker died";
    // Client aborts that came in meanwhile end first: they are neither carried nor charged.
    this.applyPendingAborts();
    const live = [...this.requests.values()];
    const notCarried = this.recovery.charge(live);
    // The worker's state is gone: every request is recomputed from its tokens.
    for (const request of live) request.numInFlightSamples = 0;
    this.scheduler.resetWorkerState();
    this.scheduler.forgetRemoved();
    for (const request of notCarried) {
      this.finish(request);
      this.emit(endOutput(request, "abort", this.recovery.notCarriedOver(reason, request)));
    }
    this.recovery.holdBackSuspects(live, this.scheduler);
    this.recovery.releaseNext(this.scheduler);
    this.flushOutputs();
  }

  /** After a failure: the other steps in flight went to a failed worker; wait them out, ignore their results. */
  private async drainInFlight(): Promise<void> {
    while (this.inFlight.length > 0) {
      const step = this.inFlight.shift() as InFlightStep;
      // A worker still alive must not wait for masks that would never come.
      if (step.masks !== null) this.masks?.abandon(step.masks, this.executor);
      await step.result.catch(() => undefined);
      this.adapters.stepLost(step.message, "the step failed");
      this.scheduler.deferRemoved(step.out.removed, step.out.kvCancels);
    }
    // Aborts that came in meanwhile name requests failAll already ended (or new ones).
    this.applyPendingAborts();
  }

  /** Appends each sampled token, checks stops, frees finished requests, emits outputs. */
  private processResult(out: SchedulerOutput, message: StepMessage, result: StepResultMessage): void {
    if (result.pooled !== null) {
      this.processPooled(out, message, result.pooled);
      return;
    }
    if (result.prompt_counts !== null) collectPromptLogprobs(out, message, result, this.limits.vocabSize);
    const now = performance.now();
    const outputs = this.outputs;
    const counts = result.token_counts;
    const drafts = result.draft_counts === null ? null : new DraftReader(result.draft_counts, result.draft_ids);
    // A frame model: each sampled row's whole frame beside its token (no drafts then).
    const frames = result.frames;
    const frameWidth = frames === null ? 0 : frames.length / Math.max(result.token_ids.length, 1);
    let k = 0;
    let t = 0;
    let topAt = 0;
    for (let i = 0; i < out.requests.length; i++) {
      if (message.sample[i] === 0) continue;
      const request = out.requests[i] as Request;
      // Speculative decoding: a row may append several tokens (its accepted drafts, then one more).
      const count = counts === null ? 1 : (counts[k] as number);
      const first = t;
      const firstTopAt = topAt;
      t += count;
      // Logprobs and their alternatives come token by token (a row with drafts has several).
      if (result.top_counts !== null) for (let j = first; j < t - 1; j++) topAt += result.top_counts[j] as number;
      const token = result.token_ids[t - 1] as number;
      const logprob = request.numLogprobs >= 0 ? tokenLogprob(result, t - 1, token, topAt) : null;
      if (result.top_counts !== null) topAt += result.top_counts[t - 1] as number;
      const proposals = drafts?.next() ?? null;
      k++;
      // Aborted while the step ran, or stopped one step earlier (overlap): the token is dropped.
      // A request preempted after this step was sent keeps its token (the worker computed it validly).
      if (request.status === "finished") continue;
      if (count > 1 && this.appendDrafted(request, result, first, t - 1, firstTopAt, now)) continue;
      if (proposals !== null && request.status === "running") request.draftIds = proposals;
      request.appendOutputToken(token);
      if (request.firstTokenMs < 0) request.firstTokenMs = now;
      request.lastTokenMs = now;
      const stop = checkStop(request, this.maxLen);
      const frame = frames === null ? null : frames.subarray((k - 1) * frameWidth, k * frameWidth);
      if (stop === null && logprob === null && frame === null && !request.needsPromptLogprobs) {
        outputs.addToken(request.id, token, Math.max(request.numCachedTokens, 0));
        continue;
      }
      // A producer ending on length keeps its blocks for the KV transfer (released by the owner).
      if (stop !== null) this.finish(request, stop.reason === "length" && request.kvTransfer?.role === "producer");
      const output = outputOf(request, token, logprob, stop);
      if (frame !== null) output.frames = frame.slice();
      if (request.promptLogprobs >= 0 && !request.promptLogprobsSent) {
        request.promptLogprobsSent = true;
        output.promptLogprobs = request.promptLogprobEntries;
      }
      this.emit(output);
    }
  }

  /**
   * A row's accepted drafts, token_ids[from, to), appended one by one as if
   * sampled one per step (with their logprobs when asked; the first one's top
   * alternatives start at topAt): one that stops the request ends it (the
   * rest are dropped). True when it stopped.
   */
  private appendDrafted(request: Request, result: StepResultMessage, from: number, to: number, topAt: number, now: number): boolean {
    for (let j = from; j < to; j++) {
      const token = result.token_ids[j] as number;
      const logprob = request.numLogprobs >= 0 ? tokenLogprob(result, j, token, topAt) : null;
      if (result.top_counts !== null) topAt += result.top_counts[j] as number;
      request.appendOutputToken(token);
      if (request.firstTokenMs < 0) request.firstTokenMs = now;
      request.lastTokenMs = now;
      const stop = checkStop(request, this.maxLen);
      if (stop === null && logprob === null) {
        this.outputs.addToken(request.id, token, Math.max(request.numCachedTokens, 0));
        continue;
      }
      if (stop !== null) this.finish(request, stop.reason === "length" && request.kvTransfer?.role === "producer");
      this.emit(outputOf(request, token, logprob, stop));
      if (stop !== null) return true;
    }
    return false;
  }

  /** Each row that ended its prompt ends its request with the prompt's pooled vector. */
  private processPooled(out: SchedulerOutput, message: StepMessage, pooled: Float32Array): void {
    const dims = this.executor.ready.pooling?.dimensions ?? 0;
    const now = performance.now();
    let k = 0;
    for (let i = 0; i < out.requests.length; i++) {
      if (message.sample[i] === 0) continue;
      const request = out.requests[i] as Request;
      const vector = pooled.slice(k * dims, (k + 1) * dims);
      k++;
      // Aborted while the step ran: the vector is dropped.
      if (request.status === "finished") continue;
      request.firstTokenMs = now;
      request.lastTokenMs = now;
      this.finish(request);
      const output = endingOutput(request.id, "stop", null, Math.max(request.numCachedTokens, 0));
      output.pooled = vector;
      this.emit(addTiming(output, request));
    }
  }

  /** Loads the worker finished: their requests run (or recompute), and the listener frees the sender's blocks. */
  private applyLoadResults(result: StepResultMessage): void {
    this.numKvTransferBytes += result.kv_bytes;
    for (const id of result.kv_loaded) {
      this.scheduler.completeLoad(id, true);
      this.kvLoads?.loadFinished(id, true, null);
    }
    result.kv_load_failed.forEach((id, i) => {
      this.scheduler.completeLoad(id, false);
      this.kvLoads?.loadFinished(id, false, result.kv_load_errors[i] ?? "the KV load failed");
    });
  }

  // ------------------------------------------------------------ endings

  private finish(request: Request, hold = false): void {
    this.adapters.requestEnded(request.loraId);
    this.scheduler.finishRequest(request, hold);
    if (hold) this.held.set(request.id, request);
    this.requests.delete(request.id);
    this.masks?.release(request);
  }

  private applyPendingAborts(): void {
    const ids = this.pendingAborts;
    this.pendingAborts = [];
    for (const id of ids) this.finishAborted(id, this.closed ? "the engine is shutting down" : null);
    const failures = this.pendingFailures;
    this.pendingFailures = new Map();
    for (const [id, message] of failures) this.finishFailed(id, message);
  }

  private runMasks(plan: MaskPlan): void {
    this.masks?.run(plan, this.executor, (request, message) => {
      // Applied before the step's tokens are, so the unmasked token is dropped.
      if (this.inFlight.length > 0) this.pendingFailures.set(request.id, message);
      else this.finishFailed(request.id, message);
    });
  }

  private finishFailed(requestId: RequestId, message: string): void {
    const request = this.requests.get(requestId);
    if (request === undefined) return;
    this.finish(request);
    this.emit(endOutput(request, "error", message));
  }

  private finishAborted(requestId: RequestId, error: string | null): void {
    const request = this.requests.get(requestId);
    if (request === undefined) return;
    this.finish(request);
    this.emit(endOutput(request, "abort", error));
  }

  /** The worker failed: every live request ends with the error; blocks and cached KV are gone. */
  private failAll(error: unknown): void {
    const message = error instanceof Error ? error.message : String(error);
    const live = [...this.requests.values()];
    this.pendingAborts = [];
    this.pendingFailures.clear();
    for (const request of live) this.finish(request);
    this.blockManager.resetPrefixCache();
    for (const request of live) this.emit(endOutput(request, "error", message));
    this.flushOutputs();
  }

  /** Defensive: live requests but an empty step would spin; end the oldest instead. */
  private failUnschedulable(out: SchedulerOutput): void {
    const oldest = this.scheduler.running[0] ?? this.scheduler.waiting[0];
    this.scheduler.deferRemoved(out.removed, out.kvCancels);
    if (oldest === undefined) return;
    this.finish(oldest);
    this.emit(endOutput(oldest, "error", "internal error: the scheduler could not place the request"));
  }

  /** Adds an output to this step's batch; an ending outside a step goes out by itself at the latest after this task. */
  private emit(output: RequestOutput): void {
    this.outputs.add(output);
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    queueMicrotask(() => {
      this.flushScheduled = false;
      this.flushOutputs();
    });
  }

  /** Hands the outputs gathered so far to onOutputs, as one batch (the sink keeps it). */
  private flushOutputs(): void {
    const batch = this.outputs;
    if (batch.size === 0) return;
    // Sized for a step of every running request, so a decode batch does not grow its array.
    this.outputs = new EngineOutputs(Math.max(batch.numPlain, this.scheduler.numRunning));
    try {
      this.onOutputs(batch);
    } catch {
      // An owner's sink must not take the engine down.
      this.numSinkErrors++;
    }
  }

  // ------------------------------------------------------------ checks

  private validate(req: EngineRequest): void {
    if (this.closed) throw new RequestRejectedError(`request ${req.id}: the engine is shutting down`);
    if (this.goneReason !== null) throw new RequestRejectedError(`request ${req.id}: ${this.goneReason}`);
    if (this.requests.has(req.id)) throw new RequestRejectedError(`request ${req.id}: a request with this id is already running`);
    const lora = req.loraId ?? 0;
    if (lora !== 0 && !this.adapters.usable(lora)) throw new RequestRejectedError(`request ${req.id}: LoRA adapter ${lora} is not loaded`);
    if (req.grammar != null && !this.takesGrammars) throw new RequestRejectedError(`request ${req.id}: structured outputs are not available on this engine`);
    const pooling = this.executor.ready.pooling !== null;
    if ((req.pooling != null) !== pooling) {
      throw new RequestRejectedError(`request ${req.id}: ${pooling ? "this is a pooling model: it takes embedding requests only" : "this model generates text: it takes no pooling requests"}`);
    }
    checkSubmittable(req, this.limits);
  }

  private checkExecutor(executor: StepExecutor): void {
    const ready = executor.ready;
    if (ready.block_size !== this.config.blockSize) {
      throw new RangeError(`the worker uses KV blocks of ${ready.block_size} tokens, the engine ${this.config.blockSize}`);
    }
    if (ready.num_blocks < this.config.numBlocks) {
      throw new RangeError(`the worker has ${ready.num_blocks} KV blocks, the engine was configured for ${this.config.numBlocks}`);
    }
  }

  private swapExecutor(): void {
    if (this.nextExecutor === null) return;
    this.executor = this.nextExecutor;
    this.limits = { ...this.config, vocabSize: this.executor.ready.vocab_size };
    this.nextExecutor = null;
    this.scheduler.resetWorkerState();
    this.lostReason = null;
    this.recovery.workerSwapped();
    this.adapters.workerReplaced();
  }
}

// ------------------------------------------------------------ helpers

/** What decides whether a request can ever run. */
export interface SubmitLimits {
  maxModelLen: number;
  /** A whole-prompt pooling request (an encoder's) runs in one step: no longer than this. */
  maxNumBatchedTokens: number;
  numBlocks: number;
  blockSize: number;
  vocabSize: number;
}

/**
 * Throws RequestRejectedError for a request that can never run: an empty
 * prompt, a token outside the vocabulary, maxTokens < 1, a prompt longer than
 * maxModelLen or than the whole KV cache. (The engine thread's proxy checks
 * the same on the main thread, so a refusal stays synchronous there too.)
 */
export function checkSubmittable(req: EngineRequest, limits: SubmitLimits): void {
  const reject = (why: string): never => {
    throw new RequestRejectedError(`request ${req.id}: ${why}`);
  };
  const prompt = req.promptIds;
  if (prompt.length === 0) reject("the prompt is empty");
  if (prompt.length > limits.maxModelLen) {
    reject(`the prompt has ${prompt.length} tokens, more than the maximum model length ${limits.maxModelLen}`);
  }
  if (req.pooling?.wholePrompt === true && prompt.length > limits.maxNumBatchedTokens) {
    reject(`the input has ${prompt.length} tokens, more than this encoder takes in one step (--max-num-batched-tokens ${limits.maxNumBatchedTokens})`);
  }
  // An encoder-decoder request's cross-attention blocks come out of the same cache.
  const cross = Math.ceil((req.numCrossTokens ?? 0) / limits.blockSize) * limits.blockSize;
  const capacity = limits.numBlocks * limits.blockSize - cross;
  if (prompt.length > capacity) {
    const what = cross > 0 ? ` beside its ${req.numCrossTokens} cross-attention positions` : "";
    reject(`the prompt has ${prompt.length} tokens, more than the whole KV cache holds${what} (${capacity})`);
  }
  for (let i = 0; i < prompt.length; i++) {
    const t = prompt[i] as number;
    if (!Number.isInteger(t) || t < 0 || t >= limits.vocabSize) reject(`prompt token ${i} (${t}) is outside the vocabulary [0, ${limits.vocabSize})`);
  }
  if (!Number.isInteger(req.stop.maxTokens) || req.stop.maxTokens < 1) reject(`maxTokens must be a positive integer, got ${req.stop.maxTokens}`);
  const k = req.promptLogprobs ?? -1;
  if (!Number.isInteger(k) || k < -1) reject(`promptLogprobs must be -1 or a count of alternatives, got ${k}`);
}

/** The worker must answer this step, one token per sampled row in row order (a pooling model: one vector of `pooledDims` floats). */
function checkResult(step: StepMessage, result: StepResultMessage, pooledDims: number | null): void {
  if (result.step_id !== step.step_id) throw new Error(`the worker answered step ${result.step_id} to step ${step.step_id}`);
  let k = 0;
  for (let i = 0; i < step.sample.length; i++) {
    if (step.sample[i] === 0) continue;
    if (result.req_ids[k] !== step.req_ids[i]) {
      throw new Error(`step ${step.step_id}: sampled row ${k} is request ${result.req_ids[k]}, expected ${step.req_ids[i]}`);
    }
    k++;
  }
  if (pooledDims !== null) {
    const floats = result.pooled?.length ?? 0;
    if (result.req_ids.length !== k || floats !== k * pooledDims || (k === 0) !== (result.pooled === null)) {
      throw new Error(`step ${step.step_id}: ${floats} pooled floats for ${k} rows of ${pooledDims} dimensions`);
    }
    return;
  }
  if (result.req_ids.length !== k) throw new Error(`step ${step.step_id}: ${result.req_ids.length} sampled rows answered for ${k}`);
  const counts = result.token_counts;
  let tokens = k;
  if (counts !== null) {
    if (counts.length !== k) throw new Error(`step ${step.step_id}: ${counts.length} token counts for ${k} sampling rows`);
    tokens = 0;
    let row = 0;
    for (let i = 0; i < step.sample.length; i++) {
      if (step.sample[i] === 0) continue;
      const count = counts[row++] as number;
      const most = 1 + draftCount(step, i);
      if (count < 1 || count > most) throw new Error(`step ${step.step_id}: row ${i} appended ${count} tokens; it could append 1 to ${most}`);
      tokens += count;
    }
  }
  if (result.token_ids.length !== tokens) {
    throw new Error(`step ${step.step_id}: ${result.token_ids.length} sampled tokens for ${tokens} expected`);
  }
  if (result.draft_counts !== null) {
    let proposed = 0;
    for (const n of result.draft_counts) proposed += n;
    if (result.draft_counts.length !== k || (result.draft_ids?.length ?? 0) !== proposed) throw new Error(`step ${step.step_id}: draft proposals do not match the sampled rows`);
  }
}

function outputOf(request: Request, token: number, logprob: TokenLogprob | null, stop: StopResult | null): RequestOutput {
  const output: RequestOutput = {
    requestId: request.id,
    newTokenIds: [token],
    logprobs: logprob === null ? null : [logprob],
    finished: stop !== null,
    finishReason: stop === null ? null : stop.reason,
    stopTokenId: stop === null ? null : stop.stopTokenId,
    numCachedTokens: Math.max(request.numCachedTokens, 0),
    error: null,
  };
  if (stop !== null) addTiming(output, request);
  return output;
}

function endOutput(request: Request, reason: "abort" | "error", error: string | null): RequestOutput {
  return addTiming(endingOutput(request.id, reason, error, Math.max(request.numCachedTokens, 0)), request);
}

/** The request's phases, on its final output, when it was scheduled and produced a token. */
function addTiming(output: RequestOutput, request: Request): RequestOutput {
  if (request.firstScheduledMs < 0 || request.firstTokenMs < 0) return output;
  const timing: RequestTiming = {
    queueMs: request.firstScheduledMs - request.submittedMs,
    prefillMs: request.firstTokenMs - request.firstScheduledMs,
    decodeMs: request.lastTokenMs - request.firstTokenMs,
    inferenceMs: request.lastTokenMs - request.firstScheduledMs,
  };
  output.timing = timing;
  return output;
}

function firstLine(text: string): string {
  return text.split("\n", 1)[0] ?? text;
}

/** The last output of a request that ends without a token (aborted, failed with `error`, or pooled). */
export function endingOutput(requestId: RequestId, reason: FinishReason, error: string | null, numCachedTokens = 0): RequestOutput {
  return { requestId, newTokenIds: [], logprobs: null, finished: true, finishReason: reason, stopTokenId: null, numCachedTokens, error };
}
