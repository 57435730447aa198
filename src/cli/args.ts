// `baton serve` flags, named as in vLLM. Parsed with node:util parseArgs in
// strict mode: an unknown flag or a bad value is a usage error (exit 2).

import { resolve as resolvePath } from "node:path";
import { parseArgs } from "node:util";
import type { Device, DistributedExecutorBackend, Dtype, LoadFormat, Runner } from "../worker/types.js";
import { LOG_LEVELS, type LogLevel } from "../observability/logger.js";
import { REASONING_PARSERS, type ReasoningParserName } from "../reasoning/reasoning-parser.js";
import { TOOL_CALL_PARSERS, type ToolCallParserName } from "../tool-parsers/tool-parser.js";
import { CACHE_AWARE_DEFAULTS, ROUTER_POLICIES, type RouterOptions } from "../router/router.js";
import { DEFAULT_MAX_IMAGE_BYTES, type MediaOptions } from "../frontend/media.js";
import { RESPONSES_STORE_DEFAULTS, type ResponseStoreOptions } from "../frontend/responses/store.js";

type SchedulingPolicy = "fcfs" | "priority";
const SCHEDULING_POLICIES: readonly SchedulingPolicy[] = ["fcfs", "priority"];

/** A command-line mistake: printed with a hint and exit code 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

export interface ServeOptions {
  /** null: the bundled demo model. */
  modelDir: string | null;
  host: string;
  port: number;
  servedModelName: string | null;
  maxModelLen: number | undefined;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  blockSize: number;
  numGpuBlocksOverride: number | undefined;
  kvCacheMemoryBytes: number | undefined;
  dtype: Dtype;
  device: Device;
  seed: number;
  loadFormat: LoadFormat;
  /** Passed to the worker, which checks it (auto: cpu on CPU, triton on CUDA). */
  attentionBackend: string;
  enforceEager: boolean;
  /** --runner: generate, pooling (embedding models) or auto (pooling for a sentence-transformers directory or an encoder). */
  runner: Runner;
  /** --hf-overrides: config.json keys restated, vLLM's JSON (the worker checks them: a decoder served as Qwen3-Reranker); null: none. */
  hfOverrides: Record<string, unknown> | null;
  /** --model-loader-extra-config: the weight loader's own options (the worker checks them). */
  modelLoaderExtraConfig: Record<string, unknown> | null;
  enablePrefixCaching: boolean;
  /** Overlap scheduling: the engine builds step N+1 while the worker runs N (--no-async-scheduling turns it off). */
  asyncScheduling: boolean;
  /** The engine core in its own thread (--no-engine-thread: on the main event loop with the HTTP server). */
  engineThread: boolean;
  /** fcfs: arrival order (a request's non-zero priority is refused); priority: lower `priority` first. */
  schedulingPolicy: SchedulingPolicy;
  /** Bearer key for every route but /health (--api-key, else BATON_API_KEY); null: no auth. */
  apiKey: string | null;
  logLevel: LogLevel;
  /** New generation requests get 429 while this many wait. */
  maxNumQueuedRequests: number;
  /** Larger request bodies get 413. */
  maxRequestBodyBytes: number;
  /** --reasoning-parser: split chat output into reasoning_content and content; null: off. */
  reasoningParser: ReasoningParserName | null;
  /** --tool-call-parser: how tool_choice "auto" reads the model's calls; null: none. */
  toolCallParser: ToolCallParserName | null;
  /** --enable-auto-tool-choice: tool_choice "auto" (the default when tools are given) is served. */
  enableAutoToolChoice: boolean;
  /** --deployment FILE.yaml (M*'s format): which worker rank runs which graph nodes. */
  deployment: string | null;
  /** --shm-bytes N: each worker's shared-memory arena in a split deployment (default: a share of /dev/shm). */
  shmBytes: number | undefined;
  /** --tensor-parallel-size N: the model split over N worker ranks (torch.distributed). */
  tensorParallelSize: number;
  /** --distributed-executor-backend mp|ray: how ranks above 0 start (child processes, or Ray actors in a placement group). */
  distributedExecutorBackend: DistributedExecutorBackend;
  /** A worker that dies is restarted; this many restarts in a row, then the server gives up and exits 1. */
  maxWorkerRestarts: number;
  /** How often one request may be carried over to a restarted worker (0: requests on a dead worker end). */
  maxRequestMigrations: number;
  /** Seconds a worker may take on one step before it counts as hung; null: sized from observed step times. */
  stepTimeoutS: number | null;
  /** On SIGTERM/SIGINT, seconds in-flight requests get to finish before the rest are aborted. */
  shutdownTimeoutS: number;
  /** --data-parallel-size: engine cores (each with its own worker and KV cache) behind one frontend. */
  dataParallelSize: number;
  /** --router and its thresholds: which replica takes a request (with dataParallelSize > 1). */
  router: RouterOptions;
  /** What image_url parts may load and how many and how large (vLLM's media flags). */
  media: MediaOptions;
  /** How many bytes of stored responses (/v1/responses, store: true) are kept, and how long. */
  responsesStore: ResponseStoreOptions;
  /** --enable-lora and its flags; null: LoRA off. */
  lora: LoraOptions | null;
  /** --speculative-config; null: no speculative decoding. */
  speculative: SpeculativeConfig | null;
}

