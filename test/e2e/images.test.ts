// The demo image-generation graph (text encoder -> denoise loop -> decoder)
// served for real: /v1/images/generations returns PNGs whose pixels and bytes
// equal the plain-PyTorch reference loop's, for n images of one request and
// for concurrent requests, whose denoise steps share one forward (the
// baton:node_batch_size histogram says so); a request runs exactly its
// num_inference_steps denoiser passes; bad requests are 400s naming the field.
// (A text model on this route: test/frontend/validation.test.ts.)

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { inflateSync } from "node:zlib";
import { python, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";

const work = tempDir("baton-images-");
after(() => removeDir(work));
// Built here by the same builder setup runs (deterministic: the same bytes as models/demo-image).
const modelDir = join(work, "demo-image");

interface Job {
  prompt: string;
  seed: number;
  size: string;
  steps: number;
  n: number;
}

/** Every image the tests compare against, made by one reference process (python/baton_worker/models/demo_image/reference.py). */
const JOBS = {
  fox: { prompt: "a red fox in the snow", seed: 7, size: "64x64", steps: 4, n: 1 },
  small: { prompt: "x", seed: 1, size: "32x32", steps: 2, n: 1 },
  large: { prompt: "a lighthouse at dusk, oil painting", seed: 3, size: "128x128", steps: 6, n: 1 },
  four: { prompt: "four of a kind", seed: 42, size: "64x64", steps: 4, n: 4 },
  ...Object.fromEntries(Array.from({ length: 8 }, (_, i) => [`c${i}`, { prompt: `concurrent prompt number ${i}`, seed: 100 + i, size: "64x64", steps: 4, n: 1 }])),
} satisfies Record<string, Job>;
type JobName = keyof typeof JOBS;
const refDir = join(work, "ref");

function reference(name: JobName, index: number): { png: Buffer; pixels: Buffer } {
  const k = Object.keys(JOBS).indexOf(name);
  return { png: readFileSync(join(refDir, `${k}-${index}.png`)), pixels: readFileSync(join(refDir, `${k}-${index}.rgb`)) };
}

/** A PNG's 8-bit RGB pixels, row by row (any of PNG's five row filters). */
function decodePng(png: Buffer): { width: number; height: number; pixels: Buffer } {
  assert.ok(png.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), "PNG signature");
  let offset = 8;
  let width = 0;
  let height = 0;
  const idat: Buffer[] = [];
  while (offset < png.length) {
    const length = png.readUInt32BE(offset);
    const kind = png.toString("latin1", offset + 4, offset + 8);
    const data = png.subarray(offset + 8, offset + 8 + length);
    if (kind === "IHDR") {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      assert.deepEqual([...data.subarray(8, 13)], [8, 2, 0, 0, 0], "8-bit RGB, not interlaced");
    } else if (kind === "IDAT") idat.push(data);
    offset += 12 + length;
  }
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * 3;
  const pixels = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]!;
    const row = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= 3 ? pixels[y * stride + x - 3]! : 0;
      const b = y > 0 ? pixels[(y - 1) * stride + x]! : 0;
      const c = x >= 3 && y > 0 ? pixels[(y - 1) * stride + x - 3]! : 0;
      const paeth = (): number => {
        const p = a + b - c;
        const [pa, pb, pc] = [Math.abs(p - a), Math.abs(p - b), Math.abs(p - c)];
        return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      };
      const predictor = [0, a, b, (a + b) >> 1, paeth()][filter];
      assert.ok(predictor !== undefined, `PNG row filter ${filter}`);
      pixels[y * stride + x] = (row[x]! + predictor) & 0xff;
    }
  }
  return { width, height, pixels };
}

interface ImagesResponse {
  created: number;
  data: { b64_json: string }[];
  usage: { input_tokens: number; output_tokens: number; total_tokens: number };
}

async function generate(server: RunningServer, body: unknown): Promise<{ status: number; json: ImagesResponse & { error?: { message: string; param: string | null } } }> {
  const res = await fetch(`${server.url}/v1/images/generations`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as ImagesResponse & { error?: { message: string; param: string | null } } };
}

