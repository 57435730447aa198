// Shared helpers for the worker tests: tiny model directories, process checks,
// and builders for valid steps.

import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { SamplingParams, StepMessage } from "../../src/transport/messages.js";
import type { WorkerOptions } from "../../src/worker/types.js";
import { samplingOf } from "../../src/frontend/sampling.js";

export function tempDir(tag: string): string {
  return mkdtempSync(join(tmpdir(), `baton-worker-test-${tag}-`));
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

/** A model directory with only config.json: enough for --load-format dummy-null. */
export function nullModelDir(config: Record<string, unknown> = {}): string {
  const dir = tempDir("model");
  const base = { architectures: ["Qwen3ForCausalLM"], vocab_size: 128, max_position_embeddings: 256 };
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...base, ...config }));
  return dir;
}

export function nullWorkerOptions(modelDir: string, overrides: Partial<WorkerOptions> = {}): WorkerOptions {
  return {
    modelDir,
    blockSize: 16,
    numBlocks: 64,
    dtype: "float32",
    device: "cpu",
    seed: 0,
    loadFormat: "dummy-null",
    forwardOutput: false,
    startTimeoutMs: 60_000,
    ...overrides,
  };
}

/** True while pid names a live (non-zombie) process. */
export function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    // Field 3 of /proc/PID/stat is the state; Z is an exited, unreaped process.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Pids of live processes whose command line contains `needle` (e.g. a unique model dir). */
export function processesMatching(needle: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8").replaceAll("\0", " ");
      if (cmdline.includes(needle) && isRunning(Number(entry))) pids.push(Number(entry));
    } catch {
      // Gone between readdir and read.
    }
  }
  return pids;
}

export async function waitUntil(condition: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export const greedy: SamplingParams = samplingOf(0, null);

/** The fields of a step that carries no graph work and no KV transfer. */
const NO_GRAPH_WORK = { graph: null, kv: null, lora: null, spec: null } satisfies Partial<StepMessage>;

/** A step that adds one request and prefills all of its prompt into fresh blocks. */
export function prefillStep(stepId: number, reqId: number, prompt: number[], firstBlock: number, sampling: SamplingParams = greedy): StepMessage {
  const blocks = Math.ceil(prompt.length / 16);
  return {
    kind: "Step",
    step_id: stepId,
    added: [{ req_id: reqId, token_ids: Int32Array.from(prompt), num_prompt_tokens: prompt.length, sampling, prompt_logprobs: -1, embeds: -1, lora_id: 0, positions: -1, encoder_states: -1, cross_block_ids: new Int32Array(0) }],
    removed: new Int32Array(0),
    req_ids: Int32Array.from([reqId]),
    num_new_tokens: Int32Array.from([prompt.length]),
    num_computed: Int32Array.from([0]),
    new_block_counts: Int32Array.from([blocks]),
    new_block_ids: Int32Array.from({ length: blocks }, (_, i) => firstBlock + i),
    sample: Uint8Array.from([1]),
    ...NO_GRAPH_WORK,
    mask_rows: new Int32Array(0),
  };
}

/** One decode token for a request whose first `computed` tokens are in the cache (no new block needed). */
export function decodeStep(stepId: number, reqId: number, computed: number, removed: number[] = []): StepMessage {
  return {
    kind: "Step",
    step_id: stepId,
    added: [],
    removed: Int32Array.from(removed),
    req_ids: Int32Array.from([reqId]),
    num_new_tokens: Int32Array.from([1]),
    num_computed: Int32Array.from([computed]),
    new_block_counts: Int32Array.from([0]),
    new_block_ids: new Int32Array(0),
    sample: Uint8Array.from([1]),
    ...NO_GRAPH_WORK,
    mask_rows: new Int32Array(0),
  };
}
