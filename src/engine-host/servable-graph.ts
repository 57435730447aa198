// Which compiled graphs the serving path runs today: the one-node LLM graph
// (one kv_cache node, walks prefill and decode), which the engine core
// serves directly. Multi-node graphs compile (so their errors show at start)
// but are refused here until the conductor drives the workers.

import type { CompiledGraph } from "../graph/compile.js";

export function checkServableGraph(graph: CompiledGraph): void {
  const nodes = graph.nodes.map((n) => `${n.name} (${n.engine})`);
  if (graph.nodes.length !== 1 || graph.nodes[0]!.engine !== "kv_cache") {
    throw new Error(`the model's graph has nodes ${nodes.join(", ")}; this build serves graphs of one kv_cache node`);
  }
}
