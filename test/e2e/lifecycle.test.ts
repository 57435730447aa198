// Start-up failures and shutdown of the real CLI: a worker that cannot start
// makes `baton serve` exit non-zero with the worker's own message, and no
// process is left behind in any case.

import assert from "node:assert/strict";
import { cpSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { demoModelDir, processesMatching, removeDir, runCli, startServer, tempDir } from "./harness.js";

async function waitFor(condition: () => boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const dirs: string[] = [];
after(() => dirs.forEach(removeDir));

/** A copy of the demo model with config.json edited. */
function brokenModel(name: string, edit: (config: Record<string, unknown>) => void): string {
  const dir = tempDir(name);
  dirs.push(dir);
  cpSync(demoModelDir, dir, { recursive: true });
  const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Record<string, unknown>;
  edit(config);
  writeFileSync(join(dir, "config.json"), JSON.stringify(config));
  return dir;
}

describe("start-up failures", () => {
  test("a missing model directory", () => {
    const missing = join(tempDir("missing"), "no-such-model");
    dirs.push(missing);
    const result = runCli(["serve", missing, "--port", "0"]);
    assert.notEqual(result.code, 0);
    assert.match(result.stderr, /no-such-model/);
    assert.match(result.stderr, /not found|does not exist|no such|missing/i);
    assert.deepEqual(processesMatching(missing), []);
  });

  test("an unknown architecture", () => {
    const dir = brokenModel("unknown-arch", (config) => {
      config.architectures = ["GPT2LMHeadModel"];
    });
    const result = runCli(["serve", dir, "--port", "0"]);
    assert.notEqual(result.code, 0);
    assert.match(result.stderr, /GPT2LMHeadModel/);
    assert.deepEqual(processesMatching(dir), []);
  });

  test("missing weights", () => {
    const dir = brokenModel("no-weights", () => {});
    removeDir(join(dir, "model.safetensors"));
    const result = runCli(["serve", dir, "--port", "0"]);
    assert.notEqual(result.code, 0);
    assert.match(result.stderr, /safetensors/);
    assert.deepEqual(processesMatching(dir), []);
  });

  test("a bad dtype", () => {
    const dir = brokenModel("bad-dtype", () => {});
    const result = runCli(["serve", dir, "--port", "0", "--dtype", "float8"]);
    assert.notEqual(result.code, 0);
    assert.match(result.stderr, /float8/);
    assert.deepEqual(processesMatching(dir), []);
  });
});

describe("shutdown", () => {
  const cases = [
    { signal: "SIGTERM", flags: [] },
    { signal: "SIGINT", flags: [] },
    { signal: "SIGTERM", flags: ["--no-engine-thread"] },
  ] as const;
  for (const { signal, flags } of cases) {
    test(`${signal} stops the server and its worker ${flags.join(" ")}`, async () => {
      const dir = brokenModel(`signal-${signal}`, () => {});
      const server = await startServer([dir, "--served-model-name", "sig", ...flags]);
      try {
        const workers = processesMatching(dir).filter((pid) => pid !== server.proc.pid);
        assert.equal(workers.length, 1, "one worker process runs the model");
        const response = await fetch(`${server.url}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "sig", prompt: "hello", max_tokens: 3 }),
        });
        await response.body?.cancel();
        const exited = new Promise<number | null>((resolve) => server.proc.once("exit", resolve));
        server.proc.kill(signal);
        assert.equal(await exited, 0);
        assert.deepEqual(processesMatching(dir), []);
      } finally {
        await server.stop();
      }
    });
  }

  test("a second signal exits at once, without a crash or a worker left behind", async () => {
    const dir = brokenModel("signal-twice", () => {});
    const server = await startServer([dir, "--served-model-name", "sig"]);
    try {
      // A long request keeps the engine busy so the first signal's shutdown is still running.
      const pending = fetch(`${server.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "sig", prompt: "hello", max_tokens: 2000, ignore_eos: true, stream: true }),
      }).then((r) => r.body?.cancel(), () => undefined);
      await new Promise((resolve) => setTimeout(resolve, 300));
      const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
        server.proc.once("exit", (code, sig) => resolve({ code, signal: sig })),
      );
      server.proc.kill("SIGTERM");
      server.proc.kill("SIGTERM");
      const { code, signal } = await exited;
      assert.equal(signal, null, "not killed by a signal (no abort)");
      assert.ok(code === 0 || code === 1, `exit code ${code}`);
      await pending;
      await waitFor(() => processesMatching(dir).length === 0, 5000);
    } finally {
      await server.stop();
    }
  });
});
