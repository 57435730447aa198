// Endpoints beyond the OpenAI API: vLLM's POST /tokenize, POST /detokenize and
// GET /version (same request and response shapes), and Baton's native
// POST /generate: token ids and/or text in, token ids and text out, as NDJSON
// lines (stream, the default) or one JSON object.

import { readFileSync } from "node:fs";
import type { ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { normalizeMessages, ChatTemplateError, type ImagePart } from "../text/chat-template.js";
import { renderChatPrompt } from "./chat-completions.js";
import { expandImageTokens, loadImages } from "./media.js";
import type { FrontendContext } from "./context.js";
import type { ResolvedLogprob } from "./generation.js";
import { badRequest, type OpenAIErrorBody } from "./openai-error.js";
import { parseGenerateRequest } from "./request-validation.js";
import { attachGrammar, compileRequestGrammar } from "./structured-output.js";
import {
  buildChoices,
  checkAvailable,
  checkModel,
  collectGeneration,
  newRequestId,
  streamGeneration,
  type StreamFormat,
  type StreamWriter,
} from "./run-generation.js";

let cachedVersion: string | null = null;

/** Baton's version, from package.json (dist/src/frontend -> repository root). */
export function batonVersion(): string {
  if (cachedVersion === null) {
    try {
      const pkg = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as { version?: string };
      cachedVersion = pkg.version ?? "unknown";
    } catch {
      cachedVersion = "unknown";
    }
  }
  return cachedVersion;
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "object" ? "an object" : `${typeof value} ${JSON.stringify(value)}`;
}

function asObject(raw: unknown): Record<string, unknown> {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw badRequest(`the request body must be a JSON object, got ${describe(raw)}`);
  return raw as Record<string, unknown>;
}

function zodError(error: z.ZodError): never {
  const issue = error.issues[0];
  const param = issue ? issue.path.map((p) => (typeof p === "number" ? `[${p}]` : p)).join(".").replaceAll(".[", "[") : null;
  throw badRequest(`${param ?? "body"}: ${issue?.message ?? "invalid"}`, param);
}

const tokenizeCompletionSchema = z.object({
  model: z.string().nullish(),
  prompt: z.string({ required_error: "prompt (or messages) is required", invalid_type_error: "must be a string" }),
  add_special_tokens: z.boolean().nullish(),
  return_token_strs: z.boolean().nullish(),
});

const tokenizeChatSchema = z.object({
  model: z.string().nullish(),
  messages: z.unknown(),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  add_special_tokens: z.boolean().nullish(),
  return_token_strs: z.boolean().nullish(),
  chat_template_kwargs: z.record(z.unknown()).nullish(),
});

const detokenizeSchema = z.object({
  model: z.string().nullish(),
  tokens: z.array(z.number({ invalid_type_error: "must be a token id" }).int("must be a token id").min(0, "must be a token id"), {
    required_error: "tokens is required",
    invalid_type_error: "must be a list of token ids",
  }),
});

/** POST /tokenize: {prompt} or {messages}; answers {count, max_model_len, tokens, token_strs}. */
export async function handleTokenize(ctx: FrontendContext, request: FastifyRequest): Promise<unknown> {
  const body = asObject(request.body);
  let ids: number[];
  let returnStrs: boolean;
  if (body.messages !== undefined) {
    const parsed = tokenizeChatSchema.safeParse(body);
    if (!parsed.success) zodError(parsed.error);
    const req = parsed.data;
    checkModel(ctx, req.model ?? null);
    let messages;
    // Image parts become the model's placeholder, expanded below to its image tokens, as chat does.
    const images: ImagePart[] = [];
    try {
      messages = normalizeMessages(req.messages, ctx.vision === null ? null : { placeholder: ctx.vision.imageToken, found: images });
    } catch (error) {
      if (error instanceof ChatTemplateError) throw badRequest(error.message, error.param);
      throw error;
    }
    const addGenerationPrompt = req.add_generation_prompt ?? true;
    const continueFinalMessage = req.continue_final_message ?? false;
    if (addGenerationPrompt && continueFinalMessage) {
      throw badRequest("continue_final_message and add_generation_prompt cannot both be true", "continue_final_message");
    }
    const text = renderChatPrompt(ctx, { messages, addGenerationPrompt, continueFinalMessage, chatTemplateKwargs: req.chat_template_kwargs ?? {} });
    ids = await ctx.tokenizer.encode(text, req.add_special_tokens ?? false);
    if (ctx.vision !== null) ids = expandImageTokens(ids, ctx.vision, images, await loadImages(images, ctx.media)).promptIds;
    returnStrs = req.return_token_strs ?? false;
  } else {
    const parsed = tokenizeCompletionSchema.safeParse(body);
    if (!parsed.success) zodError(parsed.error);
    const req = parsed.data;
    checkModel(ctx, req.model ?? null);
    ids = await ctx.tokenizer.encode(req.prompt, req.add_special_tokens ?? true);
    returnStrs = req.return_token_strs ?? false;
  }
  return {
    count: ids.length,
    max_model_len: ctx.limits.maxModelLen,
    tokens: ids,
    token_strs: returnStrs ? await ctx.tokenStrings.strings(ids) : null,
  };
}

/** POST /detokenize: {tokens} -> {prompt}. */
export async function handleDetokenize(ctx: FrontendContext, request: FastifyRequest): Promise<unknown> {
  const parsed = detokenizeSchema.safeParse(asObject(request.body));
  if (!parsed.success) zodError(parsed.error);
  checkModel(ctx, parsed.data.model ?? null);
  parsed.data.tokens.forEach((id, i) => {
    if (id >= ctx.vocabSize) throw badRequest(`tokens[${i}] must be a token id between 0 and ${ctx.vocabSize - 1}, got ${id}`, `tokens[${i}]`);
  });
  return { prompt: await ctx.tokenizer.decode(parsed.data.tokens, false) };
}

/** NDJSON: one JSON object per line; errors mid-stream are a line {"error": ...}. */
class NdjsonStream implements StreamWriter {
  constructor(private readonly res: ServerResponse) {
    res.writeHead(200, {
      "content-type": "application/x-ndjson",
      "cache-control": "no-cache",
      "x-accel-buffering": "no",
    });
    res.socket?.setNoDelay(true);
  }

  private get open(): boolean {
    return !this.res.writableEnded && !this.res.destroyed;
  }

  send(chunk: object): void {
    if (this.open) this.res.write(`${JSON.stringify(chunk)}\n`);
  }

  sendError(body: OpenAIErrorBody): void {
    this.send(body);
  }

  done(): void {
    if (this.open) this.res.end();
  }
}

function nativeLogprobs(entries: readonly ResolvedLogprob[] | null): object[] | null {
  return entries === null
    ? null
    : entries.map((e) => ({ token_id: e.tokenId, token: e.token, logprob: e.logprob, top: e.top.map((t) => ({ token_id: t.tokenId, token: t.token, logprob: t.logprob })) }));
}

/**
 * POST /generate: {prompt_token_ids?, prompt?, ...sampling parameters, stream?}.
 * The prompt is prompt_token_ids followed by the tokens of prompt (encoded with
 * special tokens only when there are no ids). Streamed lines:
 * {"id", "token_ids", "text", "finish_reason"} (plus "logprobs" when asked,
 * "stop_reason" on the finishing line), then a last line {"id", "usage"}.
 */
export async function handleGenerate(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseGenerateRequest(request.body, { vocabSize: ctx.vocabSize });
  ctx.noteIgnoredFields("/generate", req.ignoredFields);
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  const promptIds = [...(req.promptTokenIds ?? [])];
  if (req.prompt !== null && req.prompt !== "") promptIds.push(...(await ctx.tokenizer.encode(req.prompt, promptIds.length === 0)));
  if (promptIds.length === 0) throw badRequest("the prompt has no tokens", "prompt");
  const id = newRequestId("gen");
  if (req.structuredOutput !== null) await compileRequestGrammar(ctx, req.structuredOutput, req);
  const specs = buildChoices(ctx, id, [promptIds], req, arrivalMs);
  if (req.structuredOutput !== null) attachGrammar(specs, { spec: req.structuredOutput.spec, reasoning: null });

  if (req.stream) {
    const format: StreamFormat = {
      opening: () => [],
      delta(_index, delta) {
        const line: Record<string, unknown> = { id, token_ids: delta.tokenIds, text: delta.text, finish_reason: delta.finishReason };
        if (delta.logprobs) line.logprobs = nativeLogprobs(delta.logprobs);
        if (delta.finishReason !== null) line.stop_reason = delta.stopReason;
        return line;
      },
      // The last line: {"id", "usage"}.
      usage: (usage) => ({ id, usage }),
    };
    streamGeneration(ctx, specs, { ...req, includeUsage: true }, format, reply, (res) => new NdjsonStream(res));
    return reply;
  }
  const result = await collectGeneration(ctx, specs, req, reply);
  const choice = result.choices[0];
  if (!choice) throw new Error("generation produced no result");
  return {
    id,
    model: ctx.servedModelName,
    prompt_token_ids: promptIds,
    token_ids: choice.tokenIds,
    text: choice.text,
    finish_reason: choice.finishReason,
    stop_reason: choice.stopReason,
    logprobs: nativeLogprobs(choice.logprobs),
    usage: result.usage,
  };
}
