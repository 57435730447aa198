// The frontend's side of the engine's outputs (vLLM's OutputProcessor): the
// engine hands over one batch per step (engine/outputs.ts), and this is the
// one place that turns a batch into each live request's output.
//
// With the engine in its own thread, batches that arrive in one turn of the
// main event loop are merged per request before delivery: when the frontend
// falls behind, a request gets one output with several tokens (one SSE chunk
// instead of several) and catches up instead of queueing.

import type { GraphEvent, GraphEventCallback } from "../conductor/graph-engine.js";
import { endingOutput } from "../engine/engine-core.js";
import type { EngineOutputs } from "../engine/outputs.js";
import type { OutputCallback, RequestId, RequestOutput } from "../engine/types.js";

/** A live request: a text request's output callback, or a graph request's event callback. */
type Receiver = { text: OutputCallback; graph: null } | { text: null; graph: GraphEventCallback };

export class OutputProcessor {
  private readonly live = new Map<RequestId, Receiver>();
  /** Outputs received and not yet delivered, merged per request (merging only). */
  private readonly pending = new Map<RequestId, RequestOutput>();
  private deliveryScheduled = false;

  /** merge: deliver on the next turn of the event loop, merged per request (the engine thread); else at once. */
  constructor(private readonly merge: boolean) {}

  has(id: RequestId): boolean {
    return this.live.has(id);
  }

  addText(id: RequestId, onOutput: OutputCallback): void {
    this.live.set(id, { text: onOutput, graph: null });
  }

  addGraph(id: RequestId, onEvent: GraphEventCallback): void {
    this.live.set(id, { text: null, graph: onEvent });
  }

  /** One engine batch. */
  process(batch: EngineOutputs): void {
    if (!this.merge) {
      batch.forEach((output) => this.deliverOutput(output));
      return;
    }
    batch.forEach((output) => this.queue(output));
    if (!this.deliveryScheduled && this.pending.size > 0) {
      this.deliveryScheduled = true;
      setImmediate(() => this.deliver());
    }
  }

  /** A graph request's event: delivered at once and in order (no merging: each chunk is the client's next bytes). */
  event(id: RequestId, event: GraphEvent): void {
    const receiver = this.live.get(id);
    if (receiver === undefined || receiver.graph === null) return;
    if (event.kind !== "chunk") this.live.delete(id);
    try {
      receiver.graph(event);
    } catch {
      // A client's callback must not stop the others.
    }
  }

  /** Delivers what is pending now (before the engine's own endings, or when shutting down). */
  deliver(): void {
    this.deliveryScheduled = false;
    for (const [id, output] of this.pending) {
      this.pending.delete(id);
      this.deliverOutput(output);
    }
  }

  /** Ends every live request with this reason: text requests with an ending output, graph requests with an error event. */
  failAll(message: string, reason: "error" | "abort" = "error"): void {
    this.deliver();
    for (const [id, receiver] of [...this.live]) {
      if (receiver.graph !== null) this.event(id, { kind: "error", message, status: 500 });
      else this.deliverOutput(endingOutput(id, reason, message));
    }
  }

  private deliverOutput(output: RequestOutput): void {
    const receiver = this.live.get(output.requestId);
    if (receiver === undefined || receiver.text === null) return;
    if (output.finished) this.live.delete(output.requestId);
    try {
      receiver.text(output);
    } catch {
      // A client's callback must not stop the others (the engine core does the same).
    }
  }

  /** Adds an output to its request's pending one (tokens appended; the later one's ending wins). */
  private queue(output: RequestOutput): void {
    const id = output.requestId;
    const before = this.pending.get(id);
    if (before === undefined) {
      this.pending.set(id, output);
      return;
    }
    before.newTokenIds.push(...output.newTokenIds);
    if (output.logprobs !== null) before.logprobs = before.logprobs === null ? output.logprobs : [...before.logprobs, ...output.logprobs];
    before.finished = output.finished;
    before.finishReason = output.finishReason;
    before.stopTokenId = output.stopTokenId;
    before.numCachedTokens = output.numCachedTokens;
    before.error = output.error;
    if (output.errorStatus !== undefined) before.errorStatus = output.errorStatus;
    if (output.promptLogprobs !== undefined) before.promptLogprobs = output.promptLogprobs;
    if (output.promptInfo !== undefined) before.promptInfo = output.promptInfo;
    if (output.timing !== undefined) before.timing = output.timing;
  }
}
