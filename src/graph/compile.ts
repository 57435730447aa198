// Validates an exported ModelGraphLayout once, at start-up, and compiles it into
// one immutable CompiledGraph that every request's walk state indexes into.
//
// Numbering: walks own contiguous ranges of sections, walk nodes (a node as it
// appears in one walk), loops and input slots, laid out depth first, so a loop's
// body is one contiguous range of each; resetting an iteration or a walk is a
// loop over a range. Every declared input of a walk node is one slot. Routing a
// node's outputs is: output index -> Route[] -> slot / client output / stream /
// persist id, all integers.
//
// Classification of inputs follows docs/graph-semantics.md, "Input
// classification" (M*'s construction-time rules), keyed by (name, destination)
// = slot: a loop's external inputs are re-injected every iteration; its
// loop-back inputs come from its own body and are dropped after the last
// iteration.

import { chunkPolicyProblem } from "./chunk-policy.js";
import {
  EMIT_TO_CLIENT,
  EMPTY_DESTINATION,
  type ChunkPolicySpec,
  type EngineKind,
  type KvInputRole,
  type LayoutEdge,
  type LayoutSection,
  type ModelGraphLayout,
  type WalkStep,
  parseGraphLayout,
} from "./layout.js";

export class GraphCompileError extends Error {
  override readonly name = "GraphCompileError";
}

export const ROUTE_SLOT = 0;
export const ROUTE_CLIENT = 1;
export const ROUTE_STREAM = 2;
export const ROUTE_PERSIST = 3;
export const ROUTE_DROP = 4;
type RouteKind = typeof ROUTE_SLOT | typeof ROUTE_CLIENT | typeof ROUTE_STREAM | typeof ROUTE_PERSIST | typeof ROUTE_DROP;

export interface Route {
  readonly kind: RouteKind;
  /** Slot id, client output index, connection id or persist id (by kind); -1 for drop. */
  readonly target: number;
  /** The loop whose loop-back edge this is (dropped after its last iteration), or -1. */
  readonly loopBackOf: number;
  /** A kv_cache node feeding itself inside a loop: the engine core carries it, the conductor does not route it. */
  readonly engineCarried: boolean;
}

export interface CompiledNode {
  readonly id: number;
  readonly name: string;
  readonly engine: EngineKind;
  readonly overlap: boolean;
  readonly stopTokenIds: readonly number[];
  /** A kv_cache node's prefill inputs after its token ids (layout kv_inputs). */
  readonly kvInputs: readonly KvInputRole[];
  /** Ids per sampled position (a frame model); 0: one token. */
  readonly frameWidth: number;
}

const SECTION_NODE = 0;
const SECTION_SEQUENTIAL = 1;
const SECTION_PARALLEL = 2;
export const SECTION_LOOP = 3;
type CompiledSectionKind = typeof SECTION_NODE | typeof SECTION_SEQUENTIAL | typeof SECTION_PARALLEL | typeof SECTION_LOOP;

interface CompiledSection {
  readonly id: number;
  readonly kind: CompiledSectionKind;
  readonly walk: number;
  /** Enclosing section, -1 for a walk's root. */
  readonly parent: number;
  readonly children: readonly number[];
  /** Kind node: its walk node; -1 otherwise. */
  readonly walkNode: number;
  /** Kind loop: its loop; -1 otherwise. */
  readonly loop: number;
}

interface LoopCapture {
  /** Global capture id (index of per-request capture storage). */
  readonly id: number;
  readonly loop: number;
  readonly name: string;
  /** accumulated_outputs (one value per iteration run) rather than outputs (the last iteration's). */
  readonly accumulate: boolean;
}

export interface CompiledLoop {
  readonly id: number;
  readonly name: string;
  readonly walk: number;
  readonly section: number;
  readonly maxIters: number;
  /** Enclosing loop, -1 if none. */
  readonly parent: number;
  /** Body ranges (half-open). */
  readonly sectionStart: number;
  readonly sectionEnd: number;
  readonly walkNodeStart: number;
  readonly walkNodeEnd: number;
  /** Loops nested in the body: (id, loopEnd). */
  readonly loopEnd: number;
  readonly slotStart: number;
  readonly slotEnd: number;
  /** Slots fed from outside the body: re-injected every iteration. */
  readonly externalSlots: readonly number[];
  /** Id of the per-request cache of externalSlots[0] (then +1, +2, ...). */
  readonly externalCacheStart: number;
  /** Slots its own body feeds back: dropped after the last iteration. */
  readonly loopBackSlots: readonly number[];
  readonly captures: readonly LoopCapture[];
  /**
   * The body is one kv_cache node fed only by its own token (the LLM's decode
   * loop): its walk node, so an iteration can advance without a general reset; -1 otherwise.
   */
  readonly engineCarriedBody: number;
  /** Output edges (outputs then accumulated_outputs), each fed from one capture. */
  readonly outputs: readonly { readonly capture: number; readonly routes: readonly Route[] }[];
  /** This loop's captures that the enclosing loop captures too (same name). */
  readonly parentCaptures: readonly { readonly from: number; readonly to: number }[];
}

