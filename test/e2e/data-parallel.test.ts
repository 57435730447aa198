// Data parallel end to end: the real CLI with --data-parallel-size 2 (two
// engine threads, two Python workers, two KV caches behind one HTTP port),
// against the same demo model served with one engine.
// - greedy output of concurrent requests is token-exact with one engine;
// - a shared-prefix workload (8 groups of prompts sharing a long system
//   prompt) hits the prefix caches more under the cache-aware router than
//   under round-robin, by the servers' own /metrics counters, and both
//   replicas serve;
// - /metrics labels engine-level series engine="0" / engine="1";
// - a replica whose worker is killed is routed around (requests keep being
//   served, /health stays 200 and says so) and comes back, and the requests
//   it was running carry over to its restarted worker token-exactly; /health
//   is 503 only while every replica is down; a replica that gives up
//   restarting is out for good while the others serve, and the server exits
//   1 once all have;
// - a graph of models is refused at start-up with a clear error.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { repoRoot, startServer, type RunningServer } from "./harness.js";
import { health, promptIds, streamCompletion, waitFor, waitForHealth, workerPids } from "../reliability/helpers.js";

const COMMON = ["--num-gpu-blocks-override", "512", "--log-level", "warn"];
const GROUPS = 8;
const SYSTEM_TOKENS = 160;

/** Every sample of a metric with its labels. */
async function samples(url: string, name: string): Promise<{ labels: Record<string, string>; value: number }[]> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const found: { labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split("\n")) {
    const match = /^([^{\s]+)(?:\{([^}]*)\})?\s+(\S+)$/.exec(line);
    if (match === null || match[1] !== name) continue;
    const labels: Record<string, string> = {};
    for (const pair of (match[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)) labels[pair[1] as string] = pair[2] as string;
    found.push({ labels, value: Number(match[3]) });
  }
  return found;
}

/** A metric summed per engine label. */
async function perEngine(url: string, name: string): Promise<Map<string, number>> {
  const byEngine = new Map<string, number>();
  for (const s of await samples(url, name)) {
    const engine = s.labels.engine ?? "";
    byEngine.set(engine, (byEngine.get(engine) ?? 0) + s.value);
  }
  return byEngine;
}

/** Runs `baton serve` expecting it to exit by itself (killed after 120 s). */
function serveToExit(args: string[]): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [join(repoRoot, "bin", "baton.mjs"), "serve", ...args], { cwd: repoRoot, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const timer = setTimeout(() => child.kill("SIGKILL"), 120_000);
  return new Promise((resolve) =>
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stderr });
    }),
  );
}

const total = (m: Map<string, number>): number => [...m.values()].reduce((a, b) => a + b, 0);

/** Greedy token ids of each prompt, all requests at once. */
async function greedy(url: string, prompts: number[][], maxTokens: number): Promise<number[][]> {
  const results = await Promise.all(prompts.map((p) => streamCompletion(url, p, maxTokens)));
  for (const r of results) assert.equal(r.status, 200, JSON.stringify(r.error));
  return results.map((r) => r.tokenIds);
}

/** Group g's k-th prompt: its system prompt, then a short question of its own. */
function groupPrompt(g: number, k: number): number[] {
  return [...promptIds(100 + g, SYSTEM_TOKENS), ...promptIds(1000 + g * 10 + k, 8)];
}

/**
 * The shared-prefix workload: one request per group first (the system prompts
 * get cached somewhere), then two more per group at once. Returns the prefix
 * cache hit rate of the whole workload (hit tokens / queried tokens) and the
 * prompt tokens each engine was queried for.
 */
async function sharedPrefixWorkload(url: string): Promise<{ hitRate: number; queriedPerEngine: Map<string, number> }> {
  const hits0 = await perEngine(url, "vllm:prefix_cache_hits_total");
  const queries0 = await perEngine(url, "vllm:prefix_cache_queries_total");
  const groups = Array.from({ length: GROUPS }, (_, g) => g);
  await greedy(url, groups.map((g) => groupPrompt(g, 0)), 4);
  await greedy(url, groups.flatMap((g) => [groupPrompt(g, 1), groupPrompt(g, 2)]), 4);
  const hits = await perEngine(url, "vllm:prefix_cache_hits_total");
  const queries = await perEngine(url, "vllm:prefix_cache_queries_total");
  const queriedPerEngine = new Map([...queries].map(([e, v]) => [e, v - (queries0.get(e) ?? 0)]));
  return { hitRate: (total(hits) - total(hits0)) / total(queriedPerEngine), queriedPerEngine };
}

