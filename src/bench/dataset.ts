// The prompts of a `baton bench serve` run (vLLM's --dataset-name):
// - random: distinct prompts of exactly --random-input-len tokens as the
//   server counts them (special tokens included), made of random vocabulary
//   tokens and fixed up until decode -> encode gives that length;
// - sharegpt: the first human turn of ShareGPT conversations (the reply's
//   token count is the output length), filtered and shuffled like vLLM's;
// - custom: a JSONL file of {"prompt": ...} lines.
// The same seed gives the same prompts, so two servers see the same workload.

import { readFileSync } from "node:fs";
import { readModelDir, requireTokenizer } from "../config/model-dir.js";
import { TextTokenizer } from "../text/tokenizer.js";
import { SeededRandom } from "./random.js";

export type DatasetName = "random" | "sharegpt" | "custom";
export const DATASET_NAMES: readonly DatasetName[] = ["random", "sharegpt", "custom"];

export interface BenchPrompt {
  prompt: string;
  /** Prompt tokens with the model's tokenizer (special tokens included); null without a tokenizer. */
  promptTokens: number | null;
  /** max_tokens of the request. */
  outputTokens: number;
}

export interface DatasetOptions {
  name: DatasetName;
  /** Prompts to make. */
  count: number;
  seed: number;
  /** Required for random and sharegpt. */
  tokenizer: BenchTokenizer | null;
  /** Without a tokenizer: where one was looked for (appended to the error that asks for --tokenizer). */
  tokenizerTried?: string;
  randomInputLen: number;
  randomOutputLen: number;
  /** Lengths drawn uniformly from [len * (1 - r), len * (1 + r)]. */
  randomRangeRatio: number;
  datasetPath: string | null;
  /** sharegpt: a fixed output length instead of the reply's; custom: the output length. */
  fixedOutputLen: number | null;
}

/** The model's tokenizer plus which ids are ordinary vocabulary (random prompts draw only from those). */
export interface BenchTokenizer {
  tokenizer: TextTokenizer;
  /** Ids that are not added/special tokens. */
  ordinaryIds: Int32Array;
}

class DatasetError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DatasetError";
  }
}

/** Whether the dataset needs the model's tokenizer (random and sharegpt count tokens to build prompts). */
export function needsTokenizer(name: DatasetName): boolean {
  return name !== "custom";
}

/** Loads the tokenizer of a Hugging Face model directory, as `baton serve` would. */
export function loadBenchTokenizer(modelDir: string): BenchTokenizer {
  const info = readModelDir(modelDir);
  const tokenizerPath = requireTokenizer(info);
  const tokenizer = TextTokenizer.fromFile(tokenizerPath, { bosTokenId: info.bosTokenId, addBosToken: info.tokenizer.addBosToken });
  const parsed = JSON.parse(readFileSync(tokenizerPath, "utf8")) as { added_tokens?: { id: number }[] };
  const added = new Set((parsed.added_tokens ?? []).map((t) => t.id));
  const ordinary: number[] = [];
  for (let id = 0; id < tokenizer.vocabSize; id++) if (!added.has(id)) ordinary.push(id);
  return { tokenizer, ordinaryIds: Int32Array.from(ordinary) };
}

export async function buildDataset(options: DatasetOptions): Promise<BenchPrompt[]> {
  switch (options.name) {
    case "random":
      return randomPrompts(options);
    case "sharegpt":
      return sharegptPrompts(options);
    case "custom":
      return customPrompts(options);
  }
}

function needTokenizer(options: DatasetOptions): BenchTokenizer {
  if (options.tokenizer === null) {
    const tried = options.tokenizerTried === undefined ? "" : `; without it, ${options.tokenizerTried}`;
    throw new DatasetError(`--dataset-name ${options.name} needs --tokenizer MODEL_DIR (the model's tokenizer)${tried}`);
  }
  return options.tokenizer;
}

function drawLength(rng: SeededRandom, len: number, ratio: number): number {
  if (ratio === 0) return len;
  const low = Math.max(1, Math.floor(len * (1 - ratio)));
  const high = Math.ceil(len * (1 + ratio));
  return low + rng.int(high - low + 1);
}

async function randomPrompts(options: DatasetOptions): Promise<BenchPrompt[]> {
  const bench = needTokenizer(options);
  const rng = new SeededRandom(options.seed);
  const seen = new Set<string>();
  const prompts: BenchPrompt[] = [];
  while (prompts.length < options.count) {
    const inputLen = drawLength(rng, options.randomInputLen, options.randomRangeRatio);
    const outputLen = drawLength(rng, options.randomOutputLen, options.randomRangeRatio);
    const prompt = await exactLengthPrompt(bench, rng, inputLen);
    // Distinct prompts: a repeat would be a prefix-cache hit on servers that cache.
    if (seen.has(prompt)) continue;
    seen.add(prompt);
    prompts.push({ prompt, promptTokens: inputLen, outputTokens: outputLen });
  }
  return prompts;
}

