// An in-process StepExecutor for engine unit tests. It follows the Step
// semantics of protocol/schema.json like the Python worker does (per-request
// token lists and block tables, removed before added, rows validated) and
// simulates the KV cache: each row's context positions must already hold the
// right tokens before the step (so a wrong prefix-cache hit, a block reused
// while still needed, or a stale block fails loudly), then the row writes its
// own positions. The sampled token is (last input token + 1) % vocabSize,
// which depends only on the request's tokens, so any schedule (chunked,
// preempted, cached) must produce the same output as an unpressured run.
// Prompt logprobs are fake too, and depend only on the prompt: position p
// scores token t = tokens[p + 1] with logprob -(t % 97) / 8 and rank t % 5 + 1,
// and alternative j is (tokens[p] + 1 + j) % vocab with logprob -j.
// With `pooling` it is a pooling model: a row that ends its prompt answers with
// the vector fakePooled(prompt), and every position the pooling reads must
// have been computed by this worker (a prefix hit is an error unless it pools
// the last token; an encoder's row must be its whole prompt).

import type { PoolingInfo, ReadyMessage, SamplingParams, StepMessage, StepResultMessage } from "../../src/transport/messages.js";
import type { EngineRequest } from "../../src/engine/types.js";
import type { StepExecutor } from "../../src/worker/types.js";
import { samplingOf } from "../../src/frontend/sampling.js";

export interface FakeOptions {
  numBlocks: number;
  blockSize: number;
  maxModelLen?: number;
  vocabSize?: number;
  /** Milliseconds each step takes (0: answers on a resolved promise). */
  delayMs?: number;
  /** Reject this step id (simulates a worker dying). */
  failAtStep?: number;
  /** A pooling model (Ready.pooling); its dimensions must be 4 (fakePooled). */
  pooling?: PoolingInfo;
}

/** The fake pooling model's vector of a prompt: its length, first and last token, and the sum of its tokens. */
export function fakePooled(prompt: readonly number[]): number[] {
  return [prompt.length, prompt[0]!, prompt[prompt.length - 1]!, prompt.reduce((a, b) => a + b, 0)];
}

interface FakeRequest {
  tokens: number[];
  blockTable: number[];
  numPromptTokens: number;
  promptLogprobs: number;
  /** Positions this worker computed from 0 on (pooling checks that nothing it reads was skipped). */
  computedFromStart: boolean;
}

/** The fake worker's prompt logprob at position p (see the file comment). */
export function fakePromptLogprob(tokens: readonly number[], p: number, k: number, vocab: number): { tokenId: number; logprob: number; rank: number; top: { tokenId: number; logprob: number }[] } {
  const t = tokens[p + 1]!;
  const top = Array.from({ length: k }, (_, j) => ({ tokenId: (tokens[p]! + 1 + j) % vocab, logprob: -j }));
  return { tokenId: t, logprob: -(t % 97) / 8, rank: (t % 5) + 1, top };
}

export class FakeExecutor implements StepExecutor {
  readonly ready: ReadyMessage;
  readonly steps: StepMessage[] = [];
  readonly requests = new Map<number, FakeRequest>();
  keepSteps = true;
  failAtStep: number | null;
  delayMs: number;
  /** Called at the start of executeStep, e.g. to abort mid-step. */
  onStep: ((step: StepMessage) => void) | null = null;
  /** Steps sent and not answered yet, and the most there ever were at once. */
  queued = 0;
  maxQueued = 0;
  private tail: Promise<void> = Promise.resolve();
  private readonly kv: Int32Array;
  private lastStepId = -1;

  constructor(private readonly options: FakeOptions) {
    this.ready = {
      kind: "Ready",
      protocol_version: 2,
      num_blocks: options.numBlocks,
      block_size: options.blockSize,
      max_model_len: options.maxModelLen ?? 4096,
      vocab_size: options.vocabSize ?? 1000,
      architecture: "Fake",
      dtype: "float32",
      device: "cpu",
      worker_pid: 0,
      graph: {},
      pooling: options.pooling ?? null,
    };
    this.kv = new Int32Array(options.numBlocks * options.blockSize).fill(-1);
    this.failAtStep = options.failAtStep ?? null;
    this.delayMs = options.delayMs ?? 0;
  }

