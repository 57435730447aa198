// Reasoning output (--reasoning-parser): a thinking model writes its reasoning
// between <think> and </think>, then its answer. The split goes to the client
// as `reasoning_content` and `content` (message and streamed delta), as vLLM
// names them.
//
// Both parsers know the same tags; they differ in where the output starts:
// - deepseek_r1: inside the reasoning (DeepSeek-R1's template opens <think> in
//   the prompt); an output that never closes it is all reasoning.
// - qwen3: inside the reasoning only when the prompt left a <think> open (the
//   Qwen3 thinking-2507 templates) or the output opens one itself (hybrid
//   Qwen3); otherwise it is all content. With chat_template_kwargs
//   {"enable_thinking": false} Qwen3's template writes an empty, closed think
//   block into the prompt, so the answer is content.
// For both, a prompt whose last think tag is a closing one (thinking switched
// off by the template) starts in the answer, where think tags are plain text.
//
// Text arrives in pieces (one per engine step); tags may be split across them
// and are held back while incomplete, so a stream never shows part of a tag.
// A leading <think> (after optional whitespace) is dropped; whitespace right
// after </think> is dropped (the answer starts at its first visible
// character). Any split of the same text gives the same reasoning and content.

import { partialTagLength } from "../text/partial-tag.js";

export const REASONING_PARSERS = ["qwen3", "deepseek_r1"] as const;
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];

export const THINK_START = "<think>";
export const THINK_END = "</think>";

/** What one piece of text adds to each side. */
export interface ReasoningDelta {
  reasoning: string;
  content: string;
}

/**
 * Where the output starts:
 * - "reasoning": inside the think block (an optional <think> opens it again);
 * - "either": content unless the output opens with <think>;
 * - "content": the answer (think tags are plain text).
 */
export type ReasoningStart = "reasoning" | "either" | "content";

/** Where the parser named `name` starts its output, given the rendered prompt. */
export function reasoningStart(name: ReasoningParserName, prompt: string): ReasoningStart {
  const open = prompt.lastIndexOf(THINK_START);
  const close = prompt.lastIndexOf(THINK_END);
  if (close > open) return "content";
  if (open >= 0) return "reasoning";
  return name === "deepseek_r1" ? "reasoning" : "either";
}

type State = "opening" | "either" | "reasoning" | "after-end" | "content";

export class ReasoningSplitter {
  private state: State;
  /** Text received and not yet assigned to a side. */
  private held = "";

  constructor(start: ReasoningStart) {
    this.state = start === "reasoning" ? "opening" : start === "either" ? "either" : "content";
  }

  /** True once the reasoning is over (or there was none): later text is content. */
  get inContent(): boolean {
    return this.state === "after-end" || this.state === "content";
  }

  /** Adds a piece; returns the text each side gained. */
  push(text: string): ReasoningDelta {
    const out: ReasoningDelta = { reasoning: "", content: "" };
    this.held += text;
    this.advance(out);
    return out;
  }

  /** The end of the output: whatever was held back goes to the side it was on. */
  finish(): ReasoningDelta {
    const out: ReasoningDelta = { reasoning: "", content: "" };
    this.advance(out);
    const rest = this.held;
    this.held = "";
    if (this.state === "opening" || this.state === "reasoning") out.reasoning += rest;
    else if (this.state === "either" || this.state === "content") out.content += rest;
    // after-end: only whitespace is held there, and it is dropped.
    return out;
  }

  private advance(out: ReasoningDelta): void {
    for (;;) {
      switch (this.state) {
        case "opening":
        case "either": {
          const lead = this.held.length - this.held.trimStart().length;
          const rest = this.held.slice(lead);
          if (rest.startsWith(THINK_START)) {
            this.held = rest.slice(THINK_START.length);
            this.state = "reasoning";
            continue;
          }
          // Undecided while the text is blank or could still become <think>.
          if (rest === "" || THINK_START.startsWith(rest)) return;
          this.state = this.state === "opening" ? "reasoning" : "content";
          continue;
        }
        case "reasoning": {
          const end = this.held.indexOf(THINK_END);
          if (end >= 0) {
            out.reasoning += this.held.slice(0, end);
            this.held = this.held.slice(end + THINK_END.length);
            this.state = "after-end";
            continue;
          }
          const keep = partialTagLength(this.held, THINK_END);
          out.reasoning += this.held.slice(0, this.held.length - keep);
          this.held = this.held.slice(this.held.length - keep);
          return;
        }
        case "after-end": {
          const trimmed = this.held.trimStart();
          if (trimmed === "") {
            this.held = "";
            return;
          }
          this.held = trimmed;
          this.state = "content";
          continue;
        }
        case "content":
          out.content += this.held;
          this.held = "";
          return;
      }
    }
  }
}
