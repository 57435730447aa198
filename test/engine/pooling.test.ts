// Pooling models in the engine core: prefill-only requests that end with
// their prompt's pooled vector; an encoder's prompt is never chunked (and
// one longer than a step is refused at once), a causal model chunks and hits
// the prefix cache only where the pooling allows it (the last token); a
// pooling engine takes no generating request and the other way round.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { poolingTraits } from "../../src/engine/pooling.js";
import { RequestRejectedError } from "../../src/engine/engine-core.js";
import type { PoolingInfo } from "../../src/transport/messages.js";
import { fakePooled, makeRequest, range } from "./fake-executor.js";
import { collect, makeEngine } from "./helpers.js";

function info(pooling_type: string, causal: boolean): PoolingInfo {
  return { pooling_type, normalize: false, dimensions: 4, causal, is_matryoshka: false, matryoshka_dimensions: [], task: "embed", activation: "identity" };
}

function poolingRequest(prompt: number[], pooling: PoolingInfo) {
  return makeRequest(prompt, { maxTokens: 1, ignoreEos: true }, { pooling: poolingTraits(pooling) });
}

for (const asyncScheduling of [true, false]) {
  const mode = asyncScheduling ? "async scheduling" : "sync scheduling";
  describe(`EngineCore: pooling models (${mode})`, () => {
    it("an encoder runs each prompt whole, several per step, and ends each with its vector", async () => {
      const encoder = info("cls", false);
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 64, blockSize: 4, maxNumBatchedTokens: 20 }, { pooling: encoder });
      const prompts = [3, 17, 9, 20, 1, 12, 5, 8].map((n, i) => range(n, 10 * i));
      const results = await Promise.all(prompts.map((p) => collect(engine, poolingRequest(p, encoder))));
      results.forEach((result, i) => {
        assert.equal(result.outputs.length, 1);
        assert.deepEqual(Array.from(result.final.pooled ?? []), fakePooled(prompts[i]!));
        assert.equal(result.final.finishReason, "stop");
        assert.deepEqual(result.tokens, []);
        assert.ok(result.final.timing !== undefined);
      });
      assert.ok(executor.steps.some((s) => s.req_ids.length > 1), "requests share steps");
      assert.equal(engine.stats.numFreeBlocks, 64);
      engine.checkIntegrity();
    });

    it("an encoder refuses a prompt longer than a step takes, and never serves one from a cache", async () => {
      const encoder = info("mean", false);
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 64, blockSize: 4, maxNumBatchedTokens: 16 }, { pooling: encoder });
      assert.throws(() => engine.submit(poolingRequest(range(17), encoder)), (e: Error) => e instanceof RequestRejectedError && /17 tokens, more than this encoder takes in one step \(--max-num-batched-tokens 16\)/.test(e.message));
      const first = await collect(engine, poolingRequest(range(16), encoder));
      const again = await collect(engine, poolingRequest(range(16), encoder));
      assert.equal(again.final.numCachedTokens, 0);
      assert.deepEqual(Array.from(again.final.pooled ?? []), Array.from(first.final.pooled ?? []));
    });

    it("a causal model chunks a long prompt and pools the last token through prefix-cache hits", async () => {
      const last = info("last", true);
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 64, blockSize: 4, maxNumBatchedTokens: 6 }, { pooling: last });
      const prompt = range(21, 100);
      const first = await collect(engine, poolingRequest(prompt, last));
      assert.ok(executor.steps.filter((s) => s.req_ids.length > 0).length >= 4, "the prompt runs in chunks");
      assert.deepEqual(Array.from(first.final.pooled ?? []), fakePooled(prompt));
      const second = await collect(engine, poolingRequest([...prompt.slice(0, 16), 7, 8], last));
      assert.equal(second.final.numCachedTokens, 16);
      assert.deepEqual(Array.from(second.final.pooled ?? []), fakePooled([...prompt.slice(0, 16), 7, 8]));
      engine.checkIntegrity();
    });

    it("mean pooling over a causal model computes every position (no prefix hit)", async () => {
      const mean = info("mean", true);
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 64, blockSize: 4, maxNumBatchedTokens: 6 }, { pooling: mean });
      const prompt = range(18, 300);
      await collect(engine, poolingRequest(prompt, mean));
      const again = await collect(engine, poolingRequest(prompt, mean));
      assert.equal(again.final.numCachedTokens, 0);
      assert.deepEqual(Array.from(again.final.pooled ?? []), fakePooled(prompt));
    });

    it("a pooling engine refuses a generating request, a generating engine a pooling one", () => {
      const last = info("last", true);
      const pooling = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { pooling: last }).engine;
      assert.throws(() => pooling.submit(makeRequest([1, 2, 3])), /pooling model: it takes embedding requests only/);
      const generating = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }).engine;
      assert.throws(() => generating.submit(poolingRequest([1, 2, 3], last)), /generates text: it takes no pooling requests/);
    });

    it("an abort while its step runs ends it with abort and drops its vector", async () => {
      const encoder = info("cls", false);
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { pooling: encoder, delayMs: 5 });
      const request = poolingRequest(range(5), encoder);
      executor.onStep = () => engine.abort(request.id);
      const result = await collect(engine, request);
      assert.equal(result.final.finishReason, "abort");
      assert.equal(result.final.pooled, undefined);
      engine.checkIntegrity();
    });
  });
}
