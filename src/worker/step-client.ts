// The step RPC client: the engine's side of the conversation with one worker
// over its ZeroMQ channel. Ready handshake with a protocol-version check,
// steps answered strictly in order (up to MAX_IN_FLIGHT outstanding, for
// overlap scheduling), pings, Shutdown, and the step watchdog that notices a
// worker which stopped answering (SIGSTOP, a deadlock, a step that never
// returns).
//
// It knows nothing about the process: when the worker must be stopped (it
// broke the protocol, said Fatal, or hung) it tells its owner through
// StepClientEvents, and the owner (supervisor.ts) kills the process and
// calls close() with the reason once it is gone.

import type { EngineChannel } from "../transport/channel.js";
import {
  PROTOCOL_VERSION,
  ProtocolError,
  type ReadyMessage,
  type StepMaskMessage,
  type StepMessage,
  type StepResultMessage,
  type WorkerToEngineMessage,
} from "../transport/messages.js";

/**
 * Steps that may be outstanding at once: the engine core's two (step N+1 is
 * sent while N runs) plus one carrying only graph work (worker-lane.ts).
 */
export const MAX_IN_FLIGHT = 3;

/** Without --step-timeout: never less than this... */
const STEP_TIMEOUT_FLOOR_MS = 60_000;
/** ...and this many times the slowest step seen after the first ones. */
const STEP_TIMEOUT_FACTOR = 20;
/** The first steps may compile kernels or capture graphs: they get this long. */
const FIRST_STEPS_TIMEOUT_MS = 600_000;
const FIRST_STEPS = 8;
/** An idle worker is pinged this often (or every step timeout, if shorter), so a hang is noticed without traffic too. */
const IDLE_PING_MS = 5_000;

export interface StepClientEvents {
  /** The worker must be stopped: it broke the protocol or stopped answering. `reason` is one line. */
  onFailure(reason: string): void;
  /** The worker said Fatal; it exits by itself right after. */
  onFatal(message: string): void;
}

export interface WatchdogOptions {
  /** A fixed limit for one step (--step-timeout); null: sized from observed step times. */
  stepTimeoutMs: number | null;
}

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

export class StepClient {
  private readyMessage: ReadyMessage | null = null;
  private readyWaiter: ((ready: ReadyMessage) => void) | null = null;
  private readonly pending: PendingStep[] = [];
  private readonly pings = new Map<number, PendingPing>();
  private nextNonce = 1;
  private lastStepId = -Infinity;
  /** Set once the worker is gone or being stopped: every call rejects with it. */
  private closedWith: (() => Error) | null = null;
  // Watchdog state.
  private watchdog: NodeJS.Timeout | null = null;
  /** When the worker started on the oldest outstanding step (it runs them one after another). */
  private headSince = 0;
  private lastActivity = 0;
  private completedSteps = 0;
  private slowestStepMs = 0;
  private idlePing = false;

  constructor(
    private readonly channel: EngineChannel,
    private readonly events: StepClientEvents,
    private readonly options: WatchdogOptions,
  ) {}

  get ready(): ReadyMessage | null {
    return this.readyMessage;
  }

  /** Steps sent and not answered. */
  get outstanding(): number {
    return this.pending.length;
  }

  /** The step limit in force now (ms). */
  get stepTimeoutMs(): number {
    if (this.options.stepTimeoutMs !== null) return this.options.stepTimeoutMs;
    if (this.completedSteps < FIRST_STEPS) return FIRST_STEPS_TIMEOUT_MS;
    return Math.max(STEP_TIMEOUT_FLOOR_MS, STEP_TIMEOUT_FACTOR * this.slowestStepMs);
  }

  /** Resolves with the worker's Ready (its protocol version checked). */
  waitForReady(): Promise<ReadyMessage> {
    return new Promise((resolve) => {
      if (this.readyMessage !== null) resolve(this.readyMessage);
      else this.readyWaiter = resolve;
    });
  }

