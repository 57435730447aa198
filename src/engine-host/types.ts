// What the rest of Baton sees of a running engine core and its model worker,
// whichever thread the engine core runs on (start.ts chooses).

import type { EngineConfig } from "../engine/engine-core.js";
import type { EngineHandle } from "../frontend/generation.js";
import type { EngineStatsSource } from "../observability/metrics.js";
import type { GrammarService } from "../structured/grammar-service.js";
import type { ReadyMessage } from "../transport/messages.js";
import type { WorkerExit, WorkerOptions } from "../worker/types.js";

/** Engine settings the user chooses; block size, block count and max model length come from the worker's Ready. */
export type EngineSettings = Omit<EngineConfig, "maxModelLen" | "blockSize" | "numBlocks">;

export interface ServingEngine extends EngineHandle, EngineStatsSource {
  readonly ready: ReadyMessage;
  readonly config: EngineConfig;
  /** The model worker's process id. */
  readonly pid: number;
  /** Called once if the model worker dies (not when it is shut down). */
  onWorkerDeath(listener: (exit: WorkerExit) => void): void;
  /** Ends live requests ("abort"), then shuts the model worker down. Idempotent. */
  close(): Promise<void>;
}

export interface ServingEngineOptions {
  worker: WorkerOptions;
  engine: EngineSettings;
  /** The engine core in its own thread (default true). */
  engineThread?: boolean;
  /** Aborting it while the worker loads stops the start (it then rejects). */
  signal?: AbortSignal;
  /** Structured output: the grammar thread the engine core asks for token masks (absent: requests with a grammar are refused). */
  grammar?: GrammarService | null;
}

/** The engine could start its worker but not itself (e.g. a configuration the worker's Ready contradicts). */
export class EngineStartError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "EngineStartError";
  }
}
