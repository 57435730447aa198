// Tensor parallel (--tensor-parallel-size 2, gloo on CPU) through the real CLI,
// real Python ranks and real HTTP:
// - greedy output equals transformers generate, token for token, on every
//   supported architecture (TP=1 equals transformers in parity.test.ts, so
//   TP=2 equals TP=1), for concurrent requests; on one, with prefix-cache hits
//   and preemptions forced by a small KV cache;
// - a size that does not divide the attention heads is a clear start-up error;
// - rank 1 killed mid-stream, or hung (SIGSTOP, caught by the step timeout):
//   the whole rank group is restarted, the streams are migrated and finish
//   with the undisturbed text, and no process of the old group is left.
// Workers run with OMP_NUM_THREADS=1: the test machine's cores are shared.

import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";
import {
  makeRandomModel,
  postJson,
  processesMatching,
  promptIdsOf,
  removeDir,
  runCli,
  startServer,
  tempDir,
  transformersGreedy,
  type CompletionWithIds,
  type RunningServer,
} from "./harness.js";
import { health, metric, promptIds, streamCompletion, waitFor, waitForHealth, workerPid, type StreamProgress, type StreamResult } from "../reliability/helpers.js";

const ENV = { ...process.env, OMP_NUM_THREADS: "1" };
const TP = ["--tensor-parallel-size", "2", "--dtype", "float32"];
const MAX_TOKENS = 16;
const PRESSURE_TOKENS = 48;
const SHARED = "You are a careful assistant. Answer briefly and exactly, in plain words. ";
const PROMPTS = [
  "Hi",
  "The capital of France is",
  "def fibonacci(n):\n    if n < 2:\n        return n\n",
  "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
  `${SHARED}What is the boiling point of water?`,
  `${SHARED}Name three colours.`,
  `${SHARED}How far is the moon?`,
  "日本語のテキストも処理できますか？",
];

interface ArchCase {
  arch: string;
  variant: number;
  flags: string[];
  /**
   * A KV cache small enough to preempt, and a first request whose prefix the others reuse.
   * The requests are long enough (PRESSURE_TOKENS) to overlap even when a loaded machine
   * spreads their arrivals: together they need about 3x the cache. (At 16 tokens, arrivals
   * 60 ms apart never preempted; at 48 they preempted 8-10 times.)
   */
  pressure?: boolean;
}

// Heads (q/kv): llama v0 4/2 (split), mistral v0 4/2 with a sliding window,
// qwen2 v3 4/1 (the one KV head replicated on both ranks, tied embeddings), qwen3 v0 4/2 with q/k norm.
const CASES: ArchCase[] = [
  { arch: "llama", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "4", "--num-gpu-blocks-override", "48"], pressure: true },
  { arch: "mistral", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "16", "--max-num-seqs", "4"] },
  { arch: "qwen2", variant: 3, flags: ["--max-num-batched-tokens", "24", "--block-size", "8"] },
  { arch: "qwen3", variant: 0, flags: ["--max-num-batched-tokens", "16", "--block-size", "4"] },
];

function complete(server: RunningServer, model: string, prompt: string, maxTokens: number): Promise<{ status: number; body: CompletionWithIds }> {
  return postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model, prompt, max_tokens: maxTokens, temperature: 0, return_token_ids: true });
}

for (const { arch, variant, flags, pressure } of CASES) {
  describe(`${arch} (variant ${variant}) with --tensor-parallel-size 2`, () => {
    let dir = "";
    let server: RunningServer | null = null;

    before(async () => {
      dir = tempDir(`tp-${arch}`);
      makeRandomModel(arch, dir, variant);
      server = await startServer([dir, "--served-model-name", arch, ...TP, ...flags], 120_000, ENV);
    });
    after(async () => {
      await server?.stop();
      removeDir(dir);
    });

    test("greedy tokens equal transformers generate for concurrent requests", async () => {
      // Under pressure the first request runs alone, so the others can hit its cached prefix.
      const maxTokens = pressure ? PRESSURE_TOKENS : MAX_TOKENS;
      const first = pressure ? [await complete(server!, arch, PROMPTS[4]!, maxTokens)] : [];
      const rest = await Promise.all(PROMPTS.map((p) => complete(server!, arch, p, maxTokens)));
      const responses = [...first, ...rest];
      for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
      if (pressure) {
        assert.ok(((await metric(server!.url, "vllm:num_preemptions_total")) ?? 0) > 0, "the small KV cache should preempt");
        assert.ok(((await metric(server!.url, "vllm:prefix_cache_hits_total")) ?? 0) > 0, "the shared prefix should hit the cache");
      }
      const promptIdsList = responses.map((r) => promptIdsOf(r.body));
      const got = responses.map((r) => r.body.choices[0]?.token_ids ?? []);
      await server!.stop();
      const expected = transformersGreedy(dir, promptIdsList, maxTokens);
      got.forEach((tokens, i) => assert.deepEqual(tokens, expected[i], `prompt ${i} (${promptIdsList[i]?.length} tokens) diverged`));
      assert.ok(new Set(got.flat()).size >= 20, "outputs are not varied enough to prove parity");
    });
  });
}

