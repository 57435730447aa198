// CSM text-to-speech against transformers on the same directory, side by side
// in one run: REQUESTS texts of varied lengths (voices "0" and "1" in turn),
// greedy, through `baton serve`'s /v1/audio/speech (pcm, streamed as decoded)
// at concurrency 1 and 8, REPEATS times each, in two placements (one worker
// hosting both nodes; the codec on a worker of its own, so the backbone's steps
// and the codec's windows run side by side), then through transformers'
// generate + Mimi decode (bench/hf_csm_peer.py: batches of C). Prints, for
// each side's median repeat, a markdown table: requests/s, time to first audio (Baton: the first body byte;
// transformers: the batch's whole latency, as it gives audio only at the end),
// the real-time factor (seconds of compute per second of audio: wall time x
// concurrency / audio seconds) and the Baton/transformers ratios; then whether
// both sides produced the same number of samples for every text (greedy: they
// must).
// The random-weight demo model is built to end speech after about three frames
// per prompt token, so the texts stay short enough (at most ~30 tokens) to stop
// on their own before the 125-frame (10 s) cap.
//
// usage: node bench/csm_bench.mjs [MODEL_DIR=models/demo-csm] [REQUESTS=16] [REPEATS=3]
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startBatonServer } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const python = process.env.BATON_PYTHON ?? join(repo, ".venv", "bin", "python");
const model = process.argv[2] ?? join(repo, "models", "demo-csm");
const numRequests = Number(process.argv[3] ?? 16);
const repeats = Number(process.argv[4] ?? 3);
const LEVELS = [1, 8];
const SAMPLE_RATE = 24000;
const TEXTS = [
  "Hi.",
  "Good morning, everyone.",
  "The weather is lovely today.",
  "Please leave your message after the tone.",
  "Turn left at the next intersection, then continue straight for two miles.",
  "Yes.",
  "I will call you back in a few minutes.",
  "The meeting has been moved to Thursday afternoon at three.",
  "Thank you for waiting.",
  "Your package was delivered this morning and left at the front door.",
  "Okay, sounds good.",
  "Can you hear me clearly now?",
  "The train to the airport departs from platform four every twenty minutes.",
  "Welcome back.",
  "Remember to bring an umbrella, it might rain later tonight.",
  "See you soon.",
];
const requests = Array.from({ length: numRequests }, (_, i) => ({ text: TEXTS[i % TEXTS.length], voice: String(i % 2) }));

/** Sends every request, `concurrency` at a time; each one's TTFA and sample count, and the wall time. */
async function baton(url, concurrency) {
  const ttfa = new Array(requests.length);
  const samples = new Array(requests.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < requests.length) {
      const i = next++;
      const started = performance.now();
      const res = await fetch(`${url}/v1/audio/speech`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: basename(model), input: requests[i].text, voice: requests[i].voice, response_format: "pcm", temperature: 0 }),
      });
      if (res.status !== 200) throw new Error(await res.text());
      let bytes = 0;
      for await (const chunk of res.body) {
        if (bytes === 0 && chunk.length > 0) ttfa[i] = (performance.now() - started) / 1000;
        bytes += chunk.length;
      }
      samples[i] = bytes / 2; // s16le mono
    }
  }));
  return { seconds: (performance.now() - t0) / 1000, ttfa, samples };
}

