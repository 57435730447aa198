// Whisper transcription against transformers on the same directory, side by
// side in one run: CLIP_SECONDS-long speech-like clips (16 kHz WAV) through
// `baton serve`'s /v1/audio/transcriptions (language en, json) at
// concurrency 1, 8 and 32, then through transformers' generate
// (bench/hf_whisper_peer.py: one clip at a time, then batches of C). Prints
// requests/s, the real-time factor (seconds of compute per second of audio:
// wall time x concurrency / audio seconds) and the ratio of requests/s, and
// from Baton's /metrics how many windows an encoder forward batched.
// A random-weight decoder never ends a transcript: every request decodes the
// decoder's whole 448 positions on both sides, the same work.
//
// usage: node bench/whisper_bench.mjs [MODEL_DIR=models/demo-whisper] [REQUESTS=32] [CLIP_SECONDS=5]
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { startBatonServer } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const python = process.env.BATON_PYTHON ?? join(repo, ".venv", "bin", "python");
const model = process.argv[2] ?? join(repo, "models", "demo-whisper");
const numRequests = Number(process.argv[3] ?? 32);
const clipSeconds = Number(process.argv[4] ?? 5);
const LEVELS = [1, 8, 32];
// Requests per level: c=1 runs a quarter of them (each is a full 448-token decode).
const counts = Object.fromEntries(LEVELS.map((c) => [c, c === 1 ? Math.max(1, Math.floor(numRequests / 4)) : numRequests]));

const made = spawnSync(python, ["-c", `
import base64, io, json, wave, numpy as np
out = []
for i in range(${numRequests}):
    rng = np.random.default_rng(i); t = np.arange(int(${clipSeconds} * 16000)) / 16000
    f0 = 120 + 80 * rng.random() + 30 * np.sin(2 * np.pi * 0.7 * t); phase = 2 * np.pi * np.cumsum(f0) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t) ** 2)
    pcm = np.clip((0.2 * voice + 0.02 * rng.standard_normal(t.shape)) * 32767, -32768, 32767).astype(np.int16)
    b = io.BytesIO(); w = wave.open(b, "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(pcm.tobytes()); w.close()
    out.append({"wav": base64.b64encode(b.getvalue()).decode(), "samples": base64.b64encode((pcm / 32768).astype(np.float32).tobytes()).decode()})
print(json.dumps(out))
`], { encoding: "utf8", maxBuffer: 512 << 20 });
if (made.status !== 0) throw new Error(made.stderr);
const clips = JSON.parse(made.stdout);

async function baton(url, concurrency, n) {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < n) {
      const clip = clips[next++];
      const form = new FormData();
      form.append("file", new Blob([Buffer.from(clip.wav, "base64")], { type: "audio/wav" }), "clip.wav");
      form.append("language", "en");
      const res = await fetch(`${url}/v1/audio/transcriptions`, { method: "POST", body: form });
      if (res.status !== 200) throw new Error(await res.text());
      await res.json();
    }
  }));
  return (performance.now() - t0) / 1000;
}

async function scrape(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const value = (pattern) => Number(new RegExp(`^${pattern} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  return {
    encoderPasses: value('baton:node_batch_size_sum\\{[^}]*node="encoder"\\}'),
    encoderForwards: value('baton:node_batch_size_count\\{[^}]*node="encoder"\\}'),
  };
}

const ours = {};
const batching = {};
const server = await startBatonServer([model, "--log-level", "warn"]);
try {
  await baton(server.url, 2, 2); // warm-up
  for (const c of LEVELS) {
    const before = await scrape(server.url);
    ours[c] = await baton(server.url, c, counts[c]);
    const after = await scrape(server.url);
    batching[c] = (after.encoderPasses - before.encoderPasses) / Math.max(1, after.encoderForwards - before.encoderForwards);
  }
} finally {
  await server.stop();
}

const peer = spawnSync(python, [join(repo, "bench", "hf_whisper_peer.py")], {
  input: JSON.stringify({ model_dir: model, concurrency: LEVELS, counts, clips: clips.map((c) => c.samples) }),
  encoding: "utf8", maxBuffer: 64 << 20,
});
if (peer.status !== 0) throw new Error(peer.stderr);
const theirs = JSON.parse(peer.stdout);

console.log(`${clipSeconds} s clips, greedy to the decoder's 448 positions, ${model}`);
for (const c of LEVELS) {
  const n = counts[c];
  const audio = n * clipSeconds;
  const [mine, hf] = [n / ours[c], n / theirs[c].seconds];
  const rtf = (seconds) => ((seconds * Math.min(c, n)) / audio).toFixed(3);
  console.log(`c=${c} (${n} requests): baton ${mine.toFixed(2)} req/s (RTF ${rtf(ours[c])}), transformers ${hf.toFixed(2)} req/s (RTF ${rtf(theirs[c].seconds)}), ratio ${(mine / hf).toFixed(2)}; ` +
    `baton batched ${batching[c].toFixed(1)} windows an encoder forward`);
}
