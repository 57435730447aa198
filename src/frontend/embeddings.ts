// POST /v1/embeddings on a pooling model (vLLM's and OpenAI's shape): each
// input is one prefill-only engine request through its session (admission,
// metrics, the live registry, abort when the client leaves), and its pooled
// vector comes back as the request's one output. The vector is the model's
// (pooled and normalized as its directory says); `dimensions` truncates it
// (Matryoshka models only) and re-normalizes it when the model normalizes.

import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import { RequestRejectedError } from "../engine/engine-core.js";
import { poolingTraits } from "../engine/pooling.js";
import type { EngineRequest, RequestId, RequestOutput } from "../engine/types.js";
import type { PoolingInfo, SamplingParams } from "../transport/messages.js";
import type { FrontendContext } from "./context.js";
import { ApiError, badRequest, serverError, serviceUnavailable } from "./openai-error.js";
import type { SessionOwner } from "./request-session.js";
import { checkAvailable, checkModel, unixSeconds } from "./run-generation.js";
import { samplingOf } from "./sampling.js";

const KNOWN_FIELDS = new Set(["model", "input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens", "add_special_tokens", "priority"]);

/** A pooling request samples nothing; the worker reads none of this. */
const NO_SAMPLING: SamplingParams = samplingOf(0, null);

interface EmbeddingRequest {
  model: string | null;
  /** Texts, or token-id lists, one per embedding. */
  inputs: (string | number[])[];
  /** What each input is called in error messages: `input` when the client sent one, else `input[i]`. */
  params: string[];
  encoding: "float" | "base64";
  dimensions: number | null;
  /** Keep only the last k tokens of each input; -1: the model's maximum length; null: no truncation. */
  truncatePromptTokens: number | null;
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

function integerField(body: Record<string, unknown>, name: string): number | null {
  const value = body[name];
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isInteger(value)) throw badRequest(`${name} must be an integer`, name);
  return value;
}

