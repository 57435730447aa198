// Request migration in the engine core: when the worker behind the executor
// dies, live requests are recomputed on the next worker and their outputs
// continue exactly (the fake worker's tokens depend only on a request's
// tokens, so any schedule must give the undisturbed output); past
// maxRequestMigrations they end with "abort" and the reason; a request that
// kills the worker every time it is added fails alone; nothing leaks.
// The worker processes themselves are covered by test/reliability.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { RequestRejectedError, type EngineConfig, type EngineCore } from "../../src/engine/engine-core.js";
import { ExecutorLostError, type StepExecutor } from "../../src/worker/types.js";
import type { StepMessage, StepResultMessage } from "../../src/transport/messages.js";
import { FakeExecutor, makeRequest, range } from "./fake-executor.js";
import { collect, newEngineCore, submit } from "./helpers.js";

const BLOCKS = 64;
const BLOCK_SIZE = 4;

/** A fake worker that can die: outstanding steps and every later one reject with ExecutorLostError. */
class MortalExecutor implements StepExecutor {
  readonly inner: FakeExecutor;
  dead = false;
  steps = 0;
  private readonly outstanding = new Set<(error: Error) => void>();

  constructor(
    /** Dies when a step adds a request whose tokens contain this id. */
    private readonly poison: number | null = null,
    /** Dies on its nth step (counting from 1). */
    private readonly dieAtStep: number | null = null,
    private readonly onDeath: () => void = () => {},
  ) {
    this.inner = new FakeExecutor({ numBlocks: BLOCKS, blockSize: BLOCK_SIZE, delayMs: 1 });
  }

  get ready() {
    return this.inner.ready;
  }

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    if (this.dead) return Promise.reject(new ExecutorLostError("the fake worker is dead"));
    this.steps++;
    const poisoned = this.poison !== null && step.added.some((a) => a.token_ids.includes(this.poison as number));
    if (poisoned || this.steps === this.dieAtStep) {
      // Dies with this step outstanding; the owner hears of it after the rejections (as from the supervisor).
      queueMicrotask(() => this.die());
    }
    return new Promise<StepResultMessage>((resolve, reject) => {
      this.outstanding.add(reject);
      this.inner.executeStep(step).then(
        (result) => {
          this.outstanding.delete(reject);
          if (!this.dead) resolve(result);
        },
        (error: Error) => {
          this.outstanding.delete(reject);
          reject(error);
        },
      );
    });
  }

  die(): void {
    if (this.dead) return;
    this.dead = true;
    for (const reject of this.outstanding) reject(new ExecutorLostError("the fake worker was killed by SIGKILL"));
    this.outstanding.clear();
    this.onDeath();
  }
}

/** An engine whose "supervisor" restarts a dead executor after restartMs (up to maxRestarts). */
function supervised(
  config: Partial<EngineConfig>,
  options: { poison?: number; dieAtStep?: number; everyWorkerDies?: boolean; restartMs?: number; maxRestarts?: number } = {},
): { engine: EngineCore; executors: MortalExecutor[] } {
  const executors: MortalExecutor[] = [];
  let engine: EngineCore;
  const spawn = (dieAtStep: number | null): MortalExecutor => {
    const executor = new MortalExecutor(options.poison ?? null, dieAtStep, () => {
      engine.executorLost("the fake worker was killed by SIGKILL");
      if (executors.length > (options.maxRestarts ?? 10)) {
        engine.executorGone("the fake worker died too often");
        return;
      }
      setTimeout(() => engine.replaceExecutor(spawn(options.everyWorkerDies ? (options.dieAtStep ?? null) : null)), options.restartMs ?? 5);
    });
    executors.push(executor);
    return executor;
  };
  engine = newEngineCore(spawn(options.dieAtStep ?? null), {
    maxNumSeqs: 256,
    maxNumBatchedTokens: 64,
    maxModelLen: 4096,
    numBlocks: BLOCKS,
    blockSize: BLOCK_SIZE,
    ...config,
  });
  return { engine, executors };
}

