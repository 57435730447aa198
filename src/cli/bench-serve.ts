// `baton bench serve` and `baton bench compare`: flags (vLLM's `vllm bench
// serve` names, underscores accepted too) and the commands that run them.
// Usage mistakes throw UsageError (one line, exit 2); benchmark failures print
// one line and exit 1.

import { existsSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { DATASET_NAMES, type DatasetName } from "../bench/dataset.js";
import { ENDPOINTS, type Endpoint } from "../bench/openai-stream.js";
import { writePlot, PlotError } from "../bench/plot.js";
import { defaultResultFilename, dateStamp, resultJson, resultTable } from "../bench/report.js";
import { BenchError, plotTitle, runServeBench, type ServeBenchOptions } from "../bench/serve-bench.js";
import { runCompare, transformersPeer, type PeerSpec } from "../bench/compare.js";
import { UsageError } from "./args.js";

const WORKLOAD_HELP = `Workload (vLLM's flag names):
  --endpoint PATH          /v1/completions (default) or /v1/chat/completions
  --dataset-name NAME      random (default), sharegpt or custom
  --dataset-path FILE      sharegpt: a ShareGPT JSON file; custom: JSONL of {"prompt": ...}
  --num-prompts N          requests to send (default 1000)
  --random-input-len N     random: prompt tokens, exact (default 1024)
  --random-output-len N    random: max_tokens (default 128)
  --random-range-ratio R   random: lengths uniform in [len(1-R), len(1+R)] (default 0)
  --sharegpt-output-len N  sharegpt: max_tokens instead of the reply's length
  --custom-output-len N    custom: max_tokens (default 256)
  --max-concurrency N      most requests in flight (default: no limit)
  --request-rate R         requests/s, arrivals by a gamma process; inf (default) sends all at once
  --burstiness K           gamma shape: 1 (default) is Poisson, < 1 burstier, > 1 steadier
  --seed N                 prompts and arrival times (default 0)
  --no-ignore-eos          do not send ignore_eos (sent by default, so outputs are exactly
                           max_tokens long; dropped when the server refuses the field)
  --extra-body JSON        fields added to every request body, e.g. '{"structured_outputs":
                           {"regex": "[a-z ]+"}}' (with --no-ignore-eos: a grammar refuses ignore_eos)
  --metric-percentiles L   comma-separated percentiles to report (default 99)
  --disable-tqdm           no progress bar (there is none when stderr is not a terminal)
`;

export const SERVE_BENCH_HELP = `Usage: baton bench serve [options]

Streams requests to an OpenAI-compatible server (Baton, vLLM, SGLang,
transformers serve, ...) and prints vLLM's serving metrics: TTFT, TPOT, ITL
and end-to-end latency (mean, median, std, percentiles) and throughputs. One
test request (its own prompt, not measured) goes first.

Server:
  --base-url URL           the server (default http://127.0.0.1:8000)
  --host HOST, --port N    the same as --base-url http://HOST:N
  --model NAME             the model to request (default: the first of GET /v1/models)
  --tokenizer DIR          the model directory whose tokenizer makes prompts of exact
                           token lengths (needed by random and sharegpt; default: --model
                           when it is a directory, else the served model's directory from
                           GET /v1/models (its root) when it is on this machine)
  --api-key KEY            sent as a bearer token (default: $OPENAI_API_KEY)
  --temperature T          sampling temperature (default 0)

${WORKLOAD_HELP}
Output:
  --save-result            write the result JSON (vLLM's keys)
  --result-dir DIR         where (default: the current directory)
  --result-filename NAME   its name (default baton-<rate>qps-concurrency<N>-<model>-<date>.json)
  --plot-out FILE.png      a PNG of latency percentiles and throughput over time
  --label NAME             a name for the server in the JSON
  -h, --help               show this help
`;

export const COMPARE_HELP = `Usage: baton bench compare <model-dir> (--peer transformers | --peer-command CMD) [options]

Starts Baton on model-dir, runs the workload at each temperature, stops it,
then does the same with the peer server, and prints output tok/s, TTFT
p50/p99, ITL p50 and E2EL p50 of both with Baton's value over the peer's.
Run i at both servers uses seed + i: the same prompts for both servers, and
no prompt repeats across runs (random prompts are distinct).

Servers:
  --serve-args "FLAGS"     extra 'baton serve' flags, e.g. "--max-num-seqs 64"
  --peer transformers      transformers serve <model-dir> --device cpu --dtype float32
                           --continuous-batching --no-cb-use-cuda-graph (offline); installs
                           python/requirements-bench.txt into the worker's Python if needed
  --peer-command CMD       any server: a shell command with {model}, {port}, {host} and
                           {python} placeholders
  --peer-name NAME         its name in the table (default peer)
  --peer-model NAME        the model name requests to it carry (default: {model}, the path)
  --temperatures LIST      comma-separated (default 0,1)
  --rounds N               turns each server takes, in ABBA order (Baton first in
                           odd rounds, the peer in even ones); the table gives medians
                           and each round's ratio (default 1)
  --start-timeout S        seconds to wait for each server (default 600)

${WORKLOAD_HELP}
Output:
  --save-result            write {runs: [vLLM result per server and temperature], table}
  --result-dir DIR, --result-filename NAME   where (default baton-compare-<peer>-<date>.json)
  -h, --help               show this help
`;

const WORKLOAD_FLAGS = {
  endpoint: { type: "string" },
  "dataset-name": { type: "string" },
  "dataset-path": { type: "string" },
  "num-prompts": { type: "string" },
  "random-input-len": { type: "string" },
  "random-output-len": { type: "string" },
  "random-range-ratio": { type: "string" },
  "sharegpt-output-len": { type: "string" },
  "custom-output-len": { type: "string" },
  "max-concurrency": { type: "string" },
  "request-rate": { type: "string" },
  burstiness: { type: "string" },
  seed: { type: "string" },
  "no-ignore-eos": { type: "boolean" },
  "extra-body": { type: "string" },
  "ignore-eos": { type: "boolean" },
  "metric-percentiles": { type: "string" },
  "disable-tqdm": { type: "boolean" },
  "save-result": { type: "boolean" },
  "result-dir": { type: "string" },
  "result-filename": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

const SERVE_FLAGS = {
  ...WORKLOAD_FLAGS,
  "base-url": { type: "string" },
  host: { type: "string" },
  port: { type: "string" },
  model: { type: "string" },
  tokenizer: { type: "string" },
  "api-key": { type: "string" },
  temperature: { type: "string" },
  "plot-out": { type: "string" },
  label: { type: "string" },
} as const;

const COMPARE_FLAGS = {
  ...WORKLOAD_FLAGS,
  "serve-args": { type: "string" },
  peer: { type: "string" },
  "peer-command": { type: "string" },
  "peer-name": { type: "string" },
  "peer-model": { type: "string" },
  temperatures: { type: "string" },
  rounds: { type: "string" },
  "start-timeout": { type: "string" },
} as const;

interface OutputArgs {
  saveResult: boolean;
  resultDir: string | null;
  resultFilename: string | null;
}

export interface ServeBenchArgs extends OutputArgs {
  kind: "serve";
  help: boolean;
  options: ServeBenchOptions;
  plotOut: string | null;
}

export interface CompareArgs extends OutputArgs {
  kind: "compare";
  help: boolean;
  modelDir: string;
  batonArgs: string[];
  peer: PeerSpec | "transformers";
  temperatures: number[];
  rounds: number;
  startTimeoutS: number;
  workload: ServeBenchOptions;
}

/** vLLM spells flags with dashes or underscores. */
function normalizeFlagNames(args: readonly string[]): string[] {
  return args.map((arg) => {
    if (!arg.startsWith("--")) return arg;
    const eq = arg.indexOf("=");
    const name = eq < 0 ? arg : arg.slice(0, eq);
    return name.replaceAll("_", "-") + (eq < 0 ? "" : arg.slice(eq));
  });
}

function parseFlags<T extends Record<string, { type: "string" | "boolean"; short?: string }>>(args: readonly string[], options: T) {
  try {
    return parseArgs({ args: normalizeFlagNames(args), options, allowPositionals: true, strict: true });
  } catch (error) {
    const { code, message } = error as { code?: string; message: string };
    if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") throw new UsageError(`unknown option ${/'[^']*'/.exec(message)?.[0] ?? message}`);
    throw new UsageError(message.split("\n")[0] ?? message);
  }
}

function int(value: string | undefined, flag: string, min: number, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (value.trim() === "" || !Number.isSafeInteger(n) || n < min) throw new UsageError(`invalid value '${value}' for --${flag}: expected an integer >= ${min}`);
  return n;
}

function float(value: string | undefined, flag: string, check: (n: number) => boolean, expected: string, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || !check(n)) throw new UsageError(`invalid value '${value}' for --${flag}: expected ${expected}`);
  return n;
}

function list(value: string, flag: string, check: (n: number) => boolean, expected: string): number[] {
  const items = value.split(",").map((s) => s.trim());
  if (items.some((s) => s === "")) throw new UsageError(`invalid value '${value}' for --${flag}: expected ${expected}`);
  return items.map((s) => float(s, flag, check, expected, 0));
}

type WorkloadValues = { [K in keyof typeof WORKLOAD_FLAGS]?: (typeof WORKLOAD_FLAGS)[K]["type"] extends "boolean" ? boolean : string };

/** The workload flags shared by serve and compare (server, model and temperature filled in by the caller). */
function parseWorkload(values: WorkloadValues): Omit<ServeBenchOptions, "baseUrl" | "model" | "tokenizer" | "temperature" | "apiKey" | "label"> {
  const endpoint = values.endpoint ?? "/v1/completions";
  if (!(ENDPOINTS as readonly string[]).includes(endpoint)) throw new UsageError(`invalid value '${endpoint}' for --endpoint (choose from ${ENDPOINTS.join(", ")})`);
  const datasetName = values["dataset-name"] ?? "random";
  if (!(DATASET_NAMES as readonly string[]).includes(datasetName)) {
    throw new UsageError(`invalid value '${datasetName}' for --dataset-name (choose from ${DATASET_NAMES.join(", ")})`);
  }
  if (datasetName !== "random" && values["dataset-path"] === undefined) throw new UsageError(`--dataset-name ${datasetName} needs --dataset-path`);
  const rateText = values["request-rate"] ?? "inf";
  const requestRate = rateText === "inf" ? Number.POSITIVE_INFINITY : float(rateText, "request-rate", (n) => n > 0, "a positive number or inf", 0);
  if (values["ignore-eos"] === true && values["no-ignore-eos"] === true) throw new UsageError("--ignore-eos and --no-ignore-eos contradict each other");
  const maxConcurrency = values["max-concurrency"] === undefined ? null : int(values["max-concurrency"], "max-concurrency", 1, 1);
  const sharegptLen = values["sharegpt-output-len"];
  const customLen = values["custom-output-len"];
  return {
    endpoint: endpoint as Endpoint,
    datasetName: datasetName as DatasetName,
    datasetPath: values["dataset-path"] ?? null,
    numPrompts: int(values["num-prompts"], "num-prompts", 1, 1000),
    randomInputLen: int(values["random-input-len"], "random-input-len", 1, 1024),
    randomOutputLen: int(values["random-output-len"], "random-output-len", 1, 128),
    randomRangeRatio: float(values["random-range-ratio"], "random-range-ratio", (n) => n >= 0 && n < 1, "a number in [0, 1)", 0),
    fixedOutputLen:
      datasetName === "sharegpt" && sharegptLen !== undefined
        ? int(sharegptLen, "sharegpt-output-len", 1, 1)
        : datasetName === "custom" && customLen !== undefined
          ? int(customLen, "custom-output-len", 1, 1)
          : null,
    maxConcurrency,
    requestRate,
    burstiness: float(values.burstiness, "burstiness", (n) => n > 0, "a positive number", 1),
    seed: int(values.seed, "seed", 0, 0),
    ignoreEos: values["no-ignore-eos"] !== true,
    extraBody: extraBody(values["extra-body"]),
    percentiles: values["metric-percentiles"] === undefined ? [99] : list(values["metric-percentiles"], "metric-percentiles", (n) => n > 0 && n < 100, "percentiles between 0 and 100"),
    progress: values["disable-tqdm"] !== true && process.stderr.isTTY === true,
  };
}

/** --extra-body: a JSON object merged into every request. */
function extraBody(text: string | undefined): Record<string, unknown> {
  if (text === undefined) return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new UsageError(`invalid value for --extra-body: ${(error as Error).message}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new UsageError("--extra-body must be a JSON object");
  return value as Record<string, unknown>;
}

function outputArgs(values: WorkloadValues): OutputArgs {
  return { saveResult: values["save-result"] === true, resultDir: values["result-dir"] ?? null, resultFilename: values["result-filename"] ?? null };
}

function baseUrlOf(values: { "base-url"?: string; host?: string; port?: string }): URL {
  const given = values["base-url"];
  if (given !== undefined) {
    if (values.host !== undefined || values.port !== undefined) throw new UsageError("give --base-url or --host/--port, not both");
    let url: URL;
    try {
      url = new URL(given);
    } catch {
      throw new UsageError(`invalid value '${given}' for --base-url: expected a URL like http://127.0.0.1:8000`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new UsageError(`invalid value '${given}' for --base-url: expected an http or https URL`);
    return url;
  }
  const port = int(values.port, "port", 1, 8000);
  if (port > 65535) throw new UsageError(`invalid value '${values.port}' for --port: must be at most 65535`);
  const host = values.host ?? "127.0.0.1";
  return new URL(`http://${host.includes(":") ? `[${host}]` : host}:${port}`);
}

export function parseServeBenchArgs(args: readonly string[]): ServeBenchArgs {
  const { values, positionals } = parseFlags(args, SERVE_FLAGS);
  if (positionals.length > 0) throw new UsageError(`unexpected argument '${positionals[0]}' (bench serve takes flags only)`);
  const workload = parseWorkload(values);
  const model = values.model ?? null;
  const tokenizer = values.tokenizer ?? null;
  return {
    kind: "serve",
    help: values.help === true,
    options: {
      ...workload,
      baseUrl: baseUrlOf(values),
      model,
      tokenizer,
      temperature: float(values.temperature, "temperature", (n) => n >= 0, "a number >= 0", 0),
      apiKey: values["api-key"] ?? process.env.OPENAI_API_KEY ?? null,
      label: values.label ?? null,
    },
    plotOut: values["plot-out"] ?? null,
    ...outputArgs(values),
  };
}

export function parseCompareArgs(args: readonly string[]): CompareArgs {
  const { values, positionals } = parseFlags(args, COMPARE_FLAGS);
  const help = values.help === true;
  if (positionals.length > 1) throw new UsageError(`expected one model directory, got ${positionals.join(" ")}`);
  const modelDir = positionals[0];
  if (modelDir === undefined && !help) throw new UsageError("bench compare needs a model directory");
  const peerName = values.peer;
  const peerCommand = values["peer-command"];
  if (!help && (peerName === undefined) === (peerCommand === undefined)) throw new UsageError("give one of --peer transformers or --peer-command CMD");
  if (peerName !== undefined && peerName !== "transformers") throw new UsageError(`invalid value '${peerName}' for --peer (available: transformers; or use --peer-command)`);
  const peer: PeerSpec | "transformers" =
    peerCommand !== undefined
      ? { name: values["peer-name"] ?? "peer", command: peerCommand, model: values["peer-model"] ?? "{model}", env: {}, requirements: null }
      : "transformers";
  const workload = parseWorkload(values);
  // The ratio table quotes TTFT p99.
  if (!workload.percentiles.includes(99)) workload.percentiles.push(99);
  return {
    kind: "compare",
    help,
    modelDir: modelDir ?? "",
    batonArgs: (values["serve-args"] ?? "").split(/\s+/).filter((s) => s !== ""),
    peer,
    temperatures: list(values.temperatures ?? "0,1", "temperatures", (n) => n >= 0, "temperatures >= 0"),
    rounds: int(values.rounds, "rounds", 1, 1),
    startTimeoutS: float(values["start-timeout"], "start-timeout", (n) => n > 0, "seconds > 0", 600),
    workload: { ...workload, baseUrl: new URL("http://127.0.0.1/"), model: null, tokenizer: null, temperature: 0, apiKey: null, label: null },
    ...outputArgs(values),
  };
}

function log(line: string): void {
  process.stderr.write(`bench: ${line}\n`);
}

function fail(error: unknown): number {
  if (error instanceof BenchError || error instanceof PlotError) {
    process.stderr.write(`baton: ${error.message}\n`);
    return 1;
  }
  throw error;
}

function save(output: OutputArgs, defaultName: string, body: unknown): void {
  // resolve, not join: an absolute --result-filename stands on its own.
  const path = resolve(output.resultDir ?? ".", output.resultFilename ?? defaultName);
  try {
    writeFileSync(path, `${JSON.stringify(body, null, 2)}\n`);
  } catch (error) {
    throw new BenchError(`cannot write ${path}: ${(error as Error).message}`);
  }
  log(`saved ${path}`);
}

export async function runServeCommand(args: ServeBenchArgs): Promise<number> {
  try {
    const options = { ...args.options };
    // vLLM's --tokenizer defaults to --model; here that works when the model name is a directory
    // (otherwise runServeBench asks the server for the model's directory).
    if (options.tokenizer === null && options.model !== null && existsSync(join(options.model, "tokenizer.json"))) options.tokenizer = options.model;
    const run = await runServeBench(options, log);
    process.stdout.write(resultTable(run.info, run.metrics));
    const date = dateStamp();
    if (args.saveResult) save(args, defaultResultFilename(run.info, date), resultJson(run.info, run.metrics, date));
    if (args.plotOut !== null) {
      await writePlot(args.plotOut, plotTitle(run.info), run.metrics);
      log(`plotted ${args.plotOut}`);
    }
    return run.metrics.completed === 0 ? 1 : 0;
  } catch (error) {
    return fail(error);
  }
}

export async function runCompareCommand(args: CompareArgs, repoRoot: string): Promise<number> {
  try {
    const peer = args.peer === "transformers" ? transformersPeer(repoRoot) : args.peer;
    const result = await runCompare(
      {
        modelDir: args.modelDir,
        batonArgs: args.batonArgs,
        peer,
        temperatures: args.temperatures,
        rounds: args.rounds,
        workload: args.workload,
        startTimeoutMs: args.startTimeoutS * 1000,
        repoRoot,
      },
      log,
    );
    process.stdout.write(result.table);
    if (args.saveResult) save(args, `baton-compare-${peer.name}-${dateStamp()}.json`, { table: result.table, rows: result.rows, runs: result.runs });
    return 0;
  } catch (error) {
    return fail(error);
  }
}
