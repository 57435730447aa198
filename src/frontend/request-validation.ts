// Request bodies of /v1/completions and /v1/chat/completions, checked field by
// field. Every check names the parameter, so a client sees which one is wrong.
// null means "default" for every optional field (the OpenAI clients send it).
// Parameters Baton does not implement yet are refused, never silently ignored,
// when they would change the output (stop strings, logprobs, n > 1, ...).

import { ChatTemplateError, normalizeMessages, type TemplateMessage } from "../text/chat-template.js";
import { badRequest } from "./openai-error.js";

export interface ValidationLimits {
  /** Token ids must be below this (the model's vocabulary size). */
  vocabSize: number;
}

export interface SamplingRequest {
  model: string | null;
  /** null: as many as fit in the context. */
  maxTokens: number | null;
  /** Which parameter gave maxTokens, for error messages. */
  maxTokensParam: "max_tokens" | "max_completion_tokens";
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  seed: number | null;
  presencePenalty: number;
  frequencyPenalty: number;
  repetitionPenalty: number;
  stopTokenIds: number[];
  ignoreEos: boolean;
  minTokens: number;
  stream: boolean;
  includeUsage: boolean;
  returnTokenIds: boolean;
  skipSpecialTokens: boolean;
}

export interface CompletionRequest extends SamplingRequest {
  /** Text, or token ids given directly. */
  prompt: string | number[];
}

export interface ChatRequest extends SamplingRequest {
  messages: TemplateMessage[];
  addGenerationPrompt: boolean;
  chatTemplateKwargs: Record<string, unknown>;
}

type Body = Record<string, unknown>;

function asBody(body: unknown): Body {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest("the request body must be a JSON object");
  }
  return body as Body;
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return typeof value === "string" ? `the string ${JSON.stringify(value).slice(0, 40)}` : `${typeof value} ${JSON.stringify(value)?.slice(0, 40)}`;
}

function optionalBoolean(body: Body, name: string, fallback: boolean): boolean {
  const value = body[name];
  if (value === undefined || value === null) return fallback;
  if (typeof value !== "boolean") throw badRequest(`${name} must be a boolean, got ${describe(value)}`, name);
  return value;
}

function optionalNumber(body: Body, name: string, fallback: number, check: (n: number) => boolean, range: string): number {
  const value = body[name];
  if (value === undefined || value === null) return fallback;
  if (typeof value !== "number" || !Number.isFinite(value)) throw badRequest(`${name} must be a number, got ${describe(value)}`, name);
  if (!check(value)) throw badRequest(`${name} must be ${range}, got ${value}`, name);
  return value;
}

function optionalInteger(body: Body, name: string, check: (n: number) => boolean, range: string): number | null {
  const value = body[name];
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isSafeInteger(value)) throw badRequest(`${name} must be an integer, got ${describe(value)}`, name);
  if (!check(value)) throw badRequest(`${name} must be ${range}, got ${value}`, name);
  return value;
}

function tokenIds(value: unknown, name: string, limits: ValidationLimits): number[] {
  if (!Array.isArray(value)) throw badRequest(`${name} must be a list of token ids, got ${describe(value)}`, name);
  value.forEach((id: unknown, i) => {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= limits.vocabSize) {
      throw badRequest(`${name}[${i}] must be a token id between 0 and ${limits.vocabSize - 1}, got ${describe(id)}`, name);
    }
  });
  return value as number[];
}

/** Fields that would change the result but are not implemented yet. */
function refuseUnsupported(body: Body): void {
  const stop = body.stop;
  if (stop !== undefined && stop !== null && !(Array.isArray(stop) && stop.length === 0)) {
    throw badRequest("stop strings are not supported yet; use stop_token_ids", "stop");
  }
  const n = body.n;
  if (n !== undefined && n !== null && n !== 1) throw badRequest("only n = 1 is supported", "n");
  const bestOf = body.best_of;
  if (bestOf !== undefined && bestOf !== null && bestOf !== 1) throw badRequest("only best_of = 1 is supported", "best_of");
  const logprobs = body.logprobs;
  if (logprobs !== undefined && logprobs !== null && logprobs !== false) throw badRequest("logprobs are not supported yet", "logprobs");
  const topLogprobs = body.top_logprobs;
  if (topLogprobs !== undefined && topLogprobs !== null && topLogprobs !== 0) {
    throw badRequest("top_logprobs are not supported yet", "top_logprobs");
  }
  if (body.echo === true) throw badRequest("echo is not supported", "echo");
  if (body.suffix !== undefined && body.suffix !== null) throw badRequest("suffix is not supported", "suffix");
  const logitBias = body.logit_bias;
  if (logitBias !== undefined && logitBias !== null && !(typeof logitBias === "object" && Object.keys(logitBias).length === 0)) {
    throw badRequest("logit_bias is not supported yet", "logit_bias");
  }
  for (const name of ["tools", "functions"]) {
    const value = body[name];
    if (value !== undefined && value !== null && !(Array.isArray(value) && value.length === 0)) {
      throw badRequest(`${name} are not supported yet`, name);
    }
  }
}

