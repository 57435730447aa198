import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";
import { nextChunk, type StreamChunk } from "../../src/graph/chunk-policy.js";
import type { ChunkPolicySpec } from "../../src/graph/layout.js";
import { fixed, leftContext, slidingWindow } from "./builders.js";

/** Drives a policy: `pulls[i]` chunks are asked for after item i+1 is produced; then the end; then pulls until final. */
function cut(policy: ChunkPolicySpec, n: number, eager: boolean, limit = 1000): StreamChunk[] {
  const chunks: StreamChunk[] = [];
  let index = 0;
  const pull = (produced: number, end: number | null): boolean => {
    const c = nextChunk(policy, index, produced, end);
    if (c === null) return false;
    chunks.push(c);
    index++;
    return !c.final;
  };
  if (eager) for (let produced = 1; produced <= n; produced++) while (pull(produced, null)) if (chunks.length > limit) break;
  while (chunks.length < limit && pull(n, n)) {
    // after the end a policy always yields: loop until the final chunk
  }
  return chunks;
}

const span = (c: StreamChunk): string => (c.count === 0 ? `${c.final ? "final " : ""}EMPTY` : `${c.final ? "final " : ""}[${c.start}..${c.start + c.count - 1}]`);

describe("chunk policies (count-based)", () => {
  // The cases M*'s stream buffer is known by, cut with Baton's rule: the final chunk is
  // decided by the count (docs/graph-semantics.md, "The final chunk").
  const table: { policy: ChunkPolicySpec; n: number; chunks: string[]; context: number[] }[] = [
    { policy: slidingWindow(28, 7), n: 42, chunks: ["[0..27]", "[7..34]", "[14..41]", "final [21..41]"], context: [0, 21, 21, 21] },
    { policy: slidingWindow(28, 7), n: 20, chunks: ["final [0..19]"], context: [0] },
    { policy: leftContext(10, 2), n: 35, chunks: ["[0..9]", "[8..19]", "[18..29]", "final [28..34]"], context: [0, 2, 2, 2] },
    { policy: fixed(30), n: 65, chunks: ["[0..29]", "[30..59]", "final [60..64]"], context: [0, 0, 0] },
    // M*: an eager consumer gets an empty final chunk, a lazy one a full final chunk; here both get the same.
    { policy: fixed(30), n: 60, chunks: ["[0..29]", "[30..59]", "final EMPTY"], context: [0, 0, 0] },
    { policy: fixed(30), n: 0, chunks: ["final EMPTY"], context: [0] },
    { policy: slidingWindow(28, 7), n: 0, chunks: ["final EMPTY"], context: [0] },
    { policy: leftContext(10, 2), n: 0, chunks: ["final EMPTY"], context: [0] },
    { policy: leftContext(10, 2), n: 30, chunks: ["[0..9]", "[8..19]", "[18..29]", "final [28..29]"], context: [0, 2, 2, 2] },
  ];
  for (const row of table) {
    it(`${row.policy.kind}(${row.policy.size},${row.policy.stride || row.policy.left}) over ${row.n} items: ${row.chunks.join(", ")}`, () => {
      for (const eager of [true, false]) {
        const chunks = cut(row.policy, row.n, eager);
        assert.deepEqual(chunks.map(span), row.chunks, eager ? "eager consumer" : "lazy consumer");
        assert.deepEqual(chunks.map((c) => c.contextCount), row.context);
        assert.deepEqual(chunks.map((c) => c.index), row.chunks.map((_, i) => i));
      }
    });
  }

  it("a full chunk is never handed out before its items exist, the final never before the end", () => {
    const p = slidingWindow(28, 7);
    assert.equal(nextChunk(p, 0, 27, null), null);
    assert.deepEqual(nextChunk(p, 0, 28, null), { index: 0, start: 0, count: 28, contextCount: 0, final: false });
    assert.equal(nextChunk(p, 1, 34, null), null);
    assert.equal(nextChunk(p, 1, 34, 34)?.final, true);
  });

  it("continue_after_done is never final: the rest, then empty chunks", () => {
    const p = fixed(3, true);
    const chunks = cut(p, 7, true, 6);
    assert.deepEqual(chunks.map(span), ["[0..2]", "[3..5]", "[6..6]", "EMPTY", "EMPTY", "EMPTY"]);
    assert.ok(chunks.every((c) => !c.final));
  });

  const policies = fc.oneof(
    fc.integer({ min: 1, max: 12 }).map((s) => fixed(s)),
    fc.integer({ min: 1, max: 12 }).chain((w) => fc.integer({ min: 1, max: w }).map((s) => slidingWindow(w, s))),
    fc.tuple(fc.integer({ min: 1, max: 12 }), fc.integer({ min: 0, max: 14 })).map(([c, l]) => leftContext(c, l)),
  );

  it("property: exactly one final chunk, the last; offsets and context right; every item covered; timing does not matter", () => {
    fc.assert(
      fc.property(policies, fc.integer({ min: 0, max: 80 }), fc.array(fc.boolean(), { maxLength: 200 }), (policy, n, coin) => {
        // Random interleaving of producing, ending and pulling.
        const chunks: StreamChunk[] = [];
        let produced = 0;
        let k = 0;
        let ended = false;
        for (let i = 0; ; i++) {
          const pull = coin[i] ?? true;
          if (pull || ended) {
            const c = nextChunk(policy, k, produced, ended ? n : null);
            if (ended) assert.ok(c !== null, "after the end a policy always yields");
            if (c !== null) {
              chunks.push(c);
              k++;
              if (c.final) break;
              continue;
            }
          }
          if (produced < n) produced++;
          else ended = true;
        }
        const finals = chunks.filter((c) => c.final);
        assert.equal(finals.length, 1);
        assert.equal(chunks[chunks.length - 1]!.final, true);
        const seen = new Set<number>();
        for (const c of chunks) {
          assert.ok(c.start >= 0 && c.start + c.count <= n, "inside the stream");
          for (let i = c.start; i < c.start + c.contextCount; i++) assert.ok(seen.has(i), `context item ${i} was seen before`);
          for (let i = c.start + c.contextCount; i < c.start + c.count; i++) assert.ok(!seen.has(i), `new item ${i} is new`);
          for (let i = c.start; i < c.start + c.count; i++) seen.add(i);
        }
        assert.equal(seen.size, n, "every item covered");
        assert.deepEqual(chunks, cut(policy, n, false), "same chunks as a consumer that waits for the end");
      }),
      { numRuns: 500 },
    );
  });

  it("property: a continue-after-done policy is never final", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 10 }), fc.integer({ min: 0, max: 50 }), (size, n) => {
        const chunks = cut(fixed(size, true), n, true, Math.ceil(n / size) + 3);
        assert.ok(chunks.every((c) => !c.final));
        const covered = chunks.reduce((sum, c) => sum + c.count - c.contextCount, 0);
        assert.equal(covered, n);
      }),
    );
  });
});
