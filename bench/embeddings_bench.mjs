// Embeddings/s of `baton serve DIR` (POST /v1/embeddings, one request at a
// time holding BATCH inputs) against sentence-transformers' encode(texts,
// batch_size=BATCH) on the same directory, side by side, at batch 1, 32 and
// 256. The server is started here (its worker gets the machine's cores, as
// sentence-transformers' torch does) and is idle while sentence-transformers runs.
// The server keeps its default token budget per step (2048): a batch of 256
// runs as several steps, each forward small enough to stay in the CPU's caches.
//
// usage: node bench/embeddings_bench.mjs MODEL_DIR [TOTAL=512] [WORDS=32]
//   a random-weight directory of all-MiniLM-L6-v2's shape:
//   .venv/bin/python python/tests/random_embedders.py build --kind minilm-mean-norm --out /tmp/minilm
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startBatonServer } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const [dir, total = 512, words = 32] = [process.argv[2], Number(process.argv[3] ?? 512), Number(process.argv[4] ?? 32)];
if (!dir) throw new Error("usage: node bench/embeddings_bench.mjs MODEL_DIR [TOTAL] [WORDS]");
const BATCHES = [1, 32, 256];
const VOCAB = ["the", "cat", "sat", "on", "mat", "a", "dog", "is", "and", "of", "hello", "world", "embedding", "model", "quick", "brown"];
// Deterministic texts of WORDS words, each different.
const texts = Array.from({ length: total }, (_, i) => Array.from({ length: words }, (_, j) => VOCAB[(i * 7 + j * (i % 5 + 1)) % VOCAB.length]).join(" "));

const { url, stop } = await startBatonServer([dir, "--max-num-seqs", "256", "--log-level", "warn"]);

async function embed(input) {
  const r = await fetch(`${url}/v1/embeddings`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ input }) });
  if (r.status !== 200) throw new Error(await r.text());
  return (await r.json()).data.length;
}

const baton = {};
try {
  await embed(texts.slice(0, 8)); // warm-up
  for (const batch of BATCHES) {
    const t0 = performance.now();
    let done = 0;
    for (let i = 0; i < total; i += batch) done += await embed(texts.slice(i, i + batch));
    baton[batch] = done / ((performance.now() - t0) / 1000);
  }
} finally {
  stop();
}

const py = `
import json, sys, time
from sentence_transformers import SentenceTransformer
texts, batches = json.load(sys.stdin)
model = SentenceTransformer(sys.argv[1], device="cpu")
model.encode(texts[:8], batch_size=8)
out = {}
for b in batches:
    t0 = time.perf_counter()
    model.encode(texts, batch_size=b)
    out[b] = len(texts) / (time.perf_counter() - t0)
print(json.dumps(out))
`;
const python = process.env.BATON_PYTHON ?? join(repo, ".venv", "bin", "python");
const st = spawnSync(python, ["-c", py, dir], { input: JSON.stringify([texts, BATCHES]), encoding: "utf8" });
if (st.status !== 0) throw new Error(st.stderr);
const reference = JSON.parse(st.stdout.trim().split("\n").at(-1));

console.log(`${total} texts of ${words} words; embeddings/s`);
console.log("batch   baton   sentence-transformers   ratio");
for (const b of BATCHES) {
  const [x, y] = [baton[b], reference[b]];
  console.log(`${String(b).padStart(5)} ${x.toFixed(1).padStart(7)} ${y.toFixed(1).padStart(23)} ${(x / y).toFixed(2).padStart(7)}`);
}