  // Called by the channel for every decoded worker message.
  onMessage(message: WorkerToEngineMessage): void {
    if (this.closedWith !== null) return;
    this.lastActivity = performance.now();
    switch (message.kind) {
      case "Ready":
        if (this.readyMessage !== null) return this.events.onFailure("worker sent Ready twice");
        if (message.protocol_version !== PROTOCOL_VERSION) {
          return this.events.onFailure(
            `model worker speaks protocol version ${message.protocol_version}, the engine speaks ${PROTOCOL_VERSION}; ` +
              "the Python package and the TypeScript build are out of step",
          );
        }
        this.readyMessage = message;
        this.startWatchdog();
        this.readyWaiter?.(message);
        this.readyWaiter = null;
        return;
      case "Fatal":
        this.events.onFatal(message.message);
        return;
      case "StepResult": {
        const head = this.pending[0];
        if (head === undefined || head.stepId !== message.step_id) {
          return this.events.onFailure(`worker answered step ${message.step_id}, but the next outstanding step is ${head?.stepId ?? "none"}`);
        }
        this.pending.shift();
        const now = this.lastActivity;
        const tookMs = now - this.headSince;
        if (this.completedSteps >= FIRST_STEPS && tookMs > this.slowestStepMs) this.slowestStepMs = tookMs;
        this.completedSteps++;
        // The worker starts on the next outstanding step now.
        this.headSince = now;
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

  // A frame we cannot decode means the two sides disagree: the worker must stop.
  onChannelError(error: Error): void {
    if (this.closedWith !== null) return;
    const what = error instanceof ProtocolError ? "a malformed message" : "an unreadable frame";
    this.events.onFailure(`model worker sent ${what}: ${error.message}`);
  }

  /** A step's grammar masks (structured output), sent after the step itself. */
  sendStepMask(mask: StepMaskMessage): void {
    if (this.closedWith !== null) return;
    void this.channel.send(mask).catch(() => {});
  }

  executeStep(step: StepMessage): Promise<StepResultMessage> {
    if (this.closedWith !== null) return Promise.reject(this.closedWith());
    if (this.readyMessage === null) return Promise.reject(new Error("worker is not ready yet"));
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
          // The socket closed under us: close() rejects the pending step.
        });
      } catch (error) {
        reject(error as Error);
        return;
      }
      this.lastStepId = step.step_id;
      if (this.pending.length === 0) this.headSince = performance.now();
      this.pending.push({ stepId: step.step_id, resolve, reject });
    });
  }

  ping(timeoutMs: number): Promise<number> {
    if (this.closedWith !== null) return Promise.reject(this.closedWith());
    const nonce = this.nextNonce++;
    return new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pings.delete(nonce);
        reject(new Error(`model worker did not answer a ping within ${formatMs(timeoutMs)}`));
      }, timeoutMs);
      this.pings.set(nonce, { sentAt: performance.now(), resolve, reject, timer });
      void this.channel.send({ kind: "Ping", nonce }).catch(() => {});
    });
  }

  /** Asks the worker to exit; nothing is sent after it. */
  sendShutdown(makeError: () => Error): void {
    if (this.closedWith !== null) return;
    void this.channel.send({ kind: "Shutdown" }).catch(() => {});
    this.close(makeError);
  }

  /** The worker is gone (or going): everything outstanding and every later call rejects with makeError(). */
  close(makeError: () => Error): void {
    if (this.closedWith !== null) return;
    this.closedWith = makeError;
    if (this.watchdog !== null) clearInterval(this.watchdog);
    this.watchdog = null;
    this.readyWaiter = null;
    for (const step of this.pending.splice(0)) step.reject(makeError());
    for (const ping of this.pings.values()) {
      clearTimeout(ping.timer);
      ping.reject(makeError());
    }
    this.pings.clear();
  }

  // ---- the watchdog ------------------------------------------------------------

  private startWatchdog(): void {
    const fixed = this.options.stepTimeoutMs;
    const period = fixed === null ? 1_000 : Math.min(1_000, Math.max(25, fixed / 4));
    this.lastActivity = performance.now();
    this.watchdog = setInterval(() => this.check(), period);
    // Only a guard: it must not keep the process alive by itself.
    this.watchdog.unref();
  }

  private check(): void {
    if (this.closedWith !== null) return;
    const now = performance.now();
    const limit = this.stepTimeoutMs;
    const head = this.pending[0];
    if (head !== undefined) {
      if (now - this.headSince > limit) {
        this.events.onFailure(`model worker did not answer step ${head.stepId} within ${formatMs(limit)} (--step-timeout); it is treated as hung`);
      }
      return;
    }
    if (this.idlePing || now - this.lastActivity < Math.min(IDLE_PING_MS, limit)) return;
    // Idle: a ping proves the worker still reads its socket.
    this.idlePing = true;
    this.ping(limit).then(
      () => {
        this.idlePing = false;
      },
      (error: Error) => {
        this.idlePing = false;
        if (this.closedWith === null) this.events.onFailure(`${error.message} while idle (--step-timeout); it is treated as hung`);
      },
    );
  }
}

function formatMs(ms: number): string {
  return ms >= 1000 ? `${Number((ms / 1000).toFixed(1))} s` : `${Math.round(ms)} ms`;
}
