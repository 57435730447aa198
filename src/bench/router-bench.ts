// `baton bench router`: what the data-parallel router buys on a shared-prefix
// workload. Starts `baton serve --data-parallel-size N` twice, one per router
// policy (cache-aware and round-robin), and sends each the same requests
// (G groups of prompts, each group sharing a long system prompt, in a seeded
// random interleaving, at a fixed concurrency, greedy, ignore_eos), reading
// the server's own prefix-cache counters from /metrics before and after. The
// work runs in rounds, each with fresh prompts, alternating which server goes
// first, so that whatever else loads the machine meanwhile falls on both (the
// idle server costs nothing). Reports per policy the prefix-cache hit rate,
// the throughput and the time to first token, with the ratios
// cache-aware / round-robin.

import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { StreamClient, type RequestOutcome } from "./openai-stream.js";
import { freePort, ServerProcess } from "./server-process.js";
import { outputTokensOf } from "./metrics.js";
import { mean, percentile } from "../observability/statistics.js";
import type { RouterPolicy } from "../router/router.js";

export interface RouterBenchOptions {
  /** null: the demo model. */
  modelDir: string | null;
  repoRoot: string;
  dataParallelSize: number;
  groups: number;
  requestsPerGroup: number;
  systemTokens: number;
  questionTokens: number;
  maxTokens: number;
  maxConcurrency: number;
  /** KV blocks per replica (--num-gpu-blocks-override). */
  kvBlocks: number;
  seed: number;
  /** Extra `baton serve` flags (both runs). */
  serveArgs: readonly string[];
  /** Rounds of the workload per server, each with fresh prompts. */
  rounds: number;
}

interface PolicyResult {
  policy: RouterPolicy;
  requests: number;
  failed: number;
  durationS: number;
  /** Prefix-cache hit tokens / queried tokens over the workload, from the server's counters. */
  hitRate: number;
  hitTokens: number;
  queriedTokens: number;
  /** Prompt tokens each replica was queried for (how the router spread the work). */
  queriedPerReplica: number[];
  requestsPerS: number;
  outputTokensPerS: number;
  /** Prompt plus output tokens per second. */
  totalTokensPerS: number;
  meanTtftMs: number;
  p99TtftMs: number;
}

export interface RouterBenchResult {
  options: Omit<RouterBenchOptions, "repoRoot">;
  results: PolicyResult[];
  /** cache-aware / round-robin. */
  ratios: { hitRate: number; outputTokensPerS: number; meanTtft: number };
}

/** A small deterministic generator (mulberry32). */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Token ids in a plain-text range of the Qwen3 vocabulary (the demo model's). */
function tokens(next: () => number, n: number): number[] {
  return Array.from({ length: n }, () => 1000 + Math.floor(next() * 20000));
}

/** The workload's prompts, in the order they are sent. */
export function sharedPrefixPrompts(options: Pick<RouterBenchOptions, "groups" | "requestsPerGroup" | "systemTokens" | "questionTokens" | "seed">): number[][] {
  const next = rng(options.seed);
  const systems = Array.from({ length: options.groups }, () => tokens(next, options.systemTokens));
  const prompts = systems.flatMap((system) => Array.from({ length: options.requestsPerGroup }, () => [...system, ...tokens(next, options.questionTokens)]));
  // Groups interleaved at random, as independent users' requests arrive.
  for (let i = prompts.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [prompts[i], prompts[j]] = [prompts[j] as number[], prompts[i] as number[]];
  }
  return prompts;
}

/** Per engine label, the sum of a metric's series. */
async function perEngine(baseUrl: URL, name: string): Promise<Map<string, number>> {
  const text = await (await fetch(new URL("metrics", baseUrl))).text();
  const sums = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const engine = /engine="(\d+)"/.exec(line)?.[1] ?? "0";
    sums.set(engine, (sums.get(engine) ?? 0) + Number(line.trim().split(/\s+/).at(-1)));
  }
  return sums;
}

interface PolicyServer {
  policy: RouterPolicy;
  server: ServerProcess;
  client: StreamClient;
  baseUrl: URL;
}

