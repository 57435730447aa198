// Where the engine core runs. `baton serve` (and the overhead benchmark) talk
// to a ServingEngine: the engine core with its model worker behind the
// frontend's submit/abort interface, plus what the metrics read and the
// lifecycle. Two placements, chosen with --engine-thread (default) or
// --no-engine-thread:
// - EngineThread (engine-thread.ts): the engine core and the worker link in
//   their own worker thread; the main thread only serves HTTP.
// - InProcessEngine (in-process.ts): everything on the main event loop.
// docs/benchmarks.md has the numbers behind the default.
// With --data-parallel-size N > 1, N of them (each in the chosen placement)
// behind a router: DataParallelEngine (data-parallel.ts).

import { DataParallelEngine } from "./data-parallel.js";
import { EngineThread } from "./engine-thread.js";
import { InProcessEngine } from "./in-process.js";
import type { ServingEngine, ServingEngineOptions } from "./types.js";

function startOne(options: ServingEngineOptions): Promise<ServingEngine> {
  return options.engineThread === false ? InProcessEngine.start(options) : EngineThread.start(options);
}

/**
 * Starts the model worker and the engine core. Rejects with WorkerStartError
 * (the worker's own message) or EngineStartError; nothing is left running then.
 */
export function startServingEngine(options: ServingEngineOptions): Promise<ServingEngine> {
  const dataParallel = options.dataParallel ?? null;
  if (dataParallel !== null && dataParallel.size > 1) return DataParallelEngine.start(options, dataParallel, startOne);
  return startOne(options);
}
