import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { hashBlock, ROOT_HASH } from "../../src/engine/block-hash.js";
import { BlockManager } from "../../src/engine/block-manager.js";
import { Request } from "../../src/engine/request.js";
import { makeRequest, range } from "./fake-executor.js";

const req = (prompt: number[]): Request => new Request(makeRequest(prompt));

/** An encoder-decoder request (Whisper's decoder): `cross` cross-attention positions over audio hashed `audio`. */
const crossReq = (prompt: number[], cross: number, audio: number): Request =>
  new Request({
    ...makeRequest(prompt),
    encoderStatesHandle: 7,
    numCrossTokens: cross,
    media: { spans: [], images: [], params: [], audio: { data: new Uint8Array(0), param: "file", hash: audio, offset: 0 } },
  });

describe("BlockManager", () => {
  it("takes an encoder-decoder request's cross-attention blocks with its first allocation, all or nothing, and frees them", () => {
    const kv = new BlockManager(8, 4, true);
    const a = crossReq(range(5), 10, 1);
    // 2 blocks for the prompt + 3 for the cross K/V: 5 of 8.
    assert.equal(kv.allocate(a, 5), true);
    assert.equal(a.blockIds.length, 2);
    assert.equal(a.crossBlockIds.length, 3);
    assert.equal(new Set([...a.blockIds, ...a.crossBlockIds]).size, 5, "disjoint");
    assert.equal(kv.allocate(a, 8), true, "growing takes no more cross blocks");
    assert.equal(a.crossBlockIds.length, 3);
    assert.deepEqual(kv.checkIntegrity(), { free: 3, cached: 0, inUse: 5 });
    const b = crossReq(range(2), 10, 2);
    assert.equal(kv.allocate(b, 2), false, "1 + 3 blocks do not fit in 3");
    assert.deepEqual([b.blockIds, b.crossBlockIds], [[], []]);
    kv.commitComputed(a, 8);
    kv.free(a);
    assert.deepEqual(a.crossBlockIds, []);
    // The prompt's full blocks stay cached; the cross blocks are plain free blocks.
    assert.deepEqual(kv.checkIntegrity(), { free: 6, cached: 2, inUse: 0 });
    assert.equal(kv.allocate(b, 2), true);
    assert.equal(b.crossBlockIds.length, 3);
    kv.free(b);
    kv.checkIntegrity();
  });

  it("never serves one audio's decoder blocks to another audio's request", () => {
    const kv = new BlockManager(32, 4, true);
    const a = crossReq(range(9), 4, 11);
    kv.allocate(a, 9);
    kv.commitComputed(a, 9);
    assert.deepEqual(kv.findCachedPrefix(crossReq(range(9), 4, 11)), a.blockIds.slice(0, 2), "the same audio hits");
    assert.deepEqual(kv.findCachedPrefix(crossReq(range(9), 4, 12)), [], "other audio: no hit");
    assert.deepEqual(kv.findCachedPrefix(req(range(9))), [], "a text-only request: no hit");
    kv.free(a);
    kv.checkIntegrity();
  });

  it("caches a frame model's prompt blocks only, rooted in its input hash", () => {
    const kv = new BlockManager(32, 4, true);
    const frames = (prompt: number[], inputHash: number): Request => new Request(makeRequest(prompt, {}, { frameWidth: 8, inputHash }));
    const a = frames(range(6), 5);
    kv.allocate(a, 14);
    for (const t of range(8, 500)) a.appendOutputToken(t);
    kv.commitComputed(a, 14);
    // 6 prompt positions: one full block cached; the generated frames' blocks are not (their tokens are codebook 0 only).
    assert.deepEqual(kv.checkIntegrity(), { free: 28, cached: 0, inUse: 4 });
    const again = frames([...range(6), ...range(8, 500)], 5);
    assert.deepEqual(kv.findCachedPrefix(again), a.blockIds.slice(0, 1), "the prompt's block hits");
    assert.deepEqual(kv.findCachedPrefix(frames(range(6), 6)), [], "another reference clip: no hit");
    kv.free(a);
    assert.deepEqual(kv.checkIntegrity(), { free: 31, cached: 1, inUse: 0 });
  });

  it("allocates whole blocks, all or nothing, and frees them", () => {
    const kv = new BlockManager(4, 4, false);
    const a = req(range(6));
    assert.equal(kv.allocate(a, 6), true);
    assert.deepEqual(a.blockIds, [0, 1]);
    assert.equal(kv.allocate(a, 8), true, "still two blocks");
    assert.equal(kv.numFreeBlocks, 2);
    const b = req(range(12));
    assert.equal(kv.allocate(b, 12), false);
    assert.deepEqual(b.blockIds, []);
    assert.equal(kv.numFreeBlocks, 2);
    assert.deepEqual(kv.checkIntegrity(), { free: 2, cached: 0, inUse: 2 });
    kv.free(a);
    assert.deepEqual(a.blockIds, []);
    assert.deepEqual(kv.checkIntegrity(), { free: 4, cached: 0, inUse: 0 });
  });

  it("the integrity check catches a corrupted table", () => {
    const kv = new BlockManager(4, 4, false);
    const a = req(range(6));
    kv.allocate(a, 6);
    a.blockIds.push(a.blockIds[0]!);
    assert.throws(() => kv.checkIntegrity(), /integrity/);
  });

  it("registers blocks only once computed, hits full blocks, caps at length - 1", () => {
    const kv = new BlockManager(8, 4, true);
    const a = req(range(8));
    kv.allocate(a, 8);
    const b = req(range(8));
    assert.deepEqual(kv.findCachedPrefix(b), [], "nothing committed yet");
    kv.commitComputed(a, 6);
    assert.deepEqual(kv.findCachedPrefix(b), [0]);
    kv.commitComputed(a, 8);
    // 8 tokens, two cached blocks, but the last token must be computed: one block.
    assert.deepEqual(kv.findCachedPrefix(b), [0]);
    const c = req([...range(8), 99]);
    assert.deepEqual(kv.findCachedPrefix(c), [0, 1]);
    const d = req([...range(4), 50, 51, 52, 53, 54]);
    assert.deepEqual(kv.findCachedPrefix(d), [0]);
    kv.checkIntegrity();
  });

  it("shares hit blocks by reference count and keeps them cached after free", () => {
    const kv = new BlockManager(6, 4, true);
    const a = req(range(9));
    kv.allocate(a, 9);
    kv.commitComputed(a, 9);
    const b = req(range(10));
    const hits = kv.findCachedPrefix(b);
    assert.deepEqual(hits, [0, 1]);
    assert.equal(kv.allocate(b, 10, hits), true);
    assert.deepEqual(b.blockIds, [0, 1, 3]);
    assert.equal(b.numCommittedBlocks, 2);
    assert.deepEqual(kv.checkIntegrity(), { free: 2, cached: 0, inUse: 4 });
    kv.free(a);
    kv.free(b);
    assert.deepEqual(kv.checkIntegrity(), { free: 4, cached: 2, inUse: 0 });
    // Revived from the free list: the cached blocks count against free space.
    const c = req(range(10));
    assert.equal(kv.allocate(c, 10, kv.findCachedPrefix(c)), true);
    assert.deepEqual(kv.checkIntegrity(), { free: 3, cached: 0, inUse: 3 });
  });

  it("reuses plain free blocks before evicting cached ones, and evicts a prefix tail first", () => {
    const kv = new BlockManager(5, 2, true);
    const a = req(range(6));
    kv.allocate(a, 6);
    kv.commitComputed(a, 6);
    kv.free(a);
    // 3 cached (0,1,2) + 2 plain (3,4).
    const b = req([90, 91, 92, 93]);
    kv.allocate(b, 4);
    assert.deepEqual(b.blockIds, [3, 4]);
    assert.deepEqual(kv.findCachedPrefix(req(range(7))), [0, 1, 2]);
    const c = req([80, 81]);
    kv.allocate(c, 2);
    assert.deepEqual(c.blockIds, [2], "the tail block of the cached prefix goes first");
    assert.deepEqual(kv.findCachedPrefix(req(range(7))), [0, 1]);
    kv.checkIntegrity();
  });

  it("does not double-register identical content and forgets everything on reset", () => {
    const kv = new BlockManager(8, 4, true);
    const a = req(range(5));
    const b = req(range(5));
    kv.allocate(a, 5);
    kv.allocate(b, 5);
    kv.commitComputed(a, 5);
    kv.commitComputed(b, 5);
    assert.deepEqual(kv.findCachedPrefix(req(range(6))), [a.blockIds[0]!]);
    kv.free(b);
    kv.free(a);
    assert.equal(kv.checkIntegrity().cached, 1);
    kv.resetPrefixCache();
    assert.deepEqual(kv.checkIntegrity(), { free: 8, cached: 0, inUse: 0 });
    assert.deepEqual(kv.findCachedPrefix(req(range(6))), []);
  });

  it("hashes chain over the parent", () => {
    const h1 = hashBlock(ROOT_HASH, [1, 2, 3, 4], 0, 4);
    assert.equal(h1, hashBlock(ROOT_HASH, [9, 1, 2, 3, 4], 1, 4));
    assert.notEqual(h1, hashBlock(h1, [1, 2, 3, 4], 0, 4));
    assert.ok(Number.isSafeInteger(h1) && h1 >= 0);
  });
});
