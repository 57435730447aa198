// Starts the model workers a deployment asks for, one supervised process per
// rank, and works out where each (node, walk) runs. Without a deployment one
// worker hosts every node. Rank 0 starts first: its Ready carries the model's
// graph, which the deployment is checked against (a file naming an unknown
// node or leaving a node unhosted is refused in one line) before the other
// ranks start.
//
// Each rank's WorkerSupervisor restarts its worker after a death; the events
// reach the graph engine through applyWorkerEvent (the other ranks go on)
// and the frontend through a WorkerHealthEvent.

import { createServer } from "node:net";
import { placeGraph, DeploymentError, type Deployment } from "../config/deployment.js";
import { compileModelGraph, type CompiledGraph } from "../graph/compile.js";
import { arenaShare } from "../worker/shm-segments.js";
import { WorkerSupervisor, type RestartPolicy, type WorkerEvent } from "../worker/supervisor.js";
import type { WorkerClient, WorkerOptions } from "../worker/types.js";
import type { WorkerHealthEvent } from "../worker/types.js";
import type { ModelEngine } from "./model-engine.js";

export interface GraphWorkers {
  graph: CompiledGraph;
  /** By rank. */
  supervisors: WorkerSupervisor[];
  rankOf(node: string, walk: string): number;
}

/** The nodes each rank hosts, by rank; ranks must be 0..n-1. */
function nodesByRank(deployment: Deployment): string[][] {
  const byRank = new Map<number, Set<string>>();
  for (const group of deployment.nodeGroups) {
    for (const r of group.ranks) {
      let nodes = byRank.get(r);
      if (nodes === undefined) byRank.set(r, (nodes = new Set()));
      for (const n of group.nodeNames) nodes.add(n);
    }
  }
  const ranks = [...byRank.keys()].sort((a, b) => a - b);
  ranks.forEach((r, i) => {
    if (r !== i) throw new DeploymentError(`${deployment.source}: ranks must be 0..${ranks.length - 1}, one worker each; rank ${i} is missing`);
  });
  return ranks.map((r) => [...byRank.get(r)!]);
}

/** Worker options of one rank: its nodes, and the deployment's KV and length settings. */
function rankOptions(
  base: WorkerOptions,
  deployment: Deployment | null,
  rank: number,
  nodes: string[] | undefined,
  shmShare: number,
  kvTransfer: WorkerOptions["kvTransfer"],
  numRanks: number,
): WorkerOptions {
  if (deployment === null) return base;
  return {
    ...base,
    kvTransfer,
    nodes,
    rank,
    shmBytes: base.shmBytes ?? (shmShare > 0 ? shmShare : undefined),
    // Every rank runs on this host: they share its cores.
    hostWorkers: (base.hostWorkers ?? 1) * numRanks,
    numBlocks: base.numBlocks ?? deployment.kvCache.maxNumPages ?? undefined,
    maxModelLen: base.maxModelLen ?? deployment.maxSeqLen ?? undefined,
    modelKwargs: deployment.modelKwargs,
    // One progress bar: rank 0's.
    onLoadProgress: rank === 0 ? base.onLoadProgress : undefined,
  };
}

/**
 * Starts every rank; on any failure stops what started and rejects
 * (WorkerStartError or DeploymentError). `onEvent` hears every later death,
 * restart and give-up.
 */
export async function startGraphWorkers(
  base: WorkerOptions,
  deployment: Deployment | null,
  restart: RestartPolicy,
  onEvent: (event: WorkerEvent) => void,
  signal?: AbortSignal,
): Promise<GraphWorkers> {
  const nodes = deployment === null ? [undefined] : nodesByRank(deployment);
  // Tensors cross between workers through shared memory: each worker of a split deployment gets its share.
  const shmShare = nodes.length > 1 ? arenaShare(nodes.length) : 0;
  const supervisors: WorkerSupervisor[] = [];
  // Walks split over ranks may put a kv_cache node's prefill and decode apart: the KV connector's rendezvous.
  const splitsWalks = nodes.length > 1 && deployment !== null && deployment.nodeGroups.some((g) => g.graphWalks !== null);
  const kvTransfer = splitsWalks ? { address: `127.0.0.1:${await freePort()}`, worldSize: nodes.length } : undefined;
  const start = (rank: number): Promise<WorkerSupervisor> =>
    WorkerSupervisor.start(rank, rankOptions(base, deployment, rank, nodes[rank], shmShare, kvTransfer, nodes.length), restart, onEvent, signal);
  try {
    supervisors.push(await start(0));
    const graph = compileModelGraph(supervisors[0]!.client.ready.graph);
    const shape = {
      nodes: graph.nodes.map((n) => n.name),
      walks: graph.walks.map((w) => ({ name: w.name, nodes: graph.walkNodes.slice(w.walkNodeStart, w.walkNodeEnd).map((wn) => wn.node.name) })),
    };
    const placement = placeGraph(deployment, shape);
    const rest = await Promise.allSettled(nodes.slice(1).map((_, i) => start(i + 1)));
    for (const r of rest) if (r.status === "fulfilled") supervisors.push(r.value);
    const failed = rest.find((r) => r.status === "rejected");
    if (failed !== undefined) throw (failed as PromiseRejectedResult).reason;
    return {
      graph,
      supervisors,
      rankOf: (node, walk) => placement.instances(node, walk)[0]?.[0] ?? 0,
    };
  } catch (error) {
    await Promise.all(supervisors.map((s) => s.stop()));
    throw error;
  }
}

/** A TCP port free now on the loopback interface (the OS picks it). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** The current worker of every rank. */
export function currentWorkers(supervisors: readonly WorkerSupervisor[]): WorkerClient[] {
  return supervisors.map((s) => s.client);
}

/** Tells the model's engines about a worker's death, restart or loss for good. */
export function applyWorkerEvent(engine: ModelEngine, event: WorkerEvent): void {
  switch (event.kind) {
    case "down":
      engine.workerLost(event.rank, event.exit.summary);
      return;
    case "up":
      engine.workerRestarted(event.rank, event.client);
      return;
    case "gave-up":
      engine.workerGone(event.rank, event.message);
      return;
  }
}

/** The event as the frontend sees it (plain data: it may cross threads). */
export function healthEventOf(event: WorkerEvent): WorkerHealthEvent {
  switch (event.kind) {
    case "down":
      return { kind: "down", rank: event.rank, exit: event.exit, restartInMs: event.restartInMs };
    case "up":
      return { kind: "up", rank: event.rank, pid: event.client.pid, restarts: event.restarts };
    case "gave-up":
      return { kind: "gave-up", rank: event.rank, exit: event.exit, message: event.message };
  }
}
