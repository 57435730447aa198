// The message interface between the frontend and the engine core: submit,
// abort, and the outputs (the core hands them out a step at a time:
// outputs.ts; the frontend's handle delivers them per request).
// The engine core speaks token ids only; text lives in the frontend.

import type { RequestGrammar } from "../structured/answer-phase.js";
import type { PoolingTraits } from "./pooling.js";
import type { ReadyMessage, SamplingParams, StepMaskMessage, StepMessage, StepResultMessage } from "../transport/messages.js";

export type FinishReason = "stop" | "length" | "abort" | "error";

export interface StopConditions {
  /** Maximum number of generated tokens. */
  maxTokens: number;
  /** EOS ids from generation_config.json / config.json; ignored when ignoreEos. */
  eosTokenIds: number[];
  /** Extra ids that end the request (the OpenAI/vLLM `stop_token_ids`). */
  stopTokenIds: number[];
  ignoreEos: boolean;
  /** No stop condition but length applies before this many tokens. */
  minTokens: number;
}

/**
 * A request's one id, from the frontend's session to the worker: assigned at
 * submit (RequestSessions.newId), unique among live requests, an int32 so it
 * is also the request's name on the wire (AddedRequest.req_id, Step.req_ids,
 * graph work) and between the threads.
 */
export type RequestId = number;

export interface EngineRequest {
  id: RequestId;
  promptIds: number[];
  sampling: SamplingParams;
  stop: StopConditions;
  /** Lower value runs first under the priority policy (vLLM semantics). */
  priority: number;
  /** performance.now() at arrival. */
  arrivalMs: number;
  /** Structured output: the grammar its answer must follow (compiled by the frontend first); absent or null: none. */
  grammar?: RequestGrammar | null;
  /**
   * -1 or absent: no prompt logprobs. k >= 0: the log-probability of every
   * prompt token after the first, with the k most likely tokens at each
   * position. Such a request computes its whole prompt (no prefix-cache hit).
   */
  promptLogprobs?: number;
  /** Prefill/decode disaggregation (src/kv-connector): the request's part in a KV transfer; absent: none. */
  kvTransfer?: KvTransferParams;
  /**
   * A vision-language prompt: where each image's tokens sit and a hash of the
   * image's bytes (block hashes of the blocks covering them include it, so the
   * same text with another image never hits the prefix cache there); the
   * images' bytes for the worker's preprocessing, each named by its place in
   * the request (messages[0].content[1]) for error messages.
   */
  media?: PromptMedia | null;
  /** The handle (in the kv_cache node's worker) of the image features that replace the image tokens' embeddings; set by the graph engine. */
  embedsHandle?: number;
  /** A tensor in the worker's store with the prompt's multimodal rotary positions (AddedRequest.positions). */
  positionsHandle?: number;
  /**
   * An encoder-decoder model's request (Whisper): the handle of the encoder's
   * output [numCrossTokens, hidden] in the kv_cache node's worker, whose
   * cross-attention K/V the request holds in numCrossTokens positions of
   * blocks of its own (AddedRequest.encoder_states / cross_block_ids); set by the graph engine.
   */
  encoderStatesHandle?: number;
  numCrossTokens?: number;
  /**
   * A frame model's request (CSM): every sampled position is a frame of this
   * many ids (StepResult.frames), of which the token is codebook 0 only, so
   * blocks past the prompt are never cached; absent or 0: a token model.
   */
  frameWidth?: number;
  /**
   * 53-bit hash of prompt inputs the token ids do not show (a voice prompt's
   * reference audio): the root of every block hash, as an audio prompt's own
   * hash is; absent or 0: none.
   */
  inputHash?: number;
  /**
   * A pooling model's request (an embedding): prefill only, no token is
   * sampled; its one output carries the prompt's pooled vector. Set exactly
   * when the worker is a pooling model (poolingTraits of its Ready.pooling).
   */
  pooling?: PoolingTraits | null;
  /** The LoRA adapter it runs with (an id the engine loaded); 0 or absent: the base model. */
  loraId?: number;
}

/** One image's run of tokens in a prompt. */
export interface MediaSpan {
  /** Position of its first token. */
  offset: number;
  length: number;
  /** 53-bit hash of the image's bytes. */
  hash: number;
}

