// Property test: random sequences of submit / abort / step / worker failure
// against a real EngineCore with a tiny block pool and a gated fake worker.
// After every operation the block bookkeeping must be consistent; at the end
// every request has ended exactly once, finished requests carry exactly the
// tokens an unconstrained run gives, and every block is back in the pool.

import assert from "node:assert/strict";
import { setImmediate as tick } from "node:timers/promises";
import { describe, it } from "node:test";
import fc from "fast-check";
import { RequestRejectedError, type EngineCore } from "../../src/engine/engine-core.js";
import type { StepMessage, StepResultMessage } from "../../src/transport/messages.js";
import type { RequestOutput } from "../../src/engine/types.js";
import { FakeExecutor, makeRequest, range } from "./fake-executor.js";
import { newEngineCore, submit } from "./helpers.js";

const VOCAB = 20;

/** A fake worker whose steps finish only when the test says so, oldest first (two are queued with overlap). */
class GatedExecutor extends FakeExecutor {
  private readonly pending: { step: StepMessage; resolve: (r: StepResultMessage) => void; reject: (e: Error) => void }[] = [];
  maxPending = 0;
  violation: Error | null = null;

  get hasPending(): boolean {
    return this.pending.length > 0;
  }

  override executeStep(step: StepMessage): Promise<StepResultMessage> {
    return new Promise((resolve, reject) => {
      this.pending.push({ step, resolve, reject });
      this.maxPending = Math.max(this.maxPending, this.pending.length);
    });
  }

  /** Runs (or fails) the oldest step; a dead worker fails the steps queued behind it too. */
  release(fail: boolean): void {
    const p = this.pending.shift();
    if (p === undefined) return;
    if (fail) {
      p.reject(new Error("worker died"));
      for (const rest of this.pending.splice(0)) rest.reject(new Error("worker died"));
      return;
    }
    try {
      p.resolve(this.compute(p.step));
    } catch (error) {
      // The fake worker refused the step: the engine sent something inconsistent.
      this.violation ??= error as Error;
      p.reject(error as Error);
    }
  }
}

type Op =
  | { kind: "submit"; prefix: number; prefixLen: number; tail: number[]; maxTokens: number; eos: boolean; priority: number }
  | { kind: "abort"; index: number }
  | { kind: "step" }
  | { kind: "fail" };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    arbitrary: fc.record({
      kind: fc.constant("submit" as const),
      prefix: fc.integer({ min: 0, max: 2 }),
      prefixLen: fc.integer({ min: 0, max: 9 }),
      tail: fc.array(fc.integer({ min: 0, max: VOCAB - 1 }), { maxLength: 6 }),
      maxTokens: fc.integer({ min: 1, max: 10 }),
      eos: fc.boolean(),
      priority: fc.integer({ min: 0, max: 2 }),
    }),
    weight: 15,
  },
  { arbitrary: fc.record({ kind: fc.constant("abort" as const), index: fc.nat() }), weight: 5 },
  { arbitrary: fc.constant({ kind: "step" as const }), weight: 30 },
  { arbitrary: fc.constant({ kind: "fail" as const }), weight: 1 },
);

const configArb = fc.record({
  numBlocks: fc.integer({ min: 3, max: 10 }),
  blockSize: fc.constantFrom(1, 2, 4),
  maxNumBatchedTokens: fc.integer({ min: 1, max: 12 }),
  maxNumSeqs: fc.integer({ min: 1, max: 4 }),
  maxModelLen: fc.integer({ min: 6, max: 40 }),
  enablePrefixCaching: fc.boolean(),
  asyncScheduling: fc.boolean(),
});

const PREFIXES = [range(9, 3, VOCAB), range(9, 11, VOCAB)];

/** Lets the engine process a released step and send the next one(s), or go idle. */
async function settle(engine: EngineCore, executor: GatedExecutor): Promise<void> {
  for (let i = 0; i < 4; i++) await tick();
  const s = engine.stats;
  if (!executor.hasPending && s.numRunning + s.numWaiting > 0) assert.fail("the engine has live requests but sent no step");
}

type Config = typeof configArb extends fc.Arbitrary<infer T> ? T : never;

