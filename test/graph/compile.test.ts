import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { compileGraph, findWalkNode, GraphCompileError, ROUTE_CLIENT, ROUTE_PERSIST, ROUTE_SLOT, type CompiledGraph } from "../../src/graph/compile.js";
import { GraphLayoutError, parseGraphLayout, type ModelGraphLayout } from "../../src/graph/layout.js";
import {
  done,
  edge,
  emit,
  fixed,
  fromPersist,
  fromPrompt,
  graphLayout,
  llmLayout,
  loop,
  node,
  par,
  persist,
  seq,
  slidingWindow,
  step,
  streamEdge,
  ttsLayout,
} from "./builders.js";

/** (input name, node) pairs of slots, for readable assertions. */
function pairs(graph: CompiledGraph, slots: readonly number[]): string[] {
  return slots
    .map((slot) => {
      const wn = graph.walkNodes[graph.slotWalkNode[slot]!]!;
      return `${wn.inputNames[graph.slotInput[slot]!]}->${wn.node.name}`;
    })
    .sort();
}

function compileError(layout: ModelGraphLayout): string {
  try {
    compileGraph(layout);
  } catch (e) {
    assert.ok(e instanceof GraphCompileError, `expected a GraphCompileError, got ${String(e)}`);
    assert.ok(!e.message.includes("\n"), "one line");
    return e.message;
  }
  return assert.fail("compiled without error");
}

describe("graph layout parser", () => {
  it("accepts the exported layout, also after a JSON round trip", () => {
    const layout = ttsLayout();
    assert.deepEqual(parseGraphLayout(JSON.parse(JSON.stringify(layout))), layout);
  });

  it("names the field path of what is wrong", () => {
    const bad = JSON.parse(JSON.stringify(llmLayout())) as { sections: { max_iters: unknown }[] };
    bad.sections[1]!.max_iters = "many";
    assert.throws(() => parseGraphLayout(bad), (e: unknown) => e instanceof GraphLayoutError && /graph\.sections\[1\]\.max_iters/.test(e.message));
    const extra = { ...llmLayout(), surprise: 1 };
    assert.throws(() => parseGraphLayout(extra), /graph: Unrecognized key/);
    const badEdge = JSON.parse(JSON.stringify(llmLayout())) as { sections: { outputs: { persist: unknown }[] }[] };
    badEdge.sections[0]!.outputs[0]!.persist = "yes";
    assert.throws(() => parseGraphLayout(badEdge), /graph\.sections\[0\]\.outputs\[0\]\.persist/);
  });
});

