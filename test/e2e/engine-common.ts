// Shared pieces of the engine acceptance tests (engine-*.test.ts): the real
// `baton serve` with the bundled demo model and the real worker, greedy
// completions over HTTP from token-id prompts, and /metrics counters.

import assert from "node:assert/strict";
import { postJson } from "./harness.js";

export interface Completion {
  choices: { token_ids?: number[]; finish_reason: string; stop_reason?: number | string | null }[];
  usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } | null };
}

export interface Ask {
  prompt: number[];
  maxTokens: number;
  stopTokenIds?: number[];
  ignoreEos?: boolean;
  /** Sampling fields sent as they are (default: greedy). */
  sampling?: { temperature: number; seed?: number; top_p?: number; top_k?: number };
}

/** Deterministic pseudo-random prompt ids in a plain-text range of the Qwen3 vocabulary. */
export function promptIds(seed: number, length: number): number[] {
  let x = (seed * 2654435761 + 12345) >>> 0;
  return Array.from({ length }, () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return 1000 + (x % 20000);
  });
}

export async function complete(url: string, ask: Ask): Promise<Completion> {
  const response = await postJson<Completion>(`${url}/v1/completions`, {
    prompt: ask.prompt,
    max_tokens: ask.maxTokens,
    temperature: 0,
    ...ask.sampling,
    return_token_ids: true,
    ...(ask.stopTokenIds ? { stop_token_ids: ask.stopTokenIds } : {}),
    ...(ask.ignoreEos ? { ignore_eos: true } : {}),
  });
  assert.equal(response.status, 200, JSON.stringify(response.body));
  return response.body;
}

/** All at once; resolves in the order given. */
export function completeAll(url: string, asks: Ask[]): Promise<Completion[]> {
  return Promise.all(asks.map((ask) => complete(url, ask)));
}

export function summary(c: Completion): { tokens: number[]; finish: string } {
  return { tokens: c.choices[0]?.token_ids ?? [], finish: c.choices[0]?.finish_reason ?? "?" };
}

/** A counter or gauge from GET /metrics (summed over label sets); null when absent. */
export async function metric(url: string, name: string): Promise<number | null> {
  const response = await fetch(`${url}/metrics`);
  if (response.status !== 200) return null;
  const text = await response.text();
  let total: number | null = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== " " && rest[0] !== "{") continue;
    total = (total ?? 0) + Number(line.trim().split(/\s+/).at(-1));
  }
  return total;
}
