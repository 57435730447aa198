// OpenAI's logit_bias and vLLM's allowed_token_ids through HTTP, on a random
// Qwen3 model: greedy tokens equal transformers `generate` given the same bias
// (sequence_bias) or the same allowed set (prefix_allowed_tokens_fn), with
// prompts chunked and batched with plain requests; sampled tokens never leave
// the allowed set; the raw logprobs do not change with a bias.

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

const MODEL = "qwen3";
const PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Once upon a time, in a land far away,", "1, 2, 3, 4,"];
const MAX_TOKENS = 12;

describe("logit_bias and allowed_token_ids", () => {
  let dir = "";
  let server: RunningServer | null = null;

  before(async () => {
    dir = tempDir("logit-bias");
    makeRandomModel(MODEL, dir, 0);
    server = await startServer([dir, "--served-model-name", MODEL, "--dtype", "float32", "--max-num-batched-tokens", "16", "--block-size", "4"]);
  });

  after(async () => {
    await server?.stop();
    removeDir(dir);
  });

  const complete = async (body: Record<string, unknown>): Promise<CompletionWithIds> => {
    const response = await postJson<CompletionWithIds>(`${server!.url}/v1/completions`, { model: MODEL, max_tokens: MAX_TOKENS, return_token_ids: true, ...body });
    assert.equal(response.status, 200, JSON.stringify(response.body));
    return response.body;
  };
  const tokensOf = (c: CompletionWithIds): number[] => c.choices[0]?.token_ids ?? [];

  test("greedy with logit_bias equals transformers with the same sequence_bias", async () => {
    const plain = await Promise.all(PROMPTS.map((prompt) => complete({ prompt, temperature: 0 })));
    // Ban each prompt's first greedy token and favour a few others, so every output changes.
    const logitBias: Record<string, number> = { "1052": 6, "13": 4.5, "220": -3 };
    for (const c of plain) logitBias[String(tokensOf(c)[0])] = -100;
    // Biased requests run beside unbiased ones, in the same steps.
    const [biased] = await Promise.all([
      Promise.all(PROMPTS.map((prompt) => complete({ prompt, temperature: 0, logit_bias: logitBias }))),
      Promise.all(PROMPTS.map((prompt) => complete({ prompt, temperature: 0 }))),
    ]);
    const promptIds = plain.map(promptIdsOf);
    const expected = transformersGreedy(dir, promptIds, MAX_TOKENS, { logitBias });
    assert.deepEqual(biased.map(tokensOf), expected);
    for (let i = 0; i < PROMPTS.length; i++) assert.notDeepEqual(tokensOf(biased[i]!), tokensOf(plain[i]!), `prompt ${i}: the bias changed nothing`);
  });

  test("greedy with allowed_token_ids equals transformers with the same allowed set", async () => {
    const allowed = [11, 198, 220, 279, 315, 374, 1052, 3555, 9707, 15339, 30, 100, 2000, 42, 77];
    const got = await Promise.all(PROMPTS.map((prompt) => complete({ prompt, temperature: 0, allowed_token_ids: allowed })));
    const expected = transformersGreedy(dir, got.map(promptIdsOf), MAX_TOKENS, { allowedTokenIds: allowed });
    assert.deepEqual(got.map(tokensOf), expected);
    for (const c of got) for (const id of tokensOf(c)) assert.ok(allowed.includes(id), `token ${id} is not allowed`);
  });

  test("sampled tokens stay inside allowed_token_ids, with top-k, top-p and penalties", async () => {
    const allowed = [5, 500, 5000, 50000, 123, 4567];
    const bodies = [
      { temperature: 1.5, n: 4 },
      { temperature: 1.0, top_k: 3, seed: 7, n: 2 },
      { temperature: 0.8, top_p: 0.9, presence_penalty: 1.5, n: 2 },
    ];
    const results = await Promise.all(bodies.map((b) => complete({ prompt: PROMPTS[0], allowed_token_ids: allowed, ...b })));
    const seen = new Set<number>();
    for (const r of results) {
      for (const choice of r.choices) {
        assert.equal(choice.token_ids?.length, MAX_TOKENS);
        for (const id of choice.token_ids ?? []) {
          assert.ok(allowed.includes(id), `token ${id} is not allowed`);
          seen.add(id);
        }
      }
    }
    assert.ok(seen.size > 1, "temperature 1.5 over 4 choices drew only one token");
  });

  test("the returned logprobs are the raw model's (as vLLM's default), unchanged by a bias", async () => {
    const prompt = PROMPTS[1];
    const plain = await complete({ prompt, temperature: 0, max_tokens: 1, logprobs: 0 });
    const token = tokensOf(plain)[0]!;
    const forced = 9707 === token ? 9708 : 9707;
    type WithLogprobs = CompletionWithIds & { choices: { logprobs: { token_logprobs: number[] } }[] };
    const biased = (await complete({ prompt, temperature: 0, max_tokens: 1, logprobs: 0, logit_bias: { [String(forced)]: 100 } })) as WithLogprobs;
    assert.deepEqual(tokensOf(biased), [forced]);
    const echoed = (await complete({ prompt: [...promptIdsOf(plain), forced], echo: true, max_tokens: 0, logprobs: 0 })) as WithLogprobs;
    const raw = echoed.choices[0]!.logprobs.token_logprobs.at(-1)!;
    assert.ok(Math.abs(biased.choices[0]!.logprobs.token_logprobs[0]! - raw) < 1e-4, `${biased.choices[0]!.logprobs.token_logprobs[0]} vs raw ${raw}`);
  });
});
