// The Python worker as an operating-system process: spawning it in its own
// process group, capturing its output (the last lines, for error messages;
// weight-loading progress lines), killing the whole group, and learning how it
// ended. Also the registry of every worker process this thread started, so
// that none outlives it (an exit hook kills them all synchronously).
//
// Nothing here speaks the wire protocol: step-client.ts does.

import { spawn, type ChildProcess } from "node:child_process";
import type { Readable } from "node:stream";
import { resolvePythonEnv } from "./python-env.js";
import type { WorkerExit, WorkerOptions } from "./types.js";

const TAIL_LINES = 40;
const TAIL_CHARS = 4_000;
/** After 'exit', how long to wait for the last stderr bytes before reporting. */
const STDIO_DRAIN_MS = 500;
/** Weight-loading progress lines of a worker started with --progress. */
const PROGRESS_PREFIX = "BATON_PROGRESS ";

/** The command line that starts a worker (exported for tests). */
export function workerArgs(opts: WorkerOptions, inEndpoint: string, outEndpoint: string): string[] {
  const args = ["-m", "baton_worker", "--model", opts.modelDir, "--in-endpoint", inEndpoint, "--out-endpoint", outEndpoint];
  args.push("--block-size", String(opts.blockSize));
  if (opts.numBlocks !== undefined) args.push("--num-blocks", String(opts.numBlocks));
  if (opts.kvCacheMemoryBytes !== undefined) args.push("--kv-cache-memory-bytes", String(opts.kvCacheMemoryBytes));
  if (opts.maxModelLen !== undefined) args.push("--max-model-len", String(opts.maxModelLen));
  args.push("--dtype", opts.dtype, "--device", opts.device, "--seed", String(opts.seed));
  if (opts.loadFormat !== undefined) args.push("--load-format", opts.loadFormat);
  if (opts.attentionBackend !== undefined) args.push("--attention-backend", opts.attentionBackend);
  if (opts.enforceEager === true) args.push("--enforce-eager");
  if (opts.runner !== undefined && opts.runner !== "auto") args.push("--runner", opts.runner);
  if (opts.hfOverrides != null) args.push("--hf-overrides", JSON.stringify(opts.hfOverrides));
  if (opts.modelLoaderExtraConfig != null) args.push("--model-loader-extra-config", JSON.stringify(opts.modelLoaderExtraConfig));
  if (opts.maxNumSeqs !== undefined) args.push("--max-num-seqs", String(opts.maxNumSeqs));
  if (opts.lora !== undefined) args.push("--max-loras", String(opts.lora.maxLoras), "--max-lora-rank", String(opts.lora.maxLoraRank));
  if (opts.speculative !== undefined) {
    const s = opts.speculative;
    args.push("--num-speculative-tokens", String(s.numSpeculativeTokens), "--prompt-lookup-min", String(s.promptLookupMin), "--prompt-lookup-max", String(s.promptLookupMax));
    if (s.draftModel !== null) args.push("--speculative-model", s.draftModel);
  }
  if (opts.onLoadProgress !== undefined) args.push("--progress");
  if (opts.nodes !== undefined) args.push("--nodes", opts.nodes.join(","));
  if (opts.rank !== undefined) args.push("--rank", String(opts.rank));
  if (opts.modelKwargs !== undefined && Object.keys(opts.modelKwargs).length > 0) args.push("--model-kwargs", JSON.stringify(opts.modelKwargs));
  if (opts.shmBytes !== undefined && opts.shmBytes > 0) args.push("--shm-bytes", String(opts.shmBytes));
  if (opts.hostWorkers !== undefined && opts.hostWorkers > 1) args.push("--host-workers", String(opts.hostWorkers));
  if (opts.tensorParallelSize !== undefined && opts.tensorParallelSize > 1) {
    args.push("--tensor-parallel-size", String(opts.tensorParallelSize));
    if (opts.distributedExecutorBackend !== undefined) args.push("--distributed-executor-backend", opts.distributedExecutorBackend);
  }
  if (opts.kvTransfer !== undefined) args.push("--kv-transfer", opts.kvTransfer.address, "--kv-transfer-world", String(opts.kvTransfer.worldSize));
  return args;
}

// ---- registry: nothing outlives us -----------------------------------------

/** Something that must be torn down synchronously when this thread or process exits. */
interface Killable {
  killAndCleanSync(): void;
}

const live = new Set<Killable & { readonly pid: number; shutdown(graceMs: number): Promise<void> }>();
let exitHookInstalled = false;

/** Registers a worker until it has exited; the first registration installs the exit hook. */
export function registerLiveWorker(worker: Killable & { readonly pid: number; shutdown(graceMs: number): Promise<void> }): () => void {
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    // 'exit' handlers must be synchronous: SIGKILL is the only thing that fits.
    process.on("exit", killAllWorkersSync);
  }
  live.add(worker);
  return () => live.delete(worker);
}

/** Kills every worker this thread started and closes their sockets, synchronously (exit hooks, exit-now). */
export function killAllWorkersSync(): void {
  for (const worker of live) worker.killAndCleanSync();
}

/** Shuts down every worker this thread started (a start cut short, tests). */
export async function shutdownAllWorkers(graceMs: number): Promise<void> {
  await Promise.all([...live].map((w) => w.shutdown(graceMs)));
}

