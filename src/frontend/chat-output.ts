// What a chat choice's generated text becomes in the response: reasoning
// (--reasoning-parser) split from the answer. The same object serves both
// forms: a stream pushes each piece as it becomes final and sends what comes
// out; a collected response pushes the whole text once. Any split of the text
// gives the same result.

import { ReasoningSplitter, type ReasoningDelta } from "../reasoning/reasoning-parser.js";

/** What one piece of generated text adds to a chat choice. */
export interface ChatPiece {
  reasoning: string;
  content: string;
}

export class ChatChoiceOutput {
  constructor(private readonly reasoning: ReasoningSplitter | null) {}

  push(text: string): ChatPiece {
    if (this.reasoning === null) return { reasoning: "", content: text };
    return this.reasoning.push(text);
  }

  /** The end of the choice's text: everything held back comes out. */
  finish(): ChatPiece {
    if (this.reasoning === null) return { reasoning: "", content: "" };
    return this.reasoning.finish();
  }
}

export function joinPieces(a: ChatPiece, b: ReasoningDelta): ChatPiece {
  return { reasoning: a.reasoning + b.reasoning, content: a.content + b.content };
}

export function isEmptyPiece(piece: ChatPiece): boolean {
  return piece.reasoning === "" && piece.content === "";
}