export interface CompiledWalkNode {
  readonly id: number;
  readonly node: CompiledNode;
  readonly walk: number;
  readonly section: number;
  /** Enclosing loops, outermost first. */
  readonly loops: readonly number[];
  /** Innermost enclosing loop, -1 if none. */
  readonly loop: number;
  readonly inputNames: readonly string[];
  /** Slots slotStart .. slotStart + inputNames.length - 1, in inputNames order. */
  readonly slotStart: number;
  /** Inputs that are not streaming. */
  readonly normalInputs: number;
  /** Streaming input slots. */
  readonly streamSlots: readonly number[];
  /** Distinct names of its output edges. */
  readonly outputNames: readonly string[];
  readonly outputRoutes: readonly (readonly Route[])[];
  /** Outputs the innermost loop captures: (output index, capture id). */
  readonly captures: readonly { readonly output: number; readonly capture: number }[];
  /**
   * kv_cache node in a loop that takes nothing from inside the loop but its own
   * token: its self loop-back slots, carried by the engine core. Empty otherwise.
   */
  readonly engineCarriedSlots: readonly number[];
}

interface CompiledStepInput {
  readonly slot: number;
  /** Prompt name id, or -1. */
  readonly prompt: number;
  /** Persist name id, or -1. */
  readonly persist: number;
}

export interface CompiledStep {
  /** -1: the partition is done. */
  readonly walk: number;
  readonly inputs: readonly CompiledStepInput[];
  readonly release: readonly number[];
}

interface CompiledPartition {
  readonly id: number;
  readonly name: string;
  readonly walks: readonly number[];
  /** null: inactive from the start. */
  readonly start: CompiledStep | null;
  /** By walk id; undefined for walks of other partitions, null = done after that walk. */
  readonly after: readonly (CompiledStep | null | undefined)[];
  readonly incoming: readonly number[];
  readonly outgoing: readonly number[];
  readonly pythonTransitions: boolean;
}

interface CompiledConnection {
  readonly id: number;
  readonly from: number;
  readonly to: number;
  readonly edgeName: string;
  readonly policy: ChunkPolicySpec;
  /** Streaming slots it feeds (in walks of `to`). */
  readonly consumerSlots: readonly number[];
}

export interface CompiledWalk {
  readonly id: number;
  readonly name: string;
  readonly partition: number;
  readonly root: number;
  readonly sectionStart: number;
  readonly sectionEnd: number;
  readonly walkNodeStart: number;
  readonly walkNodeEnd: number;
  readonly loopStart: number;
  readonly loopEnd: number;
  readonly slotStart: number;
  readonly slotEnd: number;
}

export interface CompiledClientOutput {
  readonly id: number;
  readonly name: string;
  readonly modality: string;
}

export interface CompiledGraph {
  readonly nodes: readonly CompiledNode[];
  readonly walks: readonly CompiledWalk[];
  readonly sections: readonly CompiledSection[];
  readonly walkNodes: readonly CompiledWalkNode[];
  readonly loops: readonly CompiledLoop[];
  readonly captureCount: number;
  readonly partitions: readonly CompiledPartition[];
  readonly connections: readonly CompiledConnection[];
  readonly clientOutputs: readonly CompiledClientOutput[];
  readonly promptNames: readonly string[];
  readonly persistNames: readonly string[];
  /** Per slot: its walk node. */
  readonly slotWalkNode: Int32Array;
  /** Per slot: its index among the walk node's inputs. */
  readonly slotInput: Int32Array;
  /** Per slot: the connection feeding it, -1 for a normal input. */
  readonly slotConnection: Int32Array;
  /** Per slot: loops that re-inject it (it is external to them), outermost first. */
  readonly slotExternalOf: readonly (readonly number[])[];
  /** Per slot, parallel to slotExternalOf: the external cache ids. */
  readonly slotExternalCaches: readonly (readonly number[])[];
  readonly externalCacheCount: number;
  /** Per slot: the loop it is loop-back of, -1 if none. */
  readonly slotLoopBackOf: Int32Array;
  readonly nodeByName: ReadonlyMap<string, CompiledNode>;
  readonly walkByName: ReadonlyMap<string, CompiledWalk>;
  readonly partitionByName: ReadonlyMap<string, CompiledPartition>;
}

/** The walk node of `node` in `walk`, or undefined. */
export function findWalkNode(graph: CompiledGraph, walk: string, node: string): CompiledWalkNode | undefined {
  const w = graph.walkByName.get(walk);
  if (w === undefined) return undefined;
  for (let i = w.walkNodeStart; i < w.walkNodeEnd; i++) {
    const wn = graph.walkNodes[i]!;
    if (wn.node.name === node) return wn;
  }
  return undefined;
}

// ---------------------------------------------------------------------------

interface MutableRoute {
  kind: RouteKind;
  target: number;
  loopBackOf: number;
  engineCarried: boolean;
  /** Compile-time only: the producer (walk node id, or -1 - loop id for a loop output). */
  producerLoops: readonly number[];
  producerWalkNode: number;
}

interface MutableLoop {
  id: number;
  name: string;
  walk: number;
  section: number;
  maxIters: number;
  parent: number;
  sectionStart: number;
  sectionEnd: number;
  walkNodeStart: number;
  walkNodeEnd: number;
  loopEnd: number;
  slotStart: number;
  slotEnd: number;
  externalSlots: number[];
  externalCacheStart: number;
  loopBackSlots: number[];
  captures: LoopCapture[];
  outputs: { capture: number; routes: MutableRoute[] }[];
  parentCaptures: { from: number; to: number }[];
  layout: LayoutSection;
}

