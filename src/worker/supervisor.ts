// Starts and supervises the Python model worker: spawn, Ready handshake with a
// protocol-version check, in-order step execution (up to MAX_IN_FLIGHT steps
// outstanding for overlap scheduling), death detection, clean shutdown, and a
// guarantee that no worker process outlives the Node process that started it.

import { spawn, type ChildProcess } from "node:child_process";
import type { Readable } from "node:stream";
import { EngineChannel } from "../transport/channel.js";
import {
  PROTOCOL_VERSION,
  ProtocolError,
  type ReadyMessage,
  type StepMaskMessage,
  type StepMessage,
  type StepResultMessage,
  type WorkerToEngineMessage,
} from "../transport/messages.js";
import { resolvePythonEnv } from "./python-env.js";
import { removeSegmentsOf } from "./shm-segments.js";
import { WorkerDiedError, WorkerStartError, type WorkerClient, type WorkerExit, type WorkerOptions } from "./types.js";

/**
 * Steps that may be outstanding at once: the engine core's two (step N+1 is
 * sent while N runs) plus one carrying only graph work (worker-lane.ts).
 */
export const MAX_IN_FLIGHT = 3;
export const DEFAULT_START_TIMEOUT_MS = 600_000;
export const DEFAULT_SHUTDOWN_GRACE_MS = 5_000;

const TAIL_LINES = 40;
const TAIL_CHARS = 4_000;
/** After 'exit', how long to wait for the last stderr bytes before reporting. */
const STDIO_DRAIN_MS = 500;

/** Weight-loading progress lines of a worker started with --progress. */
const PROGRESS_PREFIX = "BATON_PROGRESS ";

/** The command line that starts a worker (exported for tests and `--dry-run` style tooling). */
export function workerArgs(opts: WorkerOptions, inEndpoint: string, outEndpoint: string): string[] {
  const args = ["-m", "baton_worker", "--model", opts.modelDir, "--in-endpoint", inEndpoint, "--out-endpoint", outEndpoint];
  args.push("--block-size", String(opts.blockSize));
  if (opts.numBlocks !== undefined) args.push("--num-blocks", String(opts.numBlocks));
  if (opts.kvCacheMemoryBytes !== undefined) args.push("--kv-cache-memory-bytes", String(opts.kvCacheMemoryBytes));
  if (opts.maxModelLen !== undefined) args.push("--max-model-len", String(opts.maxModelLen));
  args.push("--dtype", opts.dtype, "--device", opts.device, "--seed", String(opts.seed));
  if (opts.loadFormat !== undefined) args.push("--load-format", opts.loadFormat);
  if (opts.onLoadProgress !== undefined) args.push("--progress");
  if (opts.nodes !== undefined) args.push("--nodes", opts.nodes.join(","));
  if (opts.rank !== undefined) args.push("--rank", String(opts.rank));
  if (opts.modelKwargs !== undefined && Object.keys(opts.modelKwargs).length > 0) args.push("--model-kwargs", JSON.stringify(opts.modelKwargs));
  if (opts.shmBytes !== undefined && opts.shmBytes > 0) args.push("--shm-bytes", String(opts.shmBytes));
  return args;
}

// ---- process registry: nothing outlives us ---------------------------------

const live = new Set<SupervisedWorker>();
let exitHookInstalled = false;

function killGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    // The worker leads its own process group (detached), so this also reaches
    // anything it forked (compile workers, loaders).
    process.kill(-child.pid, signal);
  } catch {
    try {
      child.kill(signal);
    } catch {
      // Already gone.
    }
  }
}

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // 'exit' handlers must be synchronous: SIGKILL is the only thing that fits.
  process.on("exit", killAllWorkersSync);
}

/**
 * Kills every worker this thread started and closes their sockets, synchronously
 * (exit hooks; an engine thread told to stop at once).
 */
export function killAllWorkersSync(): void {
  for (const worker of live) worker.killAndCleanSync();
}

/** Shuts down every worker this process started; for SIGINT/SIGTERM handlers. */
export async function shutdownAllWorkers(graceMs: number = DEFAULT_SHUTDOWN_GRACE_MS): Promise<void> {
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

  constructor(private readonly forward: ((line: string) => void) | null) {}

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
    this.forward?.(clean);
    this.lines.push(clean);
    if (this.lines.length > TAIL_LINES) this.lines.shift();
  }

  text(): string {
    const all = this.lines.join("\n").trim();
    return all.length > TAIL_CHARS ? `...${all.slice(-TAIL_CHARS)}` : all;
  }
}

