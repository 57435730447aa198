// `baton bench serve`: one workload against one OpenAI-compatible server.
// Builds the prompts, checks the server with one test request (not measured,
// its own distinct prompt), runs the workload, and returns vLLM's metrics.

import { existsSync } from "node:fs";
import { basename, join } from "node:path";
import { buildDataset, loadBenchTokenizer, needsTokenizer, type BenchTokenizer, type DatasetName } from "./dataset.js";
import { computeMetrics, type BenchMetrics } from "./metrics.js";
import { describeNetworkError, StreamClient, type Endpoint } from "./openai-stream.js";
import { buildRequest, runWorkload, withTrailingSlash, type RequestExtras, type RequestSettings } from "./request-driver.js";
import { ProgressBar } from "../observability/progress.js";
import type { RunInfo } from "./report.js";

/** A failure of the benchmark itself (unreachable server, failed test request): one line, exit 1. */
export class BenchError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BenchError";
  }
}

export interface ServeBenchOptions {
  baseUrl: URL;
  endpoint: Endpoint;
  /** null: the first model of GET /v1/models. */
  model: string | null;
  /** A model directory for exact-length prompts (and token counts); null: the served model's directory (GET /v1/models' root) when it is here, else none. */
  tokenizer: string | null;
  datasetName: DatasetName;
  datasetPath: string | null;
  numPrompts: number;
  randomInputLen: number;
  randomOutputLen: number;
  randomRangeRatio: number;
  /** sharegpt/custom output length (sharegpt default: the reply's length; custom: 256). */
  fixedOutputLen: number | null;
  maxConcurrency: number | null;
  requestRate: number;
  burstiness: number;
  seed: number;
  temperature: number;
  /** Ask for ignore_eos (dropped if the server rejects the field). */
  ignoreEos: boolean;
  /** Fields added to every request body (--extra-body). */
  extraBody?: Record<string, unknown>;
  apiKey: string | null;
  percentiles: number[];
  /** Draw a progress bar on stderr. */
  progress: boolean;
  label: string | null;
}

export interface ServeBenchRun {
  info: RunInfo;
  metrics: BenchMetrics;
  extras: RequestExtras;
}

/** Tokenizers are slow to load (150k-entry vocabularies): keep one per directory. */
const tokenizers = new Map<string, BenchTokenizer>();

function tokenizerFor(dir: string): BenchTokenizer {
  let found = tokenizers.get(dir);
  if (found === undefined) {
    try {
      found = loadBenchTokenizer(dir);
    } catch (error) {
      throw new BenchError(`cannot load the tokenizer of ${dir}: ${(error as Error).message}`);
    }
    tokenizers.set(dir, found);
  }
  return found;
}

export async function runServeBench(options: ServeBenchOptions, log: (line: string) => void): Promise<ServeBenchRun> {
  const headers: Record<string, string> = options.apiKey === null ? {} : { authorization: `Bearer ${options.apiKey}` };
  const models = options.model === null ? await servedModels(options.baseUrl, headers, "; pass --model NAME") : null;
  const model = options.model ?? firstModel(options.baseUrl, models ?? []);
  const found = options.tokenizer !== null ? { dir: options.tokenizer } : await servedModelTokenizer(options, headers, model, models);
  if (found.dir !== null && options.tokenizer === null) log(`tokenizer: ${found.dir} (the served model's directory, from GET /v1/models)`);
  const tokenizer = found.dir === null ? null : tokenizerFor(found.dir);
  // One prompt more than measured: the test request gets its own, so it warms no prefix cache for the run.
  const prompts = await buildDataset({
    name: options.datasetName,
    count: options.numPrompts + 1,
    seed: options.seed,
    tokenizer,
    tokenizerTried: found.tried,
    randomInputLen: options.randomInputLen,
    randomOutputLen: options.randomOutputLen,
    randomRangeRatio: options.randomRangeRatio,
    datasetPath: options.datasetPath,
    fixedOutputLen: options.fixedOutputLen,
  }).catch((error: unknown) => {
    throw new BenchError((error as Error).message);
  });
  const testPrompt = prompts.pop();
  if (testPrompt === undefined) throw new BenchError("the dataset is empty");
  const client = new StreamClient(options.baseUrl, options.maxConcurrency ?? options.numPrompts);
  try {
    const base: Omit<RequestSettings, "extras"> = {
      baseUrl: options.baseUrl,
      endpoint: options.endpoint,
      model,
      temperature: options.temperature,
      headers,
      extraBody: options.extraBody ?? {},
    };
    const extras = await probeServer(client, base, { ...testPrompt, outputTokens: Math.min(testPrompt.outputTokens, 16) }, options.ignoreEos, log);
    const bar = options.progress ? new ProgressBar("requests", process.stderr) : null;
    const run = await runWorkload(client, { ...base, extras }, prompts, options, bar?.update);
    bar?.finish();
    const metrics = computeMetrics(run.outcomes, prompts, run.startMs, run.endMs, options.percentiles);
    const firstError = run.outcomes.find((o) => !o.success)?.error;
    if (firstError !== undefined) log(`${metrics.failed} of ${prompts.length} requests failed; the first: ${firstError}`);
    const info: RunInfo = {
      baseUrl: options.baseUrl.href,
      endpoint: options.endpoint,
      model,
      tokenizer: found.dir,
      datasetName: options.datasetName,
      numPrompts: options.numPrompts,
      requestRate: options.requestRate,
      burstiness: options.burstiness,
      maxConcurrency: options.maxConcurrency,
      temperature: options.temperature,
      seed: options.seed,
      randomInputLen: options.datasetName === "random" ? options.randomInputLen : null,
      randomOutputLen: options.datasetName === "random" ? options.randomOutputLen : null,
      label: options.label,
    };
    return { info, metrics, extras };
  } finally {
    client.close();
  }
}

