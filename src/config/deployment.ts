// `--deployment FILE.yaml`: where a model's graph nodes run, in M*'s format.
//
//   max_seq_len: 4096                 # optional here (M* requires it): the default --max-model-len
//   max_concurrent_requests: 64       # optional: requests admitted at once (the rest wait in order)
//   kv_cache: {max_num_pages: 2048}   # optional: KV blocks per KV-cache worker (--num-gpu-blocks-override)
//   model_kwargs: {...}               # optional: passed to the model's constructor
//   node_groups:
//     - node_names: [llm]
//       ranks: [0]
//       graph_walks: [prefill, decode]   # optional: place the nodes only for these walks
//       tp_size: 1                       # optional: ranks per instance; more ranks = replicas
//
// Each rank is one worker process. Without a file every node lives on rank 0.
// A kv_cache node whose prefill and decode walks are placed on two ranks is
// served with prefill/decode disaggregation (src/kv-connector/, examples/pd.yaml).
// Placement changes where work runs, never what it computes, so the model's
// walks never depend on this file; a file that names an unknown node or walk,
// lists a rank twice, places a node twice for one walk, or leaves a node
// unhosted is refused with one line saying which.

import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { z } from "zod";

export class DeploymentError extends Error {
  override name = "DeploymentError";
}

interface NodeGroup {
  nodeNames: string[];
  ranks: number[];
  /** null: the nodes are placed for every walk they appear in. */
  graphWalks: string[] | null;
  tpSize: number;
}

export interface Deployment {
  source: string;
  model: string | null;
  maxSeqLen: number | null;
  maxConcurrentRequests: number | null;
  kvCache: { maxNumPages: number | null; cpuOffloadPages: number | null };
  modelKwargs: Record<string, unknown>;
  nodeGroups: NodeGroup[];
}

const positiveInt = z.number().int().positive();
const rank = z.number().int().nonnegative();

const nodeGroupSchema = z
  .object({
    node_names: z.array(z.string().min(1)).min(1),
    ranks: z.array(rank).min(1),
    graph_walks: z.array(z.string().min(1)).min(1).optional(),
    tp_size: positiveInt.optional(),
  })
  .strict();

// M*'s other top-level keys (sharding_config, autocast_dtype) configure what
// Baton does not do yet; they are refused by name rather than ignored.
const deploymentSchema = z
  .object({
    model: z.string().optional(),
    max_seq_len: positiveInt.optional(),
    max_concurrent_requests: positiveInt.optional(),
    kv_cache: z
      .object({ max_num_pages: positiveInt.optional(), cpu_offload_pages: z.number().int().nonnegative().optional() })
      .strict()
      .optional(),
    model_kwargs: z.record(z.unknown()).optional(),
    node_groups: z.array(nodeGroupSchema).min(1),
  })
  .strict();

function issueLine(source: string, issue: z.ZodIssue): string {
  const path = issue.path.map((p, i) => (typeof p === "number" ? `[${p}]` : i === 0 ? p : `.${p}`)).join("");
  if (issue.code === "unrecognized_keys") {
    const where = path === "" ? "" : `${path}: `;
    return `${source}: ${where}unknown key${issue.keys.length > 1 ? "s" : ""} ${issue.keys.map((k) => `"${k}"`).join(", ")}`;
  }
  return `${source}: ${path === "" ? "" : `${path}: `}${issue.message.toLowerCase()}`;
}

/** Parses a deployment file's text; `source` names it in errors. */
export function parseDeployment(text: string, source: string): Deployment {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (error) {
    throw new DeploymentError(`${source}: not valid YAML: ${(error as Error).message.split("\n")[0]}`);
  }
  const parsed = deploymentSchema.safeParse(doc);
  if (!parsed.success) throw new DeploymentError(issueLine(source, parsed.error.issues[0]!));
  const d = parsed.data;
  const nodeGroups = d.node_groups.map((g, i): NodeGroup => {
    const where = `${source}: node_groups[${i}]`;
    const seen = new Set<number>();
    for (const r of g.ranks) {
      if (seen.has(r)) throw new DeploymentError(`${where}.ranks: rank ${r} is listed twice`);
      seen.add(r);
    }
    const names = new Set<string>();
    for (const n of g.node_names) {
      if (names.has(n)) throw new DeploymentError(`${where}.node_names: node "${n}" is listed twice`);
      names.add(n);
    }
    const tpSize = g.tp_size ?? 1;
    if (g.ranks.length % tpSize !== 0) {
      throw new DeploymentError(`${where}: ${g.ranks.length} ranks do not split into instances of tp_size ${tpSize}`);
    }
    return { nodeNames: g.node_names, ranks: g.ranks, graphWalks: g.graph_walks ?? null, tpSize };
  });
  return {
    source,
    model: d.model ?? null,
    maxSeqLen: d.max_seq_len ?? null,
    maxConcurrentRequests: d.max_concurrent_requests ?? null,
    kvCache: { maxNumPages: d.kv_cache?.max_num_pages ?? null, cpuOffloadPages: d.kv_cache?.cpu_offload_pages ?? null },
    modelKwargs: d.model_kwargs ?? {},
    nodeGroups,
  };
}

