// Request bodies of /v1/completions, /v1/chat/completions and /generate,
// checked with zod schemas. Every error names the parameter (its full path,
// e.g. "messages[0].role" or "stop_token_ids[1]"), so a client sees which one
// is wrong. null means "default" for every optional field (the OpenAI clients
// send it). Unknown fields are ignored, as OpenAI and vLLM do, and named in
// the result (ignoredFields) so the server can log them; known parameters that
// Baton does not implement are refused when they would change the output.

import { z } from "zod";
import { ChatTemplateError, normalizeMessages, type AudioPart, type ImagePart, type TemplateMessage } from "../text/chat-template.js";
import { SPEECH_FORMATS, type SpeechFormat } from "./audio-encoding.js";
import type { ImageGenerationSpec } from "../config/model-dir.js";
import { badRequest, type ApiError } from "./openai-error.js";
import { parseStructuredOutput, type RequestedGrammar } from "./structured-request.js";
import { parseToolRequest, type ToolRequest } from "./tool-request.js";

export interface ValidationLimits {
  /** Token ids must be below this (the model's vocabulary size). */
  vocabSize: number;
  /** The model's image placeholder text (a vision-language model); absent or null: image parts are a 400. */
  imageToken?: string | null;
  /** The model's audio placeholder text (a model that hears); absent or null: audio parts are a 400. */
  audioToken?: string | null;
}

/** The message roles of OpenAI's chat API (vLLM accepts the same). */
const MESSAGE_ROLES: readonly string[] = ["system", "developer", "user", "assistant", "tool", "function"];

/** vLLM's default --max-logprobs. */
const MAX_LOGPROBS = 20;
/** Most generations one request may start (n times the number of prompts). */
const MAX_CHOICES = 128;
/** Most stop strings per request. */
const MAX_STOP_STRINGS = 64;

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
  /** Stop strings, matched on the text. */
  stop: string[];
  includeStopStrInOutput: boolean;
  stopTokenIds: number[];
  ignoreEos: boolean;
  minTokens: number;
  /** OpenAI's logit_bias as [token id, bias] pairs, ids distinct; added to the logits before sampling. */
  logitBias: [number, number][];
  /** vLLM's allowed_token_ids: when not empty, the only tokens that may be sampled. */
  allowedTokenIds: number[];
  /** Choices per prompt. */
  n: number;
  /** -1: none; 0: the sampled token's only; k: also the top k (the worker's SamplingParams.logprobs). */
  logprobs: number;
  stream: boolean;
  includeUsage: boolean;
  returnTokenIds: boolean;
  skipSpecialTokens: boolean;
  user: string | null;
  /** Scheduling priority (vLLM): lower first; 0 by default. */
  priority: number;
  /** Structured output (response_format, structured_outputs, guided_*); null: none. */
  structuredOutput: RequestedGrammar | null;
  /** vLLM's prompt_logprobs: -1 none, k >= 0 the prompt tokens' logprobs with k alternatives each. */
  promptLogprobs: number;
  /** Top-level body fields this endpoint does not know (ignored). */
  ignoredFields: string[];
}

export interface CompletionRequest extends SamplingRequest {
  /** One entry per prompt: text, or token ids given directly. */
  prompts: (string | number[])[];
  echo: boolean;
  /** max_tokens 0 with echo: the prompt comes back (with its logprobs), nothing is generated. */
  echoOnly: boolean;
}

export interface ChatRequest extends SamplingRequest {
  messages: TemplateMessage[];
  /** image_url parts in prompt order; each left its model's placeholder in its message's content. */
  images: ImagePart[];
  /** input_audio / audio_url parts in prompt order, likewise. */
  audios: AudioPart[];
  addGenerationPrompt: boolean;
  continueFinalMessage: boolean;
  chatTemplateKwargs: Record<string, unknown>;
  /** Chat's logprobs flag. */
  wantsLogprobs: boolean;
  /** Chat's top_logprobs (0 when not asked). */
  topLogprobs: number;
  /** vLLM's include_reasoning: false drops reasoning_content (with --reasoning-parser). */
  includeReasoning: boolean;
  /** tools, tool_choice, parallel_tool_calls. */
  tools: ToolRequest;
}

