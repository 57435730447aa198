// Image-generation load: CONCURRENCY clients send TOTAL requests to a running
// `baton serve models/demo-image` and this prints images/s and how many passes
// each denoiser forward batched (from baton:node_batch_size on /metrics).
// usage: node bench/image_batching.mjs URL CONCURRENCY TOTAL STEPS SIZE
const [url, conc, total, steps, size] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5], process.argv[6]];
const hist = async () => {
  const t = await (await fetch(`${url}/metrics`)).text();
  const pick = (k) => Number(t.split("\n").find((l) => l.startsWith(`baton:node_batch_size_${k}{`) && l.includes('node="denoiser"'))?.split(" ").at(-1) ?? 0);
  const buckets = t.split("\n").filter((l) => l.startsWith("baton:node_batch_size_bucket{") && l.includes('node="denoiser"')).map((l) => [l.match(/le="([^"]+)"/)[1], Number(l.split(" ").at(-1))]);
  return { count: pick("count"), sum: pick("sum"), buckets };
};
const before = await hist();
let next = 0, done = 0;
const t0 = performance.now();
async function worker() {
  while (next < total) {
    const i = next++;
    const r = await fetch(`${url}/v1/images/generations`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: `load ${i}`, seed: i, size, num_inference_steps: steps }) });
    if (r.status !== 200) throw new Error(await r.text());
    await r.json(); done++;
  }
}
await Promise.all(Array.from({ length: conc }, worker));
const secs = (performance.now() - t0) / 1000;
const after = await hist();
const forwards = after.count - before.count, passes = after.sum - before.sum;
const dist = after.buckets.map(([le, n], i) => [le, n - (before.buckets[i]?.[1] ?? 0)]);
console.log(JSON.stringify({ requests: done, concurrency: conc, steps, size, seconds: +secs.toFixed(2), images_per_s: +(done / secs).toFixed(1), denoiser_passes: passes, forwards, mean_batch: +(passes / forwards).toFixed(2), cumulative_le: Object.fromEntries(dist) }));
