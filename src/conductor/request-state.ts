// One request's walk state: dense arrays indexed by the compiled graph's ids
// (walk nodes, slots, sections, loops, captures, partitions, connections,
// nodes). Nothing of the graph is copied; admission allocates these arrays.

import type { RequestId } from "../engine/types.js";
import type { CompiledGraph } from "../graph/compile.js";
import type { StreamChunk } from "../graph/chunk-policy.js";
import type { TensorValue, Values } from "./values.js";

/** Walk node states. */
export const WN_INACTIVE = 0; // its walk is not running
export const WN_IDLE = 1; // waiting for inputs in the current iteration
export const WN_STARTED = 2; // its pass for the current iteration is queued or running
export const WN_DONE = 3; // ran in the current iteration

export class StreamState {
  /** Items from offset `base` on (earlier ones are no longer needed). */
  items: Values[number][] = [];
  base = 0;
  produced = 0;
  ended = false;
  nextIndex = 0;
  finalTaken = false;
  finalConsumed = false;
}

export class RequestState {
  alive = true;
  readonly wnState: Uint8Array;
  /** Normal inputs still missing from the current slot. */
  readonly normalMissing: Int32Array;
  /** Streaming inputs still missing from the current slot. */
  readonly streamMissing: Int32Array;
  /** Set when a kv_cache walk node's next pass is carried by the engine core (no new kv start). */
  readonly engineCarried: Uint8Array;
  readonly cur: (Values | null)[];
  readonly next: (Values | null)[];
  /** Deliveries beyond the next-iteration slot, oldest first (never dropped). */
  readonly queue: (Values[] | undefined)[];
  readonly chunkOf: (StreamChunk | null)[];
  readonly doneChildren: Int32Array;
  readonly iter: Int32Array;
  readonly stop: Uint8Array;
  readonly captured: (Values | null)[];
  readonly externalCache: (Values | null)[];
  /** Current walk per partition, -1 when done. */
  readonly partitionWalk: Int32Array;
  readonly partitionDone: Uint8Array;
  /** A kv_cache node's engine request finished outside any loop: the partition ends with its walk. */
  readonly partitionEngineFinished: Uint8Array;
  partitionsLeft: number;
  readonly persist: (Values | null)[];
  readonly prompt: (Values | null)[];
  readonly streams: StreamState[];
  /** Per node: its engine-core request runs. */
  readonly kvRunning: Uint8Array;
  /** Per node: the walk node whose pass the engine core is computing, -1 if none. */
  readonly kvWalkNode: Int32Array;
  /** Per node: inputs of that pass, released when it completes. */
  readonly kvInputs: (readonly Values[] | null)[];
  /** Passes queued or running for this request. */
  readonly livePasses = new Set<number>();
  /** Tensors the request refers to, with their reference counts (0 = adopted, not yet placed). */
  readonly refs = new Map<TensorValue, number>();

  constructor(
    readonly id: RequestId,
    graph: CompiledGraph,
  ) {
    const walkNodes = graph.walkNodes.length;
    const slots = graph.slotWalkNode.length;
    this.wnState = new Uint8Array(walkNodes);
    this.normalMissing = new Int32Array(walkNodes);
    this.streamMissing = new Int32Array(walkNodes);
    this.engineCarried = new Uint8Array(walkNodes);
    this.cur = new Array<Values | null>(slots).fill(null);
    this.next = new Array<Values | null>(slots).fill(null);
    this.queue = new Array<Values[] | undefined>(slots).fill(undefined);
    this.chunkOf = new Array<StreamChunk | null>(slots).fill(null);
    this.doneChildren = new Int32Array(graph.sections.length);
    this.iter = new Int32Array(graph.loops.length);
    this.stop = new Uint8Array(graph.loops.length);
    this.captured = new Array<Values | null>(graph.captureCount).fill(null);
    this.externalCache = new Array<Values | null>(graph.externalCacheCount).fill(null);
    this.partitionWalk = new Int32Array(graph.partitions.length).fill(-1);
    this.partitionDone = new Uint8Array(graph.partitions.length);
    this.partitionEngineFinished = new Uint8Array(graph.partitions.length);
    this.partitionsLeft = graph.partitions.length;
    this.persist = new Array<Values | null>(graph.persistNames.length).fill(null);
    this.prompt = new Array<Values | null>(graph.promptNames.length).fill(null);
    this.streams = graph.connections.map(() => new StreamState());
    this.kvRunning = new Uint8Array(graph.nodes.length);
    this.kvWalkNode = new Int32Array(graph.nodes.length).fill(-1);
    this.kvInputs = new Array<readonly Values[] | null>(graph.nodes.length).fill(null);
  }
}
