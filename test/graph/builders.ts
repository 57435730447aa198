// Builds graphs in the exported layout (what the Python side's export_graph
// produces), with M*'s authoring names, so tests read like model code.

import {
  EMIT_TO_CLIENT,
  EMPTY_DESTINATION,
  type ChunkPolicySpec,
  type EngineKind,
  type LayoutEdge,
  type LayoutSection,
  type ModelGraphLayout,
  type WalkInput,
  type WalkStep,
} from "../../src/graph/layout.js";

export type Section =
  | { kind: "node"; node: string; inputs: string[]; outputs: LayoutEdge[] }
  | { kind: "sequential" | "parallel"; sections: Section[] }
  | { kind: "loop"; body: Section; maxIters: number; name: string; outputs: LayoutEdge[]; accumulated: LayoutEdge[] };

export function edge(to: string, name: string, opts: { persist?: boolean; newToken?: boolean } = {}): LayoutEdge {
  return { to, name, persist: opts.persist ?? false, new_token: opts.newToken ?? false, modality: "", target_partition: "" };
}

export function emit(name: string, modality: string): LayoutEdge {
  return { to: EMIT_TO_CLIENT, name, persist: false, new_token: false, modality, target_partition: "" };
}

export function persist(name: string, to: string = EMPTY_DESTINATION): LayoutEdge {
  return edge(to, name, { persist: true });
}

export function streamEdge(to: string, name: string, targetPartition: string): LayoutEdge {
  return { to, name, persist: false, new_token: false, modality: "", target_partition: targetPartition };
}

export function node(name: string, inputs: string[], outputs: LayoutEdge[]): Section {
  return { kind: "node", node: name, inputs, outputs };
}

export function seq(...sections: Section[]): Section {
  return { kind: "sequential", sections };
}

export function par(...sections: Section[]): Section {
  return { kind: "parallel", sections };
}

export function loop(
  body: Section,
  maxIters: number,
  opts: { name?: string; outputs?: LayoutEdge[]; accumulated?: LayoutEdge[] } = {},
): Section {
  return { kind: "loop", body, maxIters, name: opts.name ?? "", outputs: opts.outputs ?? [], accumulated: opts.accumulated ?? [] };
}

export function fromPrompt(nodeName: string, name: string, sourceName: string = name): WalkInput {
  return { node: nodeName, name, source: "prompt", source_name: sourceName };
}

export function fromPersist(nodeName: string, name: string, sourceName: string): WalkInput {
  return { node: nodeName, name, source: "persist", source_name: sourceName };
}

export function step(walk: string, inputs: WalkInput[] = [], release: string[] = []): WalkStep {
  return { walk, inputs, release };
}

export const done: WalkStep = { walk: "", inputs: [], release: [] };

export function fixed(size: number, continueAfterDone = false): ChunkPolicySpec {
  return { kind: "fixed", size, stride: 0, left: 0, continue_after_done: continueAfterDone };
}

export function slidingWindow(window: number, stride: number): ChunkPolicySpec {
  return { kind: "sliding_window", size: window, stride, left: 0, continue_after_done: false };
}

export function leftContext(chunk: number, left: number): ChunkPolicySpec {
  return { kind: "left_context", size: chunk, stride: 0, left, continue_after_done: false };
}

interface PartitionSpec {
  name: string;
  walks: string[];
  start: WalkStep | null;
  after?: Record<string, WalkStep>;
}

export interface GraphSpec {
  nodes: Record<string, EngineKind>;
  walks: Record<string, Section>;
  /** Default: one partition "default" with every walk, starting with the first walk fed from the prompt by `start`. */
  partitions?: PartitionSpec[];
  start?: WalkStep;
  connections?: { from: string; to: string; edge: string; policy: ChunkPolicySpec }[];
  /** Default: every (name, modality) some edge emits. */
  clientOutputs?: { name: string; modality: string }[];
}

