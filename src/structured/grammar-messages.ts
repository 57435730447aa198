// Messages to and from the grammar thread (grammar-thread.ts). Clients are
// the main thread (compiles, for the frontend's 400s) and the engine core
// (token masks, once per step with constrained rows), each on its own port.

import type { MessagePort } from "node:worker_threads";
import type { GrammarSpec } from "./grammar-spec.js";

/** workerData of the grammar thread. */
export interface GrammarThreadInit {
  tokenizerPath: string;
  /** Logits width (the worker's vocab_size); masks have ceil(vocabSize / 32) words per row. */
  vocabSize: number;
  /** Tokens that end a generation: the grammar allows them only where it may end. */
  stopTokenIds: number[];
  /** Compiled grammars kept (least recently used ones go first). */
  cacheSize: number;
}

/** One constrained row of a step. */
export interface MaskRow {
  /** Names the request's matcher (one per engine request). */
  matcher: number;
  /** Set the first time a matcher is named: its grammar. */
  spec: GrammarSpec | null;
  /** Output tokens the matcher has not seen yet, in order. */
  tokens: number[];
  /** Tokens allowed beyond the grammar's (a reasoning model's <think>). */
  allow: number[];
}

interface CompileRequest {
  kind: "compile";
  id: number;
  spec: GrammarSpec;
}

interface MasksRequest {
  kind: "masks";
  id: number;
  rows: MaskRow[];
}

interface ReleaseRequest {
  kind: "release";
  matchers: number[];
}

/** A new client's port (an engine thread's). */
interface ConnectRequest {
  kind: "connect";
  port: MessagePort;
}

export type ToGrammarThread = CompileRequest | MasksRequest | ReleaseRequest | ConnectRequest;

interface CompiledReply {
  kind: "compiled";
  id: number;
  /** Why the grammar cannot be used; null when it compiled. */
  error: string | null;
  /** The grammar engine itself failed to start (error says why): no grammar can be compiled. */
  unavailable: boolean;
  ms: number;
}

export interface MasksReply {
  kind: "masks";
  id: number;
  /** rows x words, packed as xgrammar packs them. */
  bits: Int32Array;
  /** Per row: why the row's request cannot go on (its mask is then all ones); null when fine. */
  errors: (string | null)[];
  ms: number;
}

export type FromGrammarThread = CompiledReply | MasksReply;