export function readDeployment(path: string): Deployment {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new DeploymentError(`cannot read the deployment file ${path}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`);
  }
  return parseDeployment(text, path);
}

/** What placement needs to know of a model's graph: its nodes and which nodes each walk runs. */
export interface GraphShape {
  nodes: readonly string[];
  walks: ReadonlyArray<{ name: string; nodes: readonly string[] }>;
}

/** One copy of a node for a walk: `tpSize` ranks that run it in lockstep. */
type Instance = readonly number[];

export interface Placement {
  /** Every worker rank, ascending: one worker process each. */
  ranks: readonly number[];
  /** The instances (replicas) that host `node` for `walk`; never empty for a node the walk runs. */
  instances(node: string, walk: string): readonly Instance[];
}

function key(node: string, walk: string): string {
  return `${node}\u0000${walk}`;
}

/** Places every (node, walk) of the graph; `deployment` null puts everything on rank 0. */
export function placeGraph(deployment: Deployment | null, graph: GraphShape): Placement {
  const table = new Map<string, Instance[]>();
  if (deployment === null) {
    for (const walk of graph.walks) for (const node of walk.nodes) table.set(key(node, walk.name), [[0]]);
    return { ranks: [0], instances: (node, walk) => table.get(key(node, walk)) ?? [] };
  }
  const source = deployment.source;
  const known = new Set(graph.nodes);
  const walkNodes = new Map(graph.walks.map((w) => [w.name, new Set(w.nodes)]));
  const placedBy = new Map<string, number>();
  const ranks = new Set<number>();
  deployment.nodeGroups.forEach((group, g) => {
    const where = `${source}: node_groups[${g}]`;
    for (const node of group.nodeNames) {
      if (!known.has(node)) {
        throw new DeploymentError(`${where}.node_names: unknown node "${node}" (the model's nodes: ${graph.nodes.join(", ")})`);
      }
    }
    const walks = group.graphWalks ?? graph.walks.map((w) => w.name);
    for (const walk of walks) {
      if (!walkNodes.has(walk)) {
        throw new DeploymentError(`${where}.graph_walks: unknown walk "${walk}" (the model's walks: ${graph.walks.map((w) => w.name).join(", ")})`);
      }
    }
    const instances: Instance[] = [];
    for (let i = 0; i < group.ranks.length; i += group.tpSize) instances.push(group.ranks.slice(i, i + group.tpSize));
    for (const node of group.nodeNames) {
      let placedSomewhere = false;
      for (const walk of walks) {
        if (!walkNodes.get(walk)!.has(node)) {
          if (group.graphWalks !== null) {
            throw new DeploymentError(`${where}.graph_walks: walk "${walk}" does not run node "${node}"`);
          }
          continue;
        }
        const k = key(node, walk);
        const earlier = placedBy.get(k);
        if (earlier !== undefined) {
          throw new DeploymentError(`${source}: node "${node}" is placed twice for walk "${walk}": node_groups[${earlier}] and node_groups[${g}]`);
        }
        placedBy.set(k, g);
        table.set(k, instances);
        placedSomewhere = true;
      }
      if (!placedSomewhere) throw new DeploymentError(`${where}: node "${node}" runs in none of the walks it is placed for`);
    }
    for (const r of group.ranks) ranks.add(r);
  });
  for (const walk of graph.walks) {
    for (const node of walk.nodes) {
      if (!table.has(key(node, walk.name))) {
        throw new DeploymentError(`${source}: node "${node}" is hosted by no node_group (it runs in walk "${walk.name}")`);
      }
    }
  }
  const sorted = [...ranks].sort((a, b) => a - b);
  return { ranks: sorted, instances: (node, walk) => table.get(key(node, walk)) ?? [] };
}
