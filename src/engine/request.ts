// Per-request state inside the engine core. No prefill or decode phase: a
// request has tokens it knows (prompt + outputs) and a count of tokens whose
// KV is computed; each step gives it tokens so the count catches up.

import type { RequestGrammar } from "../structured/answer-phase.js";
import type { SamplingParams } from "../transport/messages.js";
import { rootHashOf } from "./block-hash.js";
import type { PoolingTraits } from "./pooling.js";
import type { EngineRequest, KvTransferParams, MediaSpan, PromptTokenLogprob, RequestId, StopConditions } from "./types.js";

/** loading: its KV is being loaded from another worker (prefill/decode disaggregation). */
export type RequestStatus = "waiting" | "loading" | "running" | "finished";

/** Where a consumer request's remote KV load stands; "none" for every other request. */
export type KvLoadState = "none" | "pending" | "loading" | "done" | "failed";

export class Request {
  // Fields are laid out in declaration order: the ones every step reads for
  // every request (schedule, build, results) come first, so a request's hot
  // state spans as few cache lines as it can.
  status: RequestStatus = "waiting";
  /** Prompt followed by every sampled token: what the worker is told when the request is added. */
  readonly tokenIds: number[];
  readonly outputIds: number[] = [];
  /**
   * Sampled rows scheduled for this request whose token has not come back yet
   * (overlap scheduling: at most the step in flight plus the one being built).
   * The worker already has these tokens, so the scheduler counts them as known.
   */
  numInFlightSamples = 0;
  /** Tokens whose KV is (or, once the scheduled step runs, will be) computed. */
  numComputedTokens = 0;
  /** StopConditions.maxTokens and minTokens, and every id that stops it (EOS unless ignoreEos, then the stop ids). */
  readonly maxTokens: number;
  readonly minTokens: number;
  readonly stopIds: readonly number[];
  /** SamplingParams.logprobs: -1 none, k >= 0 the sampled token's logprob and k alternatives. */
  readonly numLogprobs: number;
  /** The worker knows the request (added, not removed since): its rows name it by id. */
  onWorker = false;
  /** Block table: block i holds the KV of positions [i*blockSize, (i+1)*blockSize). */
  blockIds: number[] = [];
  /** How many of blockIds the worker already has (blocks cross the wire once). */
  numSentBlocks = 0;
  /** Leading blocks of blockIds already registered in (or served from) the prefix cache. */
  numCommittedBlocks = 0;
  /** Chained hash of each full block of tokenIds, filled lazily by the prefix cache. */
  readonly blockHashes: number[] = [];
  /** Prompt tokens served from the prefix cache at first admission; -1 before admission. */
  numCachedTokens = -1;
  /** -1: none; k >= 0: prompt logprobs with k alternatives (EngineRequest.promptLogprobs). */
  readonly promptLogprobs: number;
  promptLogprobsSent = false;
  /** Engine-clock times (performance.now() in the engine's thread) for RequestTiming; -1 until they happen. */
  firstTokenMs = -1;
  lastTokenMs = -1;
  /** Image token runs of a vision-language prompt (empty: none), hashed into the block hashes. */
  readonly media: readonly MediaSpan[];

  readonly id: RequestId;
  readonly sampling: SamplingParams;
  readonly stop: StopConditions;
  readonly priority: number;
  readonly arrivalMs: number;
  /** Structured output: the grammar of its answer (null: unconstrained). */
  readonly grammar: RequestGrammar | null;
  /** EngineRequest.embedsHandle, -1 when none. */
  readonly embeds: number;
  /** EngineRequest.positionsHandle, -1 when none. */
  readonly positions: number;
  /** EngineRequest.encoderStatesHandle, -1 when none. */
  readonly encoderStates: number;
  /** Cross-attention positions it holds blocks for (EngineRequest.numCrossTokens; 0: none). */
  readonly numCrossTokens: number;
  /** The blocks of its cross-attention K/V (allocated and freed with blockIds; never prefix-cached). */
  crossBlockIds: number[] = NO_BLOCKS;
  /** Prompt logprobs received so far, in prompt order (a recomputed prompt does not add them twice). */
  readonly promptLogprobEntries: PromptTokenLogprob[] = [];
  readonly submittedMs: number;
  firstScheduledMs = -1;
  readonly numPromptTokens: number;
  numPreemptions = 0;
  /** Worker deaths this request was carried over (recomputed on the next worker). */
  numMigrations = 0;
  /**
   * It was being added to the worker when the worker died, and has not run a
   * step since: it may be what kills the worker, so it is re-admitted alone.
   */
  suspect = false;
  /** Prefill/decode disaggregation: its part in a KV transfer (null: none). */
  readonly kvTransfer: KvTransferParams | null;
  kvLoad: KvLoadState;
  /** The worker's num_prompt_tokens: what its penalties and seeded draws count outputs from. */
  readonly numWorkerPromptTokens: number;
  /** The transfer loading its KV while kvLoad is "loading". */
  kvTransferId = -1;
  /** A pooling model's request (EngineRequest.pooling); null: it generates. */
  readonly pooling: PoolingTraits | null;
  /** Speculative decoding: the worker's proposals for its next step (empty: none). */
  draftIds: readonly number[] = NO_DRAFTS;
  /** The LoRA adapter its rows run with (0: the base model). */
  readonly loraId: number;
  /** Parent hash of its first block: the adapter's own (block-hash.ts rootHashOf). */
  readonly rootHash: number;
  /** A frame model's frame width (EngineRequest.frameWidth); 0: a token model. */
  readonly frameWidth: number;