/** What one round on one server measured. */
interface RoundSample {
  outcomes: RequestOutcome[];
  durationS: number;
  hitTokens: number;
  queriedPerReplica: number[];
}

async function startPolicy(policy: RouterPolicy, options: RouterBenchOptions, log: (line: string) => void): Promise<PolicyServer> {
  const port = await freePort();
  const baseUrl = new URL(`http://127.0.0.1:${port}/`);
  const cli = join(options.repoRoot, "bin", "baton.mjs");
  const args = [
    cli,
    "serve",
    ...(options.modelDir === null ? [] : [options.modelDir]),
    "--port",
    String(port),
    "--data-parallel-size",
    String(options.dataParallelSize),
    "--router",
    policy,
    "--num-gpu-blocks-override",
    String(options.kvBlocks),
    "--log-level",
    "warn",
    ...options.serveArgs,
  ];
  log(`starting baton serve --data-parallel-size ${options.dataParallelSize} --router ${policy}`);
  const server = await ServerProcess.start({ name: `baton (${policy})`, command: [process.execPath, ...args], env: process.env, cwd: options.repoRoot, baseUrl, startTimeoutMs: 600_000 });
  return { policy, server, client: new StreamClient(baseUrl, options.maxConcurrency), baseUrl };
}

function send(target: PolicyServer, prompt: readonly number[], maxTokens: number): Promise<RequestOutcome> {
  return target.client.send({
    url: new URL("v1/completions", target.baseUrl),
    endpoint: "/v1/completions",
    body: { prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, return_token_ids: true, stream_options: { include_usage: true } },
    headers: {},
  });
}

/** Sends the prompts at the configured concurrency and reads the server's prefix-cache counters around it. */
async function runRound(target: PolicyServer, prompts: readonly number[][], options: RouterBenchOptions): Promise<RoundSample> {
  const hits0 = await perEngine(target.baseUrl, "vllm:prefix_cache_hits_total");
  const queries0 = await perEngine(target.baseUrl, "vllm:prefix_cache_queries_total");
  const outcomes: RequestOutcome[] = [];
  let nextIndex = 0;
  const started = performance.now();
  const lane = async (): Promise<void> => {
    while (nextIndex < prompts.length) {
      const prompt = prompts[nextIndex++] as number[];
      outcomes.push(await send(target, prompt, options.maxTokens));
    }
  };
  await Promise.all(Array.from({ length: options.maxConcurrency }, lane));
  const durationS = (performance.now() - started) / 1000;
  const hits = await perEngine(target.baseUrl, "vllm:prefix_cache_hits_total");
  const queries = await perEngine(target.baseUrl, "vllm:prefix_cache_queries_total");
  const replicas = Array.from({ length: options.dataParallelSize }, (_, i) => String(i));
  return {
    outcomes,
    durationS,
    hitTokens: replicas.reduce((a, e) => a + (hits.get(e) ?? 0) - (hits0.get(e) ?? 0), 0),
    queriedPerReplica: replicas.map((e) => (queries.get(e) ?? 0) - (queries0.get(e) ?? 0)),
  };
}

function summarizePolicy(policy: RouterPolicy, rounds: readonly RoundSample[]): PolicyResult {
  const outcomes = rounds.flatMap((r) => r.outcomes);
  const durationS = rounds.reduce((a, r) => a + r.durationS, 0);
  const queriedPerReplica = (rounds[0]?.queriedPerReplica ?? []).map((_, i) => rounds.reduce((a, r) => a + (r.queriedPerReplica[i] ?? 0), 0));
  const hitTokens = rounds.reduce((a, r) => a + r.hitTokens, 0);
  const queriedTokens = queriedPerReplica.reduce((a, b) => a + b, 0);
  const ok = outcomes.filter((o) => o.success);
  const outputTokens = ok.reduce((a, o) => a + outputTokensOf(o), 0);
  const promptTokens = ok.reduce((a, o) => a + (o.usagePromptTokens ?? 0), 0);
  const ttfts = ok.flatMap((o) => (o.chunkTimesMs.length > 0 ? [(o.chunkTimesMs[0] as number) - o.startMs] : [])).sort((a, b) => a - b);
  return {
    policy,
    requests: outcomes.length,
    failed: outcomes.length - ok.length,
    durationS,
    hitRate: queriedTokens > 0 ? hitTokens / queriedTokens : 0,
    hitTokens,
    queriedTokens,
    queriedPerReplica,
    requestsPerS: ok.length / durationS,
    outputTokensPerS: outputTokens / durationS,
    totalTokensPerS: (outputTokens + promptTokens) / durationS,
    meanTtftMs: mean(ttfts),
    p99TtftMs: percentile(ttfts, 99),
  };
}

