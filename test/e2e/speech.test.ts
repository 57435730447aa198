// The demo text-to-speech graph (llm -> sliding window -> codec) served for
// real: the bytes of /v1/audio/speech and of multipart /generate equal the
// plain-PyTorch reference loop's, colocated and on two workers; audio streams
// long before the LLM is done; clients that leave mid-stream free everything;
// text endpoints and bad requests answer 400.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { python, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";
import { workerPids } from "../reliability/helpers.js";

const modelDir = join(repoRoot, "models", "demo-tts");
const skip = !existsSync(join(modelDir, "config.json")) && "no demo-tts model (npm run setup builds it)";
const work = tempDir("baton-speech-");
after(() => removeDir(work));

/** The reference loop's PCM for one request (python/baton_worker/models/demo_tts/reference.py). */
function referencePcm(text: string, voice: string, seed: number, maxTokens?: number): Buffer {
  const out = join(work, `ref-${seed}-${voice}-${maxTokens ?? "cap"}-${Buffer.from(text).toString("hex").slice(0, 32)}.pcm`);
  if (existsSync(out)) return readFileSync(out);
  const args = ["-m", "baton_worker.models.demo_tts.reference", modelDir, "--text", text, "--voice", voice, "--seed", String(seed), "--out", out];
  if (maxTokens !== undefined) args.push("--max-tokens", String(maxTokens));
  const run = spawnSync(python, args, { cwd: join(repoRoot, "python"), encoding: "utf8", env: { ...process.env, OMP_NUM_THREADS: "1" } });
  assert.equal(run.status, 0, run.stderr);
  return readFileSync(out);
}

interface Streamed {
  status: number;
  body: Buffer;
  firstByteMs: number;
  totalMs: number;
}

/** POSTs and reads the whole response, timing its first body byte. */
function post(url: string, body: string | Buffer, headers: Record<string, string>): Promise<Streamed> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: "POST", headers }, (res) => {
      const chunks: Buffer[] = [];
      let firstByteMs = -1;
      res.on("data", (c: Buffer) => {
        if (firstByteMs < 0) firstByteMs = performance.now() - started;
        chunks.push(c);
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks), firstByteMs, totalMs: performance.now() - started }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

function speech(server: RunningServer, body: Record<string, unknown>): Promise<Streamed> {
  return post(`${server.url}/v1/audio/speech`, JSON.stringify(body), { "content-type": "application/json" });
}

function multipart(fields: Record<string, string>): { body: Buffer; headers: Record<string, string> } {
  const boundary = "----baton-test-boundary";
  const parts = Object.entries(fields).map(([k, v]) => `--${boundary}\r\ncontent-disposition: form-data; name="${k}"\r\n\r\n${v}\r\n`);
  return { body: Buffer.from(`${parts.join("")}--${boundary}--\r\n`), headers: { "content-type": `multipart/form-data; boundary=${boundary}` } };
}

async function metric(server: RunningServer, name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name));
  assert.ok(line !== undefined, `metric ${name} missing`);
  return Number(line.split(" ").at(-1));
}

const TEXT = "Hello there, how are you today?";

