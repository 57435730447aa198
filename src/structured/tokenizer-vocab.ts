// The vocabulary as xgrammar needs it (TokenizerInfo): every token's string as
// tokenizer.json encodes it, in id order, and how those strings decode.
//
// - byte_level: GPT-2-style byte-to-unicode strings (Qwen, Llama 3, Mistral's
//   Tekken): the decoder is ByteLevel.
// - byte_fallback: SentencePiece with <0xNN> byte tokens and ▁ for spaces
//   (Llama 2, Mistral v0.x): the decoder has a ByteFallback step.
// - raw: the strings are the text.
// prependSpace: SentencePiece adds a space before the text (a Metaspace
// pre-tokenizer or a Prepend("▁") normalizer).

import { readFileSync } from "node:fs";

export interface TokenizerVocab {
  /** Token strings by id; ids without a token are "". */
  encoded: string[];
  vocabType: "byte_level" | "byte_fallback" | "raw";
  prependSpace: boolean;
}

interface Step {
  type?: string;
  prepend_scheme?: string;
  add_prefix_space?: boolean;
  decoders?: Step[];
  pretokenizers?: Step[];
  normalizers?: Step[];
}

interface TokenizerJson {
  model?: { vocab?: Record<string, number> | [string, number][] };
  decoder?: Step | null;
  pre_tokenizer?: Step | null;
  normalizer?: Step | null;
  added_tokens?: { id: number; content: string }[];
}

function steps(step: Step | null | undefined): Step[] {
  if (step == null) return [];
  return [step, ...[...(step.decoders ?? []), ...(step.pretokenizers ?? []), ...(step.normalizers ?? [])].flatMap(steps)];
}

export function readTokenizerVocab(path: string): TokenizerVocab {
  const json = JSON.parse(readFileSync(path, "utf8")) as TokenizerJson;
  const encoded: string[] = [];
  const vocab = json.model?.vocab ?? {};
  // Unigram models list [piece, score] pairs in id order; BPE/WordPiece map piece -> id.
  if (Array.isArray(vocab)) vocab.forEach(([piece], id) => (encoded[id] = piece));
  else for (const [piece, id] of Object.entries(vocab)) encoded[id] = piece;
  for (const added of json.added_tokens ?? []) encoded[added.id] = added.content;
  for (let i = 0; i < encoded.length; i++) encoded[i] ??= "";
  const decoders = steps(json.decoder).map((s) => s.type);
  const vocabType = decoders.includes("ByteLevel") ? "byte_level" : decoders.includes("ByteFallback") ? "byte_fallback" : "raw";
  const metaspace = [...steps(json.pre_tokenizer), ...steps(json.decoder)].find((s) => s.type === "Metaspace");
  const prependSpace =
    steps(json.normalizer).some((s) => s.type === "Prepend") ||
    (metaspace !== undefined && (metaspace.prepend_scheme !== undefined ? metaspace.prepend_scheme !== "never" : metaspace.add_prefix_space !== false));
  return { encoded, vocabType, prependSpace };
}