describe("graph compiler", () => {
  it("compiles the one-node LLM graph into integer tables", () => {
    const g = compileGraph(llmLayout());
    assert.equal(g.nodes.length, 1);
    assert.deepEqual(
      g.walks.map((w) => w.name),
      ["prefill", "decode"],
    );
    const decode = findWalkNode(g, "decode", "llm")!;
    assert.equal(decode.loop, 0);
    const loopInfo = g.loops[0]!;
    assert.equal(loopInfo.name, "decode_loop");
    assert.deepEqual(pairs(g, loopInfo.externalSlots), [], "text_inputs feeds back: loop-back, not external");
    assert.deepEqual(pairs(g, loopInfo.loopBackSlots), ["text_inputs->llm"]);
    assert.deepEqual(decode.engineCarriedSlots, [decode.slotStart], "the engine core carries the token");
    const textRoutes = decode.outputRoutes[decode.outputNames.indexOf("text_inputs")]!;
    assert.equal(textRoutes[0]!.kind, ROUTE_SLOT);
    assert.equal(textRoutes[0]!.engineCarried, true);
    assert.equal(textRoutes[0]!.loopBackOf, 0);
    const prefill = findWalkNode(g, "prefill", "llm")!;
    assert.deepEqual(
      prefill.outputRoutes[0]!.map((r) => r.kind),
      [ROUTE_PERSIST, ROUTE_CLIENT],
    );
    assert.equal(g.partitions[0]!.start!.walk, 0);
    assert.equal(g.partitions[0]!.after[0]!.walk, 1);
    assert.equal(g.partitions[0]!.after[1]!.walk, -1);
    assert.ok(Object.isFrozen(g.walkNodes) && Object.isFrozen(decode.outputRoutes[0]));
  });

  it("classifies inputs by (name, destination): two body nodes sharing an external name both re-inject", () => {
    const g = compileGraph(
      graphLayout({
        nodes: { a: "stateless", b: "stateless", src: "stateless" },
        walks: {
          w: seq(
            node("src", [], [edge("a", "cond"), edge("b", "cond"), edge("a", "x")]),
            loop(seq(node("a", ["x", "cond"], [edge("b", "y")]), node("b", ["y", "cond"], [edge("a", "x")])), 3),
          ),
        },
      }),
    );
    const l = g.loops[0]!;
    assert.deepEqual(pairs(g, l.externalSlots), ["cond->a", "cond->b"]);
    assert.deepEqual(pairs(g, l.loopBackSlots), ["x->a"]);
  });

  it("BAGEL's CFG loop: every feed is loop-back, nothing external (docs/graph-semantics.md, Input classification)", () => {
    const branch = (n: string): ReturnType<typeof node> => node(n, ["latents", "t"], [edge("combine", `v_${n}`)]);
    const g = compileGraph(
      graphLayout({
        nodes: { A: "stateless", B: "stateless", C: "stateless", combine: "stateless", vae: "stateless" },
        walks: {
          gen: seq(
            loop(
              seq(
                par(branch("A"), branch("B"), branch("C")),
                node("combine", ["v_A", "v_B", "v_C", "latents", "t"], [
                  ...["A", "B", "C", "combine"].flatMap((n) => [edge(n, "latents"), edge(n, "t")]),
                ]),
              ),
              5,
              { name: "cfg", outputs: [edge("vae", "latents")] },
            ),
            node("vae", ["latents"], [emit("image", "image")]),
          ),
        },
      }),
    );
    const l = g.loops[0]!;
    assert.deepEqual(pairs(g, l.externalSlots), []);
    assert.deepEqual(pairs(g, l.loopBackSlots), [
      "latents->A",
      "latents->B",
      "latents->C",
      "latents->combine",
      "t->A",
      "t->B",
      "t->C",
      "t->combine",
    ]);
  });

  it("a kv_cache node fed from inside its loop is stepped per pass, not carried by the engine core", () => {
    const g = compileGraph(
      graphLayout({
        nodes: { llm: "kv_cache", combine: "stateless" },
        walks: {
          w: loop(seq(node("llm", ["latents"], [edge("combine", "v")]), node("combine", ["v"], [edge("llm", "latents")])), 4, { name: "denoise" }),
        },
        start: step("w", [fromPrompt("llm", "latents")]),
      }),
    );
    const wn = findWalkNode(g, "w", "llm")!;
    assert.deepEqual(wn.engineCarriedSlots, []);
    assert.ok(findWalkNode(g, "w", "combine")!.outputRoutes[0]!.every((r) => !r.engineCarried));
  });

  it("a persist edge may hand a value to a node of a later walk", () => {
    const g = compileGraph(llmLayout());
    assert.equal(g.persistNames[0], "new_token");
  });

  describe("rules, each one line naming the problem", () => {
    it("max_iters >= 1", () => {
      const m = compileError(graphLayout({ nodes: { a: "stateless" }, walks: { w: loop(node("a", [], []), 0, { name: "l" }) } }));
      assert.match(m, /walk w: loop l: max_iters must be >= 1 \(got 0\)/);
    });

    it("unknown node in a section", () => {
      const m = compileError(graphLayout({ nodes: { a: "stateless" }, walks: { w: node("ghost", [], []) } }));
      assert.match(m, /walk w: unknown node ghost in a section/);
    });

    it("unknown node in an edge", () => {
      const m = compileError(graphLayout({ nodes: { a: "stateless" }, walks: { w: node("a", [], [edge("ghost", "x")]) } }));
      assert.match(m, /walk w: node a edge x -> ghost: unknown node ghost/);
    });

    it("an edge naming an input its destination does not take (unless persist)", () => {
      const m = compileError(
        graphLayout({ nodes: { a: "stateless", b: "stateless" }, walks: { w: seq(node("a", [], [edge("b", "y")]), node("b", ["x"], [])) } }),
      );
      assert.match(m, /walk w: node a edge y -> b: node b takes no input y/);
      compileGraph(
        graphLayout({
          nodes: { a: "stateless", b: "stateless" },
          walks: { w: seq(node("a", [], [edge("b", "x"), persist("y", "b")]), node("b", ["x"], [])) },
        }),
      );
    });

    it("an edge to a node that is not in the walk (unless persist)", () => {
      const m = compileError(
        graphLayout({ nodes: { a: "stateless", b: "stateless" }, walks: { w: node("a", [], [edge("b", "x")]), v: node("b", ["x"], []) } }),
      );
      assert.match(m, /walk w: node a edge x -> b: node b is not in this walk/);
    });

    it("a loop output name the body does not produce", () => {
      const m = compileError(
        graphLayout({
          nodes: { a: "stateless", d: "stateless" },
          walks: { w: seq(loop(node("a", ["x"], [edge("a", "x")]), 2, { name: "l", outputs: [edge("d", "y")] }), node("d", ["y"], [])) },
        }),
      );
      assert.match(m, /walk w: loop l: output y is not produced by its body/);
    });

    it("outputs and accumulated_outputs sharing a name", () => {
      const m = compileError(
        graphLayout({
          nodes: { a: "stateless", d: "stateless" },
          walks: {
            w: seq(loop(node("a", [], [emit("x", "text")]), 2, { name: "l", outputs: [edge("d", "x")], accumulated: [emit("x", "text")] }), node("d", ["x"], [])),
          },
        }),
      );
      assert.match(m, /walk w: loop l: x is in both outputs and accumulated_outputs/);
    });

    it("a connection whose edge no producer emits as a streaming edge to that partition", () => {
      const layout = ttsLayout();
      layout.connections.push({ from_partition: "LLM", to_partition: "CODEC", edge_name: "spare", policy: fixed(1) });
      layout.sections.find((s) => s.node === "codec")!.inputs.push("spare");
      assert.match(compileError(layout), /connection LLM -> CODEC on spare: no node of LLM emits spare as a streaming edge to CODEC/);
    });

    it("a streaming edge without a connection", () => {
      const layout = ttsLayout();
      layout.connections = [];
      assert.match(compileError(layout), /walk prefill: node llm edge new_token -> codec: no connection LLM -> CODEC on new_token/);
    });

    it("a walk in two partitions", () => {
      const layout = llmLayout();
      layout.partitions.push({ name: "other", walks: ["decode"], start: null, after: {}, python_transitions: false });
      assert.match(compileError(layout), /walk decode is in two partitions: default and other/);
    });

    it("a transition to an unknown walk", () => {
      const layout = llmLayout();
      layout.partitions[0]!.after["decode"] = step("postprocess");
      assert.match(compileError(layout), /partition default: after decode: transition to unknown walk postprocess/);
      const start = llmLayout();
      start.partitions[0]!.start = step("nowhere");
      assert.match(compileError(start), /partition default: start: transition to unknown walk nowhere/);
    });

    it("a transition input that reads a name no edge persists", () => {
      const layout = llmLayout();
      layout.partitions[0]!.after["prefill"] = step("decode", [fromPersist("llm", "text_inputs", "ghost")]);
      assert.match(compileError(layout), /after prefill: input text_inputs reads ghost, which no edge persists/);
    });

    it("an input fed back outside any loop", () => {
      const m = compileError(graphLayout({ nodes: { a: "stateless" }, walks: { w: node("a", ["x"], [edge("a", "x")]) } }));
      assert.match(m, /walk w: input x of node a is fed back outside any loop/);
    });

    it("an emitted output not listed in client_outputs", () => {
      const layout = llmLayout();
      layout.client_outputs = [];
      assert.match(compileError(layout), /walk prefill: node llm edge new_token -> emit_to_client: client output new_token \(text\) is not in client_outputs/);
    });

    it("a chunk policy that cannot work", () => {
      assert.match(compileError(ttsLayout({ policy: slidingWindow(7, 8) })), /connection LLM -> CODEC on new_token: sliding_window policy: stride must be between 1 and the window 7 \(got 8\)/);
      assert.match(compileError(ttsLayout({ policy: fixed(0) })), /fixed policy: size must be >= 1/);
    });

    it("an edge that leaves a loop its outputs do not declare", () => {
      const m = compileError(
        graphLayout({
          nodes: { a: "stateless", c: "stateless" },
          walks: { w: seq(loop(node("a", ["s"], [edge("a", "s"), edge("c", "s")]), 3, { name: "l" }), node("c", ["s"], [])) },
        }),
      );
      assert.match(m, /walk w: node a edge s -> c: leaves loop l, whose outputs do not declare it/);
    });

    it("a node twice in one walk", () => {
      const m = compileError(graphLayout({ nodes: { a: "stateless" }, walks: { w: seq(node("a", [], []), node("a", [], [])) } }));
      assert.match(m, /walk w: node a appears twice/);
    });

    it("an unknown partition in a connection and an after-step of another partition's walk", () => {
      const layout = ttsLayout();
      layout.partitions[0]!.after["codec_chunk"] = done;
      assert.match(compileError(layout), /partition LLM: transition after walk codec_chunk of partition CODEC/);
    });
  });
});
