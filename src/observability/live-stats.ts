// What the dashboard shows of recent requests, kept in process: token totals
// and the latency samples of the last minute. BatonMetrics' request traces
// feed it, so each latency is measured once and reaches both the Prometheus
// histograms (all time, bucketed) and these windows (recent, exact).

/** The newest samples (at most `capacity`), each with the time it was taken. */
export class RecentSamples {
  private readonly values: Float64Array;
  private readonly times: Float64Array;
  private next = 0;
  private count = 0;

  constructor(readonly capacity: number) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${capacity}`);
    this.values = new Float64Array(capacity);
    this.times = new Float64Array(capacity);
  }

  add(value: number, nowMs: number): void {
    this.values[this.next] = value;
    this.times[this.next] = nowMs;
    this.next = (this.next + 1) % this.capacity;
    if (this.count < this.capacity) this.count++;
  }

  /** The kept samples taken at or after `sinceMs`, sorted ascending. */
  since(sinceMs: number): number[] {
    const picked = new Float64Array(this.count);
    let n = 0;
    for (let k = 0; k < this.count; k++) {
      if ((this.times[k] as number) >= sinceMs) picked[n++] = this.values[k] as number;
    }
    return Array.from(picked.subarray(0, n).sort());
  }
}

export class LiveRequestStats {
  /** Prompt tokens of requests that produced their first token. */
  promptTokens = 0;
  generationTokens = 0;
  finishedRequests = 0;
  /** Milliseconds; times are performance.now(). */
  readonly ttftMs = new RecentSamples(2048);
  /** One sample per generated token after the first (a k-token output after a gap g: k samples of g/k). */
  readonly itlMs = new RecentSamples(8192);
  readonly e2eMs = new RecentSamples(2048);

  firstToken(promptTokens: number, ttftMs: number, nowMs: number): void {
    this.promptTokens += promptTokens;
    this.ttftMs.add(ttftMs, nowMs);
  }

  /** `count` tokens arrived `gapMs` apart on average. */
  interTokenGaps(gapMs: number, count: number, nowMs: number): void {
    for (let i = 0; i < Math.min(count, this.itlMs.capacity); i++) this.itlMs.add(gapMs, nowMs);
  }

  generated(count: number): void {
    this.generationTokens += count;
  }

  finished(e2eMs: number, nowMs: number): void {
    this.finishedRequests++;
    this.e2eMs.add(e2eMs, nowMs);
  }
}
