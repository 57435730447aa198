// The machinery every tool-call parser shares (see tool-parser.ts for the
// contract): a buffer of text not consumed yet, the piece being built, and
// small helpers for markers that may be split across pieces.

import { partialTagsLength } from "../text/partial-tag.js";
import type { JsonCall } from "./json-call.js";
import type { ToolCallDelta } from "./tool-call.js";

/** What a piece of answer text becomes. */
export interface ToolParserPiece {
  content: string;
  calls: ToolCallDelta[];
}

export interface ToolCallParser {
  push(text: string): ToolParserPiece;
  /** The end of the answer: held text is released (as content unless it completes a call). */
  finish(): ToolParserPiece;
}

/**
 * The shared machinery: a buffer of unconsumed text, the piece being built,
 * and a step function each parser implements. step() consumes from `held`
 * and returns false when it needs more text (or, when final, has nothing
 * left to do).
 */
export abstract class StreamingToolParser implements ToolCallParser {
  protected held = "";
  protected out: ToolParserPiece = { content: "", calls: [] };
  protected final = false;

  push(text: string): ToolParserPiece {
    this.held += text;
    return this.run();
  }

  finish(): ToolParserPiece {
    this.final = true;
    return this.run();
  }

  private run(): ToolParserPiece {
    while (this.step()) {
      // each step consumed something or changed state
    }
    const out = this.out;
    this.out = { content: "", calls: [] };
    return out;
  }

  protected abstract step(): boolean;

  protected content(text: string): void {
    this.out.content += text;
  }

  protected calls(deltas: readonly ToolCallDelta[]): void {
    for (const d of deltas) this.out.calls.push(d);
  }

  /**
   * Plain content up to the first of `markers`: emits the text before it and
   * returns the marker (consumed), or emits all but a possible partial marker
   * and returns null.
   */
  protected contentUntil(markers: readonly string[]): string | null {
    let at = -1;
    let found: string | null = null;
    for (const marker of markers) {
      const i = this.held.indexOf(marker);
      if (i >= 0 && (at < 0 || i < at)) {
        at = i;
        found = marker;
      }
    }
    if (found !== null) {
      this.content(this.held.slice(0, at));
      this.held = this.held.slice(at + found.length);
      return found;
    }
    const keep = this.final ? 0 : partialTagsLength(this.held, markers);
    this.content(this.held.slice(0, this.held.length - keep));
    this.held = this.held.slice(this.held.length - keep);
    return null;
  }

  /**
   * Feeds the held text to a JSON call object: "done" when the object is
   * complete, "failed" when it is not a call (what it read is content, unless
   * it had already named its function), "more" when it needs more text.
   */
  protected feedCall(call: JsonCall): "done" | "failed" | "more" {
    const { result, deltas } = call.feed(this.held);
    this.calls(deltas);
    this.held = this.held.slice(result.used);
    if (result.error !== null) {
      if (!call.isNamed) this.content(call.consumed);
      return "failed";
    }
    if (result.done) return "done";
    if (this.final && !call.isNamed) this.content(call.consumed);
    return "more";
  }

  /** Drops leading whitespace; true when text other than whitespace is held. */
  protected skipSpace(): boolean {
    this.held = this.held.trimStart();
    return this.held !== "";
  }

  /**
   * Which of `markers` the held text starts with: the marker (consumed),
   * "wait" when it could still become one, or null when it cannot.
   */
  protected startsWith(markers: readonly string[]): string | "wait" | null {
    for (const marker of markers) {
      if (this.held.startsWith(marker)) {
        this.held = this.held.slice(marker.length);
        return marker;
      }
    }
    if (!this.final && markers.some((m) => m.startsWith(this.held))) return "wait";
    return null;
  }
}
