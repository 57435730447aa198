// Each tool-call parser on hand-written model outputs: content and calls for
// the whole text, the same for any split of it (random splits with
// fast-check), and deltas shaped as OpenAI streams them (a call's first delta
// has its index, id, type, name and empty arguments; later ones only
// argument fragments; indices count up from 0).

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { mergeToolCallDeltas, ToolCallEmitter, type ToolCallDelta, type ToolFunction } from "../../src/tool-parsers/tool-call.js";
import { createToolCallParser, toolCallIdStyle, type ToolCallParserName } from "../../src/tool-parsers/tool-parser.js";
import { convertParameter } from "../../src/tool-parsers/qwen3-coder.js";

interface Parsed {
  content: string;
  calls: { name: string; arguments: string }[];
  deltas: ToolCallDelta[];
  ids: string[];
}

function parse(name: ToolCallParserName, pieces: readonly string[], tools: ToolFunction[] = [], parallel = true): Parsed {
  const parser = createToolCallParser(name, new ToolCallEmitter(toolCallIdStyle(name), parallel), tools);
  let content = "";
  const deltas: ToolCallDelta[] = [];
  for (const piece of [...pieces.map((p) => parser.push(p)), parser.finish()]) {
    content += piece.content;
    deltas.push(...piece.calls);
  }
  const merged = mergeToolCallDeltas(deltas);
  return { content, calls: merged.map((c) => ({ name: c.function.name, arguments: c.function.arguments })), deltas, ids: merged.map((c) => c.id) };
}

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

/** The OpenAI stream shape: header first (id, type, name, ""), then fragments; indices 0, 1, ... */
function assertStreamShape(deltas: readonly ToolCallDelta[]): void {
  let next = 0;
  for (const d of deltas) {
    if (d.id !== undefined) {
      assert.equal(d.index, next, "a new call takes the next index");
      next++;
      assert.equal(d.type, "function");
      assert.equal(typeof d.function.name, "string");
      assert.equal(d.function.arguments, "");
    } else {
      assert.equal(d.index, next - 1, "fragments belong to the latest call");
      assert.equal(d.function.name, undefined);
      assert.notEqual(d.function.arguments, "");
    }
  }
}

interface Case {
  name: string;
  text: string;
  content: string;
  calls: { name: string; arguments: string }[];
  tools?: ToolFunction[];
}

const WEATHER: ToolFunction = {
  name: "get_weather",
  parameters: {
    type: "object",
    properties: { city: { type: "string" }, days: { type: "integer" }, metric: { type: "boolean" }, where: { type: "object" }, ratio: { type: "number" } },
    required: ["city"],
  },
};

