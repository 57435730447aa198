// Generated from protocol/schema.json by scripts/gen-protocol.mjs — do not edit.
// Change the schema and run `node scripts/gen-protocol.mjs` (npm run build does);
// test/transport/generated.test.ts fails while this file is stale.

import type { WireTables } from "./wire-tables.js";

export { ProtocolError } from "./protocol-error.js";

export const PROTOCOL_VERSION = 17;

/**
 * temperature 0 means greedy. top_k 0 or -1 means off. top_p 1 and min_p 0 mean off.
 * seed nil: the worker's global generator; otherwise a per-request generator seeded once, so the output does not depend on the rest of the batch.
 * suppress_token_ids are masked out while the request has fewer than min_tokens output tokens.
 * allowed_token_ids, when not empty, are the only tokens the request may sample (vLLM's allowed_token_ids); logit_bias_values[i] is added to the logit of token logit_bias_ids[i] (OpenAI's logit_bias, ids distinct). Both apply after the raw logprobs are taken and before min_tokens suppression and the penalties.
 */
export interface SamplingParams {
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  seed: number | null;
  presence_penalty: number;
  frequency_penalty: number;
  repetition_penalty: number;
  min_tokens: number;
  suppress_token_ids: Int32Array;
  allowed_token_ids: Int32Array;
  logit_bias_ids: Int32Array;
  logit_bias_values: Float32Array;
  logprobs: number;
}

/**
 * prompt_logprobs: -1 asks for none; k >= 0 asks for the log-probability of every prompt token after the first and the k most likely tokens at each of those positions (StepResult). Raw log-softmax of the model's logits, like SamplingParams.logprobs.
 * embeds: -1, or the handle of a tensor in this worker's store with one row per image-token position of the prompt, in order (a vision-language prompt's image features): those rows replace the token embeddings at those positions whenever they are computed. The worker knows the image token id from its model. A frame model (CSM) takes its prompt this way instead: an int64 tensor [num_prompt_tokens, width + 1], each position's frame (the codebook ids, then a text id), and later positions are the frames it sampled.
 * positions: -1, or the handle of an int64 tensor [3, num_prompt_tokens] in this worker's store: the prompt's multimodal rotary positions (t, h, w streams; the Qwen2-VL family). Every later token's three positions are its index plus max + 1 - num_prompt_tokens (transformers' rope delta).
 * encoder_states / cross_block_ids: an encoder-decoder model's request (Whisper): encoder_states is the handle of a tensor [L, hidden] in this worker's store (the encoder's output for the request) and cross_block_ids the blocks, disjoint from its block table, that hold its cross-attention K/V for positions 0..L-1 (block i: positions [i*block_size, (i+1)*block_size)). The worker computes that K/V when the request is added, before the step's forward pass, and every row of the request attends all L positions. -1 and empty for any other request; the engine allocates and frees those blocks with the request's own.
 */
export interface AddedRequest {
  req_id: number;
  token_ids: Int32Array;
  num_prompt_tokens: number;
  sampling: SamplingParams;
  prompt_logprobs: number;
  embeds: number;
  lora_id: number;
  positions: number;
  encoder_states: number;
  cross_block_ids: Int32Array;
}

export interface StepTimings {
  prepare_ms: number;
  forward_ms: number;
  sample_ms: number;
}

export interface WireValue {
  form: string;
  handle: number;
  worker: number;
  ids: Int32Array;
  dtype: string;
  shape: number[];
  segment: string;
  offset: number;
  nbytes: number;
}

export interface NamedValues {
  name: string;
  values: WireValue[];
}

export interface ChunkPosition {
  name: string;
  index: number;
  start: number;
  context_count: number;
  final: boolean;
}

export interface NodePass {
  pass_id: number;
  request_id: number;
  inputs: NamedValues[];
  chunks: ChunkPosition[];
  request_kwargs: unknown;
}

export interface PassBatch {
  batch_id: number;
  node: string;
  walk: string;
  passes: NodePass[];
  publish: string[];
}

export interface PromptRequest {
  request_id: number;
  prompt: string | null;
  input_modalities: string[];
  output_modalities: string[];
  kwargs: unknown;
  publish: string[];
}

