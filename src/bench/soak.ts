// `baton bench soak`: serves a model with `baton serve` for N minutes under
// mixed load (streamed and collected completions, clients that disconnect
// mid-stream, bad requests) while killing (SIGKILL) and stopping (SIGSTOP)
// its model worker at random, then checks that nothing leaked: every KV
// block free and no graph tensor held once idle, one worker process (no
// orphan), the server's file descriptors and the memory of every process
// flat, the server still answering, and a clean drain and exit 0 at the end.
// Every request must end: with its tokens, or with an error that says why
// (a 503 while the worker restarts, an in-band error after a carried-over
// request's limit); a request that hangs, a 500 or a dropped stream counts
// against the run. Exits non-zero on any leak or unexplained failure.

import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { SeededRandom } from "./random.js";
import { freePort, ServerProcess } from "./server-process.js";

export interface SoakOptions {
  repoRoot: string;
  modelDir: string;
  minutes: number;
  /** Clients sending requests back to back. */
  concurrency: number;
  /** Mean seconds between faults (exponential); 0: no faults. */
  faultIntervalS: number;
  /** --step-timeout of the served model: how fast a stopped worker is noticed. */
  stepTimeoutS: number;
  seed: number;
  log: (line: string) => void;
}

/** Memory and descriptors of one process at one moment. */
interface ProcessSample {
  role: "server" | "worker";
  pid: number;
  rssMiB: number;
}

interface SoakState {
  freeKvBlocks: number;
  kvBlocks: number;
  tensorsHeld: number;
  serverFds: number;
  processes: ProcessSample[];
}

export interface SoakResult {
  minutes: number;
  requests: {
    /** Completed with all their tokens. */
    served: number;
    /** Disconnected on purpose by the client mid-stream. */
    disconnected: number;
    /** Bad requests answered 400 as they should be. */
    rejectedBadRequest: number;
    /** Everything else, by cause (the expected ones: "503 while the worker restarts", "ended by a worker death"). */
    errors: Record<string, number>;
  };
  tokens: number;
  faults: { sigkill: number; sigstop: number };
  restarts: number;
  start: SoakState;
  end: SoakState;
  /** What leaked or failed; empty when the run is clean. */
  problems: string[];
}

/** Causes of failures the run tolerates: they are what a worker death does to requests by design. */
const EXPECTED_CAUSES = new Set(["503 while the worker restarts", "ended by a worker death"]);
const REQUEST_TIMEOUT_MS = 180_000;
/** Memory may grow this much between start and end before it counts as a leak. */
const RSS_SLACK_MIB = 64;
const RSS_SLACK_RATIO = 1.25;
const FD_SLACK = 16;
/** A fault the server has not recovered from in this long ends the fault injection (the end checks report it). */
const RECOVERY_TIMEOUT_MS = 300_000;

// ---- what /proc says ----------------------------------------------------------

function rssMiB(pid: number): number {
  try {
    const kb = Number(/^VmRSS:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0);
    return Math.round((kb / 1024) * 10) / 10;
  } catch {
    return 0;
  }
}

function openFds(pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).filter((fd) => {
      try {
        readlinkSync(`/proc/${pid}/fd/${fd}`);
        return true;
      } catch {
        return false;
      }
    }).length;
  } catch {
    return -1;
  }
}

/** The environment variable that marks this run's server, and so its workers (they inherit it). */
const RUN_MARKER = "BATON_SOAK_RUN";

/** Live baton_worker processes of this run (`runId`): the server's children, and any other (an orphan). */
function workerProcesses(parent: number, runId: string): { children: number[]; orphans: number[] } {
  const children: number[] = [];
  const orphans: number[] = [];
  const marker = `${RUN_MARKER}=${runId}\0`;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
      if (!cmdline.includes("baton_worker") || !readFileSync(`/proc/${entry}/environ`, "utf8").includes(marker)) continue;
      const status = readFileSync(`/proc/${entry}/status`, "utf8");
      if (/^State:\s+Z/m.test(status)) continue;
      const ppid = Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]);
      (ppid === parent ? children : orphans).push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return { children, orphans };
}

// ---- the server's own numbers ---------------------------------------------------

async function metrics(base: URL): Promise<Map<string, number>> {
  const text = await (await fetch(new URL("metrics", base), { signal: AbortSignal.timeout(10_000) })).text();
  const values = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || line.trim() === "") continue;
    const name = line.slice(0, line.search(/[ {]/));
    values.set(name, (values.get(name) ?? 0) + Number(line.trim().split(/\s+/).at(-1)));
  }
  return values;
}

async function snapshotRestarts(base: URL): Promise<number> {
  const snapshot = (await (await fetch(new URL("dashboard/snapshot", base), { signal: AbortSignal.timeout(10_000) })).json()) as { worker: { restarts: number } };
  return snapshot.worker.restarts;
}

