// The supervisor against the real Python worker over real ZeroMQ: handshake,
// steps, ping, shutdown, start-up failures, and death while steps are pending.
// Every test leaves no worker process behind, even when it fails.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { PROTOCOL_VERSION } from "../../src/transport/messages.js";
import { packageRoot } from "../../src/transport/package-root.js";
import { MAX_IN_FLIGHT, shutdownAllWorkers, startWorker } from "../../src/worker/supervisor.js";
import { WorkerDiedError, WorkerStartError, type WorkerClient, type WorkerExit } from "../../src/worker/types.js";
import { decodeStep, greedy, isRunning, nullModelDir, nullWorkerOptions, prefillStep, processesMatching, removeDir, tempDir, waitUntil } from "./helpers.js";

const dirs: string[] = [];
after(async () => {
  await shutdownAllWorkers(1000);
  dirs.forEach(removeDir);
});

function model(config: Record<string, unknown> = {}): string {
  const dir = nullModelDir(config);
  dirs.push(dir);
  return dir;
}

describe("a running worker", () => {
  let worker: WorkerClient;
  const deaths: WorkerExit[] = [];
  let dir: string;

  before(async () => {
    dir = model();
    worker = await startWorker(nullWorkerOptions(dir, { blockSize: 16, numBlocks: 32 }));
    worker.onDeath((exit) => deaths.push(exit));
  });
  after(async () => {
    await worker?.shutdown();
  });

  test("sends Ready with the engine's protocol version and its settings", () => {
    const ready = worker.ready;
    assert.equal(ready.protocol_version, PROTOCOL_VERSION);
    assert.equal(ready.block_size, 16);
    assert.equal(ready.num_blocks, 32);
    assert.equal(ready.vocab_size, 128);
    assert.equal(ready.architecture, "Qwen3ForCausalLM");
    assert.equal(ready.device, "cpu");
    assert.equal(ready.worker_pid, worker.pid);
    assert.ok(isRunning(worker.pid));
    assert.equal(worker.alive, true);
  });

  test("answers a prefill step and a decode step", async () => {
    const first = await worker.executeStep(prefillStep(1, 7, [1, 2, 3, 4, 5], 0));
    assert.equal(first.kind, "StepResult");
    assert.equal(first.step_id, 1);
    assert.deepStrictEqual(Array.from(first.req_ids), [7]);
    assert.equal(first.token_ids.length, 1);
    assert.ok(first.token_ids[0]! >= 0 && first.token_ids[0]! < 128);
    assert.equal(first.logprobs, null, "no row asked for logprobs");
    assert.ok(first.timings.forward_ms >= 0);

    const second = await worker.executeStep(decodeStep(2, 7, 5));
    assert.equal(second.step_id, 2);
    assert.deepStrictEqual(Array.from(second.req_ids), [7]);
  });

  test(`keeps up to ${MAX_IN_FLIGHT} steps in flight, answered in order`, async () => {
    const a = worker.executeStep(decodeStep(3, 7, 6));
    const b = worker.executeStep(decodeStep(4, 7, 7));
    const c = worker.executeStep(decodeStep(5, 7, 8));
    await assert.rejects(worker.executeStep(decodeStep(6, 7, 9)), /at most 3 steps may be in flight/);
    const results = await Promise.all([a, b, c]);
    assert.deepStrictEqual(results.map((r) => r.step_id), [3, 4, 5]);
  });

  test("rejects step ids that do not increase, without sending them", async () => {
    await assert.rejects(worker.executeStep(decodeStep(5, 7, 9)), /step ids must increase: 5 after 5/);
    const next = await worker.executeStep(decodeStep(6, 7, 9));
    assert.equal(next.step_id, 6);
  });

  test("a malformed step fails at the caller and the worker goes on", async () => {
    const bad = prefillStep(7, 8, [1, 2], 10);
    bad.added[0]!.sampling = { ...bad.added[0]!.sampling, top_k: 2.5 };
    await assert.rejects(worker.executeStep(bad), { name: "ProtocolError", message: "Step.added[0].sampling.top_k: expected int, got float" });
    assert.equal((await worker.executeStep(prefillStep(7, 8, [1, 2], 10))).step_id, 7);
  });

  test("answers pings", async () => {
    const ms = await worker.ping(5000);
    assert.ok(ms >= 0 && ms < 5000);
  });

  test("shuts down cleanly: the process is gone and nothing fires onDeath", async () => {
    const pid = worker.pid;
    await worker.shutdown();
    assert.equal(isRunning(pid), false);
    assert.equal(worker.alive, false);
    await worker.shutdown(); // idempotent
    await assert.rejects(worker.executeStep(decodeStep(10, 8, 2)), WorkerDiedError);
    await assert.rejects(worker.ping(), WorkerDiedError);
    assert.deepStrictEqual(deaths, []);
    assert.deepStrictEqual(processesMatching(dir), []);
  });
});

