// Image chat throughput against transformers on the same directory, side by
// side in one run: N chat requests, each one image (sizes in turn from
// SIZES) and a short question, greedy, every answer MAX_TOKENS long, through
// `baton serve` at concurrency 1 and 8, then through transformers' generate
// (bench/hf_vision_peer.py: one request at a time, then batches of 8).
// Prints requests/s for each and the ratio.
//
// usage: node bench/vision_bench.mjs [MODEL_DIR=models/demo-qwen-vl] [REQUESTS=32] [MAX_TOKENS=16]
import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chatRequestsPerSecond, servedLevels } from "./baton-server.mjs";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");
const python = process.env.BATON_PYTHON ?? join(repo, ".venv", "bin", "python");
const model = process.argv[2] ?? join(repo, "models", "demo-qwen-vl");
const numRequests = Number(process.argv[3] ?? 32);
const maxTokens = Number(process.argv[4] ?? 16);
const SIZES = [[224, 224], [336, 252], [140, 420], [448, 308]];
const LEVELS = [1, 8];

// Seeded noise PNGs (Pillow), base64.
const made = spawnSync(python, ["-c", `
import base64, io, json, numpy as np
from PIL import Image
sizes = ${JSON.stringify(SIZES)}
out = []
for i in range(${numRequests}):
    w, h = sizes[i % len(sizes)]
    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(b, format="PNG")
    out.append(base64.b64encode(b.getvalue()).decode())
print(json.dumps(out))
`], { encoding: "utf8", maxBuffer: 256 << 20 });
if (made.status !== 0) throw new Error(made.stderr);
const images = JSON.parse(made.stdout);
const requests = images.map((image, i) => ({ text: `Question ${i}: what is in this picture?`, image }));

const baton = (url, concurrency) =>
  chatRequestsPerSecond(url, requests.length, concurrency, (i) => {
    const r = requests[i];
    return { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: `data:image/png;base64,${r.image}` } }, { type: "text", text: r.text }] }] };
  }, maxTokens);

const ours = await servedLevels(model, LEVELS, baton);

const peer = spawnSync(python, [join(repo, "bench", "hf_vision_peer.py")], {
  input: JSON.stringify({ model_dir: model, max_new_tokens: maxTokens, concurrency: LEVELS, requests }),
  encoding: "utf8", maxBuffer: 64 << 20,
});
if (peer.status !== 0) throw new Error(peer.stderr);
const theirs = JSON.parse(peer.stdout);

console.log(`${numRequests} image chat requests (sizes ${SIZES.map(([w, h]) => `${w}x${h}`).join(", ")}), ${maxTokens} greedy tokens each, ${model}`);
for (const c of LEVELS) {
  const hf = theirs[c].requests / theirs[c].seconds;
  console.log(`c=${c}: baton ${ours[c].toFixed(2)} req/s, transformers ${hf.toFixed(2)} req/s, ratio ${(ours[c] / hf).toFixed(2)}`);
}