function parseSampling(body: Body, limits: ValidationLimits, maxTokensName: "max_tokens" | "max_completion_tokens"): SamplingRequest {
  refuseUnsupported(body);
  const model = body.model;
  if (model !== undefined && model !== null && typeof model !== "string") {
    throw badRequest(`model must be a string, got ${describe(model)}`, "model");
  }
  const maxTokens = optionalInteger(body, maxTokensName, (n) => n >= 1, "at least 1");
  const minTokens = optionalInteger(body, "min_tokens", (n) => n >= 0, "at least 0") ?? 0;
  if (maxTokens !== null && minTokens > maxTokens) {
    throw badRequest(`min_tokens (${minTokens}) must not exceed ${maxTokensName} (${maxTokens})`, "min_tokens");
  }
  const stream = optionalBoolean(body, "stream", false);
  let includeUsage = false;
  const streamOptions = body.stream_options;
  if (streamOptions !== undefined && streamOptions !== null) {
    if (!stream) throw badRequest("stream_options is only allowed when stream is true", "stream_options");
    if (typeof streamOptions !== "object" || Array.isArray(streamOptions)) {
      throw badRequest(`stream_options must be an object, got ${describe(streamOptions)}`, "stream_options");
    }
    const include = (streamOptions as Body).include_usage;
    if (include !== undefined && include !== null && typeof include !== "boolean") {
      throw badRequest(`stream_options.include_usage must be a boolean, got ${describe(include)}`, "stream_options.include_usage");
    }
    includeUsage = include === true;
  }
  const stopTokenIdsRaw = body.stop_token_ids;
  const stopTokenIds = stopTokenIdsRaw === undefined || stopTokenIdsRaw === null ? [] : tokenIds(stopTokenIdsRaw, "stop_token_ids", limits);
  return {
    model: typeof model === "string" ? model : null,
    maxTokens,
    maxTokensParam: maxTokensName,
    // OpenAI's default is 1.0; 0 means greedy.
    temperature: optionalNumber(body, "temperature", 1.0, (n) => n >= 0, "at least 0"),
    topP: optionalNumber(body, "top_p", 1.0, (n) => n > 0 && n <= 1, "in (0, 1]"),
    topK: optionalInteger(body, "top_k", (n) => n >= -1, "-1 (off), 0 (off) or a positive integer") ?? 0,
    minP: optionalNumber(body, "min_p", 0, (n) => n >= 0 && n <= 1, "in [0, 1]"),
    seed: optionalInteger(body, "seed", () => true, "an integer"),
    presencePenalty: optionalNumber(body, "presence_penalty", 0, (n) => n >= -2 && n <= 2, "in [-2, 2]"),
    frequencyPenalty: optionalNumber(body, "frequency_penalty", 0, (n) => n >= -2 && n <= 2, "in [-2, 2]"),
    repetitionPenalty: optionalNumber(body, "repetition_penalty", 1, (n) => n > 0, "greater than 0"),
    stopTokenIds,
    ignoreEos: optionalBoolean(body, "ignore_eos", false),
    minTokens,
    stream,
    includeUsage,
    returnTokenIds: optionalBoolean(body, "return_token_ids", false),
    skipSpecialTokens: optionalBoolean(body, "skip_special_tokens", true),
  };
}

export function parseCompletionRequest(raw: unknown, limits: ValidationLimits): CompletionRequest {
  const body = asBody(raw);
  const sampling = parseSampling(body, limits, "max_tokens");
  let prompt = body.prompt;
  if (prompt === undefined || prompt === null) throw badRequest("prompt is required", "prompt");
  // A list holding one prompt (string or ids) is the same as that prompt.
  if (Array.isArray(prompt) && prompt.length === 1 && (typeof prompt[0] === "string" || Array.isArray(prompt[0]))) {
    prompt = prompt[0];
  }
  if (Array.isArray(prompt)) {
    if (prompt.length > 0 && (typeof prompt[0] === "string" || Array.isArray(prompt[0]))) {
      throw badRequest("only one prompt per request is supported", "prompt");
    }
    const ids = tokenIds(prompt, "prompt", limits);
    if (ids.length === 0) throw badRequest("prompt must not be empty", "prompt");
    return { ...sampling, prompt: ids };
  }
  if (typeof prompt !== "string") {
    throw badRequest(`prompt must be a string or a list of token ids, got ${describe(prompt)}`, "prompt");
  }
  return { ...sampling, prompt };
}

export function parseChatRequest(raw: unknown, limits: ValidationLimits): ChatRequest {
  const body = asBody(raw);
  // max_completion_tokens replaces the deprecated max_tokens; it wins when both are given.
  const hasCompletionTokens = body.max_completion_tokens !== undefined && body.max_completion_tokens !== null;
  const sampling = parseSampling(body, limits, hasCompletionTokens ? "max_completion_tokens" : "max_tokens");
  let messages: TemplateMessage[];
  try {
    messages = normalizeMessages(body.messages);
  } catch (error) {
    if (error instanceof ChatTemplateError) throw badRequest(error.message, error.param);
    throw error;
  }
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== "object" || Array.isArray(kwargs))) {
    throw badRequest(`chat_template_kwargs must be an object, got ${describe(kwargs)}`, "chat_template_kwargs");
  }
  return {
    ...sampling,
    messages,
    addGenerationPrompt: optionalBoolean(body, "add_generation_prompt", true),
    chatTemplateKwargs: (kwargs as Record<string, unknown> | null | undefined) ?? {},
  };
}
