// `baton bench <serve|compare|overhead|masks>`: the load generator against any
// OpenAI-compatible server, Baton against a peer server, the control
// plane's per-step cost with the model taken out (src/bench/overhead.ts), and
// structured output's mask cost per step (src/bench/mask-cost.ts).
// serve and compare live in bench-serve.ts.

import { existsSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { MAIN_PHASES, THREAD_PHASES, runCompare, runOverhead, type BatchResult, type CompareResult } from "../bench/overhead.js";
import { UsageError } from "./args.js";
import { maskCostTable, runMaskCost } from "../bench/mask-cost.js";
import { readModelDir } from "../config/model-dir.js";
import { runSoak, soakReport } from "../bench/soak.js";
import { routerBenchReport, runRouterBench, type RouterBenchOptions } from "../bench/router-bench.js";
import { COMPARE_HELP, parseCompareArgs, parseServeBenchArgs, runCompareCommand, runServeCommand, SERVE_BENCH_HELP, type CompareArgs, type ServeBenchArgs } from "./bench-serve.js";

const BENCH_HELP = `Usage: baton bench <benchmark> [options]

Benchmarks:
  serve      load an OpenAI-compatible server (Baton or any other) with
             streamed requests and report vLLM's serving metrics
  compare    run the same workload against Baton and a peer server
             (e.g. transformers serve) started one after the other
  overhead   the control plane's per-step cost with the model taken out
  masks      structured output's cost per step at 1, 32, 128 constrained rows
  soak       N minutes of mixed load while the worker is killed and stopped
             at random; fails on any leak
  router     a shared-prefix workload against --data-parallel-size N with
             the cache-aware router and with round-robin: prefix-cache hit
             rate, throughput and TTFT of both, and their ratios

Run 'baton bench <benchmark> --help' for its options.
`;

const OVERHEAD_HELP = `Usage: baton bench overhead [model-dir] [options]

Runs B concurrent streaming /v1/completions requests (ignore_eos, long
max_tokens) through the real HTTP server and engine core against a Python
worker in the dummy-null load format (no model: each token is the last + 1),
and reports per-step times (p50/p99) of each control-plane phase, with
overlap scheduling off so that the phases of one step add up to the step,
the tokens the clients received per second, and the CPU cores the server
process, the worker and the clients used meanwhile (tokens received per
server core: the front end's ceiling per core).
model-dir defaults to models/demo; only its tokenizer and config are used
(with --load-format auto its weights too).

Options:
  --batch-sizes LIST     comma-separated B values (default 1,16,64,256,1024)
  --steps N              measured decode steps per B (default 200)
  --warmup N             steps skipped once all B requests run (default 20)
  --json                 print one JSON object keyed by B
  --no-engine-thread     run the engine core on the main thread (as serve
                         --no-engine-thread does); default: its own thread
  --load-format F        dummy-null (default: no model) or auto (the model's
                         real forward pass)
  --compare WHAT         run the workload with WHAT off, then on, and print
                         the ratio of tokens/s the clients received: async
                         (overlap scheduling) or engine-thread
  --compare-async        the same as --compare async
  -h, --help             show this help
`;

const MASKS_HELP = `Usage: baton bench masks [model-dir] [options]

What structured output costs per engine step with R constrained rows: the
grammar thread advancing each row's matcher and making its token bitmask,
the engine's round trip to it, the StepMask's encoding, and the worker
masking [R, vocab] logits. Rows decode a nested JSON schema with random
allowed tokens. model-dir defaults to models/demo (its tokenizer and vocab).

Options:
  --rows LIST      comma-separated R values (default 1,32,128)
  --steps N        measured steps per R (default 50)
  --device D       where the worker's part runs: cpu (default) or cuda
  --regex PATTERN  decode this regular expression instead of the JSON schema
  -h, --help       show this help
`;

interface MasksArgs {
  kind: "masks";
  help: boolean;
  modelDir: string | null;
  rows: number[];
  steps: number;
  device: "cpu" | "cuda";
  regex: string | null;
}

function parseMasksArgs(rest: readonly string[]): MasksArgs {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...rest],
      allowPositionals: true,
      strict: true,
      options: { rows: { type: "string" }, steps: { type: "string" }, device: { type: "string" }, regex: { type: "string" }, help: { type: "boolean", short: "h" } },
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const { values, positionals } = parsed;
  if (positionals.length > 1) throw new UsageError(`expected at most one model directory, got ${positionals.join(" ")}`);
  const device = values.device ?? "cpu";
  if (device !== "cpu" && device !== "cuda") throw new UsageError(`invalid value '${device}' for --device: expected cpu or cuda`);
  return {
    kind: "masks",
    help: values.help === true,
    modelDir: positionals[0] ?? null,
    rows: (values.rows ?? "1,32,128").split(",").map((s) => positiveInt(s.trim(), "rows")),
    steps: values.steps === undefined ? 50 : positiveInt(values.steps, "steps"),
    device,
    regex: values.regex ?? null,
  };
}

