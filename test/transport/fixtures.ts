// Hand-built messages shared by the transport tests.

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createCodec, type Codec } from "../../src/transport/codec.js";
import type { AddedRequest, SamplingParams, StepMessage, StepResultMessage, WireMessage } from "../../src/transport/messages.js";
import { packageRoot } from "../../src/transport/package-root.js";
import { schemaFromTables } from "../../src/transport/schema.js";
import type { WireTables } from "../../src/transport/wire-tables.js";

interface ParsedSchema {
  tables: WireTables;
  defaults: Record<string, Record<string, unknown>>;
}

/** scripts/gen-protocol.mjs as a module: the one parser of schema.json. */
export interface Generator {
  parseSchemaDocument(doc: unknown): ParsedSchema;
  generateTypeScript(parsed: ParsedSchema): string;
  generatePython(parsed: ParsedSchema): string;
  TS_OUT: string;
  PY_OUT: string;
}

export const generatorPath = join(packageRoot, "scripts", "gen-protocol.mjs");
export const generator = (await import(pathToFileURL(generatorPath).href)) as Generator;

/** A message with every str[] and any form, which no real message has yet. */
export interface ProbeMessage {
  kind: "Probe";
  names: string[];
  maybe_names: string[] | null;
  graph: unknown;
  maybe_graph: unknown;
}

/** A codec for a schema holding just Probe (tag "probe"), as gen-protocol parses it. */
export function probeCodec(): Codec {
  const doc = {
    protocol_version: 1,
    structs: {},
    messages: {
      Probe: {
        tag: "probe",
        from: "worker",
        fields: [
          ["names", "str[]"],
          ["maybe_names", "str[]?"],
          ["graph", "any"],
          ["maybe_graph", "any?"],
        ],
      },
    },
  };
  return createCodec(schemaFromTables(generator.parseSchemaDocument(doc).tables));
}

function sampling(overrides: Partial<SamplingParams> = {}): SamplingParams {
  return {
    temperature: 0.7,
    top_p: 0.9,
    top_k: 40,
    min_p: 0,
    seed: null,
    presence_penalty: 0,
    frequency_penalty: 0,
    repetition_penalty: 1.0,
    min_tokens: 0,
    suppress_token_ids: new Int32Array([]),
    allowed_token_ids: new Int32Array([]),
    logit_bias_ids: new Int32Array([]),
    logit_bias_values: new Float32Array([]),
    logprobs: -1,
    ...overrides,
  };
}

function added(reqId: number, tokens: number[], overrides: Partial<SamplingParams> = {}): AddedRequest {
  return { req_id: reqId, token_ids: Int32Array.from(tokens), num_prompt_tokens: tokens.length, sampling: sampling(overrides), prompt_logprobs: -1, embeds: -1, lora_id: 0, positions: -1, encoder_states: -1, cross_block_ids: new Int32Array(0) };
}

export function step(overrides: Partial<StepMessage> = {}): StepMessage {
  return {
    kind: "Step",
    step_id: 3,
    added: [added(1, [5, 6, 7]), added(2, [8, 9], { seed: 1234, logprobs: 2, suppress_token_ids: Int32Array.from([0, 1]), allowed_token_ids: Int32Array.from([3, 8, 9]), logit_bias_ids: Int32Array.from([8, 3]), logit_bias_values: Float32Array.from([2.5, -100]) })],
    removed: Int32Array.from([0]),
    req_ids: Int32Array.from([1, 2]),
    num_new_tokens: Int32Array.from([3, 2]),
    num_computed: Int32Array.from([0, 0]),
    new_block_counts: Int32Array.from([1, 1]),
    new_block_ids: Int32Array.from([4, 5]),
    sample: Uint8Array.from([1, 1]),
    mask_rows: Int32Array.from([1]),
    graph: null,
    kv: null,
    lora: null,
    spec: null,
    ...overrides,
  };
}

export function result(overrides: Partial<StepResultMessage> = {}): StepResultMessage {
  return {
    kind: "StepResult",
    step_id: 3,
    req_ids: Int32Array.from([1, 2]),
    token_ids: Int32Array.from([17, 99]),
    logprobs: Float32Array.from([-0.5, -1.5]),
    top_counts: Int32Array.from([0, 2]),
    top_ids: Int32Array.from([99, 3]),
    top_logprobs: Float32Array.from([-1.5, -2.25]),
    timings: { prepare_ms: 0.2, forward_ms: 4.5, sample_ms: 1 },
    prompt_results: [],
    pass_results: [],
    prompt_counts: Int32Array.from([2, 0]),
    prompt_logprobs: Float32Array.from([-3.5, -0.25]),
    prompt_ranks: Int32Array.from([7, 1]),
    prompt_top_ids: Int32Array.from([17]),
    prompt_top_logprobs: Float32Array.from([-0.125]),
    kv_loaded: new Int32Array(0),
    kv_load_failed: new Int32Array(0),
    kv_load_errors: [],
    kv_bytes: 0,
    pooled: null,
    lora_load_failed: new Int32Array(0),
    lora_load_errors: [],
    token_counts: null,
    draft_counts: null,
    draft_ids: null,
    frames: null,
    ...overrides,
  };
}

export const everyKind: WireMessage[] = [
  step(),
  step({ added: [], removed: new Int32Array(0), req_ids: new Int32Array(0), num_new_tokens: new Int32Array(0), num_computed: new Int32Array(0), new_block_counts: new Int32Array(0), new_block_ids: new Int32Array(0), sample: new Uint8Array(0) }),
  { kind: "Ping", nonce: 77 },
  { kind: "Shutdown" },
  {
    kind: "Ready",
    protocol_version: 1,
    num_blocks: 100,
    block_size: 16,
    max_model_len: 512,
    vocab_size: 1000,
    architecture: "Qwen3ForCausalLM",
    dtype: "float32",
    device: "cpu",
    worker_pid: 4242,
    graph: { version: 1, nodes: [{ name: "llm", engine: "kv_cache", overlap: true }], walks: [] },
    pooling: null,
  },
  {
    kind: "Ready",
    protocol_version: 1,
    num_blocks: 64,
    block_size: 16,
    max_model_len: 512,
    vocab_size: 30522,
    architecture: "BertModel",
    dtype: "float32",
    device: "cpu",
    worker_pid: 4243,
    graph: { version: 1, nodes: [{ name: "llm", engine: "kv_cache", overlap: true }], walks: [] },
    pooling: { pooling_type: "mean", normalize: true, dimensions: 4, causal: false, is_matryoshka: true, matryoshka_dimensions: [2], task: "embed", activation: "identity" },
  },
  result(),
  result({ token_ids: new Int32Array(0), logprobs: null, top_counts: null, top_ids: null, top_logprobs: null, prompt_counts: null, prompt_logprobs: null, prompt_ranks: null, prompt_top_ids: null, prompt_top_logprobs: null, pooled: Float32Array.from([0.5, -0.5, 0.25, 1, 0, 0.125, -2, 3]) }),
  result({ logprobs: null, top_counts: null, top_ids: null, top_logprobs: null }),
  { kind: "Pong", nonce: 77 },
  { kind: "Fatal", message: "cannot load: ünïcödé ✓" },
];