const FIXUP_ROUNDS = 16;

/**
 * Text that encodes to exactly `length` tokens (special tokens included).
 * Random ids rarely survive decode -> encode unchanged (merges across token
 * boundaries, partial UTF-8), so the re-encoded ids are trimmed or topped up
 * with fresh random ids until the round trip holds.
 */
export async function exactLengthPrompt(bench: BenchTokenizer, rng: SeededRandom, length: number): Promise<string> {
  const { tokenizer, ordinaryIds } = bench;
  const randomIds = (n: number): number[] => Array.from({ length: n }, () => ordinaryIds[rng.int(ordinaryIds.length)] as number);
  const specials = (await tokenizer.encode("", true)).length;
  if (length <= specials) throw new DatasetError(`--random-input-len ${length} is too short: the tokenizer adds ${specials} special token(s)`);
  for (let restart = 0; restart < 8; restart++) {
    let ids = randomIds(length - specials);
    for (let round = 0; round < FIXUP_ROUNDS; round++) {
      const text = await tokenizer.decode(ids, true);
      const withSpecials = await tokenizer.encode(text, true);
      if (withSpecials.length === length && text.length > 0) return text;
      const content = await tokenizer.encode(text, false);
      const want = length - (withSpecials.length - content.length);
      ids = content.length >= want ? content.slice(0, want) : [...content, ...randomIds(want - content.length)];
    }
  }
  throw new DatasetError(`could not make a prompt of exactly ${length} tokens with this tokenizer`);
}

interface ShareGptConversation {
  conversations?: { from?: string; value?: string }[];
}

async function sharegptPrompts(options: DatasetOptions): Promise<BenchPrompt[]> {
  const { tokenizer } = needTokenizer(options);
  if (options.datasetPath === null) throw new DatasetError("--dataset-name sharegpt needs --dataset-path FILE.json");
  let data: unknown;
  try {
    data = JSON.parse(readFileSync(options.datasetPath, "utf8"));
  } catch (error) {
    throw new DatasetError(`cannot read ${options.datasetPath}: ${(error as Error).message}`);
  }
  if (!Array.isArray(data)) throw new DatasetError(`${options.datasetPath} must hold a JSON array of ShareGPT conversations`);
  const pairs: [string, string][] = [];
  for (const entry of data as ShareGptConversation[]) {
    const turns = entry.conversations;
    const [first, second] = turns ?? [];
    if (typeof first?.value === "string" && typeof second?.value === "string") pairs.push([first.value, second.value]);
  }
  const rng = new SeededRandom(options.seed);
  // Fisher-Yates with the run's seed: the same seed picks the same conversations.
  for (let i = pairs.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    [pairs[i], pairs[j]] = [pairs[j] as [string, string], pairs[i] as [string, string]];
  }
  const prompts: BenchPrompt[] = [];
  for (const [prompt, reply] of pairs) {
    if (prompts.length === options.count) break;
    const promptTokens = (await tokenizer.encode(prompt, true)).length;
    const outputTokens = options.fixedOutputLen ?? (await tokenizer.encode(reply, false)).length;
    // vLLM's filter: drop very short pairs and ones too long for small context windows.
    if (promptTokens < 4 || (options.fixedOutputLen === null && outputTokens < 4)) continue;
    if (promptTokens > 1024 || promptTokens + outputTokens > 2048) continue;
    prompts.push({ prompt, promptTokens, outputTokens });
  }
  if (prompts.length < options.count) throw new DatasetError(`${options.datasetPath} has only ${prompts.length} usable conversations, --num-prompts is ${options.count}`);
  return prompts;
}

async function customPrompts(options: DatasetOptions): Promise<BenchPrompt[]> {
  if (options.datasetPath === null) throw new DatasetError("--dataset-name custom needs --dataset-path FILE.jsonl");
  let text: string;
  try {
    text = readFileSync(options.datasetPath, "utf8");
  } catch (error) {
    throw new DatasetError(`cannot read ${options.datasetPath}: ${(error as Error).message}`);
  }
  const prompts: BenchPrompt[] = [];
  const lines = text.split("\n");
  for (const [index, line] of lines.entries()) {
    if (prompts.length === options.count) break;
    if (line.trim() === "") continue;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch {
      throw new DatasetError(`${options.datasetPath} line ${index + 1} is not JSON`);
    }
    const prompt = (row as { prompt?: unknown }).prompt;
    if (typeof prompt !== "string") throw new DatasetError(`${options.datasetPath} line ${index + 1} has no string "prompt"`);
    const promptTokens = options.tokenizer === null ? null : (await options.tokenizer.tokenizer.encode(prompt, true)).length;
    prompts.push({ prompt, promptTokens, outputTokens: options.fixedOutputLen ?? 256 });
  }
  if (prompts.length < options.count) throw new DatasetError(`${options.datasetPath} has only ${prompts.length} prompts, --num-prompts is ${options.count}`);
  return prompts;
}
