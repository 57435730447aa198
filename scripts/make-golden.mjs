#!/usr/bin/env node
// Writes protocol/golden/<name>.json and <name>.msgpack: one realistic value
// per message type (plus edge cases of the canonical number rule), encoded by
// the TypeScript codec. Both languages' tests decode every .msgpack, compare it
// with the .json, re-encode it and require identical bytes.
//
//   npx tsc -p tsconfig.json && node scripts/make-golden.mjs          write the files
//   npx tsc -p tsconfig.json && node scripts/make-golden.mjs --check  fail if they are stale
//
// JSON form: {"message": "Step", "value": {...}}, numeric arrays as number
// lists, nil as null. f32[] values are exactly representable in float32.

import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

// The one-node LLM graph as baton_worker.graph.llm exports it (max model length 4096).
const LLM_GRAPH = {
  "version": 1,
  "nodes": [
    {
      "name": "llm",
      "engine": "kv_cache",
      "overlap": true,
      "stop_token_ids": [],
      "kv_inputs": ["embeds", "positions"],
      "frame_width": 0
    }
  ],
  "sections": [
    {
      "kind": "node",
      "node": "llm",
      "inputs": [
        "text_inputs"
      ],
      "outputs": [
        {
          "to": "",
          "name": "new_token",
          "persist": true,
          "new_token": true,
          "modality": "",
          "target_partition": ""
        },
        {
          "to": "emit_to_client",
          "name": "new_token",
          "persist": false,
          "new_token": false,
          "modality": "text",
          "target_partition": ""
        }
      ],
      "accumulated_outputs": [],
      "children": [],
      "loop_name": "",
      "max_iters": 0
    },
    {
      "kind": "loop",
      "node": "",
      "inputs": [],
      "outputs": [],
      "accumulated_outputs": [],
      "children": [
        2
      ],
      "loop_name": "decode_loop",
      "max_iters": 4096
    },
    {
      "kind": "node",
      "node": "llm",
      "inputs": [
        "text_inputs"
      ],
      "outputs": [
        {
          "to": "llm",
          "name": "text_inputs",
          "persist": false,
          "new_token": false,
          "modality": "",
          "target_partition": ""
        },
        {
          "to": "emit_to_client",
          "name": "new_token",
          "persist": false,
          "new_token": false,
          "modality": "text",
          "target_partition": ""
        }
      ],
      "accumulated_outputs": [],
      "children": [],
      "loop_name": "",
      "max_iters": 0
    }
  ],
  "walks": [
    {
      "name": "prefill",
      "partition": "default",
      "root": 0
    },
    {
      "name": "decode",
      "partition": "default",
      "root": 1
    }
  ],
  "partitions": [
    {
      "name": "default",
      "walks": [
        "prefill",
        "decode"
      ],
      "start": {
        "walk": "prefill",
        "inputs": [
          {
            "node": "llm",
            "name": "text_inputs",
            "source": "prompt",
            "source_name": "text_inputs"
          }
        ],
        "release": []
      },
      "after": {
        "prefill": {
          "walk": "decode",
          "inputs": [
            {
              "node": "llm",
              "name": "text_inputs",
              "source": "persist",
              "source_name": "new_token"
            }
          ],
          "release": [
            "new_token"
          ]
        },
        "decode": {
          "walk": "",
          "inputs": [],
          "release": []
        }
      },
      "python_transitions": false
    }
  ],
  "connections": [],
  "client_outputs": [
    {
      "name": "new_token",
      "modality": "text"
    }
  ]
};

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const codecPath = join(root, "dist", "src", "transport", "codec.js");
if (!existsSync(codecPath)) {
  console.error(`make-golden: ${codecPath} is missing; run npx tsc -p tsconfig.json first`);
  process.exit(1);
}
const { encode } = await import(codecPath);
const { fromPlain } = await import(join(root, "dist", "src", "transport", "plain.js"));

const greedy = {
  temperature: 0,
  top_p: 1.0,
  top_k: -1,
  min_p: 0,
  seed: null,
  presence_penalty: 0,
  frequency_penalty: 0,
  repetition_penalty: 1.0,
  min_tokens: 0,
  suppress_token_ids: [],
  allowed_token_ids: [],
  logit_bias_ids: [],
  logit_bias_values: [],
  logprobs: -1,
};

