// Cost per decode step of the control plane's own work for an LLM at B
// concurrent requests: the engine core alone (how a plain LLM is served)
// against the graph engine (conductor + engine core + worker lane, how the
// LLM node of a graph of models is). The executor answers at once with "last
// token + 1", so the time is the control plane's; both runs in one process,
// alternating.
//
//   npx tsc -p tsconfig.json && node dist/test/conductor/graph-engine-bench.js [requests] [tokensPerRequest] [rounds]

import { EngineCore, type EngineConfig } from "../../src/engine/engine-core.js";
import { OutputProcessor } from "../../src/engine-host/output-processor.js";
import type { EngineRequest, RequestOutput } from "../../src/engine/types.js";
import type { StepExecutor } from "../../src/worker/types.js";
import { GraphEngine } from "../../src/conductor/graph-engine.js";
import { compileGraph } from "../../src/graph/compile.js";
import type { ReadyMessage, StepMessage, StepResultMessage } from "../../src/transport/messages.js";
import type { WorkerClient } from "../../src/worker/types.js";
import { greedy } from "../engine/fake-executor.js";
import { llmLayout } from "../graph/builders.js";

const requests = Number(process.argv[2] ?? 256);
const tokensPerRequest = Number(process.argv[3] ?? 400);
const rounds = Number(process.argv[4] ?? 3);
/** "both" (default), or only "core" / "graph" (for a profile of one side). */
const only = process.argv[5] ?? "both";
const VOCAB = 32000;

/** Answers every step at once: each sampled row's token is its last one + 1. */
class EchoWorker implements WorkerClient {
  readonly pid = 0;
  readonly alive = true;
  readonly ready: ReadyMessage = {
    kind: "Ready",
    protocol_version: 3,
    num_blocks: 1 << 16,
    block_size: 16,
    max_model_len: 1 << 14,
    vocab_size: VOCAB,
    architecture: "Echo",
    dtype: "float32",
    device: "cpu",
    worker_pid: 0,
    graph: {},
    pooling: null,
  };
  private readonly last = new Map<number, number>();
  steps = 0;

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    this.steps++;
    for (const id of step.removed) this.last.delete(id);
    for (const a of step.added) this.last.set(a.req_id, a.token_ids[a.token_ids.length - 1] ?? 0);
    const reqIds: number[] = [];
    const tokens: number[] = [];
    for (let i = 0; i < step.req_ids.length; i++) {
      if (step.sample[i] !== 1) continue;
      const id = step.req_ids[i]!;
      const t = ((this.last.get(id) ?? 0) + 1) % VOCAB;
      this.last.set(id, t);
      reqIds.push(id);
      tokens.push(t);
    }
    return Promise.resolve({
      kind: "StepResult",
      step_id: step.step_id,
      prompt_results: [],
      pass_results: [],
      req_ids: Int32Array.from(reqIds),
      token_ids: Int32Array.from(tokens),
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0, forward_ms: 0, sample_ms: 0 },
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: new Int32Array(0),
      kv_load_failed: new Int32Array(0),
      kv_load_errors: [],
      kv_bytes: 0,
      lora_load_failed: new Int32Array(0),
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
      pooled: null,
    });
  }
  onDeath(): void {}
  async shutdown(): Promise<void> {}
  async ping(): Promise<number> {
    return 0;
  }
}

function config(ready: ReadyMessage): EngineConfig {
  return {
    maxNumSeqs: requests,
    maxNumBatchedTokens: Math.max(8192, requests * 16),
    maxModelLen: ready.max_model_len,
    blockSize: ready.block_size,
    numBlocks: ready.num_blocks,
    asyncScheduling: false,
  };
}

let lastId = 0;

