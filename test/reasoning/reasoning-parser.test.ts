// The reasoning split on hand-written model outputs: where each parser starts,
// tags split anywhere across pieces, and any split of the same text giving the
// same reasoning and content as the whole text at once.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { ReasoningSplitter, reasoningStart, type ReasoningStart } from "../../src/reasoning/reasoning-parser.js";

interface Split {
  reasoning: string;
  content: string;
}

function split(start: ReasoningStart, pieces: readonly string[]): Split {
  const splitter = new ReasoningSplitter(start);
  const out: Split = { reasoning: "", content: "" };
  for (const piece of [...pieces.map((p) => splitter.push(p)), splitter.finish()]) {
    out.reasoning += piece.reasoning;
    out.content += piece.content;
  }
  return out;
}

/** Cuts text at the given offsets (sorted, deduplicated, within the text). */
function cut(text: string, offsets: number[]): string[] {
  const at = [...new Set(offsets.map((o) => o % (text.length + 1)))].sort((a, b) => a - b);
  const pieces: string[] = [];
  let from = 0;
  for (const o of at) {
    pieces.push(text.slice(from, o));
    from = o;
  }
  pieces.push(text.slice(from));
  return pieces;
}

const QWEN_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
const QWEN_NO_THINK_PROMPT = `${QWEN_PROMPT}<think>\n\n</think>\n\n`;
const QWEN_2507_PROMPT = `${QWEN_PROMPT}<think>\n`;
const R1_PROMPT = "<｜User｜>Hi<｜Assistant｜><think>\n";

const OUTPUTS: { name: string; start: ReasoningStart; text: string; reasoning: string; content: string }[] = [
  {
    name: "qwen3 hybrid: the output opens and closes its think block",
    start: reasoningStart("qwen3", QWEN_PROMPT),
    text: "<think>\nThe user greets me. I greet back.\n</think>\n\nHello! How can I help?",
    reasoning: "\nThe user greets me. I greet back.\n",
    content: "Hello! How can I help?",
  },
  {
    name: "qwen3 without a think block: all content, tags inside are text",
    start: reasoningStart("qwen3", QWEN_PROMPT),
    text: "Plain answer mentioning </think> and <think> as text.",
    reasoning: "",
    content: "Plain answer mentioning </think> and <think> as text.",
  },
  {
    name: "qwen3 with enable_thinking false: the template closed the block, the answer is content",
    start: reasoningStart("qwen3", QWEN_NO_THINK_PROMPT),
    text: "Hello there.",
    reasoning: "",
    content: "Hello there.",
  },
  {
    name: "qwen3 thinking-2507: the prompt opened <think>, the output only closes it",
    start: reasoningStart("qwen3", QWEN_2507_PROMPT),
    text: "Let me think: 2+2=4.</think>\n\nThe answer is 4.",
    reasoning: "Let me think: 2+2=4.",
    content: "The answer is 4.",
  },
  {
    name: "deepseek_r1: starts in the reasoning, a repeated <think> is dropped",
    start: reasoningStart("deepseek_r1", R1_PROMPT),
    text: "<think>\nhmm\n</think>\nAnswer: 42",
    reasoning: "\nhmm\n",
    content: "Answer: 42",
  },
  {
    name: "deepseek_r1 cut off before </think>: everything is reasoning",
    start: reasoningStart("deepseek_r1", "no tags in this prompt"),
    text: "Okay, so the question is about </thi",
    reasoning: "Okay, so the question is about </thi",
    content: "",
  },
  {
    name: "empty reasoning, then content with its own angle brackets",
    start: "reasoning",
    text: "</think><b>bold</b> <think> stays",
    reasoning: "",
    content: "<b>bold</b> <think> stays",
  },
  {
    name: "a near-miss tag in the reasoning is reasoning",
    start: "either",
    text: "<think>a </thinker> b</think>c",
    reasoning: "a </thinker> b",
    content: "c",
  },
  {
    name: "either: text that starts like <think> but is not",
    start: "either",
    text: "<thin ice>",
    reasoning: "",
    content: "<thin ice>",
  },
  {
    name: "unicode on both sides",
    start: "reasoning",
    text: "思考中…🤔</think>\n答案是 ✓",
    reasoning: "思考中…🤔",
    content: "答案是 ✓",
  },
];

describe("reasoningStart", () => {
  test("deepseek_r1 starts in the reasoning unless the prompt closed the block", () => {
    assert.equal(reasoningStart("deepseek_r1", R1_PROMPT), "reasoning");
    assert.equal(reasoningStart("deepseek_r1", "plain"), "reasoning");
    assert.equal(reasoningStart("deepseek_r1", "<think>\n\n</think>\n\n"), "content");
  });

  test("qwen3 starts in the reasoning only when the prompt left <think> open", () => {
    assert.equal(reasoningStart("qwen3", QWEN_PROMPT), "either");
    assert.equal(reasoningStart("qwen3", QWEN_2507_PROMPT), "reasoning");
    assert.equal(reasoningStart("qwen3", QWEN_NO_THINK_PROMPT), "content");
  });
});

describe("ReasoningSplitter", () => {
  for (const o of OUTPUTS) {
    test(o.name, () => {
      const whole = split(o.start, [o.text]);
      assert.equal(whole.reasoning, o.reasoning);
      assert.equal(whole.content, o.content);
      // One character at a time, as a slow stream would.
      const chars = split(o.start, [...o.text]);
      assert.equal(chars.reasoning, o.reasoning);
      assert.equal(chars.content, o.content);
    });
  }

  test("any split gives the same reasoning and content (pieces only append, so no tag ever shows)", () => {
    fc.assert(
      fc.property(fc.constantFrom(...OUTPUTS), fc.array(fc.nat(), { maxLength: 12 }), (o, offsets) => {
        const result = split(o.start, cut(o.text, offsets));
        assert.equal(result.reasoning, o.reasoning);
        assert.equal(result.content, o.content);
      }),
      { numRuns: 400 },
    );
  });

  test("random texts built from tag fragments: splitting never changes the result", () => {
    const fragment = fc.constantFrom("<think>", "</think>", "<", "</", "<th", "</thi", "nk>", "\n", " ", "a", "é", "🤔", "think");
    fc.assert(
      fc.property(
        fc.constantFrom<ReasoningStart>("reasoning", "either", "content"),
        fc.array(fragment, { maxLength: 16 }),
        fc.array(fc.nat(), { maxLength: 10 }),
        (start, fragments, offsets) => {
          const text = fragments.join("");
          const whole = split(start, [text]);
          const pieces = split(start, cut(text, offsets));
          assert.equal(pieces.reasoning, whole.reasoning);
          assert.equal(pieces.content, whole.content);
        },
      ),
      { numRuns: 1000 },
    );
  });
});
