// The contract between whoever starts a model worker (the CLI, tests) and the
// supervisor that owns the Python process.

import type { ReadyMessage, StepMaskMessage, StepMessage, StepResultMessage } from "../transport/messages.js";

/**
 * executeStep() rejected because the worker behind the executor is gone (it
 * died, was killed, or is being stopped), not because of the step itself.
 */
export class ExecutorLostError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ExecutorLostError";
  }
}

/** What the engine core needs from a model worker: one step at a time, in order. */
export interface StepExecutor {
  readonly ready: ReadyMessage;
  executeStep(step: StepMessage): Promise<StepResultMessage>;
  /** The grammar masks of a step sent with mask_rows (the worker waits for them before sampling). */
  sendStepMask?(mask: StepMaskMessage): void;
}

export type Dtype = "auto" | "float32" | "bfloat16" | "float16";
export type Device = "auto" | "cpu" | "cuda";
/** auto: the weight files; dummy: random decoder weights of the config's shapes (no files); dummy-null: no model at all. */
export type LoadFormat = "auto" | "dummy" | "dummy-null";
/** vLLM's --runner: generate (an LLM), pooling (an embedding model) or auto (the worker decides from the directory). */
export type Runner = "auto" | "generate" | "pooling";
export type DistributedExecutorBackend = "mp" | "ray";

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
  /** The worker's attention kernels (auto: cpu on CPU, triton on CUDA); the worker checks the name. */
  attentionBackend?: string;
  /** No CUDA graphs: every step runs eagerly (vLLM's --enforce-eager). */
  enforceEager?: boolean;
  /** --runner (default auto). */
  runner?: Runner;
  /** vLLM's --hf-overrides, as JSON the worker checks (default none). */
  hfOverrides?: Record<string, unknown> | null;
  /** vLLM's --model-loader-extra-config, as JSON the worker checks (default none). */
  modelLoaderExtraConfig?: Record<string, unknown> | null;
  /** Speculative decoding's n-gram proposer (absent: off). */
  /** draftModel: the draft model's directory (the draft_model method); null: n-gram lookup. */
  speculative?: { numSpeculativeTokens: number; promptLookupMin: number; promptLookupMax: number; draftModel: string | null };
  /** --max-loras and --max-lora-rank: the worker serves LoRA adapters (absent: LoRA off). */
  lora?: { maxLoras: number; maxLoraRank: number };
  /** Most rows a decode step can have: the largest CUDA graph the worker captures. */
  maxNumSeqs?: number;
  /** Interpreter; default BATON_PYTHON, else <repo>/.venv/bin/python. */
  python?: string;
  /** How long to wait for the Ready message (weights load). Default 600000. */
  startTimeoutMs?: number;
  /**
   * Copy the worker's stdout/stderr lines to our stderr, prefixed "[worker PID] "
   * (default true). The last lines are kept for error messages either way.
   */
  forwardOutput?: boolean;
  /**
   * Weight-loading progress (tensors loaded of all): the worker runs with
   * --progress and its progress lines go here instead of to our stderr.
   */
  onLoadProgress?: (done: number, total: number) => void;
  /** Graph nodes this worker hosts (default: every node of the model). */
  nodes?: string[];
  /** The worker's rank in the deployment (default 0): the owner named in its tensors' descriptors. */
  rank?: number;
  /** A graph model's constructor arguments (a deployment's model_kwargs). */
  modelKwargs?: Record<string, unknown>;
  /**
   * KV connector (prefill/decode disaggregation): the torch.distributed
   * rendezvous of the deployment's workers ("HOST:PORT", rank 0 serves it)
   * and their number; the worker joins only when its first KV transfer comes.
   */
  kvTransfer?: { address: string; worldSize: number };
  /** Bytes of the worker's shared-memory arena, through which its tensors reach workers of other ranks (default: none). */
  shmBytes?: number;
  /**
   * Tensor-parallel ranks (default 1). The engine spawns and talks to rank 0
   * only; rank 0 starts the others and forwards each Step to them (the group
   * is one worker: any rank dying takes the group down).
   */
  tensorParallelSize?: number;
  /** Worker processes sharing this host's cores (data-parallel replicas x a deployment's ranks; default 1): each takes its share of torch threads. */
  hostWorkers?: number;
  /** How ranks above 0 start: "mp" (default) child processes of rank 0, "ray" actors in a Ray placement group. */
  distributedExecutorBackend?: DistributedExecutorBackend;
  /** Variables added to the worker's environment (a data-parallel replica's CUDA_VISIBLE_DEVICES). */
  env?: Record<string, string>;
  /** ZeroMQ transport between engine and worker (default "ipc"). */
  transport?: "ipc" | "tcp";
  /**
   * A step the worker has not answered after this long means it hung; it is
   * killed (--step-timeout). Default: sized from observed step times
   * (step-client.ts).
   */
  stepTimeoutMs?: number;
}

export interface WorkerExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The worker's Fatal message, or the tail of its stderr. */
  message: string;
  /** One line: why it ended (the failure we know of, or how it exited and its last stderr line). */
  summary: string;
}

/** A running worker. executeStep() rejects once the worker has died. */
export interface WorkerClient extends StepExecutor {
  readonly pid: number;
  /** Called once if the worker exits without being asked to. */
  onDeath(listener: (exit: WorkerExit) => void): void;
  /** Send Shutdown, wait for exit, SIGKILL after a grace period. Idempotent. */
  shutdown(graceMs?: number): Promise<void>;
  /** False once the worker has exited or is shutting down. */
  readonly alive: boolean;
  /**
   * Round trip of a Ping (ms). The worker answers between steps, so a long step
   * delays the Pong; rejects after timeoutMs (default 5000) or if the worker dies.
   */
  ping(timeoutMs?: number): Promise<number>;
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

/** executeStep()/ping() failed because the worker died, failed or was shut down. */
export class WorkerDiedError extends ExecutorLostError {
  constructor(
    message: string,
    readonly exit: WorkerExit | null,
  ) {
    super(message);
    this.name = "WorkerDiedError";
  }
}

/** What happened to a model worker after start-up. */
export type WorkerHealthEvent = (
  /** It died (or a restart attempt failed); the next attempt starts in restartInMs. */
  | { kind: "down"; rank: number; exit: WorkerExit; restartInMs: number }
  /** A restarted worker is Ready and serving. */
  | { kind: "up"; rank: number; pid: number; restarts: number }
  /** It died once too often (--max-worker-restarts): its engine cannot serve any more. */
  | { kind: "gave-up"; rank: number; exit: WorkerExit; message: string }
) & {
  /** With --data-parallel-size > 1: the replica (engine core) whose worker it is. */
  replica?: number;
};