describe("--tensor-parallel-size start-up errors", () => {
  let dir = "";
  before(() => {
    dir = tempDir("tp-bad");
    makeRandomModel("qwen3", dir, 0, null);
  });
  after(() => removeDir(dir));

  test("a size that does not divide the attention heads is refused with the reason, leaving no process", () => {
    const result = runCli(["serve", dir, "--tensor-parallel-size", "3", "--port", "0", "--max-worker-restarts", "0"]);
    assert.notEqual(result.code, 0);
    assert.match(result.stderr, /--tensor-parallel-size 3 must divide the model's 4 attention heads/);
    assert.deepEqual(processesMatching(`--model ${dir}`), []);
  });
});

/** Live (non-zombie) children of a process. */
function childPids(parent: number): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const status = readFileSync(`/proc/${entry}/status`, "utf8");
      if (Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]) === parent && /^State:\s+(\S)/m.exec(status)?.[1] !== "Z") pids.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return pids;
}

function alive(pid: number): boolean {
  return existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, "utf8"));
}

describe("rank 1 of a tensor-parallel group killed mid-stream", () => {
  let dir = "";
  let server: RunningServer | null = null;
  const prompts = Array.from({ length: 8 }, (_, i) => promptIds(i, 12));
  const TOKENS = 24;
  let reference: StreamResult[] = [];

  function streamAll(): { progress: StreamProgress[]; done: Promise<StreamResult[]> } {
    const progress = prompts.map(() => ({ tokens: 0 }));
    return { progress, done: Promise.all(prompts.map((p, i) => streamCompletion(server!.url, p, TOKENS, progress[i]))) };
  }

  before(async () => {
    dir = tempDir("tp-death");
    makeRandomModel("qwen3", dir, 0);
    server = await startServer([dir, ...TP, "--block-size", "4", "--step-timeout", "5"], 120_000, ENV);
    reference = await streamAll().done;
  });
  after(async () => {
    await server?.stop();
    removeDir(dir);
  });

  test("the group restarts, the streams finish with the undisturbed text, no orphan rank", async () => {
    const rank0 = workerPid(server!);
    const [rank1, ...others] = childPids(rank0);
    assert.ok(rank1 !== undefined && others.length === 0, `rank 0 (${rank0}) should have one child rank`);
    const { progress, done } = streamAll();
    await waitFor("every stream to have tokens", () => (progress.every((p) => p.tokens >= 4) ? true : null), 60_000);
    process.kill(rank1, "SIGKILL");
    const down = await waitForHealth(server!.url, 503, 10_000);
    assert.match(down.message, /tensor-parallel rank 1 .* was killed by signal 9; stopping the rank group/);
    const results = await done;
    results.forEach((r, i) => {
      assert.equal(r.error, null, `stream ${i}: ${JSON.stringify(r.error)}`);
      assert.deepEqual(r.tokenIds, reference[i]!.tokenIds, `stream ${i}: token ids`);
      assert.equal(r.text, reference[i]!.text, `stream ${i}: text`);
    });
    assert.equal((await health(server!.url)).status, 200);
    // The old group is gone entirely; the new one is again rank 0 plus one rank.
    await waitFor("the old ranks to be gone", () => (!alive(rank0) && !alive(rank1) ? true : null), 5_000);
    const newRank0 = workerPid(server!);
    assert.notEqual(newRank0, rank0);
    assert.equal(childPids(newRank0).length, 1);
    assert.equal(processesMatching(`--model ${dir}`).length, 2, "exactly the new group's two ranks run the model");
  });

  test("a hung rank 1 (SIGSTOP): the step times out, the group is killed and restarted, the streams finish", async () => {
    const rank0 = workerPid(server!);
    const [rank1] = childPids(rank0);
    assert.ok(rank1 !== undefined);
    const { progress, done } = streamAll();
    await waitFor("every stream to have tokens", () => (progress.every((p) => p.tokens >= 4) ? true : null), 60_000);
    process.kill(rank1, "SIGSTOP"); // rank 0 now waits in a collective and cannot answer the step
    const down = await waitForHealth(server!.url, 503, 20_000);
    assert.match(down.message, /step|hung|timed out/i);
    const results = await done;
    results.forEach((r, i) => assert.deepEqual(r.tokenIds, reference[i]!.tokenIds, `stream ${i}: token ids`));
    await waitFor("the hung group to be gone", () => (!alive(rank0) && !alive(rank1) ? true : null), 5_000);
    assert.equal(processesMatching(`--model ${dir}`).length, 2);
  });

  test("after the server stops, no rank is left", async () => {
    await server!.stop();
    await waitFor("every rank to exit", () => (processesMatching(`--model ${dir}`).length === 0 ? true : null), 10_000);
  });
});
