// A one-line progress bar for a terminal ("loading weights [#####.....] 45% 120/267"),
// redrawn in place with \r and finished with a newline at 100%.

export interface ProgressStream {
  write(text: string): boolean;
  columns?: number;
}

export class ProgressBar {
  private lastDrawn = -1;
  private lastTotal = 0;
  private finished = false;

  constructor(
    private readonly label: string,
    private readonly stream: ProgressStream,
    private readonly width = 30,
  ) {}

  /** Draws done/total (bound, so it can be passed as a callback). */
  readonly update = (done: number, total: number): void => {
    if (this.finished || total <= 0) return;
    const fraction = Math.min(1, Math.max(0, done / total));
    const percent = Math.floor(fraction * 100);
    if (percent === this.lastDrawn) return;
    this.lastDrawn = percent;
    this.lastTotal = total;
    this.stream.write(`\r${renderBar(this.label, done, total, this.width)}`);
    if (done >= total) {
      this.finished = true;
      this.stream.write("\n");
    }
  };

  /**
   * Ends a bar that was drawn, at 100% when `complete` (the work is done even if
   * the last update is still in a pipe), else where it stood; later updates are ignored.
   */
  finish(complete = true): void {
    if (this.finished) return;
    this.finished = true;
    if (this.lastDrawn < 0) return;
    if (complete && this.lastDrawn < 100) this.stream.write(`\r${renderBar(this.label, this.lastTotal, this.lastTotal, this.width)}`);
    this.stream.write("\n");
  }
}

export function renderBar(label: string, done: number, total: number, width: number): string {
  const fraction = total <= 0 ? 0 : Math.min(1, Math.max(0, done / total));
  const filled = Math.round(fraction * width);
  return `${label} [${"#".repeat(filled)}${".".repeat(width - filled)}] ${String(Math.floor(fraction * 100)).padStart(3)}% ${done}/${total}`;
}
