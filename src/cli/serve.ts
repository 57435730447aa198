// `baton serve`: model directory -> tokenizer and chat template -> Python
// worker -> engine core -> HTTP server. Owns the process's lifecycle: one
// start-up line when ready; exit 1 with the worker's own message when it
// cannot start; while a worker is down and restarting, /health and new
// requests answer 503 saying why (in-flight requests are carried over by the
// engine); exit 1 when restarts give up; on SIGINT/SIGTERM a drain (new
// requests 503 with Retry-After, in-flight ones finish within
// --shutdown-timeout, the rest are aborted) and exit 0; a second signal exits
// at once. No worker is left behind in any case.

import { existsSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { join } from "node:path";
import { DeploymentError, readDeployment, type Deployment } from "../config/deployment.js";
import { ModelDirError, readModelDir, requireTokenizer, type ModelDirInfo } from "../config/model-dir.js";
import { startServingEngine } from "../engine-host/start.js";
import { DataParallelEngine } from "../engine-host/data-parallel.js";
import { ServingHealth } from "./serving-health.js";
import { EngineStartError, type ServingEngine } from "../engine-host/types.js";
import { buildServer, type BatonServer } from "../frontend/server.js";
import { LoraCatalog } from "../frontend/lora-adapters.js";
import { DashboardFeed } from "../frontend/dashboard/snapshot.js";
import { serviceUnavailable } from "../frontend/openai-error.js";
import { ChatTemplate, ChatTemplateError } from "../text/chat-template.js";
import { TextTokenizer } from "../text/tokenizer.js";
import { GrammarService } from "../structured/grammar-service.js";
import { WorkerStartError } from "../worker/types.js";
import type { WorkerHealthEvent } from "../worker/types.js";
import type { ServeOptions } from "./args.js";
import { createLogger, type Logger } from "../observability/logger.js";
import { BatonMetrics } from "../observability/metrics.js";
import { ProgressBar } from "../observability/progress.js";

const DEMO_MODEL_NAME = "baton-demo";
/** Compiled grammars the grammar thread keeps. */
const GRAMMAR_CACHE_SIZE = 64;
/** How long shutdown waits for open connections before moving on. */
const CLOSE_TIMEOUT_MS = 5_000;

/** A start-up failure: printed as "baton: <message>", exit 1. */
export class ServeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ServeError";
  }
}

/** The process's one structured logger (JSON lines on stderr); set by serve(). */
let logger: Logger | null = null;

function log(line: string, level: "info" | "warn" | "error" = "info"): void {
  if (logger === null) process.stderr.write(`baton: ${line}\n`);
  else logger[level](line);
}

function loadModelDir(options: ServeOptions, repoRoot: string): { info: ModelDirInfo; name: string } {
  if (options.modelDir === null) {
    const demo = join(repoRoot, "models", "demo");
    if (!existsSync(join(demo, "config.json"))) {
      throw new ServeError(`the demo model is missing (${demo}); run npm run setup to build it, or pass a model directory`);
    }
    return { info: readModelDir(demo), name: options.servedModelName ?? DEMO_MODEL_NAME };
  }
  const info = readModelDir(options.modelDir);
  return { info, name: options.servedModelName ?? info.name };
}

function loadChatTemplate(info: ModelDirInfo): ChatTemplate | null {
  const source = info.tokenizer.chatTemplate;
  if (source === null) return null;
  try {
    return new ChatTemplate(source, { bosToken: info.tokenizer.bosToken, eosToken: info.tokenizer.eosToken });
  } catch (error) {
    // Completions still work; chat answers 400 naming the problem.
    if (error instanceof ChatTemplateError) {
      log(`${error.message}; /v1/chat/completions is disabled`, "warn");
      return null;
    }
    throw error;
  }
}

/** EOS ids from the config files, else the tokenizer's eos_token. */
function eosIds(info: ModelDirInfo, tokenizer: TextTokenizer): number[] {
  if (info.eosTokenIds.length > 0) return info.eosTokenIds;
  const eos = info.tokenizer.eosToken === null ? null : tokenizer.tokenToId(info.tokenizer.eosToken);
  return eos === null ? [] : [eos];
}

