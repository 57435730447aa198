// Output tokens/s of one `baton serve --enable-lora` server at concurrency C:
// every request on the base model, against every request on one of N LoRA
// adapters (request i uses adapter i mod N, so every step mixes them), in
// alternating rounds (base, mixed, mixed, base, ...) on the same server, with
// the same prompts. The ratio mixed / base is the cost of the adapters.
//
// usage: node bench/lora_bench.mjs BASE_DIR [ADAPTERS=8] [C=32] [ROUNDS=2] [MAX_TOKENS=64]
//   BASE_DIR: a decoder directory, e.g. .venv/bin/python bench/make_llama_19m.py --out /tmp/llama-19m
//   The adapters (rank 16 on all seven projections, seeded) are built next to it by
//   python/tests/random_loras.py.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { runCompletions, startBatonServer } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const [base, numAdapters, concurrency, rounds, maxTokens] = [process.argv[2], Number(process.argv[3] ?? 8), Number(process.argv[4] ?? 32), Number(process.argv[5] ?? 2), Number(process.argv[6] ?? 64)];
if (!base) throw new Error("usage: node bench/lora_bench.mjs BASE_DIR [ADAPTERS] [C] [ROUNDS] [MAX_TOKENS]");
const python = process.env.BATON_PYTHON ?? join(repo, ".venv", "bin", "python");
const adapterRoot = `${base.replace(/\/$/, "")}-loras`;

const names = Array.from({ length: numAdapters }, (_, i) => `lora${i}`);
if (!names.every((n) => existsSync(join(adapterRoot, n, "adapter_config.json")))) {
  const build = spawnSync(python, [join(repo, "python", "tests", "random_loras.py"), "--base", base, "--out", adapterRoot, "--bench", String(numAdapters)], {
    encoding: "utf8",
    env: { ...process.env, PYTHONPATH: join(repo, "python") },
  });
  if (build.status !== 0) throw new Error(build.stderr);
}

const args = [base, "--log-level", "warn", "--enable-lora", "--max-loras", String(numAdapters), "--max-lora-rank", "16"];
for (const n of names) args.push("--lora-modules", `${n}=${join(adapterRoot, n)}`);
const { url, stop } = await startBatonServer(args);

const WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "birds", "sing"];
const prompts = Array.from({ length: concurrency * 2 }, (_, i) => Array.from({ length: 24 }, (_, j) => WORDS[(i * 5 + j * 3) % WORDS.length]).join(" "));

/** Output tokens/s of the prompts, `concurrency` at a time, request i on model pick(i). */
async function run(pick) {
  const body = (i) => ({ model: pick(i), prompt: prompts[i], max_tokens: maxTokens, ignore_eos: true, temperature: 0 });
  return (await runCompletions(url, prompts.length, concurrency, body)).rate;
}

const results = { base: [], mixed: [] };
try {
  await run(() => "lora0"); // warm-up
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 === 0 ? ["base", "mixed"] : ["mixed", "base"];
    for (const kind of order) results[kind].push(await run(kind === "base" ? () => undefined : (i) => names[i % names.length]));
  }
} finally {
  stop();
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
console.log(`${prompts.length} requests, ${concurrency} at a time, ${maxTokens} output tokens each; output tokens/s per round`);
console.log(`base model alone:        ${results.base.map((x) => x.toFixed(1)).join("  ")}  mean ${mean(results.base).toFixed(1)}`);
console.log(`${numAdapters} adapters mixed:        ${results.mixed.map((x) => x.toFixed(1)).join("  ")}  mean ${mean(results.mixed).toFixed(1)}`);
console.log(`ratio mixed / base: ${(mean(results.mixed) / mean(results.base)).toFixed(2)}`);
