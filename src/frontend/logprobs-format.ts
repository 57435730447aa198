// The logprob shapes of the responses: completions' (text_offset, tokens,
// token_logprobs, top_logprobs), chat's (content[] with token, bytes and
// top_logprobs) and vLLM's prompt_logprobs (per prompt token a map from token
// id to logprob, rank and decoded token; null for the first token).

import type { ResolvedAlternative, ResolvedLogprob, ResolvedPromptLogprob } from "./generation.js";
import { textLength } from "../text/token-text.js";

/** JSON has no -Infinity; vLLM clamps the same way. */
function clampLogprob(logprob: number): number {
  return Math.max(logprob, -9999);
}

export interface CompletionLogprobs {
  text_offset: number[];
  token_logprobs: (number | null)[];
  tokens: string[];
  top_logprobs: (Record<string, number> | null)[];
}

/** One position of completions' logprobs: the token's text, its logprob (null: none) and alternatives. */
export interface CompletionLogprobEntry {
  token: string;
  logprob: number | null;
  top: readonly ResolvedAlternative[];
}

/**
 * Builds completions logprobs across the chunks of one choice. text_offset
 * counts code points (Python's len(), as vLLM and its clients do) from the
 * start of the choice's text, so it indexes the text when the tokens join to it.
 */
export class CompletionLogprobsBuilder {
  private offset = 0;

  /** `maxTop`: how many alternatives a position shows besides its own token (the request's logprobs). */
  constructor(private readonly maxTop: number) {}

  build(entries: readonly CompletionLogprobEntry[]): CompletionLogprobs {
    const out: CompletionLogprobs = { text_offset: [], token_logprobs: [], tokens: [], top_logprobs: [] };
    for (const entry of entries) {
      out.text_offset.push(this.offset);
      this.offset += textLength(entry.token);
      out.tokens.push(entry.token);
      if (entry.logprob === null) {
        out.token_logprobs.push(null);
        out.top_logprobs.push(null);
        continue;
      }
      out.token_logprobs.push(clampLogprob(entry.logprob));
      // The token itself first, then up to maxTop alternatives (vLLM: the top k plus the chosen one).
      const top: Record<string, number> = { [entry.token]: clampLogprob(entry.logprob) };
      for (const t of entry.top.slice(0, this.maxTop)) if (!(t.token in top)) top[t.token] = clampLogprob(t.logprob);
      out.top_logprobs.push(top);
    }
    return out;
  }
}

/** Generated tokens as completions entries. */
export function generatedEntries(logprobs: readonly ResolvedLogprob[]): CompletionLogprobEntry[] {
  return logprobs.map((e) => ({ token: e.token, logprob: e.logprob, top: e.top }));
}

/**
 * Echoed prompt tokens as completions entries: `texts` are the tokens' shares
 * of the echoed text; the first token has no logprob, token i + 1 takes
 * prompt logprob i (with its own text, not the lone string).
 */
export function promptEntries(texts: readonly string[], logprobs: readonly ResolvedPromptLogprob[] | null): CompletionLogprobEntry[] {
  return texts.map((token, i) => {
    const lp = i === 0 || logprobs === null ? undefined : logprobs[i - 1];
    if (lp === undefined) return { token, logprob: null, top: [] };
    return { token, logprob: lp.logprob, top: lp.top.map((t) => (t.tokenId === lp.tokenId ? { ...t, token } : t)) };
  });
}

export interface ChatLogprobEntry {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

export function chatLogprobs(entries: readonly ResolvedLogprob[]): { content: ChatLogprobEntry[] } {
  return {
    content: entries.map((e) => ({
      token: e.token,
      logprob: clampLogprob(e.logprob),
      bytes: e.bytes,
      top_logprobs: e.top.map((t) => ({ token: t.token, logprob: clampLogprob(t.logprob), bytes: t.bytes })),
    })),
  };
}

export interface VllmLogprob {
  logprob: number;
  rank: number;
  decoded_token: string;
}

/** vLLM's prompt_logprobs: null for the first prompt token, then {token id: {logprob, rank, decoded_token}}, the token itself first. */
export function vllmPromptLogprobs(entries: readonly ResolvedPromptLogprob[]): (Record<string, VllmLogprob> | null)[] {
  return [
    null,
    ...entries.map((e) => {
      const out: Record<string, VllmLogprob> = { [e.tokenId]: { logprob: clampLogprob(e.logprob), rank: e.rank, decoded_token: e.token } };
      e.top.forEach((t, j) => {
        if (!(t.tokenId in out)) out[t.tokenId] = { logprob: clampLogprob(t.logprob), rank: j + 1, decoded_token: t.token };
      });
      return out;
    }),
  ];
}