export async function runRouterBench(options: RouterBenchOptions, log: (line: string) => void): Promise<RouterBenchResult> {
  const policies = ["cache-aware", "round-robin"] as const;
  const servers: PolicyServer[] = [];
  try {
    for (const policy of policies) servers.push(await startPolicy(policy, options, log));
    // Warm every replica (first steps are slow) with prompts that share nothing with the workload.
    const warm = Array.from({ length: 2 * options.dataParallelSize }, (_, i) => Array.from({ length: 8 }, (_, j) => 30000 + 10 * i + j));
    for (const target of servers) await Promise.all(warm.map((p) => send(target, p, 2)));
    const samples = new Map<RouterPolicy, RoundSample[]>(policies.map((p) => [p, []]));
    for (let round = 0; round < options.rounds; round++) {
      const prompts = sharedPrefixPrompts({ ...options, seed: options.seed + round });
      // Alternate who goes first.
      const order = round % 2 === 0 ? servers : [...servers].reverse();
      for (const target of order) {
        log(`round ${round + 1}/${options.rounds}, ${target.policy}: ${prompts.length} requests at concurrency ${options.maxConcurrency}`);
        samples.get(target.policy)?.push(await runRound(target, prompts, options));
      }
    }
    const results = policies.map((p) => summarizePolicy(p, samples.get(p) ?? []));
    return finish(options, results);
  } finally {
    for (const target of servers) target.client.close();
    await Promise.all(servers.map((t) => t.server.stop()));
  }
}

function finish(options: RouterBenchOptions, results: PolicyResult[]): RouterBenchResult {
  const [ca, rr] = results as [PolicyResult, PolicyResult];
  const { repoRoot: _root, ...shown } = options;
  return {
    options: shown,
    results,
    ratios: {
      hitRate: rr.hitRate > 0 ? ca.hitRate / rr.hitRate : Number.POSITIVE_INFINITY,
      outputTokensPerS: ca.outputTokensPerS / rr.outputTokensPerS,
      meanTtft: ca.meanTtftMs / rr.meanTtftMs,
    },
  };
}

export function routerBenchReport(result: RouterBenchResult): string {
  const o = result.options;
  const lines = [
    `Shared-prefix workload: ${o.rounds} rounds of ${o.groups} groups x ${o.requestsPerGroup} requests, system prompt ${o.systemTokens} tokens + ${o.questionTokens} of its own, ` +
      `${o.maxTokens} output tokens, concurrency ${o.maxConcurrency}, --data-parallel-size ${o.dataParallelSize}, ${o.kvBlocks} KV blocks per replica`,
    "",
    "router        hit rate  prompt tokens by replica   req/s   out tok/s  total tok/s  mean TTFT ms  p99 TTFT ms  failed",
  ];
  for (const r of result.results) {
    lines.push(
      `${r.policy.padEnd(12)}  ${r.hitRate.toFixed(3).padStart(8)}  ${r.queriedPerReplica.join(" / ").padStart(24)}  ${r.requestsPerS.toFixed(2).padStart(6)}  ` +
        `${r.outputTokensPerS.toFixed(1).padStart(10)}  ${r.totalTokensPerS.toFixed(1).padStart(11)}  ${r.meanTtftMs.toFixed(1).padStart(12)}  ${r.p99TtftMs.toFixed(1).padStart(11)}  ${String(r.failed).padStart(6)}`,
    );
  }
  const x = result.ratios;
  lines.push(
    "",
    `cache-aware / round-robin: hit rate x${x.hitRate.toFixed(2)}, output tokens/s x${x.outputTokensPerS.toFixed(2)}, mean TTFT x${x.meanTtft.toFixed(2)}`,
    "",
  );
  return lines.join("\n");
}