function urlHost(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

/**
 * Runs the server until SIGINT/SIGTERM. Resolves with the process exit code
 * (0 after a signal); throws ServeError/ModelDirError when it cannot start.
 */
export async function serve(options: ServeOptions, repoRoot: string): Promise<number> {
  logger = createLogger(options.logLevel);
  let info: ModelDirInfo;
  let name: string;
  try {
    ({ info, name } = loadModelDir(options, repoRoot));
  } catch (error) {
    if (error instanceof ModelDirError) throw new ServeError(error.message);
    throw error;
  }
  // A model without a tokenizer serves only its graph's own outputs (checked against the graph once it is known).
  const tokenizer =
    info.tokenizerPath === null ? null : TextTokenizer.fromFile(info.tokenizerPath, { bosTokenId: info.bosTokenId, addBosToken: info.tokenizer.addBosToken });
  const chatTemplate = tokenizer === null ? null : loadChatTemplate(info);
  let deployment: Deployment | null = null;
  try {
    deployment = options.deployment === null ? null : readDeployment(options.deployment);
  } catch (error) {
    if (error instanceof DeploymentError) throw new ServeError(error.message);
    throw error;
  }

  let stopping = false;
  let engine: ServingEngine | null = null;
  let server: BatonServer | null = null;
  // Aborted by a signal that comes while the worker is still loading.
  const starting = new AbortController();
  let resolveExit: (code: number) => void = () => {};
  const exited = new Promise<number>((resolve) => {
    resolveExit = resolve;
  });

  /** Stops serving: drains for up to drainMs (0: none), aborts what is left (503, `reason`), stops the workers, exits with `code`. */
  const stop = async (code: number, drainMs: number, reason: string): Promise<void> => {
    stopping = true;
    if (server !== null) {
      server.setUnavailable(reason);
      if (drainMs > 0 && server.openGenerations > 0) {
        log(`draining ${server.openGenerations} request(s) for up to ${drainMs / 1000} s (--shutdown-timeout)`);
        const drained = await Promise.race([server.generationsDone().then(() => true), sleep(drainMs, false, { ref: false })]);
        if (!drained) log(`${server.openGenerations} request(s) still running after ${drainMs / 1000} s; aborting them`, "warn");
      }
      server.failInFlight(serviceUnavailable(reason));
      await Promise.race([server.app.close(), sleep(CLOSE_TIMEOUT_MS, undefined, { ref: false })]);
    }
    // Ends live requests, then shuts the model workers down (their own grace period bounds this).
    if (engine !== null) await engine.close().catch(() => {});
    // A worker still loading when the signal came is stopped through the start's signal.
    starting.abort();
    resolveExit(code);
  };
  const shutdown = async (signal: NodeJS.Signals): Promise<void> => {
    if (stopping) {
      // A second signal: stop waiting (the exit hooks kill the workers and close their sockets).
      log(`${signal} again, exiting now`);
      process.exit(1);
    }
    log(`${signal} received, shutting down`);
    await stop(0, options.shutdownTimeoutS * 1000, "the server is shutting down");
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    void shutdown(signal);
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);

  // A progress bar for weight loading, only where a person watches.
  const progressBar = process.stderr.isTTY ? new ProgressBar("loading weights", process.stderr) : null;
  // The grammar engine (structured output, forced tool calls) starts while the weights load; a model without a tokenizer has no text to constrain.
  let grammars: GrammarService | null =
    tokenizer === null || info.tokenizerPath === null
      ? null
      : GrammarService.start({
          tokenizerPath: info.tokenizerPath,
          vocabSize: info.vocabSize ?? tokenizer.vocabSize,
          stopTokenIds: eosIds(info, tokenizer),
          cacheSize: GRAMMAR_CACHE_SIZE,
        });
  const grammarCheck: Promise<string | null> =
    grammars === null
      ? Promise.resolve(null)
      : grammars.compile({ kind: "json_object", source: "" }).then(
          () => null,
          (error: unknown) => (error as Error).message,
        );
  try {
    engine = await startServingEngine({
      worker: {
        modelDir: info.dir,
        blockSize: options.blockSize,
        numBlocks: options.numGpuBlocksOverride,
        kvCacheMemoryBytes: options.kvCacheMemoryBytes,
        shmBytes: options.shmBytes,
        tensorParallelSize: options.tensorParallelSize,
        distributedExecutorBackend: options.distributedExecutorBackend,
        // Ray may place ranks on other hosts: the engine-worker link is TCP then.
        transport: options.distributedExecutorBackend === "ray" ? "tcp" : undefined,
        maxModelLen: options.maxModelLen,
        dtype: options.dtype,
        device: options.device,
        seed: options.seed,
        loadFormat: options.loadFormat,
        attentionBackend: options.attentionBackend,
        enforceEager: options.enforceEager,
        runner: options.runner,
        hfOverrides: options.hfOverrides,
        modelLoaderExtraConfig: options.modelLoaderExtraConfig,
        lora: options.lora === null ? undefined : { maxLoras: options.lora.maxLoras, maxLoraRank: options.lora.maxLoraRank },
        speculative: options.speculative ?? undefined,
        maxNumSeqs: options.maxNumSeqs,
        onLoadProgress: progressBar?.update,
        stepTimeoutMs: options.stepTimeoutS === null ? undefined : options.stepTimeoutS * 1000,
      },
      engine: {
        maxNumSeqs: options.maxNumSeqs,
        maxNumBatchedTokens: options.maxNumBatchedTokens,
        enablePrefixCaching: options.enablePrefixCaching,
        asyncScheduling: options.asyncScheduling,
        maxRequestMigrations: options.maxRequestMigrations,
        maxLoras: options.lora?.maxLoras ?? 0,
        numSpeculativeTokens: options.speculative?.numSpeculativeTokens ?? 0,
      },
      engineThread: options.engineThread,
      restart: { maxRestarts: options.maxWorkerRestarts },
      deployment,
      signal: starting.signal,
      grammar: grammars,
      dataParallel: { size: options.dataParallelSize, router: options.router },
    });
    progressBar?.finish();
  } catch (error) {
    progressBar?.finish(false);
    if (stopping) return exited;
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    if (error instanceof WorkerStartError) throw new ServeError(`worker failed to start: ${error.message}`);
    if (error instanceof EngineStartError || error instanceof DeploymentError) throw new ServeError(error.message);
    throw error;
  }
  if (stopping) {
    await engine.close().catch(() => {});
    return exited;
  }

  const ready = engine.ready;
  const outputModalities = [...new Set(engine.graph.clientOutputs.map((c) => c.modality))];
  if (tokenizer === null && outputModalities.includes("text")) {
    await engine.close().catch(() => {});
    try {
      requireTokenizer(info);
    } catch (error) {
      throw new ServeError((error as Error).message);
    }
  }
  let lora: LoraCatalog | null = null;
  if (options.lora !== null) {
    lora = new LoraCatalog(engine, name, options.lora.runtimeUpdates);
    try {
      for (const m of options.lora.modules) await lora.load(m.name, m.path);
    } catch (error) {
      await engine.close().catch(() => {});
      throw new ServeError(`--lora-modules: ${(error as Error).message}`);
    }
  }
  const dataParallel = engine instanceof DataParallelEngine ? engine : null;
  const metrics = new BatonMetrics({
    modelName: name,
    engine,
    nodes: engine,
    maxModelLen: ready.max_model_len,
    ...(dataParallel === null ? {} : { replicas: dataParallel.replicas, router: dataParallel }),
  });
  if (grammars !== null) {
    // A model whose graph gives no text (or a pooling model) has nothing for a grammar to constrain.
    const servesText = outputModalities.includes("text") && ready.pooling === null;
    const grammarProblem = !servesText
      ? null
      : ready.vocab_size !== grammars.vocabSize
        ? `the model's logits have ${ready.vocab_size} entries, the grammar engine expected ${grammars.vocabSize}`
        : await grammarCheck;
    if (grammarProblem !== null) log(`structured outputs are off: ${grammarProblem}`, "warn");
    if (!servesText || grammarProblem !== null) {
      await grammars.close();
      grammars = null;
    }
  }
  server = buildServer({
    engine,
    tokenizer,
    chatTemplate,
    servedModelName: name,
    maxModelLen: ready.max_model_len,
    eosTokenIds: tokenizer === null ? [] : eosIds(info, tokenizer),
    vocabSize: ready.vocab_size,
    onInternalError: (error) => log(`internal error: ${error.stack ?? error.message}`, "error"),
    apiKey: options.apiKey,
    metrics,
    logger,
    maxNumQueuedRequests: options.maxNumQueuedRequests,
    bodyLimitBytes: options.maxRequestBodyBytes,
    schedulingPolicy: options.schedulingPolicy,
    reasoningParser: options.reasoningParser,
    toolCallParser: options.toolCallParser,
    enableAutoToolChoice: options.enableAutoToolChoice,
    grammars,
    vision: info.vision,
    audio: info.audio,
    speech: info.speech,
    pooling: ready.pooling,
    media: options.media,
    responsesStore: options.responsesStore,
    lora,
    modelRoot: info.dir,
    numWaiting: () => liveEngine.stats.numWaiting,
    dashboard: new DashboardFeed({
      modelName: name,
      engine,
      requests: metrics.live,
      nodes: () => liveEngine.nodeStats(),
    }),
    graph: outputModalities.some((m) => m !== "text")
      ? {
          engine,
          outputModalities,
          imageGeneration: info.imageGeneration,
          voicePrompting: info.architectures[0] === "CsmForConditionalGeneration",
          samplingDefaults: info.samplingDefaults,
          onFirstAudio: (seconds) => metrics.observeFirstAudio(seconds),
        }
      : null,
  });
  const liveServer = server;
  const liveEngine = engine;
  // Workers down and up: /health and admission (serving-health.ts says how, one engine or data parallel).
  const replicaCount = dataParallel?.replicas.length ?? 1;
  const health = new ServingHealth(replicaCount, (dataParallel?.replicas[0] ?? engine).pids.length);
  engine.onWorkerEvent((event: WorkerHealthEvent) => {
    if (stopping) return;
    metrics.observeWorkerEvent(event);
    const update = health.apply(event);
    log(update.log.line, update.log.level);
    if (update.stop !== null) {
      void stop(1, 0, `${update.stop}; the server is stopping`);
      return;
    }
    liveServer.setUnavailable(update.state.unavailable);
    liveServer.setDegraded(update.state.degraded);
  });

  try {
    await server.app.listen({ host: options.host, port: options.port });
  } catch (error) {
    await engine.close().catch(() => {});
    throw new ServeError(`cannot listen on ${options.host}:${options.port}: ${(error as Error).message}`);
  }
  if (stopping) return exited;
  const address = server.app.server.address() as AddressInfo;
  process.stdout.write(
    `Baton serving ${name} (${ready.architecture}, ${ready.dtype}, ${ready.device}, ${ready.num_blocks} KV blocks` +
      (dataParallel === null ? ", " : ` per replica, ${replicaCount} replicas behind the ${options.router.policy} router, `) +
      `max_model_len ${ready.max_model_len}) on http://${urlHost(options.host)}:${address.port}\n`,
  );
  process.stdout.write(servedBanner(options, ready.pooling?.task ?? null));
  logger.info(
    { url: `http://${urlHost(options.host)}:${address.port}`, model: name, auth: options.apiKey !== null, max_num_queued_requests: options.maxNumQueuedRequests },
    "ready",
  );
  return exited;
}

/** What is served where, printed under the start-up line. */
function servedBanner(options: ServeOptions, poolingTask: string | null): string {
  const pooling = poolingTask !== null;
  const routes = poolingTask === "classify" ? "POST /score, POST /rerank (a cross-encoder)" : "POST /v1/embeddings (a pooling model)";
  return [
    pooling
      ? `  API:     ${routes}, GET /v1/models, POST /tokenize, POST /detokenize, GET /version`
      : "  API:     POST /v1/completions, POST /v1/chat/completions, GET /v1/models,",
    ...(pooling ? [] : ["           POST /generate, POST /tokenize, POST /detokenize, GET /version"]),
    "  health:  GET /health (no key needed)",
    "  metrics: GET /metrics (Prometheus, vLLM names)",
    `  dashboard: GET / (live view and playground${options.apiKey === null ? "" : "; its data needs the key"})`,
    `  auth:    ${options.apiKey === null ? "off (no --api-key)" : "on (Authorization: Bearer <key>)"}`,
    `  queue:   429 beyond ${options.maxNumQueuedRequests} waiting requests`,
    "",
  ].join("\n");
}
