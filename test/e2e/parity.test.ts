// Greedy output through the HTTP server equals transformers `generate`, token
// for token, for every supported architecture: random-weight models made by
// transformers, ten prompts of different lengths sent at once, and a small
// token budget so prompts are chunked and batched with other requests' decodes.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  makeRandomModel,
  postJson,
  promptIdsOf,
  removeDir,
  startServer,
  tempDir,
  transformersGreedy,
  type CompletionWithIds,
  type RunningServer,
} from "./harness.js";

const PROMPTS = [
  "Hi",
  "The capital of France is",
  "Once upon a time, in a land far away, there lived a dragon who",
  "def fibonacci(n):\n    if n < 2:\n        return n\n",
  "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,",
  "Translate to German: The weather is nice today and we are going for a walk in the park.",
  "Q: What is the boiling point of water at sea level?\nA:",
  "日本語のテキストも処理できますか？",
  "A long prompt that spans many blocks of the paged KV cache. ".repeat(6),
  "!",
];
const MAX_TOKENS = 20;

interface ArchCase {
  arch: string;
  variant: number;
  flags: string[];
  /** BATON_TEST_OVERLAP=1: the CPU worker overlaps steps as a GPU worker does (launch N+1, then finish N). */
  overlap?: boolean;
}

const CASES: ArchCase[] = [
  { arch: "llama", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "4"] },
  { arch: "llama3", variant: 1, flags: ["--max-num-batched-tokens", "24", "--block-size", "8"] },
  { arch: "mistral", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "16", "--max-num-seqs", "4"] },
  { arch: "qwen2", variant: 1, flags: ["--max-num-batched-tokens", "32", "--block-size", "8"] },
  { arch: "qwen3", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "4"], overlap: true },
  // A mixture of experts: 8 experts, 2 per token, the tokens of every expert batched per step.
  { arch: "qwen3_moe", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "4"] },
];

for (const { arch, variant, flags, overlap } of CASES) {
  describe(`${arch} (variant ${variant}${overlap ? ", overlapped worker steps" : ""}) through HTTP`, () => {
    let dir = "";
    let server: RunningServer | null = null;

    before(async () => {
      dir = tempDir(`parity-${arch}`);
      makeRandomModel(arch, dir, variant);
      const env = overlap ? { ...process.env, BATON_TEST_OVERLAP: "1" } : process.env;
      server = await startServer([dir, "--served-model-name", arch, "--dtype", "float32", ...flags], undefined, env);
    });

    after(async () => {
      await server?.stop();
      removeDir(dir);
    });

    test("greedy tokens equal transformers generate for concurrent chunked prompts", async () => {
      const url = `${server!.url}/v1/completions`;
      const responses = await Promise.all(
        PROMPTS.map((prompt) =>
          postJson<CompletionWithIds>(url, {
            model: arch,
            prompt,
            max_tokens: MAX_TOKENS,
            temperature: 0,
            return_token_ids: true,
          }),
        ),
      );
      for (const response of responses) assert.equal(response.status, 200, JSON.stringify(response.body));
      const promptIds = responses.map((r) => promptIdsOf(r.body));
      const got = responses.map((r) => r.body.choices[0]?.token_ids ?? []);
      await server!.stop();

      const expected = transformersGreedy(dir, promptIds, MAX_TOKENS);
      for (let i = 0; i < PROMPTS.length; i++) {
        assert.deepEqual(got[i], expected[i], `prompt ${i} (${promptIds[i]?.length} tokens) diverged`);
      }
      // Random weights often collapse to one repeated token; that would prove nothing.
      const distinct = new Set(got.flat());
      assert.ok(distinct.size >= 20, `outputs are not varied enough: ${distinct.size} distinct tokens`);
      const lengths = new Set(promptIds.map((ids) => ids.length));
      assert.ok(lengths.size >= 8, "prompts should have different lengths");
    });
  });
}
