// The worker's logprob arrays turned into the engine's entries: the sampled
// token's logprob with its top alternatives, and a prompt's logprobs as its
// chunks are scored (prompt position p scores prompt token p + 1; a prompt
// recomputed after preemption adds no entry twice, and the entries go out
// once, with the request's first generated token).

import type { StepMessage, StepResultMessage } from "../transport/messages.js";
import type { Request } from "./request.js";
import type { SchedulerOutput } from "./scheduler.js";
import type { TokenLogprob } from "./types.js";

/** Adds each row's prompt logprobs to its request; positions it already has (a recomputed prompt) are skipped. */
export function collectPromptLogprobs(out: SchedulerOutput, message: StepMessage, result: StepResultMessage, vocabSize: number): void {
  const counts = result.prompt_counts as Int32Array;
  const { prompt_logprobs: logprobs, prompt_ranks: ranks, prompt_top_ids: topIds, prompt_top_logprobs: topLogprobs } = result;
  if (counts.length !== out.requests.length || logprobs === null || ranks === null || topIds === null || topLogprobs === null) {
    throw new Error(`step ${message.step_id}: prompt logprobs for ${counts.length} rows of ${out.requests.length}, or missing arrays`);
  }
  let at = 0;
  let topAt = 0;
  for (let i = 0; i < counts.length; i++) {
    const count = counts[i] as number;
    if (count === 0) continue;
    const request = out.requests[i] as Request;
    const k = Math.min(Math.max(request.promptLogprobs, 0), vocabSize);
    // Counts and offsets follow the worker's view; a resumed request asks for none (step-builder).
    const entries = request.promptLogprobEntries;
    const first = message.num_computed[i] as number;
    for (let j = 0; j < count; j++, at++, topAt += k) {
      // Position p scores prompt token p + 1.
      const position = first + j;
      if (position !== entries.length || request.promptLogprobsSent) continue;
      const top: TokenLogprob["top"] = [];
      for (let t = topAt; t < topAt + k; t++) top.push({ tokenId: topIds[t] as number, logprob: topLogprobs[t] as number });
      entries.push({ tokenId: request.tokenIds[position + 1] as number, logprob: logprobs[at] as number, rank: ranks[at] as number, top });
    }
  }
}

/** The sampled token's logprob and its alternatives, from the worker's flat arrays (token k of token_ids, its alternatives from topAt). */
export function tokenLogprob(result: StepResultMessage, k: number, token: number, topAt: number): TokenLogprob | null {
  if (result.logprobs === null) return null;
  const top: TokenLogprob["top"] = [];
  if (result.top_counts !== null && result.top_ids !== null && result.top_logprobs !== null) {
    const count = result.top_counts[k] as number;
    for (let j = topAt; j < topAt + count; j++) top.push({ tokenId: result.top_ids[j] as number, logprob: result.top_logprobs[j] as number });
  }
  return { tokenId: token, logprob: result.logprobs[k] as number, top };
}
