// Whisper through the real server and worker (a random-weight
// WhisperForConditionalGeneration built with transformers' own classes):
// /v1/audio/transcriptions and /translations give transformers' greedy
// tokens for clips of several lengths, 8 at once with decoder prompts cut
// into small prefill chunks, with timestamps on and off, a language given or
// detected, earlier text as a prompt, and long-form audio window by window;
// the stream's events; bad uploads are a 400 naming the problem; clients that
// leave mid-stream free every KV block and tensor.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { whisperLanguageName } from "../../src/text/whisper-transcript.js";
import { assertNothingHeld, processesMatching, removeDir, repoRoot, runPython, startServer, tempDir, type RunningServer } from "./harness.js";

const dir = tempDir("whisper");
after(() => removeDir(dir));
const EOT = 50256;
const TIMESTAMP_BEGIN = 50363;


/** A speech-like clip as a 16 kHz mono int16 WAV, and the same samples as float32 (what the worker decodes). */
function clip(seconds: number, seed: number): { wav: Buffer; samples: string } {
  const code = `import io, sys, wave, base64, json, numpy as np
rng = np.random.default_rng(${seed}); t = np.arange(int(${seconds} * 16000)) / 16000
f0 = 120 + 80 * rng.random() + 30 * np.sin(2 * np.pi * 0.7 * t); phase = 2 * np.pi * np.cumsum(f0) / 16000
voice = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t) ** 2)
pcm = np.clip((0.2 * voice + 0.02 * rng.standard_normal(t.shape)) * 32767, -32768, 32767).astype(np.int16)
b = io.BytesIO(); w = wave.open(b, "wb"); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(pcm.tobytes()); w.close()
print(json.dumps({"wav": b.getvalue().hex(), "samples": base64.b64encode((pcm / 32768).astype(np.float32).tobytes()).decode()}))`;
  const out = JSON.parse(runPython(["-c", code])) as { wav: string; samples: string };
  return { wav: Buffer.from(out.wav, "hex"), samples: out.samples };
}

interface Segment {
  start: number;
  end: number;
  text: string;
  tokens: number[];
}
interface Verbose {
  task: string;
  language: string;
  duration: number;
  text: string;
  segments: Segment[];
}

async function transcribe(url: string, path: string, fields: Record<string, string>, wav: Buffer | null): Promise<{ status: number; text: string }> {
  const form = new FormData();
  if (wav !== null) form.append("file", new Blob([new Uint8Array(wav)], { type: "audio/wav" }), "clip.wav");
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  const response = await fetch(`${url}${path}`, { method: "POST", body: form });
  return { status: response.status, text: await response.text() };
}