export interface PromptResult {
  request_id: number;
  error: string | null;
  values: NamedValues[];
}

export interface ClientChunk {
  name: string;
  modality: string;
  data: Uint8Array;
  metadata: unknown;
}

export interface KvTransfer {
  transfer_id: number;
  request_id: number;
  peer_rank: number;
  block_ids: Int32Array;
  num_tokens: number;
}

export interface PassResult {
  pass_id: number;
  error: string | null;
  outputs: NamedValues[];
  client_chunks: ClientChunk[];
  stops: string[];
}

export interface GraphWork {
  prompts: PromptRequest[];
  batches: PassBatch[];
  releases: Int32Array;
  finished_requests: Int32Array;
}

export interface PoolingInfo {
  pooling_type: string;
  normalize: boolean;
  dimensions: number;
  causal: boolean;
  is_matryoshka: boolean;
  matryoshka_dimensions: number[];
  task: string;
  activation: string;
}

export interface KvWork {
  sends: KvTransfer[];
  loads: KvTransfer[];
  cancels: Int32Array;
}

export interface LoraLoad {
  lora_id: number;
  name: string;
  path: string;
}

export interface LoraWork {
  loads: LoraLoad[];
  unloads: Int32Array;
}

export interface SpecWork {
  draft_counts: Int32Array;
  draft_ids: Int32Array;
}

/**
 * Steps are executed strictly in step_id order (ids strictly increase); step_id is echoed in the result. A step may carry only graph work (no rows).
 * A request has one id everywhere (req_id, req_ids, request_id, finished_requests): the control plane's request id, unique among live requests.
 * removed: worker drops these requests' state first (finished, aborted or preempted). A preempted request comes back later as a new AddedRequest.
 * added: requests the worker has not seen; token_ids are all tokens known at admission (prompt, plus earlier outputs for a resumed request); the first num_prompt_tokens of them are the prompt (penalties count only the rest and what is sampled later).
 * Rows: req_ids[i] runs num_new_tokens[i] tokens starting at position num_computed[i]; its input tokens are token_ids[num_computed : num_computed + num_new_tokens] of the worker's own token list, which grows by every token the worker samples for it.
 * new_block_counts[i] block ids taken in order from new_block_ids are appended to row i's block table before the row runs. KV for position p lives in block_table[p // block_size] at offset p % block_size.
 * sample[i] = 1: sample one token from the last position of row i and append it to the request's token list.
 * A Step nests by concern: the rows at the top, mask_rows for grammar masks, graph (GraphWork, nil when the step carries none) for the graph runtime, kv (KvWork, nil when none) for the KV connector.
 * Graph work, for a worker hosting graph nodes, in this order: releases (the control plane drops its reference to these tensor handles of this worker's store), finished_requests (these requests ended: nodes drop per-request state), prompts (the model's process_prompt per request), the rows above, then each PassBatch (one batched call of a stateless node of one walk, one NodePass per request).
 * WireValue form: 'tokens' (ids inline), 'tensor' (handle in the store of worker rank `worker`, with dtype and shape) or 'empty' (a signal). ChunkPosition: a streaming input's chunk: index in its stream, start (offset of its first item), context_count (leading items an earlier chunk already held), final.
 * Tensors between workers: PassBatch.publish (PromptRequest.publish) names the outputs (prompt values) a worker of another rank consumes; the producer also copies those tensors into its shared-memory arena and describes the block in the WireValue (file `segment` under /dev/shm, `nbytes` bytes at `offset`; segment '' when not published). The consumer copies the bytes out during its pass; the producer frees the block when the control plane releases the handle, which it does only after every pass reading it has answered. A tensor that does not fit the arena fails its request only.
 * mask_rows: sampled rows (indices among the rows with sample = 1, in row order) whose logits are masked by a grammar before sampling; their masks come in a StepMask with this step_id, which the worker waits for after the forward pass (the engine computes a row's mask only once the token before it is known, so with two steps in flight the forward runs while the mask is made).
 * KV connector (prefill/decode disaggregation): kv.sends (prefill worker) and kv.loads (decode worker) name the same transfer_id, the tag both sides use in the transfer library; block_ids are the sender's source blocks or the receiver's destination blocks, in the same order, covering the first num_tokens positions of request_id. A sender copies its blocks out when the step arrives and sends them asynchronously; a receiver receives them asynchronously and writes them into its cache only after applying the kv.cancels of a later step (transfer ids whose request ended: their blocks may belong to another request now), so a load reported in a StepResult is in the cache before any later step runs.
 * lora (LoraWork, nil when the step carries none): LoRA adapters, loads before anything else in the step (lora_id >= 1 names the PEFT directory at path; a load that fails is answered in StepResult.lora_load_failed / lora_load_errors, one line naming the problem, and that id stays unknown); unloads after the step's removed (no request live after them may use the id). AddedRequest.lora_id is the adapter every row of that request runs with (0: the base model); a step's rows use at most the worker's --max-loras distinct adapters.
 * spec (SpecWork, nil when no row carries drafts): speculative decoding. draft_counts[i] draft tokens, taken in order from draft_ids, follow row i's known tokens: the row runs num_new_tokens[i] = (its tokens from num_computed) + draft_counts[i] positions, the drafts last, and samples (sample[i] = 1) at its last known token and at every draft. The worker verifies the drafts (greedy: a draft is accepted while it equals the token the target samples before it) and appends the accepted drafts and the token sampled after them; KV written for rejected drafts is ignored (those positions are recomputed later). Only rows whose sampling the worker can verify carry drafts.
 */
