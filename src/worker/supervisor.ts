// Supervision of the Python model worker, in two layers:
// - startWorker(): one worker incarnation. Binds a fresh channel, spawns the
//   process (worker-process.ts), runs the step RPC client over the channel
//   (step-client.ts), and joins their fates: a worker that breaks the
//   protocol, says Fatal or hangs is killed; a process that exits rejects
//   every outstanding call and tells the death listeners why.
// - WorkerSupervisor: keeps one rank's worker running. After a death it
//   restarts the worker with backoff (1 s, 2 s, 4 s ... capped) and hands the
//   new incarnation to its listener; after too many restarts in a row it gives
//   up and says so.
// No worker process outlives the Node process or thread that started it.

import { EngineChannel } from "../transport/channel.js";
import type { ReadyMessage, StepMaskMessage, StepMessage, StepResultMessage } from "../transport/messages.js";
import { removeSegmentsOf } from "./shm-segments.js";
import { StepClient } from "./step-client.js";
import { WorkerDiedError, WorkerStartError, type WorkerClient, type WorkerExit, type WorkerOptions } from "./types.js";
import { describeExit, registerLiveWorker, shutdownAllWorkers as shutdownAll, WorkerProcess, type ProcessExit } from "./worker-process.js";

export { MAX_IN_FLIGHT } from "./step-client.js";
export { killAllWorkersSync, liveWorkerPids } from "./worker-process.js";

const DEFAULT_START_TIMEOUT_MS = 600_000;
const DEFAULT_SHUTDOWN_GRACE_MS = 5_000;

/** Shuts down every worker this thread started; for a start cut short, and tests. */
export function shutdownAllWorkers(graceMs: number = DEFAULT_SHUTDOWN_GRACE_MS): Promise<void> {
  return shutdownAll(graceMs);
}

type State = "starting" | "ready" | "stopping" | "dead";

/** One worker incarnation: its process and the step client that talks to it. */
class SupervisedWorker implements WorkerClient {
  private state: State = "starting";
  private readonly deathListeners: ((exit: WorkerExit) => void)[] = [];
  private shutdownRequested = false;
  private shutdownPromise: Promise<void> | null = null;
  /** Why the worker is failing, when we know better than its exit code. */
  private failure: string | null = null;
  private exitInfo: WorkerExit | null = null;
  private readonly exited: Promise<WorkerExit>;
  private startFailed: ((error: WorkerStartError) => void) | null = null;
  private readonly unregister: () => void;
  readonly rpc: StepClient;

  constructor(
    private readonly proc: WorkerProcess,
    private readonly channel: EngineChannel,
    options: WorkerOptions,
  ) {
    this.rpc = new StepClient(
      channel,
      {
        onFailure: (reason) => this.fail(reason),
        onFatal: (message) => {
          // The worker exits non-zero right after; its exit is reported with this message.
          this.failure ??= message;
          this.rpc.close(() => new WorkerDiedError(`model worker failed: ${message}`, null));
          this.killAfter(DEFAULT_SHUTDOWN_GRACE_MS);
        },
      },
      { stepTimeoutMs: options.stepTimeoutMs ?? null },
    );
    this.unregister = registerLiveWorker(this);
    this.exited = proc.exited.then((exit) => this.onExit(exit));
  }

  get pid(): number {
    return this.proc.pid;
  }

  get ready(): ReadyMessage {
    const ready = this.rpc.ready;
    if (ready === null) throw new Error("worker is not ready yet");
    return ready;
  }

  get alive(): boolean {
    return this.state === "ready";
  }

  /** Resolves with Ready; rejects with WorkerStartError once the process is gone. */
  waitForReady(timeoutMs: number): Promise<ReadyMessage> {
    return new Promise<ReadyMessage>((resolve, reject) => {
      const timer = setTimeout(() => this.fail(`model worker did not become ready within ${Math.round(timeoutMs / 1000)} s`), timeoutMs);
      this.startFailed = (error) => {
        clearTimeout(timer);
        reject(error);
      };
      void this.rpc.waitForReady().then((ready) => {
        clearTimeout(timer);
        if (this.state !== "starting") return;
        this.state = "ready";
        this.startFailed = null;
        resolve(ready);
      });
    });
  }