/** vLLM's --speculative-config, as served: n-gram prompt lookup or a draft model. */
interface SpeculativeConfig {
  method: "ngram" | "draft_model";
  /** Most drafts a row verifies per step. */
  numSpeculativeTokens: number;
  /** The n-gram lengths the proposer matches, longest first (ngram). */
  promptLookupMin: number;
  promptLookupMax: number;
  /** The draft model's directory, absolute (draft_model); null for ngram. */
  draftModel: string | null;
}

/** An adapter named on the command line (--lora-modules). */
interface LoraModule {
  name: string;
  path: string;
}

interface LoraOptions {
  modules: LoraModule[];
  /** Most distinct adapters in one step (vLLM's --max-loras, default 1). */
  maxLoras: number;
  /** Highest rank an adapter may have (default 16). */
  maxLoraRank: number;
  /** /v1/load_lora_adapter and /v1/unload_lora_adapter are served (--allow-runtime-lora-updating, or vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=true). */
  runtimeUpdates: boolean;
}

const SERVE_DEFAULTS = {
  host: "127.0.0.1",
  port: 8000,
  maxNumSeqs: 256,
  maxNumBatchedTokens: 2048,
  blockSize: 16,
  dtype: "auto",
  device: "auto",
  seed: 0,
  loadFormat: "auto",
  logLevel: "info",
  maxNumQueuedRequests: 4096,
  maxWorkerRestarts: 5,
  maxRequestMigrations: 1,
  shutdownTimeoutS: 20,
} as const;

