// Token ids -> /tokenize's token_strs: tokenizer.decode([id]) per id, cached,
// with one batched decode per call for the misses. (Logprob token strings
// come from src/text/token-text.ts.)

import type { TextTokenizer } from "../text/tokenizer.js";

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
}
