// Requests and workers that keep failing, against the real CLI and worker:
// - a request that kills the worker every time it runs (the worker's
//   test-only BATON_TEST_CRASH_TOKEN) fails alone with a 503 after
//   --max-request-migrations, while the streams beside it finish with their
//   undisturbed text and the server stays up;
// - a crash loop that reaches --max-worker-restarts makes the server give up:
//   the request ends with an error, the server exits 1, no process is left;
// - a worker stopped with SIGSTOP under load is found by the step watchdog
//   (--step-timeout), killed and restarted, and the streams complete exactly
//   (with the engine on the main thread: --no-engine-thread).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { processesMatching, removeDir, startServer, type RunningServer } from "../e2e/harness.js";
import { demoModelCopy, health, promptIds, streamCompletion, waitFor, waitForHealth, workerPid, type StreamProgress, type StreamResult } from "./helpers.js";

/** Not in promptIds' range: only the poisoned prompt has it. */
const CRASH_TOKEN = 99_999;
const ENV = { ...process.env, OMP_NUM_THREADS: "1", BATON_TEST_CRASH_TOKEN: String(CRASH_TOKEN) };

async function collectedCompletion(url: string, prompt: number[], maxTokens: number): Promise<{ status: number; retryAfter: string | null; message: string; at: number }> {
  const response = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
  });
  const body = (await response.json()) as { error?: { message: string } };
  return { status: response.status, retryAfter: response.headers.get("retry-after"), message: body.error?.message ?? "", at: performance.now() };
}

describe("a request that crashes the worker every time", () => {
  let server: RunningServer;
  before(async () => {
    server = await startServer([], 120_000, ENV);
  });
  after(async () => {
    await server?.stop();
  });

  test("fails alone after the limit; the streams beside it finish with their undisturbed text", async () => {
    const prompts = Array.from({ length: 8 }, (_, i) => promptIds(300 + i, 10));
    const reference = await Promise.all(prompts.map((p) => streamCompletion(server.url, p, 32)));
    const firstPid = workerPid(server);
    const progress: StreamProgress[] = prompts.map(() => ({ tokens: 0 }));
    const streams = Promise.all(prompts.map((p, i) => streamCompletion(server.url, p, 32, progress[i])));
    await waitFor("the streams to start", () => (progress.every((p) => p.tokens >= 2) ? true : null), 60_000);
    const poisoned = await collectedCompletion(server.url, [1000, 1001, CRASH_TOKEN, 1002], 8);
    assert.equal(poisoned.status, 503);
    assert.ok(poisoned.retryAfter !== null);
    assert.match(poisoned.message, /the worker died each time it ran this request, so it is not retried \(--max-request-migrations 1\)/);
    const results: StreamResult[] = await streams;
    results.forEach((r, i) => {
      assert.equal(r.error, null, `stream ${i}: ${JSON.stringify(r.error)}`);
      assert.deepEqual(r.tokenIds, reference[i]!.tokenIds, `stream ${i}`);
      assert.equal(r.text, reference[i]!.text);
    });
    // Killed twice (the first run and the one retry), restarted twice, serving.
    assert.equal(server.output().match(/\[worker \d+\] baton_worker: BATON_TEST_CRASH_TOKEN 99999 seen/g)?.length, 2, server.output());
    await waitForHealth(server.url, 200, 30_000);
    assert.notEqual(workerPid(server), firstPid);
    const again = await streamCompletion(server.url, prompts[0]!, 32);
    assert.deepEqual(again.tokenIds, reference[0]!.tokenIds);
  });
});

describe("a crash loop", () => {
  test("past --max-worker-restarts the server gives up: the request ends with an error, exit 1, nothing left", async () => {
    const dir = demoModelCopy("crash-loop-model");
    const server = await startServer([dir, "--max-worker-restarts", "1", "--max-request-migrations", "5", "--served-model-name", "crash-loop"], 120_000, ENV);
    try {
      const exited = new Promise<number | null>((resolve) => server.proc.once("exit", resolve));
      // It kills the first worker, then (retried alone) the restarted one: two deaths in a row, one restart allowed.
      const poisoned = await collectedCompletion(server.url, [1000, CRASH_TOKEN], 8);
      assert.equal(poisoned.status, 503);
      assert.match(poisoned.message, /died 2 times in a row \(--max-worker-restarts 1\)/);
      assert.equal(await exited, 1);
      assert.match(server.output(), /giving up/);
      await waitFor("no worker", () => (processesMatching(dir).length === 0 ? true : null), 5_000);
    } finally {
      await server.stop();
      removeDir(dir);
    }
  });
});

describe("a hung worker", () => {
  let server: RunningServer;
  before(async () => {
    // The engine on the main thread here (the other tests use the engine thread): restarts work in both placements.
    server = await startServer(["--step-timeout", "2", "--no-engine-thread"], 120_000, { ...process.env, OMP_NUM_THREADS: "1" });
  });
  after(async () => {
    await server?.stop();
  });

  test("SIGSTOP under load: the watchdog kills and restarts it, the streams complete exactly", async () => {
    const prompts = Array.from({ length: 16 }, (_, i) => promptIds(400 + i, 10));
    const reference = await Promise.all(prompts.map((p) => streamCompletion(server.url, p, 24)));
    const pid = workerPid(server);
    const progress: StreamProgress[] = prompts.map(() => ({ tokens: 0 }));
    const streams = Promise.all(prompts.map((p, i) => streamCompletion(server.url, p, 24, progress[i])));
    await waitFor("the streams to start", () => (progress.every((p) => p.tokens >= 2) ? true : null), 60_000);
    const stoppedAt = performance.now();
    process.kill(pid, "SIGSTOP");
    try {
      const down = await waitForHealth(server.url, 503, 10_000);
      const noticed = down.at - stoppedAt;
      assert.ok(noticed >= 1_900 && noticed < 6_000, `noticed after ${Math.round(noticed)} ms (--step-timeout 2)`);
      assert.match(down.message, /did not answer step \d+ within 2 s \(--step-timeout\); it is treated as hung/);
    } finally {
      // Only needed if the test failed before the watchdog acted.
      if ((await health(server.url)).status === 200) process.kill(pid, "SIGKILL");
    }
    const results = await streams;
    results.forEach((r, i) => {
      assert.equal(r.error, null, `stream ${i}: ${JSON.stringify(r.error)}`);
      assert.deepEqual(r.tokenIds, reference[i]!.tokenIds, `stream ${i}`);
    });
    assert.notEqual(workerPid(server), pid);
  });
});
