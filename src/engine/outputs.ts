// What an engine core hands its owner once per step (vLLM's EngineCoreOutputs):
// every output of the step in one batch, through one sink given at
// construction. There is no per-request callback inside the engine; whoever
// owns the core routes a batch by request id (the frontend's output
// processor, the graph engine, the KV connector).
//
// The common output (one token, nothing else: no logprobs, no ending) is
// packed as an int32 triple, so a decode step of B rows is one typed array and
// no objects; the rest are RequestOutput objects. A batch holds at most one
// output per request, except a token and then an ending (a failed grammar
// mask after the step's token), so visiting the packed ones first keeps each
// request's order.

import type { RequestId, RequestOutput } from "./types.js";

/** A batch as it crosses a thread (structured clone keeps the fields, not the class). */
export interface OutputBatch {
  /** [request id, token id, cached prompt tokens] per packed output, `numPlain` of them. */
  plain: Int32Array;
  numPlain: number;
  rich: RequestOutput[];
}

export class EngineOutputs implements OutputBatch {
  plain: Int32Array;
  numPlain = 0;
  rich: RequestOutput[] = [];

  constructor(capacity = 64) {
    this.plain = new Int32Array(3 * Math.max(capacity, 1));
  }

  /** A batch rebuilt from its fields (after crossing a thread). */
  static of(batch: OutputBatch): EngineOutputs {
    const outputs = new EngineOutputs(0);
    outputs.plain = batch.plain;
    outputs.numPlain = batch.numPlain;
    outputs.rich = batch.rich;
    return outputs;
  }

  get size(): number {
    return this.numPlain + this.rich.length;
  }

  /** A packed output: one token of a request that goes on. */
  addToken(id: RequestId, tokenId: number, numCachedTokens: number): void {
    let at = 3 * this.numPlain;
    if (at + 3 > this.plain.length) {
      const grown = new Int32Array(this.plain.length * 2);
      grown.set(this.plain);
      this.plain = grown;
    }
    const plain = this.plain;
    plain[at++] = id;
    plain[at++] = tokenId;
    plain[at] = numCachedTokens;
    this.numPlain++;
  }

  add(output: RequestOutput): void {
    const ids = output.newTokenIds;
    if (ids.length === 1 && output.logprobs === null && output.promptLogprobs === undefined && output.promptInfo === undefined && output.frames === undefined && !output.finished && output.error === null) {
      this.addToken(output.requestId, ids[0] as number, output.numCachedTokens);
    } else this.rich.push(output);
  }

  /** Every output as a RequestOutput (packed ones first; see the top of the file). */
  forEach(fn: (output: RequestOutput) => void): void {
    const plain = this.plain;
    for (let i = 0, at = 0; i < this.numPlain; i++, at += 3) fn(plainOutput(plain[at] as number, plain[at + 1] as number, plain[at + 2] as number));
    for (const output of this.rich) fn(output);
  }
}

/** Receives an engine's outputs, one batch per step (and one per ending outside a step). */
export type OutputSink = (outputs: EngineOutputs) => void;

/** The RequestOutput of a packed output. */
function plainOutput(requestId: RequestId, tokenId: number, numCachedTokens: number): RequestOutput {
  return {
    requestId,
    newTokenIds: [tokenId],
    logprobs: null,
    finished: false,
    finishReason: null,
    stopTokenId: null,
    numCachedTokens,
    error: null,
  };
}