export interface GenerateRequest extends SamplingRequest {
  promptTokenIds: number[] | null;
  prompt: string | null;
}

// ---- schema pieces -------------------------------------------------------

const opt = <T extends z.ZodTypeAny>(schema: T) => schema.nullish();
/** The invalid_type message marks integer fields, so errors say "an integer". */
const INT = "INT";
const int = () => z.number({ invalid_type_error: INT }).int();
const bool = () => z.boolean();

const samplingShape = {
  model: opt(z.string()),
  max_tokens: opt(int().min(1, "at least 1")),
  temperature: opt(z.number().min(0, "at least 0")),
  top_p: opt(z.number().gt(0, "in (0, 1]").max(1, "in (0, 1]")),
  top_k: opt(int().min(-1, "-1 (off), 0 (off) or a positive integer")),
  min_p: opt(z.number().min(0, "in [0, 1]").max(1, "in [0, 1]")),
  seed: opt(int().min(Number.MIN_SAFE_INTEGER, "a safe integer").max(Number.MAX_SAFE_INTEGER - MAX_CHOICES, "a safe integer")),
  presence_penalty: opt(z.number().min(-2, "in [-2, 2]").max(2, "in [-2, 2]")),
  frequency_penalty: opt(z.number().min(-2, "in [-2, 2]").max(2, "in [-2, 2]")),
  repetition_penalty: opt(z.number().gt(0, "greater than 0").max(100, "at most 100")),
  stop: opt(z.union([z.string().min(1, "a non-empty string"), z.array(z.string().min(1, "a non-empty string")).max(MAX_STOP_STRINGS, `a list of at most ${MAX_STOP_STRINGS} strings`)])),
  include_stop_str_in_output: opt(bool()),
  stop_token_ids: opt(z.array(int().min(0, "a token id"))),
  ignore_eos: opt(bool()),
  min_tokens: opt(int().min(0, "at least 0")),
  n: opt(int().min(1, "at least 1").max(MAX_CHOICES, `at most ${MAX_CHOICES}`)),
  best_of: opt(int().min(1, "at least 1")),
  stream: opt(bool()),
  stream_options: opt(
    z.object({
      include_usage: opt(bool()),
      continuous_usage_stats: opt(bool()),
    }),
  ),
  return_token_ids: opt(bool()),
  skip_special_tokens: opt(bool()),
  user: opt(z.string()),
  // vLLM: lower runs first under --scheduling-policy priority; non-zero is refused with fcfs (sampling.ts).
  priority: opt(int()),
  logit_bias: opt(z.record(z.number({ invalid_type_error: "a number" }).min(-100, "in [-100, 100]").max(100, "in [-100, 100]"))),
  allowed_token_ids: opt(z.array(int().min(0, "a token id"))),
  suffix: opt(z.string()),
  response_format: opt(z.object({ type: z.string() }).passthrough()),
  structured_outputs: z.unknown(),
  guided_json: z.unknown(),
  guided_regex: z.unknown(),
  guided_choice: z.unknown(),
  guided_grammar: z.unknown(),
};

const promptLogprobsShape = opt(int().min(0, `in [0, ${MAX_LOGPROBS}]`).max(MAX_LOGPROBS, `in [0, ${MAX_LOGPROBS}]`));

const completionSchema = z.object({
  ...samplingShape,
  // 0 only with echo (checked below): the prompt comes back and nothing is generated.
  max_tokens: opt(int().min(0, "at least 0")),
  prompt: z.unknown(),
  echo: opt(bool()),
  logprobs: opt(int().min(0, `in [0, ${MAX_LOGPROBS}]`).max(MAX_LOGPROBS, `in [0, ${MAX_LOGPROBS}]`)),
  prompt_logprobs: promptLogprobsShape,
});

