// A step carries one batch per (node, walk): the conductor's batches handed
// out at different moments merge, so concurrent requests share a forward; a
// request's own passes (two stream chunks) never share one and keep their order.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { mergeBatches } from "../../src/conductor/worker-lane.js";
import type { PassBatch } from "../../src/transport/messages.js";

let nextPass = 0;
function batch(id: number, node: string, walk: string, requests: string[]): PassBatch {
  // Requests named by one letter: a = 1, b = 2, ...
  return {
    batch_id: id,
    node,
    walk,
    passes: requests.map((name) => ({ pass_id: nextPass++, request_id: name.charCodeAt(0) - 96, inputs: [], chunks: [], request_kwargs: {} })),
    publish: [],
  };
}

const shape = (batches: PassBatch[]): [string, string, string[]][] => batches.map((b) => [b.node, b.walk, b.passes.map((p) => String.fromCharCode(96 + p.request_id))]);

describe("mergeBatches", () => {
  it("merges batches of one (node, walk), keeping arrival order of the passes", () => {
    const merged = mergeBatches([batch(1, "denoiser", "generate", ["a"]), batch(2, "text_encoder", "generate", ["c"]), batch(3, "denoiser", "generate", ["b", "d"])]);
    assert.deepEqual(shape(merged), [
      ["denoiser", "generate", ["a", "b", "d"]],
      ["text_encoder", "generate", ["c"]],
    ]);
  });

  it("keeps walks apart: the same node in two walks is two batches", () => {
    assert.deepEqual(shape(mergeBatches([batch(1, "llm_codec", "x", ["a"]), batch(2, "llm_codec", "y", ["b"])])), [
      ["llm_codec", "x", ["a"]],
      ["llm_codec", "y", ["b"]],
    ]);
  });

  it("a request already in the merged batch starts a new one after it", () => {
    const merged = mergeBatches([batch(1, "codec", "chunk", ["a", "b"]), batch(2, "codec", "chunk", ["a"]), batch(3, "codec", "chunk", ["c"])]);
    assert.deepEqual(shape(merged), [
      ["codec", "chunk", ["a", "b"]],
      ["codec", "chunk", ["a", "c"]],
    ]);
  });

  it("leaves the conductor's batches unchanged (results are matched against them)", () => {
    const original = [batch(1, "n", "w", ["a"]), batch(2, "n", "w", ["b"])];
    mergeBatches(original);
    assert.deepEqual(shape(original), [
      ["n", "w", ["a"]],
      ["n", "w", ["b"]],
    ]);
  });
});
