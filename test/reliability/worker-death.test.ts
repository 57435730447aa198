// A model worker that dies is survived (README.md, "When a worker dies"),
// against the real CLI, the real Python worker on the demo model and real HTTP:
// - SIGKILL under 32 streams (half greedy, half seeded at temperature 1): /health says 503 and why within 1 s, the
//   worker is restarted, every stream completes with exactly the text of an
//   undisturbed run, then /health is 200 and new requests are served; no KV
//   block is leaked.
// - the same during prefill, and with the restarting worker killed too;
// - with --max-request-migrations 0 every stream ends with an in-band error
//   within 5 s (a collected request with a 503), and the server serves again.
// Workers run with OMP_NUM_THREADS=1: the test machine's cores are shared.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { startServer, type RunningServer } from "../e2e/harness.js";
import { health, metric, promptIds, streamCompletion, waitFor, waitForHealth, workerPid, workerPids, type StreamProgress, type StreamResult } from "./helpers.js";

const ENV = { ...process.env, OMP_NUM_THREADS: "1" };
const STREAMS = 32;
const TOKENS = 24;

function blocksOf(server: RunningServer): number {
  return Number(/(\d+) KV blocks/.exec(server.output())?.[1]);
}

/** Streams every prompt at once; `progress[i]` follows stream i. */
function streamAll(url: string, prompts: number[][], maxTokens: number): { progress: StreamProgress[]; done: Promise<StreamResult[]> } {
  const progress = prompts.map(() => ({ tokens: 0 }));
  return { progress, done: Promise.all(prompts.map((p, i) => streamCompletion(url, p, maxTokens, progress[i], seededExtra(i)))) };
}

/** Every other stream samples at temperature 1 with a seed: its migrated text must equal the undisturbed one too. */
function seededExtra(i: number): Record<string, unknown> {
  return i % 2 === 1 ? { temperature: 1, seed: 1000 + i } : {};
}

function assertSameAs(results: StreamResult[], reference: StreamResult[]): void {
  results.forEach((r, i) => {
    assert.equal(r.error, null, `stream ${i}: ${JSON.stringify(r.error)}`);
    assert.equal(r.finish, "length", `stream ${i}`);
    assert.ok(r.sawDone, `stream ${i} ends with [DONE]`);
    assert.deepEqual(r.tokenIds, reference[i]!.tokenIds, `stream ${i}: token ids`);
    assert.equal(r.text, reference[i]!.text, `stream ${i}: text`);
  });
}