  /** Records why the worker is being stopped, rejects what waits on it, and kills it. */
  private fail(reason: string): void {
    if (this.state === "dead") return;
    this.failure ??= reason;
    this.rpc.close(() => new WorkerDiedError(`model worker failed: ${reason}`, null));
    this.proc.kill();
  }

  private killAfter(ms: number): void {
    const timer = setTimeout(() => this.proc.kill(), ms);
    // Only a safety net: it must not keep the process alive by itself.
    timer.unref();
    void this.exited.then(() => clearTimeout(timer));
  }

  private async onExit(pexit: ProcessExit): Promise<WorkerExit> {
    const wasStarting = this.startFailed !== null;
    this.state = "dead";
    if (pexit.spawnError !== null) this.failure ??= `cannot start the worker with ${this.proc.python}: ${pexit.spawnError}`;
    const how = describeExit(pexit);
    const message = this.failure ?? (pexit.tail !== "" ? `model worker ${how}:\n${pexit.tail}` : `model worker ${how}`);
    const lastLine = pexit.tail.split("\n").filter((l) => l.trim() !== "").at(-1);
    const summary = firstLine(this.failure ?? (lastLine === undefined ? `model worker ${how}` : `model worker ${how}: ${lastLine.trim()}`));
    const exit: WorkerExit = { code: pexit.code, signal: pexit.signal, message, summary };
    this.exitInfo = exit;
    this.unregister();
    // Shared-memory blocks a dead worker held are nobody's now.
    if (this.proc.pid > 0) removeSegmentsOf(this.proc.pid);
    await this.channel.close();

    const reason = this.shutdownRequested ? "model worker was shut down" : message;
    this.rpc.close(() => new WorkerDiedError(reason, exit));
    if (wasStarting) {
      const startMessage =
        this.failure ??
        (this.shutdownRequested
          ? "model worker was shut down before it was ready"
          : pexit.tail !== ""
            ? `model worker ${how} before it was ready:\n${pexit.tail}`
            : `model worker ${how} before it was ready`);
      this.startFailed?.(new WorkerStartError(startMessage, exit));
      this.startFailed = null;
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
    return exit;
  }

  onDeath(listener: (exit: WorkerExit) => void): void {
    this.deathListeners.push(listener);
  }

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    if (this.state !== "ready") {
      return Promise.reject(new WorkerDiedError(`model worker is not running: ${this.exitInfo?.message ?? this.state}`, this.exitInfo));
    }
    return this.rpc.executeStep(step);
  }

  sendStepMask(mask: StepMaskMessage): void {
    if (this.state !== "ready") return;
    // A socket closed under us means the worker died: the exit path rejects the pending step.
    this.rpc.sendStepMask(mask);
  }

  ping(timeoutMs = 5_000): Promise<number> {
    if (this.state !== "ready") {
      return Promise.reject(new WorkerDiedError(`model worker is not running: ${this.exitInfo?.message ?? this.state}`, this.exitInfo));
    }
    return this.rpc.ping(timeoutMs);
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
      const shutDown = (): Error => new WorkerDiedError("model worker was shut down", null);
      if (wasReady) {
        this.rpc.sendShutdown(shutDown);
      } else {
        // Still loading: it cannot read Shutdown yet, so interrupt it.
        this.rpc.close(shutDown);
        this.proc.signal("SIGTERM");
      }
      const timer = setTimeout(() => this.proc.kill(), graceMs);
      await this.exited;
      clearTimeout(timer);
    }
    await this.exited;
    await this.channel.close();
  }

  /** For 'exit' hooks: kill, close the sockets and remove their files, synchronously. */
  killAndCleanSync(): void {
    this.proc.kill();
    this.channel.closeSync();
    if (this.proc.pid > 0) removeSegmentsOf(this.proc.pid);
  }

  /** Start-up failed or was cut short: make sure the process is gone before reporting. */
  async abortStart(): Promise<void> {
    this.shutdownRequested = true;
    this.proc.kill();
    await this.exited;
  }
}

