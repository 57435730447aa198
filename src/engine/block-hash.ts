// Chained hashes of full KV blocks for prefix caching: a block's hash covers
// its tokens and its parent's hash, so equal hashes mean equal prefixes (up to
// collisions, which the block manager rules out by comparing tokens and the
// parent hash on every hit).
//
// Two independent 32-bit lanes (murmur3-style mixing) give a 53-bit integer,
// which fits a JS number exactly and keys a Map without allocating strings.

import type { MediaSpan } from "./types.js";

const TWO_32 = 0x1_0000_0000;
const HI_MASK = 0x1f_ffff; // 21 bits: 21 + 32 = 53

/** Parent hash of a base-model request's first block. */
export const ROOT_HASH = 0;

/**
 * Parent hash of the first block of a request that runs with LoRA adapter
 * `loraId` (0: the base model) on input `inputHash` that every layer attends
 * (an encoder-decoder's audio; 0: none). Either changes every layer's K/V, so
 * such blocks must never serve another adapter's or another input's prompt,
 * nor the base model's. Adapter ids are never reused within a server's life.
 */
export function rootHashOf(loraId: number, inputHash = 0): number {
  const root = loraId === 0 ? ROOT_HASH : hashBlock(ROOT_HASH, [0x10ad, loraId], 0, 2);
  if (inputHash === 0) return root;
  return hashBlock(root, [0xa0d1, inputHash >>> 0, Math.floor(inputHash / TWO_32)], 0, 3);
}

function mix(h: number, k: number): number {
  k = Math.imul(k, 0xcc9e2d51);
  k = (k << 15) | (k >>> 17);
  k = Math.imul(k, 0x1b873593);
  h ^= k;
  h = (h << 13) | (h >>> 19);
  return (Math.imul(h, 5) + 0xe6546b64) | 0;
}

function finish(h: number, length: number): number {
  h ^= length;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Hash of tokens[start, start + count) chained onto parentHash. */
export function hashBlock(parentHash: number, tokens: ArrayLike<number>, start: number, count: number): number {
  const parentLo = parentHash >>> 0;
  const parentHi = Math.floor(parentHash / TWO_32);
  let a = mix(0x9747b28c, parentLo);
  let b = mix(0x5bd1e995, parentHi);
  a = mix(a, parentHi);
  b = mix(b, parentLo);
  for (let i = start; i < start + count; i++) {
    const t = tokens[i] as number;
    a = mix(a, t);
    b = mix(b, t ^ 0x27d4eb2f);
  }
  const lo = finish(a, count);
  const hi = finish(b, count) & HI_MASK;
  return hi * TWO_32 + lo;
}

/**
 * Extends request.blockHashes to cover the first `numBlocks` full blocks of
 * tokenIds. Only new blocks are hashed, so the cost per step is proportional
 * to the new tokens, not to the request's length.
 */
export function extendBlockHashes(
  hashes: number[],
  tokenIds: readonly number[],
  blockSize: number,
  numBlocks: number,
  media: readonly MediaSpan[] = NO_MEDIA,
  root = ROOT_HASH,
): void {
  for (let i = hashes.length; i < numBlocks; i++) {
    const parent = i === 0 ? root : (hashes[i - 1] as number);
    const hash = hashBlock(parent, tokenIds, i * blockSize, blockSize);
    hashes.push(media.length === 0 ? hash : withMedia(hash, media, i * blockSize, blockSize));
  }
}

const NO_MEDIA: readonly MediaSpan[] = [];

/**
 * The block's hash with the hash of every image whose tokens overlap the block
 * (vLLM's multimodal extra keys): image tokens are all the same id, so the
 * tokens alone cannot tell two images apart. Blocks before an image's first
 * token are unchanged, so a shared text prefix still hits.
 */
function withMedia(hash: number, media: readonly MediaSpan[], start: number, count: number): number {
  const keys: number[] = [];
  for (const span of media) {
    if (span.offset < start + count && span.offset + span.length > start) keys.push(span.hash >>> 0, Math.floor(span.hash / TWO_32));
  }
  return keys.length === 0 ? hash : hashBlock(hash, keys, 0, keys.length);
}