describe("start-up failures", { concurrency: true }, () => {
  async function startFails(opts: Parameters<typeof startWorker>[0], needle: string): Promise<WorkerStartError> {
    try {
      const worker = await startWorker(opts);
      await worker.shutdown();
      assert.fail("startWorker resolved");
    } catch (error) {
      assert.ok(error instanceof WorkerStartError, `expected WorkerStartError, got ${String(error)}`);
      assert.deepStrictEqual(processesMatching(needle), [], "no worker process is left");
      return error;
    }
  }

  test("a missing model directory", async () => {
    const parent = tempDir("missing");
    dirs.push(parent);
    const missing = join(parent, "no-such-model");
    const error = await startFails(nullWorkerOptions(missing), missing);
    assert.match(error.message, /no-such-model/);
    assert.match(error.message, /does not exist|not found|no such/i);
    assert.ok(error.exit !== null && error.exit.code !== 0);
  });

  test("an unknown architecture", async () => {
    const dir = model({ architectures: ["GPT2LMHeadModel"] });
    const error = await startFails(nullWorkerOptions(dir), dir);
    assert.match(error.message, /GPT2LMHeadModel/);
    assert.ok(error.exit !== null && error.exit.code !== 0);
  });

  test("a bad dtype", async () => {
    const dir = model();
    const error = await startFails(nullWorkerOptions(dir, { dtype: "float8" as "float32" }), dir);
    assert.match(error.message, /float8/);
  });

  test("a missing interpreter says how to fix it", async () => {
    const dir = model();
    const error = await startFails(nullWorkerOptions(dir, { python: "/nonexistent/bin/python" }), dir);
    assert.match(error.message, /Python interpreter not found: \/nonexistent\/bin\/python/);
    assert.equal(error.exit, null);
  });

  test("real weights that are missing (auto load format)", async () => {
    const dir = model({ hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16 });
    const error = await startFails(nullWorkerOptions(dir, { loadFormat: "auto" }), dir);
    assert.match(error.message, /safetensors/);
  });
});

describe("worker death", () => {
  test("SIGKILL mid-run rejects pending steps and fires onDeath once", async () => {
    const dir = model();
    const worker = await startWorker(nullWorkerOptions(dir));
    try {
      const deaths: WorkerExit[] = [];
      worker.onDeath((exit) => deaths.push(exit));
      await worker.executeStep(prefillStep(1, 1, [3, 4, 5], 0));
      // Freeze the worker so the next steps are certainly still pending when it dies.
      process.kill(worker.pid, "SIGSTOP");
      const pending = [worker.executeStep(decodeStep(2, 1, 3)), worker.executeStep(decodeStep(3, 1, 4))];
      const ping = worker.ping(30_000);
      process.kill(worker.pid, "SIGKILL");
      for (const step of pending) {
        await assert.rejects(step, (error: unknown) => {
          assert.ok(error instanceof WorkerDiedError);
          assert.match(error.message, /SIGKILL/);
          assert.equal(error.exit?.signal, "SIGKILL");
          return true;
        });
      }
      await assert.rejects(ping, WorkerDiedError);
      await waitUntil(() => deaths.length > 0, 5000, "onDeath");
      assert.equal(deaths.length, 1);
      assert.equal(deaths[0]!.signal, "SIGKILL");
      assert.equal(worker.alive, false);
      assert.equal(isRunning(worker.pid), false);
      await assert.rejects(worker.executeStep(decodeStep(4, 1, 4)), /not running/);
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(deaths.length, 1, "onDeath fires once");
    } finally {
      await worker.shutdown(1000);
    }
  });

  test("a worker Fatal rejects the step with the worker's message and fires onDeath", async () => {
    const dir = model();
    const worker = await startWorker(nullWorkerOptions(dir));
    try {
      const deaths: WorkerExit[] = [];
      worker.onDeath((exit) => deaths.push(exit));
      // Request 99 was never added: a protocol violation the worker reports as Fatal.
      await assert.rejects(worker.executeStep(decodeStep(1, 99, 0)), /model worker failed: .*99/);
      await waitUntil(() => deaths.length > 0, 10_000, "onDeath");
      assert.equal(deaths[0]!.code, 1);
      assert.match(deaths[0]!.message, /99/);
      assert.equal(isRunning(worker.pid), false);
    } finally {
      await worker.shutdown(1000);
    }
  });
});

describe("tcp transport", () => {
  test("a worker on loopback TCP answers a step", async () => {
    const worker = await startWorker(nullWorkerOptions(model(), { transport: "tcp" }));
    try {
      const res = await worker.executeStep(prefillStep(1, 1, [1, 2, 3], 0));
      assert.deepStrictEqual(Array.from(res.req_ids), [1]);
    } finally {
      await worker.shutdown();
    }
  });
});

describe("random-weight model", () => {
  const script = join(packageRoot, "python", "tests", "random_models.py");
  test("a Qwen3 checkpoint loads and generates", { skip: existsSync(script) ? false : `${script} does not exist yet` }, async () => {
    const { spawnSync } = await import("node:child_process");
    const { resolvePythonEnv } = await import("../../src/worker/python-env.js");
    const out = tempDir("qwen3");
    dirs.push(out);
    const env = resolvePythonEnv();
    const made = spawnSync(env.python, [script, "--arch", "qwen3", "--out", out], { env: env.env, encoding: "utf8" });
    assert.equal(made.status, 0, made.stderr);
    const worker = await startWorker(nullWorkerOptions(out, { loadFormat: "auto" }));
    try {
      assert.equal(worker.ready.architecture, "Qwen3ForCausalLM");
      const res = await worker.executeStep(prefillStep(1, 1, [1, 2, 3, 4, 5, 6], 0, { ...greedy, logprobs: 3 }));
      assert.equal(res.token_ids.length, 1);
      assert.ok(res.token_ids[0]! >= 0 && res.token_ids[0]! < worker.ready.vocab_size);
      assert.ok(res.logprobs !== null && res.logprobs.length === 1 && res.logprobs[0]! <= 0);
      assert.deepStrictEqual(Array.from(res.top_counts ?? []), [3]);
      assert.equal(res.top_ids?.length, 3);
    } finally {
      await worker.shutdown();
    }
  });
});
