// The HTTP server: OpenAI-compatible routes over one engine core. Everything
// that fails reaches the client as an OpenAI-shaped error body.

import Fastify, { type FastifyError, type FastifyInstance } from "fastify";
import type { ReasoningParserName } from "../reasoning/reasoning-parser.js";
import type { ChatTemplate } from "../text/chat-template.js";
import type { ToolCallParserName } from "../tool-parsers/tool-parser.js";
import type { GrammarCompiling } from "./context.js";
import { DetokenizerBatcher } from "../text/detokenizer.js";
import type { TextTokenizer } from "../text/tokenizer.js";
import { handleChatCompletion } from "./chat-completions.js";
import { handleCompletion } from "./completions.js";
import { handleEmbeddings } from "./embeddings.js";
import { handleRerank, handleScore } from "./scoring.js";
import { batonVersion, handleDetokenize, handleGenerate, handleTokenize } from "./extra-endpoints.js";
import type { FrontendContext } from "./context.js";
import type { EngineHandle } from "../engine/types.js";
import { listModels, modelCard, retrieveModel } from "./models.js";
import { registerLoraRoutes, type LoraCatalog } from "./lora-adapters.js";
import { ApiError, badRequest, serverError, type ApiErrorType } from "./openai-error.js";
import { TokenStrings } from "./token-strings.js";
import { Admission, RETRY_AFTER_UNAVAILABLE_S } from "./admission.js";
import { apiKeyHook } from "./auth.js";
import type { Logger } from "../observability/logger.js";
import type { BatonMetrics } from "../observability/metrics.js";
import { RequestSessions } from "./request-session.js";
import multipart from "@fastify/multipart";
import { registerDashboard } from "./dashboard/routes.js";
import { registerResponsesRoutes } from "./responses/routes.js";
import { RESPONSES_STORE_DEFAULTS, type ResponseStoreOptions } from "./responses/store.js";
import { handleImageGeneration, handleMultipartGenerate, handleSpeech, type GraphEndpointsOptions, type GraphEngineHandle } from "./graph-endpoints.js";
import type { DashboardSource } from "./dashboard/snapshot.js";
import type { AudioPrompt, SpeechRecognition, VisionPrompt } from "../config/model-dir.js";
import { handleTranscription } from "./transcriptions.js";
import { NO_MEDIA_ALLOWED, type MediaOptions } from "./media.js";
import type { PoolingInfo } from "../transport/messages.js";

export interface ServerOptions {
  engine: EngineHandle;
  /** null for a model without text output (a speech model): the text endpoints answer 400 saying so. */
  tokenizer: TextTokenizer | null;
  chatTemplate: ChatTemplate | null;
  servedModelName: string;
  maxModelLen: number;
  eosTokenIds: number[];
  /** Token ids must be below this (the worker's vocab size; may exceed the tokenizer's). */
  vocabSize: number;
  /** Largest accepted request body; long prompts as token-id lists get big. */
  bodyLimitBytes?: number;
  /** Called with errors that are the server's fault (for the log). */
  onInternalError?: (error: Error) => void;
  /** Bearer key every route but /health requires; null/undefined: no auth. */
  apiKey?: string | null;
  /** GET /metrics and per-request metrics; null/undefined: no /metrics route. */
  metrics?: BatonMetrics | null;
  /** Per-request log lines. */
  logger?: Logger | null;
  /** 429 once this many requests wait (default: unbounded). */
  maxNumQueuedRequests?: number;
  /** --scheduling-policy (default fcfs: a non-zero request priority is a 400). */
  schedulingPolicy?: "fcfs" | "priority";
  /** The engine's waiting-queue length (for the bound); default 0. */
  numWaiting?: () => number;
  /** --reasoning-parser (default none). */
  reasoningParser?: ReasoningParserName | null;
  /** --tool-call-parser (default none). */
  toolCallParser?: ToolCallParserName | null;
  /** --enable-auto-tool-choice (default off). */
  enableAutoToolChoice?: boolean;
  /** The grammar engine (structured output); absent: structured output requests get a 400. */
  grammars?: GrammarCompiling | null;
  /** A graph of models with non-text outputs: /v1/audio/speech, /v1/images/generations and multipart /generate. */
  graph?: (Omit<GraphEndpointsOptions, "unavailableReason" | "sessions"> & { engine: GraphEngineHandle }) | null;
  /** A vision-language model's image placement; null/undefined: image parts are a 400. */
  vision?: VisionPrompt | null;
  audio?: AudioPrompt | null;
  /** A speech-recognition model (Whisper): what /v1/audio/transcriptions and /translations need; null/undefined: those are a 400. */
  speech?: SpeechRecognition | null;
  /** A pooling model's Ready.pooling: /v1/embeddings serves it and the generating routes answer 400; null/undefined: a generating model. */
  pooling?: PoolingInfo | null;
  /** What image parts may load (default: data: URLs only, 20 MiB each). */
  media?: MediaOptions;
  /** The live dashboard at / and /dashboard; null/undefined: no dashboard. */
  dashboard?: DashboardSource | null;
  /** The Responses API's in-memory store (--responses-store-max-bytes, --responses-store-ttl). */
  responsesStore?: ResponseStoreOptions;
  /** --enable-lora: the adapters requests may name; null/undefined: LoRA off. */
  lora?: LoraCatalog | null;
  /** The model directory (the base model's `root` in /v1/models). */
  modelRoot?: string;
}

