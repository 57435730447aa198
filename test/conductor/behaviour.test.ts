// The behaviours of docs/graph-semantics.md, 'What "works" means', one test
// each, over graphs in the exported layout, driven by the in-test executor that
// plays workers and engine core.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { nextChunk, type StreamChunk } from "../../src/graph/chunk-policy.js";
import type { ChunkPolicySpec } from "../../src/graph/layout.js";
import type { ReadyPass } from "../../src/conductor/conductor.js";
import {
  done,
  edge,
  emit,
  fixed,
  fromPrompt,
  graphLayout,
  leftContext,
  llmLayout,
  loop,
  node,
  par,
  seq,
  slidingWindow,
  step,
  streamEdge,
  ttsLayout,
} from "../graph/builders.js";
import { Executor } from "./executor.js";

const iter = (p: ReadyPass): number => p.iterations[p.iterations.length - 1] ?? 0;

function pipeline(): Executor {
  const ex = new Executor(
    graphLayout({
      nodes: { enc: "stateless", dec: "stateless" },
      walks: { w: seq(node("enc", ["x"], [edge("dec", "h")]), node("dec", ["h"], [emit("out", "text")])) },
      start: step("w", [fromPrompt("enc", "x")]),
    }),
  );
  ex.on("enc", (p, e) => ({ outputs: { h: [e.tensor(`enc(${e.input(p, "x").join()})`)] } }));
  ex.on("dec", (p, e) => ({ outputs: { out: [e.tensor(`dec(${e.input(p, "h").join()})`)] } }));
  return ex;
}

/** Expected chunk sequence of a policy over n items (pure arithmetic, eager consumer). */
function expectedChunks(policy: ChunkPolicySpec, n: number): StreamChunk[] {
  const out: StreamChunk[] = [];
  for (let k = 0; ; k++) {
    const c = nextChunk(policy, k, n, n)!;
    out.push(c);
    if (c.final) return out;
  }
}

/** The TTS shape with a scripted LLM of n streamed tokens and a codec that emits what it saw. */
function tts(n: number, policy: ChunkPolicySpec = slidingWindow(28, 7), codecWorker = 0): Executor {
  const prefillStreams = n > 0;
  const ex = new Executor(ttsLayout({ prefillStreams, policy }));
  ex.placement = (name) => (name === "codec" ? codecWorker : 0);
  ex.tokenScripts.set("llm", (_r, i) => ({ token: 100 + i, finish: i === Math.max(n, 1) - 1 ? "eos" : null }));
  ex.on("codec", (p, e) => {
    const c = p.chunks[0]!;
    const items = e.input(p, "new_token");
    return { outputs: { audio: [e.tensor(`${c.index}${c.final ? "F" : ""}@${c.start}+${c.contextCount}:${items.join(" ")}`, e.placement("codec"))] } };
  });
  return ex;
}

