// Drain on SIGTERM, against the real CLI and worker: new requests get 503
// with Retry-After and /health says why; streams in flight finish normally
// within --shutdown-timeout, or end with an in-band error when it runs out;
// the server exits 0 with no worker left. A second signal exits at once, still
// without orphans.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { processesMatching, removeDir, startServer } from "../e2e/harness.js";
import { demoModelCopy, health, promptIds, streamCompletion, waitFor, type StreamProgress } from "./helpers.js";

const ENV = { ...process.env, OMP_NUM_THREADS: "1" };
const dirs: string[] = [];
after(() => dirs.forEach(removeDir));

function modelCopy(): string {
  const dir = demoModelCopy("drain-model");
  dirs.push(dir);
  return dir;
}

function exitOf(proc: import("node:child_process").ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }> {
  return new Promise((resolve) => proc.once("exit", (code, signal) => resolve({ code, signal, at: performance.now() })));
}

describe("drain on SIGTERM", { concurrency: true }, () => {
  test("in-flight streams finish, new requests get 503 with Retry-After, exit 0 with no worker left", async () => {
    const dir = modelCopy();
    const server = await startServer([dir, "--served-model-name", "drain"], 120_000, ENV);
    try {
      const prompts = Array.from({ length: 8 }, (_, i) => promptIds(500 + i, 10));
      const progress: StreamProgress[] = prompts.map(() => ({ tokens: 0 }));
      const streams = Promise.all(prompts.map((p, i) => streamCompletion(server.url, p, 48, progress[i])));
      await waitFor("the streams to start", () => (progress.every((p) => p.tokens >= 2) ? true : null), 60_000);
      const exited = exitOf(server.proc);
      server.proc.kill("SIGTERM");
      await waitFor("the drain", async () => ((await health(server.url)).status === 503 ? true : null), 5_000, 10);
      const h = await health(server.url);
      assert.equal(h.body.message, "the server is shutting down");
      const refused = await streamCompletion(server.url, prompts[0]!, 4);
      assert.equal(refused.status, 503);
      assert.equal(refused.retryAfter, "5");
      assert.match(refused.error?.message ?? "", /shutting down/);
      // Still listening: a plain POST gets the 503 too, with an OpenAI-shaped error body.
      const plain = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "hi", max_tokens: 2 }) });
      assert.equal(plain.status, 503);
      assert.equal(plain.headers.get("retry-after"), "5");
      const error = ((await plain.json()) as { error: Record<string, unknown> }).error;
      assert.deepEqual(Object.keys(error).sort(), ["code", "message", "param", "type"]);
      assert.equal(error.type, "service_unavailable");
      const results = await streams;
      results.forEach((r, i) => {
        assert.equal(r.error, null, `stream ${i}: ${JSON.stringify(r.error)}`);
        assert.equal(r.finish, "length");
        assert.equal(r.tokenIds.length, 48);
      });
      assert.equal((await exited).code, 0);
      assert.match(server.output(), /draining 8 request\(s\) for up to 20 s/);
      await waitFor("no worker", () => (processesMatching(dir).length === 0 ? true : null), 5_000);
    } finally {
      await server.stop();
    }
  });

  test("past --shutdown-timeout the rest end with an in-band error; exit 0", async () => {
    const dir = modelCopy();
    const server = await startServer([dir, "--served-model-name", "drain", "--shutdown-timeout", "1"], 120_000, ENV);
    try {
      const prompts = Array.from({ length: 4 }, (_, i) => promptIds(600 + i, 10));
      const progress: StreamProgress[] = prompts.map(() => ({ tokens: 0 }));
      const streams = Promise.all(prompts.map((p, i) => streamCompletion(server.url, p, 3000, progress[i])));
      await waitFor("the streams to start", () => (progress.every((p) => p.tokens >= 2) ? true : null), 60_000);
      const exited = exitOf(server.proc);
      const signalled = performance.now();
      server.proc.kill("SIGTERM");
      const results = await streams;
      for (const r of results) {
        assert.match(r.error?.message ?? "", /the server is shutting down/);
        assert.ok(r.sawDone);
        assert.ok(r.tokenIds.length < 3000);
        const after = r.endedAt - signalled;
        assert.ok(after >= 900 && after < 5_000, `ended ${Math.round(after)} ms after SIGTERM`);
      }
      assert.equal((await exited).code, 0);
      await waitFor("no worker", () => (processesMatching(dir).length === 0 ? true : null), 5_000);
    } finally {
      await server.stop();
    }
  });

  test("a second signal during the drain exits at once, without orphans", async () => {
    const dir = modelCopy();
    const server = await startServer([dir, "--served-model-name", "drain"], 120_000, ENV);
    try {
      const progress: StreamProgress = { tokens: 0 };
      const stream = streamCompletion(server.url, promptIds(700, 10), 3000, progress).catch(() => null);
      await waitFor("the stream to start", () => (progress.tokens >= 2 ? true : null), 60_000);
      const exited = exitOf(server.proc);
      server.proc.kill("SIGTERM");
      await waitFor("the drain", async () => ((await health(server.url)).status === 503 ? true : null), 5_000, 10);
      const second = performance.now();
      server.proc.kill("SIGTERM");
      const { code, signal, at } = await exited;
      assert.equal(signal, null, "exited, not killed (no abort)");
      assert.equal(code, 1);
      assert.ok(at - second < 2_000, `exited ${Math.round(at - second)} ms after the second signal`);
      await stream;
      await waitFor("no worker", () => (processesMatching(dir).length === 0 ? true : null), 5_000);
    } finally {
      await server.stop();
    }
  });
});
