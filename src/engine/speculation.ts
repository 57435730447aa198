// Speculative decoding, the engine's part. The worker proposes drafts for a
// row's next step (n-gram prompt lookup over the row's tokens, in the
// StepResult); the scheduler gives a decode row up to
// --speculative-config's num_speculative_tokens of them (scheduler.ts
// draftsFor, within the budget, max_tokens and the model's length) and
// allocates their slots; the worker runs them after the row's last token and
// verifies them in one forward. A row then appends its accepted drafts and
// one more token, as many as token_counts says. Only accepted drafts count
// as computed: the KV of rejected ones sits in slots the request already
// holds, beyond its computed tokens, and is overwritten when it grows there;
// no block is hashed for the prefix cache before its tokens are accepted.

import type { StepMessage, StepResultMessage } from "../transport/messages.js";
import type { Scheduler, SchedulerOutput } from "./scheduler.js";

/** Counters as vLLM names them (vllm:spec_decode_*). */
export interface SpecDecodeStats {
  /** Rows that verified drafts. */
  numDrafts: number;
  numDraftTokens: number;
  numAcceptedTokens: number;
  /** Accepted drafts by their position in the row's drafts (0: the first). */
  acceptedPerPosition: number[];
}

export function emptySpecDecodeStats(): SpecDecodeStats {
  return { numDrafts: 0, numDraftTokens: 0, numAcceptedTokens: 0, acceptedPerPosition: [] };
}

/** The sum of two replicas' counters. */
export function addSpecDecodeStats(a: SpecDecodeStats, b: SpecDecodeStats): SpecDecodeStats {
  const positions = Math.max(a.acceptedPerPosition.length, b.acceptedPerPosition.length);
  return {
    numDrafts: a.numDrafts + b.numDrafts,
    numDraftTokens: a.numDraftTokens + b.numDraftTokens,
    numAcceptedTokens: a.numAcceptedTokens + b.numAcceptedTokens,
    acceptedPerPosition: Array.from({ length: positions }, (_, p) => (a.acceptedPerPosition[p] ?? 0) + (b.acceptedPerPosition[p] ?? 0)),
  };
}

/** Row i's drafts in the step. */
export function draftCount(step: StepMessage, i: number): number {
  return step.spec === null ? 0 : ((step.spec.draft_counts[i] as number) ?? 0);
}

export class Speculation {
  readonly stats = emptySpecDecodeStats();

  /** Before the step's tokens are processed: each drafted row's accepted drafts become computed. */
  acceptDrafts(scheduler: Scheduler, out: SchedulerOutput, message: StepMessage, result: StepResultMessage): void {
    const counts = result.token_counts;
    let k = 0;
    for (let i = 0; i < out.requests.length; i++) {
      if (message.sample[i] === 0) continue;
      const count = counts === null ? 1 : (counts[k] as number);
      k++;
      const drafts = out.numDrafts[i] as number;
      if (drafts === 0) continue;
      const accepted = count - 1;
      scheduler.acceptDrafts(out, i, accepted);
      const s = this.stats;
      s.numDrafts++;
      s.numDraftTokens += drafts;
      s.numAcceptedTokens += accepted;
      for (let p = 0; p < accepted; p++) s.acceptedPerPosition[p] = (s.acceptedPerPosition[p] ?? 0) + 1;
    }
  }
}

/** The worker's proposals, one sampled row after another. */
export class DraftReader {
  private row = 0;
  private at = 0;

  constructor(
    private readonly counts: Int32Array,
    private readonly ids: Int32Array | null,
  ) {}

  /** The next sampled row's proposals (null: none). */
  next(): number[] | null {
    const n = (this.counts[this.row++] as number) ?? 0;
    if (n === 0 || this.ids === null) return null;
    const drafts = Array.from(this.ids.subarray(this.at, this.at + n));
    this.at += n;
    return drafts;
  }
}