async function images(server: RunningServer, job: Job): Promise<Buffer[]> {
  const res = await generate(server, { prompt: job.prompt, seed: job.seed, size: job.size, num_inference_steps: job.steps, n: job.n });
  assert.equal(res.status, 200, JSON.stringify(res.json));
  return res.json.data.map((d) => Buffer.from(d.b64_json, "base64"));
}

function assertReference(png: Buffer, name: JobName, index: number): void {
  const ref = reference(name, index);
  const [w, h] = JOBS[name].size.split("x").map(Number);
  const decoded = decodePng(png);
  assert.deepEqual([decoded.width, decoded.height], [w, h], `${name}[${index}] size`);
  assert.ok(decoded.pixels.equals(ref.pixels), `${name}[${index}]: pixels differ from the reference loop's`);
  assert.ok(png.equals(ref.png), `${name}[${index}]: PNG bytes differ from the reference's`);
}

/** The denoiser's baton:node_batch_size histogram: forwards, passes, and forwards of at most `le` passes per bucket. */
/** Requests finished with "stop", and e2e latencies observed, so far. */
async function requestTotals(server: RunningServer): Promise<{ stop: number; latencies: number }> {
  const lines = (await (await fetch(`${server.url}/metrics`)).text()).split("\n");
  const value = (prefix: string, part = ""): number => Number(lines.find((l) => l.startsWith(prefix) && l.includes(part))?.split(" ").at(-1) ?? 0);
  return { stop: value("vllm:request_success_total", 'finished_reason="stop"'), latencies: value("vllm:e2e_request_latency_seconds_count") };
}

async function denoiserBatches(server: RunningServer): Promise<{ count: number; sum: number; buckets: Map<number, number> }> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const lines = text.split("\n").filter((l) => l.startsWith("baton:node_batch_size") && l.includes('node="denoiser"'));
  const value = (l: string): number => Number(l.split(" ").at(-1));
  const buckets = new Map<number, number>();
  for (const l of lines) {
    const le = l.match(/le="([^"]+)"/)?.[1];
    if (l.startsWith("baton:node_batch_size_bucket") && le !== undefined && le !== "+Inf") buckets.set(Number(le), value(l));
  }
  const count = lines.find((l) => l.startsWith("baton:node_batch_size_count"));
  const sum = lines.find((l) => l.startsWith("baton:node_batch_size_sum"));
  assert.ok(count !== undefined && sum !== undefined, "baton:node_batch_size{node=denoiser} missing");
  return { count: value(count), sum: value(sum), buckets };
}

/** What the denoiser ran between two snapshots: forwards, passes, and the largest batch (to a bucket's bound). */
function batchesBetween(before: Awaited<ReturnType<typeof denoiserBatches>>, now: Awaited<ReturnType<typeof denoiserBatches>>): { forwards: number; passes: number; largest: number } {
  const forwards = now.count - before.count;
  let largest = 0;
  for (const [le, n] of now.buckets) {
    // The smallest bound that holds every forward of the interval.
    if (n - (before.buckets.get(le) ?? 0) === forwards) {
      largest = le;
      break;
    }
  }
  return { forwards, passes: now.sum - before.sum, largest };
}

before(() => {
  const env = { ...process.env, PYTHONPATH: join(repoRoot, "python"), OMP_NUM_THREADS: "1" };
  const built = spawnSync(python, ["-m", "baton_worker.models.demo_image.build", "--out", modelDir], { encoding: "utf8", env });
  assert.equal(built.status, 0, built.stderr);
  const requests = join(work, "requests.json");
  writeFileSync(requests, JSON.stringify(Object.values(JOBS)));
  const ref = spawnSync(python, ["-m", "baton_worker.models.demo_image.reference", modelDir, "--requests", requests, "--out-dir", refDir], { encoding: "utf8", env });
  assert.equal(ref.status, 0, ref.stderr);
});

