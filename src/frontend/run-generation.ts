// The two ways an endpoint delivers a generation: collected into one JSON
// body, or streamed as SSE chunks. Both abort the engine request when the
// client disconnects before the end.

import { randomUUID } from "node:crypto";
import type { FastifyReply } from "fastify";
import type { EngineRequest } from "../engine/types.js";
import type { FrontendContext } from "./context.js";
import { Generation, type OpenAIFinishReason } from "./generation.js";
import { ApiError, modelNotFound, serviceUnavailable } from "./openai-error.js";
import type { SamplingRequest } from "./request-validation.js";
import { resolveMaxTokens, toEngineRequest } from "./sampling.js";
import { SseStream } from "./sse.js";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface CollectedGeneration {
  text: string;
  tokenIds: number[];
  finishReason: OpenAIFinishReason;
  stopReason: number | null;
  usage: Usage;
}

/** How an endpoint shapes its stream. */
export interface StreamFormat {
  /** Chunks sent before any generated text (chat's role chunk). */
  opening(): object[];
  /** A chunk for text made final by one or more steps; tokenIds are all ids since the last chunk. */
  delta(text: string, tokenIds: number[], finishReason: OpenAIFinishReason | null, stopReason: number | null): object;
  /** The closing usage-only chunk (stream_options.include_usage). */
  usage(usage: Usage): object;
}

export function newRequestId(prefix: "cmpl" | "chatcmpl"): string {
  return `${prefix}-${randomUUID().replaceAll("-", "")}`;
}

export function unixSeconds(): number {
  return Math.floor(Date.now() / 1000);
}

/** 404 for another model's name; a missing model field means the served one. */
export function checkModel(ctx: FrontendContext, model: string | null): void {
  if (model !== null && model !== ctx.servedModelName) throw modelNotFound(model, ctx.servedModelName);
}

export function checkAvailable(ctx: FrontendContext): void {
  const reason = ctx.unavailableReason();
  if (reason !== null) throw serviceUnavailable(reason);
}

/** Validates the length and builds the engine request. */
export function buildEngineRequest(
  ctx: FrontendContext,
  id: string,
  promptIds: number[],
  req: SamplingRequest,
  arrivalMs: number,
): EngineRequest {
  const maxTokens = resolveMaxTokens(req, promptIds.length, ctx.limits);
  return toEngineRequest(id, promptIds, req, maxTokens, ctx.limits, arrivalMs);
}

function usageOf(promptTokens: number, completionTokens: number): Usage {
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
}

export function collectGeneration(
  ctx: FrontendContext,
  engineRequest: EngineRequest,
  skipSpecialTokens: boolean,
  reply: FastifyReply,
): Promise<CollectedGeneration> {
  return new Promise<CollectedGeneration>((resolve, reject) => {
    const parts: string[] = [];
    const tokenIds: number[] = [];
    const session = ctx.detokenizer.session(engineRequest.promptIds, skipSpecialTokens);
    const generation: Generation = new Generation(ctx.engine, ctx.registry, session, engineRequest, {
      onDelta(delta) {
        parts.push(delta.text);
        for (const id of delta.tokenIds) tokenIds.push(id);
        if (delta.finishReason === null) return;
        resolve({
          text: parts.join(""),
          tokenIds,
          finishReason: delta.finishReason,
          stopReason: delta.stopReason,
          usage: usageOf(engineRequest.promptIds.length, generation.completionTokens),
        });
      },
      onError: reject,
    });
    reply.raw.on("close", () => {
      if (reply.raw.writableEnded) return;
      generation.cancel();
      reject(new ApiError(499, "client disconnected", "invalid_request_error"));
    });
    generation.start();
  });
}

/** Streams the generation; the reply is hijacked and ends with `data: [DONE]`. */
export function streamGeneration(
  ctx: FrontendContext,
  engineRequest: EngineRequest,
  skipSpecialTokens: boolean,
  includeUsage: boolean,
  format: StreamFormat,
  reply: FastifyReply,
): void {
  reply.hijack();
  const sse = new SseStream(reply.raw);
  for (const chunk of format.opening()) sse.send(chunk);
  // Ids of steps whose text was held back travel with the next chunk that has text.
  let pendingIds: number[] = [];
  const session = ctx.detokenizer.session(engineRequest.promptIds, skipSpecialTokens);
  const generation: Generation = new Generation(ctx.engine, ctx.registry, session, engineRequest, {
    onDelta(delta) {
      pendingIds = pendingIds.length === 0 ? delta.tokenIds : pendingIds.concat(delta.tokenIds);
      if (delta.text === "" && delta.finishReason === null) return;
      sse.send(format.delta(delta.text, pendingIds, delta.finishReason, delta.stopReason));
      pendingIds = [];
      if (delta.finishReason === null) return;
      if (includeUsage) sse.send(format.usage(usageOf(engineRequest.promptIds.length, generation.completionTokens)));
      sse.done();
    },
    onError(error) {
      sse.sendError(error.toBody());
      sse.done();
    },
  });
  reply.raw.on("close", () => {
    if (!reply.raw.writableEnded) generation.cancel();
  });
  generation.start();
}
