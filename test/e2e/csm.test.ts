// Sesame's CSM through the real server and workers (a random-weight
// CsmForConditionalGeneration built with transformers' own classes): the PCM of
// /v1/audio/speech and of the multipart /generate (voice prompting: reference
// clips and their transcripts as context) is transformers' greedy generate +
// Mimi decode, 8 requests at once with prompts cut into small prefill chunks
// and blocks scarce enough to preempt, colocated and with the codec on a
// worker of its own; the openai client speaks; bad requests are a 400 naming
// the field; clients that leave free everything; a killed worker recovers.

import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { assertNothingHeld, metricValue, processesMatching, removeDir, repoRoot, runPython, startServer, tempDir, type RunningServer } from "./harness.js";

const dir = tempDir("csm");
after(() => removeDir(dir));
const MAX_FRAMES = 200;

/** A voice-like 24 kHz mono int16 WAV (a reference clip for voice prompting), written under dir. */
function clip(seconds: number, seed: number): string {
  const path = join(dir, `clip-${seed}.wav`);
  runPython(["-c", `import wave, numpy as np
rng = np.random.default_rng(${seed}); t = np.arange(int(${seconds} * 24000)) / 24000
f0 = 110 + 90 * rng.random() + 25 * np.sin(2 * np.pi * 0.9 * t); phase = 2 * np.pi * np.cumsum(f0) / 24000
x = sum(np.sin(k * phase) / k for k in range(1, 6)) * 0.25 + 0.01 * rng.standard_normal(t.shape)
w = wave.open(${JSON.stringify(path)}, "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(24000)
w.writeframes(np.clip(x * 32767, -32768, 32767).astype("<i2").tobytes()); w.close()`]);
  return path;
}

interface Case {
  text: string;
  speaker: string;
  context: { text: string; speaker: string; wav: string }[];
}

/** transformers' PCM (s16le) and frames per case (python/tests/csm_reference.py). */
function reference(cases: Case[]): { frames: number[][]; pcm: Buffer }[] {
  const out = JSON.parse(runPython([join(repoRoot, "python", "tests", "csm_reference.py")], JSON.stringify({ model_dir: dir, max_new_frames: MAX_FRAMES, cases }))) as {
    results: { frames: number[][]; pcm: string }[];
  };
  return out.results.map((r) => ({ frames: r.frames, pcm: Buffer.from(r.pcm, "base64") }));
}

interface Response {
  status: number;
  body: Buffer;
  /** The body ended properly (not cut by the server mid-stream). */
  complete: boolean;
}

function post(url: string, body: string | Buffer, headers: Record<string, string>): Promise<Response> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: "POST", headers }, (res) => {
      const chunks: Buffer[] = [];
      let complete = false;
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => (complete = true));
      res.on("error", () => undefined);
      res.on("close", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks), complete }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

function speech(server: RunningServer, c: Case, extra: Record<string, unknown> = {}): Promise<Response> {
  assert.equal(c.context.length, 0, "speech has no context: use generate");
  const body = { model: "csm", input: c.text, voice: c.speaker, response_format: "pcm", temperature: 0, max_tokens: MAX_FRAMES, ...extra };
  return post(`${server.url}/v1/audio/speech`, JSON.stringify(body), { "content-type": "application/json" });
}

/** M*'s multipart /generate, its audio chunks joined (streamed as NDJSON or one JSON body). */
async function generate(server: RunningServer, c: Case, streaming: boolean, kwargs: Record<string, unknown> = {}): Promise<Response> {
  const form = new FormData();
  form.append("text", c.text);
  form.append("streaming", String(streaming));
  const context = c.context.length === 0 ? {} : { context_text: c.context.map((x) => x.text), context_voice: c.context.map((x) => x.speaker) };
  form.append("model_kwargs", JSON.stringify({ voice: c.speaker, temperature: 0, max_tokens: MAX_FRAMES, ...context, ...kwargs }));
  for (const x of c.context) form.append("files", new Blob([new Uint8Array(readFileSync(x.wav))], { type: "audio/wav" }), "ref.wav");
  const response = await fetch(`${server.url}/generate`, { method: "POST", body: form });
  const text = await response.text();
  if (response.status !== 200) return { status: response.status, body: Buffer.from(text), complete: true };
  const chunks: { modality: string; data: string }[] = streaming
    ? text.split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as { modality: string; data: string })
    : (JSON.parse(text) as { outputs: { audio?: { data: string }[] } }).outputs.audio?.map((a) => ({ modality: "audio", data: a.data })) ?? [];
  assert.ok(chunks.every((ch) => ch.modality === "audio"), text.slice(0, 200));
  return { status: 200, body: Buffer.concat(chunks.map((ch) => Buffer.from(ch.data, "base64"))), complete: true };
}

