// KV block manager: fixed-size blocks, a free list, reference counts and the
// per-request block tables (kept on Request.blockIds), with block-granular
// prefix caching by a hash chain over full blocks (vLLM / nano-vllm style).
//
// Block states:
//   free    refCount 0, no hash      in the free list, nothing worth keeping
//   cached  refCount 0, hashed       in the free list, KV reusable until evicted
//   in use  refCount > 0             held by one or more requests' block tables
// The free list doubles as the LRU order of cached blocks: allocation takes
// from its head (evicting a cached block's hash then), a freed cached block
// goes to its tail, and a freed plain block to its head (it has nothing to
// lose, so it is reused before any cached block is evicted).
//
// An encoder-decoder request (Whisper) also holds the blocks of its
// cross-attention K/V (Request.crossBlockIds): taken with its first
// allocation, in the same all-or-nothing check, and freed with its table;
// they are never hashed, so no two requests share them.
//
// The scheduler talks to the KVCacheManager interface only, so a radix tree
// can replace the hash chain without touching it.

import { extendBlockHashes } from "./block-hash.js";
import type { Request } from "./request.js";

export interface BlockCounts {
  free: number;
  cached: number;
  inUse: number;
}

export interface KVCacheManager {
  readonly numBlocks: number;
  readonly blockSize: number;
  /** False: findCachedPrefix finds nothing and nothing is cached. */
  readonly enablePrefixCaching: boolean;
  /** Blocks an allocation can take now: free plus evictable cached blocks. */
  readonly numFreeBlocks: number;
  /**
   * Blocks holding the longest cached prefix of the request's known tokens,
   * in order; the hit is capped at numTokens - 1 so the last token is always
   * computed (its logits are needed to sample). Takes no references.
   */
  findCachedPrefix(request: Request): number[];
  /**
   * Grows the request's block table so it can hold `numTokens` tokens,
   * taking `cachedBlocks` (from findCachedPrefix, only on an empty table)
   * first, and its cross-attention blocks if it has none yet. All or
   * nothing: false, and nothing changed, if blocks are short.
   */
  allocate(request: Request, numTokens: number, cachedBlocks?: readonly number[]): boolean;
  /**
   * The step that computed the request's first `numComputedTokens` tokens has
   * executed: its full blocks now hold valid KV and may serve prefix hits.
   * (Never earlier: a block registered at schedule time could be hit by
   * another row of the same step before its KV is written.)
   */
  commitComputed(request: Request, numComputedTokens: number): void;
  /** Drops the request's references, last block first, and empties its table (and its cross-attention blocks). */
  free(request: Request): void;
  /** Forgets every cached hash (the worker's KV is gone, e.g. after a restart). */
  resetPrefixCache(): void;
  /** Throws if the bookkeeping is inconsistent; cheap enough for tests, O(blocks + table entries). */
  checkIntegrity(): BlockCounts;
  counts(): BlockCounts;
}

const NO_HASH = -1;

export class BlockManager implements KVCacheManager {
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly enablePrefixCaching: boolean;

  private readonly refCounts: Int32Array;
  /** Hash of a cached or in-use registered block; NO_HASH otherwise. */
  private readonly blockHash: Float64Array;
  /** The parent hash and tokens a block was registered with, to reject hash collisions. */
  private readonly blockParentHash: Float64Array;
  private readonly blockTokens: Int32Array;
  private readonly cachedBlockByHash = new Map<number, number>();

  // Free list: a doubly linked list over block ids with a sentinel at index numBlocks.
  private readonly next: Int32Array;
  private readonly prev: Int32Array;
  private readonly inFreeList: Uint8Array;
  private readonly sentinel: number;
  private freeCount = 0;
  /** Free-list blocks that still hold a hash (the evictable cached ones). */
  private cachedCount = 0;

  /** Requests holding blocks, for the integrity check. */
  private readonly holders = new Set<Request>();

  constructor(numBlocks: number, blockSize: number, enablePrefixCaching = true) {
    if (!Number.isInteger(numBlocks) || numBlocks < 1) throw new RangeError(`numBlocks must be a positive integer, got ${numBlocks}`);
    if (!Number.isInteger(blockSize) || blockSize < 1) throw new RangeError(`blockSize must be a positive integer, got ${blockSize}`);
    this.numBlocks = numBlocks;
    this.blockSize = blockSize;
    this.enablePrefixCaching = enablePrefixCaching;
    this.refCounts = new Int32Array(numBlocks);
    this.blockHash = new Float64Array(numBlocks).fill(NO_HASH);
    this.blockParentHash = new Float64Array(enablePrefixCaching ? numBlocks : 0);
    this.blockTokens = new Int32Array(enablePrefixCaching ? numBlocks * blockSize : 0);
    this.next = new Int32Array(numBlocks + 1);
    this.prev = new Int32Array(numBlocks + 1);
    this.inFreeList = new Uint8Array(numBlocks);
    this.sentinel = numBlocks;
    this.next[this.sentinel] = this.sentinel;
    this.prev[this.sentinel] = this.sentinel;
    // Ascending ids from the head, so a fresh cache hands out 0, 1, 2, ...
    for (let b = 0; b < numBlocks; b++) this.pushTail(b);
  }