/**
 * Spawns the Python worker and resolves once it has sent a Ready whose protocol
 * version matches. Rejects with WorkerStartError (the worker's Fatal message,
 * or its stderr tail) and leaves no process behind when it cannot start, or
 * when `signal` aborts the start.
 */
export async function startWorker(opts: WorkerOptions, signal?: AbortSignal): Promise<WorkerClient> {
  let worker: SupervisedWorker | null = null;
  let channel: EngineChannel;
  try {
    channel = await EngineChannel.bind({
      transport: opts.transport ?? "ipc",
      onMessage: (message) => worker?.rpc.onMessage(message),
      onError: (error) => worker?.rpc.onChannelError(error),
    });
  } catch (error) {
    throw new WorkerStartError((error as Error).message, null);
  }

  let proc: WorkerProcess;
  try {
    proc = WorkerProcess.spawn(opts, channel.inEndpoint, channel.outEndpoint);
  } catch (error) {
    await channel.close();
    throw new WorkerStartError(`cannot start the worker: ${(error as Error).message}`, null);
  }
  worker = new SupervisedWorker(proc, channel, opts);
  const started = worker;
  const onAbort = (): void => void started.shutdown(1_000);
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    if (signal?.aborted) onAbort();
    await worker.waitForReady(opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS);
  } catch (error) {
    // Every failure path ends with the process gone and the channel closed.
    await worker.abortStart();
    await channel.close();
    if (error instanceof WorkerStartError) throw error;
    throw new WorkerStartError((error as Error).message, null);
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
  return worker;
}

// ---- restarts ------------------------------------------------------------------

/** Plain data (it crosses to the engine thread). */
export interface RestartPolicy {
  /**
   * Restarts in a row before giving up (--max-worker-restarts); 0: a death is
   * final. The count starts over once a worker has stayed up healthyAfterMs.
   */
  maxRestarts: number;
  /** Restart n of a row (0-based) waits min(backoffBaseMs * 2^n, backoffCapMs): 1 s, 2 s, 4 s ... 30 s by default. */
  backoffBaseMs?: number;
  backoffCapMs?: number;
  /** Default 60 s. */
  healthyAfterMs?: number;
}

const BACKOFF_BASE_MS = 1_000;
const BACKOFF_CAP_MS = 30_000;
const HEALTHY_AFTER_MS = 60_000;

/** The wait before restart n (0-based) of a row. */
export function backoffMs(policy: RestartPolicy, n: number): number {
  return Math.min((policy.backoffBaseMs ?? BACKOFF_BASE_MS) * 2 ** n, policy.backoffCapMs ?? BACKOFF_CAP_MS);
}

export type WorkerEvent =
  /** The worker died (or a restart attempt failed); a new one starts in restartInMs. */
  | { kind: "down"; rank: number; exit: WorkerExit; restartInMs: number }
  /** A restarted worker is Ready. */
  | { kind: "up"; rank: number; client: WorkerClient; restarts: number }
  /** Too many restarts in a row: the rank stays down. */
  | { kind: "gave-up"; rank: number; exit: WorkerExit; message: string };

/** Keeps one rank's worker running; see the top of this file. */
export class WorkerSupervisor {
  private current: WorkerClient;
  private restartsInARow = 0;
  private restarts = 0;
  private upSince = performance.now();
  private timer: NodeJS.Timeout | null = null;
  private readonly stopping = new AbortController();
  private startingNext: Promise<void> | null = null;
  private gaveUp = false;