/** Checks the body's shape (OpenAI's rules for `input`); what depends on the model is checked later. */
function parseEmbeddingRequest(raw: unknown, vocabSize: number): EmbeddingRequest {
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
  const truncate = integerField(body, "truncate_prompt_tokens");
  if (truncate !== null && truncate < -1) throw badRequest("truncate_prompt_tokens must be -1 (the model's maximum length) or a positive token count", "truncate_prompt_tokens");
  return {
    model: (body.model as string | undefined) ?? null,
    inputs,
    params,
    encoding,
    dimensions: integerField(body, "dimensions"),
    truncatePromptTokens: truncate === 0 ? null : truncate,
    addSpecialTokens,
    priority: integerField(body, "priority") ?? 0,
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

/** One input's engine request, as its session sees it. */
class PoolingRun implements SessionOwner {
  private done = false;

  constructor(
    readonly id: RequestId,
    readonly name: string,
    private readonly onResult: (output: RequestOutput) => void,
    private readonly onError: (error: ApiError) => void,
  ) {}

  fail(error: ApiError): void {
    if (this.done) return;
    this.done = true;
    this.onError(error);
  }

  output(output: RequestOutput): void {
    if (this.done) return;
    this.done = true;
    if (output.pooled !== undefined) this.onResult(output);
    else if (output.finishReason === "abort") this.onError(serviceUnavailable(output.error ?? "the request was aborted by the engine"));
    else this.onError(output.errorStatus === 400 ? badRequest(output.error ?? "bad input") : serverError(output.error ?? "the engine failed while pooling"));
  }

  get finished(): boolean {
    return this.done;
  }
}

/** Tokenized inputs, each checked against the model's length (after truncate_prompt_tokens). */
async function tokenizeInputs(ctx: FrontendContext, req: EmbeddingRequest): Promise<number[][]> {
  const maxLen = ctx.limits.maxModelLen;
  const keep = req.truncatePromptTokens === -1 ? maxLen : req.truncatePromptTokens;
  if (keep !== null && keep > maxLen) {
    throw badRequest(`truncate_prompt_tokens (${keep}) cannot be greater than the model's maximum length ${maxLen}`, "truncate_prompt_tokens");
  }
  const prompts: number[][] = [];
  for (const [i, input] of req.inputs.entries()) {
    let ids = typeof input === "string" ? await ctx.tokenizer.encode(input, req.addSpecialTokens) : input;
    if (keep !== null && ids.length > keep) ids = ids.slice(ids.length - keep);
    const param = req.params[i] as string;
    if (ids.length === 0) throw badRequest(`${param} must not be empty (it has no tokens)`, param);
    if (ids.length > maxLen) {
      throw badRequest(
        `This model's maximum context length is ${maxLen} tokens. However, ${param} has ${ids.length} tokens. Please reduce the length of the input, or set truncate_prompt_tokens.`,
        param,
      );
    }
    prompts.push(ids);
  }
  return prompts;
}

export async function handleEmbeddings(ctx: FrontendContext, pooling: PoolingInfo, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseEmbeddingRequest(request.body, ctx.vocabSize);
  ctx.noteIgnoredFields("/v1/embeddings", req.ignoredFields);
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  checkDimensions(req.dimensions, pooling, ctx.servedModelName);
  if (req.priority !== 0 && ctx.limits.schedulingPolicy !== "priority") {
    throw badRequest("priority is only allowed with --scheduling-policy priority", "priority");
  }
  const prompts = await tokenizeInputs(ctx, req);
  const id = `embd-${randomUUID().replaceAll("-", "")}`;
  const traits = poolingTraits(pooling);
  const vectors = await new Promise<Float32Array[]>((resolve, reject) => {
    const results: Float32Array[] = [];
    let remaining = prompts.length;
    let settled = false;
    const runs: PoolingRun[] = [];
    const fail = (error: ApiError): void => {
      if (settled) return;
      settled = true;
      // The others are no longer wanted: their engine requests are aborted.
      for (const run of runs) if (!run.finished) run.fail(error);
      reject(error);
    };
    const end = (run: PoolingRun, engineDone: boolean): void => ctx.sessions.end(run, engineDone);
    prompts.forEach((promptIds, k) => {
      const run: PoolingRun = new PoolingRun(
        ctx.sessions.newId(),
        prompts.length === 1 ? id : `${id}-${k}`,
        (output) => {
          end(run, true);
          results[k] = outputVector(output.pooled as Float32Array, req.dimensions, pooling.normalize);
          if (--remaining === 0 && !settled) {
            settled = true;
            resolve(results);
          }
        },
        (error) => {
          end(run, false);
          fail(error);
        },
      );
      runs.push(run);
    });
    reply.raw.on("close", () => {
      if (!reply.raw.writableEnded) fail(new ApiError(499, "client disconnected", "invalid_request_error"));
    });
    // A client that left while its inputs were tokenized: its close event has passed already.
    if (reply.raw.destroyed) fail(new ApiError(499, "client disconnected", "invalid_request_error"));
    runs.forEach((run, k) => {
      if (settled) return;
      const engineRequest: EngineRequest = {
        id: run.id,
        promptIds: prompts[k] as number[],
        sampling: NO_SAMPLING,
        stop: { maxTokens: 1, eosTokenIds: [], stopTokenIds: [], ignoreEos: true, minTokens: 0 },
        priority: req.priority,
        arrivalMs,
        pooling: traits,
      };
      try {
        ctx.sessions.submitText(run, engineRequest, (output) => run.output(output));
      } catch (error) {
        const param = req.params[k] as string;
        // A request the engine can never run (too long for the encoder's step) is the client's to fix.
        if (error instanceof RequestRejectedError) fail(badRequest(`${param}: ${error.message.replace(/^request \d+: /, "")}`, param));
        else fail(serverError(`the engine refused the request: ${(error as Error).message}`));
      }
    });
  });
  const numTokens = prompts.reduce((sum, p) => sum + p.length, 0);
  const data: EmbeddingData[] = vectors.map((vector, index) => ({
    object: "embedding",
    index,
    embedding: req.encoding === "base64" ? base64Vector(vector) : Array.from(vector),
  }));
  return { id, object: "list", created: unixSeconds(), model: ctx.servedModelName, data, usage: { prompt_tokens: numTokens, total_tokens: numTokens } };
}