async function healthy(base: URL): Promise<boolean> {
  try {
    const response = await fetch(new URL("health", base), { signal: AbortSignal.timeout(5_000) });
    await response.arrayBuffer();
    return response.status === 200;
  } catch {
    return false;
  }
}

async function stateOf(base: URL, server: ServerProcess, runId: string): Promise<SoakState> {
  const m = await metrics(base);
  const workers = workerProcesses(server.pid, runId).children;
  return {
    freeKvBlocks: m.get("baton:kv_free_blocks") ?? -1,
    kvBlocks: m.get("baton:kv_total_blocks") ?? -1,
    tensorsHeld: m.get("baton:graph_tensors_held") ?? 0,
    serverFds: openFds(server.pid),
    processes: [{ role: "server", pid: server.pid, rssMiB: rssMiB(server.pid) }, ...workers.map((pid) => ({ role: "worker" as const, pid, rssMiB: rssMiB(pid) }))],
  };
}

/** Waits until nothing runs or waits in the engine (or gives up after timeoutMs). */
async function waitIdle(base: URL, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  while (performance.now() < deadline) {
    try {
      const m = await metrics(base);
      if ((m.get("vllm:num_requests_running") ?? 1) === 0 && (m.get("vllm:num_requests_waiting") ?? 1) === 0) return true;
    } catch {
      // The server may be busy; try again.
    }
    await sleep(250);
  }
  return false;
}

// ---- load -------------------------------------------------------------------------

type Action = "stream" | "collect" | "disconnect" | "bad";

interface Tally {
  served: number;
  disconnected: number;
  rejectedBadRequest: number;
  errors: Map<string, number>;
  tokens: number;
}

function count(tally: Tally, cause: string): void {
  tally.errors.set(cause, (tally.errors.get(cause) ?? 0) + 1);
}

/** Classifies a failure a client saw. */
function causeOf(status: number, message: string): string {
  if (status === 503 && /restart|died|not running|unavailable/i.test(message)) return "503 while the worker restarts";
  if (/carried over|died|worker/i.test(message)) return "ended by a worker death";
  return `HTTP ${status}: ${message.slice(0, 120)}`;
}

const BAD_BODIES: readonly string[] = [
  JSON.stringify({ prompt: "hello", max_tokens: -1 }),
  JSON.stringify({ prompt: "hello", temperature: "hot" }),
  "{ not json",
  JSON.stringify({ prompt: "hello", top_p: 2 }),
];

async function oneRequest(base: URL, rng: SeededRandom, tally: Tally): Promise<void> {
  const roll = rng.next();
  const action: Action = roll < 0.55 ? "stream" : roll < 0.8 ? "collect" : roll < 0.9 ? "disconnect" : "bad";
  const url = new URL("v1/completions", base);
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error("hung")), REQUEST_TIMEOUT_MS);
  try {
    if (action === "bad") {
      const body = BAD_BODIES[rng.int(BAD_BODIES.length)]!;
      const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body, signal: controller.signal });
      const text = await response.text();
      if (response.status === 400) tally.rejectedBadRequest++;
      else if (response.status === 503) count(tally, causeOf(503, text));
      else count(tally, `bad request answered ${response.status}`);
      return;
    }
    const words = ["the", "quiet", "river", "runs", "past", "old", "mills", "and", "green", "fields"];
    const prompt = Array.from({ length: 4 + rng.int(40) }, () => words[rng.int(words.length)]).join(" ");
    const maxTokens = 4 + rng.int(60);
    const body = { prompt, max_tokens: maxTokens, ignore_eos: true, temperature: rng.next() < 0.5 ? 0 : 1, seed: rng.int(1_000_000), stream: action !== "collect", return_token_ids: true };
    const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal: controller.signal });
    if (response.status !== 200) {
      const text = await response.text();
      let message = text;
      try {
        message = (JSON.parse(text) as { error: { message: string } }).error.message;
      } catch {
        // Not JSON: keep the text.
      }
      count(tally, causeOf(response.status, message));
      // Back off while the worker restarts (the server says 5 s; a second keeps the load on).
      if (response.status === 503) await sleep(1_000);
      return;
    }
    if (action === "collect") {
      const json = (await response.json()) as { choices: { token_ids?: number[]; finish_reason: string }[] };
      const n = json.choices[0]?.token_ids?.length ?? 0;
      tally.tokens += n;
      if (n === maxTokens && json.choices[0]?.finish_reason === "length") tally.served++;
      else count(tally, `collected response with ${n} of ${maxTokens} tokens`);
      return;
    }
    const leaveAfter = action === "disconnect" ? 1 + rng.int(Math.max(1, maxTokens - 1)) : Infinity;
    const reader = response.body!.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let tokens = 0;
    let finished = false;
    let error: string | null = null;
    let done = false;
    while (!done) {
      const read = await reader.read();
      if (read.done) break;
      buffer += decoder.decode(read.value, { stream: true });
      let cut: number;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.startsWith("data: ") ? event.slice(6) : "";
        if (data === "" || data === "[DONE]") continue;
        const chunk = JSON.parse(data) as { error?: { message: string }; choices?: { token_ids?: number[]; finish_reason: string | null }[] };
        if (chunk.error) error = chunk.error.message;
        for (const c of chunk.choices ?? []) {
          tokens += c.token_ids?.length ?? 0;
          if (c.finish_reason !== null) finished = true;
        }
      }
      if (tokens >= leaveAfter) {
        await reader.cancel();
        tally.disconnected++;
        tally.tokens += tokens;
        return;
      }
    }
    tally.tokens += tokens;
    if (error !== null) count(tally, causeOf(200, error));
    else if (finished && tokens === maxTokens) tally.served++;
    else count(tally, `stream ended after ${tokens} of ${maxTokens} tokens without an error`);
  } catch (error) {
    const message = (error as Error).message;
    count(tally, controller.signal.aborted ? "hung (no answer within 180 s)" : `network error: ${message.slice(0, 80)}`);
  } finally {
    clearTimeout(timer);
  }
}

