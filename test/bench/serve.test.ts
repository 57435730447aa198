// `baton bench serve` through the real CLI against a real Baton server (demo
// model, real worker): the result JSON has vLLM's keys with sane values, its
// token counts agree with what the server counted (usage and /metrics), the
// plot is a real PNG, and bad flags or an unreachable server give one line on
// stderr and a non-zero exit. No timing assertions (shared, noisy machines).

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { demoModelDir, removeDir, runCliAsync, startServer, tempDir, type RunningServer } from "../e2e/harness.js";

const skip = !existsSync(join(demoModelDir, "tokenizer.json")) && "no demo model (npm run setup)";

const PROMPTS = 8;
const INPUT_LEN = 24;
const OUTPUT_LEN = 12;

function bench(args: string[], timeoutMs?: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return runCliAsync(["bench", ...args], timeoutMs);
}

async function counters(url: string): Promise<{ prompt: number; generation: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const value = (name: string): number => {
    const line = text.split("\n").find((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
    assert.ok(line, `${name} in /metrics`);
    return Number(line.split(" ").at(-1));
  };
  return { prompt: value("vllm:prompt_tokens_total"), generation: value("vllm:generation_tokens_total") };
}

/** A port nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

let server: RunningServer | null = null;
let dir = "";

before(async () => {
  if (skip) return;
  dir = tempDir("bench-serve");
  server = await startServer(["--max-model-len", "256", "--max-num-seqs", "8", "--log-level", "warn"]);
});

after(async () => {
  await server?.stop();
  if (dir !== "") removeDir(dir);
});

const LATENCY_KEYS = ["ttft", "tpot", "itl", "e2el"].flatMap((m) => ["mean", "median", "std", "p99"].map((s) => `${s}_${m}_ms`));
const COUNT_KEYS = ["completed", "failed", "total_input_tokens", "total_output_tokens"];
const RATE_KEYS = ["request_throughput", "output_throughput", "total_token_throughput", "duration"];

test("bench serve: vLLM's result keys, token counts the server agrees with, a PNG plot", { skip, timeout: 120_000 }, async () => {
  assert.ok(server);
  const before = await counters(server.url);
  const resultFile = "result.json";
  const plot = join(dir, "plot.png");
  const run = await bench([
    "serve",
    "--base-url", server.url,
    "--tokenizer", demoModelDir,
    "--num-prompts", String(PROMPTS),
    "--max-concurrency", "4",
    "--random-input-len", String(INPUT_LEN),
    "--random-output-len", String(OUTPUT_LEN),
    "--seed", "7",
    "--save-result", "--result-dir", dir, "--result-filename", resultFile,
    "--plot-out", plot,
  ]);
  assert.equal(run.code, 0, `exit ${run.code}\n${run.stderr}`);
  assert.match(run.stdout, /=+ Serving Benchmark Result =+/);
  assert.match(run.stdout, /Output token throughput \(tok\/s\):\s+[\d.]+/);
  const after = await counters(server.url);

  const result = JSON.parse(readFileSync(join(dir, resultFile), "utf8")) as Record<string, unknown>;
  for (const key of [...COUNT_KEYS, ...RATE_KEYS, ...LATENCY_KEYS]) assert.equal(typeof result[key], "number", `${key}: ${String(result[key])}`);
  const num = (key: string): number => result[key] as number;
  assert.equal(num("completed"), PROMPTS);
  assert.equal(num("failed"), 0);
  assert.equal(result.model_id, "baton-demo", "the model comes from GET /v1/models");
  // Exact lengths: every prompt is INPUT_LEN tokens as the server counted it, every output OUTPUT_LEN (ignore_eos).
  assert.deepEqual(result.input_lens, new Array(PROMPTS).fill(INPUT_LEN));
  assert.deepEqual(result.output_lens, new Array(PROMPTS).fill(OUTPUT_LEN));
  assert.equal(num("total_input_tokens"), PROMPTS * INPUT_LEN);
  assert.equal(num("total_output_tokens"), PROMPTS * OUTPUT_LEN);
  // The server's own counters moved by the measured requests plus the one test request (its own prompt, max_tokens 12).
  assert.equal(after.prompt - before.prompt, num("total_input_tokens") + INPUT_LEN);
  assert.equal(after.generation - before.generation, num("total_output_tokens") + OUTPUT_LEN);
  // Per request, the token gaps cover every token after the first delivery.
  const itls = result.itls as number[][];
  itls.forEach((gaps, i) => assert.ok(gaps.length >= 1 && gaps.length <= OUTPUT_LEN - 1, `request ${i}: ${gaps.length} gaps`));

  for (const key of RATE_KEYS) assert.ok(num(key) > 0, `${key} = ${num(key)}`);
  const close = (a: number, b: number): boolean => Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(b));
  assert.ok(close(num("request_throughput"), PROMPTS / num("duration")));
  assert.ok(close(num("output_throughput"), num("total_output_tokens") / num("duration")));
  assert.ok(close(num("total_token_throughput"), (num("total_input_tokens") + num("total_output_tokens")) / num("duration")));
  for (const m of ["ttft", "tpot", "itl", "e2el"]) {
    assert.ok(num(`mean_${m}_ms`) > 0, `mean_${m}_ms`);
    assert.ok(num(`std_${m}_ms`) >= 0, `std_${m}_ms`);
    assert.ok(num(`p99_${m}_ms`) >= num(`median_${m}_ms`), `p99 >= median for ${m}`);
  }
  assert.ok(num("median_ttft_ms") < num("median_e2el_ms"));
  assert.ok(num("p99_e2el_ms") <= num("duration") * 1000);

  // A real PNG: signature, IHDR first with the chart's size, IEND last.
  const png = readFileSync(plot);
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.equal(png.subarray(12, 16).toString("latin1"), "IHDR");
  assert.equal(png.readUInt32BE(16), 1200);
  assert.equal(png.readUInt32BE(20), 900);
  assert.equal(png.subarray(png.length - 8, png.length - 4).toString("latin1"), "IEND");
  assert.ok(png.length > 10_000, `a chart, not a blank image (${png.length} bytes)`);
});

test("bench serve: chat endpoint streams too", { skip, timeout: 60_000 }, async () => {
  assert.ok(server);
  const out = join(dir, "chat.json");
  const run = await bench([
    "serve", "--base-url", server.url, "--endpoint", "/v1/chat/completions", "--tokenizer", demoModelDir,
    "--num-prompts", "3", "--random-input-len", "16", "--random-output-len", "6", "--seed", "11",
    "--save-result", "--result-filename", out,
  ]);
  assert.equal(run.code, 0, `exit ${run.code}\n${run.stderr}`);
  const result = JSON.parse(readFileSync(out, "utf8")) as { completed: number; output_lens: number[]; input_lens: number[] };
  assert.equal(result.completed, 3);
  assert.deepEqual(result.output_lens, [6, 6, 6]);
  // The chat template wraps the 16-token message.
  for (const n of result.input_lens) assert.ok(n > 16, `prompt tokens ${n}`);
});

test("bench serve: without --tokenizer, the served model's directory (GET /v1/models root) makes exact lengths", { skip, timeout: 60_000 }, async () => {
  assert.ok(server);
  const out = join(dir, "no-tokenizer.json");
  const run = await bench([
    "serve", "--base-url", server.url, "--num-prompts", "3", "--random-input-len", "20", "--random-output-len", "4", "--seed", "5",
    "--save-result", "--result-filename", out,
  ]);
  assert.equal(run.code, 0, `exit ${run.code}\n${run.stderr}`);
  const result = JSON.parse(readFileSync(out, "utf8")) as { completed: number; input_lens: number[]; output_lens: number[]; tokenizer_id: string };
  assert.equal(result.completed, 3);
  assert.deepEqual(result.input_lens, [20, 20, 20], "the server counted exactly the requested lengths");
  assert.deepEqual(result.output_lens, [4, 4, 4]);
  assert.equal(result.tokenizer_id, demoModelDir);
  // A model the server does not list: the error asks for --tokenizer and says what was tried.
  const missing = await bench(["serve", "--base-url", server.url, "--model", "no-such-model", "--num-prompts", "2"]);
  assert.equal(missing.code, 1, missing.stderr);
  assert.equal(
    missing.stderr.trimEnd(),
    `baton: --dataset-name random needs --tokenizer MODEL_DIR (the model's tokenizer); without it, tried the served model's directory (its root in GET ${server.url}/v1/models): no-such-model is not listed`,
  );
});

test("bench serve: a bad flag is one line on stderr and exit 2", { skip, timeout: 30_000 }, async () => {
  for (const args of [["--no-such-flag"], ["--num-prompts", "zero"], ["--endpoint", "/v1/embeddings"], ["--request-rate", "-1"]]) {
    const run = await bench(["serve", ...args]);
    assert.equal(run.code, 2, `${args.join(" ")}: exit ${run.code}`);
    const lines = run.stderr.trimEnd().split("\n");
    assert.equal(lines.length, 1, `${args.join(" ")}: ${run.stderr}`);
    assert.match(lines[0] ?? "", /^baton: .*--/);
    assert.equal(run.stdout, "");
  }
});

test("bench serve: an unreachable server is one line on stderr and exit 1", { skip, timeout: 30_000 }, async () => {
  const port = await closedPort();
  for (const model of [[], ["--model", "m"]]) {
    const run = await bench(["serve", "--base-url", `http://127.0.0.1:${port}`, "--tokenizer", demoModelDir, "--num-prompts", "2", ...model]);
    assert.equal(run.code, 1, run.stderr);
    const lines = run.stderr.trimEnd().split("\n");
    assert.equal(lines.length, 1, run.stderr);
    assert.equal(lines[0], `baton: cannot reach http://127.0.0.1:${port}/: connection refused`);
  }
});
