// Per-phase timings of recent steps, in a fixed-size ring buffer of typed
// columns (no allocation per step), for benchmarks and metrics.

export interface StepTiming {
  stepId: number;
  numRows: number;
  numTokens: number;
  /** Engine-core CPU phases (ms). */
  scheduleMs: number;
  buildMs: number;
  /** executeStep call to its result, worker time included (ms). */
  roundTripMs: number;
  processMs: number;
  /** The worker's own phases from StepResult.timings (ms). */
  workerPrepareMs: number;
  workerForwardMs: number;
  workerSampleMs: number;
}

const COLUMNS = [
  "stepId",
  "numRows",
  "numTokens",
  "scheduleMs",
  "buildMs",
  "roundTripMs",
  "processMs",
  "workerPrepareMs",
  "workerForwardMs",
  "workerSampleMs",
] as const satisfies readonly (keyof StepTiming)[];

export class StepTimingRing {
  private readonly columns: Float64Array[];
  private next = 0;
  private count = 0;

  constructor(readonly capacity = 1024) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${capacity}`);
    this.columns = COLUMNS.map(() => new Float64Array(capacity));
  }

  get size(): number {
    return this.count;
  }

  record(timing: StepTiming): void {
    for (let c = 0; c < COLUMNS.length; c++) (this.columns[c] as Float64Array)[this.next] = timing[COLUMNS[c] as keyof StepTiming];
    this.next = (this.next + 1) % this.capacity;
    if (this.count < this.capacity) this.count++;
  }

  /** The last `limit` steps (all kept, by default), oldest first. */
  recent(limit = this.count): StepTiming[] {
    const n = Math.min(limit, this.count);
    const result: StepTiming[] = [];
    for (let k = n; k > 0; k--) {
      const slot = (this.next - k + this.capacity) % this.capacity;
      const timing = {} as Record<keyof StepTiming, number>;
      for (let c = 0; c < COLUMNS.length; c++) timing[COLUMNS[c] as keyof StepTiming] = (this.columns[c] as Float64Array)[slot] as number;
      result.push(timing);
    }
    return result;
  }

  clear(): void {
    this.next = 0;
    this.count = 0;
  }
}
