// Shared pieces of the reliability tests: streamed greedy completions over
// real HTTP with their text, token ids and how they ended; the server's
// model-worker processes (found under /proc); /health polling.

import { cpSync, readdirSync, readFileSync } from "node:fs";
import { demoModelDir, tempDir, type RunningServer } from "../e2e/harness.js";

export interface StreamResult {
  status: number;
  text: string;
  tokenIds: number[];
  finish: string | null;
  /** An in-band error event (after streaming began), or the error body of a refused request. */
  error: { message: string; type?: string; code?: string | number | null } | null;
  sawDone: boolean;
  /** performance.now() when the stream ended. */
  endedAt: number;
  retryAfter: string | null;
}

export interface StreamProgress {
  tokens: number;
}

/**
 * A copy of the demo model in a fresh directory (the caller removes it), so
 * that this test's worker processes can be told apart from other suites'.
 */
export function demoModelCopy(tag: string): string {
  const dir = tempDir(tag);
  cpSync(demoModelDir, dir, { recursive: true });
  return dir;
}

/** Deterministic prompt ids in a plain-text range of the Qwen3 vocabulary. */
export function promptIds(seed: number, length: number): number[] {
  let x = (seed * 2654435761 + 12345) >>> 0;
  return Array.from({ length }, () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return 1000 + (x % 20000);
  });
}

/** A streamed greedy /v1/completions request; `progress.tokens` counts tokens as they arrive. */
export async function streamCompletion(
  url: string,
  prompt: number[],
  maxTokens: number,
  progress: StreamProgress = { tokens: 0 },
  extra: Record<string, unknown> = {},
): Promise<StreamResult> {
  const response = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, return_token_ids: true, ...extra }),
  });
  const result: StreamResult = {
    status: response.status,
    text: "",
    tokenIds: [],
    finish: null,
    error: null,
    sawDone: false,
    endedAt: 0,
    retryAfter: response.headers.get("retry-after"),
  };
  if (response.status !== 200) {
    result.error = ((await response.json()) as { error: StreamResult["error"] }).error;
    result.endedAt = performance.now();
    return result;
  }
  const decoder = new TextDecoder();
  let buffer = "";
  const reader = response.body!.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") {
        result.sawDone = true;
        continue;
      }
      const chunk = JSON.parse(data) as {
        error?: StreamResult["error"];
        choices?: { text: string; token_ids?: number[]; finish_reason: string | null }[];
      };
      if (chunk.error) {
        result.error = chunk.error;
        continue;
      }
      for (const choice of chunk.choices ?? []) {
        result.text += choice.text;
        for (const id of choice.token_ids ?? []) result.tokenIds.push(id);
        progress.tokens += choice.token_ids?.length ?? 0;
        if (choice.finish_reason !== null) result.finish = choice.finish_reason;
      }
    }
  }
  result.endedAt = performance.now();
  return result;
}

/** Pids of the server's model workers (its children running baton_worker). */
export function workerPids(server: RunningServer): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const status = readFileSync(`/proc/${entry}/status`, "utf8");
      const ppid = Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]);
      const state = /^State:\s+(\S)/m.exec(status)?.[1];
      if (ppid !== server.proc.pid || state === "Z") continue;
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8").includes("baton_worker")) pids.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return pids;
}

/** The one worker of a single-worker server. */
export function workerPid(server: RunningServer): number {
  const pids = workerPids(server);
  if (pids.length !== 1) throw new Error(`expected one worker, found ${pids.length}: ${pids.join(", ")}`);
  return pids[0]!;
}

export async function health(url: string): Promise<{ status: number; body: { status: string; message?: string } }> {
  const response = await fetch(`${url}/health`);
  return { status: response.status, body: (await response.json()) as { status: string; message?: string } };
}

export async function waitFor<T>(what: string, probe: () => Promise<T | null> | T | null, timeoutMs: number, everyMs = 25): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== null) return value;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

/** Resolves once /health answers `status`; returns when (performance.now()) and the body. */
export function waitForHealth(url: string, status: 200 | 503, timeoutMs: number): Promise<{ at: number; message: string }> {
  return waitFor(
    `/health ${status}`,
    async () => {
      const h = await health(url);
      return h.status === status ? { at: performance.now(), message: h.body.message ?? "" } : null;
    },
    timeoutMs,
  );
}

/** A counter or gauge from GET /metrics (summed over label sets); null when absent. */
export async function metric(url: string, name: string): Promise<number | null> {
  const text = await (await fetch(`${url}/metrics`)).text();
  let total: number | null = null;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== " " && rest[0] !== "{") continue;
    total = (total ?? 0) + Number(line.trim().split(/\s+/).at(-1));
  }
  return total;
}