export interface BatonServer {
  app: FastifyInstance;
  /** Requests in flight. */
  readonly inFlight: number;
  /** Generation requests (text and audio, streamed or not) admitted and not finished. */
  readonly openGenerations: number;
  /** Resolves once no generation request is open (a draining server waits for this). */
  generationsDone(): Promise<void>;
  /** Marks the server unavailable (health 503, new requests 503 with Retry-After); null makes it available again. */
  setUnavailable(reason: string | null): void;
  /** Serving, but not at full strength (a data-parallel replica is down): /health stays 200 and says why; null clears it. */
  setDegraded(reason: string | null): void;
  /** Ends every request in flight with this error; their engine requests are aborted. */
  failInFlight(error: ApiError): void;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

const HTTP_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] as const;

function errorType(status: number): ApiErrorType {
  if (status === 404) return "not_found_error";
  if (status === 503) return "service_unavailable";
  return status >= 500 ? "server_error" : "invalid_request_error";
}

export function buildServer(options: ServerOptions): BatonServer {
  const app = Fastify({ logger: false, bodyLimit: options.bodyLimitBytes ?? 64 * 1024 * 1024 });
  let unavailable: string | null = null;
  let degraded: string | null = null;
  const metrics = options.metrics ?? null;
  const admission = new Admission({
    maxNumQueuedRequests: options.maxNumQueuedRequests ?? Number.POSITIVE_INFINITY,
    numWaiting: options.numWaiting ?? (() => 0),
    unavailableReason: () => unavailable,
    onReject: (reason) => metrics?.reject(reason),
  });
  const engine = options.engine;
  const graphEngine = options.graph?.engine ?? null;
  const sessions = new RequestSessions(
    {
      submit: (req, onOutput) => engine.submit(req, onOutput),
      abort: (id, reason) => engine.abort(id, reason),
      submitGraph: graphEngine === null ? undefined : (req, onEvent) => graphEngine.submitGraph(req, onEvent),
    },
    { recorder: metrics, logger: options.logger ?? null, onSubmit: () => admission.releaseCurrent() },
  );
  const tokenizer = options.tokenizer;
  const ctx: FrontendContext | null =
    tokenizer === null
      ? null
      : {
    tokenizer,
    detokenizer: new DetokenizerBatcher(tokenizer),
    tokenStrings: new TokenStrings(tokenizer),
    chatTemplate: options.chatTemplate,
    servedModelName: options.servedModelName,
    limits: { maxModelLen: options.maxModelLen, eosTokenIds: options.eosTokenIds, schedulingPolicy: options.schedulingPolicy ?? "fcfs" },
    vocabSize: options.vocabSize,
    sessions,
    unavailableReason: () => unavailable,
    reasoningParser: options.reasoningParser ?? null,
    toolCallParser: options.toolCallParser ?? null,
    enableAutoToolChoice: options.enableAutoToolChoice ?? false,
    grammars: options.grammars ?? null,
    vision: options.vision ?? null,
    audio: options.audio ?? null,
    speech: options.speech ?? null,
    media: options.media ?? NO_MEDIA_ALLOWED,
    adapters: options.lora ?? null,
    noteIgnoredFields(route, names) {
      // Ignored like vLLM does, but said once per field name so a client's typo is visible without flooding the log.
      for (const name of names) {
        if (warnedFields.has(name)) continue;
        warnedFields.add(name);
        options.logger?.warn({ route, field: name }, `ignoring unknown request field ${JSON.stringify(name)} (logged once per field name)`);
      }
    },
  };
  const card = modelCard(options.servedModelName, Math.floor(Date.now() / 1000), options.maxModelLen, options.modelRoot);
  const adapters = options.lora ?? null;
  const warnedFields = new Set<string>();

  app.setErrorHandler((error: FastifyError | ApiError | Error, _request, reply) => {
    if (reply.sent || reply.raw.headersSent) return;
    if (error instanceof ApiError) {
      if (error.status === 503) void reply.header("retry-after", String(RETRY_AFTER_UNAVAILABLE_S));
      void reply.code(error.status).send(error.toBody());
      return;
    }
    // fastify's own client errors: invalid JSON, empty body, wrong content type, body too large.
    const status = "statusCode" in error && typeof error.statusCode === "number" ? error.statusCode : 500;
    if (status < 500) {
      const message = "code" in error && error.code === "FST_ERR_CTP_INVALID_JSON" ? `invalid JSON body: ${error.message}` : error.message;
      void reply.code(status).send(new ApiError(status, message, errorType(status)).toBody());
      return;
    }
    options.onInternalError?.(error);
    void reply.code(500).send(serverError(`internal error: ${error.message}`).toBody());
  });
  // JSON bodies must be valid UTF-8 (Node would silently replace bad bytes with U+FFFD).
  app.removeContentTypeParser("application/json");
  // Only JSON bodies: anything else is a 415 naming the media type.
  app.removeContentTypeParser("text/plain");
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (_request, body, done) => {
    const bytes = body as Buffer;
    if (bytes.length === 0) {
      done(badRequest("the request body is empty; send a JSON object"), undefined);
      return;
    }
    let text: string;
    try {
      text = utf8.decode(bytes);
    } catch {
      done(badRequest("the request body is not valid UTF-8", null, "invalid_utf8"), undefined);
      return;
    }
    try {
      // A "__proto__" key must not become a prototype anywhere downstream.
      done(null, text.includes("__proto__") ? JSON.parse(text, (key, value: unknown) => (key === "__proto__" ? undefined : value)) : JSON.parse(text));
    } catch (error) {
      done(badRequest(`invalid JSON body: ${(error as Error).message}`, null, "invalid_json"), undefined);
    }
  });
  app.setNotFoundHandler((request, reply) => {
    // A known path asked with another method: 405 naming the methods it takes.
    const path = request.url.split("?")[0] ?? request.url;
    const allowed = HTTP_METHODS.filter((method) => app.findRoute({ method, url: path }) !== null);
    if (allowed.length > 0) {
      void reply
        .code(405)
        .header("allow", allowed.join(", "))
        .send(new ApiError(405, `${request.method} is not allowed on ${path}; use ${allowed.join(" or ")}`, "invalid_request_error").toBody());
      return;
    }
    void reply.code(404).send(new ApiError(404, `no route for ${request.method} ${request.url}`, "not_found_error").toBody());
  });

  if (options.apiKey) {
    const key = options.apiKey;
    app.addHook("onRequest", apiKeyHook(key, () => metrics?.reject("unauthorized")));
  }
  app.addHook("preHandler", admission.preHandler);
  if (metrics !== null) {
    app.get("/metrics", async (_request, reply) => reply.header("content-type", metrics.contentType).send(await metrics.render()));
  }

  app.get("/health", async (_request, reply) => {
    if (unavailable === null) return degraded === null ? { status: "ok" } : { status: "ok", message: degraded };
    return reply.code(503).send({ status: "unavailable", message: unavailable });
  });
  app.get("/v1/models", async () => listModels(card, adapters));
  app.get<{ Params: { model: string } }>("/v1/models/:model", async (request) => retrieveModel(card, request.params.model, adapters));
  registerLoraRoutes(app, adapters);
  const graph: GraphEndpointsOptions | null = options.graph ? { ...options.graph, sessions, unavailableReason: () => unavailable } : null;
  // A model without text output (a speech model) answers the text endpoints with a 400 saying why.
  const textContext = (): FrontendContext => {
    if (ctx !== null) return ctx;
    const produces = graph?.outputModalities.join(", ") || "no text";
    const route = graph?.outputModalities.includes("image") ? "/v1/images/generations" : "/v1/audio/speech";
    throw badRequest(`model ${options.servedModelName} does not produce text (it produces ${produces}); use ${route} or the multipart form of /generate`);
  };
  const pooling = options.pooling ?? null;
  const name = options.servedModelName;
  // A pooling model embeds or scores; it generates no text.
  const generateContext = (): FrontendContext => {
    if (pooling?.task === "classify") throw badRequest(`model ${name} is a pooling model (a cross-encoder): it generates no text; use /score or /rerank`);
    if (pooling !== null) throw badRequest(`model ${name} is a pooling model (an embedding model): it generates no text; use /v1/embeddings`);
    return textContext();
  };
  app.post("/v1/completions", (request, reply) => handleCompletion(generateContext(), request, reply));
  app.post("/v1/chat/completions", (request, reply) => handleChatCompletion(generateContext(), request, reply));
  app.post("/v1/embeddings", (request, reply) => {
    if (pooling === null) throw badRequest(`model ${name} generates text; /v1/embeddings needs a pooling model (an embedding model, --runner pooling)`);
    if (pooling.task === "classify") throw badRequest(`model ${name} is a cross-encoder: it scores text pairs (/score, /rerank) and gives no embeddings`);
    return handleEmbeddings(textContext(), pooling, request, reply);
  });
  // vLLM's scoring routes: a cross-encoder or reranker scores a pair itself, an embedding model by cosine similarity.
  const scoringModel = (route: string): PoolingInfo => {
    if (pooling !== null) return pooling;
    throw badRequest(`model ${name} generates text; ${route} needs a pooling model (a cross-encoder, a reranker served with --hf-overrides, or an embedding model)`);
  };
  for (const path of ["/score", "/v1/score"]) app.post(path, (request, reply) => handleScore(textContext(), scoringModel("/score"), request, reply));
  for (const path of ["/rerank", "/v1/rerank", "/v2/rerank"]) app.post(path, (request, reply) => handleRerank(textContext(), scoringModel("/rerank"), request, reply));
  registerResponsesRoutes(app, generateContext, options.responsesStore ?? RESPONSES_STORE_DEFAULTS);
  app.post("/tokenize", (request) => handleTokenize(textContext(), request));
  app.post("/detokenize", (request) => handleDetokenize(textContext(), request));
  app.get("/version", async () => ({ version: batonVersion() }));
  void app.register(multipart, { limits: { fileSize: 64 * 1024 * 1024, files: 16, fields: 16 } });
  app.post("/generate", (request, reply) => {
    if (request.isMultipart()) {
      if (graph === null) throw badRequest("this model takes the JSON form of /generate (prompt_token_ids, prompt); the multipart form is for graph models");
      return handleMultipartGenerate(graph, request, reply);
    }
    return handleGenerate(generateContext(), request, reply);
  });
  app.post("/v1/audio/transcriptions", (request, reply) => handleTranscription(generateContext(), "transcribe", request, reply));
  app.post("/v1/audio/translations", (request, reply) => handleTranscription(generateContext(), "translate", request, reply));
  app.post("/v1/audio/speech", (request, reply) => {
    if (graph === null) throw badRequest(`model ${options.servedModelName} does not produce audio; /v1/audio/speech needs a speech model`);
    return handleSpeech(graph, request, reply);
  });
  app.post("/v1/images/generations", (request, reply) => {
    if (graph === null) throw badRequest(`model ${options.servedModelName} does not generate images; /v1/images/generations needs an image model`);
    return handleImageGeneration(graph, request, reply);
  });
  if (options.dashboard) registerDashboard(app, options.dashboard, { apiKeyRequired: Boolean(options.apiKey) });

  return {
    app,
    get inFlight() {
      return sessions.size;
    },
    get openGenerations() {
      return admission.openRequests;
    },
    generationsDone() {
      return admission.idle();
    },
    setUnavailable(reason) {
      unavailable = reason;
    },
    setDegraded(reason) {
      degraded = reason;
    },
    failInFlight(error) {
      sessions.failAll(error);
    },
  };
}