describe("demo image generation", () => {
  let server: RunningServer;
  before(async () => {
    server = await startServer([modelDir]);
  });
  after(async () => {
    await server?.stop();
  });

  test("pixels and PNG bytes equal the plain-PyTorch reference loop at 32x32, 64x64 and 128x128", async () => {
    for (const name of ["fox", "small", "large"] as const) {
      const [png] = await images(server, JOBS[name]);
      assertReference(png!, name, 0);
    }
  });

  test("n=4 in one request: four different reference images, their denoise steps in forwards of 4", async () => {
    const before = await denoiserBatches(server);
    const res = await generate(server, { prompt: JOBS.four.prompt, seed: 42, n: 4, num_inference_steps: 4 });
    assert.equal(res.status, 200);
    const pngs = res.json.data.map((d) => Buffer.from(d.b64_json, "base64"));
    assert.equal(pngs.length, 4);
    pngs.forEach((png, i) => assertReference(png, "four", i));
    assert.equal(new Set(pngs.map((p) => p.toString("base64"))).size, 4, "the n images differ");
    // Usage: the prompt's UTF-8 bytes plus the start id; 8x8 latent positions per 64x64 image.
    assert.deepEqual(res.json.usage, { input_tokens: 15, input_tokens_details: { text_tokens: 15, image_tokens: 0 }, output_tokens: 256, total_tokens: 271 });
    const ran = batchesBetween(before, await denoiserBatches(server));
    assert.equal(ran.passes, 16, "4 images x 4 steps: exactly num_inference_steps denoiser passes each");
    // All four in one forward; a prompt admitted a step apart from the others (the engine
    // thread takes each submission as its own message) costs one extra forward at each end.
    assert.ok(ran.largest === 4 && ran.forwards <= 6, `the 4 images' steps batched (${JSON.stringify(ran)})`);
  });

  test("8 concurrent requests: each the reference's image, denoise steps batched across requests", async (t) => {
    const names = Array.from({ length: 8 }, (_, i) => `c${i}` as JobName);
    const before = await denoiserBatches(server);
    const results = await Promise.all(names.map((name) => images(server, JOBS[name])));
    results.forEach(([png], i) => assertReference(png!, names[i]!, 0));
    const ran = batchesBetween(before, await denoiserBatches(server));
    assert.equal(ran.passes, 32, "8 requests x 4 steps");
    assert.ok(ran.forwards < 32 && ran.largest > 1, `batched: ${JSON.stringify(ran)}`);
    t.diagnostic(`8 concurrent requests x 4 steps: ${ran.passes} denoiser passes in ${ran.forwards} forwards, largest batch <= ${ran.largest}`);
  });

  test("the same seed gives the same PNG bytes, alone or batched with other requests", async () => {
    const body = { prompt: "same seed", seed: 5, size: "64x64", num_inference_steps: 3 };
    const alone = await generate(server, body);
    assert.equal(alone.status, 200);
    const [together] = await Promise.all([
      generate(server, body),
      ...[1, 2, 3].map((i) => generate(server, { ...body, prompt: `neighbour ${i}`, seed: 50 + i })),
    ]);
    assert.equal(together!.json.data[0]!.b64_json, alone.json.data[0]!.b64_json);
    const other = await generate(server, { ...body, seed: 6 });
    assert.notEqual(other.json.data[0]!.b64_json, alone.json.data[0]!.b64_json);
    // Without a seed the server draws one: two requests differ.
    const [a, b] = await Promise.all([generate(server, { prompt: "no seed" }), generate(server, { prompt: "no seed" })]);
    assert.deepEqual([a.status, b.status], [200, 200], JSON.stringify([a.json, b.json]));
    assert.notEqual(a.json.data[0]!.b64_json, b.json.data[0]!.b64_json);
  });

  test("bad requests are 400s naming the field; the server keeps serving", async () => {
    const good = { prompt: "ok", seed: 1 };
    const cases: [Record<string, unknown>, string, RegExp][] = [
      [{ ...good, size: "100x100" }, "size", /32x32, 64x64, 128x128, 256x256/],
      [{ ...good, size: 64 }, "size", /string/],
      [{ ...good, n: 0 }, "n", /between 1 and 10/],
      [{ ...good, n: 11 }, "n", /between 1 and 10/],
      [{ ...good, n: "2" }, "n", /integer/],
      [{ ...good, n: 1.5 }, "n", /integer/],
      [{ ...good, num_inference_steps: 0 }, "num_inference_steps", /between 1 and 50/],
      [{ ...good, num_inference_steps: 51 }, "num_inference_steps", /between 1 and 50/],
      [{ ...good, num_inference_steps: "4" }, "num_inference_steps", /integer/],
      [{ ...good, response_format: "url" }, "response_format", /only b64_json/],
      [{ ...good, output_format: "jpeg" }, "output_format", /only png/],
      [{ ...good, stream: true }, "stream", /not supported/],
      [{ ...good, seed: "seven" }, "seed", /integer/],
      [{ seed: 1 }, "prompt", /required/],
      [{ prompt: "" }, "prompt", /non-empty/],
      [{ prompt: 42 }, "prompt", /string/],
    ];
    for (const [body, param, pattern] of cases) {
      const res = await generate(server, body);
      assert.equal(res.status, 400, `${JSON.stringify(body)} -> ${res.status}`);
      assert.equal(res.json.error?.param, param, JSON.stringify(res.json));
      assert.match(res.json.error!.message, pattern);
    }
    const ok = await generate(server, { ...good, size: "32x32", num_inference_steps: 1 });
    assert.equal(ok.status, 200);
    assert.equal(decodePng(Buffer.from(ok.json.data[0]!.b64_json, "base64")).width, 32);
  });

  test("text and speech routes answer a clear 400 naming the image route", async () => {
    const chat = await fetch(`${server.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "hi" }] }),
    });
    assert.equal(chat.status, 400);
    assert.match(await chat.text(), /does not produce text.*\/v1\/images\/generations/);
    const speech = await fetch(`${server.url}/v1/audio/speech`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ input: "hi", voice: "nova" }) });
    assert.equal(speech.status, 400);
  });

  test("image requests count in the request metrics as text requests do (each of the n images is one request)", async () => {
    const before = await requestTotals(server);
    const res = await generate(server, { prompt: "counted", seed: 9, n: 2, size: "32x32", num_inference_steps: 2 });
    assert.equal(res.status, 200);
    const now = await requestTotals(server);
    assert.equal(now.stop - before.stop, 2, "vllm:request_success_total{finished_reason=stop}");
    assert.equal(now.latencies - before.latencies, 2, "vllm:e2e_request_latency_seconds_count");
  });

  test("a client that leaves mid-request frees every tensor", async () => {
    const controller = new AbortController();
    const leaving = fetch(`${server.url}/v1/images/generations`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "leaving", n: 8, size: "256x256", num_inference_steps: 50 }),
      signal: controller.signal,
    }).catch(() => null);
    await new Promise((r) => setTimeout(r, 300));
    controller.abort();
    await leaving;
    const deadline = Date.now() + 10_000;
    for (;;) {
      const text = await (await fetch(`${server.url}/metrics`)).text();
      const held = Number(text.split("\n").find((l) => l.startsWith("baton:graph_tensors_held"))?.split(" ").at(-1));
      if (held === 0) break;
      assert.ok(Date.now() < deadline, `${held} tensors still held after the client left`);
      await new Promise((r) => setTimeout(r, 100));
    }
  });
});

describe("shutdown with an image request running", () => {
  test("the request ends with the server's 503 instead of running on, and the server exits 0", async () => {
    const server = await startServer([modelDir, "--shutdown-timeout", "0"]);
    try {
      const running = generate(server, { prompt: "interrupted", n: 8, size: "256x256", num_inference_steps: 50 });
      await new Promise((r) => setTimeout(r, 500));
      const exited = server.stop(30_000);
      const res = await running;
      assert.equal(res.status, 503, JSON.stringify(res.json));
      assert.match(res.json.error?.message ?? "", /shutting down/);
      assert.equal(await exited, 0);
    } finally {
      await server.stop();
    }
  });
});
