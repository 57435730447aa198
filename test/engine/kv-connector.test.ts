// The KV connector's scheduler half (src/kv-connector/disaggregated-core.ts
// with the engine cores' producer/consumer paths) over two fake workers whose
// fake KV caches check every context position: a load that copied the wrong
// blocks, a prefill block freed and reused before its transfer, or a decode
// block written by a late load after its request ended fails the step. The
// "transport" copies the sender's blocks when the decode worker's step with
// the load comes back, so the prefill side must still hold them then.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { EngineConfig } from "../../src/engine/engine-core.js";
import type { EngineRequest, RequestOutput } from "../../src/engine/types.js";
import type { StepExecutor } from "../../src/worker/types.js";
import { DisaggregatedCore, type KvSendLane } from "../../src/kv-connector/disaggregated-core.js";
import type { KvTransfer, StepMessage, StepResultMessage } from "../../src/transport/messages.js";
import { FakeExecutor, makeRequest, range } from "./fake-executor.js";
import { OutputProcessor } from "../../src/engine-host/output-processor.js";
import { routeOutputs, submit } from "./helpers.js";

const BLOCK = 4;

class PrefillLane implements KvSendLane {
  readonly rank = 0;
  readonly sends = new Map<number, KvTransfer>();
  pendingSends: KvTransfer[] = [];
  constructor(readonly fake: FakeExecutor) {}
  get ready() {
    return this.fake.ready;
  }
  addKvSends(sends: readonly KvTransfer[]): void {
    for (const s of sends) this.sends.set(s.transfer_id, s);
  }
  executeStep(step: StepMessage): Promise<StepResultMessage> {
    return this.fake.executeStep(step);
  }
}

/** The decode worker: a fake plus the receiving end of the transfers. */
class DecodeLane implements KvSendLane, StepExecutor {
  readonly rank = 1;
  private readonly loads = new Map<number, KvTransfer>();
  private readonly cancelled = new Set<number>();
  numLoads = 0;
  constructor(
    readonly fake: FakeExecutor,
    private readonly prefill: PrefillLane,
    /** Load ordinals (1-based) that fail. */
    private readonly failing: ReadonlySet<number> = new Set(),
  ) {}
  get ready() {
    return this.fake.ready;
  }
  addKvSends(): void {
    throw new Error("the decode side sends nothing");
  }
  async executeStep(step: StepMessage): Promise<StepResultMessage> {
    for (const id of step.kv?.cancels ?? []) this.cancelled.add(id);
    for (const load of step.kv?.loads ?? []) this.loads.set(load.transfer_id, load);
    const result = await this.fake.executeStep(step);
    const loaded: number[] = [];
    const failed: number[] = [];
    for (const [id, load] of this.loads) {
      const send = this.prefill.sends.get(id);
      if (send === undefined) continue;
      this.loads.delete(id);
      const ordinal = ++this.numLoads;
      assert.equal(send.block_ids.length, load.block_ids.length);
      if (this.cancelled.has(id) || this.failing.has(ordinal)) failed.push(id);
      else {
        this.fake.copyBlocksFrom(this.prefill.fake, send.block_ids, load.block_ids);
        loaded.push(id);
      }
    }
    return {
      ...result,
      kv_loaded: Int32Array.from(loaded),
      kv_load_failed: Int32Array.from(failed),
      kv_load_errors: failed.map(() => "failed (fake)"),
      kv_bytes: loaded.length * 100,
    };
  }
}

function config(numBlocks: number): EngineConfig {
  return { maxNumSeqs: 8, maxNumBatchedTokens: 6, maxModelLen: 4096, blockSize: BLOCK, numBlocks };
}

function setup(failing: ReadonlySet<number> = new Set()) {
  const prefillFake = new FakeExecutor({ numBlocks: 64, blockSize: BLOCK, delayMs: 1 });
  const decodeFake = new FakeExecutor({ numBlocks: 64, blockSize: BLOCK, delayMs: 1 });
  const prefill = new PrefillLane(prefillFake);
  const decode = new DecodeLane(decodeFake, prefill, failing);
  const outputs = new OutputProcessor(false);
  const pd = new DisaggregatedCore({ prefill: { lane: prefill, config: config(64) }, decode: { lane: decode, config: config(64) }, onOutputs: (batch) => outputs.process(batch) });
  routeOutputs(pd, outputs);
  return { pd, decode };
}