async function runScenario(config: Config, ops: Op[]): Promise<void> {
    const executor = new GatedExecutor({ numBlocks: config.numBlocks, blockSize: config.blockSize, vocabSize: VOCAB });
    executor.keepSteps = false;
    const engine = newEngineCore(executor, config);
    const maxLen = Math.min(config.maxModelLen, config.numBlocks * config.blockSize + 1);
    const submitted: { id: number; prompt: number[]; maxTokens: number; eos: number | null; outputs: RequestOutput[] }[] = [];

    const apply = async (op: Op): Promise<void> => {
      switch (op.kind) {
        case "submit": {
          let prompt = [...PREFIXES[op.prefix % 2]!.slice(0, op.prefix === 2 ? 0 : op.prefixLen), ...op.tail];
          if (prompt.length === 0) prompt = [1];
          const eos = op.eos ? (prompt.at(-1)! + 3) % VOCAB : null;
          const req = makeRequest(prompt, { maxTokens: op.maxTokens, eosTokenIds: eos === null ? [] : [eos] }, { priority: op.priority });
          const entry = { id: req.id, prompt, maxTokens: op.maxTokens, eos, outputs: [] as RequestOutput[] };
          try {
            submit(engine, req, (o) => entry.outputs.push(o));
            submitted.push(entry);
          } catch (error) {
            assert.ok(error instanceof RequestRejectedError);
            assert.ok(prompt.length > config.maxModelLen || prompt.length > config.numBlocks * config.blockSize);
          }
          await settle(engine, executor);
          break;
        }
        case "abort":
          if (submitted.length > 0) engine.abort(submitted[op.index % submitted.length]!.id);
          break;
        case "step":
        case "fail":
          executor.release(op.kind === "fail");
          await settle(engine, executor);
          break;
      }
      engine.checkIntegrity();
    };

    for (const op of ops) await apply(op);
    // Drain: every live request must end in bounded time.
    for (let i = 0; i < 2000 && executor.hasPending; i++) {
      executor.release(false);
      await settle(engine, executor);
      engine.checkIntegrity();
    }
    assert.equal(executor.hasPending, false, "drained");
    assert.equal(executor.violation, null, "the fake worker accepted every step");
    assert.ok(executor.maxPending <= (config.asyncScheduling ? 2 : 1), "steps in flight");

    const stats = engine.stats;
    assert.equal(stats.numRunning + stats.numWaiting, 0);
    assert.equal(stats.numUsedBlocks, 0);
    assert.equal(stats.numFreeBlocks, config.numBlocks);
    for (const entry of submitted) {
      const ends = entry.outputs.filter((o) => o.finished);
      assert.equal(ends.length, 1, `request ${entry.id} ended ${ends.length} times`);
      assert.equal(entry.outputs.at(-1), ends[0]);
      const tokens = entry.outputs.flatMap((o) => o.newTokenIds);
      const expected = range(tokens.length, entry.prompt.at(-1)! + 1, VOCAB);
      assert.deepEqual(tokens, expected, `request ${entry.id} tokens`);
      // A prompt of exactly maxLen still gets its one token.
      assert.ok(tokens.length <= entry.maxTokens && entry.prompt.length + tokens.length <= Math.max(maxLen, entry.prompt.length + 1));
      const end = ends[0]!;
      if (end.finishReason === "length") {
        assert.ok(tokens.length === entry.maxTokens || entry.prompt.length + tokens.length >= maxLen);
      } else if (end.finishReason === "stop") {
        assert.equal(end.stopTokenId, entry.eos);
        assert.equal(tokens.at(-1), entry.eos);
      }
    }
    await engine.close();
}

describe("EngineCore property", () => {
  it("keeps KV bookkeeping consistent and loses nothing under random submit/abort/step/failure", async () => {
    await fc.assert(
      fc.asyncProperty(configArb, fc.array(opArb, { minLength: 5, maxLength: 80, size: "medium" }), async (config, ops) => {
        try {
          await runScenario(config, ops);
        } catch (error) {
          if (process.env.DEBUG_PROPERTY) console.error(error);
          throw error;
        }
      }),
      {
        numRuns: Number(process.env.PROPERTY_RUNS ?? 300),
        // Replay a failure: PROPERTY_SEED=<seed> PROPERTY_PATH=<path> (DEBUG_PROPERTY=1 prints the error).
        ...(process.env.PROPERTY_SEED === undefined ? {} : { seed: Number(process.env.PROPERTY_SEED), path: process.env.PROPERTY_PATH, endOnFailure: true }),
      },
    );
  });
});
