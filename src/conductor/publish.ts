// Which tensors must leave their worker: an output (or a prompt value) is
// published to shared memory when some input slot it can reach belongs to a
// (node, walk) placed on another rank. Decided once from the compiled graph
// and the placement, so a colocated deployment never copies a tensor and a
// split one copies only what crosses. The reach is an over-approximation
// (every route a value may take, whatever the run decides), never an under one:
// a consumer on another rank always finds the bytes in shared memory.

import { ROUTE_PERSIST, ROUTE_SLOT, ROUTE_STREAM, type CompiledGraph, type Route } from "../graph/compile.js";

export interface PublishPlan {
  /** Per walk node id: the output names another rank consumes. */
  readonly outputs: readonly string[][];
  /** Prompt names (process_prompt runs on rank 0) another rank consumes. */
  readonly prompts: string[];
}

/** rankOfWalkNode[wn]: the rank a walk node runs on; promptRank: the rank that runs process_prompt. */
export function planPublishing(graph: CompiledGraph, rankOfWalkNode: readonly number[], promptRank: number): PublishPlan {
  // Slots fed by each persist id and each prompt name, through any partition's steps.
  const persistSlots: number[][] = graph.persistNames.map(() => []);
  const promptSlots: number[][] = graph.promptNames.map(() => []);
  for (const partition of graph.partitions) {
    for (const step of [partition.start, ...partition.after]) {
      if (step === null || step === undefined) continue;
      for (const input of step.inputs) {
        if (input.persist >= 0) persistSlots[input.persist]!.push(input.slot);
        if (input.prompt >= 0) promptSlots[input.prompt]!.push(input.slot);
      }
    }
  }
  const loopOfCapture = new Map<number, number>();
  for (const loop of graph.loops) for (const c of loop.captures) loopOfCapture.set(c.id, loop.id);

  const slotRank = (slot: number): number => rankOfWalkNode[graph.slotWalkNode[slot]!]!;
  const crossesSlots = (slots: readonly number[], rank: number): boolean => slots.some((s) => slotRank(s) !== rank);
  const crossesRoutes = (routes: readonly Route[], rank: number): boolean =>
    routes.some((r) => {
      if (r.kind === ROUTE_SLOT) return slotRank(r.target) !== rank;
      if (r.kind === ROUTE_STREAM) return crossesSlots(graph.connections[r.target]!.consumerSlots, rank);
      if (r.kind === ROUTE_PERSIST) return crossesSlots(persistSlots[r.target]!, rank);
      return false; // client outputs are rendered to bytes by the producer; drops go nowhere
    });
  // A captured value leaves its loop through the loop's output edges, or is captured again by the enclosing loop.
  const crossesCapture = (capture: number, rank: number): boolean => {
    const loop = graph.loops[loopOfCapture.get(capture)!]!;
    for (const o of loop.outputs) if (o.capture === capture && crossesRoutes(o.routes, rank)) return true;
    for (const pc of loop.parentCaptures) if (pc.from === capture && crossesCapture(pc.to, rank)) return true;
    return false;
  };

  const outputs = graph.walkNodes.map((wn) => {
    const rank = rankOfWalkNode[wn.id]!;
    const names = wn.outputNames.filter(
      (_, o) => crossesRoutes(wn.outputRoutes[o]!, rank) || wn.captures.some((c) => c.output === o && crossesCapture(c.capture, rank)),
    );
    return names;
  });
  const prompts = graph.promptNames.filter((_, p) => crossesSlots(promptSlots[p]!, promptRank));
  return { outputs, prompts };
}
