// From validated OpenAI parameters to what the engine core takes: the wire
// SamplingParams (the worker's sampler) and StopConditions (checked in TS).

import type { EngineRequest, RequestId, StopConditions } from "../engine/types.js";
import type { SamplingParams } from "../transport/messages.js";
import { badRequest } from "./openai-error.js";
import type { SamplingRequest } from "./request-validation.js";

/** Below this temperature sampling is greedy (vLLM's _SAMPLING_EPS). */
const GREEDY_EPSILON = 1e-5;

export interface ModelLimits {
  maxModelLen: number;
  eosTokenIds: readonly number[];
  /** --scheduling-policy; with fcfs (the default) a non-zero request priority is a 400. */
  schedulingPolicy?: "fcfs" | "priority";
}

/**
 * The number of tokens to generate: the requested count, or all the room left
 * in the context. Refuses requests that cannot fit, naming both numbers.
 */
export function resolveMaxTokens(req: SamplingRequest, promptLength: number, limits: ModelLimits): number {
  const { maxModelLen } = limits;
  const param = req.maxTokensParam;
  if (promptLength >= maxModelLen) {
    throw badRequest(
      `This model's maximum context length is ${maxModelLen} tokens. However, your prompt has ${promptLength} tokens, which leaves no room for a completion. Please reduce the length of the prompt.`,
      "prompt",
      "context_length_exceeded",
    );
  }
  if (req.maxTokens === null) return maxModelLen - promptLength;
  if (promptLength + req.maxTokens > maxModelLen) {
    throw badRequest(
      `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${promptLength + req.maxTokens} tokens (${promptLength} in the prompt, ${req.maxTokens} for the completion). Please reduce the length of the prompt or ${param}.`,
      param,
      "context_length_exceeded",
    );
  }
  return req.maxTokens;
}

export function toSamplingParams(req: SamplingRequest, limits: ModelLimits): SamplingParams {
  const greedy = req.temperature < GREEDY_EPSILON;
  // While fewer than min_tokens are out, every token that would stop the request is masked.
  const suppress = req.minTokens > 0 ? [...(req.ignoreEos ? [] : limits.eosTokenIds), ...req.stopTokenIds] : [];
  if (req.allowedTokenIds.length > 0 && req.allowedTokenIds.every((id) => suppress.includes(id))) {
    // Every allowed token would be masked until min_tokens are out: nothing could be sampled.
    throw badRequest(`allowed_token_ids holds only tokens that end the request, which min_tokens (${req.minTokens}) forbids`, "allowed_token_ids");
  }
  return {
    temperature: greedy ? 0 : req.temperature,
    // Greedy ignores the truncation knobs; sending them "off" keeps the worker on its fast path.
    top_p: greedy ? 1 : req.topP,
    top_k: greedy || req.topK === -1 ? 0 : req.topK,
    min_p: greedy ? 0 : req.minP,
    seed: req.seed,
    presence_penalty: req.presencePenalty,
    frequency_penalty: req.frequencyPenalty,
    repetition_penalty: req.repetitionPenalty,
    min_tokens: req.minTokens,
    suppress_token_ids: Int32Array.from(new Set(suppress)),
    allowed_token_ids: Int32Array.from(req.allowedTokenIds),
    logit_bias_ids: Int32Array.from(req.logitBias, ([id]) => id),
    logit_bias_values: Float32Array.from(req.logitBias, ([, bias]) => bias),
    logprobs: req.logprobs,
  };
}

/** A graph request's sampling: its temperature, seed and top-k (0: off), every other knob off (the graph routes take no more). */
export function samplingOf(temperature: number, seed: number | null, topK = 0): SamplingParams {
  return {
    temperature: temperature < GREEDY_EPSILON ? 0 : temperature,
    top_p: 1,
    top_k: topK,
    min_p: 0,
    seed,
    presence_penalty: 0,
    frequency_penalty: 0,
    repetition_penalty: 1,
    min_tokens: 0,
    suppress_token_ids: new Int32Array(0),
    allowed_token_ids: new Int32Array(0),
    logit_bias_ids: new Int32Array(0),
    logit_bias_values: new Float32Array(0),
    logprobs: -1,
  };
}

function toStopConditions(req: SamplingRequest, maxTokens: number, limits: ModelLimits): StopConditions {
  return {
    maxTokens,
    eosTokenIds: [...limits.eosTokenIds],
    stopTokenIds: [...req.stopTokenIds],
    ignoreEos: req.ignoreEos,
    minTokens: Math.min(req.minTokens, maxTokens),
  };
}

export function toEngineRequest(
  id: RequestId,
  promptIds: number[],
  req: SamplingRequest,
  maxTokens: number,
  limits: ModelLimits,
  arrivalMs: number,
): EngineRequest {
  return {
    id,
    promptIds,
    sampling: toSamplingParams(req, limits),
    stop: toStopConditions(req, maxTokens, limits),
    priority: checkedPriority(req, limits),
    arrivalMs,
    promptLogprobs: req.promptLogprobs,
  };
}

/** vLLM: a non-zero priority is an error unless the server runs the priority policy. */
function checkedPriority(req: SamplingRequest, limits: ModelLimits): number {
  if (req.priority !== 0 && limits.schedulingPolicy !== "priority") {
    throw badRequest(`Got priority ${req.priority} but priority scheduling is not enabled (--scheduling-policy priority).`, "priority");
  }
  return req.priority;
}