const SERVE_FLAGS = {
  host: { type: "string" },
  deployment: { type: "string" },
  "shm-bytes": { type: "string" },
  "tensor-parallel-size": { type: "string" },
  "distributed-executor-backend": { type: "string" },
  port: { type: "string" },
  "served-model-name": { type: "string" },
  "max-model-len": { type: "string" },
  "max-num-seqs": { type: "string" },
  "max-num-batched-tokens": { type: "string" },
  "block-size": { type: "string" },
  "num-gpu-blocks-override": { type: "string" },
  "kv-cache-memory-bytes": { type: "string" },
  dtype: { type: "string" },
  device: { type: "string" },
  seed: { type: "string" },
  "load-format": { type: "string" },
  "model-loader-extra-config": { type: "string" },
  runner: { type: "string" },
  "hf-overrides": { type: "string" },
  "attention-backend": { type: "string" },
  "enforce-eager": { type: "boolean" },
  "enable-prefix-caching": { type: "boolean" },
  // parseArgs in Node 20 has no automatic --no-* negation.
  "no-enable-prefix-caching": { type: "boolean" },
  "async-scheduling": { type: "boolean" },
  "no-async-scheduling": { type: "boolean" },
  "engine-thread": { type: "boolean" },
  "no-engine-thread": { type: "boolean" },
  "scheduling-policy": { type: "string" },
  "api-key": { type: "string" },
  "log-level": { type: "string" },
  "max-num-queued-requests": { type: "string" },
  "max-request-body-bytes": { type: "string" },
  "reasoning-parser": { type: "string" },
  "tool-call-parser": { type: "string" },
  "enable-auto-tool-choice": { type: "boolean" },
  "max-worker-restarts": { type: "string" },
  "max-request-migrations": { type: "string" },
  "step-timeout": { type: "string" },
  "shutdown-timeout": { type: "string" },
  "data-parallel-size": { type: "string" },
  router: { type: "string" },
  "router-cache-threshold": { type: "string" },
  "router-balance-abs-threshold": { type: "string" },
  "router-balance-rel-threshold": { type: "string" },
  "allowed-media-domains": { type: "string", multiple: true },
  "allowed-local-media-path": { type: "string" },
  "limit-mm-per-prompt": { type: "string" },
  "max-image-bytes": { type: "string" },
  "responses-store-max-bytes": { type: "string" },
  "responses-store-ttl": { type: "string" },
  "enable-lora": { type: "boolean" },
  "lora-modules": { type: "string", multiple: true },
  "max-loras": { type: "string" },
  "max-lora-rank": { type: "string" },
  "allow-runtime-lora-updating": { type: "boolean" },
  "speculative-config": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

/** vLLM's dtype spellings mapped onto the worker's. */
const DTYPES: Record<string, Dtype> = {
  auto: "auto",
  float32: "float32",
  float: "float32",
  bfloat16: "bfloat16",
  float16: "float16",
  half: "float16",
};
const DEVICES: readonly Device[] = ["auto", "cpu", "cuda"];
const LOAD_FORMATS: readonly LoadFormat[] = ["auto", "dummy", "dummy-null"];
const RUNNERS: readonly Runner[] = ["auto", "generate", "pooling"];
const EXECUTOR_BACKENDS: readonly DistributedExecutorBackend[] = ["mp", "ray"];

/**
 * An integer, optionally with vLLM's human-readable suffixes: lower-case
 * k/m/g/t are powers of 1000, upper-case K/M/G/T powers of 1024 ("32k", "4G").
 */
export function parseHumanInt(text: string, flag: string): number {
  const match = /^(\d+(?:\.\d+)?)([kmgtKMGT]?)$/.exec(text.trim());
  if (!match) throw new UsageError(`invalid value '${text}' for --${flag}: expected an integer`);
  const [, digits = "", suffix = ""] = match;
  const power = suffix === "" ? 0 : "kmgt".indexOf(suffix.toLowerCase()) + 1;
  const base = suffix !== "" && suffix === suffix.toUpperCase() ? 1024 : 1000;
  const value = Number(digits) * base ** power;
  if (!Number.isSafeInteger(value)) throw new UsageError(`invalid value '${text}' for --${flag}: expected an integer`);
  return value;
}

function intFlag(value: string | undefined, flag: string, min: number, fallback: number): number;
function intFlag(value: string | undefined, flag: string, min: number, fallback: undefined): number | undefined;
function intFlag(value: string | undefined, flag: string, min: number, fallback: number | undefined): number | undefined {
  if (value === undefined) return fallback;
  const n = parseHumanInt(value, flag);
  if (n < min) throw new UsageError(`invalid value '${value}' for --${flag}: must be at least ${min}`);
  return n;
}

/** Seconds as a plain number (fractions allowed), at least `min`. */
function secondsFlag(value: string | undefined, flag: string, min: number): number | undefined {
  if (value === undefined) return undefined;
  const n = /^\d+(\.\d+)?$/.test(value.trim()) ? Number(value) : Number.NaN;
  if (!Number.isFinite(n)) throw new UsageError(`invalid value '${value}' for --${flag}: expected a number of seconds`);
  if (n < min) throw new UsageError(`invalid value '${value}' for --${flag}: must be at least ${min}`);
  return n;
}

/** A plain decimal number within [min, max]. */
function numberFlag(value: string | undefined, flag: string, min: number, max: number, fallback: number): number {
  if (value === undefined) return fallback;
  const n = /^\d+(\.\d+)?$/.test(value.trim()) ? Number(value) : Number.NaN;
  if (!Number.isFinite(n) || n < min || n > max) {
    throw new UsageError(`invalid value '${value}' for --${flag}: expected a number from ${min} to ${max === Number.POSITIVE_INFINITY ? "up" : max}`);
  }
  return n;
}

/** --data-parallel-size and the router flags, which mean nothing without it. */
function dataParallelFlags(values: Record<string, string | string[] | boolean | undefined>): { dataParallelSize: number; router: RouterOptions } {
  const text = (name: string): string | undefined => {
    const v = values[name];
    return typeof v === "string" ? v : undefined;
  };
  const size = intFlag(text("data-parallel-size"), "data-parallel-size", 1, 1);
  const routerFlags = ["router", "router-cache-threshold", "router-balance-abs-threshold", "router-balance-rel-threshold"].filter((f) => values[f] !== undefined);
  if (size === 1 && routerFlags.length > 0) {
    throw new UsageError(`--${routerFlags[0]} needs --data-parallel-size 2 or more (one engine has nothing to route between)`);
  }
  if (size > 1 && values.deployment !== undefined) {
    throw new UsageError("--data-parallel-size > 1 cannot be combined with --deployment (data parallel serves plain LLMs)");
  }
  const policy = choice(text("router"), "router", ROUTER_POLICIES, "cache-aware");
  if (policy === "round-robin") {
    const tuning = routerFlags.filter((f) => f !== "router");
    if (tuning.length > 0) throw new UsageError(`--${tuning[0]} tunes --router cache-aware; it means nothing with --router round-robin`);
  }
  return {
    dataParallelSize: size,
    router: {
      policy,
      cacheThreshold: numberFlag(text("router-cache-threshold"), "router-cache-threshold", 0, 1, CACHE_AWARE_DEFAULTS.cacheThreshold),
      balanceAbsThreshold: intFlag(text("router-balance-abs-threshold"), "router-balance-abs-threshold", 0, CACHE_AWARE_DEFAULTS.balanceAbsThreshold),
      balanceRelThreshold: numberFlag(text("router-balance-rel-threshold"), "router-balance-rel-threshold", 1, Number.POSITIVE_INFINITY, CACHE_AWARE_DEFAULTS.balanceRelThreshold),
    },
  };
}

function choice<T extends string>(value: string | undefined, flag: string, allowed: Record<string, T> | readonly T[], fallback: T): T {
  if (value === undefined) return fallback;
  const table: Record<string, T> = Array.isArray(allowed) ? Object.fromEntries(allowed.map((a) => [a, a])) : (allowed as Record<string, T>);
  const found = table[value];
  if (found === undefined) {
    throw new UsageError(`invalid value '${value}' for --${flag} (choose from ${Object.keys(table).join(", ")})`);
  }
  return found;
}

/**
 * vLLM accepts --max_model_len as well as --max-model-len, and several
 * adapters after one --lora-modules (each name=path or a JSON object): those
 * become one flag each, as parseArgs takes them.
 */
function normalizeFlagNames(args: readonly string[]): string[] {
  const out: string[] = [];
  let inLoraModules = false;
  for (const arg of args) {
    if (!arg.startsWith("--")) {
      const adapter = /^[^/=][^=]*=/.test(arg) || arg.startsWith("{");
      if (inLoraModules && adapter && out.at(-1) !== "--lora-modules") out.push("--lora-modules");
      else if (!adapter) inLoraModules = false;
      out.push(arg);
      continue;
    }
    const eq = arg.indexOf("=");
    const name = (eq < 0 ? arg : arg.slice(0, eq)).replaceAll("_", "-");
    inLoraModules = name === "--lora-modules" && eq < 0;
    out.push(name + (eq < 0 ? "" : arg.slice(eq)));
  }
  return out;
}

export interface ParsedServe {
  help: boolean;
  options: ServeOptions;
}

export function parseServeArgs(args: readonly string[], env: NodeJS.ProcessEnv = process.env): ParsedServe {
  let parsed;
  try {
    parsed = parseArgs({ args: normalizeFlagNames(args), options: SERVE_FLAGS, allowPositionals: true, strict: true });
  } catch (error) {
    const { code, message } = error as { code?: string; message: string };
    if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") {
      throw new UsageError(`unknown option ${/'[^']*'/.exec(message)?.[0] ?? message}`);
    }
    // The other parseArgs messages name the flag ("Option '--port <value>' argument missing").
    throw new UsageError(message);
  }
  const { values, positionals } = parsed;
  if (positionals.length > 1) throw new UsageError(`expected at most one model directory, got ${positionals.join(" ")}`);
  if (values["enable-prefix-caching"] && values["no-enable-prefix-caching"]) {
    throw new UsageError("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  }
  if (values["async-scheduling"] && values["no-async-scheduling"]) {
    throw new UsageError("--async-scheduling and --no-async-scheduling contradict each other");
  }
  if (values["engine-thread"] && values["no-engine-thread"]) {
    throw new UsageError("--engine-thread and --no-engine-thread contradict each other");
  }
  const servedModelName = values["served-model-name"];
  if (servedModelName !== undefined && servedModelName.trim() === "") throw new UsageError("--served-model-name must not be empty");
  const port = intFlag(values.port, "port", 0, SERVE_DEFAULTS.port);
  if (port > 65535) throw new UsageError(`invalid value '${values.port}' for --port: must be at most 65535`);
  const apiKey = values["api-key"] ?? env.BATON_API_KEY ?? null;
  if (apiKey !== null && apiKey.trim() === "") throw new UsageError("--api-key (or BATON_API_KEY) must not be empty");
  const toolCallParser = values["tool-call-parser"] === undefined ? null : choice(values["tool-call-parser"], "tool-call-parser", TOOL_CALL_PARSERS, "hermes");
  if (values["enable-auto-tool-choice"] === true && toolCallParser === null) {
    throw new UsageError("--enable-auto-tool-choice needs --tool-call-parser");
  }
  if (values["tensor-parallel-size"] !== undefined && values.deployment !== undefined && values["tensor-parallel-size"] !== "1") {
    throw new UsageError("--tensor-parallel-size and --deployment do not combine yet: tensor parallel serves a plain LLM");
  }
  const seed = values.seed === undefined ? SERVE_DEFAULTS.seed : Number(values.seed);
  if (!Number.isSafeInteger(seed)) throw new UsageError(`invalid value '${values.seed}' for --seed: expected an integer`);
  return {
    help: values.help === true,
    options: {
      modelDir: positionals[0] ?? null,
      host: values.host ?? SERVE_DEFAULTS.host,
      port,
      servedModelName: servedModelName ?? null,
      maxModelLen: intFlag(values["max-model-len"], "max-model-len", 1, undefined),
      maxNumSeqs: intFlag(values["max-num-seqs"], "max-num-seqs", 1, SERVE_DEFAULTS.maxNumSeqs),
      maxNumBatchedTokens: intFlag(values["max-num-batched-tokens"], "max-num-batched-tokens", 1, SERVE_DEFAULTS.maxNumBatchedTokens),
      blockSize: intFlag(values["block-size"], "block-size", 1, SERVE_DEFAULTS.blockSize),
      numGpuBlocksOverride: intFlag(values["num-gpu-blocks-override"], "num-gpu-blocks-override", 1, undefined),
      kvCacheMemoryBytes: intFlag(values["kv-cache-memory-bytes"], "kv-cache-memory-bytes", 1, undefined),
      dtype: choice(values.dtype, "dtype", DTYPES, SERVE_DEFAULTS.dtype),
      device: choice(values.device, "device", DEVICES, SERVE_DEFAULTS.device),
      seed,
      loadFormat: choice(values["load-format"], "load-format", LOAD_FORMATS, SERVE_DEFAULTS.loadFormat),
      attentionBackend: values["attention-backend"] ?? "auto",
      enforceEager: values["enforce-eager"] === true,
      runner: choice(values.runner, "runner", RUNNERS, "auto"),
      hfOverrides: jsonObjectFlag(values["hf-overrides"], "hf-overrides"),
      modelLoaderExtraConfig: jsonObjectFlag(values["model-loader-extra-config"], "model-loader-extra-config"),
      enablePrefixCaching: values["no-enable-prefix-caching"] !== true,
      asyncScheduling: values["no-async-scheduling"] !== true,
      engineThread: values["no-engine-thread"] !== true,
      schedulingPolicy: choice(values["scheduling-policy"], "scheduling-policy", SCHEDULING_POLICIES, "fcfs"),
      apiKey,
      logLevel: choice(values["log-level"], "log-level", LOG_LEVELS, SERVE_DEFAULTS.logLevel),
      maxNumQueuedRequests: intFlag(values["max-num-queued-requests"], "max-num-queued-requests", 0, SERVE_DEFAULTS.maxNumQueuedRequests),
      maxRequestBodyBytes: intFlag(values["max-request-body-bytes"], "max-request-body-bytes", 1024, 64 * 1024 * 1024),
      reasoningParser: values["reasoning-parser"] === undefined ? null : choice(values["reasoning-parser"], "reasoning-parser", REASONING_PARSERS, "qwen3"),
      toolCallParser,
      enableAutoToolChoice: values["enable-auto-tool-choice"] === true,
      deployment: values.deployment ?? null,
      shmBytes: intFlag(values["shm-bytes"], "shm-bytes", 1, undefined),
      tensorParallelSize: intFlag(values["tensor-parallel-size"], "tensor-parallel-size", 1, 1),
      distributedExecutorBackend: choice(values["distributed-executor-backend"], "distributed-executor-backend", EXECUTOR_BACKENDS, "mp"),
      maxWorkerRestarts: intFlag(values["max-worker-restarts"], "max-worker-restarts", 0, SERVE_DEFAULTS.maxWorkerRestarts),
      maxRequestMigrations: intFlag(values["max-request-migrations"], "max-request-migrations", 0, SERVE_DEFAULTS.maxRequestMigrations),
      stepTimeoutS: secondsFlag(values["step-timeout"], "step-timeout", 0.1) ?? null,
      shutdownTimeoutS: secondsFlag(values["shutdown-timeout"], "shutdown-timeout", 0) ?? SERVE_DEFAULTS.shutdownTimeoutS,
      ...dataParallelFlags(values),
      media: {
        // vLLM takes the domains space-separated after one flag; several flags add up.
        allowedDomains: (values["allowed-media-domains"] ?? []).flatMap((v) => v.split(/[\s,]+/)).filter((d) => d !== "").map((d) => d.toLowerCase()),
        allowedLocalPath: values["allowed-local-media-path"] ?? null,
        maxImagesPerPrompt: limitMmPerPrompt(values["limit-mm-per-prompt"]).image,
        maxAudiosPerPrompt: limitMmPerPrompt(values["limit-mm-per-prompt"]).audio,
        maxImageBytes: intFlag(values["max-image-bytes"], "max-image-bytes", 1, DEFAULT_MAX_IMAGE_BYTES),
      },
      responsesStore: {
        maxBytes: intFlag(values["responses-store-max-bytes"], "responses-store-max-bytes", 0, RESPONSES_STORE_DEFAULTS.maxBytes),
        ttlMs: (secondsFlag(values["responses-store-ttl"], "responses-store-ttl", 1) ?? RESPONSES_STORE_DEFAULTS.ttlMs / 1000) * 1000,
      },
      lora: loraOptions(values, env),
      speculative: speculativeConfig(values["speculative-config"]),
    },
  };
}

/** --enable-lora with its flags; the LoRA flags without it are refused, as vLLM does. */
function loraOptions(values: { [k: string]: string | boolean | string[] | undefined }, env: NodeJS.ProcessEnv): LoraOptions | null {
  const modules = (values["lora-modules"] as string[] | undefined) ?? [];
  if (values["enable-lora"] !== true) {
    const stray = ["lora-modules", "max-loras", "max-lora-rank", "allow-runtime-lora-updating"].find((f) => values[f] !== undefined);
    if (stray !== undefined) throw new UsageError(`--${stray} needs --enable-lora`);
    return null;
  }
  const parsed = modules.map((text) => loraModule(text.trim()));
  const names = new Set<string>();
  for (const m of parsed) {
    if (names.has(m.name)) throw new UsageError(`--lora-modules names adapter ${m.name} twice`);
    names.add(m.name);
  }
  const runtimeEnv = (env.VLLM_ALLOW_RUNTIME_LORA_UPDATING ?? "").toLowerCase();
  return {
    modules: parsed,
    maxLoras: intFlag(values["max-loras"] as string | undefined, "max-loras", 1, 1),
    maxLoraRank: intFlag(values["max-lora-rank"] as string | undefined, "max-lora-rank", 1, 16),
    runtimeUpdates: values["allow-runtime-lora-updating"] === true || runtimeEnv === "true" || runtimeEnv === "1",
  };
}

/** vLLM's two spellings: name=path, or a JSON object {"name": ..., "path": ...}. */
function loraModule(text: string): LoraModule {
  if (text.startsWith("{")) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      throw new UsageError(`invalid value '${text}' for --lora-modules: expected name=path or a JSON object`);
    }
    const { name, path } = (parsed ?? {}) as { name?: unknown; path?: unknown };
    if (typeof name !== "string" || typeof path !== "string" || name === "" || path === "") {
      throw new UsageError(`invalid value '${text}' for --lora-modules: the JSON form needs "name" and "path" strings`);
    }
    return { name, path };
  }
  const eq = text.indexOf("=");
  if (eq <= 0 || eq === text.length - 1) throw new UsageError(`invalid value '${text}' for --lora-modules: expected name=path`);
  return { name: text.slice(0, eq), path: text.slice(eq + 1) };
}

