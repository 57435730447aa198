// Chunk policies of streaming connections as pure count arithmetic.
//
// Chunk k of a policy covers items [start(k), newEnd(k)): the items before
// newStart(k) were already seen in an earlier chunk (its context), the rest are
// new. A chunk is handed out as soon as `produced >= newEnd(k)`. Once the
// producer has ended with n items, the first chunk whose newEnd(k) > n is the
// final one and holds [start(k), n): the remainder, only context, or nothing.
// So which chunk is final depends only on n, never on when the consumer asks
// (M* decides an empty final chunk by consumer timing). A continue-after-done
// policy never yields a final chunk: after the end it keeps yielding what is
// left, then empty chunks, and the consumer ends itself.

import type { ChunkPolicySpec } from "./layout.js";

export interface StreamChunk {
  /** 0, 1, 2, ... per connection per request. */
  index: number;
  /** Offset of the chunk's first item in the stream. */
  start: number;
  /** Items in the chunk (context included). */
  count: number;
  /** Leading items of the chunk that an earlier chunk already held. */
  contextCount: number;
  final: boolean;
}

/** First item of chunk k (context included). */
export function chunkStart(policy: ChunkPolicySpec, k: number): number {
  switch (policy.kind) {
    case "fixed":
      return k * policy.size;
    case "sliding_window":
      return k * policy.stride;
    case "left_context":
      return Math.max(0, k * policy.size - policy.left);
  }
}

/** First item of chunk k that no earlier chunk held. */
function newStart(policy: ChunkPolicySpec, k: number): number {
  if (k === 0) return 0;
  return newEnd(policy, k - 1);
}

/** One past the last item of a full chunk k. */
function newEnd(policy: ChunkPolicySpec, k: number): number {
  switch (policy.kind) {
    case "fixed":
    case "left_context":
      return (k + 1) * policy.size;
    case "sliding_window":
      return k * policy.stride + policy.size;
  }
}

/**
 * The next chunk (index `index`) given `produced` items so far and the
 * producer's final item count (`endCount`, null while it runs); null when
 * nothing is ready yet. The caller asks for index k+1 only after taking k and
 * never after a final chunk.
 */
export function nextChunk(
  policy: ChunkPolicySpec,
  index: number,
  produced: number,
  endCount: number | null,
): StreamChunk | null {
  const start = chunkStart(policy, index);
  const fresh = newStart(policy, index);
  const end = newEnd(policy, index);
  if (end <= produced) return { index, start, count: end - start, contextCount: fresh - start, final: false };
  if (endCount === null) return null;
  const n = endCount;
  if (policy.kind === "fixed" && policy.continue_after_done) {
    const from = Math.min(start, n);
    return { index, start: from, count: n - from, contextCount: Math.min(fresh, n) - from, final: false };
  }
  return { index, start, count: n - start, contextCount: fresh - start, final: true };
}

/** Why a policy's parameters cannot work, or null. */
export function chunkPolicyProblem(policy: ChunkPolicySpec): string | null {
  if (policy.size < 1) return `size must be >= 1 (got ${policy.size})`;
  if (policy.kind === "sliding_window" && (policy.stride < 1 || policy.stride > policy.size)) {
    return `stride must be between 1 and the window ${policy.size} (got ${policy.stride})`;
  }
  if (policy.kind !== "fixed" && policy.continue_after_done) return "continue_after_done is for fixed policies only";
  return null;
}
