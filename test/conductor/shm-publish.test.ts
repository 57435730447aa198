// Which tensors a worker publishes to shared memory (planPublishing: exactly
// the outputs and prompt values some other rank may consume, through slots,
// streams, persist edges and loop outputs), and the acknowledgement rule
// (RemoteReads: a release waits for the passes reading the tensor elsewhere).

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { RemoteReads } from "../../src/conductor/remote-reads.js";
import { planPublishing } from "../../src/conductor/publish.js";
import { compileModelGraph, type CompiledGraph } from "../../src/graph/compile.js";
import type { PassBatch } from "../../src/transport/messages.js";
import { edge, emit, fromPersist, fromPrompt, graphLayout, loop, node, persist, seq, step, ttsLayout } from "../graph/builders.js";

function plan(graph: CompiledGraph, ranks: Record<string, number>, promptRank = 0): { outputs: Record<string, string[]>; prompts: string[] } {
  const rankOf = graph.walkNodes.map((wn) => ranks[wn.node.name] ?? 0);
  const p = planPublishing(graph, rankOf, promptRank);
  const outputs: Record<string, string[]> = {};
  for (const wn of graph.walkNodes) {
    const names = p.outputs[wn.id]!;
    if (names.length > 0) outputs[`${graph.walks[wn.walk]!.name}.${wn.node.name}`] = names;
  }
  return { outputs, prompts: p.prompts };
}

const pipeline = compileModelGraph(
  graphLayout({
    nodes: { enc: "stateless", mid: "stateless", dec: "stateless" },
    walks: {
      w: seq(node("enc", ["x"], [edge("mid", "h"), edge("dec", "skip")]), node("mid", ["h"], [edge("dec", "g")]), node("dec", ["g", "skip"], [emit("out", "audio")])),
    },
    start: step("w", [fromPrompt("enc", "x")]),
  }),
);

describe("planPublishing", () => {
  it("publishes nothing when every node shares one rank", () => {
    assert.deepEqual(plan(pipeline, {}), { outputs: {}, prompts: [] });
  });

  it("publishes exactly the outputs a node on another rank takes, and prompt values another rank takes", () => {
    assert.deepEqual(plan(pipeline, { dec: 1 }), { outputs: { "w.enc": ["skip"], "w.mid": ["g"] }, prompts: [] });
    assert.deepEqual(plan(pipeline, { enc: 1, mid: 1, dec: 1 }), { outputs: {}, prompts: ["x"] });
    assert.deepEqual(plan(pipeline, { mid: 2 }), { outputs: { "w.enc": ["h"], "w.mid": ["g"] }, prompts: [] });
  });

  it("follows persist edges into later walks and loop outputs out of their loop", () => {
    const graph = compileModelGraph(
      graphLayout({
        nodes: { body: "stateless", tail: "stateless", later: "stateless" },
        walks: {
          first: seq(
            loop(node("body", ["s"], [edge("body", "s")]), 3, { name: "l", outputs: [edge("tail", "s")] }),
            node("tail", ["s"], [persist("kept")]),
          ),
          second: node("later", ["kept"], [emit("out", "audio")]),
        },
        partitions: [
          {
            name: "default",
            walks: ["first", "second"],
            start: step("first", [fromPrompt("body", "s")]),
            after: { first: step("second", [fromPersist("later", "kept", "kept")], ["kept"]), second: step("") },
          },
        ],
      }),
    );
    assert.deepEqual(plan(graph, { later: 1 }).outputs, { "first.tail": ["kept"] });
    assert.deepEqual(plan(graph, { tail: 1, later: 1 }).outputs, { "first.body": ["s"] });
    assert.deepEqual(plan(graph, { body: 1 }), { outputs: { "first.body": ["s"] }, prompts: ["s"] });
  });

  it("follows streams into the consumer partition", () => {
    const graph = compileModelGraph(ttsLayout());
    const outputs = plan(graph, { codec: 1 }).outputs;
    assert.deepEqual(Object.keys(outputs).sort(), ["decode.llm", "prefill.llm"]);
    assert.deepEqual(plan(graph, {}).outputs, {});
  });
});

function batch(...inputs: { handle: number; worker: number }[]): PassBatch {
  const value = (v: { handle: number; worker: number }) => ({ form: "tensor", ...v, ids: new Int32Array(0), dtype: "float32", shape: [1], segment: "s", offset: 0, nbytes: 4 });
  return { batch_id: 1, node: "n", walk: "w", passes: [{ pass_id: 1, request_id: 1, inputs: [{ name: "x", values: inputs.map(value) }], chunks: [], request_kwargs: {} }], publish: [] };
}

describe("RemoteReads", () => {
  it("holds back a release until every pass reading the tensor on another worker has answered", () => {
    const released: string[] = [];
    const reads = new RemoteReads(2, (owner, handles) => released.push(`${owner}:${handles.join(",")}`));
    const first = batch({ handle: 7, worker: 0 });
    const second = batch({ handle: 7, worker: 0 }, { handle: 8, worker: 0 });
    const local = batch({ handle: 9, worker: 1 });
    reads.sent(1, first);
    reads.sent(1, second);
    reads.sent(1, local); // read where it lives: nothing to wait for
    reads.released(0, [7, 8, 5]);
    assert.deepEqual(released, ["0:5"]);
    reads.answered(1, first);
    assert.deepEqual(released, ["0:5"]);
    reads.answered(1, second);
    assert.deepEqual(released, ["0:5", "0:7", "0:8"]);
    reads.answered(1, local);
    reads.released(1, [9]);
    assert.deepEqual(released, ["0:5", "0:7", "0:8", "1:9"]);
    assert.equal(reads.size, 0);
  });

  it("lets a release through at once when the reading pass already answered", () => {
    const released: number[][] = [];
    const reads = new RemoteReads(2, (_owner, handles) => released.push([...handles]));
    const b = batch({ handle: 3, worker: 1 });
    reads.sent(0, b);
    reads.answered(0, b);
    reads.released(1, [3]);
    assert.deepEqual(released, [[3]]);
  });
});
