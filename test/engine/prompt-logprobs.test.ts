// Prompt logprobs in the engine core: gathered over prefill chunks, sent once
// with the first token, never served from (or corrupting) the prefix cache,
// not repeated when a preempted prompt is recomputed; and the request phases
// (RequestTiming) on the final output.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { PromptTokenLogprob } from "../../src/engine/types.js";
import { fakePromptLogprob, makeRequest, range } from "./fake-executor.js";
import { collect, makeEngine } from "./helpers.js";

function expected(prompt: number[], k: number): PromptTokenLogprob[] {
  return prompt.slice(1).map((_, p) => fakePromptLogprob(prompt, p, k, 1000));
}

for (const asyncScheduling of [true, false]) {
  const mode = asyncScheduling ? "async scheduling" : "sync scheduling";
  describe(`EngineCore: prompt logprobs (${mode})`, () => {
    it("arrive once, with the first token, for every prompt token after the first, over chunked prefill", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4, maxNumBatchedTokens: 5 });
      const prompt = range(13, 50);
      const { outputs, tokens } = await collect(engine, makeRequest(prompt, { maxTokens: 3 }, { promptLogprobs: 2 }));
      assert.ok(executor.steps.filter((s) => s.req_ids.length > 0).length >= 3, "the prompt runs in chunks");
      assert.deepEqual(tokens, [63, 64, 65]);
      assert.deepEqual(outputs[0]!.promptLogprobs, expected(prompt, 2));
      assert.ok(outputs.slice(1).every((o) => o.promptLogprobs === undefined));
      engine.checkIntegrity();
    });

    it("a one-token prompt has none; k = 0 gives no alternatives; requests without them get none", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4 });
      const one = await collect(engine, makeRequest([7], { maxTokens: 1 }, { promptLogprobs: 3 }));
      assert.deepEqual(one.outputs[0]!.promptLogprobs, []);
      const zero = await collect(engine, makeRequest([1, 2, 3], { maxTokens: 1 }, { promptLogprobs: 0 }));
      assert.deepEqual(zero.outputs[0]!.promptLogprobs, expected([1, 2, 3], 0));
      const none = await collect(engine, makeRequest([1, 2, 3], { maxTokens: 1 }));
      assert.equal(none.outputs[0]!.promptLogprobs, undefined);
    });

    it("skip the prefix cache for themselves, leave it intact for others, and count no lookup", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4 });
      const prompt = range(12, 300);
      await collect(engine, makeRequest(prompt, { maxTokens: 1 }));
      const before = engine.stats;
      const steps = executor.steps.length;
      const withLogprobs = await collect(engine, makeRequest(prompt, { maxTokens: 2 }, { promptLogprobs: 1 }));
      assert.equal(withLogprobs.final.numCachedTokens, 0);
      assert.equal(executor.steps[steps]!.num_computed[0], 0, "the whole prompt is computed");
      assert.deepEqual(withLogprobs.outputs[0]!.promptLogprobs, expected(prompt, 1));
      assert.deepEqual([engine.stats.numPrefixQueryTokens, engine.stats.numPrefixHitTokens], [before.numPrefixQueryTokens, before.numPrefixHitTokens]);
      // Its identical blocks did not replace the cached ones: a third request still hits them, twice over.
      const again = await collect(engine, makeRequest(prompt, { maxTokens: 2 }));
      assert.equal(again.final.numCachedTokens, 8);
      assert.deepEqual(again.tokens, withLogprobs.tokens);
      const repeat = await collect(engine, makeRequest(prompt, { maxTokens: 2 }, { promptLogprobs: 1 }));
      assert.deepEqual(repeat.outputs[0]!.promptLogprobs, withLogprobs.outputs[0]!.promptLogprobs);
      engine.checkIntegrity();
    });

    it("are not repeated when a preempted prompt is recomputed", async () => {
      const prompts = Array.from({ length: 5 }, (_, i) => range(9 + i, 100 * i));
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 8, blockSize: 4, maxNumBatchedTokens: 6 });
      const results = await Promise.all(prompts.map((p) => collect(engine, makeRequest(p, { maxTokens: 10 }, { promptLogprobs: 1 }))));
      assert.ok(engine.stats.numPreemptions > 0, "expected preemptions");
      // Resumed after its prompt logprobs went out, a request asks the worker for none (and may hit the cache again).
      const resumed = executor.steps.flatMap((s) => s.added).filter((a) => a.token_ids.length > a.num_prompt_tokens);
      assert.ok(resumed.length > 0);
      assert.ok(resumed.every((a) => a.prompt_logprobs === -1));
      results.forEach((r, i) => {
        const sent = r.outputs.filter((o) => o.promptLogprobs !== undefined);
        assert.equal(sent.length, 1);
        assert.deepEqual(sent[0]!.promptLogprobs, expected(prompts[i]!, 1));
      });
      engine.checkIntegrity();
    });

    it("the final output carries the request's phases; an output before the first token does not", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4 }, { delayMs: 2 });
      const { outputs, final } = await collect(engine, makeRequest(range(6), { maxTokens: 3 }));
      assert.ok(outputs.slice(0, -1).every((o) => o.timing === undefined));
      const t = final.timing!;
      assert.ok(t.queueMs >= 0 && t.prefillMs > 0 && t.decodeMs > 0, JSON.stringify(t));
      assert.ok(Math.abs(t.inferenceMs - (t.prefillMs + t.decodeMs)) < 1e-9);
    });
  });
}