export interface StepMessage {
  kind: "Step";
  step_id: number;
  added: AddedRequest[];
  removed: Int32Array;
  req_ids: Int32Array;
  num_new_tokens: Int32Array;
  num_computed: Int32Array;
  new_block_counts: Int32Array;
  new_block_ids: Int32Array;
  sample: Uint8Array;
  mask_rows: Int32Array;
  graph: GraphWork | null;
  kv: KvWork | null;
  lora: LoraWork | null;
  spec: SpecWork | null;
}

/**
 * bitmask: len(mask_rows) rows of ceil(vocab_size / 32) words; bit j of word w of row r allows token 32 * w + j for sampled row mask_rows[r] (xgrammar's layout). Every other token's logit becomes -inf before sampling (and before logprobs are taken).
 */
export interface StepMaskMessage {
  kind: "StepMask";
  step_id: number;
  bitmask: Int32Array;
}

export interface PingMessage {
  kind: "Ping";
  nonce: number;
}

export interface ShutdownMessage {
  kind: "Shutdown";
}

/**
 * pooling: nil for a generating model; for a pooling model (--runner pooling) how its prompt becomes one vector. Every request of such a worker is prefill only: the row that reaches the end of its prompt (sample = 1) is pooled instead of sampled (StepResult.pooled). pooling_type: cls (first position), mean (every position) or last (last position) of the last hidden layer; normalize: the vector is L2-normalized; dimensions: its length; causal false: a bidirectional encoder, which needs a request's whole prompt in one row (never chunked, never a prefix-cache hit) and keeps no KV (num_blocks only counts for the scheduler); is_matryoshka / matryoshka_dimensions: the model's config allows truncating the vector (to those lengths only, when listed). task: embed (the vector is an embedding) or classify (a cross-encoder or reranker: the vector is its dimensions logits, /score and /rerank serve it); activation: what turns a classifier's logit into its score, sigmoid or identity (identity for embed).
 * graph: the model's graph of nodes and walks as data (layout in docs/graph-runtime.md; validated and compiled by src/graph/ at start-up). A plain LLM is the one-node graph: node llm, walks prefill and decode.
 */
export interface ReadyMessage {
  kind: "Ready";
  protocol_version: number;
  num_blocks: number;
  block_size: number;
  max_model_len: number;
  vocab_size: number;
  architecture: string;
  dtype: string;
  device: string;
  worker_pid: number;
  graph: unknown;
  pooling: PoolingInfo | null;
}

