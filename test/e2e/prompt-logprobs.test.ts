// Prompt logprobs over HTTP equal transformers' log-softmax of the same prompt
// (float32, within 1e-4) on every architecture, with chunked prefill forced
// (8 tokens per step) and a warm prefix cache: a request that wants prompt
// logprobs computes its whole prompt (cached_tokens 0) and gives the same
// numbers every time, and the cached blocks it did not use still serve the
// next plain request. Streamed, echoed (max_tokens 0) and vLLM's
// prompt_logprobs forms agree.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { makeRandomModel, postJson, python, removeDir, repoRoot, startServer, tempDir } from "./harness.js";

const TOLERANCE = 1e-4;
const K = 3;
const ARCHES = ["llama", "llama3", "mistral", "qwen2", "qwen3"];

interface Reference {
  logprobs: number[];
  ranks: number[];
  top_ids: number[][];
  top_logprobs: number[][];
}

type VllmPromptLogprobs = (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[];

interface Completion {
  choices: {
    text: string;
    finish_reason: string;
    token_ids?: number[];
    logprobs: { tokens: string[]; token_logprobs: (number | null)[]; text_offset: number[]; top_logprobs: (Record<string, number> | null)[] } | null;
    prompt_logprobs?: VllmPromptLogprobs | null;
  }[];
  usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details: { cached_tokens: number } };
}

function reference(modelDir: string, prompt: number[]): Reference {
  const dir = tempDir("plp-ref");
  try {
    writeFileSync(join(dir, "in.json"), JSON.stringify({ cases: [{ model_dir: modelDir, prompt, k: K }] }));
    const result = spawnSync(python, [join(repoRoot, "test", "e2e", "prompt-logprobs-reference.py"), join(dir, "in.json"), join(dir, "out.json")], { encoding: "utf8" });
    assert.equal(result.status, 0, result.stderr);
    return (JSON.parse(readFileSync(join(dir, "out.json"), "utf8")) as { cases: Reference[] }).cases[0] as Reference;
  } finally {
    removeDir(dir);
  }
}

async function streamed(url: string, body: object): Promise<Record<string, unknown>[]> {
  const response = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  assert.equal(response.status, 200);
  return (await response.text())
    .split("\n")
    .filter((l) => l.startsWith("data: {"))
    .map((l) => JSON.parse(l.slice(6)) as Record<string, unknown>);
}

describe("prompt logprobs equal transformers' on every architecture (chunked prefill, warm prefix cache)", () => {
  for (const arch of ARCHES) {
    test(arch, async () => {
      const dir = tempDir(`plp-${arch}`);
      let stop: (() => Promise<unknown>) | null = null;
      try {
        makeRandomModel(arch, dir, 0, null);
        // A small SentencePiece-style tokenizer (400 tokens) over the 512-token model: the prompts are ids.
        copyFileSync(join(repoRoot, "test", "fixtures", "tokenizers", "llama2-style.json"), join(dir, "tokenizer.json"));
        const server = await startServer([dir, "--dtype", "float32", "--max-num-batched-tokens", "8", "--block-size", "4", "--served-model-name", "m"]);
        stop = () => server.stop();
        const prompt = Array.from({ length: 29 }, (_, i) => 3 + ((i * 37 + arch.length * 11) % 390));
        const complete = async (body: object): Promise<Completion> => {
          const r = await postJson<Completion>(`${server.url}/v1/completions`, { model: "m", prompt, temperature: 0, ...body });
          assert.equal(r.status, 200, JSON.stringify(r.body));
          return r.body;
        };

        // Warm the prefix cache with plain requests.
        const plain = await complete({ max_tokens: 2, return_token_ids: true });
        const hit = await complete({ max_tokens: 2, return_token_ids: true });
        assert.ok(hit.usage.prompt_tokens_details.cached_tokens >= 24, "the plain repeat hits the cache");

        const first = await complete({ max_tokens: 1, prompt_logprobs: K });
        const second = await complete({ max_tokens: 1, prompt_logprobs: K });
        assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0, "prompt logprobs skip the cache hit");
        const got = first.choices[0]?.prompt_logprobs as VllmPromptLogprobs;
        assert.deepEqual(second.choices[0]?.prompt_logprobs, got, "the same numbers again");
        assert.equal(got.length, prompt.length);
        assert.equal(got[0], null, "the first prompt token has none");

        const ref = reference(dir, prompt);
        for (let p = 1; p < prompt.length; p++) {
          const entry = got[p] as Record<string, { logprob: number; rank: number }>;
          const own = entry[String(prompt[p])];
          assert.ok(own !== undefined, `position ${p} has the prompt token`);
          assert.ok(Math.abs(own.logprob - (ref.logprobs[p - 1] as number)) < TOLERANCE, `${arch} position ${p}: ${own.logprob} vs ${ref.logprobs[p - 1]}`);
          assert.ok(Math.abs(own.rank - (ref.ranks[p - 1] as number)) <= 1, `${arch} position ${p} rank ${own.rank} vs ${ref.ranks[p - 1]}`);
          const top = Object.values(entry).map((v) => v.logprob).sort((a, b) => b - a).slice(0, K);
          (ref.top_logprobs[p - 1] as number[]).forEach((v, j) => assert.ok(Math.abs((top[j] as number) - v) < TOLERANCE, `${arch} position ${p} top ${j}`));
        }

        // Streamed: the same prompt_logprobs, on the first chunk.
        const chunks = await streamed(server.url, { model: "m", prompt, temperature: 0, max_tokens: 1, prompt_logprobs: K });
        const withPrompt = chunks.filter((c) => (c.choices as { prompt_logprobs?: unknown }[])[0]?.prompt_logprobs !== undefined);
        assert.equal(withPrompt.length, 1);
        assert.deepEqual((withPrompt[0]!.choices as { prompt_logprobs: unknown }[])[0]!.prompt_logprobs, got);

        // echo + logprobs with max_tokens 0: the prompt alone, scored like prompt_logprobs.
        const echo = await complete({ max_tokens: 0, echo: true, logprobs: 1 });
        const choice = echo.choices[0]!;
        const lp = choice.logprobs!;
        assert.equal(lp.tokens.length, prompt.length, "only the prompt's tokens");
        assert.equal(lp.token_logprobs[0], null);
        for (let p = 1; p < prompt.length; p++) assert.equal(lp.token_logprobs[p], got[p]![String(prompt[p])]!.logprob);
        assert.equal(choice.text, lp.tokens.join(""));
        assert.equal(choice.finish_reason, "length");
        assert.equal(echo.usage.completion_tokens, 0);

        // The shared blocks are intact: a plain request still hits them and generates the same tokens.
        const after = await complete({ max_tokens: 2, return_token_ids: true });
        assert.ok(after.usage.prompt_tokens_details.cached_tokens >= 24);
        assert.deepEqual(after.choices[0]?.token_ids, plain.choices[0]?.token_ids);
      } finally {
        await stop?.();
        removeDir(dir);
      }
    });
  }
});