async function client(base: URL, rng: SeededRandom, tally: Tally, until: number): Promise<void> {
  while (performance.now() < until) await oneRequest(base, rng, tally);
}

// ---- faults ---------------------------------------------------------------------

async function faults(
  base: URL,
  server: ServerProcess,
  runId: string,
  options: SoakOptions,
  rng: SeededRandom,
  until: number,
  done: { sigkill: number; sigstop: number },
): Promise<void> {
  if (options.faultIntervalS <= 0) return;
  for (;;) {
    // Exponential gaps: faults at random, not on a beat.
    const gapMs = -Math.log(1 - rng.next()) * options.faultIntervalS * 1000;
    if (performance.now() + gapMs >= until) return;
    await sleep(gapMs);
    const pid = workerProcesses(server.pid, runId).children[0];
    if (pid === undefined || !(await healthy(base))) continue;
    const signal = rng.next() < 0.6 ? "SIGKILL" : "SIGSTOP";
    try {
      process.kill(pid, signal);
    } catch {
      continue;
    }
    if (signal === "SIGKILL") done.sigkill++;
    else done.sigstop++;
    options.log(`${signal} to worker ${pid}`);
    // One fault at a time: the next only once a new worker serves (a stopped one is found by the watchdog first).
    const deadline = performance.now() + RECOVERY_TIMEOUT_MS;
    for (;;) {
      const current = workerProcesses(server.pid, runId).children;
      if (current.length === 1 && current[0] !== pid && (await healthy(base))) break;
      if (performance.now() > deadline) {
        options.log(`no new worker serving ${RECOVERY_TIMEOUT_MS / 1000} s after the ${signal}; no more faults`);
        return;
      }
      await sleep(250);
    }
  }
}

// ---- the run ---------------------------------------------------------------------