/** The codec's passes and forwards so far (/metrics baton:node_batch_size), to tell how many windows a forward decoded. */
async function codecBatches(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const value = (suffix) => Number(new RegExp(`^baton:node_batch_size_${suffix}\\{[^}]*node="codec"[^}]*\\} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  return { passes: value("sum"), forwards: value("count") };
}

const work = mkdtempSync(join(tmpdir(), "csm-bench-"));
const split = join(work, "codec-worker.yaml");
writeFileSync(split, "node_groups:\n  - node_names: [backbone]\n    ranks: [0]\n  - node_names: [codec]\n    ranks: [1]\n");
const PLACEMENTS = { "one worker": [], "codec worker": ["--deployment", split] };
const ours = {};
const windowsPerForward = {};
try {
  for (const [placement, args] of Object.entries(PLACEMENTS)) {
    const server = await startBatonServer([model, "--log-level", "warn", ...args]);
    ours[placement] = {};
    try {
      await baton(server.url, Math.max(...LEVELS)); // warm-up
      for (const c of LEVELS) {
        ours[placement][c] = [];
        const before = await codecBatches(server.url);
        for (let r = 0; r < repeats; r++) ours[placement][c].push(await baton(server.url, c));
        const after = await codecBatches(server.url);
        windowsPerForward[`${placement} ${c}`] = (after.passes - before.passes) / Math.max(1, after.forwards - before.forwards);
      }
    } finally {
      await server.stop();
    }
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}

const peer = spawnSync(python, [join(repo, "bench", "hf_csm_peer.py")], {
  input: JSON.stringify({ model_dir: model, concurrency: LEVELS, repeats, requests }),
  encoding: "utf8", maxBuffer: 64 << 20, env: { ...process.env, PYTHONPATH: [join(repo, "python"), process.env.PYTHONPATH].filter(Boolean).join(":") },
});
if (peer.status !== 0) throw new Error(peer.stderr);
const theirs = JSON.parse(peer.stdout);

const quantile = (values, q) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(q * values.length))];
const sum = (values) => values.reduce((a, b) => a + b, 0);
// Each side's median repeat by wall time (the faster of two): other work on a shared
// machine's cores slows single repeats several-fold, and the median leaves those out.
const medianRun = (runs) => [...runs].sort((a, b) => a.seconds - b.seconds)[Math.floor((runs.length - 1) / 2)];
const audioSeconds = sum(theirs[LEVELS[0]][0].samples) / SAMPLE_RATE;
const ms = (s) => (s * 1000).toFixed(0);

console.log(`${numRequests} speech requests, greedy, ${(audioSeconds / numRequests).toFixed(2)} s of audio a request on average, ` +
  `median of ${repeats} repeat(s), ${model}\n`);
console.log("| C | Baton placement | Baton req/s | transformers req/s | req/s ratio | Baton TTFA p50 / p90 (ms) | transformers TTFA p50 / p90 (ms) | TTFA p50 ratio | Baton RTF | transformers RTF | codec windows per forward |");
console.log("|---|---|---|---|---|---|---|---|---|---|---|");
const mismatches = [];
const expected = theirs[LEVELS[0]][0].samples;
for (const c of LEVELS) {
  const hf = medianRun(theirs[c]);
  for (const placement of Object.keys(PLACEMENTS)) {
    const mine = medianRun(ours[placement][c]);
    const rate = (run) => numRequests / run.seconds;
    const rtf = (run) => ((run.seconds * Math.min(c, numRequests)) / (sum(run.samples) / SAMPLE_RATE)).toFixed(3);
    const [p50, p90] = [(run) => quantile(run.ttfa, 0.5), (run) => quantile(run.ttfa, 0.9)];
    console.log(`| ${c} | ${placement} | ${rate(mine).toFixed(2)} | ${rate(hf).toFixed(2)} | ${(rate(mine) / rate(hf)).toFixed(2)} | ${ms(p50(mine))} / ${ms(p90(mine))} | ` +
      `${ms(p50(hf))} / ${ms(p90(hf))} | ${(p50(mine) / p50(hf)).toFixed(2)} | ${rtf(mine)} | ${rtf(hf)} | ${windowsPerForward[`${placement} ${c}`].toFixed(1)} |`);
  }
  const sides = [...Object.keys(PLACEMENTS).map((p) => [`baton (${p})`, ours[p][c]]), ["transformers", theirs[c]]];
  for (const [side, runs] of sides) {
    runs.forEach((run, r) => run.samples.forEach((n, i) => n !== expected[i] && mismatches.push(`${side} c=${c} repeat ${r} request ${i}: ${n} samples, not ${expected[i]}`)));
  }
}
console.log(mismatches.length === 0
  ? `\naudio lengths: all ${(Object.keys(PLACEMENTS).length + 1) * LEVELS.length * repeats * numRequests} responses (every side, level and repeat) have the same sample count for their text and voice`
  : `\naudio lengths differ in ${mismatches.length} responses:\n${mismatches.join("\n")}`);
