// Many LoRA adapters over one base model, served by the real worker: greedy
// output with each of four PEFT adapters (different ranks, targets, rsLoRA,
// layers_to_transform) equals transformers with PEFT's merged model, with
// every adapter's rows and base rows in the same steps, the same prompts for
// all of them (a prefix-cache hit across adapters would show), chunked
// prefill forced small. Adapters load and unload at runtime with vLLM's
// routes; bad ones are refused with one line naming the adapter.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { makeRandomModel, postJson, processesMatching, promptIdsOf, python, removeDir, repoRoot, runCliAsync, startServer, tempDir, type CompletionWithIds, type RunningServer } from "./harness.js";

const work = tempDir("lora");
const baseDir = join(work, "base");
const loraRoot = join(work, "adapters");
after(() => removeDir(work));

const PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n < 2:", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,"];
const MAX_TOKENS = 10;

function loraScript(args: string[]): unknown {
  const result = spawnSync(python, [join(repoRoot, "python", "tests", "random_loras.py"), ...args], {
    cwd: repoRoot,
    encoding: "utf8",
    env: { ...process.env, PYTHONPATH: join(repoRoot, "python") },
  });
  if (result.status !== 0) throw new Error(`random_loras.py ${args.join(" ")} failed:\n${result.stderr}`);
  return JSON.parse(result.stdout.trim().split("\n").at(-1)!);
}

interface ModelList {
  data: { id: string; parent: string | null; root: string }[];
}

describe("multi-LoRA serving", () => {
  let server: RunningServer;
  let adapters: Record<string, string> = {};

  before(async () => {
    mkdirSync(loraRoot, { recursive: true });
    makeRandomModel("qwen3", baseDir, 0);
    adapters = (loraScript(["--base", baseDir, "--out", loraRoot]) as { adapters: Record<string, string> }).adapters;
    server = await startServer([
      baseDir,
      "--served-model-name", "base",
      "--enable-lora",
      "--lora-modules", `a1=${adapters.a1}`, `a2=${adapters.a2}`,
      "--lora-modules", JSON.stringify({ name: "a3", path: adapters.a3 }),
      "--max-loras", "4",
      "--max-lora-rank", "16",
      "--allow-runtime-lora-updating",
      "--max-num-batched-tokens", "16",
      "--block-size", "4",
    ]);
  });
  after(() => server?.stop());

  test("adapters are listed under the base model; one more loads at runtime", async () => {
    const load = await fetch(`${server.url}/v1/load_lora_adapter`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lora_name: "a4", lora_path: adapters.a4 }) });
    assert.equal(load.status, 200, await load.text());
    const models = (await (await fetch(`${server.url}/v1/models`)).json()) as ModelList;
    assert.deepEqual(models.data.map((m) => [m.id, m.parent]), [["base", null], ["a1", "base"], ["a2", "base"], ["a3", "base"], ["a4", "base"]]);
    assert.equal(models.data.find((m) => m.id === "a2")?.root, adapters.a2);
  });

  test("greedy output of each adapter and the base model equals transformers + PEFT merged, all in the same steps", async () => {
    const names = ["base", "a1", "a2", "a3", "a4"];
    const responses = await Promise.all(
      names.flatMap((model) => PROMPTS.map((prompt) => postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model, prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true }))),
    );
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const promptIds = responses.slice(0, PROMPTS.length).map((r) => promptIdsOf(r.body));
    const input = join(work, "reference.json");
    writeFileSync(input, JSON.stringify({ prompts: promptIds, max_new_tokens: MAX_TOKENS, loras: names.map((n) => (n === "base" ? null : adapters[n])) }));
    const expected = (loraScript(["--base", baseDir, "--reference", "--input", input]) as { outputs: number[][][] }).outputs;
    names.forEach((name, a) => {
      PROMPTS.forEach((_, p) => {
        const got = responses[a * PROMPTS.length + p]!.body.choices[0]?.token_ids;
        assert.deepEqual(got, expected[a]![p], `${name}, prompt ${p}`);
      });
    });
    // Each adapter changes the answer: otherwise the comparison above proves nothing.
    for (let a = 1; a < names.length; a++) assert.notDeepEqual(expected[a], expected[0], `${names[a]} answers as the base model does`);
  });

  test("bad adapters and names are refused with one line naming them; an unloaded adapter is gone", async () => {
    const load = (body: unknown): Promise<{ status: number; body: { error?: { message: string } } }> => postJson(`${server.url}/v1/load_lora_adapter`, body);
    const rank = await load({ lora_name: "big", lora_path: join(loraRoot, "rank32") });
    assert.equal(rank.status, 400);
    assert.match(rank.body.error?.message ?? "", /big.*rank 32 exceeds --max-lora-rank 16/);
    const missing = await load({ lora_name: "nowhere", lora_path: join(work, "no-such-dir") });
    assert.equal(missing.status, 400);
    assert.match(missing.body.error?.message ?? "", /nowhere.*no-such-dir.*not a directory/);
    assert.equal((await load({ lora_name: "a1", lora_path: adapters.a1 })).status, 400, "a name already served");
    assert.equal((await load({ lora_path: adapters.a1 })).status, 400, "no lora_name");
    const unknown = await postJson<{ error: { message: string } }>(`${server.url}/v1/completions`, { model: "big", prompt: "x", max_tokens: 1 });
    assert.equal(unknown.status, 404);

    const unload = await fetch(`${server.url}/v1/unload_lora_adapter`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lora_name: "a4" }) });
    assert.equal(unload.status, 200, await unload.text());
    assert.equal((await postJson(`${server.url}/v1/completions`, { model: "a4", prompt: "x", max_tokens: 1 })).status, 404);
    assert.equal((await postJson(`${server.url}/v1/unload_lora_adapter`, { lora_name: "a4" })).status, 404);
    // The server still serves the others.
    assert.equal((await postJson(`${server.url}/v1/completions`, { model: "a1", prompt: "x", max_tokens: 2 })).status, 200);
  });

  test("a restarted worker gets the adapters again: the same answers after it was killed", async () => {
    const ask = async (): Promise<number[][]> => {
      const rs = await Promise.all(["a1", "a3", "base"].map((model) => postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model, prompt: PROMPTS[0], max_tokens: 6, temperature: 0, return_token_ids: true })));
      for (const r of rs) assert.equal(r.status, 200, JSON.stringify(r.body));
      return rs.map((r) => r.body.choices[0]?.token_ids ?? []);
    };
    const before = await ask();
    const [pid] = processesMatching(`--model ${baseDir} `);
    assert.ok(pid !== undefined, "the worker's process");
    process.kill(pid, "SIGKILL");
    const deadline = Date.now() + 60_000;
    for (;;) {
      const health = await fetch(`${server.url}/health`).catch(() => null);
      const pids = processesMatching(`--model ${baseDir} `);
      if (health?.status === 200 && pids.length === 1 && pids[0] !== pid) break;
      assert.ok(Date.now() < deadline, "the worker came back");
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.deepEqual(await ask(), before);
  });

  test("LoRA flags without --enable-lora, and a bad --lora-modules at start, fail with one line", async () => {
    const stray = await runCliAsync(["serve", baseDir, "--lora-modules", `a1=${adapters.a1}`]);
    assert.equal(stray.code, 2);
    assert.match(stray.stderr, /--lora-modules needs --enable-lora/);
    const bad = await runCliAsync(["serve", baseDir, "--enable-lora", "--lora-modules", `big=${join(loraRoot, "rank32")}`, "--port", "0"]);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /--lora-modules: adapter big .*rank 32 exceeds --max-lora-rank 16/);
  });
});
