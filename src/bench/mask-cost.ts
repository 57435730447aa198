// `baton bench masks`: what structured output costs per engine step at R
// constrained rows, phase by phase:
// - grammar: the grammar thread feeding each row's new token to its matcher
//   and making its bitmask (what the engine core waits for, off its thread);
// - round trip: the engine core's request to the grammar thread and back;
// - encode: the StepMask's MessagePack encoding (R packed rows);
// - apply: the worker unpacking the bits and masking [R, vocab] logits
//   (python/baton_worker/sampling/token_bitmask.py, on the worker's device).
// Rows decode a JSON schema with nested objects and strings, each step
// taking a random token the mask allows, so they spend most steps inside
// strings (the costliest state to mask) and the rest in structure.

import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { GrammarSpec } from "../structured/grammar-spec.js";
import { GrammarService } from "../structured/grammar-service.js";
import { encode } from "../transport/codec.js";
import { resolvePythonEnv } from "../worker/python-env.js";
import { readModelDir } from "../config/model-dir.js";

const MASK_BENCH_SCHEMA = {
  type: "object",
  properties: {
    log: {
      type: "array",
      items: {
        type: "object",
        properties: { msg: { type: "string" }, level: { enum: ["info", "warn", "error"] }, n: { type: "integer" } },
        required: ["msg", "level", "n"],
        additionalProperties: false,
      },
    },
  },
  required: ["log"],
  additionalProperties: false,
};

export interface MaskCostRow {
  rows: number;
  steps: number;
  /** Per step, ms: p50 and p99. */
  grammar: { p50: number; p99: number };
  roundTrip: { p50: number; p99: number };
  encode: { p50: number; p99: number };
  apply: { p50: number; p99: number };
  /** StepMask bytes per step. */
  bytes: number;
}

function percentiles(values: number[]): { p50: number; p99: number } {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
  return { p50: at(0.5), p99: at(0.99) };
}

function allowedTokens(bits: Int32Array, at: number, words: number): number[] {
  const ids: number[] = [];
  for (let w = 0; w < words; w++) {
    let word = bits[at + w] as number;
    while (word !== 0) {
      const bit = 31 - Math.clz32(word & -word);
      ids.push(w * 32 + bit);
      word &= word - 1;
    }
  }
  return ids;
}

/**
 * The worker's apply time (ms per step, p50/p99) for each row count, in one
 * Python process, on masks the walk produced (`masks[i]`: some steps' packed
 * rows for row count i, cycled through).
 */
