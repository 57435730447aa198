// The contract between whoever starts a model worker (the CLI, tests) and the
// supervisor that owns the Python process.

import type { StepExecutor } from "../engine/types.js";

export type Dtype = "auto" | "float32" | "bfloat16" | "float16";
export type Device = "auto" | "cpu" | "cuda";
export type LoadFormat = "auto" | "dummy-null";

export interface WorkerOptions {
  modelDir: string;
  blockSize: number;
  /** Explicit KV block count (vLLM's --num-gpu-blocks-override). */
  numBlocks?: number;
  /** KV budget in bytes when numBlocks is not given. */
  kvCacheMemoryBytes?: number;
  maxModelLen?: number;
  dtype: Dtype;
  device: Device;
  seed: number;
  loadFormat?: LoadFormat;
  /** Interpreter; default BATON_PYTHON, else <repo>/.venv/bin/python. */
  python?: string;
  /** How long to wait for the Ready message (weights load). */
  startTimeoutMs?: number;
}

export interface WorkerExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The worker's Fatal message, or the tail of its stderr. */
  message: string;
}

/** A running worker. executeStep() rejects once the worker has died. */
export interface WorkerClient extends StepExecutor {
  readonly pid: number;
  /** Called once if the worker exits without being asked to. */
  onDeath(listener: (exit: WorkerExit) => void): void;
  /** Send Shutdown, wait for exit, SIGKILL after a grace period. Idempotent. */
  shutdown(graceMs?: number): Promise<void>;
}

/** The worker could not start; message is the worker's own explanation. */
export class WorkerStartError extends Error {
  constructor(
    message: string,
    readonly exit: WorkerExit | null,
  ) {
    super(message);
    this.name = "WorkerStartError";
  }
}
