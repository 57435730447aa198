// Property: every valid message survives encode -> decode exactly, and
// re-encoding the decoded message gives the same bytes (the encoding is canonical).

import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { decode, encode } from "../../src/transport/codec.js";
import type {
  AddedRequest,
  ClientChunk,
  NamedValues,
  KvTransfer,
  PassBatch,
  PassResult,
  PromptRequest,
  PromptResult,
  SamplingParams,
  StepTimings,
  WireMessage,
  WireValue,
} from "../../src/transport/messages.js";

// fast-check makes null-prototype objects by default; the codec makes plain ones.
function rec<T>(model: { [K in keyof T]: fc.Arbitrary<T[K]> }): fc.Arbitrary<T> {
  return fc.record(model, { noNullPrototype: true }) as fc.Arbitrary<T>;
}

// Any safe integer: 32-bit ones travel as MessagePack ints, wider ones as float64.
const int = fc.oneof(fc.integer(), fc.integer({ min: -(2 ** 31), max: 2 ** 32 - 1 }), fc.maxSafeInteger());
// -0 is excluded on purpose: its value is the integer 0, so the canonical rule
// sends it as int 0 (a documented, harmless loss of the sign).
const float = fc.oneof(fc.double(), fc.double({ min: -1e3, max: 1e3, noNaN: true }), fc.integer().map((x) => x)).filter((x) => !Object.is(x, -0));
const str = fc.string({ unit: "grapheme", maxLength: 40 });
const i32 = fc.int32Array({ maxLength: 40 });
const f32 = fc.float32Array({ maxLength: 40 });
const u8 = fc.uint8Array({ maxLength: 40 });

const samplingParams: fc.Arbitrary<SamplingParams> = rec({
  temperature: float,
  top_p: float,
  top_k: int,
  min_p: float,
  seed: fc.option(int),
  presence_penalty: float,
  frequency_penalty: float,
  repetition_penalty: float,
  min_tokens: int,
  suppress_token_ids: i32,
  allowed_token_ids: i32,
  logit_bias_ids: i32,
  logit_bias_values: f32,
  logprobs: int,
});

const addedRequest: fc.Arbitrary<AddedRequest> = rec({ req_id: int, token_ids: i32, num_prompt_tokens: int, sampling: samplingParams, prompt_logprobs: int, embeds: int, lora_id: int, positions: int, encoder_states: int, cross_block_ids: i32 });
const timings: fc.Arbitrary<StepTimings> = rec({ prepare_ms: float, forward_ms: float, sample_ms: float });

const strs = fc.array(str, { maxLength: 3 });
const small = <T>(a: fc.Arbitrary<T>): fc.Arbitrary<T[]> => fc.array(a, { maxLength: 3 });
// any: plain data, as a model's kwargs or a chunk's metadata hold it.
const plain = fc.dictionary(fc.string({ maxLength: 8 }), fc.oneof(str, fc.integer(), fc.boolean(), fc.constant(null)), { maxKeys: 3, noNullPrototype: true });
const wireValue: fc.Arbitrary<WireValue> = rec({ form: fc.constantFrom("tokens", "tensor", "empty"), handle: int, worker: int, ids: i32, dtype: str, shape: fc.array(int, { maxLength: 4 }), segment: str, offset: int, nbytes: int });
const namedValues: fc.Arbitrary<NamedValues> = rec({ name: str, values: small(wireValue) });
const passBatch: fc.Arbitrary<PassBatch> = rec({
  batch_id: int,
  node: str,
  walk: str,
  passes: small(
    rec({
      pass_id: int,
      request_id: int,
      inputs: small(namedValues),
      chunks: small(rec({ name: str, index: int, start: int, context_count: int, final: fc.boolean() })),
      request_kwargs: plain,
    }),
  ),
  publish: strs,
});
const promptRequest: fc.Arbitrary<PromptRequest> = rec({ request_id: int, prompt: fc.option(str), input_modalities: strs, output_modalities: strs, kwargs: plain, publish: strs });
const promptResult: fc.Arbitrary<PromptResult> = rec({ request_id: int, error: fc.option(str), values: small(namedValues) });
const clientChunk: fc.Arbitrary<ClientChunk> = rec({ name: str, modality: str, data: u8, metadata: plain });
const passResult: fc.Arbitrary<PassResult> = rec({ pass_id: int, error: fc.option(str), outputs: small(namedValues), client_chunks: small(clientChunk), stops: strs });

