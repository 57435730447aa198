// --distributed-executor-backend ray: the ranks above 0 of a tensor-parallel
// worker are Ray actors placed by a placement group, on a local Ray cluster
// of two logical nodes that this test starts (python/tests/ray_cluster.py);
// the engine reaches rank 0 over tcp://. Greedy output equals transformers;
// rank 0 killed leaves no actor behind and the group comes back.
// Skipped where the worker's Python has no ray (it is not a dependency of
// Baton: pip install ray to use this backend).

import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  makeRandomModel,
  postJson,
  processesMatching,
  promptIdsOf,
  python,
  removeDir,
  repoRoot,
  startServer,
  tempDir,
  transformersGreedy,
  type CompletionWithIds,
  type RunningServer,
} from "./harness.js";
import { health, waitFor } from "../reliability/helpers.js";

const hasRay = spawnSync(python, ["-c", "import ray"], { encoding: "utf8" }).status === 0;
const PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"];
const MAX_TOKENS = 12;

/** Starts the two-node cluster; resolves with its address once both nodes are up. */
function startCluster(): { proc: ChildProcess; address: Promise<string> } {
  const proc = spawn(python, [join(repoRoot, "python", "tests", "ray_cluster.py")], { stdio: ["pipe", "pipe", "pipe"] });
  let output = "";
  const address = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no Ray cluster in 180 s:\n${output}`)), 180_000);
    const onData = (chunk: Buffer): void => {
      output += chunk.toString();
      const match = /RAY_ADDRESS (\S+)/.exec(output);
      if (match?.[1]) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    };
    proc.stdout?.on("data", onData);
    proc.stderr?.on("data", onData);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the Ray cluster exited with ${code}:\n${output}`));
    });
  });
  return { proc, address };
}

describe("tensor parallel placed by Ray", { skip: hasRay ? false : "the worker's Python has no ray" }, () => {
  let dir = "";
  let cluster: { proc: ChildProcess; address: Promise<string> } | null = null;
  let server: RunningServer | null = null;

  before(async () => {
    dir = tempDir("tp-ray");
    makeRandomModel("llama", dir, 0);
    cluster = startCluster();
    const address = await cluster.address;
    server = await startServer(
      [dir, "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray", "--dtype", "float32", "--block-size", "4"],
      240_000,
      { ...process.env, RAY_ADDRESS: address, OMP_NUM_THREADS: "1" },
    );
  });
  after(async () => {
    await server?.stop();
    if (cluster !== null && cluster.proc.exitCode === null) {
      const exited = new Promise((resolve) => cluster!.proc.once("exit", resolve));
      cluster.proc.stdin?.end(); // the helper shuts the cluster down when its stdin closes
      const timer = setTimeout(() => cluster!.proc.kill("SIGKILL"), 60_000);
      await exited;
      clearTimeout(timer);
    }
    removeDir(dir);
  });

  test("the ranks' bundles span both logical nodes, and greedy output equals transformers", async () => {
    const placed = /tensor-parallel ranks placed by Ray: bundles on nodes (\w+), (\w+)/.exec(server!.output());
    assert.ok(placed, `no placement line in:\n${server!.output()}`);
    assert.notEqual(placed[1], placed[2], "the two one-CPU bundles span both nodes");
    const url = `${server!.url}/v1/completions`;
    const responses = await Promise.all(PROMPTS.map((prompt) => postJson<CompletionWithIds>(url, { prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true })));
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const got = responses.map((r) => r.body.choices[0]?.token_ids ?? []);
    const ids = responses.map((r) => promptIdsOf(r.body));
    assert.deepEqual(got, transformersGreedy(dir, ids, MAX_TOKENS));
  });

  test("rank 0 killed: Ray ends its actor, the server starts a new group that serves the same tokens", async () => {
    const before = await postJson<CompletionWithIds>(`${server!.url}/v1/completions`, { prompt: PROMPTS[0], max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true });
    const [rank0] = processesMatching(`--model ${dir}`);
    const actors = processesMatching("ray::RankActor");
    assert.ok(rank0 !== undefined && actors.length === 1, `one rank 0 and one rank actor, got ${rank0} and ${actors.join(", ")}`);
    process.kill(rank0, "SIGKILL");
    // The owner is gone: Ray kills its actor; the supervisor starts a new rank 0, which places a new one.
    await waitFor("the old actor to end", () => (processesMatching("ray::RankActor").includes(actors[0]!) ? null : true), 60_000, 200);
    await waitFor("a new group", async () => ((await health(server!.url)).status === 200 && processesMatching("ray::RankActor").length === 1 ? true : null), 120_000, 200);
    const after = await postJson<CompletionWithIds>(`${server!.url}/v1/completions`, { prompt: PROMPTS[0], max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true });
    assert.deepEqual(after.body.choices[0]?.token_ids, before.body.choices[0]?.token_ids);
    await server!.stop();
    assert.deepEqual(processesMatching(`--model ${dir}`), []);
    await waitFor("no rank actor left", () => (processesMatching("ray::RankActor").length === 0 ? true : null), 30_000, 200);
  });
});
