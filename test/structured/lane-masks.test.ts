// Grammar masks through the graph engine's worker lane, with the real worker
// and the real grammar thread (the demo LLM run as a graph: a graph's LLM node
// steps through the lane of its worker, a plain LLM's core needs none). The lane numbers wire steps itself, and its
// own steps (graph work, no rows) make the wire ids run ahead of the engine
// core's; a StepMask must still reach the worker under the id of the step
// that waits for it, and a row-less step must never wait. A mask under the
// core's id would make the worker fail the protocol ("got the mask of step
// N while step M waits") and every request would end with an error.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { readModelDir } from "../../src/config/model-dir.js";
import type { EngineRequest, RequestOutput } from "../../src/engine/types.js";
import type { StepExecutor } from "../../src/worker/types.js";
import { GraphEngine } from "../../src/conductor/graph-engine.js";
import { stepMasks } from "../../src/engine/step-masks.js";
import { compileModelGraph } from "../../src/graph/compile.js";
import { startWorker } from "../../src/worker/supervisor.js";
import type { RequestGrammar } from "../../src/structured/answer-phase.js";
import { GrammarService } from "../../src/structured/grammar-service.js";
import { TextTokenizer } from "../../src/text/tokenizer.js";
import type { StepMaskMessage, StepMessage } from "../../src/transport/messages.js";
import type { WorkerClient } from "../../src/worker/types.js";
import { demoModelDir } from "../e2e/harness.js";
import { greedy, waitUntil } from "../worker/helpers.js";
import { OutputProcessor } from "../../src/engine-host/output-processor.js";

const PATTERN = "[a-z]{3}-[0-9]{2}";
const GRAMMAR: RequestGrammar = { spec: { kind: "regex", source: PATTERN }, reasoning: null };

/** What went over the wire, in order: each step's id and whether it waits for a mask, each mask's id. */
type WireEvent = { kind: "step"; id: number; rows: number; masked: boolean } | { kind: "mask"; id: number };

/** Records what the lane sends, then sends it to the real worker. */
function recording(worker: WorkerClient, events: WireEvent[]): StepExecutor {
  return {
    get ready() {
      return worker.ready;
    },
    executeStep(step: StepMessage) {
      events.push({ kind: "step", id: step.step_id, rows: step.req_ids.length, masked: step.mask_rows.length > 0 });
      return worker.executeStep(step);
    },
    sendStepMask(mask: StepMaskMessage) {
      events.push({ kind: "mask", id: mask.step_id });
      worker.sendStepMask?.(mask);
    },
  };
}

for (const asyncScheduling of [true, false]) {
  describe(`grammar masks through a worker lane (overlap ${asyncScheduling ? "on" : "off"})`, () => {
    const info = readModelDir(demoModelDir);
    const tokenizer = TextTokenizer.fromFile(join(demoModelDir, "tokenizer.json"));
    let grammars: GrammarService;
    let worker: WorkerClient;
    let engine: GraphEngine;
    const processor = new OutputProcessor(false);
    const events: WireEvent[] = [];

    before(async () => {
      grammars = GrammarService.start({ tokenizerPath: join(demoModelDir, "tokenizer.json"), vocabSize: info.vocabSize!, stopTokenIds: info.eosTokenIds, cacheSize: 4 });
      assert.equal(await grammars.compile(GRAMMAR.spec), null);
      worker = await startWorker({ modelDir: demoModelDir, blockSize: 16, numBlocks: 128, dtype: "float32", device: "cpu", seed: 0, forwardOutput: false });
      engine = new GraphEngine({
        onOutputs: (batch) => processor.process(batch),
        graph: compileModelGraph(worker.ready.graph),
        workers: [worker],
        rankOf: () => 0,
        engine: { maxNumSeqs: 8, maxNumBatchedTokens: 512, asyncScheduling },
        wrapExecutor: (_rank, client) => recording(client, events),
        stepMasks: (ready) => stepMasks({ port: grammars.connectPort(), vocabSize: grammars.vocabSize }, ready.vocab_size),
      });
    });

    after(async () => {
      await engine?.close();
      await worker?.shutdown();
      await grammars?.close();
    });

    test("masks reach the steps that wait for them; the lane's own steps never wait", async () => {
      const lane = engine.lanes[0]!;
      // A step of the lane's own goes first: from here on wire ids run ahead of the core's.
      lane.requestEnded(999_999);
      await waitUntil(() => events.length > 0 && lane.stepsInFlight === 0, 10_000, "the lane's own step");
      assert.deepEqual(events[0], { kind: "step", id: 0, rows: 0, masked: false });

      const outputs = await Promise.all(
        [0, 1, 2, 3].map(
          (i) =>
            new Promise<{ ids: number[]; last: RequestOutput }>((resolve) => {
              const ids: number[] = [];
              const request: EngineRequest = {
                id: i + 1,
                promptIds: [9707 + i, 11, 1879, 0],
                sampling: { ...greedy, temperature: 1, seed: 100 + i },
                stop: { maxTokens: 24, eosTokenIds: info.eosTokenIds, stopTokenIds: [], ignoreEos: false, minTokens: 0 },
                priority: 0,
                arrivalMs: performance.now(),
                grammar: GRAMMAR,
              };
              engine.submit(request);
              processor.addText(request.id, (out) => {
                ids.push(...out.newTokenIds);
                // Graph work for the lane while the request runs: it rides in the next step, or goes in one of the lane's own.
                lane.requestEnded(1_000 * (i + 1) + ids.length);
                if (out.finished) resolve({ ids, last: out });
              });
            }),
        ),
      );
      for (const { ids, last } of outputs) {
        assert.equal(last.finishReason, "stop", last.error ?? "");
        const text = await tokenizer.decode(ids, true);
        assert.match(text, new RegExp(`^${PATTERN}$`));
      }

      // Every mask names a masked step that was sent and not yet answered by a mask, in order.
      const masked = events.filter((e) => e.kind === "step" && e.masked).map((e) => e.id);
      const masks = events.filter((e) => e.kind === "mask").map((e) => e.id);
      assert.deepEqual(masks, masked);
      for (const [at, event] of events.entries()) {
        if (event.kind !== "mask") continue;
        assert.ok(events.slice(0, at).some((e) => e.kind === "step" && e.id === event.id && e.masked), `mask ${event.id} follows its step`);
      }
      const rowless = events.filter((e) => e.kind === "step" && e.rows === 0);
      assert.ok(rowless.length >= 1 && rowless.every((e) => e.kind === "step" && !e.masked));
      if (!asyncScheduling) {
        // Between the core's steps the lane is idle, so its own steps go in between the masked ones.
        const first = events.findIndex((e) => e.kind === "step" && e.masked);
        assert.ok(events.slice(first).some((e) => e.kind === "step" && e.rows === 0), "a row-less step between masked ones");
      }
      assert.ok(engine.stats.numSteps > 0);
      assert.ok(lane.client.alive, "the worker is still serving");
    });
  });
}
