// The two ways an endpoint delivers generations: collected into one JSON
// body, or streamed as SSE chunks. A request may run several generations at
// once (n > 1, or several completion prompts): each is its own engine request
// and its own "choice". All are aborted when the client disconnects early.

import { randomUUID } from "node:crypto";
import type { FastifyReply } from "fastify";
import type { EngineRequest } from "../engine/types.js";
import { StopStringMatcher } from "../text/stop-strings.js";
import { TokenTextSession } from "../text/token-text.js";
import type { FrontendContext } from "./context.js";
import { Generation, type GenerationDelta, type GenerationSink, type OpenAIFinishReason, type ResolvedLogprob, type ResolvedPromptLogprob } from "./generation.js";
import { ApiError, modelNotFound, serviceUnavailable, type OpenAIErrorBody } from "./openai-error.js";
import type { SamplingRequest } from "./request-validation.js";
import { resolveMaxTokens, toEngineRequest } from "./sampling.js";
import { SseStream } from "./sse.js";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /** cached_tokens: prompt tokens served from the prefix cache. */
  prompt_tokens_details: { cached_tokens: number };
}

/** One generation of a request: choice `index` of prompt `promptIndex`. */
export interface ChoiceSpec {
  index: number;
  promptIndex: number;
  /** What the client and the logs call this generation: the response's id, with "-<index>" when it has several. */
  name: string;
  request: EngineRequest;
}

interface CollectedChoice {
  index: number;
  promptIndex: number;
  text: string;
  tokenIds: number[];
  /** One entry per generated token when logprobs were asked for. */
  logprobs: ResolvedLogprob[] | null;
  /** One entry per prompt token after the first when prompt logprobs were asked for. */
  promptLogprobs: ResolvedPromptLogprob[] | null;
  finishReason: OpenAIFinishReason;
  stopReason: number | string | null;
}

export interface CollectedGeneration {
  choices: CollectedChoice[];
  usage: Usage;
}

/** How an endpoint shapes its stream. */
export interface StreamFormat {
  /** Chunks sent before any generated text (chat's role chunks). */
  opening(): object[];
  /**
   * A chunk for one choice's text made final by one or more steps; tokenIds/logprobs cover all steps since its last chunk.
   * null: nothing to show yet (the format holds the text back); the ids and logprobs travel with the next chunk. Never null with a finish reason.
   * A list: several chunks in order (chat sends each tool-call delta in its own chunk).
   */
  delta(index: number, delta: GenerationDelta): object | object[] | null;
  /** The closing usage-only chunk (stream_options.include_usage). */
  usage(usage: Usage): object;
}

export function newRequestId(prefix: "cmpl" | "chatcmpl" | "gen"): string {
  return `${prefix}-${randomUUID().replaceAll("-", "")}`;
}

export function unixSeconds(): number {
  return Math.floor(Date.now() / 1000);
}

/** 404 for another model's name; a missing model field means the served one. */
export function checkModel(ctx: FrontendContext, model: string | null): void {
  if (model !== null && model !== ctx.servedModelName && ctx.adapters?.has(model) !== true) throw modelNotFound(model, ctx.servedModelName);
}

export function checkAvailable(ctx: FrontendContext): void {
  const reason = ctx.unavailableReason();
  if (reason !== null) throw serviceUnavailable(reason);
}

/**
 * n engine requests per prompt, choice index = prompt * n + i. Every prompt is
 * checked against the context length before anything is submitted. With a
 * seed, choice i samples with seed + i, so the choices differ but repeat.
 */
export function buildChoices(ctx: FrontendContext, responseId: string, prompts: number[][], req: SamplingRequest, arrivalMs: number): ChoiceSpec[] {
  const specs: ChoiceSpec[] = [];
  const single = prompts.length === 1 && req.n === 1;
  prompts.forEach((promptIds, promptIndex) => {
    const maxTokens = resolveMaxTokens(req, promptIds.length, ctx.limits);
    for (let i = 0; i < req.n; i++) {
      const index = promptIndex * req.n + i;
      const request = toEngineRequest(ctx.sessions.newId(), promptIds, req, maxTokens, ctx.limits, arrivalMs);
      const lora = ctx.adapters?.idOf(req.model) ?? 0;
      if (lora !== 0) request.loraId = lora;
      if (req.seed !== null && i > 0) request.sampling = { ...request.sampling, seed: req.seed + i };
      specs.push({ index, promptIndex, name: single ? responseId : `${responseId}-${index}`, request });
    }
  });
  return specs;
}

