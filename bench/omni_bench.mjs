// Qwen3-Omni audio-in chat throughput against transformers on the same
// directory, side by side in one run: N chat requests, each one clip (lengths
// in turn from SECONDS, seeded tones and noise as 16-bit WAV) and a short
// question, greedy, every answer MAX_TOKENS long, through `baton serve` at
// concurrency 1 and 8 (OpenAI's input_audio parts), then through transformers'
// thinker.generate (bench/hf_omni_peer.py: one request at a time, then batches
// of 8). Prints requests/s for each and the ratio.
//
// usage: node bench/omni_bench.mjs [MODEL_DIR=models/demo-qwen3-omni] [REQUESTS=32] [MAX_TOKENS=16]
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chatRequestsPerSecond, servedLevels } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const python = process.env.BATON_PYTHON ?? join(repo, ".venv", "bin", "python");
const model = process.argv[2] ?? join(repo, "models", "demo-qwen3-omni");
const numRequests = Number(process.argv[3] ?? 32);
const maxTokens = Number(process.argv[4] ?? 16);
const SECONDS = [1, 2, 3, 4];
const LEVELS = [1, 8];

const made = spawnSync(python, ["-c", `
import base64, io, json, wave, numpy as np
seconds = ${JSON.stringify(SECONDS)}
out = []
for i in range(${numRequests}):
    n = 16000 * seconds[i % len(seconds)]
    t = np.arange(n) / 16000
    x = 0.3 * np.sin(2 * np.pi * (200 + 37 * i) * t) + 0.05 * np.random.default_rng(i).standard_normal(n)
    b = io.BytesIO()
    with wave.open(b, "wb") as w:
        w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
        w.writeframes(np.round(x * 32767).astype("<i2").tobytes())
    out.append(base64.b64encode(b.getvalue()).decode())
print(json.dumps(out))
`], { encoding: "utf8", maxBuffer: 256 << 20 });
if (made.status !== 0) throw new Error(made.stderr);
const clips = JSON.parse(made.stdout);
const requests = clips.map((audio, i) => ({ text: `Question ${i}: what do you hear?`, audio }));

const baton = (url, concurrency) =>
  chatRequestsPerSecond(url, requests.length, concurrency, (i) => {
    const r = requests[i];
    return { messages: [{ role: "user", content: [{ type: "input_audio", input_audio: { data: r.audio, format: "wav" } }, { type: "text", text: r.text }] }] };
  }, maxTokens);

const ours = await servedLevels(model, LEVELS, baton);

const peer = spawnSync(python, [join(repo, "bench", "hf_omni_peer.py")], {
  input: JSON.stringify({ model_dir: model, max_new_tokens: maxTokens, concurrency: LEVELS, requests }),
  encoding: "utf8", maxBuffer: 64 << 20, env: { ...process.env, PYTHONPATH: [join(repo, "python"), process.env.PYTHONPATH].filter(Boolean).join(":") },
});
if (peer.status !== 0) throw new Error(peer.stderr);
const theirs = JSON.parse(peer.stdout);

console.log(`${numRequests} audio chat requests (clips of ${SECONDS.join(", ")} s), ${maxTokens} greedy tokens each, ${model}`);
for (const c of LEVELS) {
  const hf = theirs[c].requests / theirs[c].seconds;
  console.log(`c=${c}: baton ${ours[c].toFixed(2)} req/s, transformers ${hf.toFixed(2)} req/s, ratio ${(ours[c] / hf).toFixed(2)}`);
}