/** A GET /v1/models card: vLLM's and Baton's carry `root` (the weights' directory) and `parent` (an adapter's base model). */
interface ServedModel {
  id: string;
  root: string | null;
  parent: string | null;
}

function modelsUrl(baseUrl: URL): URL {
  return new URL("v1/models", withTrailingSlash(baseUrl));
}

/** GET /v1/models; a BenchError (`hint` appended to a bad status) when it cannot be read. */
async function servedModels(baseUrl: URL, headers: Record<string, string>, hint: string): Promise<ServedModel[]> {
  const url = modelsUrl(baseUrl);
  let response: Response;
  try {
    response = await fetch(url, { headers, signal: AbortSignal.timeout(10_000) });
  } catch (error) {
    const cause = (error as { cause?: Error }).cause;
    throw new BenchError(`cannot reach ${baseUrl.href}: ${cause ? describeNetworkError(cause) : (error as Error).message}`);
  }
  const text = await response.text();
  if (response.status !== 200) throw new BenchError(`GET ${url.href} answered HTTP ${response.status}${hint}`);
  let data: unknown;
  try {
    data = (JSON.parse(text) as { data?: unknown }).data;
  } catch {
    data = undefined;
  }
  if (!Array.isArray(data)) return [];
  const nonEmpty = (value: unknown): string | null => (typeof value === "string" && value !== "" ? value : null);
  return data.flatMap((card: unknown) => {
    if (typeof card !== "object" || card === null) return [];
    const { id, root, parent } = card as Record<string, unknown>;
    return typeof id === "string" ? [{ id, root: nonEmpty(root), parent: nonEmpty(parent) }] : [];
  });
}

/** The first served model's id (vLLM's default when --model is not given). */
function firstModel(baseUrl: URL, models: readonly ServedModel[]): string {
  const first = models[0];
  if (first === undefined) throw new BenchError(`GET ${modelsUrl(baseUrl).href} lists no model; pass --model NAME`);
  return first.id;
}

/**
 * Without --tokenizer, vLLM's bench uses the model's own tokenizer. Here: the
 * served model's directory as GET /v1/models gives it (`root`; for an adapter,
 * its base model's too), when that directory is on this machine with a
 * tokenizer.json. Only for datasets that need a tokenizer; `tried` says what
 * was looked at when nothing was found.
 */
async function servedModelTokenizer(
  options: ServeBenchOptions,
  headers: Record<string, string>,
  model: string,
  listed: ServedModel[] | null,
): Promise<{ dir: string | null; tried?: string }> {
  if (!needsTokenizer(options.datasetName)) return { dir: null };
  const url = modelsUrl(options.baseUrl).href;
  const tried = (detail: string): { dir: null; tried: string } => ({ dir: null, tried: `tried the served model's directory (its root in GET ${url}): ${detail}` });
  let models = listed;
  if (models === null) {
    try {
      models = await servedModels(options.baseUrl, headers, "");
    } catch (error) {
      return tried((error as Error).message);
    }
  }
  const card = models.find((m) => m.id === model);
  if (card === undefined) return tried(`${model} is not listed`);
  const base = card.parent === null ? undefined : models.find((m) => m.id === card.parent);
  const roots = [card.root, base?.root ?? null].filter((root): root is string => root !== null);
  if (roots.length === 0) return tried(`${model} has no root`);
  const dir = roots.find((root) => existsSync(join(root, "tokenizer.json")));
  if (dir !== undefined) return { dir };
  return tried(`no ${roots.map((root) => join(root, "tokenizer.json")).join(" nor ")} on this machine`);
}

/**
 * Sends the test request, first with every optional field; servers that refuse
 * unknown fields (HTTP 400/422) are retried without return_token_ids, then
 * without ignore_eos too. Returns the fields the server took.
 */
async function probeServer(
  client: StreamClient,
  base: Omit<RequestSettings, "extras">,
  prompt: { prompt: string; promptTokens: number | null; outputTokens: number },
  ignoreEos: boolean,
  log: (line: string) => void,
): Promise<RequestExtras> {
  const attempts: RequestExtras[] = [
    { ignoreEos, returnTokenIds: true },
    { ignoreEos, returnTokenIds: false },
    ...(ignoreEos ? [{ ignoreEos: false, returnTokenIds: false }] : []),
  ];
  let lastError = "";
  for (const extras of attempts) {
    const outcome = await client.send(buildRequest({ ...base, extras }, prompt));
    if (outcome.success) {
      if (ignoreEos && !extras.ignoreEos) log(`the server refused ignore_eos (${lastError}); outputs may end before max_tokens at EOS`);
      return extras;
    }
    if (outcome.status === 0) throw new BenchError(`cannot reach ${base.baseUrl.href}: ${outcome.error}`);
    lastError = outcome.error;
    if (outcome.status !== 400 && outcome.status !== 422) break;
  }
  throw new BenchError(`the test request to ${new URL(base.endpoint.slice(1), withTrailingSlash(base.baseUrl)).href} failed: ${lastError}`);
}

export function plotTitle(info: RunInfo): string {
  const concurrency = info.maxConcurrency === null ? "" : `, concurrency ${info.maxConcurrency}`;
  const rate = Number.isFinite(info.requestRate) ? `, ${info.requestRate} req/s` : "";
  return `${basename(info.model)} at ${info.baseUrl}: ${info.numPrompts} requests${concurrency}${rate}, temperature ${info.temperature}`;
}