interface MutableWalkNode {
  id: number;
  node: CompiledNode;
  walk: number;
  section: number;
  loops: number[];
  loop: number;
  inputNames: string[];
  slotStart: number;
  normalInputs: number;
  streamSlots: number[];
  outputNames: string[];
  outputRoutes: MutableRoute[][];
  captures: { output: number; capture: number }[];
  engineCarriedSlots: number[];
  layout: LayoutSection;
}

interface MutableSection {
  id: number;
  kind: CompiledSectionKind;
  walk: number;
  parent: number;
  children: number[];
  walkNode: number;
  loop: number;
}

interface Derived {
  ext: Set<number>;
  out: Set<number>;
  loopBack: Set<number>;
}

const SECTION_KIND = { node: SECTION_NODE, sequential: SECTION_SEQUENTIAL, parallel: SECTION_PARALLEL, loop: SECTION_LOOP } as const;

function fail(message: string): never {
  throw new GraphCompileError(message);
}

function edgeText(edge: LayoutEdge): string {
  const to = edge.to === EMPTY_DESTINATION ? '""' : edge.to;
  return `edge ${edge.name} -> ${to}`;
}

/** Validates the layout (every rule of the graph contract) and compiles it. Throws GraphCompileError, one line. */
export function compileGraph(layout: ModelGraphLayout): CompiledGraph {
  // Nodes ------------------------------------------------------------------
  const nodes: CompiledNode[] = [];
  const nodeByName = new Map<string, CompiledNode>();
  for (const n of layout.nodes) {
    if (nodeByName.has(n.name)) fail(`node ${n.name} is declared twice`);
    if (n.name === EMIT_TO_CLIENT) fail(`node ${n.name}: the name is reserved for client outputs`);
    const node: CompiledNode = {
      id: nodes.length,
      name: n.name,
      engine: n.engine,
      overlap: n.overlap,
      stopTokenIds: Object.freeze([...n.stop_token_ids]),
      kvInputs: Object.freeze([...n.kv_inputs]),
      frameWidth: n.frame_width,
    };
    nodes.push(node);
    nodeByName.set(n.name, node);
  }

  // Partitions and walks ----------------------------------------------------
  const partitionIndex = new Map<string, number>();
  layout.partitions.forEach((p, i) => {
    if (partitionIndex.has(p.name)) fail(`partition ${p.name} is declared twice`);
    partitionIndex.set(p.name, i);
  });
  const walkIndex = new Map<string, number>();
  layout.walks.forEach((w, i) => {
    if (walkIndex.has(w.name)) fail(`walk ${w.name} is declared twice`);
    walkIndex.set(w.name, i);
  });
  const walkPartition = new Map<string, string>();
  for (const p of layout.partitions) {
    for (const w of p.walks) {
      if (!walkIndex.has(w)) fail(`partition ${p.name}: unknown walk ${w}`);
      const other = walkPartition.get(w);
      if (other !== undefined) fail(`walk ${w} is in two partitions: ${other} and ${p.name}`);
      walkPartition.set(w, p.name);
    }
  }
  for (const w of layout.walks) {
    if (!partitionIndex.has(w.partition)) fail(`walk ${w.name}: unknown partition ${w.partition}`);
    const listed = walkPartition.get(w.name);
    if (listed === undefined) fail(`walk ${w.name}: partition ${w.partition} does not list it`);
    if (listed !== w.partition) fail(`walk ${w.name} is in two partitions: ${w.partition} and ${listed}`);
  }

  // Connections (needed to tell streaming inputs from normal ones) ----------
  const connectionInto = new Map<string, number>(); // `${toPartition}\0${edge}` -> connection index
  layout.connections.forEach((c, i) => {
    const what = `connection ${c.from_partition} -> ${c.to_partition} on ${c.edge_name}`;
    if (!partitionIndex.has(c.from_partition)) fail(`${what}: unknown partition ${c.from_partition}`);
    if (!partitionIndex.has(c.to_partition)) fail(`${what}: unknown partition ${c.to_partition}`);
    if (c.from_partition === c.to_partition) fail(`${what}: a partition cannot stream to itself`);
    const problem = chunkPolicyProblem(c.policy);
    if (problem !== null) fail(`${what}: ${c.policy.kind} policy: ${problem}`);
    const key = `${c.to_partition}\0${c.edge_name}`;
    if (connectionInto.has(key)) fail(`${what}: partition ${c.to_partition} already receives a stream named ${c.edge_name}`);
    connectionInto.set(key, i);
  });
  const connectionSlots: number[][] = layout.connections.map(() => []);
  const connectionProducers: number[] = layout.connections.map(() => 0);

  // Client outputs ------------------------------------------------------------
  const clientOutputs: CompiledClientOutput[] = [];
  const clientIndex = new Map<string, number>();
  for (const c of layout.client_outputs) {
    const key = `${c.name}\0${c.modality}`;
    if (clientIndex.has(key)) fail(`client output ${c.name} (${c.modality}) is declared twice`);
    clientIndex.set(key, clientOutputs.length);
    clientOutputs.push({ id: clientOutputs.length, name: c.name, modality: c.modality });
  }

  // Pass 1: number sections, walk nodes, loops and slots, walk by walk --------
  const sections: MutableSection[] = [];
  const walkNodes: MutableWalkNode[] = [];
  const loops: MutableLoop[] = [];
  const slotWalkNode: number[] = [];
  const slotInput: number[] = [];
  const slotConnection: number[] = [];
  const walks: CompiledWalk[] = [];

  layout.walks.forEach((walkLayout, walkId) => {
    const walkName = walkLayout.name;
    const partitionName = walkLayout.partition;
    const sectionStart = sections.length;
    const walkNodeStart = walkNodes.length;
    const loopStart = loops.length;
    const slotStart = slotWalkNode.length;
    const onPath = new Set<number>();
    const used = new Set<number>();
    const nodesInWalk = new Set<string>();
    const loopNames = new Set<string>();

    const visit = (index: number, parent: number, enclosing: number[]): number => {
      const s = layout.sections[index];
      if (s === undefined) fail(`walk ${walkName}: section ${index} does not exist`);
      if (onPath.has(index) || used.has(index)) fail(`walk ${walkName}: section ${index} is used twice`);
      onPath.add(index);
      used.add(index);
      const id = sections.length;
      const section: MutableSection = { id, kind: SECTION_KIND[s.kind], walk: walkId, parent, children: [], walkNode: -1, loop: -1 };
      sections.push(section);
      switch (s.kind) {
        case "node": {
          const node = nodeByName.get(s.node);
          if (node === undefined) fail(`walk ${walkName}: unknown node ${s.node || '""'} in a section`);
          if (nodesInWalk.has(s.node)) fail(`walk ${walkName}: node ${s.node} appears twice`);
          nodesInWalk.add(s.node);
          if (s.children.length > 0) fail(`walk ${walkName}: node section ${s.node} has children`);
          const names = new Set<string>();
          const wnId = walkNodes.length;
          const wn: MutableWalkNode = {
            id: wnId,
            node,
            walk: walkId,
            section: id,
            loops: [...enclosing],
            loop: enclosing.length > 0 ? enclosing[enclosing.length - 1]! : -1,
            inputNames: [],
            slotStart: slotWalkNode.length,
            normalInputs: 0,
            streamSlots: [],
            outputNames: [],
            outputRoutes: [],
            captures: [],
            engineCarriedSlots: [],
            layout: s,
          };
          for (const input of s.inputs) {
            if (names.has(input)) fail(`walk ${walkName}: node ${s.node} declares input ${input} twice`);
            names.add(input);
            const slot = slotWalkNode.length;
            slotWalkNode.push(wnId);
            slotInput.push(wn.inputNames.length);
            wn.inputNames.push(input);
            const connection = connectionInto.get(`${partitionName}\0${input}`);
            if (connection === undefined) {
              slotConnection.push(-1);
              wn.normalInputs++;
            } else {
              slotConnection.push(connection);
              wn.streamSlots.push(slot);
              connectionSlots[connection]!.push(slot);
            }
          }
          walkNodes.push(wn);
          section.walkNode = wnId;
          break;
        }
        case "sequential":
        case "parallel": {
          if (s.children.length === 0) fail(`walk ${walkName}: empty ${s.kind} section ${index}`);
          for (const child of s.children) section.children.push(visit(child, id, enclosing));
          break;
        }
        case "loop": {
          const name = s.loop_name;
          const what = `walk ${walkName}: loop ${name || `(section ${index})`}`;
          if (s.max_iters < 1) fail(`${what}: max_iters must be >= 1 (got ${s.max_iters})`);
          if (s.children.length !== 1) fail(`${what}: a loop has exactly one body section (got ${s.children.length})`);
          if (name !== "") {
            if (loopNames.has(name)) fail(`walk ${walkName}: two loops named ${name}`);
            loopNames.add(name);
          }
          const loopId = loops.length;
          const loop: MutableLoop = {
            id: loopId,
            name,
            walk: walkId,
            section: id,
            maxIters: s.max_iters,
            parent: enclosing.length > 0 ? enclosing[enclosing.length - 1]! : -1,
            sectionStart: sections.length,
            sectionEnd: 0,
            walkNodeStart: walkNodes.length,
            walkNodeEnd: 0,
            loopEnd: 0,
            slotStart: slotWalkNode.length,
            slotEnd: 0,
            externalSlots: [],
            externalCacheStart: 0,
            loopBackSlots: [],
            captures: [],
            outputs: [],
            parentCaptures: [],
            layout: s,
          };
          loops.push(loop);
          section.loop = loopId;
          section.children.push(visit(s.children[0]!, id, [...enclosing, loopId]));
          loop.sectionEnd = sections.length;
          loop.walkNodeEnd = walkNodes.length;
          loop.loopEnd = loops.length;
          loop.slotEnd = slotWalkNode.length;
          break;
        }
      }
      onPath.delete(index);
      return id;
    };

    const root = visit(walkLayout.root, -1, []);
    walks.push({
      id: walkId,
      name: walkName,
      partition: partitionIndex.get(partitionName)!,
      root,
      sectionStart,
      sectionEnd: sections.length,
      walkNodeStart,
      walkNodeEnd: walkNodes.length,
      loopStart,
      loopEnd: loops.length,
      slotStart,
      slotEnd: slotWalkNode.length,
    });
  });

  // Pass 2: routes of node edges and loop output edges ----------------------
  const persistIndex = new Map<string, number>();
  const persistNames: string[] = [];
  const persistId = (name: string): number => {
    let id = persistIndex.get(name);
    if (id === undefined) {
      id = persistNames.length;
      persistIndex.set(name, id);
      persistNames.push(name);
    }
    return id;
  };

  const walkNodeIn = (walk: CompiledWalk, nodeName: string): MutableWalkNode | undefined => {
    for (let i = walk.walkNodeStart; i < walk.walkNodeEnd; i++) if (walkNodes[i]!.node.name === nodeName) return walkNodes[i];
    return undefined;
  };

  const compileEdge = (
    walk: CompiledWalk,
    edge: LayoutEdge,
    where: string,
    producerLoops: readonly number[],
    producerWalkNode: number,
  ): MutableRoute[] => {
    const routes: MutableRoute[] = [];
    const route = (kind: RouteKind, target: number): void => {
      routes.push({ kind, target, loopBackOf: -1, engineCarried: false, producerLoops, producerWalkNode });
    };
    const what = `walk ${walk.name}: ${where} ${edgeText(edge)}`;
    if (edge.persist) route(ROUTE_PERSIST, persistId(edge.name));
    if (edge.target_partition !== "") {
      if (!nodeByName.has(edge.to)) fail(`${what}: unknown node ${edge.to || '""'}`);
      const fromPartition = layout.walks[walk.id]!.partition;
      const connection = connectionInto.get(`${edge.target_partition}\0${edge.name}`);
      const c = connection === undefined ? undefined : layout.connections[connection];
      if (connection === undefined || c === undefined || c.from_partition !== fromPartition) {
        fail(`${what}: no connection ${fromPartition} -> ${edge.target_partition} on ${edge.name}`);
      }
      connectionProducers[connection]!++;
      route(ROUTE_STREAM, connection);
      return routes;
    }
    if (edge.to === EMIT_TO_CLIENT) {
      const client = clientIndex.get(`${edge.name}\0${edge.modality}`);
      if (client === undefined) fail(`${what}: client output ${edge.name} (${edge.modality || "no modality"}) is not in client_outputs`);
      route(ROUTE_CLIENT, client);
      return routes;
    }
    if (edge.to === EMPTY_DESTINATION) {
      if (!edge.persist) route(ROUTE_DROP, -1);
      return routes;
    }
    if (!nodeByName.has(edge.to)) fail(`${what}: unknown node ${edge.to}`);
    const dest = walkNodeIn(walk, edge.to);
    const input = dest === undefined ? -1 : dest.inputNames.indexOf(edge.name);
    if (dest === undefined || input < 0) {
      // A persist edge may name a node of a later walk: the value is handed over by a transition.
      if (edge.persist) return routes;
      if (dest === undefined) fail(`${what}: node ${edge.to} is not in this walk`);
      fail(`${what}: node ${edge.to} takes no input ${edge.name}`);
    }
    const slot = dest.slotStart + input;
    if (slotConnection[slot]! >= 0) fail(`${what}: ${edge.name} is a streaming input of ${edge.to}`);
    // An edge from inside a loop to a node outside it leaves only as the loop's
    // output (once, after the last iteration), never once per iteration.
    for (let i = producerLoops.length - 1; i >= 0; i--) {
      const left = loops[producerLoops[i]!]!;
      if (dest.loops.includes(left.id)) break;
      const declared = [...left.layout.outputs, ...left.layout.accumulated_outputs].some((e) => e.name === edge.name && e.to === edge.to);
      if (!declared) fail(`${what}: leaves loop ${left.name || `(section ${left.section})`}, whose outputs do not declare it`);
      return routes;
    }
    route(ROUTE_SLOT, slot);
    return routes;
  };

  for (const walk of walks) {
    for (let i = walk.walkNodeStart; i < walk.walkNodeEnd; i++) {
      const wn = walkNodes[i]!;
      for (const edge of wn.layout.outputs) {
        const routes = compileEdge(walk, edge, `node ${wn.node.name}`, wn.loops, wn.id);
        let o = wn.outputNames.indexOf(edge.name);
        if (o < 0) {
          o = wn.outputNames.length;
          wn.outputNames.push(edge.name);
          wn.outputRoutes.push([]);
        }
        wn.outputRoutes[o]!.push(...routes);
      }
    }
  }

  // Loop captures: names the body produces (its direct members' output names). --
  const loopOf = (loopId: number): MutableLoop => loops[loopId]!;
  const directProducerNames = (loop: MutableLoop): Set<string> => {
    const names = new Set<string>();
    for (let i = loop.walkNodeStart; i < loop.walkNodeEnd; i++) {
      const wn = walkNodes[i]!;
      if (wn.loop === loop.id) for (const n of wn.outputNames) names.add(n);
    }
    for (let l = loop.id + 1; l < loop.loopEnd; l++) {
      const inner = loops[l]!;
      if (inner.parent === loop.id) {
        for (const e of inner.layout.outputs) names.add(e.name);
        for (const e of inner.layout.accumulated_outputs) names.add(e.name);
      }
    }
    return names;
  };

  const captures: LoopCapture[] = [];
  for (const loop of loops) {
    const walk = walks[loop.walk]!;
    const what = `walk ${walk.name}: loop ${loop.name || `(section ${loop.section})`}`;
    const produced = directProducerNames(loop);
    const last = new Set(loop.layout.outputs.map((e) => e.name));
    for (const e of loop.layout.accumulated_outputs) {
      if (last.has(e.name)) fail(`${what}: ${e.name} is in both outputs and accumulated_outputs`);
    }
    const captureFor = (name: string, accumulate: boolean): number => {
      const existing = loop.captures.find((c) => c.name === name);
      if (existing !== undefined) return existing.id;
      const c: LoopCapture = { id: captures.length, loop: loop.id, name, accumulate };
      captures.push(c);
      loop.captures.push(c);
      return c.id;
    };
    const add = (edge: LayoutEdge, accumulate: boolean): void => {
      if (!produced.has(edge.name)) fail(`${what}: output ${edge.name} is not produced by its body`);
      const capture = captureFor(edge.name, accumulate);
      // A loop's output leaves it as an output of its enclosing loops' body.
      const routes = compileEdge(walk, edge, `loop ${loop.name || `(section ${loop.section})`} output`, ancestors(loop.id), -1);
      loop.outputs.push({ capture, routes });
    };
    for (const e of loop.layout.outputs) add(e, false);
    for (const e of loop.layout.accumulated_outputs) add(e, true);
  }
  function ancestors(of: number): number[] {
    const list: number[] = [];
    for (let p = loops[of]!.parent; p >= 0; p = loops[p]!.parent) list.push(p);
    return list;
  }
  for (const wn of walkNodes) {
    if (wn.loop < 0) continue;
    const loop = loopOf(wn.loop);
    wn.outputNames.forEach((name, output) => {
      const c = loop.captures.find((x) => x.name === name);
      if (c !== undefined) wn.captures.push({ output, capture: c.id });
    });
  }
  for (const loop of loops) {
    if (loop.parent < 0) continue;
    const parent = loopOf(loop.parent);
    for (const c of loop.captures) {
      const to = parent.captures.find((x) => x.name === c.name);
      if (to !== undefined) loop.parentCaptures.push({ from: c.id, to: to.id });
    }
  }

  // Pass 3: classification of inputs (bottom up) -----------------------------
  const slotLoopBackOf = new Int32Array(slotWalkNode.length).fill(-1);
  const slotExternalOf: number[][] = slotWalkNode.map(() => []);

  const slotOutputs = (routes: readonly (readonly MutableRoute[])[], skipSelf: number): Set<number> => {
    const out = new Set<number>();
    for (const list of routes) for (const r of list) if (r.kind === ROUTE_SLOT && slotWalkNode[r.target] !== skipSelf) out.add(r.target);
    return out;
  };

  const derive = (sectionId: number): Derived => {
    const s = sections[sectionId]!;
    switch (s.kind) {
      case SECTION_NODE: {
        const wn = walkNodes[s.walkNode]!;
        const loopBack = new Set<number>();
        for (const list of wn.outputRoutes) for (const r of list) if (r.kind === ROUTE_SLOT && slotWalkNode[r.target] === wn.id) loopBack.add(r.target);
        const ext = new Set<number>();
        for (let i = 0; i < wn.inputNames.length; i++) {
          const slot = wn.slotStart + i;
          if (slotConnection[slot]! < 0 && !loopBack.has(slot)) ext.add(slot);
        }
        return { ext, out: slotOutputs(wn.outputRoutes, wn.id), loopBack };
      }
      case SECTION_SEQUENTIAL: {
        const ext = new Set<number>();
        const out = new Set<number>();
        const loopBack = new Set<number>();
        const producedBefore = new Set<number>();
        for (const child of s.children) {
          const d = derive(child);
          for (const slot of d.ext) {
            if (producedBefore.has(slot)) out.delete(slot);
            else ext.add(slot);
          }
          for (const slot of d.out) {
            if (ext.has(slot) && !d.ext.has(slot)) {
              ext.delete(slot);
              loopBack.add(slot);
            } else out.add(slot);
          }
          for (const slot of d.out) producedBefore.add(slot);
          for (const slot of d.loopBack) loopBack.add(slot);
        }
        return { ext, out, loopBack };
      }
      case SECTION_PARALLEL: {
        const consumed = new Set<number>();
        const produced = new Set<number>();
        const loopBack = new Set<number>();
        for (const child of s.children) {
          const d = derive(child);
          for (const slot of d.ext) consumed.add(slot);
          for (const slot of d.out) produced.add(slot);
          for (const slot of d.loopBack) loopBack.add(slot);
        }
        const ext = new Set<number>();
        const out = new Set<number>();
        for (const slot of consumed) if (!produced.has(slot)) ext.add(slot);
        for (const slot of produced) if (!consumed.has(slot)) out.add(slot);
        return { ext, out, loopBack };
      }
      case SECTION_LOOP: {
        const loop = loopOf(s.loop);
        const body = derive(s.children[0]!);
        for (const slot of body.ext) {
          loop.externalSlots.push(slot);
          slotExternalOf[slot]!.push(loop.id);
        }
        for (const slot of body.loopBack) {
          loop.loopBackSlots.push(slot);
          slotLoopBackOf[slot] = loop.id;
        }
        return { ext: body.ext, out: slotOutputs(loop.outputs.map((o) => o.routes), -1), loopBack: new Set() };
      }
    }
  };

  for (const walk of walks) {
    const root = derive(walk.root);
    for (const slot of root.loopBack) {
      const wn = walkNodes[slotWalkNode[slot]!]!;
      fail(`walk ${walk.name}: input ${wn.inputNames[slotInput[slot]!]} of node ${wn.node.name} is fed back outside any loop`);
    }
  }
  // Externals were pushed innermost first; keep outermost first.
  for (const list of slotExternalOf) list.reverse();
  let externalCacheCount = 0;
  for (const loop of loops) {
    loop.externalCacheStart = externalCacheCount;
    externalCacheCount += loop.externalSlots.length;
  }
  const slotExternalCaches = slotExternalOf.map((list, slot) =>
    list.map((l) => loops[l]!.externalCacheStart + loops[l]!.externalSlots.indexOf(slot)),
  );

  // An edge is a loop-back edge of L when its slot is loop-back of L and it leaves L's body.
  const markLoopBack = (r: MutableRoute): void => {
    if (r.kind !== ROUTE_SLOT) return;
    const l = slotLoopBackOf[r.target]!;
    if (l >= 0 && r.producerLoops.includes(l)) r.loopBackOf = l;
  };
  for (const wn of walkNodes) for (const list of wn.outputRoutes) for (const r of list) markLoopBack(r);
  for (const loop of loops) for (const o of loop.outputs) for (const r of o.routes) markLoopBack(r);

  // kv_cache nodes in loops whose only inputs are their own token (fed back)
  // and values re-injected from outside: the engine core decodes on, feeding
  // itself, and the conductor does not resubmit per iteration. Any other
  // kv_cache node in a loop (BAGEL's LLM fed new latents every iteration) is
  // stepped per pass like a stateless one.
  for (const wn of walkNodes) {
    if (wn.node.engine !== "kv_cache" || wn.loop < 0) continue;
    const loop = loopOf(wn.loop);
    const selfFed: number[] = [];
    let carried = true;
    for (let i = 0; i < wn.inputNames.length; i++) {
      const slot = wn.slotStart + i;
      if (wn.outputRoutes.some((list) => list.some((r) => r.kind === ROUTE_SLOT && r.target === slot))) selfFed.push(slot);
      else if (slotConnection[slot]! >= 0 || !loop.externalSlots.includes(slot)) carried = false;
    }
    if (!carried || selfFed.length === 0) continue;
    wn.engineCarriedSlots.push(...selfFed);
    for (const list of wn.outputRoutes) {
      for (const r of list) if (r.kind === ROUTE_SLOT && slotWalkNode[r.target] === wn.id) r.engineCarried = true;
    }
  }

  // Transitions ----------------------------------------------------------------
  const promptIndex = new Map<string, number>();
  const promptNames: string[] = [];
  const compileStep = (partitionName: string, step: WalkStep, where: string): CompiledStep => {
    const what = `partition ${partitionName}: ${where}`;
    if (step.walk === "") {
      if (step.inputs.length > 0) fail(`${what}: a step that ends the partition takes no inputs`);
      return { walk: -1, inputs: [], release: step.release.map((n) => releaseId(what, n)) };
    }
    const walkId = walkIndex.get(step.walk);
    if (walkId === undefined) fail(`${what}: transition to unknown walk ${step.walk}`);
    if (layout.walks[walkId]!.partition !== partitionName) fail(`${what}: transition to walk ${step.walk} of partition ${layout.walks[walkId]!.partition}`);
    const walk = walks[walkId]!;
    const inputs: CompiledStepInput[] = step.inputs.map((input) => {
      const dest = walkNodeIn(walk, input.node);
      if (dest === undefined) fail(`${what}: input ${input.name} for node ${input.node}, which is not in walk ${step.walk}`);
      const index = dest.inputNames.indexOf(input.name);
      if (index < 0) fail(`${what}: node ${input.node} takes no input ${input.name} in walk ${step.walk}`);
      const slot = dest.slotStart + index;
      if (slotConnection[slot]! >= 0) fail(`${what}: ${input.name} is a streaming input of ${input.node}`);
      if (input.source === "persist") {
        const id = persistIndex.get(input.source_name);
        if (id === undefined) fail(`${what}: input ${input.name} reads ${input.source_name}, which no edge persists`);
        return { slot, prompt: -1, persist: id };
      }
      let id = promptIndex.get(input.source_name);
      if (id === undefined) {
        id = promptNames.length;
        promptIndex.set(input.source_name, id);
        promptNames.push(input.source_name);
      }
      return { slot, prompt: id, persist: -1 };
    });
    return { walk: walkId, inputs, release: step.release.map((n) => releaseId(what, n)) };
  };
  const releaseId = (what: string, name: string): number => {
    const id = persistIndex.get(name);
    if (id === undefined) fail(`${what}: releases ${name}, which no edge persists`);
    return id;
  };

  const partitions: CompiledPartition[] = layout.partitions.map((p, id) => {
    const after: (CompiledStep | null | undefined)[] = walks.map(() => undefined);
    for (const w of p.walks) after[walkIndex.get(w)!] = null;
    for (const [walkName, step] of Object.entries(p.after)) {
      const walkId = walkIndex.get(walkName);
      if (walkId === undefined) fail(`partition ${p.name}: transition after unknown walk ${walkName}`);
      if (!p.walks.includes(walkName)) fail(`partition ${p.name}: transition after walk ${walkName} of partition ${layout.walks[walkId]!.partition}`);
      after[walkId] = compileStep(p.name, step, `after ${walkName}`);
    }
    return {
      id,
      name: p.name,
      walks: p.walks.map((w) => walkIndex.get(w)!),
      start: p.start === null ? null : compileStep(p.name, p.start, "start"),
      after,
      incoming: layout.connections.flatMap((c, i) => (c.to_partition === p.name ? [i] : [])),
      outgoing: layout.connections.flatMap((c, i) => (c.from_partition === p.name ? [i] : [])),
      pythonTransitions: p.python_transitions,
    };
  });

  const connections: CompiledConnection[] = layout.connections.map((c, id) => {
    const what = `connection ${c.from_partition} -> ${c.to_partition} on ${c.edge_name}`;
    if (connectionProducers[id] === 0) fail(`${what}: no node of ${c.from_partition} emits ${c.edge_name} as a streaming edge to ${c.to_partition}`);
    if (connectionSlots[id]!.length === 0) fail(`${what}: no node of ${c.to_partition} takes ${c.edge_name}`);
    return {
      id,
      from: partitionIndex.get(c.from_partition)!,
      to: partitionIndex.get(c.to_partition)!,
      edgeName: c.edge_name,
      policy: { ...c.policy },
      consumerSlots: connectionSlots[id]!,
    };
  });

  const engineCarriedBody = (l: MutableLoop): number => {
    const body = sections[l.sectionStart]!;
    if (body.kind !== SECTION_NODE) return -1;
    const wn = walkNodes[body.walkNode]!;
    return wn.engineCarriedSlots.length > 0 && wn.engineCarriedSlots.length === wn.inputNames.length ? wn.id : -1;
  };

  // Freeze ---------------------------------------------------------------------
  const freezeRoute = (r: MutableRoute): Route => Object.freeze({ kind: r.kind, target: r.target, loopBackOf: r.loopBackOf, engineCarried: r.engineCarried });
  const graph: CompiledGraph = {
    nodes: Object.freeze(nodes.map((n) => Object.freeze(n))),
    walks: Object.freeze(walks.map((w) => Object.freeze(w))),
    sections: Object.freeze(sections.map((s) => Object.freeze({ ...s, children: Object.freeze(s.children) }))),
    walkNodes: Object.freeze(
      walkNodes.map((wn) =>
        Object.freeze({
          id: wn.id,
          node: wn.node,
          walk: wn.walk,
          section: wn.section,
          loops: Object.freeze(wn.loops),
          loop: wn.loop,
          inputNames: Object.freeze(wn.inputNames),
          slotStart: wn.slotStart,
          normalInputs: wn.normalInputs,
          streamSlots: Object.freeze(wn.streamSlots),
          outputNames: Object.freeze(wn.outputNames),
          outputRoutes: Object.freeze(wn.outputRoutes.map((list) => Object.freeze(list.map(freezeRoute)))),
          captures: Object.freeze(wn.captures.map((c) => Object.freeze(c))),
          engineCarriedSlots: Object.freeze(wn.engineCarriedSlots),
        }),
      ),
    ),
    loops: Object.freeze(
      loops.map((l) =>
        Object.freeze({
          id: l.id,
          name: l.name,
          walk: l.walk,
          section: l.section,
          maxIters: l.maxIters,
          parent: l.parent,
          sectionStart: l.sectionStart,
          sectionEnd: l.sectionEnd,
          walkNodeStart: l.walkNodeStart,
          walkNodeEnd: l.walkNodeEnd,
          loopEnd: l.loopEnd,
          slotStart: l.slotStart,
          slotEnd: l.slotEnd,
          externalSlots: Object.freeze(l.externalSlots),
          externalCacheStart: l.externalCacheStart,
          loopBackSlots: Object.freeze(l.loopBackSlots),
          captures: Object.freeze(l.captures.map((c) => Object.freeze(c))),
          engineCarriedBody: engineCarriedBody(l),
          outputs: Object.freeze(l.outputs.map((o) => Object.freeze({ capture: o.capture, routes: Object.freeze(o.routes.map(freezeRoute)) }))),
          parentCaptures: Object.freeze(l.parentCaptures.map((p) => Object.freeze(p))),
        }),
      ),
    ),
    captureCount: captures.length,
    partitions: Object.freeze(partitions.map((p) => Object.freeze(p))),
    connections: Object.freeze(connections.map((c) => Object.freeze(c))),
    clientOutputs: Object.freeze(clientOutputs.map((c) => Object.freeze(c))),
    promptNames: Object.freeze(promptNames),
    persistNames: Object.freeze(persistNames),
    slotWalkNode: Int32Array.from(slotWalkNode),
    slotInput: Int32Array.from(slotInput),
    slotConnection: Int32Array.from(slotConnection),
    slotExternalOf: Object.freeze(slotExternalOf.map((l) => Object.freeze(l))),
    slotExternalCaches: Object.freeze(slotExternalCaches.map((l) => Object.freeze(l))),
    externalCacheCount,
    slotLoopBackOf,
    nodeByName,
    walkByName: new Map(walks.map((w) => [w.name, w])),
    partitionByName: new Map(partitions.map((p) => [p.name, p])),
  };
  return graph;
}

/**
 * The graph a worker announced in Ready, parsed and compiled; throws
 * GraphLayoutError or GraphCompileError with one line naming the problem.
 */
export function compileModelGraph(data: unknown): CompiledGraph {
  return compileGraph(parseGraphLayout(data));
}