const SOAK_HELP = `Usage: baton bench soak [model-dir] [options]

Starts baton serve (model-dir defaults to models/demo) and drives it for N
minutes with mixed load: streamed and collected completions at temperatures
0 and 1, clients that disconnect mid-stream, and bad requests. Meanwhile the
model worker is killed (SIGKILL) or stopped (SIGSTOP, found by the step
watchdog) at random, one fault at a time. At the end, once idle: every KV
block must be free, no graph tensor held, one worker process and no orphan,
the server's file descriptors and the memory of every process flat, and
every request must have ended with its tokens or with an error that says
why (a 503 while the worker restarts, an error for a request a death ended).
Then a drain (SIGTERM) must end in exit 0. Prints requests served, errors
by cause, faults, restarts, free KV blocks and RSS at start and end; exits
1 on any leak or unexplained failure.

Options:
  --minutes N            how long the load runs (default 1; fractions allowed)
  --concurrency C        clients sending back to back (default 16)
  --fault-interval S     mean seconds between faults, exponentially spread
                         (default 20; 0: no faults)
  --step-timeout S       the server's --step-timeout (default 5)
  --seed N               the load's and the faults' random seed (default 0)
  --json                 print the result as one JSON object
  -h, --help             show this help
`;

const ROUTER_HELP = `Usage: baton bench router [model-dir] [options]

Starts baton serve --data-parallel-size N (model-dir defaults to models/demo)
with --router cache-aware, then with --router round-robin, and sends each the
same shared-prefix workload: G groups of R requests, each group's prompts
sharing one long system prompt followed by a question of their own, groups
interleaved at random (seeded), streamed greedy completions at a fixed
concurrency. Prints per router the prefix-cache hit rate (from the server's
vllm:prefix_cache_* counters), the prompt tokens each replica was given,
requests/s, output and total tokens/s, TTFT, and the ratios.

Options:
  --data-parallel-size N   replicas (default 2)
  --groups G               prompt groups (default 16)
  --requests-per-group R   requests per group (default 8)
  --system-tokens N        shared system prompt length (default 512)
  --question-tokens N      each request's own tokens after it (default 32)
  --max-tokens N           output tokens per request (default 16)
  --max-concurrency C      requests in flight (default 16)
  --kv-blocks N            KV blocks per replica (default 400: room for about
                           half the groups' system prompts, as a cache that
                           cannot hold everything twice)
  --rounds N               rounds per router, each with fresh prompts,
                           alternating which server goes first (default 2)
  --seed N                 the workload's seed (default 0)
  --serve-arg=ARG          an extra baton serve flag (repeatable; with "=",
                           e.g. --serve-arg=--no-engine-thread)
  --json                   print one JSON object
  -h, --help               show this help
`;

/** `baton bench router`: the bench's options (less what the CLI fills in) and how to print. */
interface RouterArgs extends Omit<RouterBenchOptions, "repoRoot" | "serveArgs"> {
  kind: "router";
  help: boolean;
  serveArgs: string[];
  json: boolean;
}

