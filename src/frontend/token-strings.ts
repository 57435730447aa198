// Token ids -> the strings logprobs show: tokenizer.decode([id]) per id (what
// vLLM shows), cached, with one batched decode per call for the misses.

import type { TokenLogprob } from "../engine/types.js";
import type { TextTokenizer } from "../text/tokenizer.js";
import type { ResolvedLogprob } from "./generation.js";

const CACHE_LIMIT = 200_000;

export class TokenStrings {
  private readonly cache = new Map<number, string>();

  constructor(private readonly tokenizer: Pick<TextTokenizer, "decodeBatch">) {}

  async strings(ids: readonly number[]): Promise<string[]> {
    const missing = [...new Set(ids.filter((id) => !this.cache.has(id)))];
    if (missing.length > 0) {
      const texts = await this.tokenizer.decodeBatch(
        missing.map((id) => [id]),
        false,
      );
      if (this.cache.size + missing.length > CACHE_LIMIT) this.cache.clear();
      missing.forEach((id, i) => this.cache.set(id, texts[i] ?? ""));
    }
    return ids.map((id) => this.cache.get(id) ?? "");
  }

  async resolve(logprobs: readonly TokenLogprob[]): Promise<ResolvedLogprob[]> {
    const ids: number[] = [];
    for (const entry of logprobs) {
      ids.push(entry.tokenId);
      for (const top of entry.top) ids.push(top.tokenId);
    }
    const texts = await this.strings(ids);
    let at = 0;
    return logprobs.map((entry) => ({
      tokenId: entry.tokenId,
      token: texts[at++] ?? "",
      logprob: entry.logprob,
      top: entry.top.map((top) => ({ tokenId: top.tokenId, token: texts[at++] ?? "", logprob: top.logprob })),
    }));
  }
}

/** The UTF-8 bytes of a token string (OpenAI's `bytes`). */
export function utf8Bytes(text: string): number[] {
  return [...Buffer.from(text, "utf8")];
}