function run(pd: DisaggregatedCore, req: EngineRequest, abortAfter = Infinity): Promise<{ tokens: number[]; outputs: RequestOutput[] }> {
  return new Promise((resolve) => {
    const tokens: number[] = [];
    const outputs: RequestOutput[] = [];
    submit(pd, req, (out) => {
      outputs.push(out);
      tokens.push(...out.newTokenIds);
      if (!out.finished && tokens.length >= abortAfter) queueMicrotask(() => pd.abort(req.id));
      if (out.finished) resolve({ tokens, outputs });
    });
  });
}

/** The fake worker's greedy continuation: each token is the last one plus one. */
function expected(prompt: number[], n: number): number[] {
  return Array.from({ length: n }, (_, i) => (prompt[prompt.length - 1]! + 1 + i) % 1000);
}

function assertAllFree(pd: DisaggregatedCore): void {
  const s = pd.stats;
  assert.equal(s.numUsedBlocks, 0, "decode blocks in use");
  assert.equal(s.prefillKv?.numHeldBlocks, 0, "prefill blocks held");
  assert.equal(pd.prefill.stats.numUsedBlocks, 0, "prefill blocks in use");
  pd.checkIntegrity();
}

describe("KV connector: prefill on one engine core, decode on another", () => {
  it("requests prefill on one side, load their KV and decode on the other: same tokens, blocks freed on both", async () => {
    const { pd, decode } = setup();
    const prompts = [range(3, 10), range(9, 100), range(17, 200), range(4, 300), range(12, 400)];
    const results = await Promise.all(prompts.map((p) => run(pd, makeRequest(p, { maxTokens: 7 }))));
    results.forEach((r, i) => {
      assert.deepEqual(r.tokens, expected(prompts[i]!, 7));
      assert.equal(r.outputs.at(-1)!.finishReason, "length");
      assert.equal(r.outputs.filter((o) => o.finished).length, 1);
    });
    assert.equal(decode.numLoads, prompts.length);
    assert.equal(pd.stats.numKvTransferBytes, prompts.length * 100);
    assertAllFree(pd);
    // The same prompt again: the prefill side's prefix cache serves it, the decode side's too (no load needed past it).
    const again = await run(pd, makeRequest(range(17, 200), { maxTokens: 3 }));
    assert.deepEqual(again.tokens, expected(range(17, 200), 3));
    assert.ok(again.outputs.at(-1)!.numCachedTokens > 0);
    assertAllFree(pd);
    await pd.close();
  });

  it("a failed load is recomputed on the decode side", async () => {
    const { pd } = setup(new Set([1, 3]));
    const prompts = [range(10, 10), range(13, 50), range(7, 90)];
    const results = await Promise.all(prompts.map((p) => run(pd, makeRequest(p, { maxTokens: 5 }))));
    results.forEach((r, i) => assert.deepEqual(r.tokens, expected(prompts[i]!, 5)));
    assert.equal(pd.kvLoadFailures, 2);
    assertAllFree(pd);
    await pd.close();
  });

  it("requests aborted at every stage free their blocks on both sides", async () => {
    const { pd } = setup();
    const runs: Promise<unknown>[] = [];
    for (let i = 0; i < 40; i++) {
      const req = makeRequest(range(3 + (i % 15), i * 7), { maxTokens: 6 });
      const p = run(pd, req, i % 4 === 0 ? Infinity : i % 3);
      runs.push(p);
      // Some leave before any token: during prefill, or while their KV loads.
      if (i % 5 === 1) setTimeout(() => pd.abort(req.id), i % 3);
    }
    await Promise.all(runs);
    await new Promise((resolve) => setTimeout(resolve, 20));
    assertAllFree(pd);
    await pd.close();
  });

  it("max_tokens 1 and a stop token on the first token end on the prefill side", async () => {
    const { pd, decode } = setup();
    const one = await run(pd, makeRequest(range(5, 10), { maxTokens: 1 }));
    assert.deepEqual(one.tokens, [15]);
    const eos = await run(pd, makeRequest(range(5, 10), { eosTokenIds: [15], maxTokens: 8 }));
    assert.deepEqual([eos.tokens, eos.outputs.at(-1)!.finishReason], [[15], "stop"]);
    assert.equal(decode.numLoads, 0);
    assertAllFree(pd);
    await pd.close();
  });
});