function parseRouterArgs(rest: readonly string[]): RouterArgs {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...rest],
      allowPositionals: true,
      strict: true,
      options: {
        "data-parallel-size": { type: "string" },
        groups: { type: "string" },
        "requests-per-group": { type: "string" },
        "system-tokens": { type: "string" },
        "question-tokens": { type: "string" },
        "max-tokens": { type: "string" },
        "max-concurrency": { type: "string" },
        "kv-blocks": { type: "string" },
        rounds: { type: "string" },
        seed: { type: "string" },
        "serve-arg": { type: "string", multiple: true },
        json: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const { values, positionals } = parsed;
  if (positionals.length > 1) throw new UsageError(`expected at most one model directory, got ${positionals.join(" ")}`);
  const int = (name: keyof typeof values, fallback: number): number => {
    const v = values[name];
    return typeof v === "string" ? positiveInt(v, name) : fallback;
  };
  const dataParallelSize = int("data-parallel-size", 2);
  if (dataParallelSize < 2) throw new UsageError("--data-parallel-size must be at least 2 (one engine has nothing to route between)");
  return {
    kind: "router",
    help: values.help === true,
    modelDir: positionals[0] ?? null,
    dataParallelSize,
    groups: int("groups", 16),
    requestsPerGroup: int("requests-per-group", 8),
    systemTokens: int("system-tokens", 512),
    questionTokens: int("question-tokens", 32),
    maxTokens: int("max-tokens", 16),
    maxConcurrency: int("max-concurrency", 16),
    kvBlocks: int("kv-blocks", 400),
    rounds: int("rounds", 2),
    seed: values.seed === undefined ? 0 : nonNegativeInt(values.seed, "seed"),
    serveArgs: values["serve-arg"] ?? [],
    json: values.json === true,
  };
}

interface SoakArgs {
  kind: "soak";
  help: boolean;
  modelDir: string | null;
  minutes: number;
  concurrency: number;
  faultIntervalS: number;
  stepTimeoutS: number;
  seed: number;
  json: boolean;
}

interface OverheadArgs {
  kind: "overhead";
  help: boolean;
  modelDir: string | null;
  batchSizes: number[];
  steps: number;
  warmup: number;
  json: boolean;
  engineThread: boolean;
  loadFormat: "dummy-null" | "auto";
  compare: "async" | "engine-thread" | null;
}

function positiveInt(text: string, flag: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n) || n < 1) throw new UsageError(`invalid value '${text}' for --${flag}: expected a positive integer`);
  return n;
}

export type BenchArgs = { kind: "list"; help: true } | OverheadArgs | ServeBenchArgs | CompareArgs | MasksArgs | SoakArgs | RouterArgs;

export function parseBenchArgs(args: readonly string[]): BenchArgs {
  const [sub, ...rest] = args;
  if (sub === undefined || sub === "--help" || sub === "-h") return { kind: "list", help: true };
  if (sub === "serve") return parseServeBenchArgs(rest);
  if (sub === "compare") return parseCompareArgs(rest);
  if (sub === "masks") return parseMasksArgs(rest);
  if (sub === "soak") return parseSoakArgs(rest);
  if (sub === "router") return parseRouterArgs(rest);
  if (sub !== "overhead") throw new UsageError(`unknown benchmark '${sub}' (available: serve, compare, overhead, masks, soak, router)`);
  return parseOverheadArgs(rest);
}

function nonNegativeInt(text: string, flag: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n) || n < 0) throw new UsageError(`invalid value '${text}' for --${flag}: expected a non-negative integer`);
  return n;
}

function nonNegativeNumber(text: string, flag: string, min = 0): number {
  const n = /^\d+(\.\d+)?$/.test(text.trim()) ? Number(text) : Number.NaN;
  if (!Number.isFinite(n) || n < min) throw new UsageError(`invalid value '${text}' for --${flag}: expected a number of at least ${min}`);
  return n;
}

function parseSoakArgs(rest: readonly string[]): SoakArgs {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...rest],
      allowPositionals: true,
      strict: true,
      options: {
        minutes: { type: "string" },
        concurrency: { type: "string" },
        "fault-interval": { type: "string" },
        "step-timeout": { type: "string" },
        seed: { type: "string" },
        json: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const { values, positionals } = parsed;
  if (positionals.length > 1) throw new UsageError(`expected at most one model directory, got ${positionals.join(" ")}`);
  return {
    kind: "soak",
    help: values.help === true,
    modelDir: positionals[0] ?? null,
    minutes: values.minutes === undefined ? 1 : nonNegativeNumber(values.minutes, "minutes", 0.05),
    concurrency: values.concurrency === undefined ? 16 : positiveInt(values.concurrency, "concurrency"),
    faultIntervalS: values["fault-interval"] === undefined ? 20 : nonNegativeNumber(values["fault-interval"], "fault-interval"),
    stepTimeoutS: values["step-timeout"] === undefined ? 5 : nonNegativeNumber(values["step-timeout"], "step-timeout", 0.1),
    seed: values.seed === undefined ? 0 : nonNegativeInt(values.seed, "seed"),
    json: values.json === true,
  };
}