  constructor(req: EngineRequest) {
    this.id = req.id;
    this.sampling = req.sampling;
    this.stop = req.stop;
    this.maxTokens = req.stop.maxTokens;
    this.minTokens = req.stop.minTokens;
    this.stopIds = req.stop.ignoreEos ? req.stop.stopTokenIds : [...req.stop.eosTokenIds, ...req.stop.stopTokenIds];
    this.numLogprobs = req.sampling.logprobs;
    this.priority = req.priority;
    this.arrivalMs = req.arrivalMs;
    this.grammar = req.grammar ?? null;
    this.promptLogprobs = req.promptLogprobs ?? -1;
    this.media = req.media?.spans ?? [];
    this.embeds = req.embedsHandle ?? -1;
    this.positions = req.positionsHandle ?? -1;
    this.encoderStates = req.encoderStatesHandle ?? -1;
    this.numCrossTokens = this.encoderStates >= 0 ? (req.numCrossTokens ?? 0) : 0;
    this.submittedMs = performance.now();
    this.numPromptTokens = req.promptIds.length;
    this.tokenIds = req.promptIds.slice();
    this.kvTransfer = req.kvTransfer ?? null;
    // A consumer's last "prompt" token was sampled on the prefill side: to the worker it is an output token.
    this.numWorkerPromptTokens = this.kvTransfer?.role === "consumer" ? Math.min(this.kvTransfer.numTokens, this.numPromptTokens) : this.numPromptTokens;
    this.kvLoad = this.kvTransfer?.role === "consumer" ? "pending" : "none";
    this.pooling = req.pooling ?? null;
    this.loraId = req.loraId ?? 0;
    this.rootHash = rootHashOf(this.loraId, req.inputHash || (req.media?.audio?.hash ?? 0));
    this.frameWidth = req.frameWidth ?? 0;
  }

  /** Tokens whose full blocks the prefix cache may keep: a frame model's outputs are more than their token ids, so its prompt only. */
  get numCacheableTokens(): number {
    return this.frameWidth > 0 ? this.numPromptTokens : Number.MAX_SAFE_INTEGER;
  }

  /** Whether prefix-cache hits may serve its prompt: not while it needs prompt logprobs, nor for pooling that reads every position. */
  get readsPrefixCache(): boolean {
    return !this.needsPromptLogprobs && (this.pooling?.readsPrefixCache ?? true);
  }

  /** Asked for prompt logprobs and has not had them yet (a request resumed after they went out has no need). */
  get needsPromptLogprobs(): boolean {
    return this.promptLogprobs >= 0 && !this.promptLogprobsSent;
  }

  get numTokens(): number {
    return this.tokenIds.length;
  }

  /** Tokens the worker has or will have when the steps in flight are done. */
  get numTokensWithInFlight(): number {
    return this.tokenIds.length + this.numInFlightSamples;
  }

  get numOutputTokens(): number {
    return this.outputIds.length;
  }

  get isFinished(): boolean {
    return this.status === "finished";
  }

  appendOutputToken(tokenId: number): void {
    this.tokenIds.push(tokenId);
    this.outputIds.push(tokenId);
  }
}

const NO_DRAFTS: readonly number[] = [];
const NO_BLOCKS: number[] = [];