describe("conductor: what 'works' means (docs/graph-semantics.md)", () => {
  it("a pipeline runs once per request and is reusable", () => {
    const ex = pipeline();
    ex.admit("r1", { x: [ex.tensor("a")] });
    ex.admit("r2", { x: [ex.tensor("b")] });
    ex.run();
    ex.admit("r3", { x: [ex.tensor("c")] });
    ex.run();
    assert.deepEqual(ex.clientOf("r1"), ["dec(enc(a))"]);
    assert.deepEqual(ex.clientOf("r2"), ["dec(enc(b))"]);
    assert.deepEqual(ex.clientOf("r3"), ["dec(enc(c))"]);
    assert.equal(ex.runsOf("enc", "w"), 3);
    assert.equal(ex.runsOf("dec", "w"), 3);
    assert.deepEqual(ex.done, ["r1", "r2", "r3"]);
    assert.equal(ex.batchesSeen[0]!.passes.length, 2, "r1 and r2 ran enc as one batch");
    assert.equal(ex.liveTensors(), 0, "every tensor released");
    assert.equal(ex.conductor.activeRequests, 0);
  });

  it("a fixed-iteration loop then a decoder emits exactly one output", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { unet: "stateless", vae: "stateless" },
        walks: {
          w: seq(loop(node("unet", ["lat", "cond"], [edge("unet", "lat")]), 3, { name: "denoise", outputs: [edge("vae", "lat")] }), node("vae", ["lat"], [emit("image", "image")])),
        },
        start: step("w", [fromPrompt("unet", "lat"), fromPrompt("unet", "cond")]),
      }),
    );
    const conds: string[] = [];
    ex.on("unet", (p, e) => {
      conds.push(e.input(p, "cond").join());
      return { outputs: { lat: [e.tensor(`lat${iter(p) + 1}`)] } };
    });
    ex.on("vae", (p, e) => ({ outputs: { image: [e.tensor(`img(${e.input(p, "lat").join()})`)] } }));
    ex.admit("r", { lat: [ex.tensor("lat0")], cond: [ex.tensor("cond")] });
    ex.run();
    assert.equal(ex.runsOf("unet", "w"), 3);
    assert.deepEqual(conds, ["cond", "cond", "cond"], "the external input is re-injected every iteration");
    assert.deepEqual(ex.clientOf("r"), ["img(lat3)"]);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("a loop stopped by a signal on its 4th iteration runs exactly 4 times and the 4th iteration's outputs are delivered", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { gen: "stateless", dec: "stateless" },
        walks: {
          w: seq(
            loop(node("gen", ["s"], [edge("gen", "s"), emit("frame", "video")]), 10, { name: "L", outputs: [edge("dec", "s")] }),
            node("dec", ["s"], [emit("summary", "text")]),
          ),
        },
        start: step("w", [fromPrompt("gen", "s")]),
      }),
    );
    ex.on("gen", (p, e) => ({ outputs: { s: [e.tensor(`s${iter(p)}`)], frame: [e.tensor(`f${iter(p)}`)] }, stops: iter(p) === 3 ? ["L"] : [] }));
    ex.on("dec", (p, e) => ({ outputs: { summary: [e.tensor(`sum(${e.input(p, "s").join()})`)] } }));
    ex.admit("r", { s: [ex.tensor("s")] });
    ex.run();
    assert.equal(ex.runsOf("gen", "w"), 4);
    assert.deepEqual(ex.clientOf("r", "frame"), ["f0", "f1", "f2", "f3"]);
    assert.deepEqual(ex.clientOf("r", "summary"), ["sum(s3)"]);
    assert.equal(ex.liveTensors(), 0);
  });

  describe("nested loops outer 2 x inner 3", () => {
    it("run the inner node 6 times, the outer tail 2 and the decoder once, with exactly one value each", () => {
      const ex = new Executor(
        graphLayout({
          nodes: { pre: "stateless", den: "stateless", tail: "stateless", dec: "stateless" },
          walks: {
            w: seq(
              loop(
                seq(
                  node("pre", ["h"], [edge("den", "x")]),
                  loop(node("den", ["x"], [edge("den", "x")]), 3, { name: "inner", outputs: [edge("tail", "x")] }),
                  node("tail", ["x"], [edge("pre", "h")]),
                ),
                2,
                { name: "outer", outputs: [edge("dec", "h")] },
              ),
              node("dec", ["h"], [emit("out", "text")]),
            ),
          },
          start: step("w", [fromPrompt("pre", "h")]),
        }),
      );
      const seen: string[] = [];
      ex.on("pre", (p, e) => {
        seen.push(`pre ${e.input(p, "h").join("|")}`);
        return { outputs: { x: [e.tensor(`x${p.iterations[0]}.0`)] } };
      });
      ex.on("den", (p, e) => ({ outputs: { x: [e.tensor(`x${p.iterations[0]}.${p.iterations[1]! + 1}`)] } }));
      ex.on("tail", (p, e) => {
        seen.push(`tail ${e.input(p, "x").join("|")}`);
        return { outputs: { h: [e.tensor(`h${p.iterations[0]! + 1}`)] } };
      });
      ex.on("dec", (p, e) => ({ outputs: { out: [e.tensor(`dec(${e.input(p, "h").join("|")})`)] } }));
      ex.admit("r", { h: [ex.tensor("h0")] });
      ex.run();
      assert.equal(ex.runsOf("den", "w"), 6);
      assert.equal(ex.runsOf("tail", "w"), 2);
      assert.equal(ex.runsOf("dec", "w"), 1);
      assert.deepEqual(seen, ["pre h0", "tail x0.3", "pre h1", "tail x1.3"]);
      assert.deepEqual(ex.clientOf("r"), ["dec(h2)"]);
      assert.equal(ex.liveTensors(), 0);
    });

    it("also with the inner loop last in the outer body", () => {
      const ex = new Executor(
        graphLayout({
          nodes: { pre: "stateless", den: "stateless", dec: "stateless" },
          walks: {
            w: seq(
              loop(
                seq(
                  node("pre", ["h"], [edge("den", "x")]),
                  loop(node("den", ["x"], [edge("den", "x"), edge("pre", "h")]), 3, { name: "inner", outputs: [edge("pre", "h")] }),
                ),
                2,
                { name: "outer", outputs: [edge("dec", "h")] },
              ),
              node("dec", ["h"], [emit("out", "text")]),
            ),
          },
          start: step("w", [fromPrompt("pre", "h")]),
        }),
      );
      const pre: string[] = [];
      ex.on("pre", (p, e) => {
        pre.push(e.input(p, "h").join("|"));
        return { outputs: { x: [e.tensor(`x${p.iterations[0]}.0`)] } };
      });
      ex.on("den", (p, e) => {
        const v = `x${p.iterations[0]}.${p.iterations[1]! + 1}`;
        return { outputs: { x: [e.tensor(v)], h: [e.tensor(v)] } };
      });
      ex.on("dec", (p, e) => ({ outputs: { out: [e.tensor(`dec(${e.input(p, "h").join("|")})`)] } }));
      ex.admit("r", { h: [ex.tensor("h0")] });
      ex.run();
      assert.equal(ex.runsOf("pre", "w"), 2, "no extra outer iteration");
      assert.equal(ex.runsOf("den", "w"), 6);
      assert.equal(ex.runsOf("dec", "w"), 1);
      assert.deepEqual(pre, ["h0", "x0.3"]);
      assert.deepEqual(ex.clientOf("r"), ["dec(x1.3)"], "one value: the inner loop's last iteration");
      assert.equal(ex.liveTensors(), 0);
    });
  });

  it("two body nodes sharing an external input name both get it every iteration", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { src: "stateless", a: "stateless", b: "stateless" },
        walks: {
          w: seq(
            node("src", [], [edge("a", "cond"), edge("b", "cond"), edge("a", "x")]),
            loop(seq(node("a", ["x", "cond"], [edge("b", "y")]), node("b", ["y", "cond"], [edge("a", "x"), emit("y", "text")])), 3, { name: "L" }),
          ),
        },
      }),
    );
    const got: string[] = [];
    ex.on("src", (_p, e) => ({ outputs: { cond: [e.tensor("cond")], x: [e.tensor("x0")] } }));
    ex.on("a", (p, e) => {
      got.push(`a${iter(p)} ${e.input(p, "cond").join()}`);
      return { outputs: { y: [e.tensor(`y${iter(p)}`)] } };
    });
    ex.on("b", (p, e) => {
      got.push(`b${iter(p)} ${e.input(p, "cond").join()}`);
      return { outputs: { x: [e.tensor(`x${iter(p) + 1}`)], y: [e.tensor(`out${iter(p)}`)] } };
    });
    ex.admit("r");
    ex.run();
    assert.deepEqual(got, ["a0 cond", "b0 cond", "a1 cond", "b1 cond", "a2 cond", "b2 cond"]);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("Parallel inside a Loop with a self-loop runs each member once per iteration", () => {
    // Loop(Parallel([A(a->A), B(b->B, bo->C)]), 3, outputs=[bo->C]) then C: a shape in
    // which M* lets the self-fed A run twice per iteration and C never runs.
    const ex = new Executor(
      graphLayout({
        nodes: { A: "stateless", B: "stateless", C: "stateless" },
        walks: {
          w: seq(
            loop(par(node("A", ["a"], [edge("A", "a")]), node("B", ["b"], [edge("B", "b"), edge("C", "bo")])), 3, { name: "L", outputs: [edge("C", "bo")] }),
            node("C", ["bo"], [emit("out", "text")]),
          ),
        },
        start: step("w", [fromPrompt("A", "a"), fromPrompt("B", "b")]),
      }),
    );
    const order: string[] = [];
    ex.on("A", (p, e) => {
      order.push(`A${iter(p)}`);
      return { outputs: { a: [e.tensor(`a${iter(p)}`)] } };
    });
    ex.on("B", (p, e) => {
      order.push(`B${iter(p)}`);
      return { outputs: { b: [e.tensor(`b${iter(p)}`)], bo: [e.tensor(`bo${iter(p)}`)] } };
    });
    ex.on("C", (p, e) => ({ outputs: { out: [e.tensor(`C(${e.input(p, "bo").join("|")})`)] } }));
    ex.admit("r", { a: [ex.tensor("a")], b: [ex.tensor("b")] });
    ex.run();
    assert.deepEqual(order, ["A0", "B0", "A1", "B1", "A2", "B2"]);
    assert.deepEqual(ex.clientOf("r"), ["C(bo2)"]);
    assert.equal(ex.liveTensors(), 0);
  });

  describe("accumulated_outputs hold one value per iteration run", () => {
    for (const stopAt of [null, 2]) {
      it(stopAt === null ? "to max_iters" : "also on early stop", () => {
        const ex = new Executor(
          graphLayout({
            nodes: { roll: "stateless", dec: "stateless" },
            walks: {
              w: seq(
                loop(node("roll", ["s"], [edge("roll", "s")]), 5, { name: "rollout", accumulated: [edge("dec", "s")] }),
                node("dec", ["s"], [emit("out", "text")]),
              ),
            },
            start: step("w", [fromPrompt("roll", "s")]),
          }),
        );
        ex.on("roll", (p, e) => ({ outputs: { s: [e.tensor(`s${iter(p) + 1}`)] }, stops: iter(p) === stopAt ? ["rollout"] : [] }));
        ex.on("dec", (p, e) => ({ outputs: { out: [e.tensor(e.input(p, "s").join(" "))] } }));
        ex.admit("r", { s: [ex.tensor("s0")] });
        ex.run();
        assert.deepEqual(ex.clientOf("r"), [stopAt === null ? "s1 s2 s3 s4 s5" : "s1 s2 s3"]);
        assert.equal(ex.liveTensors(), 0);
      });
    }
  });

  it("after a stop nothing is ready and nothing is emitted", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { A: "stateless", B: "stateless" },
        walks: { w: loop(par(node("A", ["a"], [edge("A", "a"), emit("ea", "text")]), node("B", ["b"], [edge("B", "b"), emit("eb", "text")])), 10, { name: "L" }) },
        start: step("w", [fromPrompt("A", "a"), fromPrompt("B", "b")]),
      }),
    );
    ex.on("A", (p, e) => ({ outputs: { a: [e.tensor("a")], ea: [e.tensor(`A${iter(p)}`)] }, stops: iter(p) === 1 ? ["L"] : [] }));
    ex.on("B", (p, e) => ({ outputs: { b: [e.tensor("b")], eb: [e.tensor(`B${iter(p)}`)] } }));
    ex.admit("r", { a: [ex.tensor("a")], b: [ex.tensor("b")] });
    ex.run();
    assert.deepEqual(ex.clientOf("r"), ["A0", "B0", "A1", "B1"], "the stopping iteration's outputs are delivered");
    assert.deepEqual(ex.conductor.takeReady(), []);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0);

    // A kv_cache node: a token in flight when max_iters stops the loop is discarded.
    const llm = new Executor(ttsLayout({ maxIters: 3 }));
    llm.tokenScripts.set("llm", (_r, i) => ({ token: i, finish: null }));
    llm.on("codec", (_p, e) => ({ outputs: { audio: [e.tensor("pcm")] } }));
    llm.admit("r", { text_inputs: [Executor.tokens(1, 2, 3)] });
    llm.run();
    assert.deepEqual(llm.kvStops, ["r/llm"], "the engine core is told to stop");
    const clientBefore = llm.client.length;
    llm.conductor.kvToken(llm.idOf("r"), llm.graph.nodeByName.get("llm")!, 99, null);
    assert.equal(llm.client.length, clientBefore, "nothing emitted after the stop");
    assert.deepEqual(llm.conductor.takeReady(), []);
  });

  it("a third delivery waits and is not lost", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { p1: "stateless", p2: "stateless", p3: "stateless", S: "stateless" },
        walks: {
          w: loop(
            par(node("p1", [], [edge("S", "x")]), node("p2", [], [edge("S", "x")]), node("p3", [], [edge("S", "x")]), node("S", ["x"], [emit("got", "text")])),
            3,
            { name: "L" },
          ),
        },
      }),
    );
    for (const name of ["p1", "p2", "p3"]) ex.on(name, (p, e) => ({ outputs: { x: [e.tensor(`${name}#${iter(p)}`)] } }));
    ex.on("S", (p, e) => ({ outputs: { got: [e.tensor(`${iter(p)}:${e.input(p, "x").join()}`)] } }));
    ex.admit("r");
    ex.run();
    // Iteration 0 takes p1's value; p2's waits in the next slot, p3's (the third) in the queue.
    assert.deepEqual(ex.clientOf("r"), ["0:p1#0", "1:p2#0", "2:p3#0"]);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0, "what is left at the end of the walk is released");
  });

  it("a node with streaming and normal inputs takes a chunk only when the normal inputs are there", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { prod: "stateless", G: "stateless", T: "stateless" },
        walks: {
          pw: loop(node("prod", [], [streamEdge("T", "s", "Q")]), 3, { name: "produce" }),
          qw: seq(node("G", [], [edge("T", "trig")]), node("T", ["s", "trig"], [emit("out", "text")])),
        },
        partitions: [
          { name: "P", walks: ["pw"], start: step("pw"), after: { pw: done } },
          { name: "Q", walks: ["qw"], start: step("qw"), after: { qw: step("qw") } },
        ],
        connections: [{ from: "P", to: "Q", edge: "s", policy: fixed(1) }],
      }),
    );
    let gRuns = 0;
    ex.on("prod", (p, e) => ({ outputs: { s: [e.tensor(`s${iter(p)}`)] } }));
    ex.on("G", (_p, e) => ({ outputs: { trig: [e.tensor(`g${gRuns++}`)] } }));
    ex.on("T", (p, e) => ({ outputs: { out: [e.tensor(`${e.input(p, "trig").join()}:${e.input(p, "s").join()}${p.chunks[0]!.final ? " final" : ""}`)] } }));
    ex.holdBack = (p) => p.walkNode.node.name === "G" && gRuns === 0;
    ex.admit("r");
    ex.run();
    assert.equal(ex.runsOf("prod", "pw"), 3, "the producer is done");
    assert.equal(ex.runsOf("T", "qw"), 0, "chunks are there, the trigger is not: T does not take one");
    const g = ex.held.pop()!;
    ex.holdBack = () => false;
    ex.runPass(g);
    ex.run();
    assert.deepEqual(ex.clientOf("r"), ["g0:s0", "g1:s1", "g2:s2", "g3: final"]);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0);
  });

  describe("one final chunk, last, for every policy and item count, with correct offsets and context counts", () => {
    const policies: ChunkPolicySpec[] = [fixed(4), slidingWindow(6, 2), slidingWindow(5, 5), leftContext(4, 2), leftContext(3, 5)];
    for (const policy of policies) {
      it(`${policy.kind}(${policy.size}, ${policy.stride || policy.left})`, () => {
        for (const n of [0, 1, 3, 4, 5, 8, 12, 13]) {
          const ex = tts(n, policy);
          ex.admit("r", { text_inputs: [Executor.tokens(1)] });
          ex.run();
          const chunks = ex.passesSeen.map((p) => p.chunks[0]!);
          assert.deepEqual(chunks, expectedChunks(policy, n), `n=${n}`);
          assert.deepEqual(
            ex.clientOf("r"),
            chunks.map((c) => {
              const items = Array.from({ length: c.count }, (_, i) => `t${100 + c.start + i}`);
              return `${c.index}${c.final ? "F" : ""}@${c.start}+${c.contextCount}:${items.join(" ")}`;
            }),
            `n=${n}: each pass saw exactly its chunk's items`,
          );
          assert.deepEqual(ex.done, ["r"]);
          assert.equal(ex.liveTensors(), 0);
        }
      });
    }
  });

  it("a consumer looping over chunks is done with the pass that consumed the final chunk", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { prod: "stateless", T: "stateless" },
        walks: {
          pw: loop(node("prod", [], [streamEdge("T", "s", "Q")]), 5, { name: "produce" }),
          qw: loop(node("T", ["s"], [emit("out", "text")]), 100, { name: "talk" }),
        },
        partitions: [
          { name: "P", walks: ["pw"], start: step("pw"), after: { pw: done } },
          { name: "Q", walks: ["qw"], start: step("qw"), after: { qw: step("qw") } },
        ],
        connections: [{ from: "P", to: "Q", edge: "s", policy: fixed(2) }],
      }),
    );
    ex.on("prod", (p, e) => ({ outputs: { s: [e.tensor(`s${iter(p)}`)] } }));
    ex.on("T", (p, e) => ({ outputs: { out: [e.tensor(`${iter(p)}:${e.input(p, "s").join(" ")}${p.chunks[0]!.final ? " final" : ""}`)] } }));
    ex.admit("r");
    ex.run();
    assert.deepEqual(ex.clientOf("r"), ["0:s0 s1", "1:s2 s3", "2:s4 final"]);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("a continue-after-end policy is never final", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { prod: "stateless", T: "stateless" },
        walks: {
          pw: loop(node("prod", [], [streamEdge("T", "s", "Q")]), 5, { name: "produce" }),
          qw: loop(node("T", ["s"], [emit("out", "text")]), 100, { name: "talk" }),
        },
        partitions: [
          { name: "P", walks: ["pw"], start: step("pw"), after: { pw: done } },
          { name: "Q", walks: ["qw"], start: step("qw"), after: { qw: done } },
        ],
        connections: [{ from: "P", to: "Q", edge: "s", policy: fixed(2, true) }],
      }),
    );
    ex.on("prod", (p, e) => ({ outputs: { s: [e.tensor(`s${iter(p)}`)] } }));
    // The consumer ends itself once it sees nothing new after the end.
    ex.on("T", (p, e) => ({ outputs: { out: [e.tensor(e.input(p, "s").join(" ") || "-")] }, stops: p.chunks[0]!.count === 0 ? ["talk"] : [] }));
    ex.admit("r");
    ex.run();
    assert.ok(ex.passesSeen.filter((p) => p.walkNode.node.name === "T").every((p) => !p.chunks[0]!.final));
    assert.deepEqual(ex.clientOf("r"), ["s0 s1", "s2 s3", "s4", "-"]);
    assert.deepEqual(ex.done, ["r"]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("client chunks arrive in order before completion", () => {
    const ex = tts(42);
    ex.admit("a", { text_inputs: [Executor.tokens(1)] });
    ex.step();
    ex.admit("b", { text_inputs: [Executor.tokens(2)] });
    ex.run();
    for (const r of ["a", "b"]) {
      const events = ex.log.filter((l) => l.startsWith(`client ${r} `) || l === `done ${r}`);
      assert.equal(events.length, 5);
      assert.equal(events[events.length - 1], `done ${r}`);
      assert.deepEqual(
        ex.clientOf(r).map((s) => s.split("@")[0]),
        ["0", "1", "2", "3F"],
      );
    }
  });

  it("a per-request failure fails only that request", () => {
    const ex = pipeline();
    ex.holdBack = (p) => p.walkNode.node.name === "enc";
    ex.admit("r1", { x: [ex.tensor("a")] });
    ex.admit("r2", { x: [ex.tensor("b")] });
    ex.step();
    const [p1, p2] = ex.held;
    ex.holdBack = () => false;
    ex.held = [];
    ex.conductor.failPass(p1!.passId, "prepare_inputs raised");
    ex.runPass(p1!); // a late result of the failed request: ignored, its tensors released
    ex.runPass(p2!);
    ex.run();
    assert.deepEqual([...ex.failed], [["r1", "prepare_inputs raised"]]);
    assert.deepEqual(ex.done, ["r2"]);
    assert.deepEqual(ex.clientOf("r1"), []);
    assert.deepEqual(ex.clientOf("r2"), ["dec(enc(b))"]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("a failed forward fails its batch", () => {
    const ex = pipeline();
    ex.holdBack = (p) => p.walkNode.node.name === "enc";
    for (const r of ["r1", "r2", "r3"]) ex.admit(r, { x: [ex.tensor(r)] });
    ex.step();
    assert.equal(ex.batchesSeen.length, 1);
    const batch = ex.batchesSeen[0]!;
    assert.equal(batch.passes.length, 3);
    ex.holdBack = () => false;
    ex.held = [];
    ex.admit("r4", { x: [ex.tensor("r4")] });
    ex.conductor.failBatch(batch.batchId, "CUDA error");
    ex.run();
    assert.deepEqual([...ex.failed.keys()], ["r1", "r2", "r3"]);
    assert.deepEqual(ex.done, ["r4"]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("duplicate failure reports are ignored", () => {
    const ex = pipeline();
    ex.holdBack = () => true;
    ex.admit("r1", { x: [ex.tensor("a")] });
    ex.step();
    const pass = ex.held[0]!;
    ex.conductor.failRequest(ex.idOf("r1"), "first");
    ex.conductor.failRequest(ex.idOf("r1"), "second");
    ex.conductor.failPass(pass.passId, "third");
    ex.conductor.failBatch(ex.batchesSeen[0]!.batchId, "fourth");
    assert.deepEqual([...ex.failed], [["r1", "first"]]);
    assert.equal(ex.liveTensors(), 0);
  });

  it("a disconnect frees everything on every worker", () => {
    // A graph that holds tensors everywhere: a persisted value across walks, a
    // loop cache, a stream buffer of tensors into a second partition on worker 1.
    const layout = graphLayout({
      nodes: { enc: "stateless", step: "stateless", voc: "stateless" },
      walks: {
        first: node("enc", ["x"], [edge("", "ctx", { persist: true })]),
        gen: loop(node("step", ["ctx", "s"], [edge("step", "s"), streamEdge("voc", "frame", "V")]), 6, { name: "gen", accumulated: [emit("s", "text")] }),
        vocode: node("voc", ["frame"], [emit("pcm", "audio")]),
      },
      partitions: [
        {
          name: "M",
          walks: ["first", "gen"],
          start: step("first", [fromPrompt("enc", "x")]),
          after: { first: step("gen", [{ node: "step", name: "ctx", source: "persist", source_name: "ctx" }, fromPrompt("step", "s")], ["ctx"]), gen: done },
        },
        { name: "V", walks: ["vocode"], start: step("vocode"), after: { vocode: step("vocode") } },
      ],
      connections: [{ from: "M", to: "V", edge: "frame", policy: slidingWindow(3, 1) }],
    });
    let total = 0;
    for (let cut = 0; cut <= 40; cut++) {
      const ex = new Executor(layout);
      ex.on("enc", (_p, e) => ({ outputs: { ctx: [e.tensor("ctx")] } }));
      ex.on("step", (p, e) => ({ outputs: { s: [e.tensor(`s${iter(p)}`)], frame: [e.tensor(`f${iter(p)}`)] } }));
      ex.on("voc", (p, e) => ({ outputs: { pcm: [e.tensor(`pcm${p.chunks[0]!.index}`, 1)] } }));
      ex.admit("keep", { x: [ex.tensor("x")], s: [ex.tensor("s")] });
      ex.admit("cut", { x: [ex.tensor("x")], s: [ex.tensor("s")] });
      let steps = 0;
      while (steps < cut && ex.step()) steps++;
      const active = ex.conductor.has(ex.idOf("cut"));
      total += ex.conductor.heldTensors(ex.idOf("cut")).length;
      ex.conductor.abort(ex.idOf("cut"));
      ex.conductor.abort(ex.idOf("cut"));
      assert.equal(ex.conductor.has(ex.idOf("cut")), false);
      ex.run();
      assert.ok(ex.done.includes("keep"), `cut after ${cut} steps: the other request completes`);
      if (active) assert.ok(!ex.done.includes("cut") && !ex.failed.has("cut"), "an aborted request reports nothing");
      assert.equal(ex.engine.size, 0, "no engine request left");
      assert.equal(ex.liveTensors(), 0, `cut after ${cut} steps: every tensor on every worker released`);
    }
    assert.ok(total > 0, "the cuts caught the request holding tensors");
  });

  it("the same bytes colocated and split over workers", () => {
    const run = (codecWorker: number): { client: string[]; releases: Map<number, number> } => {
      const ex = tts(29, slidingWindow(28, 7), codecWorker);
      ex.admit("r", { text_inputs: [Executor.tokens(5, 6)] });
      ex.run();
      assert.equal(ex.liveTensors(), 0);
      const releases = new Map<number, number>();
      for (const c of ex.releaseCalls) releases.set(c.worker, (releases.get(c.worker) ?? 0) + c.handles.length);
      return { client: ex.clientOf("r"), releases };
    };
    const colocated = run(0);
    const split = run(1);
    assert.deepEqual(split.client, colocated.client);
    assert.deepEqual([...colocated.releases], [[0, 2]]);
    assert.deepEqual([...split.releases], [[1, 2]], "the codec's tensors are released to the worker that holds them");
  });
});

describe("the one-node LLM graph", () => {
  it("prefill then decode: one kv start, one continue, a token per pass, EOS ends the request", () => {
    const ex = new Executor(llmLayout());
    ex.tokenScripts.set("llm", (_r, i) => ({ token: 10 + i, finish: i === 4 ? "eos" : null }));
    ex.admit("r", { text_inputs: [Executor.tokens(1, 2, 3)] });
    ex.run();
    assert.deepEqual(ex.clientOf("r"), ["t10", "t11", "t12", "t13", "t14"]);
    assert.deepEqual(
      ex.kvStarts.map((s) => `${ex.graph.walks[s.walkNode.walk]!.name} ${s.continuing}`),
      ["prefill false", "decode true"],
    );
    assert.deepEqual(ex.labelsOf(ex.kvStarts[0]!.inputs[0]!), ["t1,2,3"]);
    assert.deepEqual(ex.kvStops, [], "the engine ended the request itself");
    assert.deepEqual(ex.done, ["r"]);
  });

  it("a finish on the first token ends the request after prefill", () => {
    const ex = new Executor(llmLayout());
    ex.tokenScripts.set("llm", () => ({ token: 7, finish: "length" }));
    ex.admit("r", { text_inputs: [Executor.tokens(1)] });
    ex.run();
    assert.deepEqual(ex.clientOf("r"), ["t7"]);
    assert.equal(ex.kvStarts.length, 1);
    assert.deepEqual(ex.done, ["r"]);
  });

  it("a kv_cache node fed from inside its loop (BAGEL's CFG loop) is started once per iteration", () => {
    const ex = new Executor(
      graphLayout({
        nodes: { LLM: "kv_cache", combine: "stateless", vae: "stateless" },
        walks: {
          gen: seq(
            loop(seq(node("LLM", ["latents"], [edge("combine", "v")]), node("combine", ["v"], [edge("LLM", "latents")])), 4, {
              name: "denoise",
              outputs: [edge("vae", "latents")],
            }),
            node("vae", ["latents"], [emit("image", "image")]),
          ),
        },
        start: step("gen", [fromPrompt("LLM", "latents")]),
      }),
    );
    ex.on("LLM", (p, e) => ({ outputs: { v: [e.tensor(`v(${e.input(p, "latents").join()})`)] } }));
    ex.on("combine", (p, e) => ({ outputs: { latents: [e.tensor(`l${iter(p) + 1}`)] } }));
    ex.on("vae", (p, e) => ({ outputs: { image: [e.tensor(`img(${e.input(p, "latents").join()})`)] } }));
    ex.admit("r", { latents: [ex.tensor("l0")] });
    ex.run();
    assert.deepEqual(
      ex.kvStarts.map((s) => `${ex.labelsOf(s.inputs[0]!).join()} ${s.continuing}`),
      ["l0 false", "l1 true", "l2 true", "l3 true"],
    );
    assert.deepEqual(ex.clientOf("r"), ["img(l4)"]);
    assert.deepEqual(ex.kvStops, ["r/LLM"], "the loop's end stops the engine-core request");
    assert.equal(ex.liveTensors(), 0);
  });

  it("a decode loop gives each token to the client and ends at the stop token or at max_iters", () => {
    for (const maxIters of [1, 2, 3, 10]) {
      for (const eosAt of [-1, 0, 1, 2, 5, 9, 20]) {
        const ex = new Executor(llmLayout(maxIters));
        ex.tokenScripts.set("llm", (_r, i) => ({ token: i, finish: i === eosAt ? "eos" : null }));
        ex.admit("r", { text_inputs: [Executor.tokens(1)] });
        ex.run();
        const label = `max_iters ${maxIters}, eos at ${eosAt}`;
        // Prefill's token, then one per decode iteration, up to and including the stop token.
        const count = Math.min(maxIters, eosAt < 0 ? Infinity : eosAt) + 1;
        assert.deepEqual(ex.clientOf("r"), Array.from({ length: count }, (_, i) => `t${i}`), label);
        assert.deepEqual(ex.done, ["r"], label);
        // The engine core ended a request on its stop token by itself; max_iters has the conductor stop it.
        const stoppedByEos = eosAt >= 0 && eosAt <= maxIters;
        assert.deepEqual(ex.kvStops, stoppedByEos ? [] : ["r/llm"], label);
      }
    }
  });

  it("max_iters ends decode and stops the engine core", () => {
    const ex = new Executor(llmLayout(3));
    ex.tokenScripts.set("llm", (_r, i) => ({ token: i, finish: null }));
    ex.admit("r", { text_inputs: [Executor.tokens(1)] });
    ex.run();
    assert.deepEqual(ex.clientOf("r"), ["t0", "t1", "t2", "t3"]);
    assert.deepEqual(ex.kvStops, ["r/llm"]);
    assert.deepEqual(ex.done, ["r"]);
  });
});