/** --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, ...}' (vLLM's keys). */
function speculativeConfig(value: string | undefined): SpeculativeConfig | null {
  if (value === undefined) return null;
  const bad = (why: string): never => {
    throw new UsageError(`invalid value '${value}' for --speculative-config: ${why}`);
  };
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    bad("expected a JSON object");
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return bad("expected a JSON object");
  const config = parsed as Record<string, unknown>;
  const method = config.method;
  if (method !== "ngram" && method !== "draft_model") bad(`method ${JSON.stringify(method ?? null)} is not served (served: "ngram", "draft_model")`);
  const known = method === "ngram" ? ["method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"] : ["method", "num_speculative_tokens", "model"];
  const unknown = Object.keys(config).filter((k) => !known.includes(k));
  if (unknown.length > 0) bad(`unknown key ${unknown[0]} for method ${method as string} (served: ${known.join(", ")})`);
  const int = (key: string, fallback: number | null): number => {
    const v = config[key] ?? fallback;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) return bad(`${key} must be a positive integer`);
    return v;
  };
  const numSpeculativeTokens = int("num_speculative_tokens", null);
  if (method === "draft_model") {
    if (typeof config.model !== "string" || config.model === "") return bad("method draft_model needs model, the draft model's directory");
    return { method, numSpeculativeTokens, promptLookupMin: 1, promptLookupMax: 3, draftModel: resolvePath(config.model) };
  }
  const promptLookupMax = int("prompt_lookup_max", 3);
  const promptLookupMin = int("prompt_lookup_min", Math.min(1, promptLookupMax));
  if (promptLookupMin > promptLookupMax) bad(`prompt_lookup_min ${promptLookupMin} is above prompt_lookup_max ${promptLookupMax}`);
  return { method: "ngram", numSpeculativeTokens, promptLookupMin, promptLookupMax, draftModel: null };
}