  get numFreeBlocks(): number {
    return this.freeCount;
  }

  blocksFor(numTokens: number): number {
    return Math.ceil(numTokens / this.blockSize);
  }

  findCachedPrefix(request: Request): number[] {
    const hits: number[] = [];
    if (!this.enablePrefixCaching || this.cachedBlockByHash.size === 0) return hits;
    const maxBlocks = Math.floor((request.numTokens - 1) / this.blockSize);
    extendBlockHashes(request.blockHashes, request.tokenIds, this.blockSize, maxBlocks, request.media, request.rootHash);
    for (let i = 0; i < maxBlocks; i++) {
      const hash = request.blockHashes[i] as number;
      const block = this.cachedBlockByHash.get(hash);
      if (block === undefined) break;
      const parent = i === 0 ? request.rootHash : (request.blockHashes[i - 1] as number);
      if (!this.holdsTokens(block, parent, request.tokenIds, i * this.blockSize)) break;
      hits.push(block);
    }
    return hits;
  }

  allocate(request: Request, numTokens: number, cachedBlocks: readonly number[] = []): boolean {
    const table = request.blockIds;
    const numNew = this.blocksFor(numTokens) - table.length - cachedBlocks.length;
    const numCross = request.numCrossTokens > 0 && request.crossBlockIds.length === 0 ? this.blocksFor(request.numCrossTokens) : 0;
    // A cached block nobody holds sits in the free list: taking it costs a free slot too.
    let numRevived = 0;
    for (const block of cachedBlocks) if (this.refCounts[block] === 0) numRevived++;
    if (Math.max(numNew, 0) + numRevived + numCross > this.freeCount) return false;
    if (numCross > 0) {
      const cross: number[] = [];
      for (let i = 0; i < numCross; i++) {
        const block = this.popHead();
        this.evict(block);
        this.refCounts[block] = 1;
        cross.push(block);
      }
      request.crossBlockIds = cross;
      this.holders.add(request);
    }
    for (const block of cachedBlocks) {
      if (this.refCounts[block] === 0) this.unlink(block);
      this.refCounts[block] = this.refCounts[block]! + 1;
      table.push(block);
    }
    // Hit blocks are registered already; commitComputed starts after them.
    if (cachedBlocks.length > 0) request.numCommittedBlocks = cachedBlocks.length;
    for (let i = 0; i < numNew; i++) {
      const block = this.popHead();
      this.evict(block);
      this.refCounts[block] = 1;
      table.push(block);
    }
    if (table.length > 0) this.holders.add(request);
    return true;
  }

  commitComputed(request: Request, numComputedTokens: number): void {
    if (!this.enablePrefixCaching) return;
    const numFull = Math.min(Math.floor(Math.min(numComputedTokens, request.numCacheableTokens) / this.blockSize), request.blockIds.length);
    if (numFull <= request.numCommittedBlocks) return;
    extendBlockHashes(request.blockHashes, request.tokenIds, this.blockSize, numFull, request.media, request.rootHash);
    for (let i = request.numCommittedBlocks; i < numFull; i++) {
      const block = request.blockIds[i] as number;
      const hash = request.blockHashes[i] as number;
      // Another block already caches this content: keep that one, leave this plain.
      if (this.blockHash[block] !== NO_HASH || this.cachedBlockByHash.has(hash)) continue;
      this.cachedBlockByHash.set(hash, block);
      this.blockHash[block] = hash;
      this.blockParentHash[block] = i === 0 ? request.rootHash : (request.blockHashes[i - 1] as number);
      const start = i * this.blockSize;
      for (let j = 0; j < this.blockSize; j++) this.blockTokens[block * this.blockSize + j] = request.tokenIds[start + j] as number;
    }
    request.numCommittedBlocks = numFull;
  }

  free(request: Request): void {
    const cross = request.crossBlockIds;
    for (let i = cross.length - 1; i >= 0; i--) {
      const block = cross[i] as number;
      const refs = this.refCounts[block]! - 1;
      this.refCounts[block] = refs;
      if (refs !== 0) throw new Error(`cross-attention block ${block} has ${refs} other references`);
      this.pushHead(block);
    }
    if (cross.length > 0) request.crossBlockIds = [];
    const table = request.blockIds;
    // Reverse order: a prefix's tail blocks enter the LRU first and are evicted first.
    for (let i = table.length - 1; i >= 0; i--) {
      const block = table[i] as number;
      const refs = this.refCounts[block]! - 1;
      this.refCounts[block] = refs;
      if (refs < 0) throw new Error(`block ${block} freed more often than taken`);
      if (refs === 0) {
        if (this.blockHash[block] === NO_HASH) this.pushHead(block);
        else this.pushTail(block);
      }
    }
    request.blockIds = [];
    request.numSentBlocks = 0;
    request.numCommittedBlocks = 0;
    this.holders.delete(request);
  }

  resetPrefixCache(): void {
    for (const block of this.cachedBlockByHash.values()) this.blockHash[block] = NO_HASH;
    this.cachedBlockByHash.clear();
    this.cachedCount = 0;
    for (const request of this.holders) request.numCommittedBlocks = 0;
  }