const vectors = {
  // Two new requests (one unseeded, one seeded with top-5 logprobs), two removed
  // ones, and three rows: a decode row, a whole prefill that samples and a
  // chunked prefill that does not.
  step: {
    message: "Step",
    value: {
      step_id: 17,
      added: [
        {
          req_id: 10,
          token_ids: [151644, 872, 198, 9707, 151645],
          num_prompt_tokens: 5,
          sampling: { ...greedy },
          prompt_logprobs: -1,
          embeds: -1,
          lora_id: 0,
          positions: -1,
          encoder_states: -1,
          cross_block_ids: [],
        },
        {
          req_id: 11,
          token_ids: [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198],
          num_prompt_tokens: 12,
          sampling: {
            temperature: 0.7,
            top_p: 0.95,
            top_k: 50,
            min_p: 0.05,
            seed: 42,
            presence_penalty: 0.5,
            frequency_penalty: -0.25,
            repetition_penalty: 1.1,
            min_tokens: 2,
            suppress_token_ids: [151643, 151645],
            allowed_token_ids: [],
            logit_bias_ids: [17, 30, 151645],
            logit_bias_values: [2.5, -100, -0.75],
            logprobs: 5,
          },
          prompt_logprobs: 2,
          embeds: -1,
          lora_id: 0,
          positions: -1,
          encoder_states: -1,
          cross_block_ids: [],
        },
      ],
      removed: [3, 9],
      req_ids: [7, 10, 11],
      num_new_tokens: [1, 5, 8],
      num_computed: [23, 0, 0],
      new_block_counts: [1, 1, 2],
      new_block_ids: [40, 41, 42, 43],
      sample: [1, 1, 0],
      mask_rows: [1],
      graph: null,
      kv: null,
      lora: null,
      spec: null,
    },
  },
  // KV connector: a step carrying a prefill worker's send, a decode worker's load and a cancel (one message, every field used).
  step_kv: {
    message: "Step",
    value: {
      step_id: 5,
      added: [],
      removed: [],
      req_ids: [],
      num_new_tokens: [],
      num_computed: [],
      new_block_counts: [],
      new_block_ids: [],
      sample: [],
      mask_rows: [],
      graph: null,
      kv: { sends: [{ transfer_id: 3, request_id: 7, peer_rank: 1, block_ids: [12, 13, 14], num_tokens: 40 }], loads: [{ transfer_id: 4, request_id: 8, peer_rank: 0, block_ids: [200, 201], num_tokens: 17 }], cancels: [2] },
      lora: null,
      spec: null,
    },
  },
  // LoRA: a step loading two adapters and unloading one ahead of a row of a request that runs with adapter 2.
  step_lora: {
    message: "Step",
    value: {
      step_id: 9,
      added: [
        {
          req_id: 12,
          token_ids: [151644, 872, 198],
          num_prompt_tokens: 3,
          sampling: { ...greedy },
          prompt_logprobs: -1,
          embeds: -1,
          lora_id: 2,
          positions: -1,
          encoder_states: -1,
          cross_block_ids: [],
        },
      ],
      removed: [],
      req_ids: [12],
      num_new_tokens: [3],
      num_computed: [0],
      new_block_counts: [1],
      new_block_ids: [44],
      sample: [1],
      mask_rows: [],
      graph: null,
      kv: null,
      lora: { loads: [{ lora_id: 2, name: "sql-lora", path: "/models/sql-lora" }, { lora_id: 3, name: "ünï", path: "/tmp/ünï" }], unloads: [1] },
      spec: null,
    },
  },
  // Speculative decoding: row 0 decodes with three drafts after its last token, row 1 with none.
  step_spec: {
    message: "Step",
    value: {
      step_id: 21,
      added: [],
      removed: [],
      req_ids: [7, 8],
      num_new_tokens: [4, 1],
      num_computed: [30, 12],
      new_block_counts: [1, 0],
      new_block_ids: [45],
      sample: [1, 1],
      mask_rows: [],
      graph: null,
      kv: null,
      lora: null,
      spec: { draft_counts: [3, 0], draft_ids: [11, 12, 13] },
    },
  },
  // The mask of step 17's second sampled row, over a 40-token vocabulary: tokens 0, 5, 31 and 39.
  step_mask: {
    message: "StepMask",
    value: { step_id: 17, bitmask: [-2147483615, 128] },
  },
  // A step with no work (engine idle tick / drain): every array empty.
  step_empty: {
    message: "Step",
    value: {
      step_id: 0,
      added: [],
      removed: [],
      req_ids: [],
      num_new_tokens: [],
      num_computed: [],
      new_block_counts: [],
      new_block_ids: [],
      sample: [],
      mask_rows: [],
      graph: null,
      kv: null,
      lora: null,
      spec: null,
    },
  },
  // Canonical numbers at the edges: 2^32-1 is uint32, a seed of 2^33 and
  // -2^31-1 have no 32-bit integer form and travel as float64, -2^31 is int32.
  step_wide_ints: {
    message: "Step",
    value: {
      step_id: 4294967295,
      added: [
        {
          req_id: 2147483647,
          token_ids: [-2147483648, 0, 2147483647],
          num_prompt_tokens: 1,
          sampling: { ...greedy, temperature: 1e-5, top_k: 0, seed: 8589934592, min_tokens: -2147483649, logprobs: 0 },
          prompt_logprobs: 0,
          embeds: 7,
          lora_id: 0,
          positions: 5,
          encoder_states: 9,
          cross_block_ids: [3, 0, 2147483647],
        },
      ],
      removed: [],
      req_ids: [2147483647],
      num_new_tokens: [3],
      num_computed: [0],
      new_block_counts: [1],
      new_block_ids: [0],
      sample: [1],
      mask_rows: [],
      graph: null,
      kv: null,
      lora: null,
      spec: null,
    },
  },
  // Graph work only (a text-to-speech request): a release, a finished request,
  // one prompt to process and a batch of two codec passes over token chunks.
  step_graph: {
    message: "Step",
    value: {
      step_id: 1038,
      added: [],
      removed: [],
      req_ids: [],
      num_new_tokens: [],
      num_computed: [],
      new_block_counts: [],
      new_block_ids: [],
      sample: [],
      mask_rows: [],
      graph: {
        prompts: [{ request_id: 2, prompt: "Hello there.", input_modalities: ["text"], output_modalities: ["audio"], kwargs: { voice: "nova" }, publish: ["hidden"] }],
        batches: [
          {
            batch_id: 9,
            node: "codec",
            walk: "codec_chunk",
            passes: [
              {
                pass_id: 41,
                request_id: 1,
                inputs: [{ name: "new_token", values: [{ form: "tokens", handle: 0, worker: 0, ids: [300, 301, 302, 303], dtype: "", shape: [], segment: "", offset: 0, nbytes: 0 }] }],
                chunks: [{ name: "new_token", index: 3, start: 12, context_count: 12, final: false }],
                request_kwargs: { voice: "nova" },
              },
              {
                pass_id: 42,
                request_id: 3,
                inputs: [{ name: "new_token", values: [{ form: "tensor", handle: 17, worker: 1, ids: [], dtype: "float32", shape: [1, 480], segment: "baton-4242-arena", offset: 1920, nbytes: 1920 }, { form: "empty", handle: 0, worker: 0, ids: [], dtype: "", shape: [], segment: "", offset: 0, nbytes: 0 }] }],
                chunks: [],
                request_kwargs: {},
              },
            ],
            publish: ["audio_chunk"],
          },
        ],
        releases: [5, 6],
        finished_requests: [10],
      },
      kv: null,
      lora: null,
      spec: null,
    },
  },
  ping: { message: "Ping", value: { nonce: 123456 } },
  shutdown: { message: "Shutdown", value: {} },
  ready: {
    message: "Ready",
    value: {
      protocol_version: 4,
      num_blocks: 2048,
      block_size: 16,
      max_model_len: 4096,
      vocab_size: 151936,
      architecture: "Qwen3ForCausalLM",
      dtype: "bfloat16",
      device: "cuda:0",
      worker_pid: 48213,
      graph: LLM_GRAPH,
      pooling: null,
    },
  },
  // A pooling model: a BERT encoder, mean pooling, normalized, Matryoshka lengths 16 and 32.
  ready_pooling: {
    message: "Ready",
    value: {
      protocol_version: 10,
      num_blocks: 8192,
      block_size: 16,
      max_model_len: 512,
      vocab_size: 30522,
      architecture: "BertModel",
      dtype: "float32",
      device: "cpu",
      worker_pid: 48214,
      graph: LLM_GRAPH,
      pooling: { pooling_type: "mean", normalize: true, dimensions: 4, causal: false, is_matryoshka: true, matryoshka_dimensions: [16, 32], task: "embed", activation: "identity" },
    },
  },
  // Sampled rows 7 and 10 (row 11 was a chunk), no logprobs asked.
  result: {
    message: "StepResult",
    value: {
      step_id: 17,
      req_ids: [7, 10],
      token_ids: [2585, 13],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0.25, forward_ms: 12.7, sample_ms: 1.0 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: null,
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },
  // KV connector: one load written into the cache (131072 bytes), one failed with its reason.
  result_kv: {
    message: "StepResult",
    value: {
      step_id: 5,
      req_ids: [],
      token_ids: [],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0.25, forward_ms: 0.0, sample_ms: 0.0 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [4],
      kv_load_failed: [2],
      kv_load_errors: ["cancelled: its request ended"],
      kv_bytes: 131072,
      pooled: null,
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },  // LoRA: the step's second load refused, with its one line.
  result_lora: {
    message: "StepResult",
    value: {
      step_id: 9,
      req_ids: [],
      token_ids: [],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0.25, forward_ms: 0.0, sample_ms: 0.0 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: null,
      lora_load_failed: [3],
      lora_load_errors: ["adapter ünï (/tmp/ünï): rank 64 exceeds --max-lora-rank 16"],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },  // Speculative decoding: row 0 accepted two of its three drafts and sampled 40 after them; new proposals for row 0.
  result_spec: {
    message: "StepResult",
    value: {
      step_id: 21,
      req_ids: [7, 8],
      token_ids: [11, 12, 40, 5],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0.25, forward_ms: 0.0, sample_ms: 0.0 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: null,
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: [3, 1],
      draft_counts: [2, 0],
      draft_ids: [41, 42],
      frames: null,
    },
  },
  // Logprobs for both rows, top-2 for the first and none for the second.
  result_logprobs: {
    message: "StepResult",
    value: {
      step_id: 18,
      req_ids: [7, 11],
      token_ids: [11, 151645],
      logprobs: [-0.5, -2.375],
      top_counts: [2, 0],
      top_ids: [11, 17],
      top_logprobs: [-0.5, -1.25],
      timings: { prepare_ms: 0.125, forward_ms: 3, sample_ms: 0.3333333333333333 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: null,
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },
  // Prompt logprobs: row 10 (k = 2) covers two prompt positions, row 11 none;
  // row 7 (k = 0) one position, with no alternatives.
  result_prompt_logprobs: {
    message: "StepResult",
    value: {
      step_id: 19,
      req_ids: [10],
      token_ids: [198],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0.5, forward_ms: 4, sample_ms: 0.25 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: [2, 0, 1],
      prompt_logprobs: [-3.5, -0.125, -7.25],
      prompt_ranks: [12, 1, 301],
      prompt_top_ids: [872, 9707, 198, 872],
      prompt_top_logprobs: [-0.75, -1.5, -0.125, -2.0],
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: null,
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },
  // The answer to step_graph: the prompt's token ids, one pass's audio bytes, one failed pass.
  result_graph: {
    message: "StepResult",
    value: {
      step_id: 1038,
      req_ids: [],
      token_ids: [],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0, forward_ms: 0, sample_ms: 0 },
      prompt_results: [{ request_id: 2, error: null, values: [{ name: "text_inputs", values: [{ form: "tokens", handle: 0, worker: 0, ids: [256, 261, 72, 105, 257], dtype: "", shape: [], segment: "", offset: 0, nbytes: 0 }] }] }],
      pass_results: [
        { pass_id: 41, error: null, outputs: [], client_chunks: [{ name: "audio_chunk", modality: "audio", data: [0, 1, 255, 127], metadata: { output: "audio_chunk", sample_rate: 24000 } }], stops: [] },
        { pass_id: 42, error: "node 'codec': forward: RuntimeError: shape mismatch", outputs: [], client_chunks: [], stops: [] },
      ],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: null,
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },
  // Two rows of a pooling step ended their prompts: their 4-dimensional vectors, in row order.
  result_pooled: {
    message: "StepResult",
    value: {
      step_id: 5,
      req_ids: [3, 9],
      token_ids: [],
      logprobs: null,
      top_counts: null,
      top_ids: null,
      top_logprobs: null,
      timings: { prepare_ms: 0.5, forward_ms: 12.25, sample_ms: 0 },
      prompt_results: [],
      pass_results: [],
      prompt_counts: null,
      prompt_logprobs: null,
      prompt_ranks: null,
      prompt_top_ids: null,
      prompt_top_logprobs: null,
      kv_loaded: [],
      kv_load_failed: [],
      kv_load_errors: [],
      kv_bytes: 0,
      pooled: [0.5, -0.5, 0.5, -0.5, 0.25, 0.75, -0.125, 0.5],
      lora_load_failed: [],
      lora_load_errors: [],
      token_counts: null,
      draft_counts: null,
      draft_ids: null,
      frames: null,
    },
  },
  pong: { message: "Pong", value: { nonce: 123456 } },
  fatal: {
    message: "Fatal",
    value: { message: "unsupported architecture GPT2LMHeadModel in /models/gpt2/config.json — supported: Qwen3ForCausalLM" },
  },
};

const check = process.argv.includes("--check");
let stale = 0;
for (const [name, doc] of Object.entries(vectors)) {
  const json = `${JSON.stringify(doc, null, 2)}\n`;
  const bytes = encode(fromPlain(doc));
  const jsonPath = join(root, "protocol", "golden", `${name}.json`);
  const binPath = join(root, "protocol", "golden", `${name}.msgpack`);
  if (check) {
    const same = existsSync(jsonPath) && existsSync(binPath) && readFileSync(jsonPath, "utf8") === json && Buffer.compare(readFileSync(binPath), bytes) === 0;
    if (!same) {
      console.error(`make-golden: protocol/golden/${name} is stale`);
      stale++;
    }
  } else {
    writeFileSync(jsonPath, json);
    writeFileSync(binPath, bytes);
    console.log(`protocol/golden/${name}.msgpack  ${bytes.length} bytes`);
  }
}
process.exit(stale > 0 ? 1 : 0);