/** --hf-overrides / --model-loader-extra-config '{...}': a JSON object, passed to the worker as it is. */
function jsonObjectFlag(value: string | undefined, flag: string): Record<string, unknown> | null {
  if (value === undefined) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    throw new UsageError(`invalid value '${value}' for --${flag}: expected a JSON object`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new UsageError(`invalid value '${value}' for --${flag}: expected a JSON object`);
  return parsed as Record<string, unknown>;
}

/** --limit-mm-per-prompt '{"image": N, "audio": M}' (vLLM's JSON form): the most parts of each modality one prompt may hold; null: no limit. */
function limitMmPerPrompt(value: string | undefined): { image: number | null; audio: number | null } {
  if (value === undefined) return { image: null, audio: null };
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    throw new UsageError(`invalid value '${value}' for --limit-mm-per-prompt: expected JSON such as '{"image": 2}'`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new UsageError(`invalid value '${value}' for --limit-mm-per-prompt: expected a JSON object such as '{"image": 2}'`);
  }
  const limits = parsed as Record<string, unknown>;
  for (const [modality, limit] of Object.entries(limits)) {
    if (modality !== "image" && modality !== "audio") throw new UsageError(`--limit-mm-per-prompt: modality '${modality}' is not served (only "image" and "audio")`);
    if (typeof limit !== "number" || !Number.isSafeInteger(limit) || limit < 0) {
      throw new UsageError(`--limit-mm-per-prompt: "${modality}" must be a non-negative integer, got ${JSON.stringify(limit)}`);
    }
  }
  const of = (name: string): number | null => (typeof limits[name] === "number" ? (limits[name] as number) : null);
  return { image: of("image"), audio: of("audio") };
}

export const MAIN_HELP = `Usage: baton <command> [options]

Commands:
  serve [model-dir]   serve a Hugging Face model directory with an OpenAI-compatible API
                      (no directory: the bundled demo model in models/demo)
  bench serve         load an OpenAI-compatible server, vLLM's metrics (baton bench --help)
  bench compare       the same workload against Baton and a peer server
  bench overhead      measure the control plane's per-step cost
  bench soak          mixed load with worker faults for N minutes; fails on any leak
  bench router        data parallel: cache-aware against round-robin routing on shared prefixes

Options:
  -h, --help          show this help (baton serve --help lists the serve flags)
  -v, --version       print the version
`;

export const SERVE_HELP = `Usage: baton serve [model-dir] [options]

Serves POST /v1/completions, POST /v1/chat/completions, POST /v1/responses,
GET /v1/models and GET /health. Without model-dir, serves the bundled demo
model (models/demo, built by npm run setup) as "baton-demo".

Options (vLLM's names; --flag value or --flag=value):
  --host HOST                      address to listen on (default ${SERVE_DEFAULTS.host})
  --port PORT                      port; 0 picks a free one (default ${SERVE_DEFAULTS.port})
  --served-model-name NAME         model name in the API (default: the directory's name)
  --max-model-len N                context length (default: the model's max_position_embeddings)
  --max-num-seqs N                 most requests running at once (default ${SERVE_DEFAULTS.maxNumSeqs})
  --max-num-batched-tokens N       token budget per engine step (default ${SERVE_DEFAULTS.maxNumBatchedTokens})
  --block-size N                   tokens per KV-cache block (default ${SERVE_DEFAULTS.blockSize})
  --num-gpu-blocks-override N      exact number of KV-cache blocks
  --kv-cache-memory-bytes N        KV-cache budget in bytes (suffixes: k/m/g = 1000s, K/M/G = 1024s)
  --dtype auto|float32|bfloat16|float16   weight and activation dtype (default auto)
  --device auto|cpu|cuda           where the model runs (default auto)
  --seed N                         seed of the worker's global sampler (default ${SERVE_DEFAULTS.seed})
  --load-format auto|dummy|dummy-null
                                   dummy: random decoder weights of the config's shapes, no
                                   weight files; dummy-null: no model at all, each token is
                                   the last + 1 (both for tests and benchmarks)
  --model-loader-extra-config JSON the loader's options (vLLM's flag); dummy takes
                                   '{"residual_scale": S}': the weights that write into the
                                   residual stream (o_proj, down_proj) drawn S times smaller, so a
                                   tied model mostly repeats its input (a copying workload for
                                   speculative-decoding benchmarks at any shape)
  --runner auto|generate|pooling   pooling: an embedding model (/v1/embeddings); auto (default):
                                   pooling for a sentence-transformers directory (modules.json)
                                   or an encoder (BertModel, XLMRobertaModel, their
                                   *ForSequenceClassification cross-encoders), else generate
  --hf-overrides JSON              config.json restated (vLLM's flag); serves a Qwen3ForCausalLM
                                   as Qwen3-Reranker: '{"architectures":
                                   ["Qwen3ForSequenceClassification"], "classifier_from_token":
                                   ["no", "yes"], "is_original_qwen3_reranker": true}'
  --attention-backend auto|triton|flex|cpu|reference
                                   the worker's attention kernels (default auto: triton on
                                   CUDA, cpu on CPU)
  --enforce-eager                  no CUDA graphs: decode steps run eagerly
  --enable-lora                    serve LoRA adapters (PEFT directories) over the base model;
                                   a request picks one by its \`model\`
  --lora-modules NAME=PATH ...     adapters to serve from the start (also vLLM's JSON form
                                   '{"name": ..., "path": ...}'); listed in /v1/models
  --max-loras N                    most distinct adapters in one step (default 1)
  --max-lora-rank N                highest adapter rank accepted (default 16)
  --allow-runtime-lora-updating    serve /v1/load_lora_adapter and /v1/unload_lora_adapter
                                   (also VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, as vLLM)
  --speculative-config JSON        speculative decoding, vLLM's keys: '{"method": "ngram",
                                   "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                                   "prompt_lookup_min": 1}' (n-gram prompt lookup) or
                                   '{"method": "draft_model", "model": DIR, "num_speculative_tokens":
                                   4}' (a smaller model with the same vocabulary drafts); greedy
                                   rows verify drafts, other rows decode as usual
  --no-enable-prefix-caching       turn prefix caching off
  --no-async-scheduling            turn overlap scheduling off (step N+1 is built while N runs; default on)
  --no-engine-thread               run the engine core on the HTTP server's event loop instead of
                                   its own thread (default: its own thread)
  --scheduling-policy fcfs|priority   priority: requests with a lower \`priority\` field run first (default fcfs)
  --max-num-queued-requests N      new requests get 429 while N wait (default ${SERVE_DEFAULTS.maxNumQueuedRequests})
  --max-request-body-bytes N       larger request bodies get 413 (default 64M = 64 MiB)
  --reasoning-parser qwen3|deepseek_r1   split <think>...</think> out of chat answers into
                                   reasoning_content (message and streamed delta)
  --enable-auto-tool-choice        serve tool_choice "auto" (the default when tools are given):
                                   the model's own calls are parsed out of its answer
  --tool-call-parser hermes|llama3_json|mistral|qwen3_coder   the model's tool-call format
  --deployment FILE.yaml           which worker rank runs which graph nodes (M*'s format)
  --shm-bytes N                    each worker's shared-memory arena for tensors that cross between
                                   workers of a deployment (default: a quarter of /dev/shm, at most
                                   2 GiB, split between the workers)
  --tensor-parallel-size N         split the model over N worker ranks (torch.distributed: gloo on CPU,
                                   NCCL on CUDA); N must divide the attention heads (default 1)
  --distributed-executor-backend mp|ray   how ranks above 0 start: child processes of rank 0 (mp,
                                   default) or Ray actors in a placement group (ray; the cluster at
                                   RAY_ADDRESS, else a local one); the engine-worker link is then tcp://
  --max-worker-restarts N          restart a dead or hung worker up to N times in a row (1 s, 2 s, 4 s ...
                                   apart), then exit 1; 0: never (default ${SERVE_DEFAULTS.maxWorkerRestarts})
  --max-request-migrations N       carry a request over to a restarted worker at most N times; past it, or
                                   with 0, it ends with an error (default ${SERVE_DEFAULTS.maxRequestMigrations})
  --step-timeout SECONDS           a worker that has not answered a step after this long is hung: killed and
                                   restarted (default: 20x the slowest step seen, at least 60 s; 600 s for
                                   the first steps, which may compile)
  --shutdown-timeout SECONDS       on SIGTERM/SIGINT, new requests get 503 and in-flight ones get this long to
                                   finish before the rest are aborted (default ${SERVE_DEFAULTS.shutdownTimeoutS}); a second signal exits at once
  --data-parallel-size N           N engine cores, each with its own model worker and KV cache, behind this
                                   one server and a router (default 1; plain LLMs only)
  --router cache-aware|round-robin   which replica takes a request: cache-aware (default) sends it where
                                   its longest prompt prefix is cached unless the loads are out of balance
  --router-cache-threshold F       cache-aware: a replica holding more than this fraction of the prompt
                                   takes it (0-1, default ${CACHE_AWARE_DEFAULTS.cacheThreshold})
  --router-balance-abs-threshold N   cache-aware: loads are out of balance when the busiest replica has more
                                   than N requests more than the idlest (default ${CACHE_AWARE_DEFAULTS.balanceAbsThreshold}) ...
  --router-balance-rel-threshold F   ... and more than F times as many (default ${CACHE_AWARE_DEFAULTS.balanceRelThreshold}); then the least
                                   loaded replica takes it
  --allowed-media-domains D [D...] image_url parts may fetch http(s) URLs of these hosts (default: none;
                                   data: URLs are always allowed)
  --allowed-local-media-path DIR   image_url parts may read file:// URLs under DIR (default: none)
  --limit-mm-per-prompt JSON       most images / audio parts per prompt, e.g. '{"image": 2, "audio": 1}' (default: no limit)
  --max-image-bytes N              largest image accepted, in bytes (default 20M = 20 MiB)
  --responses-store-max-bytes N    stored responses (/v1/responses with store: true) kept in memory for
                                   previous_response_id, GET and background; least recently used go first
                                   past N bytes; 0: none kept (default 256M = 256 MiB; a restart forgets them)
  --responses-store-ttl SECONDS    a stored response is forgotten this long after it finished (default 86400)
  --api-key KEY                    require 'Authorization: Bearer KEY' on every route but /health
  --log-level LEVEL                trace|debug|info|warn|error|fatal|silent (default ${SERVE_DEFAULTS.logLevel})
  -h, --help                       show this help

Environment:
  BATON_PYTHON                     the Python interpreter for the model worker
                                   (default: .venv/bin/python in the repository)
  BATON_API_KEY                    the API key when --api-key is not given
`;