export interface PromptMedia {
  spans: MediaSpan[];
  images: Uint8Array[];
  /** Where each image came from in the request (for error messages). */
  params: string[];
  /** An audio prompt (a transcription's file): its bytes, decoded by the worker, and their 53-bit hash. */
  audio?: PromptAudio;
  /** A chat's audio parts (a model that hears): their bytes, decoded by the worker, and where each came from. */
  clips?: { data: Uint8Array; param: string }[];
  /**
   * Where the worker expands the prompt's placeholders (VisionPrompt.expandsInWorker): a 53-bit hash
   * of every image and clip in order, the root of the request's block hashes once the engine takes
   * the worker's ids (the spans' offsets no longer hold then).
   */
  hash?: number;
}

interface PromptAudio {
  data: Uint8Array;
  /** Where it came from in the request (the multipart field), for error messages. */
  param: string;
  /**
   * 53-bit hash of the bytes and of what else the worker reads with them (the
   * window's offset): every KV block of the request hashes it in, since a
   * decoder's every layer attends the audio.
   */
  hash: number;
  /** Where the window the worker encodes starts, in the model's units (Whisper: mel frames; long-form audio); 0: the start. */
  offset: number;
}

/**
 * producer (the prefill side): a request that ends on length keeps its KV
 * blocks, to be sent to the decode side, until the engine's owner releases
 * them (EngineCore.releaseHeld). consumer (the decode side): the KV of the
 * first `numTokens` tokens is loaded from `remoteBlockIds` on the worker of
 * rank `peerRank` instead of computed; a failed load falls back to computing it.
 */
export type KvTransferParams =
  | { role: "producer" }
  | { role: "consumer"; peerRank: number; remoteBlockIds: readonly number[]; numTokens: number };

export interface TokenLogprob {
  tokenId: number;
  logprob: number;
  top: { tokenId: number; logprob: number }[];
}

/** A prompt token's log-probability: its rank among all tokens (1 = most likely) and the top alternatives. */
export interface PromptTokenLogprob extends TokenLogprob {
  rank: number;
}

/**
 * Where a finished request's time went (vLLM's request phases), measured in
 * the engine's own clock: queue = submitted to first scheduled, prefill =
 * first scheduled to first token, decode = first to last token, inference =
 * first scheduled to last token. Milliseconds.
 */
export interface RequestTiming {
  queueMs: number;
  prefillMs: number;
  decodeMs: number;
  inferenceMs: number;
}

export interface RequestOutput {
  requestId: RequestId;
  /** Tokens generated by this step (usually one). */
  newTokenIds: number[];
  /** One entry per new token when the request asked for logprobs. */
  logprobs: TokenLogprob[] | null;
  finished: boolean;
  finishReason: FinishReason | null;
  /** The stop token that ended the request (EOS or a stop token id), if any. */
  stopTokenId: number | null;
  /** Prompt tokens served from the prefix cache (0 until prefix caching lands). */
  numCachedTokens: number;
  /** Set with finishReason "error". */
  error: string | null;
  /** With an error: 400 when the request's own input was refused before it ran (an image that does not decode), 503 when its worker died; absent otherwise. */
  errorStatus?: number;
  /**
   * With the first generated token of a request that asked for prompt
   * logprobs: one entry per prompt token after the first (prompt token i + 1
   * is entry i). Absent on every other output.
   */
  promptLogprobs?: PromptTokenLogprob[];
  /** On the final output of a request that produced a token (or its pooled vector); absent otherwise. */
  timing?: RequestTiming;
  /** A pooling request's one output: the prompt's vector (as the model pools and normalizes it). */
  pooled?: Float32Array;
  /**
   * On a graph text request's first output: the integer values its model's
   * process_prompt returned that no walk reads, by name (a transcription's
   * decoded sample count). Absent on every other output.
   */
  promptInfo?: Record<string, number[]>;
  /** A frame model's output: the frame of each of newTokenIds, flattened (EngineRequest.frameWidth ids each). */
  frames?: Int32Array;
}

export type OutputCallback = (output: RequestOutput) => void;

/** What the frontend holds of an engine (in this thread or its own): submit and abort, by request id. */
export interface EngineHandle {
  submit(req: EngineRequest, onOutput: OutputCallback): void;
  /**
   * Frees the request's resources; its last output says "abort". `reason`
   * "stop" tells observers the frontend ended it on a stop string (a normal
   * finish, counted as vLLM counts it), not that the client left.
   */
  abort(requestId: RequestId, reason?: "stop"): void;
}

export interface SchedulerConfig {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
  blockSize: number;
  numBlocks: number;
  /** --max-loras: most distinct LoRA adapters among the running requests (a step's rows); 0 or absent: LoRA off. */
  maxLoras?: number;
  /** --speculative-config's num_speculative_tokens: most draft tokens a decode row verifies; 0 or absent: off. */
  numSpeculativeTokens?: number;
}