export async function runSoak(options: SoakOptions): Promise<SoakResult> {
  const port = await freePort();
  const base = new URL(`http://127.0.0.1:${port}/`);
  const command = [
    process.execPath,
    `${options.repoRoot}/bin/baton.mjs`,
    "serve",
    options.modelDir,
    "--port",
    String(port),
    "--max-worker-restarts",
    "1000000",
    "--step-timeout",
    String(options.stepTimeoutS),
    "--log-level",
    "warn",
  ];
  options.log(`starting ${command.slice(2).join(" ")}`);
  const runId = `${process.pid}-${Date.now()}`;
  const server = await ServerProcess.start({ name: "baton", command, env: { ...process.env, [RUN_MARKER]: runId }, cwd: options.repoRoot, baseUrl: base, startTimeoutMs: 300_000 });
  const problems: string[] = [];
  try {
    // Warm up (first steps, allocator pools) before the start state is taken.
    const warm: Tally = { served: 0, disconnected: 0, rejectedBadRequest: 0, errors: new Map(), tokens: 0 };
    const warmRng = new SeededRandom(options.seed + 1);
    await Promise.all(Array.from({ length: options.concurrency }, () => client(base, warmRng, warm, performance.now() + 10_000)));
    await waitIdle(base, 60_000);
    const start = await stateOf(base, server, runId);
    options.log(`start: ${JSON.stringify(start)}`);

    const tally: Tally = { served: 0, disconnected: 0, rejectedBadRequest: 0, errors: new Map(), tokens: 0 };
    const rng = new SeededRandom(options.seed);
    const until = performance.now() + options.minutes * 60_000;
    const faultCount = { sigkill: 0, sigstop: 0 };
    const progress = setInterval(() => {
      options.log(`served ${tally.served}, disconnected ${tally.disconnected}, errors ${[...tally.errors.values()].reduce((a, b) => a + b, 0)}, faults ${faultCount.sigkill + faultCount.sigstop}`);
    }, 30_000);
    try {
      await Promise.all([
        ...Array.from({ length: options.concurrency }, () => client(base, rng, tally, until)),
        faults(base, server, runId, options, new SeededRandom(options.seed + 2), until, faultCount),
      ]);
    } finally {
      clearInterval(progress);
    }

    // The end state: the last restart done, nothing running.
    const backDeadline = performance.now() + 120_000;
    while (!(await healthy(base)) && performance.now() < backDeadline) await sleep(250);
    if (!(await healthy(base))) problems.push("the server did not become healthy again after the run");
    if (!(await waitIdle(base, 60_000))) problems.push("requests were still running a minute after the load stopped");
    const end = await stateOf(base, server, runId);
    const restarts = await snapshotRestarts(base);
    options.log(`end: ${JSON.stringify(end)}`);

    if (end.freeKvBlocks !== end.kvBlocks) problems.push(`KV blocks leaked: ${end.kvBlocks - end.freeKvBlocks} of ${end.kvBlocks} not free when idle`);
    if (end.tensorsHeld !== 0) problems.push(`graph tensors leaked: ${end.tensorsHeld} held when idle`);
    const workers = workerProcesses(server.pid, runId);
    if (workers.children.length !== 1) problems.push(`expected one worker process, found ${workers.children.length}`);
    if (workers.orphans.length > 0) problems.push(`orphaned worker processes: ${workers.orphans.join(", ")}`);
    if (end.serverFds > start.serverFds + FD_SLACK) problems.push(`file descriptors leaked: ${start.serverFds} at the start, ${end.serverFds} at the end`);
    for (const role of ["server", "worker"] as const) {
      const before = start.processes.find((p) => p.role === role)?.rssMiB ?? 0;
      const after = end.processes.find((p) => p.role === role)?.rssMiB ?? 0;
      if (after > before * RSS_SLACK_RATIO + RSS_SLACK_MIB) problems.push(`${role} memory grew from ${before} MiB to ${after} MiB`);
    }
    for (const [cause, n] of tally.errors) if (!EXPECTED_CAUSES.has(cause)) problems.push(`${n} request(s) failed: ${cause}`);
    if (restarts < faultCount.sigkill + faultCount.sigstop) problems.push(`${faultCount.sigkill + faultCount.sigstop} faults but only ${restarts} restarts`);

    const result: SoakResult = {
      minutes: options.minutes,
      requests: { served: tally.served, disconnected: tally.disconnected, rejectedBadRequest: tally.rejectedBadRequest, errors: Object.fromEntries(tally.errors) },
      tokens: tally.tokens,
      faults: faultCount,
      restarts,
      start,
      end,
      problems,
    };
    return result;
  } finally {
    // A drain, then exit 0: anything else is a problem too.
    await server.stop(60_000);
    if (server.exitCode !== 0) problems.push(`the server exited with ${server.exitCode} after SIGTERM`);
    const left = workerProcesses(server.pid, runId);
    if (left.children.length + left.orphans.length > 0) problems.push(`worker processes left after the server exited: ${[...left.children, ...left.orphans].join(", ")}`);
  }
}

/** The report printed at the end. */
export function soakReport(r: SoakResult): string {
  const rows = (s: SoakState): string => s.processes.map((p) => `${p.role} ${p.pid} ${p.rssMiB} MiB`).join(", ");
  const errors = Object.entries(r.requests.errors);
  return [
    `soak: ${r.minutes} min, ${r.tokens} tokens received`,
    `requests: ${r.requests.served} served, ${r.requests.disconnected} disconnected by the client, ${r.requests.rejectedBadRequest} bad requests answered 400`,
    `errors by cause: ${errors.length === 0 ? "none" : errors.map(([c, n]) => `${n} ${c}`).join("; ")}`,
    `faults: ${r.faults.sigkill} SIGKILL, ${r.faults.sigstop} SIGSTOP; worker restarts: ${r.restarts}`,
    `free KV blocks: ${r.start.freeKvBlocks}/${r.start.kvBlocks} at the start, ${r.end.freeKvBlocks}/${r.end.kvBlocks} at the end; graph tensors held at the end: ${r.end.tensorsHeld}`,
    `server file descriptors: ${r.start.serverFds} at the start, ${r.end.serverFds} at the end`,
    `RSS at the start: ${rows(r.start)}`,
    `RSS at the end:   ${rows(r.end)}`,
    r.problems.length === 0 ? "no leak, no unexplained failure" : `PROBLEMS:\n  ${r.problems.join("\n  ")}`,
    "",
  ].join("\n");
}