function engineRequest(i: number): EngineRequest {
  return {
    id: ++lastId,
    promptIds: Array.from({ length: 8 }, (_, j) => (i * 8 + j) % VOCAB),
    sampling: greedy(),
    stop: { maxTokens: tokensPerRequest, eosTokenIds: [], stopTokenIds: [], ignoreEos: true, minTokens: 0 },
    priority: 0,
    arrivalMs: performance.now(),
  };
}

type Submit = (req: EngineRequest, onOutput: (out: RequestOutput) => void) => void;

/** Runs B requests to completion; ms per step over the whole run (prefill included, 1 of tokensPerRequest steps). */
async function run(submit: Submit, worker: EchoWorker): Promise<{ msPerStep: number; tokens: number }> {
  let tokens = 0;
  let done = 0;
  const t0 = performance.now();
  const steps0 = worker.steps;
  await new Promise<void>((resolve) => {
    for (let i = 0; i < requests; i++) {
      submit(engineRequest(i), (out) => {
        tokens += out.newTokenIds.length;
        if (out.finished && ++done === requests) resolve();
      });
    }
  });
  const ms = performance.now() - t0;
  if (tokens !== requests * tokensPerRequest) throw new Error(`got ${tokens} tokens, expected ${requests * tokensPerRequest}`);
  return { msPerStep: ms / (worker.steps - steps0), tokens };
}

async function main(): Promise<void> {
  const coreWorker = new EchoWorker();
  const outputs = new OutputProcessor(false);
  const core = new EngineCore(coreWorker, config(coreWorker.ready), { onOutputs: (batch) => outputs.process(batch) });
  const graphWorker = new EchoWorker();
  const graph = new GraphEngine({
    graph: compileGraph(llmLayout(tokensPerRequest + 8)),
    workers: [graphWorker],
    rankOf: () => 0,
    onOutputs: (batch) => outputs.process(batch),
    engine: { maxNumSeqs: requests, maxNumBatchedTokens: Math.max(8192, requests * 16), asyncScheduling: false },
  });
  console.log(`B=${requests}, ${tokensPerRequest} tokens per request, ms per step (control plane only)`);
  const results: { core: number[]; graph: number[] } = { core: [], graph: [] };
  for (let r = 0; r < rounds; r++) {
    if (only !== "graph") results.core.push((await run((req, cb) => (core.submit(req), outputs.addText(req.id, cb)), coreWorker)).msPerStep);
    if (only !== "core") {
      results.graph.push((await run((req, cb) => (graph.submit(req), outputs.addText(req.id, cb)), graphWorker)).msPerStep);
    }
  }
  const best = (xs: number[]): number => Math.min(...xs);
  // Where a step's time goes, p50 over the last round's decode steps (the engine core's timing ring).
  const phases = (ring: typeof core.timings): string => {
    const recent = ring.recent(Math.min(ring.size, tokensPerRequest - 8));
    const p50 = (key: "scheduleMs" | "buildMs" | "roundTripMs" | "processMs"): string => {
      const xs = recent.map((t) => t[key]).sort((a, b) => a - b);
      return (xs[Math.floor(xs.length / 2)] ?? 0).toFixed(3);
    };
    return `schedule ${p50("scheduleMs")} build ${p50("buildMs")} round trip ${p50("roundTripMs")} process ${p50("processMs")}`;
  };
  if (only !== "graph") console.log(`engine core alone, p50 ms: ${phases(core.timings)}`);
  if (only !== "core") console.log(`graph engine, p50 ms:      ${phases(graph.timings!)}`);
  console.log(`engine core alone: ${results.core.map((x) => x.toFixed(3)).join(" ")}  best ${best(results.core).toFixed(3)}`);
  console.log(`graph engine:      ${results.graph.map((x) => x.toFixed(3)).join(" ")}  best ${best(results.graph).toFixed(3)}`);
  if (only === "both") {
    console.log(`ratio graph/core (best): ${(best(results.graph) / best(results.core)).toFixed(3)}`);
  }
  await core.close();
  await graph.close();
}

await main();
