// Tool calls as the OpenAI API streams them: the first delta of a call names
// it (index, id, type, function name, empty arguments), later deltas of the
// same index carry argument fragments that concatenate to the arguments'
// JSON text. A collected message's tool_calls are the merge of those deltas,
// so a stream and a collected response can never disagree.

import { randomBytes } from "node:crypto";

/** A function the request offers (tools[i].function). */
export interface ToolFunction {
  name: string;
  description?: string;
  /** JSON schema of the arguments object; absent: any object. */
  parameters?: Record<string, unknown>;
  strict?: boolean;
}

export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function: { name?: string; arguments: string };
}

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export type ToolCallIdStyle = "openai" | "mistral";

const ALPHANUMERIC = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

function randomAlphanumeric(length: number): string {
  const bytes = randomBytes(length);
  let out = "";
  for (const b of bytes) out += ALPHANUMERIC[b % ALPHANUMERIC.length];
  return out;
}

/** A fresh call id: "call_" + 24 characters, or Mistral's 9 alphanumerics (its chat templates refuse other ids). */
function newToolCallId(style: ToolCallIdStyle): string {
  return style === "mistral" ? randomAlphanumeric(9) : `call_${randomAlphanumeric(24)}`;
}

/**
 * Numbers a choice's calls and shapes their deltas. With parallel_tool_calls
 * false only the first call is kept; later ones produce no deltas.
 */
export class ToolCallEmitter {
  private count = 0;
  /** Whether the call being parsed is shown (false beyond the first with parallel_tool_calls false). */
  private showing = false;

  constructor(
    private readonly idStyle: ToolCallIdStyle,
    private readonly parallel: boolean,
  ) {}

  /** Calls begun so far (shown or not). */
  get numCalls(): number {
    return this.count;
  }

  /** A new call named `name`; `id` is the model's own when it wrote one. */
  begin(name: string, id: string | null = null): ToolCallDelta[] {
    this.showing = this.parallel || this.count === 0;
    const index = this.count++;
    if (!this.showing) return [];
    return [{ index, id: id ?? newToolCallId(this.idStyle), type: "function", function: { name, arguments: "" } }];
  }

  /** A fragment of the current call's arguments. */
  args(fragment: string): ToolCallDelta[] {
    if (!this.showing || fragment === "" || this.count === 0) return [];
    return [{ index: this.count - 1, function: { arguments: fragment } }];
  }
}

/** Merges deltas by index into complete calls (what a client does with a stream). */
export function mergeToolCallDeltas(deltas: readonly ToolCallDelta[]): ToolCall[] {
  const calls: ToolCall[] = [];
  for (const delta of deltas) {
    let call = calls[delta.index];
    if (call === undefined) {
      call = { id: delta.id ?? "", type: "function", function: { name: delta.function.name ?? "", arguments: "" } };
      calls[delta.index] = call;
    }
    call.function.arguments += delta.function.arguments;
  }
  return calls.filter((c) => c !== undefined);
}

/**
 * Appends b's deltas to a's, joining consecutive argument fragments of the
 * same call (a call's first delta keeps its empty arguments, as OpenAI sends it).
 */
export function joinToolCallDeltas(a: ToolCallDelta[], b: readonly ToolCallDelta[]): ToolCallDelta[] {
  for (const delta of b) {
    const last = a[a.length - 1];
    if (last !== undefined && last.index === delta.index && last.id === undefined && delta.id === undefined) {
      a[a.length - 1] = { ...last, function: { ...last.function, arguments: last.function.arguments + delta.function.arguments } };
    } else {
      a.push(delta);
    }
  }
  return a;
}
