// Wire messages between the engine core and the model worker.
// Field names and order mirror protocol/schema.json exactly; the codec checks
// these types against that file at start-up, and test/transport tests pin them.

export const PROTOCOL_VERSION = 1;

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
  logprobs: number;
}

export interface AddedRequest {
  req_id: number;
  token_ids: Int32Array;
  num_prompt_tokens: number;
  sampling: SamplingParams;
}

export interface StepTimings {
  prepare_ms: number;
  forward_ms: number;
  sample_ms: number;
}

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
}

export interface PingMessage {
  kind: "Ping";
  nonce: number;
}

export interface ShutdownMessage {
  kind: "Shutdown";
}

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
}

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
}

export interface PongMessage {
  kind: "Pong";
  nonce: number;
}

export interface FatalMessage {
  kind: "Fatal";
  message: string;
}

export type EngineToWorkerMessage = StepMessage | PingMessage | ShutdownMessage;
export type WorkerToEngineMessage = ReadyMessage | StepResultMessage | PongMessage | FatalMessage;
export type WireMessage = EngineToWorkerMessage | WorkerToEngineMessage;

/** A message that does not match the schema; `field` names where decoding stopped. */
export class ProtocolError extends Error {
  constructor(
    message: string,
    readonly field: string,
  ) {
    super(message);
    this.name = "ProtocolError";
  }
}