describe("Whisper: transcriptions and translations", () => {
  let server: RunningServer;
  before(async () => {
    runPython(["-m", "baton_worker.models.whisper.build", "--out", dir, "--tokenizer-dir", join(repoRoot, "node_modules", "@lenml", "tokenizer-gpt2", "models")]);
    // 1300 blocks of 4: a request holds 375 for its cross-attention K/V and up to 112 for its own, so 8 at once
    // wait for blocks and preempt each other.
    server = await startServer([dir, "--served-model-name", "whisper", "--max-num-batched-tokens", "8", "--block-size", "4", "--num-gpu-blocks-override", "1300"]);
  });
  after(() => server?.stop());

  test("greedy tokens equal transformers' generate, 8 requests at once", async () => {
    const clips = [clip(1, 1), clip(4.5, 2), clip(12, 3), clip(30, 4), clip(4.5, 5), clip(7, 6), clip(2, 7), clip(45, 8)];
    interface Case {
      path: string;
      fields: Record<string, string>;
      language: string | null;
      task: string;
      timestamps: boolean;
      prompt: string | null;
    }
    const cases: Case[] = [
      { path: "/v1/audio/transcriptions", fields: { language: "en", response_format: "json" }, language: "en", task: "transcribe", timestamps: false, prompt: null },
      { path: "/v1/audio/transcriptions", fields: { language: "en", response_format: "verbose_json" }, language: "en", task: "transcribe", timestamps: true, prompt: null },
      { path: "/v1/audio/translations", fields: { response_format: "verbose_json" }, language: null, task: "translate", timestamps: true, prompt: null },
      { path: "/v1/audio/transcriptions", fields: { response_format: "verbose_json" }, language: null, task: "transcribe", timestamps: true, prompt: null },
      { path: "/v1/audio/transcriptions", fields: { language: "english", prompt: "Earlier words here.", response_format: "json" }, language: "en", task: "transcribe", timestamps: false, prompt: "Earlier words here." },
      { path: "/v1/audio/transcriptions", fields: { language: "de", response_format: "text" }, language: "de", task: "transcribe", timestamps: false, prompt: null },
      { path: "/v1/audio/translations", fields: { response_format: "json", prompt: "Context." }, language: null, task: "translate", timestamps: false, prompt: "Context." },
      { path: "/v1/audio/transcriptions", fields: { language: "en", response_format: "verbose_json" }, language: "en", task: "transcribe", timestamps: true, prompt: null },
    ];
    const responses = await Promise.all(cases.map((c, i) => transcribe(server.url, c.path, { model: "whisper", ...c.fields }, clips[i]!.wav)));
    responses.forEach((r, i) => assert.equal(r.status, 200, `case ${i}: ${r.text}`));
    const input = JSON.stringify({
      model_dir: dir,
      max_new_tokens: 0,
      cases: cases.map((c, i) => ({ audio: clips[i]!.samples, language: c.language, task: c.task, timestamps: c.timestamps, prompt: c.prompt })),
    });
    const expected = (JSON.parse(runPython([join(repoRoot, "python", "tests", "whisper_reference.py")], input)) as { results: { tokens: number[]; text: string; language: string }[] }).results;
    const generated = (ids: number[]): number[] => ids.filter((t) => t < EOT || t >= TIMESTAMP_BEGIN);
    let withTimestamps = 0;
    responses.forEach((r, i) => {
      const c = cases[i]!;
      const want = expected[i]!;
      assert.ok(generated(want.tokens).length >= 5, `case ${i}: the reference generated too little to compare`);
      if (c.fields.response_format === "verbose_json") {
        const body = JSON.parse(r.text) as Verbose;
        assert.deepEqual(body.segments.flatMap((s) => s.tokens), generated(want.tokens), `case ${i}: tokens`);
        if (body.segments.some((s) => s.tokens.some((t) => t >= TIMESTAMP_BEGIN))) withTimestamps++;
        assert.equal(body.text, want.text, `case ${i}: text`);
        assert.equal(body.task, c.task === "translate" ? "translate" : "transcribe");
        if (c.language === null) assert.equal(body.language, whisperLanguageName(want.language), `case ${i}: detected language`);
      } else {
        const text = c.fields.response_format === "text" ? r.text.replace(/\n$/, "") : (JSON.parse(r.text) as { text: string }).text;
        assert.equal(text, want.text, `case ${i}: text`);
      }
    });
    assert.ok(withTimestamps >= 2, "transcripts with timestamps");
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    const preemptions = Number(/^vllm:num_preemptions_total(?:\{[^}]*\})? (\S+)$/m.exec(metrics)?.[1]);
    assert.ok(preemptions > 0, `requests were preempted (${preemptions}), their cross-attention K/V recomputed`);
    const long = JSON.parse(responses[7]!.text) as Verbose;
    assert.equal(long.duration, 45);
    assert.ok(long.segments.at(-1)!.end > 30, "the long clip's segments run past the first window");
    const texts = new Set(expected.map((e) => e.text));
    assert.ok(texts.size >= 6, "transcripts differ between clips");
  });

  test("srt and vtt carry the segments; a stream sends text deltas then the whole text", async () => {
    const { wav } = clip(6, 11);
    const verbose = JSON.parse((await transcribe(server.url, "/v1/audio/transcriptions", { language: "en", response_format: "verbose_json" }, wav)).text) as Verbose;
    const srt = await transcribe(server.url, "/v1/audio/transcriptions", { language: "en", response_format: "srt" }, wav);
    assert.equal(srt.status, 200);
    assert.equal(srt.text.split("\n\n").filter((cue) => cue.trim() !== "").length, verbose.segments.length);
    assert.match(srt.text, /^1\n\d\d:\d\d:\d\d,\d\d\d --> \d\d:\d\d:\d\d,\d\d\d\n/);
    const vtt = await transcribe(server.url, "/v1/audio/transcriptions", { language: "en", response_format: "vtt" }, wav);
    assert.match(vtt.text, /^WEBVTT\n\n\d\d:\d\d:\d\d\.\d\d\d --> /);
    const json = JSON.parse((await transcribe(server.url, "/v1/audio/transcriptions", { language: "en" }, wav)).text) as { text: string };
    const stream = await transcribe(server.url, "/v1/audio/transcriptions", { language: "en", stream: "true" }, wav);
    assert.equal(stream.status, 200);
    const events = stream.text.split("\n\n").filter((e) => e.startsWith("data: ") && e !== "data: [DONE]").map((e) => JSON.parse(e.slice(6)) as { type: string; delta?: string; text?: string });
    const deltas = events.filter((e) => e.type === "transcript.text.delta");
    assert.ok(deltas.length > 1, "several deltas");
    assert.deepEqual(events.at(-1), { type: "transcript.text.done", text: json.text });
    assert.equal(deltas.map((e) => e.delta).join(""), json.text);
  });

  test("the openai Python client transcribes, translates and streams", async () => {
    const { wav } = clip(5, 15);
    const path = join(dir, "client.wav");
    writeFileSync(path, wav);
    const json = JSON.parse((await transcribe(server.url, "/v1/audio/transcriptions", { language: "en" }, wav)).text) as { text: string };
    const translated = JSON.parse((await transcribe(server.url, "/v1/audio/translations", {}, wav)).text) as { text: string };
    const code = `import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
with open(sys.argv[2], "rb") as f:
    text = client.audio.transcriptions.create(model="whisper", file=f, language="en").text
with open(sys.argv[2], "rb") as f:
    verbose = client.audio.transcriptions.create(model="whisper", file=f, language="en", response_format="verbose_json", timestamp_granularities=["segment"])
with open(sys.argv[2], "rb") as f:
    translation = client.audio.translations.create(model="whisper", file=f).text
with open(sys.argv[2], "rb") as f:
    events = [e.type + ":" + (getattr(e, "delta", None) or getattr(e, "text", "")) for e in client.audio.transcriptions.create(model="whisper", file=f, language="en", stream=True)]
print(json.dumps({"text": text, "segments": len(verbose.segments), "language": verbose.language, "translation": translation, "events": events}))`;
    const out = JSON.parse(runPython(["-c", code, server.url, path])) as { text: string; segments: number; language: string; translation: string; events: string[] };
    assert.equal(out.text, json.text);
    assert.equal(out.translation, translated.text);
    assert.equal(out.language, "english");
    assert.ok(out.segments >= 1);
    assert.equal(out.events.at(-1), `transcript.text.done:${json.text}`);
    assert.equal(out.events.slice(0, -1).map((e) => e.replace(/^transcript\.text\.delta:/, "")).join(""), json.text);
  });

  test("bad uploads are a 400 naming the problem", async () => {
    const { wav } = clip(1, 12);
    const cases: [Record<string, string>, Buffer | null, RegExp, string | null][] = [
      [{}, null, /file is required/, "file"],
      [{}, Buffer.alloc(0), /the file is empty/, "file"],
      [{}, Buffer.from("this is not audio at all, just text"), /file: not a readable audio file/, "file"],
      [{ language: "klingon" }, wav, /language: unknown language "klingon"/, "language"],
      [{ response_format: "xml" }, wav, /response_format must be one of/, "response_format"],
      [{ temperature: "hot" }, wav, /temperature must be a number/, "temperature"],
      [{ "timestamp_granularities[]": "word", response_format: "verbose_json" }, wav, /word timestamps are not supported/, "timestamp_granularities[]"],
      [{ stream: "true", response_format: "srt" }, wav, /response_format srt is not streamed/, "stream"],
      [{ voice: "x" }, wav, /unknown form field "voice"/, "voice"],
      [{ model: "other" }, wav, /other/, null],
    ];
    for (const [fields, file, message, param] of cases) {
      const r = await transcribe(server.url, "/v1/audio/transcriptions", fields, file);
      const body = JSON.parse(r.text) as { error: { message: string; param: string | null } };
      assert.equal(r.status, fields.model === "other" ? 404 : 400, `${JSON.stringify(fields)}: ${r.text}`);
      assert.match(body.error.message, message);
      if (param !== null) assert.equal(body.error.param, param);
    }
    const big = await transcribe(server.url, "/v1/audio/transcriptions", {}, Buffer.alloc(25 * 1024 * 1024 + 10));
    assert.equal(big.status, 400);
    assert.match(big.text, /larger than 26214400 bytes/);
  });

  test("200 clients that leave mid-stream or mid-request free every KV block and tensor", async () => {
    const { wav } = clip(8, 13);
    const clients = Array.from({ length: 200 }, async (_, i) => {
      const controller = new AbortController();
      const form = new FormData();
      form.append("file", new Blob([new Uint8Array(wav)]), "a.wav");
      // Every third client asks without a language (its detection request may be what it leaves) and
      // every other one without a stream (it leaves before any byte comes back).
      if (i % 3 !== 0) form.append("language", "en");
      const streamed = i % 2 === 0;
      if (streamed) form.append("stream", "true");
      try {
        if (!streamed) setTimeout(() => controller.abort(), 20 + (i % 10) * 30);
        const response = await fetch(`${server.url}/v1/audio/transcriptions`, { method: "POST", body: form, signal: controller.signal });
        const reader = response.body!.getReader();
        for (let k = 0; k < 1 + (i % 4); k++) await reader.read();
        controller.abort();
      } catch {
        // Aborted before or while reading: what the test wants.
      }
    });
    await Promise.all(clients);
    await assertNothingHeld(server.url);
    // And the server still answers.
    const r = await transcribe(server.url, "/v1/audio/transcriptions", { language: "en" }, wav);
    assert.equal(r.status, 200);
  });

  test("a worker killed mid-transcription: those requests fail with 503, the worker restarts, the same audio transcribes as before", async () => {
    const { wav } = clip(8, 14);
    const before = await transcribe(server.url, "/v1/audio/transcriptions", { language: "en" }, wav);
    assert.equal(before.status, 200);
    const inFlight = Array.from({ length: 3 }, () => transcribe(server.url, "/v1/audio/transcriptions", { language: "en" }, wav));
    await new Promise((r) => setTimeout(r, 300));
    const workers = processesMatching(dir).filter((pid) => pid !== server.proc.pid);
    assert.equal(workers.length, 1, `one worker (${workers.join(", ")})`);
    process.kill(workers[0]!, "SIGKILL");
    for (const r of await Promise.all(inFlight)) {
      // A request that finished before the kill is whole; the others are refused as the worker's loss.
      if (r.status === 200) assert.equal(r.text, before.text);
      else assert.equal(r.status, 503, r.text);
    }
    const deadline = Date.now() + 60_000;
    while ((await fetch(`${server.url}/health`)).status !== 200) {
      assert.ok(Date.now() < deadline, "the worker came back");
      await new Promise((r) => setTimeout(r, 200));
    }
    const after = await transcribe(server.url, "/v1/audio/transcriptions", { language: "en" }, wav);
    assert.equal(after.status, 200, after.text);
    assert.equal(after.text, before.text);
  });
});
