// Pooling models (a worker whose Ready has `pooling`): every request is
// prefill only, and the worker answers the row that ends its prompt with the
// prompt's pooled vector instead of a token. What that means for scheduling
// follows from how the model pools, decided here once.

import type { PoolingInfo } from "../transport/messages.js";

/** How the engine schedules a pooling request (EngineRequest.pooling). */
export interface PoolingTraits {
  /**
   * The whole prompt in one row: a bidirectional encoder attends over the
   * whole sequence at once, so its prompt is never chunked (and may not be
   * longer than a step's token budget).
   */
  wholePrompt: boolean;
  /**
   * Prefix-cache hits allowed: only last-token pooling over a causal model,
   * where cached positions are never read again. Mean and CLS pooling need
   * the hidden state of every (or the first) position, which a hit skips.
   */
  readsPrefixCache: boolean;
}

export function poolingTraits(info: PoolingInfo): PoolingTraits {
  return { wholePrompt: !info.causal, readsPrefixCache: info.causal && info.pooling_type === "last" };
}
