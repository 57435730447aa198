// The model graph as the worker exports it (Ready.graph): flat tables, sections
// refer to their children by index. This file is the TypeScript side of the
// layout in the graph contract; `parseGraphLayout` turns decoded msgpack/JSON
// into it and names the field path of the first thing that is wrong. Meaning
// (which names exist, which edges are legal) is checked by compile.ts.

import { z } from "zod";

export const EMIT_TO_CLIENT = "emit_to_client";
export const EMPTY_DESTINATION = "";

export type EngineKind = "kv_cache" | "stateless";
/** What a kv_cache node's prefill input after its token ids is: AddedRequest.embeds, .positions or .encoder_states. */
const KV_INPUT_ROLES = ["embeds", "positions", "encoder_states"] as const;
export type KvInputRole = (typeof KV_INPUT_ROLES)[number];

interface LayoutNode {
  name: string;
  engine: EngineKind;
  /** May the node's next step be scheduled before this one's result is back. */
  overlap: boolean;
  /** kv_cache nodes: token ids that end the node's generation (the model's own, beside a request's stops). */
  stop_token_ids: number[];
  /** A kv_cache node's prefill inputs after its token ids, in order (GraphModel.get_kv_input_roles). */
  kv_inputs: KvInputRole[];
  /** A kv_cache node whose every sampled position is a frame of this many ids (CSM; StepResult.frames); 0: a token per position. */
  frame_width: number;
}

export interface LayoutEdge {
  /** A node name, EMIT_TO_CLIENT, or EMPTY_DESTINATION. */
  to: string;
  name: string;
  persist: boolean;
  new_token: boolean;
  /** Output modality of an EMIT_TO_CLIENT edge ("" otherwise). */
  modality: string;
  /** Consumer partition of a streaming edge ("" otherwise). */
  target_partition: string;
}

type SectionKind = "node" | "sequential" | "parallel" | "loop";

export interface LayoutSection {
  kind: SectionKind;
  node: string;
  inputs: string[];
  outputs: LayoutEdge[];
  accumulated_outputs: LayoutEdge[];
  children: number[];
  loop_name: string;
  max_iters: number;
}

interface LayoutWalk {
  name: string;
  partition: string;
  root: number;
}

type WalkInputSource = "prompt" | "persist";

export interface WalkInput {
  node: string;
  name: string;
  source: WalkInputSource;
  source_name: string;
}

export interface WalkStep {
  /** "" = the partition is done. */
  walk: string;
  inputs: WalkInput[];
  release: string[];
}

interface LayoutPartition {
  name: string;
  walks: string[];
  /** null: inactive from the start. */
  start: WalkStep | null;
  after: Record<string, WalkStep>;
  python_transitions: boolean;
}

type ChunkPolicyKind = "fixed" | "sliding_window" | "left_context";

export interface ChunkPolicySpec {
  kind: ChunkPolicyKind;
  /** fixed: chunk size; sliding_window: window; left_context: chunk. */
  size: number;
  /** sliding_window only. */
  stride: number;
  /** left_context only. */
  left: number;
  /** fixed only. */
  continue_after_done: boolean;
}

interface LayoutConnection {
  from_partition: string;
  to_partition: string;
  edge_name: string;
  policy: ChunkPolicySpec;
}

interface LayoutClientOutput {
  name: string;
  modality: string;
}

export interface ModelGraphLayout {
  version: 1;
  nodes: LayoutNode[];
  sections: LayoutSection[];
  walks: LayoutWalk[];
  partitions: LayoutPartition[];
  connections: LayoutConnection[];
  client_outputs: LayoutClientOutput[];
}

const count = z.number().int().nonnegative();

const edgeSchema = z
  .object({
    to: z.string(),
    name: z.string().min(1),
    persist: z.boolean(),
    new_token: z.boolean(),
    modality: z.string(),
    target_partition: z.string(),
  })
  .strict();

const sectionSchema = z
  .object({
    kind: z.enum(["node", "sequential", "parallel", "loop"]),
    node: z.string(),
    inputs: z.array(z.string().min(1)),
    outputs: z.array(edgeSchema),
    accumulated_outputs: z.array(edgeSchema),
    children: z.array(count),
    loop_name: z.string(),
    max_iters: z.number().int(),
  })
  .strict();

const walkInputSchema = z
  .object({
    node: z.string().min(1),
    name: z.string().min(1),
    source: z.enum(["prompt", "persist"]),
    source_name: z.string().min(1),
  })
  .strict();

const walkStepSchema = z
  .object({
    walk: z.string(),
    inputs: z.array(walkInputSchema),
    release: z.array(z.string().min(1)),
  })
  .strict();

const layoutSchema = z
  .object({
    version: z.literal(1),
    nodes: z.array(
      z
        .object({
          name: z.string().min(1),
          engine: z.enum(["kv_cache", "stateless"]),
          overlap: z.boolean(),
          stop_token_ids: z.array(z.number().int().nonnegative()).default([]),
          kv_inputs: z.array(z.enum(KV_INPUT_ROLES)).default(["embeds", "positions"]),
          frame_width: z.number().int().nonnegative().default(0),
        })
        .strict(),
    ),
    sections: z.array(sectionSchema),
    walks: z.array(z.object({ name: z.string().min(1), partition: z.string().min(1), root: count }).strict()),
    partitions: z.array(
      z
        .object({
          name: z.string().min(1),
          walks: z.array(z.string().min(1)),
          start: walkStepSchema.nullable(),
          after: z.record(z.string(), walkStepSchema),
          python_transitions: z.boolean(),
        })
        .strict(),
    ),
    connections: z.array(
      z
        .object({
          from_partition: z.string().min(1),
          to_partition: z.string().min(1),
          edge_name: z.string().min(1),
          policy: z
            .object({
              kind: z.enum(["fixed", "sliding_window", "left_context"]),
              size: count,
              stride: count,
              left: count,
              continue_after_done: z.boolean(),
            })
            .strict(),
        })
        .strict(),
    ),
    client_outputs: z.array(z.object({ name: z.string().min(1), modality: z.string().min(1) }).strict()),
  })
  .strict();

export class GraphLayoutError extends Error {
  override readonly name = "GraphLayoutError";
}

function pathText(path: readonly (string | number)[]): string {
  let text = "graph";
  for (const part of path) text += typeof part === "number" ? `[${part}]` : `.${part}`;
  return text;
}

/** Decoded Ready.graph -> ModelGraphLayout; throws GraphLayoutError naming the field. */
export function parseGraphLayout(data: unknown): ModelGraphLayout {
  const parsed = layoutSchema.safeParse(data);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    if (issue === undefined) throw new GraphLayoutError("graph: invalid layout");
    throw new GraphLayoutError(`${pathText(issue.path)}: ${issue.message}`);
  }
  // Every schema field maps one to one onto the interfaces above; `satisfies`
  // keeps the two from drifting apart.
  return parsed.data satisfies ModelGraphLayout;
}
