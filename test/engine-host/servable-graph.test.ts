// The graph a worker announces in Ready is compiled at start: the one-node
// LLM graph (as the real worker exports it) is served; a multi-node graph
// compiles but is refused with one line until the conductor drives workers.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { checkServableGraph } from "../../src/engine-host/servable-graph.js";
import { compileModelGraph } from "../../src/graph/compile.js";
import { packageRoot } from "../../src/transport/package-root.js";
import { resolvePythonEnv } from "../../src/worker/python-env.js";
import { ttsLayout } from "../graph/builders.js";

describe("the graph in Ready", () => {
  test("the worker's one-node LLM graph compiles and is served", () => {
    const golden = JSON.parse(readFileSync(join(packageRoot, "protocol", "golden", "ready.json"), "utf8")) as { value: { graph: unknown } };
    const graph = compileModelGraph(golden.value.graph);
    assert.deepEqual(graph.nodes.map((n) => [n.name, n.engine]), [["llm", "kv_cache"]]);
    assert.deepEqual(graph.walks.map((w) => w.name), ["prefill", "decode"]);
    assert.doesNotThrow(() => checkServableGraph(graph));
  });

  test("a malformed graph is refused naming the field", () => {
    assert.throws(() => compileModelGraph({ version: 1, nodes: "llm" }), /^GraphLayoutError: graph\.nodes: /);
  });

  test("the demo text-to-speech model's graph, as Python exports it, compiles", () => {
    const env = resolvePythonEnv();
    const script = [
      "import json, sys",
      "from baton_worker.graph.export import export_graph",
      "from baton_worker.models.demo_tts.graph_model import BatonDemoTTS",
      "print(json.dumps(export_graph(BatonDemoTTS(sys.argv[1]))))",
    ].join("\n");
    const run = spawnSync(env.python, ["-c", script, join(packageRoot, "models", "demo-tts")], { env: env.env, encoding: "utf8" });
    assert.equal(run.status, 0, run.stderr);
    const graph = compileModelGraph(JSON.parse(run.stdout));
    assert.deepEqual(graph.nodes.map((n) => [n.name, n.engine]), [["llm", "kv_cache"], ["codec", "stateless"]]);
    assert.deepEqual(graph.walks.map((w) => w.name), ["prefill", "decode", "codec_chunk"]);
    assert.deepEqual(graph.connections.map((c) => [c.edgeName, c.policy.kind, c.policy.size, c.policy.stride]), [["new_token", "sliding_window", 16, 4]]);
  });

  test("a text-to-speech graph compiles but is not served by this build, in one line", () => {
    const graph = compileModelGraph(ttsLayout());
    assert.throws(
      () => checkServableGraph(graph),
      (e: unknown) => e instanceof Error && /nodes llm \(kv_cache\), codec \(stateless\); this build serves graphs of one kv_cache node/.test(e.message) && !e.message.includes("\n"),
    );
  });
});