/**
 * req_ids / token_ids: one entry per sampled row, in row order.
 * logprobs: each token's log-probability, one entry per token of token_ids, nil when no row asked (SamplingParams.logprobs < 0).
 * top_counts[i] entries of top_ids / top_logprobs belong to token i of token_ids (SamplingParams.logprobs > 0 asks for that many).
 * prompt_results: one per prompt request, in order: its values by name (a 1-D integer tensor as 'tokens'; other tensors stay in this worker's store as 'tensor' with one reference, the control plane's), or the error that refuses the request.
 * pass_results: one per pass of every batch, in order: stored outputs by name (one reference each, the control plane's), client_chunks (outputs bound for the client, already postprocessed to bytes), the loops the pass stops, or the error that fails its request.
 * Prompt logprobs (AddedRequest.prompt_logprobs >= 0): prompt_counts has one entry per row of the step (nil when no row asks); row i covers prompt_counts[i] positions p = num_computed[i], num_computed[i] + 1, ..., each with the log-probability of prompt token p + 1 given tokens 0..p. Only positions p < num_prompt_tokens - 1 count (the last prompt position predicts the first output token, which is sampled).
 * prompt_logprobs / prompt_ranks: one entry per such position, rows in order: the prompt token's log-probability and its rank (1 + the number of tokens more likely). prompt_top_ids / prompt_top_logprobs: k entries per position, most likely first, where k = min(AddedRequest.prompt_logprobs, vocab size) of the row's request.
 * token_counts (nil: one token per sampled row): how many of token_ids each sampled row appended, in row order (a row with drafts: its accepted drafts plus one). draft_counts / draft_ids (nil: no proposals): the worker's proposals (speculative decoding, --speculative-config) for each sampled row's next step, draft_counts[i] ids each, in row order; the engine may schedule fewer.
 * frames (nil: none): a frame model's (CSM's) whole frame for each sampled row, width ids a row, in row order (width = len(frames) / len(token_ids)); token_ids then holds what the engine counts and stops on: codebook 0, or the stop id for a stop frame.
 */
export interface StepResultMessage {
  kind: "StepResult";
  step_id: number;
  req_ids: Int32Array;
  token_ids: Int32Array;
  logprobs: Float32Array | null;
  top_counts: Int32Array | null;
  top_ids: Int32Array | null;
  top_logprobs: Float32Array | null;
  timings: StepTimings;
  prompt_results: PromptResult[];
  pass_results: PassResult[];
  prompt_counts: Int32Array | null;
  prompt_logprobs: Float32Array | null;
  prompt_ranks: Int32Array | null;
  prompt_top_ids: Int32Array | null;
  prompt_top_logprobs: Float32Array | null;
  kv_loaded: Int32Array;
  kv_load_failed: Int32Array;
  kv_load_errors: string[];
  kv_bytes: number;
  pooled: Float32Array | null;
  lora_load_failed: Int32Array;
  lora_load_errors: string[];
  token_counts: Int32Array | null;
  draft_counts: Int32Array | null;
  draft_ids: Int32Array | null;
  frames: Int32Array | null;
}

export interface PongMessage {
  kind: "Pong";
  nonce: number;
}

/**
 * The worker cannot go on (for example it cannot load the model); it exits non-zero right after sending this.
 */
export interface FatalMessage {
  kind: "Fatal";
  message: string;
}

/** Messages the engine sends. */
export type EngineToWorkerMessage = StepMessage | StepMaskMessage | PingMessage | ShutdownMessage;
/** Messages the worker sends. */
export type WorkerToEngineMessage = ReadyMessage | StepResultMessage | PongMessage | FatalMessage;
export type WireMessage = EngineToWorkerMessage | WorkerToEngineMessage;