for (const asyncScheduling of [true, false]) {
  const mode = asyncScheduling ? "async scheduling" : "sync scheduling";
  describe(`EngineCore: request migration (${mode})`, () => {
    it("requests carried over to the restarted worker continue token-exactly, nothing leaks", async () => {
      const { engine, executors } = supervised({ asyncScheduling, maxRequestMigrations: 1 }, { dieAtStep: 6 });
      const prompts = range(8).map((i) => range(3 + i, i * 10));
      const runs = await Promise.all(prompts.map((p) => collect(engine, makeRequest(p, { maxTokens: 12 }))));
      assert.equal(executors.length, 2, "one death, one restart");
      runs.forEach((r, i) => {
        const last = prompts[i]!.at(-1)!;
        assert.deepEqual(r.tokens, range(12, last + 1), `request ${i} continues where it was`);
        assert.equal(r.final.finishReason, "length");
      });
      // Some were re-added with the tokens they had generated before the death.
      const resumed = executors[1]!.inner.steps.flatMap((s) => s.added).filter((a) => a.token_ids.length > a.num_prompt_tokens);
      assert.ok(resumed.length > 0, "the restarted worker got requests with earlier outputs");
      assert.equal(engine.stats.numUsedBlocks, 0);
      assert.equal(engine.stats.numFreeBlocks, BLOCKS);
      engine.checkIntegrity();
    });

    it("with maxRequestMigrations 0, requests on the dead worker end with abort and the reason; waiting ones run on the next", async () => {
      const { engine, executors } = supervised({ asyncScheduling, maxRequestMigrations: 0, maxNumSeqs: 2 }, { dieAtStep: 3 });
      const runs = [range(4), range(4, 10), range(4, 20)].map((p) => collect(engine, makeRequest(p, { maxTokens: 30 })));
      const [a, b, c] = await Promise.all(runs);
      for (const r of [a!, b!]) {
        assert.equal(r.final.finishReason, "abort");
        assert.match(r.final.error ?? "", /killed by SIGKILL; requests are not carried over to a restarted worker \(--max-request-migrations 0\)/);
      }
      // Never on the worker (maxNumSeqs 2): it simply waited for the next one.
      assert.deepEqual(c!.tokens, range(30, 24));
      assert.equal(executors.length, 2);
      engine.checkIntegrity();
      assert.equal(engine.stats.numUsedBlocks, 0);
    });

    it("a request carried over more often than allowed ends with the reason", async () => {
      // Every worker dies on its 4th step.
      const { engine, executors } = supervised({ asyncScheduling, maxRequestMigrations: 1 }, { dieAtStep: 4, everyWorkerDies: true });
      const { final, tokens } = await collect(engine, makeRequest(range(4), { maxTokens: 200 }));
      assert.equal(executors.filter((e) => e.dead).length, 2);
      assert.equal(final.finishReason, "abort");
      assert.match(final.error ?? "", /already carried over to a restarted worker 1 time \(--max-request-migrations 1\)/);
      // What it streamed before is still exact.
      assert.deepEqual(tokens, range(tokens.length, 4));
      engine.checkIntegrity();
    });

    it("a request that kills the worker each time it is added fails alone; the others finish exactly", async () => {
      const POISON = 777;
      const { engine, executors } = supervised({ asyncScheduling, maxRequestMigrations: 1 }, { poison: POISON });
      const innocent = range(6).map((i) => collect(engine, makeRequest(range(4, i * 10), { maxTokens: 40 })));
      // Let the innocent ones get going, then send the poison.
      await new Promise((resolve) => setTimeout(resolve, 20));
      const poisoned = await collect(engine, makeRequest([1, 2, POISON], { maxTokens: 40 }));
      assert.equal(poisoned.final.finishReason, "abort");
      assert.match(poisoned.final.error ?? "", /the worker died each time it ran this request, so it is not retried/);
      const done = await Promise.all(innocent);
      done.forEach((r, i) => {
        assert.equal(r.final.finishReason, "length", `innocent ${i}: ${r.final.error}`);
        assert.deepEqual(r.tokens, range(40, i * 10 + 4));
      });
      assert.equal(executors.length, 3, "two deaths: the first and the retry");
      engine.checkIntegrity();
      assert.equal(engine.stats.numUsedBlocks, 0);
    });

    it("aborts while the worker is down end the request once, without a charge", async () => {
      const { engine, executors } = supervised({ asyncScheduling, maxRequestMigrations: 1 }, { dieAtStep: 3, restartMs: 50 });
      const req = makeRequest(range(4), { maxTokens: 100 });
      const run = collect(engine, req);
      await new Promise((resolve) => setTimeout(resolve, 15));
      assert.ok(executors[0]!.dead);
      engine.abort(req.id);
      const { final, outputs } = await run;
      assert.equal(final.finishReason, "abort");
      assert.equal(final.error, null);
      assert.equal(outputs.filter((o) => o.finished).length, 1);
      await new Promise((resolve) => setTimeout(resolve, 60));
      engine.checkIntegrity();
      assert.equal(engine.stats.numUsedBlocks, 0);
    });

    it("a worker gone for good ends everything and refuses new requests", async () => {
      const { engine } = supervised({ asyncScheduling, maxRequestMigrations: 3 }, { dieAtStep: 2, maxRestarts: 0 });
      const r = await collect(engine, makeRequest(range(4), { maxTokens: 50 }));
      assert.equal(r.final.finishReason, "abort");
      assert.match(r.final.error ?? "", /died too often/);
      assert.throws(() => submit(engine, makeRequest(range(4)), () => {}), RequestRejectedError);
      engine.checkIntegrity();
    });
  });
}