/** The layout export_graph would produce for this spec. */
export function graphLayout(spec: GraphSpec): ModelGraphLayout {
  const sections: LayoutSection[] = [];
  const emitted = new Map<string, { name: string; modality: string }>();
  const noteEdges = (edges: LayoutEdge[]): void => {
    for (const e of edges) if (e.to === EMIT_TO_CLIENT) emitted.set(`${e.name}\0${e.modality}`, { name: e.name, modality: e.modality });
  };
  const flatten = (s: Section): number => {
    const index = sections.length;
    const base: LayoutSection = { kind: s.kind, node: "", inputs: [], outputs: [], accumulated_outputs: [], children: [], loop_name: "", max_iters: 0 };
    sections.push(base);
    switch (s.kind) {
      case "node":
        base.node = s.node;
        base.inputs = [...s.inputs];
        base.outputs = [...s.outputs];
        noteEdges(s.outputs);
        break;
      case "sequential":
      case "parallel":
        base.children = s.sections.map(flatten);
        break;
      case "loop":
        base.loop_name = s.name;
        base.max_iters = s.maxIters;
        base.outputs = [...s.outputs];
        base.accumulated_outputs = [...s.accumulated];
        noteEdges(s.outputs);
        noteEdges(s.accumulated);
        base.children = [flatten(s.body)];
        break;
    }
    return index;
  };
  const walkNames = Object.keys(spec.walks);
  const partitions: PartitionSpec[] = spec.partitions ?? [
    { name: "default", walks: walkNames, start: spec.start ?? step(walkNames[0]!), after: {} },
  ];
  const partitionOf = new Map<string, string>();
  for (const p of partitions) for (const w of p.walks) partitionOf.set(w, p.name);
  const walks = walkNames.map((name) => ({ name, partition: partitionOf.get(name) ?? "default", root: flatten(spec.walks[name]!) }));
  return {
    version: 1,
    nodes: Object.entries(spec.nodes).map(([name, engine]) => ({ name, engine, overlap: true, stop_token_ids: [], kv_inputs: engine === "kv_cache" ? ["embeds", "positions"] : [], frame_width: 0 })),
    sections,
    walks,
    partitions: partitions.map((p) => ({ name: p.name, walks: p.walks, start: p.start, after: p.after ?? {}, python_transitions: false })),
    connections: (spec.connections ?? []).map((c) => ({ from_partition: c.from, to_partition: c.to, edge_name: c.edge, policy: c.policy })),
    client_outputs: spec.clientOutputs ?? [...emitted.values()],
  };
}

/** The one-node LLM graph (contract): prefill then a decode loop. */
export function llmLayout(maxIters = 64): ModelGraphLayout {
  return graphLayout({
    nodes: { llm: "kv_cache" },
    walks: {
      prefill: node("llm", ["text_inputs"], [persist("new_token"), emit("new_token", "text")]),
      decode: loop(node("llm", ["text_inputs"], [edge("llm", "text_inputs"), emit("new_token", "text")]), maxIters, { name: "decode_loop" }),
    },
    partitions: [
      {
        name: "default",
        walks: ["prefill", "decode"],
        start: step("prefill", [fromPrompt("llm", "text_inputs")]),
        after: { prefill: step("decode", [fromPersist("llm", "text_inputs", "new_token")], ["new_token"]), decode: done },
      },
    ],
  });
}

/**
 * The TTS shape: llm (prefill + decode loop) streams new_token over a sliding
 * window to a stateless codec partition whose pass emits audio.
 */
export function ttsLayout(opts: { prefillStreams?: boolean; policy?: ChunkPolicySpec; maxIters?: number } = {}): ModelGraphLayout {
  const prefillOutputs = [persist("new_token")];
  if (opts.prefillStreams ?? true) prefillOutputs.push(streamEdge("codec", "new_token", "CODEC"));
  return graphLayout({
    nodes: { llm: "kv_cache", codec: "stateless" },
    walks: {
      prefill: node("llm", ["text_inputs"], prefillOutputs),
      decode: loop(node("llm", ["text_inputs"], [edge("llm", "text_inputs"), streamEdge("codec", "new_token", "CODEC")]), opts.maxIters ?? 2048, {
        name: "decode_loop",
      }),
      codec_chunk: node("codec", ["new_token"], [emit("audio", "audio")]),
    },
    partitions: [
      {
        name: "LLM",
        walks: ["prefill", "decode"],
        start: step("prefill", [fromPrompt("llm", "text_inputs")]),
        after: { prefill: step("decode", [fromPersist("llm", "text_inputs", "new_token")], ["new_token"]), decode: done },
      },
      { name: "CODEC", walks: ["codec_chunk"], start: step("codec_chunk"), after: { codec_chunk: step("codec_chunk") } },
    ],
    connections: [{ from: "LLM", to: "CODEC", edge: "new_token", policy: opts.policy ?? slidingWindow(28, 7) }],
  });
}