const chatSchema = z.object({
  ...samplingShape,
  max_completion_tokens: opt(int().min(1, "at least 1")),
  messages: z.unknown(),
  logprobs: opt(bool()),
  top_logprobs: opt(int().min(0, `in [0, ${MAX_LOGPROBS}]`).max(MAX_LOGPROBS, `in [0, ${MAX_LOGPROBS}]`)),
  add_generation_prompt: opt(bool()),
  continue_final_message: opt(bool()),
  chat_template_kwargs: opt(z.record(z.unknown())),
  tools: opt(z.array(z.unknown())),
  functions: opt(z.array(z.unknown())),
  tool_choice: z.unknown(),
  include_reasoning: opt(bool()),
  parallel_tool_calls: opt(bool()),
  prompt_logprobs: promptLogprobsShape,
});

const generateSchema = z.object({
  ...samplingShape,
  prompt: opt(z.string()),
  prompt_token_ids: opt(z.array(int().min(0, "a token id"))),
  logprobs: opt(int().min(0, `in [0, ${MAX_LOGPROBS}]`).max(MAX_LOGPROBS, `in [0, ${MAX_LOGPROBS}]`)),
});

type SamplingBody = z.infer<z.ZodObject<typeof samplingShape>>;

// ---- error formatting -----------------------------------------------------