const CASES: Record<ToolCallParserName, Case[]> = {
  hermes: [
    {
      name: "content, then one call",
      text: 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
      content: "Let me check.\n",
      calls: [{ name: "get_weather", arguments: '{"city": "Paris", "days": 3}' }],
    },
    {
      name: "two calls; braces, quotes, escapes and the end tag inside strings",
      text: '<tool_call>\n{"name": "a", "arguments": {"s": "x}{\\"</tool_call>\\\\", "n": [1, {"k": null}]}}\n</tool_call>\n<tool_call>{"arguments": {}, "name": "b"}</tool_call>\n',
      content: "",
      calls: [
        { name: "a", arguments: '{"s": "x}{\\"</tool_call>\\\\", "n": [1, {"k": null}]}' },
        { name: "b", arguments: "{}" },
      ],
    },
    {
      name: "no call: angle brackets and a near-miss marker are content",
      text: "a < b and <tool_ca> is not a call <tool",
      content: "a < b and <tool_ca> is not a call <tool",
      calls: [],
    },
    {
      name: "a <tool_call> without a JSON object is content",
      text: "x <tool_call> not json </tool_call> y",
      content: "x <tool_call> not json </tool_call> y",
      calls: [],
    },
    {
      name: "cut off inside the arguments: the call keeps what was written",
      text: '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
      content: "",
      calls: [{ name: "get_weather", arguments: '{"city": "Par' }],
    },
    {
      name: "cut off before the name is complete: content",
      text: 'ok <tool_call>{"name": "get_w',
      content: 'ok <tool_call>{"name": "get_w',
      calls: [],
    },
    {
      name: "arguments as a JSON string, unicode, text after the call",
      text: '<tool_call>{"name": "é", "arguments": "{\\"q\\": \\"☃\\"}"}</tool_call> done',
      content: "done",
      calls: [{ name: "é", arguments: '{"q": "☃"}' }],
    },
  ],
  llama3_json: [
    {
      name: "one call",
      text: '{"name": "get_weather", "parameters": {"city": "Paris"}}',
      content: "",
      calls: [{ name: "get_weather", arguments: '{"city": "Paris"}' }],
    },
    {
      name: "python tag and two calls separated by ;",
      text: '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": [1, 2], "y": "a;b"}}',
      content: "",
      calls: [
        { name: "a", arguments: "{}" },
        { name: "b", arguments: '{"x": [1, 2], "y": "a;b"}' },
      ],
    },
    {
      name: "an answer that does not start with an object is content",
      text: "  The weather is {nice} today.",
      content: "  The weather is {nice} today.",
      calls: [],
    },
    {
      name: "an object without a name is content",
      text: '{"temperature": 21}',
      content: '{"temperature": 21}',
      calls: [],
    },
    {
      name: "numbers and literals as values of other keys",
      text: '{"confidence": 0.9, "name": "f", "ok": true, "parameters": {"n": -1e3}} trailing',
      content: "trailing",
      calls: [{ name: "f", arguments: '{"n": -1e3}' }],
    },
  ],
  mistral: [
    {
      name: "JSON list of calls (tokenizer v3)",
      text: '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
      content: "",
      calls: [
        { name: "get_weather", arguments: '{"city": "Paris"}' },
        { name: "get_time", arguments: "{}" },
      ],
    },
    {
      name: "name[ARGS] calls (tokenizer v11), one with its own [CALL_ID]",
      text: 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": [1, 2]}[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{}',
      content: "Sure.",
      calls: [
        { name: "get_weather", arguments: '{"city": "Paris", "days": [1, 2]}' },
        { name: "get_time", arguments: "{}" },
      ],
    },
    {
      name: "a bad name after [TOOL_CALLS] is content",
      text: "[TOOL_CALLS]bad name[ARGS]{}",
      content: "[TOOL_CALLS]bad name[ARGS]{}",
      calls: [],
    },
  ],
  qwen3_coder: [
    {
      name: "one call, values typed by the schema",
      tools: [WEATHER],
      text:
        "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=days>\n3\n</parameter>\n" +
        '<parameter=metric>\nTrue\n</parameter>\n<parameter=where>\n{"lat": 1.5}\n</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n</tool_call>',
      content: "I'll look it up.\n",
      calls: [{ name: "get_weather", arguments: '{"city": "San Francisco", "days": 3, "metric": true, "where": {"lat":1.5}, "note": "42"}' }],
    },
    {
      name: "two calls, a missing </parameter>, a call without parameters, no <tool_call>",
      tools: [WEATHER],
      text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=ratio>\n0.5\n</function>\n</tool_call>\n<function=ping>\n</function>",
      content: "",
      calls: [
        { name: "get_weather", arguments: '{"city": "Oslo", "ratio": 0.5}' },
        { name: "ping", arguments: "{}" },
      ],
    },
    {
      name: "a <tool_call> that does not open a function is content",
      text: "<tool_call>\nhello</tool_call>",
      content: "<tool_call>\nhello</tool_call>",
      calls: [],
    },
  ],
};

function normalizeArgs(text: string): string {
  return JSON.stringify(JSON.parse(text));
}

