// What a chat choice's generated text becomes in the response: reasoning
// (--reasoning-parser) split from the answer, then tool calls (a tool-call
// parser, with tool_choice "auto") split from the rest of the answer. The
// same object serves both forms: a stream pushes each piece as it becomes
// final and sends what comes out; a collected response pushes the whole text
// once. Any split of the text gives the same result.

import type { ReasoningSplitter } from "../reasoning/reasoning-parser.js";
import { joinToolCallDeltas, mergeToolCallDeltas, type ToolCall, type ToolCallDelta } from "../tool-parsers/tool-call.js";
import type { ToolCallParser } from "../tool-parsers/tool-parser.js";

/** What one piece of generated text adds to a chat choice. */
export interface ChatPiece {
  reasoning: string;
  content: string;
  toolCalls: ToolCallDelta[];
}

export class ChatChoiceOutput {
  private numCalls = 0;

  constructor(
    private readonly reasoning: ReasoningSplitter | null,
    private readonly tools: ToolCallParser | null,
  ) {}

  /** Tool calls begun so far. */
  get numToolCalls(): number {
    return this.numCalls;
  }

  push(text: string): ChatPiece {
    const split = this.reasoning === null ? { reasoning: "", content: text } : this.reasoning.push(text);
    return this.answer(split.reasoning, split.content, false);
  }

  /** The end of the choice's text: everything held back comes out. */
  finish(): ChatPiece {
    const split = this.reasoning === null ? { reasoning: "", content: "" } : this.reasoning.finish();
    return this.answer(split.reasoning, split.content, true);
  }

  private answer(reasoning: string, content: string, final: boolean): ChatPiece {
    if (this.tools === null) return { reasoning, content, toolCalls: [] };
    const piece = this.tools.push(content);
    const calls = piece.calls;
    let text = piece.content;
    if (final) {
      const last = this.tools.finish();
      text += last.content;
      joinToolCallDeltas(calls, last.calls);
    }
    for (const call of calls) if (call.id !== undefined) this.numCalls++;
    return { reasoning, content: text, toolCalls: calls };
  }
}

export function joinPieces(a: ChatPiece, b: ChatPiece): ChatPiece {
  return { reasoning: a.reasoning + b.reasoning, content: a.content + b.content, toolCalls: joinToolCallDeltas([...a.toolCalls], b.toolCalls) };
}

export function isEmptyPiece(piece: ChatPiece): boolean {
  return piece.reasoning === "" && piece.content === "" && piece.toolCalls.length === 0;
}

/** A collected choice's tool calls. */
export function toolCallsOf(piece: ChatPiece): ToolCall[] {
  return mergeToolCallDeltas(piece.toolCalls);
}