/** Same number of samples, every sample within one step of transformers' (see docs/benchmarks.md: a decode of other lengths rounds differently). */
function assertSamePcm(got: Buffer, want: Buffer, what: string): void {
  assert.equal(got.length, want.length, `${what}: ${got.length / 2} samples, transformers ${want.length / 2}`);
  assert.ok(want.length >= 2 * 1920 * 3, `${what}: the reference spoke too little to compare`);
  let worst = 0;
  let differing = 0;
  for (let i = 0; i < got.length; i += 2) {
    const d = Math.abs(got.readInt16LE(i) - want.readInt16LE(i));
    worst = Math.max(worst, d);
    if (d > 0) differing++;
  }
  assert.ok(worst <= 1, `${what}: a sample differs by ${worst}`);
  assert.ok(differing <= got.length / 2 / 100, `${what}: ${differing} of ${got.length / 2} samples differ`);
}


const TEXTS = [
  "Hello from Sesame.",
  "The past is just a story we tell ourselves.",
  "Good morning, how did you sleep?",
  "Numbers like 42 and 7 are read aloud.",
  "A much longer sentence, with commas, pauses and a question at the end of it?",
  "Yes.",
];

describe("CSM: speech from a Hugging Face directory", () => {
  let server: RunningServer;
  let cases: Case[];
  let expected: { frames: number[][]; pcm: Buffer }[];
  before(async () => {
    runPython(["-m", "baton_worker.models.csm.build", "--out", dir, "--tokenizer-dir", join(repoRoot, "node_modules", "@lenml", "tokenizer-llama3", "models")]);
    const [a, b] = [clip(0.9, 1), clip(1.6, 2)];
    cases = [
      ...TEXTS.map((text, i) => ({ text, speaker: String(i % 2), context: [] })),
      { text: "Now say it in my voice.", speaker: "1", context: [{ text: "This is how I sound.", speaker: "1", wav: a }] },
      { text: "And we answer together.", speaker: "0", context: [{ text: "First speaker.", speaker: "0", wav: a }, { text: "Second one here.", speaker: "1", wav: b }] },
    ];
    expected = reference(cases);
    // 56 blocks of 4 for 8 requests of 60 to 140 positions, 8 tokens a step: requests wait, prompts go in
    // small chunks and running requests are preempted (recomputed from the frames the worker kept).
    server = await startServer([dir, "--served-model-name", "csm", "--block-size", "4", "--num-gpu-blocks-override", "56", "--max-num-batched-tokens", "8"]);
  });
  after(() => server?.stop());

  test("8 requests at once give transformers' greedy speech, sample for sample, preempted or not", async () => {
    const responses = await Promise.all(cases.map((c, i) => (c.context.length > 0 ? generate(server, c, i % 2 === 0) : speech(server, c))));
    responses.forEach((r, i) => {
      assert.equal(r.status, 200, `case ${i}: ${r.body.toString().slice(0, 300)}`);
      assertSamePcm(r.body, expected[i]!.pcm, `case ${i}`);
    });
    const lengths = new Set(expected.map((e) => e.frames.length));
    assert.ok(lengths.size >= 4, "requests stop after different numbers of frames");
    assert.ok(expected.every((e) => e.frames.length < MAX_FRAMES && e.frames.at(-1)!.slice(0, -1).every((c) => c === 0)), "every reference ended on its stop frame");
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.ok(metricValue(metrics, "vllm:num_preemptions_total") > 0, "some requests were preempted");
  });

  test("the openai Python client speaks; a seed makes sampled speech repeatable", async () => {
    const c = cases[1]!;
    const code = `import json, sys, base64
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
whole = client.audio.speech.create(model="csm", voice="${c.speaker}", input=${JSON.stringify(c.text)}, response_format="pcm", extra_body={"temperature": 0, "max_tokens": ${MAX_FRAMES}}).content
with client.audio.speech.with_streaming_response.create(model="csm", voice="${c.speaker}", input=${JSON.stringify(c.text)}, response_format="wav", extra_body={"temperature": 0, "max_tokens": ${MAX_FRAMES}}) as r:
    chunks = list(r.iter_bytes())
print(json.dumps({"pcm": base64.b64encode(whole).decode(), "wav": base64.b64encode(b"".join(chunks)).decode(), "chunks": len(chunks)}))`;
    const out = JSON.parse(runPython(["-c", code, server.url])) as { pcm: string; wav: string; chunks: number };
    assertSamePcm(Buffer.from(out.pcm, "base64"), expected[1]!.pcm, "openai pcm");
    const wav = Buffer.from(out.wav, "base64");
    assert.equal(wav.subarray(0, 4).toString(), "RIFF");
    assertSamePcm(wav.subarray(44), expected[1]!.pcm, "openai wav");
    const sampled = (seed: number): Promise<Response> => speech(server, cases[2]!, { temperature: 0.9, seed, max_tokens: 40 });
    const [x, y, z] = await Promise.all([sampled(7), sampled(7), sampled(8)]);
    assert.equal(x.status, 200);
    // The same frames; the codec's windows may batch with other requests' and round otherwise (one step at most).
    assertSamePcm(y.body, x.body, "the same seed");
    const close = z.body.length === x.body.length && z.body.every((_, i) => i % 2 === 1 || Math.abs(z.body.readInt16LE(i) - x.body.readInt16LE(i)) <= 1);
    assert.ok(!close, "another seed speaks otherwise");
    // No temperature and no max_tokens: generation_config.json's sampling (0.9, top-k 50), at most its 125 frames.
    const defaults = await post(`${server.url}/v1/audio/speech`, JSON.stringify({ input: TEXTS[4], voice: "1", response_format: "pcm", seed: 3 }), { "content-type": "application/json" });
    assert.equal(defaults.status, 200);
    assert.ok(defaults.body.length > 0 && defaults.body.length <= 125 * 1920 * 2, `${defaults.body.length / 2} samples`);
  });

  test("bad requests are a 400 naming the field", async () => {
    const bad = async (r: Promise<Response>, status: number, message: RegExp): Promise<void> => {
      const res = await r;
      assert.equal(res.status, status, res.body.toString());
      assert.match((JSON.parse(res.body.toString()) as { error: { message: string } }).error.message, message);
    };
    await bad(speech(server, { text: "Hi.", speaker: "alice", context: [] }), 400, /voice/);
    await bad(speech(server, { text: "", speaker: "0", context: [] }), 400, /input/);
    await bad(speech(server, { text: "Hi.", speaker: "0", context: [] }, { response_format: "mp3" }), 400, /response_format/);
    const a = clip(0.5, 3);
    await bad(generate(server, { text: "Hi.", speaker: "0", context: [{ text: "", speaker: "0", wav: a }] }, false), 400, /context_text/);
    const junk = join(dir, "junk.wav");
    writeFileSync(junk, "this is not audio at all");
    await bad(generate(server, { text: "Hi.", speaker: "0", context: [{ text: "Words.", speaker: "0", wav: junk }] }, false), 400, /files\[0\]|audio/);
  });

  test("200 clients that leave mid-stream or before any byte free every KV block and tensor", async () => {
    const clients = Array.from({ length: 200 }, async (_, i) => {
      const controller = new AbortController();
      try {
        if (i % 2 === 1) setTimeout(() => controller.abort(), 10 + (i % 7) * 25);
        const response = await fetch(`${server.url}/v1/audio/speech`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ input: TEXTS[i % TEXTS.length], voice: String(i % 2), response_format: "pcm", temperature: 0.9, seed: i, max_tokens: 60 }),
          signal: controller.signal,
        });
        const reader = response.body!.getReader();
        for (let k = 0; k < 1 + (i % 3); k++) await reader.read();
        controller.abort();
      } catch {
        // Aborted before or while reading: what the test wants.
      }
    });
    await Promise.all(clients);
    await assertNothingHeld(server.url);
    const r = await speech(server, cases[0]!);
    assertSamePcm(r.body, expected[0]!.pcm, "after the disconnects");
  });

  test("a worker killed mid-speech: those requests fail, the worker restarts, the same text speaks the same", async () => {
    const inFlight = [0, 1, 4].map((i) => speech(server, cases[i]!));
    await new Promise((r) => setTimeout(r, 150));
    const workers = processesMatching(dir).filter((pid) => pid !== server.proc.pid);
    assert.equal(workers.length, 1, `one worker (${workers.join(", ")})`);
    process.kill(workers[0]!, "SIGKILL");
    // Done before the kill: whole. Streaming: cut without its last chunk. Not started yet: a 503.
    for (const [k, r] of (await Promise.all(inFlight)).entries()) {
      if (r.status !== 200) assert.equal(r.status, 503, r.body.toString());
      else if (r.complete) assertSamePcm(r.body, expected[[0, 1, 4][k]!]!.pcm, "finished before the kill");
    }
    const deadline = Date.now() + 60_000;
    while ((await fetch(`${server.url}/health`)).status !== 200) {
      assert.ok(Date.now() < deadline, "the worker came back");
      await new Promise((r) => setTimeout(r, 200));
    }
    const again = await speech(server, cases[4]!);
    assert.equal(again.status, 200);
    assertSamePcm(again.body, expected[4]!.pcm, "after the restart");
  });

  test("with the codec on a worker of its own, the same speech", async () => {
    const deployment = join(dir, "two.yaml");
    writeFileSync(deployment, "node_groups:\n  - node_names: [backbone]\n    ranks: [0]\n  - node_names: [codec]\n    ranks: [1]\n");
    const split = await startServer([dir, "--served-model-name", "csm", "--deployment", deployment]);
    try {
      const picked = [0, 3, 6, 7];
      const responses = await Promise.all(picked.map((i) => (cases[i]!.context.length > 0 ? generate(split, cases[i]!, true) : speech(split, cases[i]!))));
      responses.forEach((r, k) => {
        assert.equal(r.status, 200, r.body.toString().slice(0, 300));
        assertSamePcm(r.body, expected[picked[k]!]!.pcm, `split case ${picked[k]}`);
      });
    } finally {
      await split.stop();
    }
  });
});
