// Time to first audio on a running `baton serve models/demo-tts`: REQUESTS
// sequential /v1/audio/speech requests (pcm, 40-word input, one seed each)
// and, per request, when the first body byte arrived, when the body ended,
// and a SHA-256 of the bytes: run it against two placements (one worker, and
// --deployment examples/demo-tts-two-workers.yaml) and the digests must match.
//   node bench/speech_latency.mjs URL [REQUESTS]
import { createHash } from "node:crypto";
import { request } from "node:http";

const url = new URL("/v1/audio/speech", process.argv[2] ?? "http://127.0.0.1:8000");
const count = Number(process.argv[3] ?? 8);
const words = Array.from({ length: 40 }, (_, i) => ["baton", "streams", "speech", "from", "a", "graph", "of", "models"][i % 8]).join(" ");

function speak(seed) {
  const body = JSON.stringify({ model: "demo-tts", input: words, voice: "alloy", response_format: "pcm", seed, temperature: 0.8 });
  return new Promise((resolve, reject) => {
    const started = performance.now();
    let first = -1;
    const hash = createHash("sha256");
    let bytes = 0;
    const req = request(url, { method: "POST", headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      if (res.statusCode !== 200) reject(new Error(`status ${res.statusCode}`));
      res.on("data", (chunk) => {
        if (first < 0) first = performance.now() - started;
        hash.update(chunk);
        bytes += chunk.length;
      });
      res.on("end", () => resolve({ seed, firstMs: first, totalMs: performance.now() - started, bytes, sha256: hash.digest("hex").slice(0, 16) }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

const runs = [];
for (let i = 0; i < count; i++) runs.push(await speak(1000 + i));
for (const r of runs) console.log(`seed ${r.seed}: first audio ${r.firstMs.toFixed(0)} ms of ${r.totalMs.toFixed(0)} ms, ${r.bytes} bytes, sha256 ${r.sha256}`);
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
console.log(`median first audio ${median(runs.map((r) => r.firstMs)).toFixed(0)} ms, median total ${median(runs.map((r) => r.totalMs)).toFixed(0)} ms`);