describe("data parallel (--data-parallel-size 2)", { timeout: 240_000 }, () => {
  let single: RunningServer | null = null;
  let cacheAware: RunningServer | null = null;
  let roundRobin: RunningServer | null = null;
  let graphRefusal: Promise<{ code: number | null; stderr: string }> | null = null;

  before(async () => {
    // The speech model with two replicas, started meanwhile: it must exit 1 saying why.
    graphRefusal = serveToExit([join(repoRoot, "models", "demo-tts"), "--data-parallel-size", "2", "--port", "0", ...COMMON]);
    const started = await Promise.allSettled([
      startServer(COMMON),
      startServer([...COMMON, "--data-parallel-size", "2"]),
      // One restart in a row allowed: the last test makes its replicas give up.
      startServer([...COMMON, "--data-parallel-size", "2", "--router", "round-robin", "--no-engine-thread", "--max-worker-restarts", "1"]),
    ]);
    const running = started.map((s) => (s.status === "fulfilled" ? s.value : null));
    single = running[0] ?? null;
    cacheAware = running[1] ?? null;
    roundRobin = running[2] ?? null;
    const failed = started.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed !== undefined) throw failed.reason;
  });

  after(async () => {
    await Promise.all([single, cacheAware, roundRobin].map((s) => s?.stop()));
    await graphRefusal;
  });

  test("each replica has its own worker, and the replicas' workers share the host's cores", () => {
    assert.equal(workerPids(cacheAware!).length, 2);
    assert.equal(workerPids(roundRobin!).length, 2);
    // Two workers each taking every core oversubscribe them (about 2.8x slower measured on 2 cores).
    for (const pid of [...workerPids(cacheAware!), ...workerPids(roundRobin!)]) {
      assert.match(readFileSync(`/proc/${pid}/cmdline`, "utf8"), /\x00--host-workers\x002\x00/);
    }
    assert.ok(workerPids(single!).every((pid) => !readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("--host-workers")));
  });

  test("greedy output of concurrent requests is token-exact with one engine", async () => {
    const prompts = Array.from({ length: 8 }, (_, i) => promptIds(500 + i, 12 + 9 * i));
    const expected = await greedy(single!.url, prompts, 16);
    const [ca, rr] = await Promise.all([greedy(cacheAware!.url, prompts, 16), greedy(roundRobin!.url, prompts, 16)]);
    assert.deepEqual(ca, expected);
    assert.deepEqual(rr, expected);
    for (const ids of expected) assert.equal(ids.length, 16);
  });

  test("/metrics labels engine-level series by replica; request-level ones stay per model", async () => {
    const running = await samples(cacheAware!.url, "vllm:num_requests_running");
    assert.deepEqual(running.map((s) => s.labels.engine).sort(), ["0", "1"]);
    const queries = await samples(cacheAware!.url, "vllm:prefix_cache_queries_total");
    assert.deepEqual(queries.map((s) => s.labels.engine).sort(), ["0", "1"]);
    const blocks = await samples(cacheAware!.url, "baton:kv_total_blocks");
    assert.deepEqual(blocks.map((s) => [s.labels.engine, s.value]).sort(), [["0", 512], ["1", 512]]);
    const ttft = await samples(cacheAware!.url, "vllm:time_to_first_token_seconds_count");
    assert.equal(ttft.length, 1);
    assert.equal(ttft[0]!.labels.engine, undefined);
    // One engine: no engine label, as before.
    const singleRunning = await samples(single!.url, "vllm:num_requests_running");
    assert.deepEqual(singleRunning.map((s) => s.labels.engine), [undefined]);
  });

  test("shared prefixes: cache-aware routing hits the prefix caches more than round-robin, on both replicas", async (t) => {
    const [ca, rr] = await Promise.all([sharedPrefixWorkload(cacheAware!.url), sharedPrefixWorkload(roundRobin!.url)]);
    t.diagnostic(`prefix-cache hit rate: cache-aware ${ca.hitRate.toFixed(3)}, round-robin ${rr.hitRate.toFixed(3)}`);
    // Cache-aware: the 16 later requests all find their group's system prompt (10 blocks of 16).
    const ideal = (2 * GROUPS * SYSTEM_TOKENS) / (3 * GROUPS * (SYSTEM_TOKENS + 8));
    assert.ok(ca.hitRate > rr.hitRate, `cache-aware ${ca.hitRate.toFixed(3)} <= round-robin ${rr.hitRate.toFixed(3)}`);
    assert.ok(ca.hitRate >= ideal * 0.95, `cache-aware hit rate ${ca.hitRate.toFixed(3)}, expected about ${ideal.toFixed(3)}`);
    for (const engine of ["0", "1"]) assert.ok((ca.queriedPerEngine.get(engine) ?? 0) > 0, `replica ${engine} got no request`);
    const routed = await samples(cacheAware!.url, "baton:router_requests_total");
    const hitsRouted = routed.filter((s) => s.labels.reason === "cache_hit").reduce((a, s) => a + s.value, 0);
    assert.ok(hitsRouted >= 2 * GROUPS, `only ${hitsRouted} requests routed as cache hits`);
  });

  test("a replica whose worker is killed is routed around and comes back; its requests carry over", async () => {
    const url = cacheAware!.url;
    const before = workerPids(cacheAware!);
    // Streams in flight on both replicas when the worker dies: the dead replica's continue on its restarted worker.
    const longPrompts = Array.from({ length: 4 }, (_, i) => promptIds(700 + i, 30 + 11 * i));
    const progress = longPrompts.map(() => ({ tokens: 0 }));
    const streams = longPrompts.map((p, i) => streamCompletion(url, p, 24, progress[i]));
    const expected = greedy(single!.url, longPrompts, 24);
    await waitFor("every stream to start", () => (progress.every((p) => p.tokens > 0) ? true : null), 30_000);
    process.kill(before[0]!, "SIGKILL");
    // /health stays 200 (the other replica serves) and says which one is down.
    const degraded = await waitFor("a degraded /health", async () => {
      const h = await health(url);
      assert.equal(h.status, 200);
      return h.body.message !== undefined && /replica (\d)/.test(h.body.message) ? h.body.message : null;
    }, 10_000);
    const dead = /replica (\d)/.exec(degraded)![1]!;
    const routedBefore = await perEngine(url, "baton:router_requests_total");
    const prompts = Array.from({ length: 6 }, (_, i) => promptIds(900 + i, 20));
    const outputs = await greedy(url, prompts, 8);
    for (const ids of outputs) assert.equal(ids.length, 8);
    const routedAfter = await perEngine(url, "baton:router_requests_total");
    assert.equal((routedAfter.get(dead) ?? 0) - (routedBefore.get(dead) ?? 0), 0, "a request went to the dead replica");
    // The supervisor restarts it; then /health is plain ok again and both replicas take requests.
    await waitFor("the replica to come back", async () => ((await health(url)).body.message === undefined ? true : null), 90_000, 200);
    const now = workerPids(cacheAware!);
    assert.equal(now.length, 2);
    assert.ok(!now.includes(before[0]!));
    const again = await greedy(url, Array.from({ length: 4 }, (_, i) => promptIds(950 + i, 40)), 4);
    assert.equal(again.length, 4);
    const carried = await Promise.all(streams);
    assert.deepEqual(
      carried.map((r) => [r.status, r.finish, r.tokenIds]),
      (await expected).map((ids) => [200, "length", ids]),
    );
  });

  test("/health is 503 only while every replica is down; a replica that gives up is out, the server exits 1 when all have", async () => {
    const url = roundRobin!.url;
    for (const pid of workerPids(roundRobin!)) process.kill(pid, "SIGKILL");
    const down = await waitForHealth(url, 503, 10_000);
    assert.match(down.message, /replica 0/);
    assert.match(down.message, /replica 1/);
    await waitFor("both replicas back", async () => {
      const h = await health(url);
      return h.status === 200 && h.body.message === undefined ? true : null;
    }, 90_000, 200);
    assert.equal((await greedy(url, [promptIds(990, 20)], 4))[0]!.length, 4);
    // A second death within a minute is past --max-worker-restarts 1: that replica is out for good, the other serves.
    const [first, second] = workerPids(roundRobin!);
    process.kill(first!, "SIGKILL");
    const gaveUp = await waitFor("the replica to give up", async () => {
      const message = (await health(url)).body.message ?? "";
      return /died 2 times in a row/.test(message) ? message : null;
    }, 10_000);
    assert.match(gaveUp, /^serving on 1 of 2 replicas: replica \d: /);
    for (const ids of await greedy(url, Array.from({ length: 4 }, (_, i) => promptIds(995 + i, 20)), 4)) assert.equal(ids.length, 4);
    assert.equal((await health(url)).status, 200);
    assert.deepEqual(workerPids(roundRobin!), [second]);
    process.kill(second!, "SIGKILL");
    const proc = roundRobin!.proc;
    await waitFor("the server to exit", () => (proc.exitCode !== null || proc.signalCode !== null ? true : null), 30_000, 100);
    assert.equal(proc.exitCode, 1);
  });

  test("a graph of models is refused at start-up", async () => {
    const { code, stderr } = await graphRefusal!;
    assert.equal(code, 1, stderr);
    assert.match(stderr, /--data-parallel-size > 1 serves plain LLMs only/);
  });
});
