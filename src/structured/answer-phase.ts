// Which generated tokens a request's grammar sees. Structured output applies
// to the answer, not to a reasoning model's thinking: with a reasoning parser
// the grammar starts after the </think> token, and where the output may or
// may not open a think block ("either"), its first token may be <think> on
// top of whatever the grammar allows.

import type { GrammarSpec } from "./grammar-spec.js";

/** What the engine is told about a constrained request (crosses threads: plain data). */
export interface RequestGrammar {
  spec: GrammarSpec;
  /** Thinking before the answer; null: the grammar applies from the first token. */
  reasoning: {
    /** "reasoning": the output starts inside the think block; "either": it may open one with its first token. */
    start: "reasoning" | "either";
    startTokenId: number;
    endTokenId: number;
  } | null;
}

/** The row's input to the grammar for the next token. */
export interface GrammarStep {
  /** Answer tokens the matcher has not seen yet. */
  tokens: number[];
  /** Tokens allowed on top of the grammar's. */
  allow: number[];
}

/** One request's walk through its output: thinking (unconstrained), then the answer (constrained). */
export class AnswerPhase {
  private phase: "either" | "reasoning" | "answer";
  /** Output tokens looked at so far. */
  private seen = 0;

  constructor(private readonly grammar: RequestGrammar) {
    this.phase = grammar.reasoning === null ? "answer" : grammar.reasoning.start;
  }

  /**
   * Takes the outputs generated since the last call; returns what the grammar
   * needs to mask the next token, or null while the model is thinking (no mask).
   */
  next(outputIds: readonly number[]): GrammarStep | null {
    const reasoning = this.grammar.reasoning;
    const tokens: number[] = [];
    for (; this.seen < outputIds.length; this.seen++) {
      const token = outputIds[this.seen] as number;
      if (this.phase === "either") {
        // The first token decides: <think> opens the thinking, anything else is the answer's first token.
        this.phase = token === reasoning?.startTokenId ? "reasoning" : "answer";
        if (this.phase === "reasoning") continue;
      }
      if (this.phase === "reasoning") {
        if (token === reasoning?.endTokenId) this.phase = "answer";
        continue;
      }
      tokens.push(token);
    }
    if (this.phase === "reasoning") return null;
    return { tokens, allow: this.phase === "either" && reasoning !== null ? [reasoning.startTokenId] : [] };
  }
}