/** Every struct and message in wire order, for the codec (src/transport/codec.ts). */
export const WIRE_TABLES: WireTables = {
  protocolVersion: 17,
  structs: {
    SamplingParams: [
      { name: "temperature", type: { kind: "float", nullable: false, text: "float" } },
      { name: "top_p", type: { kind: "float", nullable: false, text: "float" } },
      { name: "top_k", type: { kind: "int", nullable: false, text: "int" } },
      { name: "min_p", type: { kind: "float", nullable: false, text: "float" } },
      { name: "seed", type: { kind: "int", nullable: true, text: "int?" } },
      { name: "presence_penalty", type: { kind: "float", nullable: false, text: "float" } },
      { name: "frequency_penalty", type: { kind: "float", nullable: false, text: "float" } },
      { name: "repetition_penalty", type: { kind: "float", nullable: false, text: "float" } },
      { name: "min_tokens", type: { kind: "int", nullable: false, text: "int" } },
      { name: "suppress_token_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "allowed_token_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "logit_bias_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "logit_bias_values", type: { kind: "f32[]", nullable: false, text: "f32[]" } },
      { name: "logprobs", type: { kind: "int", nullable: false, text: "int" } },
    ],
    AddedRequest: [
      { name: "req_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "token_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "num_prompt_tokens", type: { kind: "int", nullable: false, text: "int" } },
      { name: "sampling", type: { kind: "struct", struct: "SamplingParams", nullable: false, text: "SamplingParams" } },
      { name: "prompt_logprobs", type: { kind: "int", nullable: false, text: "int" } },
      { name: "embeds", type: { kind: "int", nullable: false, text: "int" } },
      { name: "lora_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "positions", type: { kind: "int", nullable: false, text: "int" } },
      { name: "encoder_states", type: { kind: "int", nullable: false, text: "int" } },
      { name: "cross_block_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
    ],
    StepTimings: [
      { name: "prepare_ms", type: { kind: "float", nullable: false, text: "float" } },
      { name: "forward_ms", type: { kind: "float", nullable: false, text: "float" } },
      { name: "sample_ms", type: { kind: "float", nullable: false, text: "float" } },
    ],
    WireValue: [
      { name: "form", type: { kind: "str", nullable: false, text: "str" } },
      { name: "handle", type: { kind: "int", nullable: false, text: "int" } },
      { name: "worker", type: { kind: "int", nullable: false, text: "int" } },
      { name: "ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "dtype", type: { kind: "str", nullable: false, text: "str" } },
      { name: "shape", type: { kind: "int[]", nullable: false, text: "int[]" } },
      { name: "segment", type: { kind: "str", nullable: false, text: "str" } },
      { name: "offset", type: { kind: "int", nullable: false, text: "int" } },
      { name: "nbytes", type: { kind: "int", nullable: false, text: "int" } },
    ],
    NamedValues: [
      { name: "name", type: { kind: "str", nullable: false, text: "str" } },
      { name: "values", type: { kind: "struct[]", struct: "WireValue", nullable: false, text: "WireValue[]" } },
    ],
    ChunkPosition: [
      { name: "name", type: { kind: "str", nullable: false, text: "str" } },
      { name: "index", type: { kind: "int", nullable: false, text: "int" } },
      { name: "start", type: { kind: "int", nullable: false, text: "int" } },
      { name: "context_count", type: { kind: "int", nullable: false, text: "int" } },
      { name: "final", type: { kind: "bool", nullable: false, text: "bool" } },
    ],
    NodePass: [
      { name: "pass_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "request_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "inputs", type: { kind: "struct[]", struct: "NamedValues", nullable: false, text: "NamedValues[]" } },
      { name: "chunks", type: { kind: "struct[]", struct: "ChunkPosition", nullable: false, text: "ChunkPosition[]" } },
      { name: "request_kwargs", type: { kind: "any", nullable: false, text: "any" } },
    ],
    PassBatch: [
      { name: "batch_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "node", type: { kind: "str", nullable: false, text: "str" } },
      { name: "walk", type: { kind: "str", nullable: false, text: "str" } },
      { name: "passes", type: { kind: "struct[]", struct: "NodePass", nullable: false, text: "NodePass[]" } },
      { name: "publish", type: { kind: "str[]", nullable: false, text: "str[]" } },
    ],
    PromptRequest: [
      { name: "request_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "prompt", type: { kind: "str", nullable: true, text: "str?" } },
      { name: "input_modalities", type: { kind: "str[]", nullable: false, text: "str[]" } },
      { name: "output_modalities", type: { kind: "str[]", nullable: false, text: "str[]" } },
      { name: "kwargs", type: { kind: "any", nullable: false, text: "any" } },
      { name: "publish", type: { kind: "str[]", nullable: false, text: "str[]" } },
    ],
    PromptResult: [
      { name: "request_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "error", type: { kind: "str", nullable: true, text: "str?" } },
      { name: "values", type: { kind: "struct[]", struct: "NamedValues", nullable: false, text: "NamedValues[]" } },
    ],
    ClientChunk: [
      { name: "name", type: { kind: "str", nullable: false, text: "str" } },
      { name: "modality", type: { kind: "str", nullable: false, text: "str" } },
      { name: "data", type: { kind: "u8[]", nullable: false, text: "u8[]" } },
      { name: "metadata", type: { kind: "any", nullable: false, text: "any" } },
    ],
    KvTransfer: [
      { name: "transfer_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "request_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "peer_rank", type: { kind: "int", nullable: false, text: "int" } },
      { name: "block_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "num_tokens", type: { kind: "int", nullable: false, text: "int" } },
    ],
    PassResult: [
      { name: "pass_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "error", type: { kind: "str", nullable: true, text: "str?" } },
      { name: "outputs", type: { kind: "struct[]", struct: "NamedValues", nullable: false, text: "NamedValues[]" } },
      { name: "client_chunks", type: { kind: "struct[]", struct: "ClientChunk", nullable: false, text: "ClientChunk[]" } },
      { name: "stops", type: { kind: "str[]", nullable: false, text: "str[]" } },
    ],
    GraphWork: [
      { name: "prompts", type: { kind: "struct[]", struct: "PromptRequest", nullable: false, text: "PromptRequest[]" } },
      { name: "batches", type: { kind: "struct[]", struct: "PassBatch", nullable: false, text: "PassBatch[]" } },
      { name: "releases", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "finished_requests", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
    ],
    PoolingInfo: [
      { name: "pooling_type", type: { kind: "str", nullable: false, text: "str" } },
      { name: "normalize", type: { kind: "bool", nullable: false, text: "bool" } },
      { name: "dimensions", type: { kind: "int", nullable: false, text: "int" } },
      { name: "causal", type: { kind: "bool", nullable: false, text: "bool" } },
      { name: "is_matryoshka", type: { kind: "bool", nullable: false, text: "bool" } },
      { name: "matryoshka_dimensions", type: { kind: "int[]", nullable: false, text: "int[]" } },
      { name: "task", type: { kind: "str", nullable: false, text: "str" } },
      { name: "activation", type: { kind: "str", nullable: false, text: "str" } },
    ],
    KvWork: [
      { name: "sends", type: { kind: "struct[]", struct: "KvTransfer", nullable: false, text: "KvTransfer[]" } },
      { name: "loads", type: { kind: "struct[]", struct: "KvTransfer", nullable: false, text: "KvTransfer[]" } },
      { name: "cancels", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
    ],
    LoraLoad: [
      { name: "lora_id", type: { kind: "int", nullable: false, text: "int" } },
      { name: "name", type: { kind: "str", nullable: false, text: "str" } },
      { name: "path", type: { kind: "str", nullable: false, text: "str" } },
    ],
    LoraWork: [
      { name: "loads", type: { kind: "struct[]", struct: "LoraLoad", nullable: false, text: "LoraLoad[]" } },
      { name: "unloads", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
    ],
    SpecWork: [
      { name: "draft_counts", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      { name: "draft_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
    ],
  },
  messages: {
    Step: {
      tag: "step",
      from: "engine",
      fields: [
        { name: "step_id", type: { kind: "int", nullable: false, text: "int" } },
        { name: "added", type: { kind: "struct[]", struct: "AddedRequest", nullable: false, text: "AddedRequest[]" } },
        { name: "removed", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "req_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "num_new_tokens", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "num_computed", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "new_block_counts", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "new_block_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "sample", type: { kind: "u8[]", nullable: false, text: "u8[]" } },
        { name: "mask_rows", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "graph", type: { kind: "struct", struct: "GraphWork", nullable: true, text: "GraphWork?" } },
        { name: "kv", type: { kind: "struct", struct: "KvWork", nullable: true, text: "KvWork?" } },
        { name: "lora", type: { kind: "struct", struct: "LoraWork", nullable: true, text: "LoraWork?" } },
        { name: "spec", type: { kind: "struct", struct: "SpecWork", nullable: true, text: "SpecWork?" } },
      ],
    },
    StepMask: {
      tag: "step_mask",
      from: "engine",
      fields: [
        { name: "step_id", type: { kind: "int", nullable: false, text: "int" } },
        { name: "bitmask", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
      ],
    },
    Ping: {
      tag: "ping",
      from: "engine",
      fields: [
        { name: "nonce", type: { kind: "int", nullable: false, text: "int" } },
      ],
    },
    Shutdown: {
      tag: "shutdown",
      from: "engine",
      fields: [],
    },
    Ready: {
      tag: "ready",
      from: "worker",
      fields: [
        { name: "protocol_version", type: { kind: "int", nullable: false, text: "int" } },
        { name: "num_blocks", type: { kind: "int", nullable: false, text: "int" } },
        { name: "block_size", type: { kind: "int", nullable: false, text: "int" } },
        { name: "max_model_len", type: { kind: "int", nullable: false, text: "int" } },
        { name: "vocab_size", type: { kind: "int", nullable: false, text: "int" } },
        { name: "architecture", type: { kind: "str", nullable: false, text: "str" } },
        { name: "dtype", type: { kind: "str", nullable: false, text: "str" } },
        { name: "device", type: { kind: "str", nullable: false, text: "str" } },
        { name: "worker_pid", type: { kind: "int", nullable: false, text: "int" } },
        { name: "graph", type: { kind: "any", nullable: false, text: "any" } },
        { name: "pooling", type: { kind: "struct", struct: "PoolingInfo", nullable: true, text: "PoolingInfo?" } },
      ],
    },
    StepResult: {
      tag: "result",
      from: "worker",
      fields: [
        { name: "step_id", type: { kind: "int", nullable: false, text: "int" } },
        { name: "req_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "token_ids", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "logprobs", type: { kind: "f32[]", nullable: true, text: "f32[]?" } },
        { name: "top_counts", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "top_ids", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "top_logprobs", type: { kind: "f32[]", nullable: true, text: "f32[]?" } },
        { name: "timings", type: { kind: "struct", struct: "StepTimings", nullable: false, text: "StepTimings" } },
        { name: "prompt_results", type: { kind: "struct[]", struct: "PromptResult", nullable: false, text: "PromptResult[]" } },
        { name: "pass_results", type: { kind: "struct[]", struct: "PassResult", nullable: false, text: "PassResult[]" } },
        { name: "prompt_counts", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "prompt_logprobs", type: { kind: "f32[]", nullable: true, text: "f32[]?" } },
        { name: "prompt_ranks", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "prompt_top_ids", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "prompt_top_logprobs", type: { kind: "f32[]", nullable: true, text: "f32[]?" } },
        { name: "kv_loaded", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "kv_load_failed", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "kv_load_errors", type: { kind: "str[]", nullable: false, text: "str[]" } },
        { name: "kv_bytes", type: { kind: "int", nullable: false, text: "int" } },
        { name: "pooled", type: { kind: "f32[]", nullable: true, text: "f32[]?" } },
        { name: "lora_load_failed", type: { kind: "i32[]", nullable: false, text: "i32[]" } },
        { name: "lora_load_errors", type: { kind: "str[]", nullable: false, text: "str[]" } },
        { name: "token_counts", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "draft_counts", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "draft_ids", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
        { name: "frames", type: { kind: "i32[]", nullable: true, text: "i32[]?" } },
      ],
    },
    Pong: {
      tag: "pong",
      from: "worker",
      fields: [
        { name: "nonce", type: { kind: "int", nullable: false, text: "int" } },
      ],
    },
    Fatal: {
      tag: "fatal",
      from: "worker",
      fields: [
        { name: "message", type: { kind: "str", nullable: false, text: "str" } },
      ],
    },
  },
};
