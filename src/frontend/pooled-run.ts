// What every pooling route shares: each prompt is one prefill-only engine
// request through its session (admission, metrics, the live registry, abort
// when the client leaves), and its pooled row (an embedding, or a
// classifier's logits) comes back as the request's one output. The routes
// (embeddings.ts, scoring.ts) parse, tokenize and shape the answer.

import type { FastifyReply } from "fastify";
import { RequestRejectedError } from "../engine/engine-core.js";
import { poolingTraits } from "../engine/pooling.js";
import type { EngineRequest, RequestId, RequestOutput } from "../engine/types.js";
import type { PoolingInfo, SamplingParams } from "../transport/messages.js";
import type { FrontendContext } from "./context.js";
import { ApiError, badRequest, serverError, serviceUnavailable } from "./openai-error.js";
import type { SessionOwner } from "./request-session.js";
import { samplingOf } from "./sampling.js";

/** A pooling request samples nothing; the worker reads none of this. */
const NO_SAMPLING: SamplingParams = samplingOf(0, null);

/** The prompts of one HTTP request, ready for the engine. */
export interface PooledPrompts {
  /** The response's id; with several prompts, prompt k's request is `${id}-${k}`. */
  id: string;
  prompts: number[][];
  /** What each prompt is called in error messages (`input[2]`, `documents[0]`). */
  params: string[];
  priority: number;
  arrivalMs: number;
}

export function integerField(body: Record<string, unknown>, name: string): number | null {
  const value = body[name];
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isInteger(value)) throw badRequest(`${name} must be an integer`, name);
  return value;
}

/** truncate_prompt_tokens as a length to keep (-1: the model's maximum length; 0 or absent: none), checked against the model. */
export function truncationLength(ctx: FrontendContext, body: Record<string, unknown>): number | null {
  const truncate = integerField(body, "truncate_prompt_tokens");
  if (truncate === null || truncate === 0) return null;
  if (truncate < -1) throw badRequest("truncate_prompt_tokens must be -1 (the model's maximum length) or a positive token count", "truncate_prompt_tokens");
  const maxLen = ctx.limits.maxModelLen;
  const keep = truncate === -1 ? maxLen : truncate;
  if (keep > maxLen) throw badRequest(`truncate_prompt_tokens (${keep}) cannot be greater than the model's maximum length ${maxLen}`, "truncate_prompt_tokens");
  return keep;
}

/** The request's priority (0 unless --scheduling-policy priority allows another). */
export function priorityOf(ctx: FrontendContext, body: Record<string, unknown>): number {
  const priority = integerField(body, "priority") ?? 0;
  if (priority !== 0 && ctx.limits.schedulingPolicy !== "priority") throw badRequest("priority is only allowed with --scheduling-policy priority", "priority");
  return priority;
}

/** 400 naming the prompt when it is empty or longer than the model takes; `what` says what it is. */
export function checkPromptLength(ctx: FrontendContext, ids: number[], param: string, what: string): void {
  const maxLen = ctx.limits.maxModelLen;
  if (ids.length === 0) throw badRequest(`${what} must not be empty (it has no tokens)`, param);
  if (ids.length > maxLen) {
    throw badRequest(
      `This model's maximum context length is ${maxLen} tokens. However, ${what} has ${ids.length} tokens. Please reduce the length of the input, or set truncate_prompt_tokens.`,
      param,
    );
  }
}

/** One prompt's engine request, as its session sees it. */
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

/** Each prompt's pooled row, in prompt order; the first failure fails them all (the others are aborted). */
export function runPooled(ctx: FrontendContext, pooling: PoolingInfo, job: PooledPrompts, reply: FastifyReply): Promise<Float32Array[]> {
  const traits = poolingTraits(pooling);
  const { prompts } = job;
  return new Promise<Float32Array[]>((resolve, reject) => {
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
    prompts.forEach((_, k) => {
      const run: PoolingRun = new PoolingRun(
        ctx.sessions.newId(),
        prompts.length === 1 ? job.id : `${job.id}-${k}`,
        (output) => {
          end(run, true);
          results[k] = output.pooled as Float32Array;
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
    // A client that left while its prompts were tokenized: its close event has passed already.
    if (reply.raw.destroyed) fail(new ApiError(499, "client disconnected", "invalid_request_error"));
    runs.forEach((run, k) => {
      if (settled) return;
      const engineRequest: EngineRequest = {
        id: run.id,
        promptIds: prompts[k] as number[],
        sampling: NO_SAMPLING,
        stop: { maxTokens: 1, eosTokenIds: [], stopTokenIds: [], ignoreEos: true, minTokens: 0 },
        priority: job.priority,
        arrivalMs: job.arrivalMs,
        pooling: traits,
      };
      try {
        ctx.sessions.submitText(run, engineRequest, (output) => run.output(output));
      } catch (error) {
        const param = job.params[k] as string;
        // A request the engine can never run (too long for the encoder's step) is the client's to fix.
        if (error instanceof RequestRejectedError) fail(badRequest(`${param}: ${error.message.replace(/^request \d+: /, "")}`, param));
        else fail(serverError(`the engine refused the request: ${(error as Error).message}`));
      }
    });
  });
}
