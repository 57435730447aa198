// Stop strings (OpenAI/vLLM `stop`), matched on the detokenized text.
//
// Text arrives in pieces (one per engine step). A stop string can span pieces,
// so the matcher holds back the longest tail of the text that is the start of
// some stop string: a stream never shows text that a later piece turns into a
// stop string. When a stop string appears, the text before it (plus the stop
// string itself with include_stop_str_in_output) is the last text emitted.
// Among several matches the one that starts first wins (ties: the longest).

export interface StopMatch {
  /** Text that is final now (possibly ""). */
  text: string;
  /** The stop string that matched, or null. */
  stop: string | null;
}

export class StopStringMatcher {
  private readonly stops: string[];
  private readonly maxLen: number;
  /** Text received but not emitted yet. */
  private buffer = "";
  private done = false;

  constructor(
    stops: readonly string[],
    private readonly includeStopInOutput = false,
  ) {
    if (stops.some((s) => s.length === 0)) throw new Error("stop strings must not be empty");
    this.stops = [...new Set(stops)];
    this.maxLen = Math.max(0, ...this.stops.map((s) => s.length));
  }

  /** Text currently held back (for tests). */
  get heldBack(): string {
    return this.buffer;
  }

  /**
   * Adds a piece of text. With final=true everything held back is released
   * (unless a stop string matches). With check=false (min_tokens not reached
   * yet) the text is released unchecked, as vLLM skips the check then.
   */
  push(piece: string, final = false, check = true): StopMatch {
    if (this.done) return { text: "", stop: null };
    this.buffer += piece;
    if (!check) {
      const text = this.buffer;
      this.buffer = "";
      return { text, stop: null };
    }
    let bestAt = -1;
    let best: string | null = null;
    for (const stop of this.stops) {
      const at = this.buffer.indexOf(stop);
      if (at < 0) continue;
      if (bestAt < 0 || at < bestAt || (at === bestAt && stop.length > (best?.length ?? 0))) {
        bestAt = at;
        best = stop;
      }
    }
    if (best !== null && !final) {
      // A stop string starting before the match may still complete: wait for more text.
      const pending = this.partialStartBefore(bestAt);
      if (pending >= 0) {
        const text = this.buffer.slice(0, pending);
        this.buffer = this.buffer.slice(pending);
        return { text, stop: null };
      }
    }
    if (best !== null) {
      this.done = true;
      const text = this.buffer.slice(0, bestAt) + (this.includeStopInOutput ? best : "");
      this.buffer = "";
      return { text, stop: best };
    }
    if (final) {
      const text = this.buffer;
      this.buffer = "";
      return { text, stop: null };
    }
    const hold = this.partialTail();
    const text = this.buffer.slice(0, this.buffer.length - hold);
    this.buffer = this.buffer.slice(this.buffer.length - hold);
    return { text, stop: null };
  }

  /** The first position before `end` where the rest of the buffer is a proper prefix of a stop string, or -1. */
  private partialStartBefore(end: number): number {
    for (let q = Math.max(0, this.buffer.length - this.maxLen + 1); q < end; q++) {
      const tail = this.buffer.slice(q);
      if (this.stops.some((s) => s.length > tail.length && s.startsWith(tail))) return q;
    }
    return -1;
  }

  /** Length of the longest tail of the buffer that is a proper prefix of a stop string. */
  private partialTail(): number {
    const limit = Math.min(this.buffer.length, this.maxLen - 1);
    for (let k = limit; k > 0; k--) {
      const tail = this.buffer.slice(this.buffer.length - k);
      if (this.stops.some((s) => s.startsWith(tail))) return k;
    }
    return 0;
  }
}