  private constructor(
    readonly rank: number,
    /** Options of restarted incarnations: the first one's sizes, no progress reporting (the bar was for the first load). */
    private readonly options: WorkerOptions,
    first: WorkerClient,
    private readonly policy: RestartPolicy,
    private readonly onEvent: (event: WorkerEvent) => void,
  ) {
    this.current = first;
    this.watch(first);
  }

  /** Starts the first incarnation; a failure there is final (WorkerStartError), never retried. */
  static async start(rank: number, options: WorkerOptions, policy: RestartPolicy, onEvent: (event: WorkerEvent) => void, signal?: AbortSignal): Promise<WorkerSupervisor> {
    const first = await startWorker(options, signal);
    const { onLoadProgress: _bar, ...rest } = options;
    // A restarted worker must fit the engine sized from the first one: same KV block count, same length limit.
    const ready = first.ready;
    const again: WorkerOptions = {
      ...rest,
      ...(ready.max_model_len > 0 ? { maxModelLen: ready.max_model_len } : {}),
      ...(ready.num_blocks > 0 ? { numBlocks: ready.num_blocks, kvCacheMemoryBytes: undefined } : {}),
    };
    return new WorkerSupervisor(rank, again, first, policy, onEvent);
  }

  /** The current incarnation (dead while a restart is pending). */
  get client(): WorkerClient {
    return this.current;
  }

  /** Restarts since start. */
  get numRestarts(): number {
    return this.restarts;
  }

  private watch(client: WorkerClient): void {
    client.onDeath((exit) => {
      if (client !== this.current || this.stopping.signal.aborted) return;
      // A worker that served a while before dying is not part of a crash loop.
      if (performance.now() - this.upSince >= (this.policy.healthyAfterMs ?? HEALTHY_AFTER_MS)) this.restartsInARow = 0;
      this.scheduleRestart(exit);
    });
  }

  private scheduleRestart(exit: WorkerExit): void {
    if (this.restartsInARow >= this.policy.maxRestarts) {
      this.gaveUp = true;
      const tries = this.policy.maxRestarts;
      const message =
        tries === 0
          ? `the model worker of rank ${this.rank} died and restarts are off (--max-worker-restarts 0): ${exit.summary}`
          : `the model worker of rank ${this.rank} died ${tries + 1} times in a row (--max-worker-restarts ${tries}): ${exit.summary}`;
      this.onEvent({ kind: "gave-up", rank: this.rank, exit, message });
      return;
    }
    const delay = backoffMs(this.policy, this.restartsInARow);
    this.restartsInARow++;
    this.onEvent({ kind: "down", rank: this.rank, exit, restartInMs: delay });
    this.timer = setTimeout(() => {
      this.timer = null;
      this.startingNext = this.restart();
    }, delay);
  }

  private async restart(): Promise<void> {
    let client: WorkerClient;
    try {
      client = await startWorker(this.options, this.stopping.signal);
    } catch (error) {
      if (this.stopping.signal.aborted) return;
      const message = (error as Error).message;
      const exit = error instanceof WorkerStartError && error.exit !== null ? error.exit : { code: null, signal: null, message, summary: firstLine(message) };
      this.scheduleRestart(exit);
      return;
    }
    if (this.stopping.signal.aborted) {
      await client.shutdown();
      return;
    }
    this.current = client;
    this.upSince = performance.now();
    this.restarts++;
    this.watch(client);
    this.onEvent({ kind: "up", rank: this.rank, client, restarts: this.restarts });
  }

  /** True once the supervisor has given up on its worker. */
  get finished(): boolean {
    return this.gaveUp;
  }

  /** Stops restarting and shuts the current worker down (a restart in progress is cut short). Idempotent. */
  async stop(graceMs: number = DEFAULT_SHUTDOWN_GRACE_MS): Promise<void> {
    this.stopping.abort();
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    await this.startingNext;
    await this.current.shutdown(graceMs).catch(() => {});
  }
}

function firstLine(text: string): string {
  return text.split("\n", 1)[0] ?? text;
}
