// Cost of the conductor per sampled token for the one-node LLM graph: kvToken
// (complete the decode pass, route new_token to the client, end the iteration,
// carry the next one) at 256 concurrent requests.
//
//   npx tsc -p tsconfig.json && node dist/test/conductor/kv-token-bench.js [requests] [tokensPerRequest]

import { compileGraph, type CompiledClientOutput, type CompiledNode } from "../../src/graph/compile.js";
import { Conductor, type ClientOutputMeta, type ConductorSink, type KvStart } from "../../src/conductor/conductor.js";
import type { TokensValue, Values } from "../../src/conductor/values.js";
import { llmLayout } from "../graph/builders.js";

const requests = Number(process.argv[2] ?? 256);
const tokensPerRequest = Number(process.argv[3] ?? 2000);

class CountingSink implements ConductorSink {
  outputs = 0;
  done = 0;
  clientOutput(_r: number, _o: CompiledClientOutput, values: Values, _m: ClientOutputMeta): void {
    this.outputs += values.length;
  }
  clientToken(): void {
    this.outputs++;
  }
  requestDone(): void {
    this.done++;
  }
  requestFailed(requestId: number, message: string): void {
    throw new Error(`${requestId} failed: ${message}`);
  }
  release(): void {}
  kvStart(_s: KvStart): void {}
  kvStop(): void {}
}

function run(): { admitUs: number; nsPerToken: number; tokens: number } {
  const graph = compileGraph(llmLayout(tokensPerRequest + 8));
  const sink = new CountingSink();
  const conductor = new Conductor(graph, sink);
  const llm: CompiledNode = graph.nodeByName.get("llm")!;
  const ids = Array.from({ length: requests }, (_, i) => i + 1);
  const prompt = new Map<string, Values>([["text_inputs", [{ kind: "tokens", ids: new Int32Array(64) }]]]);

  const a0 = process.hrtime.bigint();
  for (const id of ids) conductor.admit(id, prompt);
  const admitUs = Number(process.hrtime.bigint() - a0) / 1000 / requests;
  // Prefill tokens (the walk transition to decode happens here).
  for (const id of ids) conductor.kvToken(id, llm, 0, null);

  const t0 = process.hrtime.bigint();
  for (let step = 1; step < tokensPerRequest; step++) {
    const finish = step === tokensPerRequest - 1 ? "length" : null;
    for (let r = 0; r < requests; r++) {
      conductor.kvToken(ids[r]!, llm, step, finish);
    }
  }
  const ns = Number(process.hrtime.bigint() - t0);
  const tokens = requests * (tokensPerRequest - 1);
  if (sink.done !== requests || sink.outputs !== requests * tokensPerRequest) throw new Error("benchmark run incomplete");
  return { admitUs, nsPerToken: ns / tokens, tokens };
}

run(); // warm up
for (let round = 0; round < 4; round++) {
  const r = run();
  console.log(`${requests} requests x ${tokensPerRequest} tokens: ${r.nsPerToken.toFixed(0)} ns/token (kvToken + routing), admit ${r.admitUs.toFixed(1)} us/request`);
}
