// `baton bench overhead --json` at tiny sizes, through the real CLI: the shape
// of the report and that every number is finite and positive. No timing
// assertions (this runs on shared, noisy machines).

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const demo = join(repoRoot, "models", "demo", "tokenizer.json");
const COMMON = ["schedule", "build", "encode", "worker_round_trip", "decode", "process", "step"];
const PLACEMENTS = [
  { name: "engine thread", flags: [], phases: [...COMMON, "post"] },
  { name: "main thread", flags: ["--no-engine-thread"], phases: [...COMMON, "detokenize", "stream"] },
];

for (const { name, flags, phases: PHASES } of PLACEMENTS) test(`bench overhead --json reports per-phase p50/p99 for each batch size (${name})`, { skip: !existsSync(demo) && "no demo model (npm run setup)", timeout: 120_000 }, () => {
  const run = spawnSync(process.execPath, [join(repoRoot, "bin", "baton.mjs"), "bench", "overhead", "--batch-sizes", "1,4", "--steps", "5", "--warmup", "2", "--json", ...flags], {
    cwd: repoRoot,
    encoding: "utf8",
    timeout: 110_000,
  });
  assert.equal(run.status, 0, `exit ${run.status}\n${run.stderr}`);
  const report = JSON.parse(run.stdout) as Record<string, Record<string, unknown>>;
  assert.deepEqual(Object.keys(report).sort(), ["1", "4"]);
  const positive = (value: unknown, what: string): void => {
    assert.equal(typeof value, "number", what);
    assert.ok(Number.isFinite(value as number) && (value as number) > 0, `${what} = ${String(value)}`);
  };
  const finite = (value: unknown, what: string): void => {
    assert.equal(typeof value, "number", what);
    assert.ok(Number.isFinite(value as number) && (value as number) >= 0, `${what} = ${String(value)}`);
  };
  for (const [b, r] of Object.entries(report)) {
    for (const key of ["engine_core_ms_p50", "engine_core_ms_p99", "step_ms_p50", "step_ms_p99", "tokens_per_s", "main_thread_busy"]) positive(r[key], `B=${b} ${key}`);
    // Counted by the clients over a window of a few steps: may be 0, never negative or missing.
    finite(r.delivered_tokens_per_s, `B=${b} delivered_tokens_per_s`);
    // CPU over the same window, in cores (/proc ticks are 10 ms: the worker's and clients' may read 0 here).
    positive(r.server_cpu_cores, `B=${b} server_cpu_cores`);
    for (const key of ["worker_cpu_cores", "clients_cpu_cores", "delivered_tokens_per_server_core"]) finite(r[key], `B=${b} ${key}`);
    assert.equal(r.engine_thread, flags.length === 0);
    assert.ok((r.steps as number) >= 4, `B=${b} measured ${String(r.steps)} steps`);
    const phases = r.phases as Record<string, { p50: number; p99: number }>;
    assert.deepEqual(Object.keys(phases).sort(), [...PHASES].sort());
    for (const p of PHASES) {
      // Some phases can round to 0 ms at B=1 (e.g. stream); step and the round trip cannot.
      finite(phases[p]?.p50, `B=${b} ${p}.p50`);
      finite(phases[p]?.p99, `B=${b} ${p}.p99`);
      assert.ok((phases[p]?.p99 as number) >= (phases[p]?.p50 as number), `B=${b} ${p}: p99 >= p50`);
    }
    positive(phases.step?.p50, `B=${b} step.p50`);
    positive(phases.worker_round_trip?.p50, `B=${b} worker_round_trip.p50`);
  }
});