/** Pids of workers that are still running (tests use this to prove cleanup). */
export function liveWorkerPids(): number[] {
  return [...live].map((w) => w.pid);
}

// ---- output capture ----------------------------------------------------------

class OutputTail {
  private lines: string[] = [];
  private partial = new Map<Readable, string>();

  constructor(private readonly forward: (line: string) => void) {}

  attach(stream: Readable | null): Promise<void> {
    if (stream === null) return Promise.resolve();
    stream.setEncoding("utf8");
    stream.on("data", (chunk: string) => {
      const text = (this.partial.get(stream) ?? "") + chunk;
      const parts = text.split("\n");
      this.partial.set(stream, parts.pop() ?? "");
      for (const line of parts) this.add(line);
    });
    return new Promise((resolve) => {
      const done = (): void => {
        const rest = this.partial.get(stream);
        if (rest) this.add(rest);
        this.partial.delete(stream);
        resolve();
      };
      stream.once("end", done);
      stream.once("close", done);
      stream.once("error", done);
    });
  }

  private add(line: string): void {
    const clean = line.replace(/\r$/, "");
    this.forward(clean);
    this.lines.push(clean);
    if (this.lines.length > TAIL_LINES) this.lines.shift();
  }

  text(): string {
    const all = this.lines.join("\n").trim();
    return all.length > TAIL_CHARS ? `...${all.slice(-TAIL_CHARS)}` : all;
  }
}

// ---- the process -------------------------------------------------------------

/** How a worker process ended, before anyone explains it better. */
export interface ProcessExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The last lines it printed. */
  tail: string;
  /** spawn() itself failed (no such interpreter...). */
  spawnError: string | null;
}

export class WorkerProcess {
  /** Resolves once the process has exited and its last output lines are in (or after a short wait). */
  readonly exited: Promise<ProcessExit>;

  private constructor(
    private readonly child: ChildProcess,
    private readonly output: OutputTail,
    readonly python: string,
  ) {
    const stdioDone = Promise.all([output.attach(child.stdout), output.attach(child.stderr)]).then(() => {});
    // stdin is a pipe we never write to, so the worker cannot read our terminal;
    // it reaches EOF when this process dies, whatever the cause.
    child.stdin?.on("error", () => {});
    this.exited = new Promise<ProcessExit>((resolve) => {
      const finish = async (code: number | null, signal: NodeJS.Signals | null, spawnError: string | null): Promise<void> => {
        // Let the last lines of stderr (usually the traceback) arrive, but do not
        // hang on a grandchild that still holds the pipe open.
        await Promise.race([stdioDone, new Promise((r) => setTimeout(r, STDIO_DRAIN_MS).unref())]);
        resolve({ code, signal, tail: output.text(), spawnError });
      };
      child.once("exit", (code, signal) => void finish(code, signal, null));
      child.once("error", (error) => {
        // spawn() failed (ENOENT, EACCES): there is no process, so no 'exit' will come.
        if (child.pid === undefined) void finish(null, null, error.message);
      });
    });
  }

  /**
   * Spawns `python -m baton_worker ...` in its own process group. Output lines
   * go to our stderr prefixed "[worker PID] " (unless opts.forwardOutput is
   * false); progress lines go to opts.onLoadProgress.
   */
  static spawn(opts: WorkerOptions, inEndpoint: string, outEndpoint: string): WorkerProcess {
    const pythonEnv = resolvePythonEnv(opts.python);
    const child = spawn(pythonEnv.python, workerArgs(opts, inEndpoint, outEndpoint), {
      env: opts.env === undefined ? pythonEnv.env : { ...pythonEnv.env, ...opts.env },
      stdio: ["pipe", "pipe", "pipe"],
      // Own process group: a terminal's Ctrl-C reaches only us, and we decide
      // how the worker stops (Shutdown, then SIGKILL of the whole group).
      detached: true,
    });
    const forward = opts.forwardOutput ?? true;
    const prefix = `[worker ${child.pid ?? "?"}] `;
    const onProgress = opts.onLoadProgress;
    const output = new OutputTail((line) => {
      // "BATON_PROGRESS <done> <total>" from a worker started with --progress.
      if (onProgress !== undefined && line.startsWith(PROGRESS_PREFIX)) {
        const [done, total] = line.slice(PROGRESS_PREFIX.length).split(" ").map(Number);
        if (Number.isFinite(done) && Number.isFinite(total)) onProgress(done as number, total as number);
        return;
      }
      if (forward) process.stderr.write(`${prefix}${line}\n`);
    });
    return new WorkerProcess(child, output, pythonEnv.python);
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  /** The process has not exited (it may be stopped). */
  get running(): boolean {
    return this.child.pid !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Signals the whole process group (the worker and anything it forked). */
  signal(signal: NodeJS.Signals): void {
    if (!this.running) return;
    try {
      process.kill(-(this.child.pid as number), signal);
    } catch {
      try {
        this.child.kill(signal);
      } catch {
        // Already gone.
      }
    }
  }

  /** SIGKILL to the group: works on a stopped (SIGSTOP) or hung worker too. */
  kill(): void {
    this.signal("SIGKILL");
  }
}

/** One line naming how a process ended ("was killed by SIGKILL", "exited with code 1"). */
export function describeExit(exit: Pick<WorkerExit, "code" | "signal">): string {
  return exit.signal !== null ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`;
}
