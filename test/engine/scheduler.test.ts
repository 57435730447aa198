import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { BlockManager } from "../../src/engine/block-manager.js";
import { Request } from "../../src/engine/request.js";
import { Scheduler, type SchedulerOutput } from "../../src/engine/scheduler.js";
import { buildStepMessage } from "../../src/engine/step-builder.js";
import type { SchedulerConfig } from "../../src/engine/types.js";
import { makeRequest, range } from "./fake-executor.js";

function setup(config: Partial<SchedulerConfig> = {}, prefix = false) {
  const full: SchedulerConfig = { maxNumSeqs: 8, maxNumBatchedTokens: 64, maxModelLen: 1024, blockSize: 4, numBlocks: 32, ...config };
  const kv = new BlockManager(full.numBlocks, full.blockSize, prefix);
  return { scheduler: new Scheduler(full, kv), kv };
}

function add(scheduler: Scheduler, prompt: number[], priority = 0): Request {
  const request = new Request(makeRequest(prompt, {}, { priority }));
  scheduler.addRequest(request);
  return request;
}

/** What the engine does after a step: sampled rows get a token, computed blocks are committed. */
function finishStep(scheduler: Scheduler, out: SchedulerOutput): void {
  scheduler.updateAfterStep(out);
  out.requests.forEach((request, i) => {
    if (out.sample[i] === 1) request.appendOutputToken(7);
  });
}

function rows(out: SchedulerOutput): [number, number, number][] {
  return out.requests.map((r, i) => [r.id, out.numComputedBefore[i]!, out.numNewTokens[i]!]);
}

describe("Scheduler", () => {
  it("schedules decodes and continuing chunks before admitting waiting requests", () => {
    const { scheduler } = setup({ maxNumBatchedTokens: 8 });
    const a = add(scheduler, range(3));
    const b = add(scheduler, range(10));
    let out = scheduler.schedule();
    // a's whole prompt (samples), then a chunk of b (does not sample).
    assert.deepEqual(rows(out), [
      [a.id, 0, 3],
      [b.id, 0, 5],
    ]);
    assert.deepEqual(out.sample, [1, 0]);
    finishStep(scheduler, out);
    const c = add(scheduler, range(20));
    out = scheduler.schedule();
    assert.deepEqual(rows(out), [
      [a.id, 3, 1],
      [b.id, 5, 5],
      [c.id, 0, 2],
    ]);
    assert.deepEqual(out.sample, [1, 1, 0]);
    assert.deepEqual(out.added, [c]);
  });

  it("respects maxNumSeqs and admits in FCFS order within a priority, better priority first", () => {
    const { scheduler } = setup({ maxNumSeqs: 2 });
    const a = add(scheduler, range(3));
    const b = add(scheduler, range(3));
    const urgent = add(scheduler, range(3), -1);
    const out = scheduler.schedule();
    assert.deepEqual(out.requests, [urgent, a]);
    assert.equal(scheduler.numWaiting, 1);
    assert.equal(b.status, "waiting");
  });

  it("preempts the newest running request when blocks run out, and re-queues it at the front", () => {
    // 4 blocks of 4: a and b each hold 2 blocks after their 8-token prompts.
    const { scheduler, kv } = setup({ numBlocks: 4 });
    const a = add(scheduler, range(8));
    const b = add(scheduler, range(8, 100));
    const c = add(scheduler, range(2, 200));
    let out = scheduler.schedule();
    assert.deepEqual(out.requests, [a, b]);
    finishStep(scheduler, out);
    // Both need a third block for position 8; only b can give blocks back.
    out = scheduler.schedule();
    assert.deepEqual(out.requests, [a]);
    assert.deepEqual(out.preempted, [b]);
    assert.deepEqual(out.removed, [b.id]);
    assert.equal(b.numComputedTokens, 0);
    assert.equal(b.onWorker, false);
    assert.deepEqual(b.blockIds, []);
    assert.deepEqual(scheduler.waiting, [b, c]);
    assert.equal(scheduler.numPreemptions, 1);
    kv.checkIntegrity();
    // No admissions in a preempting step; b is re-added later with its output so far.
    assert.deepEqual(out.added, []);
    finishStep(scheduler, out);
    scheduler.finishRequest(a);
    out = scheduler.schedule();
    assert.equal(out.requests[0], b);
    assert.equal(out.added[0], b);
    assert.equal(out.numNewTokens[0], 9);
    const step = buildStepMessage(out, 5);
    assert.equal(step.added[0]!.num_prompt_tokens, 8);
    assert.deepEqual(Array.from(step.added[0]!.token_ids), [...range(8, 100), 7]);
  });

  it("under priorities, preempts the worst priority even if it was scheduled earlier in the step", () => {
    const { scheduler, kv } = setup({ numBlocks: 4 });
    const low = add(scheduler, range(8), 5);
    const high = add(scheduler, range(8, 100), 0);
    // Priority order admits high first, then low.
    let out = scheduler.schedule();
    assert.deepEqual(out.requests, [high, low]);
    finishStep(scheduler, out);
    out = scheduler.schedule();
    assert.deepEqual(out.requests, [high]);
    assert.deepEqual(out.preempted, [low]);
    assert.equal(out.numScheduledTokens, 1);
    kv.checkIntegrity();
  });

  it("a lone request that cannot grow preempts itself only when others hold the blocks", () => {
    const { scheduler, kv } = setup({ numBlocks: 3, maxNumBatchedTokens: 64 });
    const a = add(scheduler, range(4));
    const b = add(scheduler, range(7, 50));
    let out = scheduler.schedule();
    finishStep(scheduler, out);
    // a needs a 2nd block (position 4); b holds 2 of 3 blocks and is newer: b goes.
    out = scheduler.schedule();
    assert.deepEqual(out.preempted, [b]);
    assert.deepEqual(out.requests, [a]);
    assert.equal(a.blockIds.length, 2);
    kv.checkIntegrity();
  });

  it("finished requests leave the queues and are removed from the worker in the next step", () => {
    const { scheduler, kv } = setup();
    const a = add(scheduler, range(3));
    let out = scheduler.schedule();
    assert.deepEqual(out.added, [a]);
    finishStep(scheduler, out);
    assert.equal(a.onWorker, true);
    scheduler.finishRequest(a);
    assert.equal(scheduler.finishRequest(a), false);
    const b = add(scheduler, range(3));
    out = scheduler.schedule();
    assert.deepEqual(out.removed, [a.id]);
    assert.deepEqual(out.added, [b]);
    assert.equal(a.onWorker, false);
    assert.equal(scheduler.numRunning, 1);
    kv.checkIntegrity();
  });
});