function usageOf(specs: readonly ChoiceSpec[], generations: readonly Generation[]): Usage {
  const prompts = new Map<number, number>();
  specs.forEach((spec, i) => prompts.set(spec.promptIndex, generations[i]?.numPromptTokens ?? spec.request.promptIds.length));
  let promptTokens = 0;
  for (const n of prompts.values()) promptTokens += n;
  // Per prompt, the most any of its choices got from the prefix cache.
  const cached = new Map<number, number>();
  specs.forEach((spec, i) => cached.set(spec.promptIndex, Math.max(cached.get(spec.promptIndex) ?? 0, generations[i]?.numCachedTokens ?? 0)));
  let cachedTokens = 0;
  for (const n of cached.values()) cachedTokens += n;
  const completionTokens = generations.reduce((sum, g) => sum + g.completionTokens, 0);
  return {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
    prompt_tokens_details: { cached_tokens: cachedTokens },
  };
}

export function newGeneration(ctx: FrontendContext, spec: ChoiceSpec, req: SamplingRequest, sink: GenerationSink): Generation {
  const session = ctx.detokenizer.session(spec.request.promptIds, req.skipSpecialTokens);
  const vocabulary = ctx.tokenizer.vocabulary;
  return new Generation(ctx.sessions, spec.name, session, spec.request, sink, {
    stopStrings: req.stop.length > 0 ? new StopStringMatcher(req.stop, req.includeStopStrInOutput) : null,
    vocabulary,
    tokenTexts: spec.request.sampling.logprobs >= 0 ? new TokenTextSession(vocabulary, spec.request.promptIds, req.skipSpecialTokens) : null,
  });
}

export function collectGeneration(
  ctx: FrontendContext,
  specs: readonly ChoiceSpec[],
  req: SamplingRequest,
  reply: FastifyReply,
): Promise<CollectedGeneration> {
  return new Promise<CollectedGeneration>((resolve, reject) => {
    const results: (CollectedChoice | null)[] = specs.map(() => null);
    let remaining = specs.length;
    let settled = false;
    const generations: Generation[] = [];
    const fail = (error: ApiError): void => {
      if (settled) return;
      settled = true;
      for (const g of generations) g.cancel();
      reject(error);
    };
    specs.forEach((spec, k) => {
      const parts: string[] = [];
      const tokenIds: number[] = [];
      const logprobs: ResolvedLogprob[] = [];
      let promptLogprobs: ResolvedPromptLogprob[] | null = null;
      const generation = newGeneration(ctx, spec, req, {
        onDelta(delta) {
          parts.push(delta.text);
          for (const id of delta.tokenIds) tokenIds.push(id);
          if (delta.logprobs) for (const entry of delta.logprobs) logprobs.push(entry);
          if (delta.promptLogprobs) promptLogprobs = delta.promptLogprobs;
          if (delta.finishReason === null) return;
          results[k] = {
            index: spec.index,
            promptIndex: spec.promptIndex,
            text: parts.join(""),
            tokenIds,
            logprobs: spec.request.sampling.logprobs >= 0 ? logprobs : null,
            promptLogprobs,
            finishReason: delta.finishReason,
            stopReason: delta.stopReason,
          };
          remaining--;
          if (remaining === 0 && !settled) {
            settled = true;
            resolve({ choices: results as CollectedChoice[], usage: usageOf(specs, generations) });
          }
        },
        onError: fail,
      });
      generations.push(generation);
    });
    reply.raw.on("close", () => {
      if (reply.raw.writableEnded) return;
      fail(new ApiError(499, "client disconnected", "invalid_request_error"));
    });
    // A client that left while its prompt was tokenized: its close event has passed already.
    if (reply.raw.destroyed) fail(new ApiError(499, "client disconnected", "invalid_request_error"));
    for (const generation of generations) {
      if (settled) break;
      generation.start();
    }
  });
}

