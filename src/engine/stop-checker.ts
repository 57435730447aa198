// Stop conditions checked after each sampled token has been appended
// (vLLM V1's check_stop). The stop token stays in outputIds; the frontend
// decides whether it becomes text.
//
// Order: below minTokens only length can stop a request; then EOS (unless
// ignoreEos), then stop token ids, then max tokens and max model length.

import type { Request } from "./request.js";
import type { FinishReason } from "./types.js";

export interface StopResult {
  reason: FinishReason;
  /** The EOS or stop token id that ended the request; null for "length". */
  stopTokenId: number | null;
}

const LENGTH: StopResult = Object.freeze({ reason: "length", stopTokenId: null });

/**
 * Why the request must stop after its latest token, or null to go on.
 * `maxModelLen` bounds prompt + output (the engine passes the smaller of the
 * model's limit and what the whole KV cache can hold, so a request alone in
 * the cache can always finish).
 */
export function checkStop(request: Request, maxModelLen: number): StopResult | null {
  const numOutput = request.numOutputTokens;
  if (numOutput === 0) return null;
  // The request's own copies of its stop conditions (Request.stopIds: EOS unless ignoreEos, then the stop ids).
  if (numOutput >= request.minTokens && request.stopIds.length > 0) {
    const last = request.outputIds[numOutput - 1] as number;
    if (request.stopIds.includes(last)) return { reason: "stop", stopTokenId: last };
  }
  if (numOutput >= request.maxTokens || request.numTokens >= maxModelLen) return LENGTH;
  return null;
}