describe("step builder", () => {
  it("sends tokens and blocks once, as deltas, in one buffer", () => {
    const { scheduler } = setup({ maxNumBatchedTokens: 6 });
    const a = add(scheduler, range(10));
    let out = scheduler.schedule();
    let step = buildStepMessage(out, 0);
    assert.equal(step.added.length, 1);
    assert.deepEqual(Array.from(step.added[0]!.token_ids), range(10));
    assert.deepEqual(Array.from(step.new_block_counts), [2]);
    assert.deepEqual(Array.from(step.new_block_ids), [0, 1]);
    assert.equal(step.req_ids.buffer, step.new_block_ids.buffer);
    finishStep(scheduler, out);
    out = scheduler.schedule();
    step = buildStepMessage(out, 1);
    assert.deepEqual(step.added, []);
    assert.deepEqual([step.num_computed[0], step.num_new_tokens[0], step.sample[0]], [6, 4, 1]);
    assert.deepEqual(Array.from(step.new_block_ids), [2]);
    finishStep(scheduler, out);
    out = scheduler.schedule();
    step = buildStepMessage(out, 2);
    // Position 10 still fits block 2: nothing new to send.
    assert.deepEqual(Array.from(step.new_block_counts), [0]);
    assert.equal(a.numSentBlocks, 3);
  });

  describe("LoRA adapters", () => {
    function addLora(scheduler: Scheduler, prompt: number[], loraId: number): Request {
      const request = new Request(makeRequest(prompt, {}, { loraId }));
      scheduler.addRequest(request);
      return request;
    }

    it("runs at most maxLoras distinct adapters at once, passing over a request of another adapter rather than waiting on it", () => {
      const { scheduler } = setup({ maxLoras: 2 });
      const a1 = addLora(scheduler, range(3), 1);
      const a2 = addLora(scheduler, range(3), 2);
      const a3 = addLora(scheduler, range(3), 3);
      const base = addLora(scheduler, range(3), 0);
      const again1 = addLora(scheduler, range(3), 1);
      let out = scheduler.schedule();
      // Adapter 3 would be a third: it waits, and the base request and adapter 1's second request go ahead of it.
      assert.deepEqual(out.requests, [a1, a2, base, again1]);
      assert.deepEqual(out.added.map((r) => r.loraId), [1, 2, 0, 1]);
      finishStep(scheduler, out);
      out = scheduler.schedule();
      assert.ok(!out.requests.includes(a3), "a third adapter never joins while two run");
      finishStep(scheduler, out);
      scheduler.finishRequest(a2);
      out = scheduler.schedule();
      assert.deepEqual(out.added, [a3], "adapter 3 runs once adapter 2's last request ended");
      const step = buildStepMessage(out, 9);
      assert.equal(step.added[0]!.lora_id, 3);
      assert.equal(step.lora, null, "the adapters' loads ride on the engine's steps, not the scheduler's");
    });

    it("never serves one adapter's prompt from another adapter's (or the base model's) cached blocks", () => {
      const { scheduler, kv } = setup({ maxLoras: 4 }, true);
      const prompt = range(13);
      const base = addLora(scheduler, prompt, 0);
      const one = addLora(scheduler, prompt, 1);
      finishStep(scheduler, scheduler.schedule());
      assert.equal(base.numComputedTokens, 13);
      assert.equal(one.numComputedTokens, 13);
      const sameAdapter = new Request(makeRequest(prompt, {}, { loraId: 1 }));
      const otherAdapter = new Request(makeRequest(prompt, {}, { loraId: 2 }));
      const baseAgain = new Request(makeRequest(prompt, {}, {}));
      assert.deepEqual(kv.findCachedPrefix(sameAdapter), one.blockIds.slice(0, 3));
      assert.deepEqual(kv.findCachedPrefix(baseAgain), base.blockIds.slice(0, 3));
      assert.deepEqual(kv.findCachedPrefix(otherAdapter), []);
      assert.notDeepEqual(one.blockIds.slice(0, 3), base.blockIds.slice(0, 3));
    });
  });

  describe("speculative decoding", () => {
    it("gives a decode row its drafts within the budget and max_tokens, counts only accepted ones as computed", () => {
      const { scheduler, kv } = setup({ numSpeculativeTokens: 3, maxNumBatchedTokens: 64 });
      const a = new Request(makeRequest(range(6), { maxTokens: 5 }));
      scheduler.addRequest(a);
      finishStep(scheduler, scheduler.schedule()); // prefill, one token sampled
      assert.equal(a.numComputedTokens, 6);
      a.draftIds = [11, 12, 13, 14];
      let out = scheduler.schedule();
      // The last sampled token and three drafts (K = 3), blocks for all of them.
      assert.deepEqual(rows(out), [[a.id, 6, 4]]);
      assert.deepEqual(out.numDrafts, [3]);
      assert.deepEqual(out.draftIds, [11, 12, 13]);
      assert.equal(a.blockIds.length, kv.blocksFor(10));
      assert.equal(a.numComputedTokens, 7, "only the known token counts before the result");
      const step = buildStepMessage(out, 4);
      assert.deepEqual(Array.from(step.spec!.draft_counts), [3]);
      assert.deepEqual(Array.from(step.spec!.draft_ids), [11, 12, 13]);
      assert.deepEqual(a.draftIds, [], "proposals are used once");
      scheduler.acceptDrafts(out, 0, 2);
      scheduler.updateAfterStep(out);
      for (const t of [11, 12, 40]) a.appendOutputToken(t);
      scheduler.commitDrafts(out);
      assert.equal(a.numComputedTokens, 9);
      // Four outputs so far, max_tokens 5: no room for a draft (the token after it would be the sixth).
      a.draftIds = [1, 2];
      out = scheduler.schedule();
      assert.deepEqual(rows(out), [[a.id, 9, 1]]);
            assert.equal(buildStepMessage(out, 5).spec, null);
    });
  });
});