  counts(): BlockCounts {
    return { free: this.freeCount - this.cachedCount, cached: this.cachedCount, inUse: this.numBlocks - this.freeCount };
  }

  checkIntegrity(): BlockCounts {
    const fail = (what: string): never => {
      throw new Error(`KV block integrity: ${what}`);
    };
    // Walk the free list both ways.
    const seen = new Uint8Array(this.numBlocks);
    let listed = 0;
    for (let b = this.next[this.sentinel]!, last = this.sentinel; b !== this.sentinel; last = b, b = this.next[b]!) {
      if (b < 0 || b >= this.numBlocks) fail(`free list holds ${b}`);
      if (seen[b]) fail(`block ${b} twice in the free list`);
      if (this.prev[b] !== last) fail(`free list links broken at ${b}`);
      if (this.refCounts[b] !== 0) fail(`block ${b} in the free list with refCount ${this.refCounts[b]}`);
      seen[b] = 1;
      if (++listed > this.numBlocks) fail("free list cycles");
    }
    if (listed !== this.freeCount) fail(`free list has ${listed} blocks, count says ${this.freeCount}`);
    // Each reference is one block-table entry; no table holds a block twice.
    const owners = new Int32Array(this.numBlocks);
    for (const request of this.holders) {
      const inTable = new Set<number>();
      for (const block of [...request.blockIds, ...request.crossBlockIds]) {
        if (inTable.has(block)) fail(`block ${block} twice in request ${request.id}'s tables`);
        inTable.add(block);
        owners[block] = owners[block]! + 1;
      }
      for (const block of request.crossBlockIds) if (this.blockHash[block] !== NO_HASH) fail(`cross-attention block ${block} is hashed`);
      if (request.numCommittedBlocks > request.blockIds.length) fail(`request ${request.id} committed more blocks than it holds`);
    }
    let free = 0;
    let cached = 0;
    let inUse = 0;
    for (let b = 0; b < this.numBlocks; b++) {
      const refs = this.refCounts[b]!;
      if (refs < 0) fail(`block ${b} has refCount ${refs}`);
      if (refs !== owners[b]) fail(`block ${b} has refCount ${refs} but ${owners[b]} table entries`);
      if ((refs === 0) !== (seen[b] === 1)) fail(`block ${b} (refCount ${refs}) ${seen[b] ? "is" : "is not"} in the free list`);
      const hash = this.blockHash[b]!;
      if (hash !== NO_HASH && this.cachedBlockByHash.get(hash) !== b) fail(`block ${b} has a hash the cache does not map to it`);
      if (refs > 0) inUse++;
      else if (hash !== NO_HASH) cached++;
      else free++;
    }
    for (const [hash, block] of this.cachedBlockByHash) {
      if (this.blockHash[block] !== hash) fail(`cache maps a hash to block ${block}, which has another`);
    }
    if (cached !== this.cachedCount) fail(`${cached} cached blocks, count says ${this.cachedCount}`);
    if (free + cached + inUse !== this.numBlocks) fail(`free ${free} + cached ${cached} + in use ${inUse} != ${this.numBlocks}`);
    if (!this.enablePrefixCaching && cached !== 0) fail("cached blocks with prefix caching off");
    return { free, cached, inUse };
  }

  // ------------------------------------------------------------ internals

  private holdsTokens(block: number, parentHash: number, tokens: readonly number[], start: number): boolean {
    if (this.blockParentHash[block] !== parentHash) return false;
    const base = block * this.blockSize;
    for (let j = 0; j < this.blockSize; j++) if (this.blockTokens[base + j] !== tokens[start + j]) return false;
    return true;
  }

  /** The block is being reused for other tokens: its cached KV is gone. */
  private evict(block: number): void {
    const hash = this.blockHash[block]!;
    if (hash === NO_HASH) return;
    this.cachedBlockByHash.delete(hash);
    this.blockHash[block] = NO_HASH;
  }

  private pushTail(block: number): void {
    this.link(block, this.prev[this.sentinel]!, this.sentinel);
  }

  private pushHead(block: number): void {
    this.link(block, this.sentinel, this.next[this.sentinel]!);
  }

  private link(block: number, before: number, after: number): void {
    this.next[before] = block;
    this.prev[block] = before;
    this.next[block] = after;
    this.prev[after] = block;
    this.inFreeList[block] = 1;
    this.freeCount++;
    if (this.blockHash[block] !== NO_HASH) this.cachedCount++;
  }

  private popHead(): number {
    const block = this.next[this.sentinel]!;
    if (block === this.sentinel) throw new Error("no free KV block (allocate checked the count)");
    this.unlink(block);
    return block;
  }

  private unlink(block: number): void {
    if (!this.inFreeList[block]) throw new Error(`block ${block} is not in the free list`);
    const before = this.prev[block]!;
    const after = this.next[block]!;
    this.next[before] = after;
    this.prev[after] = before;
    this.inFreeList[block] = 0;
    this.freeCount--;
    if (this.blockHash[block] !== NO_HASH) this.cachedCount--;
  }
}
