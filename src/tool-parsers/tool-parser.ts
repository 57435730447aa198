// Tool-call parsers (--tool-call-parser, with --enable-auto-tool-choice): with
// tool_choice "auto" the model writes calls in its own format inside its
// answer; a parser turns that text into content and OpenAI tool-call deltas.
//
// Every parser is a streaming state machine fed the answer's text in pieces
// (one per engine step) and once at the end (finish). Its decisions depend
// only on the text seen so far, so any split of the same text gives the same
// content and calls; text that may still turn into a call marker is held back.
// A call is shown once its name is known; until then its text is held, and
// if it turns out not to be a call it is released as content. Arguments are
// streamed as the model writes them (qwen3_coder: one parameter at a time,
// since each value's JSON type comes from the function's schema).

import type { ToolCallEmitter, ToolFunction } from "./tool-call.js";
import { HermesToolParser } from "./hermes.js";
import { Llama3JsonToolParser } from "./llama3-json.js";
import { MistralToolParser } from "./mistral.js";
import { Qwen3CoderToolParser } from "./qwen3-coder.js";
import type { ToolCallParser } from "./streaming-parser.js";

export type { ToolCallParser } from "./streaming-parser.js";

export const TOOL_CALL_PARSERS = ["hermes", "llama3_json", "mistral", "qwen3_coder"] as const;
export type ToolCallParserName = (typeof TOOL_CALL_PARSERS)[number];

/** The id style a parser's calls get (Mistral's templates accept only 9-character ids). */
export function toolCallIdStyle(name: ToolCallParserName): "openai" | "mistral" {
  return name === "mistral" ? "mistral" : "openai";
}

export function createToolCallParser(name: ToolCallParserName, emitter: ToolCallEmitter, tools: readonly ToolFunction[]): ToolCallParser {
  switch (name) {
    case "hermes":
      return new HermesToolParser(emitter);
    case "llama3_json":
      return new Llama3JsonToolParser(emitter);
    case "mistral":
      return new MistralToolParser(emitter);
    case "qwen3_coder":
      return new Qwen3CoderToolParser(emitter, tools);
  }
}