function describe(value: unknown): string {
  if (value === null) return "null";
  if (value === undefined) return "nothing";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "string") return `the string ${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}...` : value)}`;
  if (typeof value === "object") return "an object";
  return `${typeof value} ${JSON.stringify(value)}`;
}

function paramOf(path: readonly (string | number)[]): string {
  let out = "";
  for (const part of path) out += typeof part === "number" ? `[${part}]` : out === "" ? part : `.${part}`;
  return out;
}

function valueAt(body: unknown, path: readonly (string | number)[]): unknown {
  let value = body;
  for (const part of path) {
    if (typeof value !== "object" || value === null) return undefined;
    value = (value as Record<string | number, unknown>)[part];
  }
  return value;
}

const EXPECTED: Record<string, string> = {
  number: "a number",
  integer: "an integer",
  string: "a string",
  boolean: "a boolean",
  array: "a list",
  object: "an object",
};

/** What a union parameter accepts, for its error message. */
const UNION_EXPECTED: Record<string, string> = {
  stop: "a non-empty string or a list of non-empty strings",
};

function toApiError(issue: z.ZodIssue, body: unknown): ApiError {
  const param = paramOf(issue.path);
  const value = valueAt(body, issue.path);
  switch (issue.code) {
    case "invalid_type": {
      if (issue.received === "undefined") return badRequest(`${param} is required`, param);
      const expected = issue.message === INT ? "an integer" : (EXPECTED[issue.expected] ?? issue.expected);
      return badRequest(`${param} must be ${expected}, got ${describe(value)}`, param);
    }
    case "too_small":
    case "too_big":
      return badRequest(`${param} must be ${issue.message}, got ${typeof value === "number" ? value : describe(value)}`, param);
    case "invalid_union": {
      const top = typeof issue.path[0] === "string" ? issue.path[0] : param;
      return badRequest(`${param} must be ${UNION_EXPECTED[top] ?? "of another type"}, got ${describe(value)}`, param);
    }
    default:
      return badRequest(`${param}: ${issue.message}`, param);
  }
}

/** Top-level keys of the body that the schema does not know. */
export function unknownKeys(schema: z.AnyZodObject, raw: unknown): string[] {
  if (typeof raw !== "object" || raw === null) return [];
  return Object.keys(raw).filter((key) => !(key in schema.shape));
}

export function parseWith<T extends z.ZodTypeAny>(schema: T, raw: unknown): z.infer<T> {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw badRequest(`the request body must be a JSON object, got ${describe(raw)}`);
  }
  const result = schema.safeParse(raw);
  if (!result.success) {
    const issue = result.error.issues[0];
    if (issue) throw toApiError(issue, raw);
    throw badRequest("invalid request body");
  }
  return result.data as z.infer<T>;
}

/** OpenAI's logit_bias: keys are token ids written in decimal ("50256"), each token once. */
function parseLogitBias(bias: Record<string, number> | null | undefined, limits: ValidationLimits): [number, number][] {
  if (bias == null) return [];
  const seen = new Map<number, string>();
  for (const [key, value] of Object.entries(bias)) {
    const param = `logit_bias.${key}`;
    const id = /^\d+$/.test(key) ? Number(key) : NaN;
    if (!Number.isSafeInteger(id) || id >= limits.vocabSize) {
      throw badRequest(`logit_bias keys must be token ids between 0 and ${limits.vocabSize - 1}, got ${JSON.stringify(key)}`, param);
    }
    const earlier = seen.get(id);
    if (earlier !== undefined) throw badRequest(`logit_bias names token ${id} twice (${JSON.stringify(earlier)} and ${JSON.stringify(key)})`, param);
    seen.set(id, key);
  }
  return [...seen.keys()].map((id) => [id, bias[seen.get(id) as string] as number]);
}

function checkTokenIds(ids: readonly number[], param: string, limits: ValidationLimits): void {
  ids.forEach((id, i) => {
    if (id >= limits.vocabSize) throw badRequest(`${param}[${i}] must be a token id between 0 and ${limits.vocabSize - 1}, got ${id}`, `${param}[${i}]`);
  });
}

/** Known parameters that would change the result but are not implemented. */
function refuseUnsupported(body: SamplingBody & { functions?: unknown[] | null }, n: number): void {
  if (body.best_of != null && body.best_of !== n) throw badRequest(`best_of must equal n (${n}); best_of > n is not supported`, "best_of");
  if (body.suffix != null && body.suffix !== "") throw badRequest("suffix is not supported", "suffix");
  if (body.functions != null && body.functions.length > 0) throw badRequest("functions are not supported; use tools", "functions");
}

function parseSampling(
  body: SamplingBody,
  limits: ValidationLimits,
  maxTokens: number | null,
  maxTokensParam: "max_tokens" | "max_completion_tokens",
  logprobs: number,
  ignoredFields: string[],
): SamplingRequest {
  const n = body.n ?? 1;
  refuseUnsupported(body, n);
  const minTokens = body.min_tokens ?? 0;
  if (maxTokens !== null && minTokens > maxTokens) {
    throw badRequest(`min_tokens (${minTokens}) must not exceed ${maxTokensParam} (${maxTokens})`, "min_tokens");
  }
  const stream = body.stream ?? false;
  if (body.stream_options != null && !stream) throw badRequest("stream_options is only allowed when stream is true", "stream_options");
  const stopTokenIds = body.stop_token_ids ?? [];
  checkTokenIds(stopTokenIds, "stop_token_ids", limits);
  const stop = body.stop == null ? [] : typeof body.stop === "string" ? [body.stop] : body.stop;
  const allowedTokenIds = body.allowed_token_ids ?? [];
  if (body.allowed_token_ids != null && allowedTokenIds.length === 0) throw badRequest("allowed_token_ids must not be empty", "allowed_token_ids");
  checkTokenIds(allowedTokenIds, "allowed_token_ids", limits);
  const structuredOutput = parseStructuredOutput(body);
  if (allowedTokenIds.length > 0 && structuredOutput !== null) {
    // Both decide which tokens may come next; their intersection could be empty.
    throw badRequest("allowed_token_ids cannot be combined with structured output", "allowed_token_ids");
  }
  return {
    model: body.model ?? null,
    maxTokens,
    maxTokensParam,
    // OpenAI's default is 1.0; 0 means greedy.
    temperature: body.temperature ?? 1.0,
    topP: body.top_p ?? 1.0,
    topK: body.top_k ?? 0,
    minP: body.min_p ?? 0,
    seed: body.seed ?? null,
    presencePenalty: body.presence_penalty ?? 0,
    frequencyPenalty: body.frequency_penalty ?? 0,
    repetitionPenalty: body.repetition_penalty ?? 1,
    stop,
    includeStopStrInOutput: body.include_stop_str_in_output ?? false,
    stopTokenIds,
    ignoreEos: body.ignore_eos ?? false,
    minTokens,
    logitBias: parseLogitBias(body.logit_bias, limits),
    allowedTokenIds: [...new Set(allowedTokenIds)],
    n,
    logprobs,
    stream,
    includeUsage: stream && body.stream_options?.include_usage === true,
    returnTokenIds: body.return_token_ids ?? false,
    skipSpecialTokens: body.skip_special_tokens ?? true,
    user: body.user ?? null,
    priority: body.priority ?? 0,
    structuredOutput,
    promptLogprobs: -1,
    ignoredFields,
  };
}

/** vLLM's default max_tokens for /v1/completions. */
const COMPLETIONS_DEFAULT_MAX_TOKENS = 16;

function isIdList(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((v) => typeof v === "number");
}

function parsePrompts(prompt: unknown, limits: ValidationLimits): (string | number[])[] {
  if (prompt === undefined || prompt === null) throw badRequest("prompt is required", "prompt");
  if (typeof prompt === "string") return [prompt];
  const expected = "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists";
  if (!Array.isArray(prompt)) throw badRequest(`${expected}, got ${describe(prompt)}`, "prompt");
  if (prompt.length === 0) throw badRequest("prompt must not be empty", "prompt");
  const ids = (list: unknown[], param: string): number[] => {
    list.forEach((id, i) => {
      if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= limits.vocabSize) {
        throw badRequest(`${param}[${i}] must be a token id between 0 and ${limits.vocabSize - 1}, got ${describe(id)}`, `${param}[${i}]`);
      }
    });
    return list as number[];
  };
  if (typeof prompt[0] === "number") return [ids(prompt, "prompt")];
  return prompt.map((entry: unknown, i) => {
    if (typeof entry === "string") return entry;
    if (Array.isArray(entry)) {
      if (entry.length === 0) throw badRequest(`prompt[${i}] must not be empty`, `prompt[${i}]`);
      return ids(entry, `prompt[${i}]`);
    }
    throw badRequest(`prompt[${i}] must be a string or a list of token ids (all entries of one kind), got ${describe(entry)}`, `prompt[${i}]`);
  });
}

export function parseCompletionRequest(raw: unknown, limits: ValidationLimits): CompletionRequest {
  const body = parseWith(completionSchema, raw);
  const prompts = parsePrompts(body.prompt, limits);
  const echo = body.echo ?? false;
  // vLLM: max_tokens 0 with echo returns the prompt alone; one token is generated and dropped.
  const echoOnly = echo && body.max_tokens === 0;
  if (body.max_tokens === 0 && !echo) throw badRequest("max_tokens must be at least 1 (0 is allowed only with echo), got 0", "max_tokens");
  const maxTokens = echoOnly ? 1 : (body.max_tokens ?? COMPLETIONS_DEFAULT_MAX_TOKENS);
  const logprobs = body.logprobs ?? -1;
  const sampling = parseSampling(body, limits, maxTokens, "max_tokens", logprobs, unknownKeys(completionSchema, raw));
  if (prompts.length * sampling.n > MAX_CHOICES) {
    throw badRequest(`n (${sampling.n}) times the number of prompts (${prompts.length}) must be at most ${MAX_CHOICES}`, "n");
  }
  // echo with logprobs scores the prompt too (vLLM: prompt_logprobs defaults to logprobs then).
  const promptLogprobs = body.prompt_logprobs ?? (echo ? logprobs : -1);
  return { ...sampling, promptLogprobs, prompts, echo, echoOnly };
}

export function parseChatRequest(raw: unknown, limits: ValidationLimits): ChatRequest {
  const body = parseWith(chatSchema, raw);
  // max_completion_tokens replaces the deprecated max_tokens; it wins when both are given.
  const useCompletionTokens = body.max_completion_tokens != null;
  const maxTokens = useCompletionTokens ? body.max_completion_tokens! : (body.max_tokens ?? null);
  const wantsLogprobs = body.logprobs ?? false;
  const topLogprobs = body.top_logprobs ?? 0;
  if (topLogprobs > 0 && !wantsLogprobs) throw badRequest("top_logprobs requires logprobs to be true", "top_logprobs");
  const sampling = parseSampling(body, limits, maxTokens, useCompletionTokens ? "max_completion_tokens" : "max_tokens", wantsLogprobs ? topLogprobs : -1, unknownKeys(chatSchema, raw));
  let messages: TemplateMessage[];
  const images: ImagePart[] = [];
  const audios: AudioPart[] = [];
  try {
    messages = normalizeMessages(
      body.messages,
      limits.imageToken != null ? { placeholder: limits.imageToken, found: images } : null,
      limits.audioToken != null ? { placeholder: limits.audioToken, found: audios } : null,
    );
  } catch (error) {
    if (error instanceof ChatTemplateError) throw badRequest(error.message, error.param);
    throw error;
  }
  messages.forEach((message, i) => {
    if (!MESSAGE_ROLES.includes(message.role)) {
      throw badRequest(`messages[${i}].role: unknown role ${JSON.stringify(message.role)} (expected one of ${MESSAGE_ROLES.join(", ")})`, `messages[${i}].role`);
    }
  });
  const addGenerationPrompt = body.add_generation_prompt ?? true;
  const continueFinalMessage = body.continue_final_message ?? false;
  if (continueFinalMessage && addGenerationPrompt) {
    throw badRequest("continue_final_message and add_generation_prompt cannot both be true (set add_generation_prompt to false)", "continue_final_message");
  }
  if (continueFinalMessage && messages[messages.length - 1]?.role !== "assistant") {
    throw badRequest("continue_final_message needs an assistant message last", "messages");
  }
  return {
    ...sampling,
    promptLogprobs: body.prompt_logprobs ?? -1,
    messages,
    images,
    audios,
    addGenerationPrompt,
    continueFinalMessage,
    chatTemplateKwargs: body.chat_template_kwargs ?? {},
    wantsLogprobs,
    topLogprobs,
    includeReasoning: body.include_reasoning ?? true,
    tools: parseToolRequest(body),
  };
}

/** Baton's /generate: prompt_token_ids and/or prompt (text, appended after the ids); stream defaults to true. */
export function parseGenerateRequest(raw: unknown, limits: ValidationLimits): GenerateRequest {
  const withDefault = typeof raw === "object" && raw !== null && !Array.isArray(raw) ? { stream: true, ...raw } : raw;
  const body = parseWith(generateSchema, withDefault);
  const ids = body.prompt_token_ids ?? null;
  if (ids !== null) checkTokenIds(ids, "prompt_token_ids", limits);
  const prompt = body.prompt ?? null;
  if ((ids === null || ids.length === 0) && (prompt === null || prompt === "")) {
    throw badRequest("give prompt_token_ids or prompt (or both)", "prompt_token_ids");
  }
  const sampling = parseSampling(body, limits, body.max_tokens ?? null, "max_tokens", body.logprobs ?? -1, unknownKeys(generateSchema, raw));
  if (sampling.n !== 1) throw badRequest("/generate runs one sequence per request (n must be 1)", "n");
  return { ...sampling, promptTokenIds: ids, prompt };
}

// ---- /v1/audio/speech -----------------------------------------------------

/** OpenAI's limit on the text of one speech request. */
const MAX_SPEECH_INPUT_CHARS = 4096;

export interface SpeechRequest {
  model: string | null;
  input: string;
  voice: string;
  format: SpeechFormat;
  /** null: the model's default (generation_config.json), else 1. */
  temperature: number | null;
  seed: number | null;
  /** null: the model's own cap. */
  maxTokens: number | null;
}

const speechSchema = z.object({
  model: opt(z.string()),
  input: z.string().min(1, "a non-empty string").max(MAX_SPEECH_INPUT_CHARS, `at most ${MAX_SPEECH_INPUT_CHARS} characters`),
  voice: z.string().min(1, "a non-empty string"),
  response_format: opt(z.string()),
  speed: opt(z.number()),
  instructions: opt(z.string()),
  stream_format: opt(z.string()),
  temperature: samplingShape.temperature,
  seed: samplingShape.seed,
  max_tokens: samplingShape.max_tokens,
});

/**
 * OpenAI's speech request plus Baton's `seed`, `temperature` and `max_tokens`.
 * The default format is wav (OpenAI's mp3 is not produced); formats, speeds and
 * options that would change the audio and are not implemented are refused by name.
 */
export function parseSpeechRequest(raw: unknown): SpeechRequest {
  const body = parseWith(speechSchema, raw);
  const format = body.response_format ?? "wav";
  if (!(SPEECH_FORMATS as readonly string[]).includes(format)) {
    throw badRequest(`response_format ${JSON.stringify(format)} is not supported (supported: ${SPEECH_FORMATS.join(", ")})`, "response_format");
  }
  if (body.speed != null && body.speed !== 1) throw badRequest(`speed ${body.speed} is not supported (only 1.0)`, "speed");
  if (body.instructions != null && body.instructions !== "") throw badRequest("instructions are not supported by this model", "instructions");
  if (body.stream_format != null && body.stream_format !== "audio") {
    throw badRequest(`stream_format ${JSON.stringify(body.stream_format)} is not supported (only "audio")`, "stream_format");
  }
  return {
    model: body.model ?? null,
    input: body.input,
    voice: body.voice,
    format: format as SpeechFormat,
    temperature: body.temperature ?? null,
    seed: body.seed ?? null,
    maxTokens: body.max_tokens ?? null,
  };
}

// ---- /v1/images/generations -----------------------------------------------

/** OpenAI's limit on the prompt of one image request (dall-e-3's). */
const MAX_IMAGE_PROMPT_CHARS = 4000;

export interface ImageRequest {
  model: string | null;
  prompt: string;
  n: number;
  /** One of the model's sizes, "WxH". */
  size: string;
  /** null: the server draws one. */
  seed: number | null;
  numInferenceSteps: number;
}

const imageSchema = z.object({
  model: opt(z.string()),
  prompt: z.string().min(1, "a non-empty string").max(MAX_IMAGE_PROMPT_CHARS, `at most ${MAX_IMAGE_PROMPT_CHARS} characters`),
  n: opt(int()),
  size: opt(z.string()),
  response_format: opt(z.string()),
  output_format: opt(z.string()),
  stream: opt(z.boolean()),
  user: opt(z.string()),
  seed: opt(int().min(Number.MIN_SAFE_INTEGER, "a safe integer").max(Number.MAX_SAFE_INTEGER, "a safe integer")),
  num_inference_steps: opt(int()),
});

/**
 * OpenAI's image request plus Baton's `seed` and `num_inference_steps`,
 * checked against the model's own bounds (its config.json image_generation).
 * Only b64_json PNGs are served: `url` responses, other formats and streaming
 * are refused by name.
 */
export function parseImageRequest(raw: unknown, spec: ImageGenerationSpec): ImageRequest {
  const body = parseWith(imageSchema, raw);
  const n = body.n ?? 1;
  if (n < 1 || n > spec.maxN) throw badRequest(`n must be between 1 and ${spec.maxN}, got ${n}`, "n");
  const size = body.size ?? spec.defaultSize;
  if (!spec.sizes.includes(size)) throw badRequest(`size ${JSON.stringify(size)} is not supported by this model (supported: ${spec.sizes.join(", ")})`, "size");
  const format = body.response_format ?? "b64_json";
  if (format !== "b64_json") {
    throw badRequest(`response_format ${JSON.stringify(format)} is not supported: only b64_json is served (this server keeps no image URLs)`, "response_format");
  }
  if (body.output_format != null && body.output_format !== "png") {
    throw badRequest(`output_format ${JSON.stringify(body.output_format)} is not supported (only png)`, "output_format");
  }
  if (body.stream === true) throw badRequest("streaming image generation is not supported", "stream");
  const steps = body.num_inference_steps ?? spec.defaultInferenceSteps;
  if (steps < 1 || steps > spec.maxInferenceSteps) {
    throw badRequest(`num_inference_steps must be between 1 and ${spec.maxInferenceSteps}, got ${steps}`, "num_inference_steps");
  }
  return { model: body.model ?? null, prompt: body.prompt, n, size, seed: body.seed ?? null, numInferenceSteps: steps };
}
