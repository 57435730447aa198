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
      "overlap": true
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
            logprobs: 5,
          },
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
    },
  },
  ping: { message: "Ping", value: { nonce: 123456 } },
  shutdown: { message: "Shutdown", value: {} },
  ready: {
    message: "Ready",
    value: {
      protocol_version: 2,
      num_blocks: 2048,
      block_size: 16,
      max_model_len: 4096,
      vocab_size: 151936,
      architecture: "Qwen3ForCausalLM",
      dtype: "bfloat16",
      device: "cuda:0",
      worker_pid: 48213,
      graph: LLM_GRAPH,
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