// ---- the supervised worker ---------------------------------------------------

interface PendingStep {
  stepId: number;
  resolve: (result: StepResultMessage) => void;
  reject: (error: Error) => void;
}

interface PendingPing {
  sentAt: number;
  resolve: (ms: number) => void;
  reject: (error: Error) => void;
  timer: NodeJS.Timeout;
}

type State = "starting" | "ready" | "stopping" | "dead";

class SupervisedWorker implements WorkerClient {
  private state: State = "starting";
  /** The process is gone; onExit is collecting its last words. */
  private exiting = false;
  private readyMessage: ReadyMessage | null = null;
  private readonly pending: PendingStep[] = [];
  private readonly pings = new Map<number, PendingPing>();
  private nextNonce = 1;
  private lastStepId = -Infinity;
  private readonly deathListeners: ((exit: WorkerExit) => void)[] = [];
  private shutdownRequested = false;
  private shutdownPromise: Promise<void> | null = null;
  /** Why the worker is failing, when we know better than its exit code. */
  private failure: string | null = null;
  private exitInfo: WorkerExit | null = null;
  private readonly exited: Promise<WorkerExit>;
  private resolveExited!: (exit: WorkerExit) => void;
  private readonly stdioDone: Promise<void>;
  /** Start-up waiters: settled by Ready, Fatal, exit or a protocol error. */
  private startWaiter: { resolve: (ready: ReadyMessage) => void; reject: (error: Error) => void } | null = null;

  constructor(
    private readonly child: ChildProcess,
    private readonly channel: EngineChannel,
    private readonly output: OutputTail,
  ) {
    this.exited = new Promise((resolve) => (this.resolveExited = resolve));
    this.stdioDone = Promise.all([output.attach(child.stdout), output.attach(child.stderr)]).then(() => {});
    // stdin is a pipe we never write to, so the worker cannot read our terminal;
    // it reaches EOF when this process dies, whatever the cause.
    child.stdin?.on("error", () => {});
    child.once("exit", (code, signal) => void this.onExit(code, signal));
    child.once("error", (error) => {
      // spawn() failed (ENOENT, EACCES): there is no process, so no 'exit' will come.
      if (child.pid === undefined) {
        this.failure = `cannot start the worker: ${error.message}`;
        void this.onExit(null, null);
      }
    });
  }

  get pid(): number {
    return this.child.pid ?? -1;
  }

  get ready(): ReadyMessage {
    if (this.readyMessage === null) throw new Error("worker is not ready yet");
    return this.readyMessage;
  }

  get alive(): boolean {
    return this.state === "ready" && !this.exiting;
  }