function applyTimes(vocab: number, rowCounts: number[], masks: Int32Array[][], steps: number, device: string): { p50: number; p99: number }[] {
  const dir = mkdtempSync(join(tmpdir(), "baton-masks-"));
  try {
    masks.forEach((list, i) => list.forEach((bits, j) => writeFileSync(join(dir, `${i}-${j}.bin`), bits)));
    const script = `
import json, os, time
import numpy as np, torch
from baton_worker.sampling.token_bitmask import apply_token_bitmask
vocab, steps, device, folder = ${vocab}, ${steps}, ${JSON.stringify(device)}, ${JSON.stringify(dir)}
out = []
for i, rows in enumerate(${JSON.stringify(rowCounts)}):
    masks = [np.fromfile(os.path.join(folder, f"{i}-{j}.bin"), dtype="<i4") for j in range(${MASK_SAMPLES})]
    base = torch.randn(rows, vocab, device=device)
    times = []
    for k in range(steps):
        logits = base.clone()
        if device != "cpu":
            torch.cuda.synchronize()
        t = time.perf_counter()
        apply_token_bitmask(logits, np.arange(rows), masks[k % len(masks)])
        if device != "cpu":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    out.append({"p50": times[len(times) // 2], "p99": times[min(len(times) - 1, int(0.99 * len(times)))]})
print(json.dumps(out))
`;
    const { python, env } = resolvePythonEnv();
    const result = spawnSync(python, ["-c", script], { encoding: "utf8", env, maxBuffer: 16 * 1024 * 1024 });
    if (result.status !== 0) throw new Error(`the worker's mask timing failed: ${result.stderr}`);
    return JSON.parse(result.stdout) as { p50: number; p99: number }[];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Steps' masks kept per row count for the worker's timing. */
const MASK_SAMPLES = 10;

export async function runMaskCost(options: { modelDir: string; rows: number[]; steps: number; device: string; regex?: string | null }): Promise<MaskCostRow[]> {
  const info = readModelDir(options.modelDir);
  const vocabSize = info.vocabSize ?? 0;
  if (vocabSize <= 0) throw new Error(`${options.modelDir}/config.json has no vocab_size`);
  if (info.tokenizerPath === null) throw new Error(`${options.modelDir} has no tokenizer.json: a grammar needs the model's tokens`);
  const service = GrammarService.start({ tokenizerPath: info.tokenizerPath, vocabSize, stopTokenIds: info.eosTokenIds, cacheSize: 4 });
  const spec: GrammarSpec = options.regex ? { kind: "regex", source: options.regex } : { kind: "json_schema", source: JSON.stringify(MASK_BENCH_SCHEMA) };
  const error = await service.compile(spec);
  if (error !== null) throw new Error(`the benchmark schema does not compile: ${error}`);
  const client = service.client();
  const words = client.words;
  const stop = new Set(info.eosTokenIds);
  const results: MaskCostRow[] = [];
  const samples: Int32Array[][] = [];
  let seed = 12345;
  const random = (): number => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed / 2147483648;
  };
  try {
    for (const rows of options.rows) {
      const matchers = Array.from({ length: rows }, () => client.newMatcher());
      let fresh: number[][] = matchers.map(() => []);
      const grammar: number[] = [];
      const roundTrip: number[] = [];
      const encodeMs: number[] = [];
      let bytes = 0;
      const kept: Int32Array[] = [];
      for (let step = 0; step < options.steps + 5; step++) {
        const t0 = performance.now();
        const reply = await client.masks(matchers.map((m, r) => ({ matcher: m, spec: step === 0 ? spec : null, tokens: fresh[r] as number[], allow: [] })));
        const t1 = performance.now();
        const e0 = performance.now();
        const encoded = encode({ kind: "StepMask", step_id: step, bitmask: reply.bits });
        const e1 = performance.now();
        // The first steps create the matchers; they are not what a running request pays.
        if (step >= 5) {
          grammar.push(reply.ms);
          roundTrip.push(t1 - t0);
          encodeMs.push(e1 - e0);
          bytes = encoded.length;
          if (step % Math.max(1, Math.floor(options.steps / MASK_SAMPLES)) === 0 && kept.length < MASK_SAMPLES) kept.push(reply.bits.slice());
        }
        fresh = matchers.map((_, r) => {
          const allowed = allowedTokens(reply.bits, r * words, words).filter((t) => !stop.has(t));
          return allowed.length === 0 ? [] : [allowed[Math.floor(random() * allowed.length)] as number];
        });
      }
      client.release(matchers);
      while (kept.length < MASK_SAMPLES) kept.push((kept[kept.length - 1] as Int32Array).slice());
      samples.push(kept);
      results.push({ rows, steps: options.steps, grammar: percentiles(grammar), roundTrip: percentiles(roundTrip), encode: percentiles(encodeMs), apply: { p50: 0, p99: 0 }, bytes });
    }
  } finally {
    client.close();
    await service.close();
  }
  const applied = applyTimes(vocabSize, options.rows, samples, options.steps, options.device);
  results.forEach((r, i) => (r.apply = applied[i] ?? r.apply));
  return results;
}

export function maskCostTable(results: readonly MaskCostRow[], vocab: number | null): string {
  const f = (p: { p50: number; p99: number }): string => `${p.p50.toFixed(3)} / ${p.p99.toFixed(3)}`;
  const lines = [
    "| constrained rows | grammar thread | round trip | StepMask encode | worker apply | StepMask bytes |",
    "| --- | --- | --- | --- | --- | --- |",
    ...results.map((r) => `| ${r.rows} | ${f(r.grammar)} | ${f(r.roundTrip)} | ${f(r.encode)} | ${f(r.apply)} | ${r.bytes} |`),
  ];
  return `mask cost per step in ms (p50 / p99)${vocab === null ? "" : `, vocabulary ${vocab}`}\n${lines.join("\n")}\n`;
}
