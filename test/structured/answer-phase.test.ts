// Which generated tokens a grammar sees: all of them without a reasoning
// parser; after </think> when the output starts inside the thinking; and,
// where the output may open a think block, <think> is allowed as its first
// token on top of the grammar.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { AnswerPhase, type RequestGrammar } from "../../src/structured/answer-phase.js";

const spec = { kind: "json_object" as const, source: "" };
const THINK = 1000;
const END = 1001;

function walk(grammar: RequestGrammar, outputs: number[], at: number[]): (ReturnType<AnswerPhase["next"]> | null)[] {
  const phase = new AnswerPhase(grammar);
  return at.map((n) => phase.next(outputs.slice(0, n)));
}

describe("AnswerPhase", () => {
  test("no reasoning: every token goes to the grammar, in order, once", () => {
    assert.deepEqual(walk({ spec, reasoning: null }, [5, 6, 7], [0, 2, 3, 3]), [
      { tokens: [], allow: [] },
      { tokens: [5, 6], allow: [] },
      { tokens: [7], allow: [] },
      { tokens: [], allow: [] },
    ]);
  });

  test("starting inside the thinking: unconstrained until </think>, then the answer's tokens", () => {
    const grammar: RequestGrammar = { spec, reasoning: { start: "reasoning", startTokenId: THINK, endTokenId: END } };
    assert.deepEqual(walk(grammar, [9, 9, END, 5, 6], [0, 2, 3, 5]), [null, null, { tokens: [], allow: [] }, { tokens: [5, 6], allow: [] }]);
    // </think> and the first answer token in one step.
    assert.deepEqual(walk(grammar, [9, END, 5], [3]), [{ tokens: [5], allow: [] }]);
  });

  test("either: <think> is allowed first; taking it starts the thinking, anything else is the answer", () => {
    const grammar: RequestGrammar = { spec, reasoning: { start: "either", startTokenId: THINK, endTokenId: END } };
    assert.deepEqual(walk(grammar, [THINK, 3, END, 4], [0, 1, 2, 3, 4]), [{ tokens: [], allow: [THINK] }, null, null, { tokens: [], allow: [] }, { tokens: [4], allow: [] }]);
    assert.deepEqual(walk(grammar, [7, THINK, 8], [1, 3]), [{ tokens: [7], allow: [] }, { tokens: [THINK, 8], allow: [] }]);
  });
});