/** Where a stream goes: SSE for the OpenAI routes, NDJSON for /generate. */
export interface StreamWriter {
  send(chunk: object): void;
  sendError(body: OpenAIErrorBody): void;
  done(): void;
}

/**
 * Streams the generations; the reply is hijacked and (with SSE) ends with `data: [DONE]`.
 * holdHeaders: nothing is sent before the first output or error, so a request
 * refused while its input is prepared (an image that does not decode) gets a
 * plain 4xx instead of a 200 stream that then fails.
 */
export function streamGeneration(
  ctx: FrontendContext,
  specs: readonly ChoiceSpec[],
  req: SamplingRequest,
  format: StreamFormat,
  reply: FastifyReply,
  makeWriter: (res: FastifyReply["raw"]) => StreamWriter = (res) => new SseStream(res),
  holdHeaders = false,
): void {
  reply.hijack();
  let opened: StreamWriter | null = null;
  const open = (): StreamWriter => {
    if (opened !== null) return opened;
    opened = makeWriter(reply.raw);
    for (const chunk of format.opening()) opened.send(chunk);
    return opened;
  };
  const sse: StreamWriter = {
    send: (chunk) => open().send(chunk),
    sendError: (body) => open().sendError(body),
    done: () => open().done(),
  };
  if (!holdHeaders) open();
  let remaining = specs.length;
  let ended = false;
  const generations: Generation[] = [];
  specs.forEach((spec) => {
    // Ids (and logprobs) of steps whose text was held back travel with the next chunk that has text.
    let pendingIds: number[] = [];
    let pendingLogprobs: ResolvedLogprob[] = [];
    let pendingPromptLogprobs: ResolvedPromptLogprob[] | null = null;
    const wantsLogprobs = spec.request.sampling.logprobs >= 0;
    const generation = newGeneration(ctx, spec, req, {
      onDelta(delta) {
        if (ended) return;
        pendingIds = pendingIds.length === 0 ? delta.tokenIds : pendingIds.concat(delta.tokenIds);
        if (delta.logprobs) pendingLogprobs = pendingLogprobs.concat(delta.logprobs);
        if (delta.promptLogprobs) pendingPromptLogprobs = delta.promptLogprobs;
        if (delta.text === "" && delta.finishReason === null) return;
        // Nothing held back and no logprobs (a plain stream's every token): the delta as it came, no copy.
        const asIs = pendingIds === delta.tokenIds && delta.logprobs === null && pendingPromptLogprobs === delta.promptLogprobs && !wantsLogprobs;
        const chunk = format.delta(
          spec.index,
          asIs ? delta : { ...delta, tokenIds: pendingIds, logprobs: wantsLogprobs ? pendingLogprobs : null, promptLogprobs: pendingPromptLogprobs },
        );
        if (chunk === null) return;
        if (Array.isArray(chunk)) for (const c of chunk) sse.send(c);
        else sse.send(chunk);
        pendingIds = [];
        pendingLogprobs = [];
        pendingPromptLogprobs = null;
        if (delta.finishReason === null) return;
        remaining--;
        if (remaining > 0) return;
        ended = true;
        if (req.includeUsage) sse.send(format.usage(usageOf(specs, generations)));
        sse.done();
      },
      onError(error) {
        if (ended) return;
        ended = true;
        for (const g of generations) g.cancel();
        if (opened === null && !reply.raw.headersSent) {
          reply.raw.writeHead(error.status, { "content-type": "application/json; charset=utf-8" });
          reply.raw.end(JSON.stringify(error.toBody()));
          return;
        }
        sse.sendError(error.toBody());
        sse.done();
      },
    });
    generations.push(generation);
  });
  reply.raw.on("close", () => {
    if (reply.raw.writableEnded) return;
    ended = true;
    for (const g of generations) g.cancel();
  });
  // A client that left while its prompt was tokenized: its close event has passed already.
  if (reply.raw.destroyed) ended = true;
  for (const generation of generations) {
    if (ended) break;
    generation.start();
  }
}
