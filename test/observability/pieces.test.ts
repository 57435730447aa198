// Auth key comparison, the 401 hook, the progress bar and the new serve flags.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import Fastify from "fastify";
import { parseServeArgs, UsageError } from "../../src/cli/args.js";
import { apiKeyHook, keyMatches } from "../../src/frontend/auth.js";
import { ProgressBar, renderBar } from "../../src/observability/progress.js";

describe("auth", () => {
  test("keyMatches compares digests of any length", () => {
    const d = createHash("sha256").update("secret").digest();
    assert.equal(keyMatches(d, "secret"), true);
    assert.equal(keyMatches(d, "secreT"), false);
    assert.equal(keyMatches(d, ""), false);
    assert.equal(keyMatches(d, "secret".repeat(100)), false);
  });

  test("the hook leaves /health open and answers 401 elsewhere", async () => {
    const app = Fastify();
    app.addHook("onRequest", apiKeyHook("k"));
    app.get("/health", async () => ({ ok: true }));
    app.get("/x", async () => ({ ok: true }));
    try {
      assert.equal((await app.inject({ url: "/health" })).statusCode, 200);
      assert.equal((await app.inject({ url: "/health?probe=1" })).statusCode, 200);
      const missing = await app.inject({ url: "/x" });
      assert.equal(missing.statusCode, 401);
      assert.equal(missing.headers["www-authenticate"], "Bearer");
      assert.equal(missing.json().error.code, "invalid_api_key");
      assert.equal((await app.inject({ url: "/x", headers: { authorization: "Bearer no" } })).statusCode, 401);
      assert.equal((await app.inject({ url: "/x", headers: { authorization: "Basic k" } })).statusCode, 401);
      assert.equal((await app.inject({ url: "/x", headers: { authorization: "Bearer k" } })).statusCode, 200);
      assert.equal((await app.inject({ url: "/nope", headers: { authorization: "Bearer k" } })).statusCode, 404);
      assert.equal((await app.inject({ url: "/nope" })).statusCode, 401, "unknown routes need the key too");
    } finally {
      await app.close();
    }
  });
});

describe("progress bar", () => {
  test("renders and finishes with a newline once", () => {
    assert.equal(renderBar("w", 5, 10, 10), "w [#####.....]  50% 5/10");
    const writes: string[] = [];
    const bar = new ProgressBar("w", { write: (t) => (writes.push(t), true) }, 4);
    bar.update(0, 4);
    bar.update(0, 4);
    bar.update(2, 4);
    bar.update(4, 4);
    bar.update(4, 4);
    assert.deepEqual(writes, ["\rw [....]   0% 0/4", "\rw [##..]  50% 2/4", "\rw [####] 100% 4/4", "\n"]);
  });

  test("finish() completes a drawn bar once and ignores later updates", () => {
    const writes: string[] = [];
    const bar = new ProgressBar("w", { write: (t) => (writes.push(t), true) }, 4);
    bar.update(1, 4);
    bar.finish();
    bar.finish();
    bar.update(4, 4);
    assert.deepEqual(writes, ["\rw [#...]  25% 1/4", "\rw [####] 100% 4/4", "\n"]);
    const silent: string[] = [];
    new ProgressBar("w", { write: (t) => (silent.push(t), true) }).finish();
    assert.deepEqual(silent, [], "a bar never drawn writes nothing");
  });
});

describe("serve flags", () => {
  test("--api-key, BATON_API_KEY, --log-level, --max-num-queued-requests", () => {
    const a = parseServeArgs(["--api-key", "k1", "--log-level", "warn", "--max-num-queued-requests", "2"], { BATON_API_KEY: "env" }).options;
    assert.equal(a.apiKey, "k1", "the flag wins over the environment");
    assert.equal(a.logLevel, "warn");
    assert.equal(a.maxNumQueuedRequests, 2);
    assert.equal(parseServeArgs([], { BATON_API_KEY: "env" }).options.apiKey, "env");
    assert.equal(parseServeArgs([], {}).options.apiKey, null);
    assert.throws(() => parseServeArgs(["--log-level", "loud"], {}), UsageError);
    assert.throws(() => parseServeArgs(["--api-key", ""], {}), UsageError);
    assert.throws(() => parseServeArgs(["--max-num-queued-requests", "-1"], {}), UsageError);
  });
});