  /**
   * Like the real worker, steps run one after another in arrival order: a
   * step sent while another runs (overlap scheduling) waits in a queue, and
   * reads the tokens the earlier step appended.
   */
  executeStep(step: StepMessage): Promise<StepResultMessage> {
    this.onStep?.(step);
    if (this.keepSteps) this.steps.push(step);
    this.maxQueued = Math.max(this.maxQueued, ++this.queued);
    const run = this.tail.then(async () => {
      try {
        if (this.delayMs > 0) await new Promise((resolve) => setTimeout(resolve, this.delayMs));
        if (step.step_id === this.failAtStep) throw new Error("the model worker died (fake)");
        return this.compute(step);
      } finally {
        this.queued--;
      }
    });
    this.tail = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /** KV connector tests: copies blocks of `from`'s fake cache into this one's (a finished KV load). */
  copyBlocksFrom(from: FakeExecutor, srcBlocks: ArrayLike<number>, dstBlocks: ArrayLike<number>): void {
    const bs = this.options.blockSize;
    for (let i = 0; i < srcBlocks.length; i++) {
      const src = srcBlocks[i]! * bs;
      this.kv.set(from.kv.subarray(src, src + bs), dstBlocks[i]! * bs);
    }
  }

  /** Executes a step at once (what executeStep does after its delay). */
  compute(step: StepMessage): StepResultMessage {
    const bs = this.options.blockSize;
    const vocab = this.ready.vocab_size;
    // Like the supervisor: ids only increase (a replacement worker sees the engine's ids go on).
    if (step.step_id <= this.lastStepId) throw new Error(`step ${step.step_id} after ${this.lastStepId}`);
    this.lastStepId = step.step_id;
    for (const id of step.removed) this.requests.delete(id);
    for (const added of step.added) {
      if (this.requests.has(added.req_id)) throw new Error(`request ${added.req_id} is already running`);
      if (added.num_prompt_tokens < 0 || added.num_prompt_tokens > added.token_ids.length) throw new Error("bad num_prompt_tokens");
      this.requests.set(added.req_id, {
        tokens: Array.from(added.token_ids),
        blockTable: [],
        numPromptTokens: added.num_prompt_tokens,
        promptLogprobs: added.prompt_logprobs,
        computedFromStart: false,
      });
    }
    const n = step.req_ids.length;
    for (const field of [step.num_new_tokens, step.num_computed, step.new_block_counts, step.sample]) {
      if (field.length !== n) throw new Error("row arrays differ in length");
    }
    const rows: FakeRequest[] = [];
    const seen = new Set<number>();
    let blockAt = 0;
    for (let i = 0; i < n; i++) {
      const id = step.req_ids[i]!;
      if (seen.has(id)) throw new Error(`request ${id} has two rows`);
      seen.add(id);
      const state = this.requests.get(id);
      if (state === undefined) throw new Error(`unknown request ${id}`);
      for (let c = 0; c < step.new_block_counts[i]!; c++) {
        const block = step.new_block_ids[blockAt++]!;
        if (block < 0 || block >= this.options.numBlocks) throw new Error(`block ${block} out of range`);
        state.blockTable.push(block);
      }
      const start = step.num_computed[i]!;
      const end = start + step.num_new_tokens[i]!;
      if (step.num_new_tokens[i]! < 1) throw new Error(`row ${i} has no tokens`);
      if (end > state.tokens.length) throw new Error(`row ${i} runs to ${end}, request has ${state.tokens.length} tokens`);
      if (end > state.blockTable.length * bs) throw new Error(`row ${i} needs ${Math.ceil(end / bs)} blocks, has ${state.blockTable.length}`);
      if (step.sample[i] === 1 && end !== state.tokens.length) throw new Error(`row ${i} samples before its last token`);
      // The context must be in the cache before the step (prefix hits included).
      for (let p = 0; p < start; p++) {
        const slot = state.blockTable[Math.floor(p / bs)]! * bs + (p % bs);
        if (this.kv[slot] !== state.tokens[p]) throw new Error(`request ${id}: KV at position ${p} holds ${this.kv[slot]}, expected ${state.tokens[p]}`);
      }
      rows.push(state);
    }
    if (blockAt !== step.new_block_ids.length) throw new Error("new_block_ids longer than new_block_counts say");
    // Two live requests must never write the same slot in one step.
    const written = new Set<number>();
    const reqIds: number[] = [];
    const tokenIds: number[] = [];
    const pooling = this.options.pooling;
    const pooled: number[] = [];
    const prompt = { any: false, counts: [] as number[], logprobs: [] as number[], ranks: [] as number[], topIds: [] as number[], topLogprobs: [] as number[] };
    for (let i = 0; i < n; i++) {
      const state = rows[i]!;
      const start = step.num_computed[i]!;
      const end = Math.min(start + step.num_new_tokens[i]!, state.numPromptTokens - 1);
      let count = 0;
      if (state.promptLogprobs >= 0) {
        prompt.any = true;
        for (let p = start; p < end; p++, count++) {
          const entry = fakePromptLogprob(state.tokens, p, Math.min(state.promptLogprobs, vocab), vocab);
          prompt.logprobs.push(entry.logprob);
          prompt.ranks.push(entry.rank);
          for (const t of entry.top) {
            prompt.topIds.push(t.tokenId);
            prompt.topLogprobs.push(t.logprob);
          }
        }
      }
      prompt.counts.push(count);
    }
    for (let i = 0; i < n; i++) {
      const state = rows[i]!;
      const start = step.num_computed[i]!;
      const end = start + step.num_new_tokens[i]!;
      for (let p = start; p < end; p++) {
        const slot = state.blockTable[Math.floor(p / bs)]! * bs + (p % bs);
        if (written.has(slot)) throw new Error(`slot ${slot} written twice in step ${step.step_id}`);
        written.add(slot);
        this.kv[slot] = state.tokens[p]!;
      }
      if (start === 0) state.computedFromStart = true;
      if (pooling !== undefined) {
        if (!pooling.causal && (start !== 0 || end !== state.tokens.length)) throw new Error(`request ${step.req_ids[i]}: an encoder's row must be its whole prompt`);
        if (step.sample[i] !== 1) continue;
        if (pooling.pooling_type !== "last" && !state.computedFromStart) throw new Error(`request ${step.req_ids[i]}: ${pooling.pooling_type} pooling over skipped positions`);
        reqIds.push(step.req_ids[i]!);
        pooled.push(...fakePooled(state.tokens));
        continue;
      }
      if (step.sample[i] === 1) {
        const token = (state.tokens[end - 1]! + 1) % vocab;
        state.tokens.push(token);
        reqIds.push(step.req_ids[i]!);
        tokenIds.push(token);
      }
    }
    return {
      kind: "StepResult",
      step_id: step.step_id,
      prompt_results: [],
      pass_results: [],
      req_ids: Int32Array.from(reqIds),
      token_ids: Int32Array.from(tokenIds),
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0, forward_ms: 0, sample_ms: 0 },
      prompt_counts: prompt.any ? Int32Array.from(prompt.counts) : null,
      prompt_logprobs: prompt.any ? Float32Array.from(prompt.logprobs) : null,
      prompt_ranks: prompt.any ? Int32Array.from(prompt.ranks) : null,
      prompt_top_ids: prompt.any ? Int32Array.from(prompt.topIds) : null,
      prompt_top_logprobs: prompt.any ? Float32Array.from(prompt.topLogprobs) : null,
      kv_loaded: new Int32Array(0),
      kv_load_failed: new Int32Array(0),
      kv_load_errors: [],
      kv_bytes: 0,
      lora_load_failed: new Int32Array(0),
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
      pooled: pooled.length > 0 ? Float32Array.from(pooled) : null,
    };
  }
}

export function greedy(overrides: Partial<SamplingParams> = {}): SamplingParams {
  return { ...samplingOf(0, null), ...overrides };
}

let counter = 0;

export function makeRequest(
  promptIds: number[],
  stop: Partial<EngineRequest["stop"]> = {},
  extra: Partial<Omit<EngineRequest, "stop">> = {},
): EngineRequest {
  return {
    id: ++counter,
    promptIds,
    sampling: greedy(),
    stop: { maxTokens: 16, eosTokenIds: [], stopTokenIds: [], ignoreEos: false, minTokens: 0, ...stop },
    priority: 0,
    arrivalMs: performance.now(),
    ...extra,
  };
}

/** 0, 1, 2, ... n-1 shifted by `from`, modulo the vocabulary. */
export function range(n: number, from = 0, vocab = 1000): number[] {
  return Array.from({ length: n }, (_, i) => (from + i) % vocab);
}
