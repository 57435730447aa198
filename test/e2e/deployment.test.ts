// The deployment file's top-level settings on the real server and workers:
// max_concurrent_requests holds requests back in arrival order (and they
// still give their undisturbed output), model_kwargs reach the graph model's
// constructor, and model_kwargs a model cannot take are refused at start.

import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { demoModelDir, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";

const ttsDir = join(repoRoot, "models", "demo-tts");
const work = tempDir("baton-deployment-");
after(() => removeDir(work));

function deploymentFile(name: string, text: string): string {
  const path = join(work, name);
  writeFileSync(path, text);
  return path;
}

async function gauge(server: RunningServer, name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name));
  assert.ok(line !== undefined, `metric ${name} missing`);
  return Number(line.split(" ").at(-1));
}

async function complete(server: RunningServer, prompt: string): Promise<string> {
  const res = await fetch(`${server.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 24, temperature: 0, ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  let text = "";
  for (const line of (await res.text()).split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    text += (JSON.parse(line.slice(6)) as { choices: { text: string }[] }).choices[0]!.text;
  }
  return text;
}

describe("deployment settings", { skip: !existsSync(join(demoModelDir, "config.json")) && "no demo model (npm run setup)" }, () => {
  test("max_concurrent_requests: at most that many run, the rest wait in order and give their undisturbed output", async () => {
    const file = deploymentFile("limit.yaml", "node_groups:\n  - node_names: [llm]\n    ranks: [0]\nmax_concurrent_requests: 2\n");
    const server = await startServer([demoModelDir, "--deployment", file]);
    try {
      const prompts = Array.from({ length: 5 }, (_, i) => `Request number ${i} says`);
      let maxRunning = 0;
      let maxWaiting = 0;
      let sampling = true;
      const sampler = (async () => {
        while (sampling) {
          maxRunning = Math.max(maxRunning, await gauge(server, "vllm:num_requests_running"));
          maxWaiting = Math.max(maxWaiting, await gauge(server, "vllm:num_requests_waiting"));
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      })();
      const together = await Promise.all(prompts.map((p) => complete(server, p)));
      sampling = false;
      await sampler;
      assert.ok(maxRunning <= 2, `${maxRunning} requests ran at once`);
      assert.ok(maxWaiting >= 1, "no request was ever held back");
      for (let i = 0; i < prompts.length; i++) assert.equal(together[i], await complete(server, prompts[i]!), `request ${i}`);
      assert.equal(await gauge(server, "vllm:num_requests_waiting"), 0);
    } finally {
      await server.stop();
    }
  });

  test("a plain LLM refuses model_kwargs at start, saying why", async () => {
    const file = deploymentFile("llm-kwargs.yaml", "node_groups:\n  - node_names: [llm]\n    ranks: [0]\nmodel_kwargs: {default_voice: nova}\n");
    await assert.rejects(startServer([demoModelDir, "--deployment", file], 60_000), /model_kwargs \(default_voice\).*plain LLM/);
  });
});

describe("deployment model_kwargs on a graph model", { skip: !existsSync(join(ttsDir, "config.json")) && "no demo-tts model (npm run setup)" }, () => {
  test("model_kwargs reach the model's constructor: default_voice is the voice of a request that names none", async () => {
    const file = deploymentFile("tts-kwargs.yaml", "node_groups:\n  - node_names: [llm, codec]\n    ranks: [0]\nmodel_kwargs: {default_voice: nova}\n");
    const server = await startServer([ttsDir, "--deployment", file]);
    try {
      const generate = async (kwargs: Record<string, unknown>): Promise<Buffer> => {
        const form = new FormData();
        form.set("text", "Good evening.");
        form.set("streaming", "false");
        form.set("model_kwargs", JSON.stringify({ seed: 5, max_tokens: 160, ...kwargs }));
        const res = await fetch(`${server.url}/generate`, { method: "POST", body: form });
        assert.equal(res.status, 200);
        const json = (await res.json()) as { outputs: { audio: { data: string }[] } };
        return Buffer.concat(json.outputs.audio.map((c) => Buffer.from(c.data, "base64")));
      };
      const unnamed = await generate({});
      assert.ok(unnamed.equals(await generate({ voice: "nova" })), "no voice speaks as the default_voice");
      assert.ok(!unnamed.equals(await generate({ voice: "alloy" })), "another voice gives other bytes");
    } finally {
      await server.stop();
    }
  });

  test("model_kwargs the constructor does not take are refused at start, naming them", async () => {
    const file = deploymentFile("tts-bad.yaml", "node_groups:\n  - node_names: [llm, codec]\n    ranks: [0]\nmodel_kwargs: {sample_rate: 8000}\n");
    await assert.rejects(startServer([ttsDir, "--deployment", file], 60_000), /model_kwargs for .*sample_rate/);
  });
});