describe("demo text-to-speech, one worker", { skip }, () => {
  let server: RunningServer;
  before(async () => {
    server = await startServer([modelDir]);
  });
  after(async () => {
    await server?.stop();
  });

  test("/v1/audio/speech pcm and wav carry the reference loop's bytes", async () => {
    const ref = referencePcm(TEXT, "nova", 7, 250);
    assert.ok(ref.length > 10_000);
    const pcm = await speech(server, { input: TEXT, voice: "nova", seed: 7, response_format: "pcm", max_tokens: 250 });
    assert.equal(pcm.status, 200);
    assert.ok(pcm.body.equals(ref), `pcm differs (${pcm.body.length} vs ${ref.length} bytes)`);
    const wav = await speech(server, { input: TEXT, voice: "nova", seed: 7, max_tokens: 250 });
    assert.equal(wav.body.subarray(0, 4).toString(), "RIFF");
    assert.equal(wav.body.readUInt32LE(24), 24_000, "sample rate");
    assert.ok(wav.body.subarray(44).equals(ref));
  });

  test("multipart /generate gives the same bytes, streamed as NDJSON and collected as JSON", async () => {
    const ref = referencePcm("Good morning.", "alloy", 3, 200);
    const fields = { text: "Good morning.", model_kwargs: JSON.stringify({ voice: "alloy", seed: 3, max_tokens: 200 }) };
    const streamed = multipart({ ...fields, streaming: "true" });
    const res = await post(`${server.url}/generate`, streamed.body, streamed.headers);
    assert.equal(res.status, 200);
    const lines = res.body.toString().trim().split("\n").map((l) => JSON.parse(l) as { modality: string; data: string });
    assert.ok(lines.length > 1 && lines.every((l) => l.modality === "audio"));
    assert.ok(Buffer.concat(lines.map((l) => Buffer.from(l.data, "base64"))).equals(ref));
    const collected = multipart({ ...fields, streaming: "false", request_id: "mine-1" });
    const whole = await post(`${server.url}/generate`, collected.body, collected.headers);
    const json = JSON.parse(whole.body.toString()) as { request_id: string; outputs: { audio: { data: string }[] } };
    assert.equal(json.request_id, "mine-1");
    assert.ok(Buffer.concat(json.outputs.audio.map((c) => Buffer.from(c.data, "base64"))).equals(ref));
  });

  test("the first audio bytes leave before half of a 10-word request's time", async () => {
    const words = Array.from({ length: 10 }, (_, i) => ["speak", "softly", "and", "carry", "a", "tune"][i % 6]).join(" ");
    const res = await speech(server, { input: words, voice: "nova", seed: 11, response_format: "pcm", max_tokens: 600 });
    assert.equal(res.status, 200);
    assert.ok(res.firstByteMs < res.totalMs / 2, `first byte at ${res.firstByteMs.toFixed(0)} ms of ${res.totalMs.toFixed(0)} ms`);
  });

  test("text endpoints and bad speech requests are 400s that say why", async () => {
    const chat = await post(`${server.url}/v1/chat/completions`, JSON.stringify({ messages: [{ role: "user", content: "hi" }] }), { "content-type": "application/json" });
    assert.equal(chat.status, 400);
    assert.match(chat.body.toString(), /does not produce text/);
    for (const [body, pattern] of [
      [{ input: TEXT, voice: "nova", response_format: "mp3" }, /response_format "mp3"/],
      [{ input: TEXT, voice: "nova", speed: 1.5 }, /speed 1.5/],
      [{ input: TEXT, voice: "hal" }, /voice/],
      [{ voice: "nova" }, /input/],
    ] as const) {
      const res = await speech(server, body);
      assert.equal(res.status, 400, res.body.toString());
      assert.match((JSON.parse(res.body.toString()) as { error: { message: string } }).error.message, pattern);
    }
  });

  test("200 clients that leave mid-stream free every KV block and tensor", async () => {
    const cuts = Array.from({ length: 200 }, (_, i) => i);
    for (let start = 0; start < cuts.length; start += 25) {
      await Promise.all(
        cuts.slice(start, start + 25).map(
          (i) =>
            new Promise<void>((resolve) => {
              const req = httpRequest(`${server.url}/v1/audio/speech`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
                let got = 0;
                const limit = (i * 7919) % 8_000; // 0 to ~8 kB: before the first chunk, within a few chunks
                res.on("data", (c: Buffer) => {
                  got += c.length;
                  if (got >= limit) req.destroy();
                });
                res.on("close", () => resolve());
                res.on("error", () => resolve());
              });
              req.on("error", () => resolve());
              req.end(JSON.stringify({ input: `cut number ${i}`, voice: "nova", seed: i, response_format: "pcm" }));
              if (i % 5 === 0) setTimeout(() => req.destroy(), (i % 13) * 5);
            }),
        ),
      );
    }
    const deadline = Date.now() + 20_000;
    for (;;) {
      const [running, usage, held] = [
        await metric(server, "vllm:num_requests_running"),
        await metric(server, "vllm:kv_cache_usage_perc"),
        await metric(server, "baton:graph_tensors_held"),
      ];
      if (running === 0 && usage === 0 && held === 0) break;
      assert.ok(Date.now() < deadline, `still held after the cuts: running ${running}, kv usage ${usage}, tensors ${held}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    // And it still serves the same bytes.
    const res = await speech(server, { input: "Good morning.", voice: "alloy", seed: 3, response_format: "pcm", max_tokens: 200 });
    assert.ok(res.body.equals(referencePcm("Good morning.", "alloy", 3, 200)));
  });
});

describe("demo text-to-speech, llm and codec on two workers", { skip }, () => {
  let server: RunningServer;
  before(async () => {
    const deployment = join(work, "two.yaml");
    writeFileSync(deployment, "node_groups:\n  - node_names: [llm]\n    ranks: [0]\n  - node_names: [codec]\n    ranks: [1]\n");
    server = await startServer([modelDir, "--deployment", deployment]);
  });
  after(async () => {
    await server?.stop();
  });

  test("the same request and seed give the same bytes as one worker and the reference", async () => {
    const ref = referencePcm(TEXT, "nova", 7, 250);
    const res = await speech(server, { input: TEXT, voice: "nova", seed: 7, response_format: "pcm", max_tokens: 250 });
    assert.equal(res.status, 200);
    assert.ok(res.body.equals(ref), `differs (${res.body.length} vs ${ref.length} bytes)`);
  });

  test("the two ranks' workers share the host's cores", () => {
    const pids = workerPids(server);
    assert.equal(pids.length, 2);
    for (const pid of pids) assert.match(readFileSync(`/proc/${pid}/cmdline`, "utf8"), /\x00--host-workers\x002\x00/);
  });

  test("a deployment naming an unknown node is refused at start in one line", async () => {
    const bad = join(work, "bad.yaml");
    writeFileSync(bad, "node_groups:\n  - node_names: [llm, vocoder]\n    ranks: [0]\n");
    await assert.rejects(startServer([modelDir, "--deployment", bad], 60_000), /vocoder/);
  });
});