describe("a worker killed under load (request migration on, the default)", () => {
  let server: RunningServer;
  const prompts = Array.from({ length: STREAMS }, (_, i) => promptIds(i, 12));
  let reference: StreamResult[];

  before(async () => {
    server = await startServer([], 120_000, ENV);
    reference = await streamAll(server.url, prompts, TOKENS).done;
  });
  after(async () => {
    await server?.stop();
  });

  test("32 streams survive a SIGKILL with the undisturbed text; /health is 503 within 1 s, then 200", async () => {
    const pid = workerPid(server);
    const { progress, done } = streamAll(server.url, prompts, TOKENS);
    await waitFor("every stream to have tokens", () => (progress.every((p) => p.tokens >= 4) ? true : null), 60_000);
    const killedAt = performance.now();
    process.kill(pid, "SIGKILL");
    const down = await waitForHealth(server.url, 503, 5_000);
    assert.ok(down.at - killedAt < 1_000, `/health said 503 after ${Math.round(down.at - killedAt)} ms`);
    assert.match(down.message, /died: model worker was killed by SIGKILL; restarting it in 1 s/);
    // New requests are turned away meanwhile, with Retry-After.
    const refused = await streamCompletion(server.url, prompts[0]!, 2);
    assert.equal(refused.status, 503);
    assert.ok(refused.retryAfter !== null);
    const results = await done;
    assertSameAs(results, reference);
    assert.ok(results.every((r) => r.tokenIds.length === TOKENS));
    assert.equal((await health(server.url)).status, 200);
    assert.notEqual(workerPid(server), pid);
    // Served again, and nothing leaked: every block is free once idle.
    assertSameAs([await streamCompletion(server.url, prompts[3]!, TOKENS, undefined, seededExtra(3))], [reference[3]!]);
    await waitFor("all KV blocks free", async () => ((await metric(server.url, "baton:kv_free_blocks")) === blocksOf(server) ? true : null), 5_000);
    assert.equal(await metric(server.url, "vllm:num_requests_running"), 0);
    assert.equal(await metric(server.url, "baton:worker_deaths_total"), 1);
    assert.equal(await metric(server.url, "baton:worker_restarts_total"), 1);
  });

  test("a death during prefill: long prompts are recomputed and complete exactly", async () => {
    // 12000 prompt tokens: six chunked-prefill steps of 2048.
    const long = Array.from({ length: 4 }, (_, i) => promptIds(100 + i, 3000));
    const pid = workerPid(server);
    const { progress, done } = streamAll(server.url, long, 8);
    await waitFor("the prefill to start", async () => ((await metric(server.url, "vllm:num_requests_running")) ?? 0) > 0 ? true : null, 30_000, 5);
    const waitingForFirstToken = progress.filter((p) => p.tokens === 0).length;
    process.kill(pid, "SIGKILL");
    const results = await done;
    assert.ok(waitingForFirstToken > 0, "killed while a prompt was still being prefilled");
    const undisturbed = await streamAll(server.url, long, 8).done;
    assertSameAs(results, undisturbed);
  });

  test("a worker killed while it restarts: the next attempt serves the streams to the end", async () => {
    const first = workerPid(server);
    const { progress, done } = streamAll(server.url, prompts.slice(0, 8), TOKENS);
    await waitFor("tokens", () => (progress.every((p) => p.tokens >= 2) ? true : null), 60_000);
    process.kill(first, "SIGKILL");
    // The restart spawns after 1 s; kill it while it loads.
    const second = await waitFor("the restarting worker", () => workerPids(server).find((p) => p !== first) ?? null, 10_000, 10);
    process.kill(second, "SIGKILL");
    const results = await done;
    assertSameAs(results, reference.slice(0, 8));
    const third = workerPid(server);
    assert.ok(third !== first && third !== second);
    assert.match(server.output(), /restarting it in 2 s/, "the second attempt waited twice as long");
  });
});

describe("--max-request-migrations 0", () => {
  let server: RunningServer;
  before(async () => {
    server = await startServer(["--max-request-migrations", "0"], 120_000, ENV);
  });
  after(async () => {
    await server?.stop();
  });

  test("every stream ends with an error within 5 s of the death, a collected request gets 503; then served again", async () => {
    const prompts = Array.from({ length: STREAMS }, (_, i) => promptIds(200 + i, 12));
    const { progress, done } = streamAll(server.url, prompts, 400);
    const collected = fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: prompts[0], max_tokens: 400, ignore_eos: true, temperature: 0 }),
    });
    await waitFor("every stream to have tokens", () => (progress.every((p) => p.tokens >= 2) ? true : null), 60_000);
    const killedAt = performance.now();
    process.kill(workerPid(server), "SIGKILL");
    const results = await done;
    for (const [i, r] of results.entries()) {
      assert.equal(r.status, 200);
      assert.ok(r.error !== null, `stream ${i} ends with an error event`);
      assert.match(r.error.message, /requests are not carried over to a restarted worker \(--max-request-migrations 0\)/);
      assert.ok(r.sawDone, `stream ${i} is closed with [DONE]`);
      assert.equal(r.finish, null);
      assert.ok(r.endedAt - killedAt < 5_000, `stream ${i} ended ${Math.round(r.endedAt - killedAt)} ms after the kill`);
    }
    const refused = await collected;
    assert.equal(refused.status, 503);
    assert.ok(refused.headers.get("retry-after") !== null);
    assert.match(((await refused.json()) as { error: { message: string } }).error.message, /--max-request-migrations 0/);
    await waitForHealth(server.url, 200, 30_000);
    const again = await streamCompletion(server.url, prompts[1]!, 4);
    assert.equal(again.finish, "length");
    assert.equal(again.tokenIds.length, 4);
  });
});