const kvTransfer: fc.Arbitrary<KvTransfer> = rec({ transfer_id: int, request_id: int, peer_rank: int, block_ids: i32, num_tokens: int });

const message: fc.Arbitrary<WireMessage> = fc.oneof(
  rec({
    kind: fc.constant("Step" as const),
    step_id: int,
    added: fc.array(addedRequest, { maxLength: 4 }),
    removed: i32,
    req_ids: i32,
    num_new_tokens: i32,
    num_computed: i32,
    new_block_counts: i32,
    new_block_ids: i32,
    sample: u8,
    mask_rows: i32,
    graph: fc.option(rec({ prompts: small(promptRequest), batches: small(passBatch), releases: i32, finished_requests: i32 }), { nil: null }),
    kv: fc.option(rec({ sends: small(kvTransfer), loads: small(kvTransfer), cancels: i32 }), { nil: null }),
    lora: fc.option(rec({ loads: small(rec({ lora_id: int, name: str, path: str })), unloads: i32 }), { nil: null }),
    spec: fc.option(rec({ draft_counts: i32, draft_ids: i32 }), { nil: null }),
  }),
  rec({ kind: fc.constant("StepMask" as const), step_id: int, bitmask: i32 }),
  rec({ kind: fc.constant("Ping" as const), nonce: int }),
  fc.constant({ kind: "Shutdown" as const }),
  rec({
    kind: fc.constant("Ready" as const),
    protocol_version: int,
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    vocab_size: int,
    architecture: str,
    dtype: str,
    device: str,
    worker_pid: int,
    graph: fc.constant({ version: 1, nodes: [] }),
    pooling: fc.option(
      rec({ pooling_type: str, normalize: fc.boolean(), dimensions: int, causal: fc.boolean(), is_matryoshka: fc.boolean(), matryoshka_dimensions: fc.array(int, { maxLength: 4 }), task: str, activation: str }),
    ),
  }),
  rec({
    kind: fc.constant("StepResult" as const),
    step_id: int,
    req_ids: i32,
    token_ids: i32,
    logprobs: fc.option(f32),
    top_counts: fc.option(i32),
    top_ids: fc.option(i32),
    top_logprobs: fc.option(f32),
    timings,
    prompt_results: small(promptResult),
    pass_results: small(passResult),
    prompt_counts: fc.option(i32),
    prompt_logprobs: fc.option(f32),
    prompt_ranks: fc.option(i32),
    prompt_top_ids: fc.option(i32),
    prompt_top_logprobs: fc.option(f32),
    kv_loaded: i32,
    kv_load_failed: i32,
    kv_load_errors: strs,
    kv_bytes: int,
    pooled: fc.option(f32),
    lora_load_failed: i32,
    lora_load_errors: strs,
    token_counts: fc.option(i32),
    draft_counts: fc.option(i32),
    draft_ids: fc.option(i32),
    frames: fc.option(i32),
  }),
  rec({ kind: fc.constant("Pong" as const), nonce: int }),
  rec({ kind: fc.constant("Fatal" as const), message: str }),
);

test("random valid messages round-trip exactly and re-encode to the same bytes", () => {
  fc.assert(
    fc.property(message, (m) => {
      const bytes = encode(m);
      const back = decode(bytes);
      assert.deepStrictEqual(back, m);
      assert.equal(Buffer.compare(encode(back), bytes), 0);
    }),
    { numRuns: 2000 },
  );
});

test("any byte string decodes to a message or throws ProtocolError, never anything else", () => {
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
      try {
        decode(bytes);
      } catch (error) {
        assert.equal((error as Error).name, "ProtocolError", String(error));
      }
    }),
    { numRuns: 5000 },
  );
});

test("corrupting a valid frame gives a message or a ProtocolError", () => {
  fc.assert(
    fc.property(message, fc.nat(), fc.integer({ min: 0, max: 255 }), (m, at, byte) => {
      const bytes = Buffer.from(encode(m));
      bytes[at % bytes.length] = byte;
      try {
        decode(bytes);
      } catch (error) {
        assert.equal((error as Error).name, "ProtocolError", String(error));
      }
    }),
    { numRuns: 3000 },
  );
});