/** The help text for what was asked. */
export function benchHelp(args: BenchArgs): string {
  switch (args.kind) {
    case "list":
      return BENCH_HELP;
    case "overhead":
      return OVERHEAD_HELP;
    case "serve":
      return SERVE_BENCH_HELP;
    case "compare":
      return COMPARE_HELP;
    case "masks":
      return MASKS_HELP;
    case "soak":
      return SOAK_HELP;
    case "router":
      return ROUTER_HELP;
  }
}

function parseOverheadArgs(rest: readonly string[]): OverheadArgs {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...rest],
      allowPositionals: true,
      strict: true,
      options: {
        "batch-sizes": { type: "string" },
        steps: { type: "string" },
        warmup: { type: "string" },
        json: { type: "boolean" },
        "compare-async": { type: "boolean" },
        compare: { type: "string" },
        "engine-thread": { type: "boolean" },
        "no-engine-thread": { type: "boolean" },
        "load-format": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const { values, positionals } = parsed;
  if (positionals.length > 1) throw new UsageError(`expected at most one model directory, got ${positionals.join(" ")}`);
  const batchSizes = (values["batch-sizes"] ?? "1,16,64,256,1024").split(",").map((s) => positiveInt(s.trim(), "batch-sizes"));
  const compare = values["compare-async"] === true ? "async" : (values.compare ?? null);
  if (compare !== null && compare !== "async" && compare !== "engine-thread") {
    throw new UsageError(`invalid value '${compare}' for --compare: expected async or engine-thread`);
  }
  const loadFormat = values["load-format"] ?? "dummy-null";
  if (loadFormat !== "dummy-null" && loadFormat !== "auto") throw new UsageError(`invalid value '${loadFormat}' for --load-format: expected dummy-null or auto`);
  if (values["engine-thread"] === true && values["no-engine-thread"] === true) throw new UsageError("--engine-thread and --no-engine-thread contradict each other");
  return {
    kind: "overhead",
    help: values.help === true,
    modelDir: positionals[0] ?? null,
    batchSizes,
    steps: values.steps === undefined ? 200 : positiveInt(values.steps, "steps"),
    warmup: values.warmup === undefined ? 20 : positiveInt(values.warmup, "warmup"),
    json: values.json === true,
    engineThread: values["no-engine-thread"] !== true,
    loadFormat,
    compare,
  };
}

const round = (x: number): number => Math.round(x * 1000) / 1000;

function overheadJson(results: BatchResult[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const r of results) {
    const phases: Record<string, { p50: number; p99: number }> = {};
    for (const [p, v] of Object.entries(r.phases)) phases[p] = { p50: round(v.p50), p99: round(v.p99) };
    out[String(r.batch_size)] = {
      engine_core_ms_p50: round(r.engine_core_ms_p50),
      engine_core_ms_p99: round(r.engine_core_ms_p99),
      step_ms_p50: round(r.step_ms_p50),
      step_ms_p99: round(r.step_ms_p99),
      tokens_per_s: Math.round(r.tokens_per_s),
      delivered_tokens_per_s: Math.round(r.delivered_tokens_per_s),
      worker_ms_p50: round(r.worker_ms_p50),
      main_thread_busy: round(r.main_thread_busy),
      engine_thread: r.engine_thread,
      steps: r.steps,
      max_in_flight: r.max_in_flight,
      server_cpu_cores: round(r.server_cpu_cores),
      worker_cpu_cores: round(r.worker_cpu_cores),
      clients_cpu_cores: round(r.clients_cpu_cores),
      delivered_tokens_per_server_core: Math.round(r.delivered_tokens_per_server_core),
      phases,
    };
  }
  return out;
}

function overheadTable(results: BatchResult[]): string {
  const threaded = results[0]?.engine_thread ?? true;
  const phases = threaded ? THREAD_PHASES : MAIN_PHASES;
  const cols = ["B", ...phases.map((p) => `${p} p50/p99`), "engine_core p50/p99", "main busy", "tok/s generated", "tok/s received", "server cores", "tok/s received per server core"];
  const rows = results.map((r) => [
    String(r.batch_size),
    ...phases.map((p) => `${r.phases[p]?.p50.toFixed(3)}/${r.phases[p]?.p99.toFixed(3)}`),
    `${r.engine_core_ms_p50.toFixed(3)}/${r.engine_core_ms_p99.toFixed(3)}`,
    `${Math.round(r.main_thread_busy * 100)}%`,
    String(Math.round(r.tokens_per_s)),
    String(Math.round(r.delivered_tokens_per_s)),
    r.server_cpu_cores.toFixed(2),
    String(Math.round(r.delivered_tokens_per_server_core)),
  ]);
  const lines = [`| ${cols.join(" | ")} |`, `|${cols.map(() => " --- ").join("|")}|`, ...rows.map((r) => `| ${r.join(" | ")} |`)];
  const where = threaded ? "engine core in its own thread" : "engine core on the main thread";
  return `per-step times in ms (p50/p99), ${where}\n${lines.join("\n")}\n`;
}