for (const [parserName, cases] of Object.entries(CASES) as [ToolCallParserName, Case[]][]) {
  describe(`${parserName} tool-call parser`, () => {
    for (const c of cases) {
      test(c.name, () => {
        const whole = parse(parserName, [c.text], c.tools ?? []);
        assert.equal(whole.content, c.content);
        assert.deepEqual(
          whole.calls.map((call) => call.name),
          c.calls.map((call) => call.name),
        );
        whole.calls.forEach((call, i) => {
          const expected = c.calls[i]?.arguments as string;
          // JSON parsers pass the model's own text through; qwen3_coder writes JSON itself.
          if (parserName === "qwen3_coder") assert.equal(normalizeArgs(call.arguments), normalizeArgs(expected));
          else assert.equal(call.arguments, expected);
        });
        assertStreamShape(whole.deltas);
        for (const id of whole.ids) assert.match(id, parserName === "mistral" ? /^[A-Za-z0-9]{9}$/ : /^call_[A-Za-z0-9]{24}$/);
      });
    }

    test("any split of each output gives the same content and calls, streamed in OpenAI's shape", () => {
      fc.assert(
        fc.property(fc.constantFrom(...cases), fc.array(fc.nat(), { maxLength: 16 }), (c, offsets) => {
          const whole = parse(parserName, [c.text], c.tools ?? []);
          const pieces = parse(parserName, cut(c.text, offsets), c.tools ?? []);
          assert.equal(pieces.content, whole.content);
          assert.deepEqual(pieces.calls, whole.calls);
          assertStreamShape(pieces.deltas);
        }),
        { numRuns: 300 },
      );
    });

    test("one character at a time", () => {
      for (const c of cases) {
        const whole = parse(parserName, [c.text], c.tools ?? []);
        const chars = parse(parserName, [...c.text], c.tools ?? []);
        assert.equal(chars.content, whole.content, c.name);
        assert.deepEqual(chars.calls, whole.calls, c.name);
      }
    });
  });
}

describe("tool-call parsers on random text", () => {
  test("splitting never changes the result, whatever the text", () => {
    const fragment = fc.constantFrom(
      "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<function=f>", "<parameter=x>", "</parameter>", "</function>",
      '{"name": "f", "arguments": ', '{"a": [1, "}"]}', "}", "{", '"', "\\", ";", ",", "]", "[", " ", "\n", "x", "é",
    );
    fc.assert(
      fc.property(
        fc.constantFrom<ToolCallParserName>("hermes", "llama3_json", "mistral", "qwen3_coder"),
        fc.array(fragment, { maxLength: 14 }),
        fc.array(fc.nat(), { maxLength: 10 }),
        (name, fragments, offsets) => {
          const text = fragments.join("");
          const whole = parse(name, [text]);
          const pieces = parse(name, cut(text, offsets));
          assert.equal(pieces.content, whole.content);
          assert.deepEqual(pieces.calls, whole.calls);
          assertStreamShape(pieces.deltas);
        },
      ),
      { numRuns: 2000 },
    );
  });

  test("parallel_tool_calls false keeps only the first call", () => {
    const text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>';
    const parsed = parse("hermes", [text], [], false);
    assert.deepEqual(parsed.calls, [{ name: "a", arguments: "{}" }]);
    assert.equal(parsed.content, "");
  });
});

describe("qwen3_coder parameter types", () => {
  test("values follow the schema's type, and stay text when they do not fit it", () => {
    assert.equal(convertParameter("\n12\n", { type: "integer" }), 12);
    assert.equal(convertParameter("12.5", { type: "integer" }), "12.5");
    assert.equal(convertParameter("12.5", { type: ["null", "number"] }), 12.5);
    assert.equal(convertParameter("FALSE", { type: "boolean" }), false);
    assert.deepEqual(convertParameter('["a"]', { type: "array" }), ["a"]);
    assert.equal(convertParameter("{not json}", { type: "object" }), "{not json}");
    assert.equal(convertParameter("null", { type: "null" }), null);
    assert.equal(convertParameter("\n  spaced  \n", { type: "string" }), "  spaced  ");
    assert.equal(convertParameter("7", undefined), "7");
  });
});