  /** Resolves with Ready; rejects with WorkerStartError after cleaning the process up. */
  waitForReady(timeoutMs: number): Promise<ReadyMessage> {
    return new Promise<ReadyMessage>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.fail(`model worker did not become ready within ${Math.round(timeoutMs / 1000)} s`);
      }, timeoutMs);
      this.startWaiter = {
        resolve: (ready) => {
          clearTimeout(timer);
          resolve(ready);
        },
        reject: (error) => {
          clearTimeout(timer);
          reject(error);
        },
      };
    });
  }

  // Called by the channel for every decoded worker message.
  onMessage(message: WorkerToEngineMessage): void {
    if (this.state === "dead") return;
    switch (message.kind) {
      case "Ready":
        if (this.exiting || this.state === "stopping") return;
        if (this.state !== "starting") return this.fail("worker sent Ready twice");
        if (message.protocol_version !== PROTOCOL_VERSION) {
          return this.fail(
            `model worker speaks protocol version ${message.protocol_version}, the engine speaks ${PROTOCOL_VERSION}; ` +
              "the Python package and the TypeScript build are out of step",
          );
        }
        this.readyMessage = message;
        this.state = "ready";
        this.startWaiter?.resolve(message);
        this.startWaiter = null;
        return;
      case "Fatal":
        // The worker exits non-zero right after; onExit reports with this message.
        this.failure = message.message;
        this.rejectOutstanding(() => new WorkerDiedError(`model worker failed: ${message.message}`, null));
        this.killAfter(DEFAULT_SHUTDOWN_GRACE_MS);
        return;
      case "StepResult": {
        const head = this.pending[0];
        if (head === undefined || head.stepId !== message.step_id) {
          return this.fail(`worker answered step ${message.step_id}, but the next outstanding step is ${head?.stepId ?? "none"}`);
        }
        this.pending.shift();
        head.resolve(message);
        return;
      }
      case "Pong": {
        const ping = this.pings.get(message.nonce);
        if (ping === undefined) return; // A ping that already timed out.
        this.pings.delete(message.nonce);
        clearTimeout(ping.timer);
        ping.resolve(performance.now() - ping.sentAt);
        return;
      }
    }
  }

  // A frame we cannot decode means the two sides disagree: stop the worker.
  onChannelError(error: Error): void {
    if (this.state === "dead") return;
    const what = error instanceof ProtocolError ? "a malformed message" : "an unreadable frame";
    this.fail(`model worker sent ${what}: ${error.message}`);
  }

  /** Records why the worker is being stopped, rejects what waits on it, and kills it. */
  private fail(reason: string): void {
    if (this.state === "dead") return;
    this.failure ??= reason;
    this.rejectOutstanding(() => new WorkerDiedError(`model worker failed: ${reason}`, null));
    this.killNow();
  }

  private rejectOutstanding(makeError: () => Error): void {
    for (const step of this.pending.splice(0)) step.reject(makeError());
    for (const ping of this.pings.values()) {
      clearTimeout(ping.timer);
      ping.reject(makeError());
    }
    this.pings.clear();
  }

  killNow(): void {
    killGroup(this.child, "SIGKILL");
  }

  /** For 'exit' hooks: kill, close the sockets and remove their files, synchronously. */
  killAndCleanSync(): void {
    this.killNow();
    this.channel.closeSync();
    if (this.child.pid !== undefined) removeSegmentsOf(this.child.pid);
  }

  private killAfter(ms: number): void {
    const timer = setTimeout(() => this.killNow(), ms);
    // Only a safety net: it must not keep the process alive by itself.
    timer.unref();
    void this.exited.then(() => clearTimeout(timer));
  }

  private async onExit(code: number | null, signal: NodeJS.Signals | null): Promise<void> {
    if (this.exiting) return;
    this.exiting = true;
    // Let the last lines of stderr (usually the traceback) and a Fatal still in
    // the socket arrive (the process can exit before ZeroMQ hands us its last
    // frame), but do not hang on a grandchild that still holds the pipe open.
    await Promise.race([this.stdioDone, new Promise((r) => setTimeout(r, STDIO_DRAIN_MS).unref())]);
    // Not `state === "starting"`: shutdown() during start-up moves state on.
    const wasStarting = this.startWaiter !== null;
    this.state = "dead";
    const how = signal !== null ? `was killed by ${signal}` : `exited with code ${code}`;
    const tail = this.output.text();
    const message = this.failure ?? (tail !== "" ? `model worker ${how}:\n${tail}` : `model worker ${how}`);
    const exit: WorkerExit = { code, signal, message };
    this.exitInfo = exit;
    live.delete(this);
    if (this.child.pid !== undefined) removeSegmentsOf(this.child.pid);
    await this.channel.close();

    const reason = this.shutdownRequested ? "model worker was shut down" : message;
    this.rejectOutstanding(() => new WorkerDiedError(reason, exit));
    if (wasStarting) {
      const startMessage =
        this.failure ??
        (this.shutdownRequested
          ? "model worker was shut down before it was ready"
          : tail !== ""
            ? `model worker ${how} before it was ready:\n${tail}`
            : `model worker ${how} before it was ready`);
      this.startWaiter?.reject(new WorkerStartError(startMessage, exit));
      this.startWaiter = null;
    } else if (!this.shutdownRequested) {
      for (const listener of this.deathListeners.splice(0)) {
        try {
          listener(exit);
        } catch (error) {
          // A faulty listener must not stop the others from hearing about the death.
          queueMicrotask(() => {
            throw error;
          });
        }
      }
    }
    this.resolveExited(exit);
  }

  onDeath(listener: (exit: WorkerExit) => void): void {
    this.deathListeners.push(listener);
  }

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    if (!this.alive) {
      return Promise.reject(new WorkerDiedError(`model worker is not running: ${this.exitInfo?.message ?? this.state}`, this.exitInfo));
    }
    if (this.pending.length >= MAX_IN_FLIGHT) {
      return Promise.reject(new Error(`at most ${MAX_IN_FLIGHT} steps may be in flight (step ${step.step_id})`));
    }
    if (!(step.step_id > this.lastStepId)) {
      return Promise.reject(new Error(`step ids must increase: ${step.step_id} after ${this.lastStepId}`));
    }
    return new Promise<StepResultMessage>((resolve, reject) => {
      try {
        // Encoding happens synchronously inside send(): a malformed step throws
        // a ProtocolError here and never reaches the worker.
        void this.channel.send(step).catch(() => {
          // The socket closed under us: the exit path rejects the pending step.
        });
      } catch (error) {
        reject(error as Error);
        return;
      }
      this.lastStepId = step.step_id;
      this.pending.push({ stepId: step.step_id, resolve, reject });
    });
  }

  sendStepMask(mask: StepMaskMessage): void {
    if (!this.alive) return;
    // A socket closed under us means the worker died: the exit path rejects the pending step.
    void this.channel.send(mask).catch(() => {});
  }

  ping(timeoutMs = 5_000): Promise<number> {
    if (!this.alive) {
      return Promise.reject(new WorkerDiedError(`model worker is not running: ${this.exitInfo?.message ?? this.state}`, this.exitInfo));
    }
    const nonce = this.nextNonce++;
    return new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pings.delete(nonce);
        reject(new Error(`model worker did not answer a ping within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pings.set(nonce, { sentAt: performance.now(), resolve, reject, timer });
      void this.channel.send({ kind: "Ping", nonce }).catch(() => {});
    });
  }

  shutdown(graceMs: number = DEFAULT_SHUTDOWN_GRACE_MS): Promise<void> {
    this.shutdownPromise ??= this.doShutdown(graceMs);
    return this.shutdownPromise;
  }

  private async doShutdown(graceMs: number): Promise<void> {
    this.shutdownRequested = true;
    if (this.state !== "dead") {
      const wasReady = this.state === "ready";
      this.state = "stopping";
      this.rejectOutstanding(() => new WorkerDiedError("model worker was shut down", null));
      if (wasReady) {
        void this.channel.send({ kind: "Shutdown" }).catch(() => {});
      } else {
        // Still loading: it cannot read Shutdown yet, so interrupt it.
        killGroup(this.child, "SIGTERM");
      }
      const timer = setTimeout(() => this.killNow(), graceMs);
      await this.exited;
      clearTimeout(timer);
    }
    await this.exited;
    await this.channel.close();
  }

  /** Start-up failed after spawn: make sure the process is gone before reporting. */
  async abortStart(): Promise<void> {
    this.shutdownRequested = true;
    this.killNow();
    await this.exited;
  }
}

/**
 * Spawns the Python worker and resolves once it has sent a Ready whose protocol
 * version matches. Rejects with WorkerStartError (the worker's Fatal message,
 * or its stderr tail) and leaves no process behind when it cannot start.
 */
export async function startWorker(opts: WorkerOptions): Promise<WorkerClient> {
  const pythonEnv = resolvePythonEnv(opts.python);
  installExitHook();

  let worker: SupervisedWorker | null = null;
  let channel: EngineChannel;
  try {
    channel = await EngineChannel.bind({
      transport: opts.transport ?? "ipc",
      onMessage: (message) => worker?.onMessage(message),
      onError: (error) => worker?.onChannelError(error),
    });
  } catch (error) {
    throw new WorkerStartError((error as Error).message, null);
  }

  let child: ChildProcess;
  try {
    child = spawn(pythonEnv.python, workerArgs(opts, channel.inEndpoint, channel.outEndpoint), {
      env: pythonEnv.env,
      stdio: ["pipe", "pipe", "pipe"],
      // Own process group: a terminal's Ctrl-C reaches only us, and we decide
      // how the worker stops (Shutdown, then SIGKILL of the whole group).
      detached: true,
    });
  } catch (error) {
    await channel.close();
    throw new WorkerStartError(`cannot start the worker with ${pythonEnv.python}: ${(error as Error).message}`, null);
  }

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
  worker = new SupervisedWorker(child, channel, output);
  live.add(worker);

  try {
    await worker.waitForReady(opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS);
  } catch (error) {
    // Every failure path ends with the process gone and the channel closed.
    await worker.abortStart();
    await channel.close();
    if (error instanceof WorkerStartError) throw error;
    throw new WorkerStartError((error as Error).message, null);
  }
  return worker;
}
