// /v1/audio/speech request bodies and the audio framing clients decode: the
// refusals name the parameter, and a WAV header is one Python's `wave` reads.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { UNKNOWN_SIZE, wavHeader } from "../../src/frontend/audio-encoding.js";
import { ApiError } from "../../src/frontend/openai-error.js";
import { parseSpeechRequest } from "../../src/frontend/request-validation.js";
import { resolvePythonEnv } from "../../src/worker/python-env.js";

function refused(body: unknown, param: string, message: RegExp) {
  assert.throws(
    () => parseSpeechRequest(body),
    (e: unknown) => e instanceof ApiError && e.status === 400 && e.param === param && message.test(e.message),
  );
}

describe("speech requests", () => {
  test("OpenAI's fields plus seed and temperature; wav by default", () => {
    assert.deepEqual(parseSpeechRequest({ model: "tts", input: "Hello there.", voice: "alloy" }), {
      model: "tts",
      input: "Hello there.",
      voice: "alloy",
      format: "wav",
      temperature: null,
      seed: null,
      maxTokens: null,
    });
    const r = parseSpeechRequest({ input: "Hi", voice: "echo", response_format: "pcm", speed: 1.0, seed: 42, temperature: 0, max_tokens: 64 });
    assert.equal(r.format, "pcm");
    assert.equal(r.seed, 42);
    assert.equal(r.temperature, 0);
    assert.equal(r.maxTokens, 64);
  });

  test("formats, speeds and options Baton does not produce are 400s naming them", () => {
    refused({ input: "Hi", voice: "alloy", response_format: "mp3" }, "response_format", /response_format "mp3" is not supported \(supported: pcm, wav\)/);
    refused({ input: "Hi", voice: "alloy", response_format: "opus" }, "response_format", /"opus"/);
    refused({ input: "Hi", voice: "alloy", speed: 1.5 }, "speed", /speed 1\.5 is not supported \(only 1\.0\)/);
    refused({ input: "Hi", voice: "alloy", stream_format: "sse" }, "stream_format", /stream_format "sse"/);
    refused({ input: "Hi", voice: "alloy", instructions: "whisper" }, "instructions", /instructions are not supported/);
  });

  test("missing or malformed input and voice are named", () => {
    refused({ voice: "alloy" }, "input", /input is required/);
    refused({ input: "", voice: "alloy" }, "input", /input must be a non-empty string/);
    refused({ input: "x".repeat(4097), voice: "alloy" }, "input", /at most 4096 characters/);
    refused({ input: "Hi" }, "voice", /voice is required/);
    refused({ input: 3, voice: "alloy" }, "input", /input must be a string/);
    refused({ input: "Hi", voice: "alloy", temperature: -1 }, "temperature", /at least 0/);
    refused({ input: "Hi", voice: "alloy", seed: 1.5 }, "seed", /an integer/);
  });
});

const dirs: string[] = [];
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

describe("wav framing", () => {
  const samples = Buffer.alloc(2 * 2400);
  for (let i = 0; i < 2400; i++) samples.writeInt16LE(Math.round(8000 * Math.sin(i / 10)), 2 * i);

  function readWithPythonWave(bytes: Buffer): { rate: number; channels: number; width: number; frames: number; same: boolean } {
    const dir = mkdtempSync(join(tmpdir(), "baton-wav-"));
    dirs.push(dir);
    writeFileSync(join(dir, "a.wav"), bytes);
    writeFileSync(join(dir, "a.pcm"), samples);
    const script = `
import json, sys, wave
with wave.open(sys.argv[1] + "/a.wav", "rb") as w:
    frames = w.readframes(10**9)
    print(json.dumps({"rate": w.getframerate(), "channels": w.getnchannels(), "width": w.getsampwidth(),
                      "frames": len(frames) // 2, "same": frames == open(sys.argv[1] + "/a.pcm", "rb").read()}))`;
    const run = spawnSync(resolvePythonEnv().python, ["-c", script, dir], { encoding: "utf8" });
    assert.equal(run.status, 0, run.stderr);
    return JSON.parse(run.stdout) as { rate: number; channels: number; width: number; frames: number; same: boolean };
  }

  test("a known-length WAV reads back the same samples", () => {
    const bytes = Buffer.concat([wavHeader({ sampleRate: 24000, channels: 1, bitsPerSample: 16 }, samples.length), samples]);
    assert.deepEqual(readWithPythonWave(bytes), { rate: 24000, channels: 1, width: 2, frames: 2400, same: true });
  });

  test("a streamed WAV (length unknown) says so and still reads to the end", () => {
    const header = wavHeader({ sampleRate: 24000, channels: 1, bitsPerSample: 16 }, null);
    assert.equal(header.readUInt32LE(4), UNKNOWN_SIZE);
    assert.equal(header.readUInt32LE(40), UNKNOWN_SIZE);
    assert.deepEqual(readWithPythonWave(Buffer.concat([header, samples])), { rate: 24000, channels: 1, width: 2, frames: 2400, same: true });
  });
});
