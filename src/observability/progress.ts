// A one-line progress bar for a terminal ("loading weights [#####.....] 45% 120/267"),
// redrawn in place with \r and finished with a newline at 100%.

export interface ProgressStream {
  write(text: string): boolean;
  columns?: number;
}

export class ProgressBar {
  private lastDrawn = -1;
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
    this.stream.write(`\r${renderBar(this.label, done, total, this.width)}`);
    if (done >= total) {
      this.finished = true;
      this.stream.write("\n");
    }
  };
}

export function renderBar(label: string, done: number, total: number, width: number): string {
  const fraction = total <= 0 ? 0 : Math.min(1, Math.max(0, done / total));
  const filled = Math.round(fraction * width);
  return `${label} [${"#".repeat(filled)}${".".repeat(width - filled)}] ${String(Math.floor(fraction * 100)).padStart(3)}% ${done}/${total}`;
}
