import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { RequestRejectedError } from "../../src/engine/engine-core.js";
import type { RequestOutput } from "../../src/engine/types.js";
import { FakeExecutor, makeRequest, range } from "./fake-executor.js";
import { collect, makeEngine, newEngineCore, submit } from "./helpers.js";

for (const asyncScheduling of [true, false]) {
  const mode = asyncScheduling ? "async scheduling" : "sync scheduling";
  describe(`EngineCore: generation and stop conditions (${mode})`, () => {
    it("generates one output per token, then finishes on maxTokens with length", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      const { outputs, tokens, final } = await collect(engine, makeRequest(range(5), { maxTokens: 4 }));
      assert.deepEqual(tokens, [5, 6, 7, 8]);
      assert.equal(outputs.length, 4);
      assert.ok(outputs.every((o) => o.newTokenIds.length === 1));
      assert.ok(outputs.slice(0, -1).every((o) => !o.finished && o.finishReason === null));
      assert.equal(final.finishReason, "length");
      assert.equal(final.stopTokenId, null);
      assert.equal(engine.stats.numUsedBlocks, 0);
      engine.checkIntegrity();
    });

    it("stops on EOS and includes it", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      const { tokens, final } = await collect(engine, makeRequest([1, 2, 3], { eosTokenIds: [6] }));
      assert.deepEqual(tokens, [4, 5, 6]);
      assert.equal(final.finishReason, "stop");
      assert.equal(final.stopTokenId, 6);
    });

    it("stops on a stop token id", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      const { tokens, final } = await collect(engine, makeRequest([1, 2, 3], { stopTokenIds: [5] }));
      assert.deepEqual(tokens, [4, 5]);
      assert.deepEqual([final.finishReason, final.stopTokenId], ["stop", 5]);
    });

    it("ignoreEos keeps going past EOS but still honours stop token ids", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      const a = await collect(engine, makeRequest([3], { eosTokenIds: [5], ignoreEos: true, maxTokens: 4 }));
      assert.deepEqual(a.tokens, [4, 5, 6, 7]);
      assert.equal(a.final.finishReason, "length");
      const b = await collect(engine, makeRequest([3], { eosTokenIds: [5], stopTokenIds: [6], ignoreEos: true }));
      assert.deepEqual(b.tokens, [4, 5, 6]);
      assert.equal(b.final.stopTokenId, 6);
    });

    it("minTokens suppresses EOS until reached", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { vocabSize: 10 });
      // Outputs 4 5 6 7 8 9 0 1 2 3 4: the first 4 comes before minTokens, the second stops.
      const { tokens, final } = await collect(engine, makeRequest([3], { eosTokenIds: [4], minTokens: 3, maxTokens: 50 }));
      assert.deepEqual(tokens, [4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]);
      assert.deepEqual([final.finishReason, final.stopTokenId], ["stop", 4]);
    });

    it("minTokens does not hold back the length limit", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      const { tokens, final } = await collect(engine, makeRequest([3], { minTokens: 10, maxTokens: 2 }));
      assert.equal(tokens.length, 2);
      assert.equal(final.finishReason, "length");
    });

    it("stops at the maximum model length", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4, maxModelLen: 10 });
      const { tokens, final } = await collect(engine, makeRequest(range(8), { maxTokens: 100 }));
      assert.equal(tokens.length, 2);
      assert.equal(final.finishReason, "length");
    });

    it("a prompt of exactly maxModelLen gets one token", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4, maxModelLen: 10 });
      const { tokens, final } = await collect(engine, makeRequest(range(10), { maxTokens: 100 }));
      assert.deepEqual(tokens, [10]);
      assert.equal(final.finishReason, "length");
    });

    it("treats the whole KV cache as a length limit, so a lone request always finishes", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 2, blockSize: 4 });
      // 8 slots: positions 0..7 computed, the 9th token is sampled from position 7.
      const { tokens, final } = await collect(engine, makeRequest(range(6), { maxTokens: 10 }));
      assert.equal(6 + tokens.length, 9);
      assert.equal(final.finishReason, "length");
      engine.checkIntegrity();
    });

    it("hands each step's outputs to its owner as one batch: tokens packed, endings as objects", async () => {
      const batches: { ids: number[]; numPlain: number; numRich: number }[] = [];
      const executor = new FakeExecutor({ numBlocks: 16, blockSize: 4 });
      const engine = newEngineCore(executor, { asyncScheduling, maxNumSeqs: 8, maxNumBatchedTokens: 64, maxModelLen: 64, blockSize: 4, numBlocks: 16 }, {
        onBatch: (batch) => {
          const ids: number[] = [];
          batch.forEach((o) => ids.push(o.requestId));
          batches.push({ ids, numPlain: batch.numPlain, numRich: batch.rich.length });
        },
      });
      const runs = await Promise.all([1, 2, 3].map((t) => collect(engine, makeRequest([t], { maxTokens: 4 }))));
      for (const run of runs) assert.deepEqual(run.outputs.map((o) => o.finished), [false, false, false, true]);
      // No request twice in a batch, and no more batches than steps.
      for (const b of batches) assert.equal(new Set(b.ids).size, b.ids.length);
      assert.ok(batches.length <= engine.stats.numSteps);
      // Every token of a request that goes on is packed; the three endings are objects.
      assert.equal(batches.reduce((n, b) => n + b.numPlain, 0), 9);
      assert.equal(batches.reduce((n, b) => n + b.numRich, 0), 3);
      assert.ok(batches.some((b) => b.numPlain === 3), "a decode step of three rows is one batch of three packed tokens");
    });

    it("an owner's sink that throws does not stop the engine (counted in numSinkErrors)", async () => {
      let thrown = false;
      const executor = new FakeExecutor({ numBlocks: 16, blockSize: 4 });
      const engine = newEngineCore(executor, { asyncScheduling, maxNumSeqs: 8, maxNumBatchedTokens: 64, maxModelLen: 64, blockSize: 4, numBlocks: 16 }, {
        onBatch: () => {
          if (thrown) return;
          thrown = true;
          throw new Error("owner bug");
        },
      });
      const { tokens, final } = await collect(engine, makeRequest([1], { maxTokens: 3 }));
      // The first step's batch was lost with the throw; the request still finishes.
      assert.deepEqual(tokens, [3, 4]);
      assert.equal(final.finishReason, "length");
      assert.equal(engine.stats.numSinkErrors, 1);
      engine.checkIntegrity();
    });

    it("passes logprobs through when asked", async () => {
      const executor = new FakeExecutor({ numBlocks: 8, blockSize: 4 });
      const run = executor.executeStep.bind(executor);
      executor.executeStep = async (step) => {
        const result = await run(step);
        const n = result.token_ids.length;
        return {
          ...result,
          logprobs: Float32Array.from({ length: n }, () => -0.5),
          top_counts: Int32Array.from({ length: n }, () => 2),
          top_ids: Int32Array.from({ length: 2 * n }, (_, j) => j),
          top_logprobs: Float32Array.from({ length: 2 * n }, () => -1),
        };
      };
      const engine = newEngineCore(executor, { asyncScheduling, maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 64, blockSize: 4, numBlocks: 8 });
      const req = makeRequest([1, 2], { maxTokens: 2 });
      req.sampling = { ...req.sampling, logprobs: 2 };
      const { outputs } = await collect(engine, req);
      assert.deepEqual(outputs[0]!.logprobs, [{ tokenId: 3, logprob: -0.5, top: [{ tokenId: 0, logprob: -1 }, { tokenId: 1, logprob: -1 }] }]);
    });
  });

  describe(`EngineCore: scheduling through the step loop (${mode})`, () => {
    it("splits a long prompt into chunks within the token budget; samples only on the last", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4, maxNumBatchedTokens: 8 });
      const { tokens } = await collect(engine, makeRequest(range(20), { maxTokens: 2 }));
      assert.deepEqual(tokens, [20, 21]);
      const rows = executor.steps.map((s) => [s.num_computed[0], s.num_new_tokens[0], s.sample[0]]);
      assert.deepEqual(rows, [
        [0, 8, 0],
        [8, 8, 0],
        [16, 4, 1],
        [20, 1, 1],
      ]);
      // Blocks are sent once, when assigned: 2 + 2 + 1 + 1 (position 20 opens block 5).
      assert.deepEqual(
        executor.steps.map((s) => Array.from(s.new_block_ids)),
        [[0, 1], [2, 3], [4], [5]],
      );
    });

    it("never exceeds the token budget or maxNumSeqs, and decodes come first", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 64, blockSize: 4, maxNumBatchedTokens: 10, maxNumSeqs: 3 });
      const runs = [];
      for (let i = 0; i < 7; i++) runs.push(collect(engine, makeRequest(range(5 + 3 * i, i), { maxTokens: 5 })));
      const results = await Promise.all(runs);
      for (const [i, r] of results.entries()) assert.deepEqual(r.tokens, range(5, 5 + 4 * i));
      for (const step of executor.steps) {
        assert.ok(step.req_ids.length <= 3, "maxNumSeqs");
        assert.ok(step.num_new_tokens.reduce((a, b) => a + b, 0) <= 10, "token budget");
        // Rows that continue a request (decodes, later chunks) precede newly added ones.
        const added = new Set(step.added.map((a) => a.req_id));
        let seenNew = false;
        for (const id of step.req_ids) {
          if (added.has(id)) seenNew = true;
          else assert.ok(!seenNew, `step ${step.step_id}: a running row after a new one`);
        }
      }
      engine.checkIntegrity();
      assert.equal(engine.stats.numUsedBlocks + engine.stats.numFreeBlocks, 64);
    });

    it("names each request on the wire by its own id, added once and removed once", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      const first = makeRequest([1], { maxTokens: 2 });
      const second = makeRequest([2], { maxTokens: 2 });
      await collect(engine, first);
      await collect(engine, second);
      const addedIds = executor.steps.flatMap((s) => s.added.map((a) => a.req_id));
      assert.deepEqual(addedIds, [first.id, second.id]);
      const rows = executor.steps.flatMap((s) => Array.from(s.req_ids));
      assert.ok(rows.every((id) => id === first.id || id === second.id));
      assert.deepEqual(executor.steps.flatMap((s) => Array.from(s.removed)).slice(0, 1), [first.id]);
      assert.equal(engine.stats.numRunning + engine.stats.numWaiting, 0);
    });
  });

  describe(`EngineCore: abort, failure, close (${mode})`, () => {
    it("an abort arriving mid-step applies after the step and frees the blocks", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { delayMs: 2 });
      const req = makeRequest(range(6), { maxTokens: 50 });
      executor.onStep = (step) => {
        if (step.step_id === 3) {
          engine.abort(req.id);
          // Still held: the step in flight may write into them.
          assert.ok(engine.stats.numUsedBlocks > 0);
        }
      };
      const { outputs, final } = await collect(engine, req);
      assert.equal(final.finishReason, "abort");
      assert.deepEqual(final.newTokenIds, []);
      // Sync: tokens from steps 0..2; the one sampled by step 3 is dropped. Async: step 3 is
      // sent while step 2 runs, so the abort lands after step 2 and its token is dropped too.
      assert.equal(outputs.length, asyncScheduling ? 3 : 4);
      assert.equal(engine.stats.numUsedBlocks, 0);
      engine.checkIntegrity();
      // The worker is told on the next step.
      executor.onStep = null;
      await collect(engine, makeRequest([1], { maxTokens: 1 }));
      assert.deepEqual(Array.from(executor.steps.at(-1)!.removed), [req.id]);
    });

    it("aborting a waiting request or an unknown id is harmless", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4, maxNumSeqs: 1 }, { delayMs: 1 });
      const a = collect(engine, makeRequest(range(4), { maxTokens: 3 }));
      const reqB = makeRequest(range(4), { maxTokens: 3 });
      const b = collect(engine, reqB);
      engine.abort(987654);
      engine.abort(reqB.id);
      engine.abort(reqB.id);
      assert.equal((await b).final.finishReason, "abort");
      assert.equal((await a).tokens.length, 3);
      engine.checkIntegrity();
    });

    it("a worker failure ends every live request with error; a new executor serves again", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { failAtStep: 2 });
      const runs = [collect(engine, makeRequest(range(4), { maxTokens: 10 })), collect(engine, makeRequest(range(4, 9), { maxTokens: 10 }))];
      const results = await Promise.all(runs);
      for (const r of results) {
        assert.equal(r.final.finishReason, "error");
        assert.match(r.final.error ?? "", /worker died/);
      }
      assert.equal(engine.stats.numUsedBlocks, 0);
      engine.checkIntegrity();
      engine.replaceExecutor(new FakeExecutor({ numBlocks: 16, blockSize: 4 }));
      const again = await collect(engine, makeRequest(range(4), { maxTokens: 3 }));
      assert.deepEqual(again.tokens, [4, 5, 6]);
    });

    it("replacing the executor mid-generation recomputes live requests on the new worker", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { delayMs: 1 });
      const next = new FakeExecutor({ numBlocks: 16, blockSize: 4 });
      executor.onStep = (step) => {
        if (step.step_id === 2) engine.replaceExecutor(next);
      };
      const { tokens, final } = await collect(engine, makeRequest(range(5), { maxTokens: 6 }));
      assert.deepEqual(tokens, range(6, 5));
      assert.equal(final.finishReason, "length");
      const resumed = next.steps[0]!.added[0]!;
      assert.equal(resumed.num_prompt_tokens, 5);
      assert.equal(resumed.token_ids.length, 5 + 3);
    });

    it("rejects requests that can never run, synchronously", () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 4, blockSize: 4, maxModelLen: 12 });
      const cb = (): void => assert.fail("no callback for a rejected request");
      assert.throws(() => submit(engine, makeRequest(range(13)), cb), RequestRejectedError);
      assert.throws(() => submit(engine, makeRequest([]), cb), /empty/);
      assert.throws(() => submit(engine, makeRequest([5000]), cb), /vocabulary/);
      assert.throws(() => submit(engine, makeRequest([1], { maxTokens: 0 }), cb), /maxTokens/);
      const small = makeEngine({ asyncScheduling, numBlocks: 2, blockSize: 4, maxModelLen: 100 }).engine;
      assert.throws(() => submit(small, makeRequest(range(9)), cb), /KV cache/);
      const req = makeRequest([1]);
      submit(small, req, () => {});
      assert.throws(() => submit(small, { ...req }, cb), /already running/);
    });

    it("close() aborts live requests and refuses new ones", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 }, { delayMs: 1 });
      const run = collect(engine, makeRequest(range(4), { maxTokens: 1000 }));
      await new Promise((resolve) => setTimeout(resolve, 5));
      await engine.close();
      const { final } = await run;
      assert.equal(final.finishReason, "abort");
      assert.match(final.error ?? "", /shutting down/);
      assert.throws(() => submit(engine, makeRequest([1]), () => {}), RequestRejectedError);
      engine.checkIntegrity();
    });

    it("a throwing callback does not stop the engine", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4 });
      submit(engine, makeRequest([1], { maxTokens: 3 }), () => {
        throw new Error("client bug");
      });
      const ok = await collect(engine, makeRequest([2], { maxTokens: 3 }));
      assert.deepEqual(ok.tokens, [3, 4, 5]);
    });

    it("records per-phase timings of each step", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 16, blockSize: 4, timingCapacity: 4 });
      await collect(engine, makeRequest([1], { maxTokens: 6 }));
      const recent = engine.timings.recent();
      assert.equal(recent.length, 4);
      assert.deepEqual(
        recent.map((t) => t.stepId),
        [2, 3, 4, 5],
      );
      for (const t of recent) {
        assert.equal(t.numRows, 1);
        assert.ok(t.scheduleMs >= 0 && t.buildMs >= 0 && t.roundTripMs >= 0 && t.processMs >= 0);
      }
    });
  });

  describe(`EngineCore: preemption and prefix caching (${mode})`, () => {
    async function runAll(numBlocks: number, prefix: boolean, prompts: number[][], maxTokens: number) {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks, blockSize: 4, maxNumBatchedTokens: 16, enablePrefixCaching: prefix });
      const results = await Promise.all(prompts.map((p) => collect(engine, makeRequest(p, { maxTokens }))));
      engine.checkIntegrity();
      return { engine, executor, results };
    }

    it("preempts under a tiny block pool; every request completes with the unpressured tokens", async () => {
      const prompts = Array.from({ length: 6 }, (_, i) => range(6 + i, 100 * i));
      const roomy = await runAll(256, false, prompts, 14);
      const tight = await runAll(8, false, prompts, 14);
      assert.ok(tight.engine.stats.numPreemptions > 0, "expected preemptions");
      assert.equal(roomy.engine.stats.numPreemptions, 0);
      for (let i = 0; i < prompts.length; i++) {
        assert.deepEqual(tight.results[i]!.tokens, roomy.results[i]!.tokens);
        assert.equal(tight.results[i]!.final.finishReason, "length");
      }
      // A resumed request comes back with its outputs so far after its original prompt.
      const resumed = tight.executor.steps.flatMap((s) => s.added).filter((a) => a.token_ids.length > a.num_prompt_tokens);
      assert.ok(resumed.length > 0);
      for (const a of resumed) {
        const i = prompts.findIndex((p) => p.length === a.num_prompt_tokens && p[0] === a.token_ids[0]);
        assert.ok(i >= 0);
        const expected = [...prompts[i]!, ...roomy.results[i]!.tokens].slice(0, a.token_ids.length);
        assert.deepEqual(Array.from(a.token_ids), expected);
      }
      assert.equal(tight.engine.stats.numUsedBlocks, 0);
    });

    it("preemption with prefix caching on gives the same tokens", async () => {
      const shared = range(8, 500);
      const prompts = Array.from({ length: 6 }, (_, i) => [...shared, ...range(3 + i, 10 * i)]);
      const roomy = await runAll(256, true, prompts, 12);
      const tight = await runAll(9, true, prompts, 12);
      assert.ok(tight.engine.stats.numPreemptions > 0);
      for (let i = 0; i < prompts.length; i++) assert.deepEqual(tight.results[i]!.tokens, roomy.results[i]!.tokens);
    });

    it("serves a repeated prefix from the cache and reports numCachedTokens", async () => {
      const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4 });
      const system = range(10, 300);
      const first = await collect(engine, makeRequest([...system, 1, 2], { maxTokens: 2 }));
      assert.equal(first.final.numCachedTokens, 0);
      const second = await collect(engine, makeRequest([...system, 7, 8, 9], { maxTokens: 2 }));
      // Two full blocks (8 tokens) of the shared 10 are cached.
      assert.equal(second.final.numCachedTokens, 8);
      assert.deepEqual(second.tokens, [10, 11]);
      const firstRow = executor.steps.find((s) => s.added.length > 0 && s.step_id > 0)!;
      assert.equal(firstRow.num_computed[0], 8);
      assert.equal(firstRow.num_new_tokens[0], 5);
      assert.equal(firstRow.new_block_counts[0], 4);
      // Same prompt again: the hit stops one token short so the last token is computed.
      const same = await collect(engine, makeRequest([...system, 7, 8, 9], { maxTokens: 1 }));
      assert.equal(same.final.numCachedTokens, 12);
      assert.equal(engine.stats.numPrefixHitTokens, 20);
      engine.checkIntegrity();
    });

    it("caps the hit at prompt length - 1 on a block-aligned prompt", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4 });
      const prompt = range(8, 40);
      await collect(engine, makeRequest(prompt, { maxTokens: 1 }));
      const again = await collect(engine, makeRequest(prompt, { maxTokens: 3 }));
      assert.equal(again.final.numCachedTokens, 4);
      assert.deepEqual(again.tokens, [48, 49, 50]);
    });

    it("shares cached blocks between concurrent requests and leaves no leak", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4 });
      const system = range(16, 700);
      await collect(engine, makeRequest([...system, 1], { maxTokens: 1 }));
      const outs: RequestOutput[] = [];
      const runs = Array.from({ length: 4 }, (_, i) => collect(engine, makeRequest([...system, i + 2], { maxTokens: 5 })));
      for (const r of await Promise.all(runs)) outs.push(r.final);
      assert.ok(outs.every((o) => o.numCachedTokens === 16));
      assert.equal(engine.stats.numUsedBlocks, 0);
      assert.ok(engine.stats.numCachedBlocks > 0);
      engine.checkIntegrity();
    });

    it("with prefix caching off, nothing is cached", async () => {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 32, blockSize: 4, enablePrefixCaching: false });
      const prompt = range(12, 40);
      await collect(engine, makeRequest(prompt, { maxTokens: 1 }));
      const again = await collect(engine, makeRequest(prompt, { maxTokens: 1 }));
      assert.equal(again.final.numCachedTokens, 0);
      assert.equal(engine.stats.numCachedBlocks, 0);
    });
  });
}

