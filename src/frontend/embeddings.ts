// POST /v1/embeddings on a pooling model (vLLM's and OpenAI's shape): each
// input is one prefill-only engine request (pooled-run.ts), and its pooled
// vector comes back as the request's one output. The vector is the model's
// (pooled and normalized as its directory says); `dimensions` truncates it
// (Matryoshka models only) and re-normalizes it when the model normalizes.

import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { PoolingInfo } from "../transport/messages.js";
import type { FrontendContext } from "./context.js";
import { badRequest } from "./openai-error.js";
import { checkPromptLength, integerField, priorityOf, runPooled, truncationLength } from "./pooled-run.js";
import { checkAvailable, checkModel, unixSeconds } from "./run-generation.js";

const KNOWN_FIELDS = new Set(["model", "input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens", "add_special_tokens", "priority"]);

interface EmbeddingRequest {
  model: string | null;
  /** Texts, or token-id lists, one per embedding. */
  inputs: (string | number[])[];
  /** What each input is called in error messages: `input` when the client sent one, else `input[i]`. */
  params: string[];
  encoding: "float" | "base64";
  dimensions: number | null;
  /** Keep only the last k tokens of each input (truncate_prompt_tokens; -1 is the model's maximum length); null: no truncation. */
  keepTokens: number | null;
  addSpecialTokens: boolean;
  priority: number;
  ignoredFields: string[];
}

interface EmbeddingData {
  object: "embedding";
  index: number;
  embedding: number[] | string;
}

function isTokenList(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((t) => typeof t === "number");
}

/** Checks the body's shape (OpenAI's rules for `input`); what depends on the model is checked later. */
function parseEmbeddingRequest(raw: unknown, ctx: FrontendContext): EmbeddingRequest {
  const vocabSize = ctx.vocabSize;
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw badRequest("the request body must be a JSON object");
  const body = raw as Record<string, unknown>;
  if (body.model !== undefined && body.model !== null && typeof body.model !== "string") throw badRequest("model must be a string", "model");
  const input = body.input;
  let inputs: (string | number[])[];
  if (typeof input === "string") inputs = [input];
  else if (isTokenList(input) && input.length > 0) inputs = [input];
  else if (Array.isArray(input) && input.length > 0 && input.every((x) => typeof x === "string")) inputs = input as string[];
  else if (Array.isArray(input) && input.length > 0 && input.every(isTokenList)) inputs = input as number[][];
  else throw badRequest("input must be a string, a list of strings, a list of token ids or a list of token-id lists, and not empty", "input");
  // A string or one token-id list is `input` itself; a list's items are `input[i]`.
  const single = typeof input === "string" || isTokenList(input);
  const params = inputs.map((_, i) => (single ? "input" : `input[${i}]`));
  inputs.forEach((item, i) => {
    const param = params[i] as string;
    if (item.length === 0) throw badRequest(`${param} must not be empty`, param);
    if (typeof item === "string") return;
    const bad = item.findIndex((t) => !Number.isInteger(t) || t < 0 || t >= vocabSize);
    if (bad >= 0) throw badRequest(`${param}[${bad}] (${item[bad]}) is not a token id of this model's vocabulary [0, ${vocabSize})`, param);
  });
  const encoding = body.encoding_format ?? "float";
  if (encoding !== "float" && encoding !== "base64") throw badRequest(`encoding_format must be "float" or "base64", got ${JSON.stringify(encoding)}`, "encoding_format");
  if (body.user !== undefined && body.user !== null && typeof body.user !== "string") throw badRequest("user must be a string", "user");
  const addSpecialTokens = body.add_special_tokens ?? true;
  if (typeof addSpecialTokens !== "boolean") throw badRequest("add_special_tokens must be a boolean", "add_special_tokens");
  return {
    model: (body.model as string | undefined) ?? null,
    inputs,
    params,
    encoding,
    dimensions: integerField(body, "dimensions"),
    keepTokens: truncationLength(ctx, body),
    addSpecialTokens,
    priority: priorityOf(ctx, body),
    ignoredFields: Object.keys(body).filter((key) => !KNOWN_FIELDS.has(key)),
  };
}

/** 400 unless the model allows truncating its vectors to `dimensions` (vLLM's rules and messages). */
function checkDimensions(dimensions: number | null, pooling: PoolingInfo, model: string): void {
  if (dimensions === null) return;
  if (!pooling.is_matryoshka) {
    throw badRequest(`Model "${model}" does not support matryoshka representation, changing output dimensions will lead to poor results.`, "dimensions");
  }
  if (dimensions < 1) throw badRequest("dimensions must be greater than 0", "dimensions");
  if (dimensions > pooling.dimensions) throw badRequest(`dimensions ${dimensions} is more than the model's ${pooling.dimensions}`, "dimensions");
  const allowed = pooling.matryoshka_dimensions;
  if (allowed.length > 0 && !allowed.includes(dimensions)) {
    throw badRequest(`Model "${model}" only supports ${JSON.stringify(allowed)} for matryoshka representation, but got ${dimensions}`, "dimensions");
  }
}

/** The client's vector: truncated to `dimensions` and re-normalized when the model normalizes. */
function outputVector(pooled: Float32Array, dimensions: number | null, normalize: boolean): Float32Array {
  if (dimensions === null || dimensions === pooled.length) return pooled;
  const out = pooled.slice(0, dimensions);
  if (!normalize) return out;
  let sum = 0;
  for (const x of out) sum += x * x;
  // As torch's F.normalize: divide by max(norm, eps).
  const scale = 1 / Math.max(Math.sqrt(sum), 1e-12);
  for (let i = 0; i < out.length; i++) out[i] = (out[i] as number) * scale;
  return out;
}

/** OpenAI's base64 form: the little-endian float32 bytes. */
function base64Vector(vector: Float32Array): string {
  const bytes = Buffer.alloc(vector.length * 4);
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i] as number, i * 4);
  return bytes.toString("base64");
}

/** Tokenized inputs, each checked against the model's length (after truncate_prompt_tokens). */
async function tokenizeInputs(ctx: FrontendContext, req: EmbeddingRequest): Promise<number[][]> {
  const keep = req.keepTokens;
  const prompts: number[][] = [];
  for (const [i, input] of req.inputs.entries()) {
    let ids = typeof input === "string" ? await ctx.tokenizer.encode(input, req.addSpecialTokens) : input;
    if (keep !== null && ids.length > keep) ids = ids.slice(ids.length - keep);
    const param = req.params[i] as string;
    checkPromptLength(ctx, ids, param, param);
    prompts.push(ids);
  }
  return prompts;
}

export async function handleEmbeddings(ctx: FrontendContext, pooling: PoolingInfo, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseEmbeddingRequest(request.body, ctx);
  ctx.noteIgnoredFields("/v1/embeddings", req.ignoredFields);
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  checkDimensions(req.dimensions, pooling, ctx.servedModelName);
  const prompts = await tokenizeInputs(ctx, req);
  const id = `embd-${randomUUID().replaceAll("-", "")}`;
  const pooled = await runPooled(ctx, pooling, { id, prompts, params: req.params, priority: req.priority, arrivalMs }, reply);
  const numTokens = prompts.reduce((sum, p) => sum + p.length, 0);
  const data: EmbeddingData[] = pooled.map((row, index) => {
    const vector = outputVector(row, req.dimensions, pooling.normalize);
    return { object: "embedding", index, embedding: req.encoding === "base64" ? base64Vector(vector) : Array.from(vector) };
  });
  return { id, object: "list", created: unixSeconds(), model: ctx.servedModelName, data, usage: { prompt_tokens: numTokens, total_tokens: numTokens } };
}
