// Control-plane overhead of two checkouts side by side: `baton bench overhead`
// at one batch size, alternating the trees A B, B A, ... so slow drifts of a
// shared machine fall on both, then the median of each tree's step p50 and the
// median of the per-round ratios B / A. Each tree must be built (npm run build)
// with its own .venv and models/demo.
//
//   git worktree add /tmp/before 5351548 && (cd /tmp/before && npm run setup && npm run build)
//   node bench/overhead_ab.mjs /tmp/before . [--rounds 10] [--batch-size 256] [--steps 800]
import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { parseArgs } from "node:util";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { rounds: { type: "string", default: "10" }, "batch-size": { type: "string", default: "256" }, steps: { type: "string", default: "800" } },
});
if (positionals.length !== 2) {
  console.error("usage: node bench/overhead_ab.mjs TREE_A TREE_B [--rounds N] [--batch-size B] [--steps S]");
  process.exit(2);
}
const trees = positionals.map((p) => resolve(p));
const batch = values["batch-size"];

function once(tree) {
  const run = spawnSync(process.execPath, ["bin/baton.mjs", "bench", "overhead", "--batch-sizes", batch, "--steps", values.steps, "--json"], { cwd: tree, encoding: "utf8" });
  const last = run.stdout.trim().split("\n").at(-1) ?? "";
  if (run.status !== 0 || !last.startsWith("{")) throw new Error(`bench overhead failed in ${tree}:\n${run.stderr.slice(-2000)}`);
  const r = JSON.parse(last)[batch];
  return { step: r.step_ms_p50, core: r.engine_core_ms_p50, process: r.phases.process.p50, worker: r.worker_ms_p50 };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const runs = [[], []];
const ratios = [];
for (let round = 0; round < Number(values.rounds); round++) {
  const got = [];
  for (const i of round % 2 === 0 ? [0, 1] : [1, 0]) {
    got[i] = once(trees[i]);
    runs[i].push(got[i]);
    const g = got[i];
    console.log(`round ${round} ${"AB"[i]} step p50 ${g.step.toFixed(3)} ms  engine core ${g.core.toFixed(3)}  process ${g.process.toFixed(3)}  worker ${g.worker.toFixed(3)}`);
  }
  ratios.push(got[1].step / got[0].step);
}
const med = (i, key) => median(runs[i].map((r) => r[key]));
console.log(`A = ${trees[0]}\nB = ${trees[1]}\nB=${batch}, ${values.rounds} rounds, medians (ms):`);
for (const key of ["step", "core", "process", "worker"]) console.log(`  ${key.padEnd(8)} A ${med(0, key).toFixed(3)}  B ${med(1, key).toFixed(3)}  B/A ${(med(1, key) / med(0, key)).toFixed(3)}`);
console.log(`  per-round step ratios B/A: ${ratios.map((r) => r.toFixed(2)).join(" ")}; median ${median(ratios).toFixed(3)}`);