function compareText(results: CompareResult[]): string {
  const lines = results.map(
    (r) =>
      `B=${r.batch_size}: ${r.what} off ${Math.round(r.off_tokens_per_s)} tok/s received (step p50 ${r.off_step_ms_p50.toFixed(3)} ms), ` +
      `on ${Math.round(r.on_tokens_per_s)} tok/s received (step p50 ${r.on_step_ms_p50.toFixed(3)} ms), ratio on/off ${r.ratio.toFixed(3)}`,
  );
  return `${lines.join("\n")}\n`;
}

export async function runBench(args: BenchArgs, repoRoot: string): Promise<number> {
  switch (args.kind) {
    case "list":
      process.stdout.write(BENCH_HELP);
      return 0;
    case "serve":
      return runServeCommand(args);
    case "compare":
      return runCompareCommand(args, repoRoot);
    case "overhead":
      return runOverheadCommand(args, repoRoot);
    case "masks": {
      const modelDir = args.modelDir ?? join(repoRoot, "models", "demo");
      const results = await runMaskCost({ modelDir, rows: args.rows, steps: args.steps, device: args.device, regex: args.regex });
      process.stdout.write(maskCostTable(results, readModelDir(modelDir).vocabSize));
      return 0;
    }
    case "soak":
      return runSoakCommand(args, repoRoot);
    case "router": {
      const { kind: _kind, help: _help, json, ...options } = args;
      const result = await runRouterBench({ ...options, repoRoot }, (line) => void process.stderr.write(`bench: ${line}\n`));
      process.stdout.write(json ? `${JSON.stringify(result)}\n` : routerBenchReport(result));
      return result.results.some((r) => r.failed > 0) ? 1 : 0;
    }
  }
}

async function runSoakCommand(args: SoakArgs, repoRoot: string): Promise<number> {
  const modelDir = args.modelDir ?? join(repoRoot, "models", "demo");
  if (!existsSync(join(modelDir, "config.json"))) {
    process.stderr.write(`baton: ${join(modelDir, "config.json")} is missing (run npm run setup for the demo model)\n`);
    return 1;
  }
  const result = await runSoak({
    repoRoot,
    modelDir,
    minutes: args.minutes,
    concurrency: args.concurrency,
    faultIntervalS: args.faultIntervalS,
    stepTimeoutS: args.stepTimeoutS,
    seed: args.seed,
    log: (line) => void process.stderr.write(`soak: ${line}\n`),
  });
  process.stdout.write(args.json ? `${JSON.stringify(result)}\n` : soakReport(result));
  return result.problems.length === 0 ? 0 : 1;
}

async function runOverheadCommand(args: OverheadArgs, repoRoot: string): Promise<number> {
  const modelDir = args.modelDir ?? join(repoRoot, "models", "demo");
  if (!existsSync(join(modelDir, "tokenizer.json"))) {
    process.stderr.write(`baton: ${join(modelDir, "tokenizer.json")} is missing (run npm run setup for the demo model)\n`);
    return 1;
  }
  const log = (line: string): void => void process.stderr.write(`bench: ${line}\n`);
  const options = { modelDir, batchSizes: args.batchSizes, steps: args.steps, warmupSteps: args.warmup, engineThread: args.engineThread, loadFormat: args.loadFormat, log };
  if (args.compare !== null) {
    const results = await runCompare(args.compare, options);
    if (args.json) process.stdout.write(`${JSON.stringify(Object.fromEntries(results.map((r) => [String(r.batch_size), r])))}\n`);
    else process.stdout.write(compareText(results));
    return 0;
  }
  // Overlap off: with one step in flight the phases add up to the step (see src/bench/overhead.ts).
  const results = await runOverhead({ ...options, asyncScheduling: false });
  if (args.json) process.stdout.write(`${JSON.stringify(overheadJson(results))}\n`);
  else process.stdout.write(overheadTable(results));
  return 0;
}