describe("EngineCore: overlap scheduling", () => {
  const mix = () => [
    makeRequest(range(5), { maxTokens: 8 }), // length, mid-batch
    makeRequest(range(10, 3), { eosTokenIds: [16], maxTokens: 30 }), // outputs 13 14 15 16: EOS
    makeRequest(range(20, 7), { stopTokenIds: [29], maxTokens: 30 }), // outputs 27 28 29: stop token id
    makeRequest(range(40, 2), { maxTokens: 1 }),
    makeRequest(range(9, 1), { maxTokens: 12, eosTokenIds: [5], minTokens: 20 }),
    makeRequest(range(30, 50), { maxTokens: 6 }),
  ];

  async function run(asyncScheduling: boolean) {
    const { engine, executor } = makeEngine({ asyncScheduling, numBlocks: 64, blockSize: 4, maxNumBatchedTokens: 24 }, { delayMs: 1 });
    const results = await Promise.all(mix().map((r) => collect(engine, r)));
    engine.checkIntegrity();
    assert.equal(engine.stats.numUsedBlocks, 0);
    const sampledRows = executor.steps.reduce((n, s) => n + s.sample.reduce((a, b) => a + b, 0), 0);
    return { results, executor, sampledRows };
  }

  it("gives the outputs of sync scheduling with two steps in flight; a token sampled after a stop is dropped", async () => {
    const on = await run(true);
    const off = await run(false);
    const summary = (r: Awaited<ReturnType<typeof run>>) =>
      r.results.map((c) => [c.tokens, c.final.finishReason, c.final.stopTokenId, c.outputs.filter((o) => o.finished).length]);
    assert.deepEqual(summary(on), summary(off));
    assert.deepEqual(on.results[1]!.tokens, [13, 14, 15, 16]);
    assert.deepEqual(on.results[2]!.tokens, [27, 28, 29]);
    assert.equal(on.executor.maxQueued, 2);
    assert.equal(off.executor.maxQueued, 1);
    // Sync samples exactly what it emits; async also ran the stopped requests' next rows (EOS, stop id) and dropped them.
    const emitted = on.results.reduce((n, c) => n + c.tokens.length, 0);
    assert.equal(off.sampledRows, emitted);
    assert.equal(on.sampledRows, emitted + 2);
  });

  it("keeps the same outputs under KV pressure and preemption with two steps in flight", async () => {
    const reqs = () => Array.from({ length: 8 }, (_, i) => makeRequest(range(6 + i, 10 * i), { maxTokens: 12, stopTokenIds: i % 3 === 0 ? [10 * i + 6 + i + 7] : [] }));
    const outputs = [];
    for (const asyncScheduling of [true, false]) {
      const { engine } = makeEngine({ asyncScheduling, numBlocks: 12, blockSize: 4, maxNumBatchedTokens: 16 }, { delayMs: 0 });
      const results = await Promise.all(reqs().map((r) => collect(engine, r)));
      assert.ok(engine.stats.numPreemptions > 0, "preempted");
      engine.checkIntegrity();
      assert.equal(engine.stats.numUsedBlocks, 0);
      outputs.push(results.map((c) => [c.tokens, c.final.finishReason]));
    }
    assert.deepEqual(outputs[0], outputs[1]);
  });

  it("records per-step timings for both steps in flight", async () => {
    const { engine } = makeEngine({ numBlocks: 16, blockSize: 4 }, { delayMs: 1 });
    await collect(engine, makeRequest(range(4), { maxTokens: 5 }));
    const timings = engine.timings.recent();
    assert.equal(timings.length, engine.stats.numSteps);
    assert.deepEqual(
      timings.map((t) => t.stepId),
      timings.map((_, i) => i),
    );
  });
});
