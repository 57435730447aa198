// A Responses request as the chat request the chat route would have built
// from the same conversation: the body is translated to chat's fields
// (messages, tools as {type, function}, tool_choice, response_format from
// text.format, max_completion_tokens from max_output_tokens, temperature,
// top_p, parallel_tool_calls, user) and checked by parseChatRequest, so both
// routes share one set of rules. An error raised on the chat side names the
// chat parameter; it is renamed to the Responses one before the client sees it.

import { ApiError } from "../openai-error.js";
import { parseChatRequest, type ChatRequest } from "../request-validation.js";
import type { FunctionTool, TextFormat, ToolChoiceParam } from "./items.js";
import type { ConversationMessages } from "./input-messages.js";
import type { ResponsesRequest } from "./request.js";

type ValidationLimits = Parameters<typeof parseChatRequest>[1];

function chatTool(tool: FunctionTool): Record<string, unknown> {
  const fn: Record<string, unknown> = { name: tool.name };
  if (tool.description !== null) fn.description = tool.description;
  if (tool.parameters !== null) fn.parameters = tool.parameters;
  if (tool.strict !== null) fn.strict = tool.strict;
  return { type: "function", function: fn };
}

function chatToolChoice(choice: ToolChoiceParam): unknown {
  return typeof choice === "string" ? choice : { type: "function", function: { name: choice.name } };
}

function responseFormat(format: TextFormat): Record<string, unknown> | null {
  switch (format.type) {
    case "text":
      return null;
    case "json_object":
      return { type: "json_object" };
    case "json_schema":
      return { type: "json_schema", json_schema: { name: format.name, schema: format.schema, ...(format.strict === null ? {} : { strict: format.strict }) } };
  }
}

export function toChatRequest(req: ResponsesRequest, conversation: ConversationMessages, limits: ValidationLimits): ChatRequest {
  const body: Record<string, unknown> = {
    messages: conversation.messages,
    tool_choice: chatToolChoice(req.toolChoice),
    parallel_tool_calls: req.parallelToolCalls,
    max_completion_tokens: req.maxOutputTokens,
    temperature: req.temperature,
    top_p: req.topP,
    user: req.user,
    response_format: responseFormat(req.text.format),
  };
  if (req.tools.length > 0) body.tools = req.tools.map(chatTool);
  try {
    return parseChatRequest(body, limits);
  } catch (error) {
    throw responsesError(error, conversation.origins);
  }
}

/** Chat parameter names and the Responses ones they stand for, most specific first. */
const RENAMES: [RegExp, (origins: readonly string[], ...groups: string[]) => string][] = [
  [/messages\[(\d+)\]/g, (origins, k) => origins[Number(k)] ?? "input"],
  [/\bmessages\b/g, () => "input"],
  [/response_format\.json_schema\b/g, () => "text.format"],
  [/response_format\b/g, () => "text.format"],
  [/max_completion_tokens\b/g, () => "max_output_tokens"],
  [/tools\[(\d+)\]\.function\b/g, (_origins, i) => `tools[${i}]`],
  [/tool_choice\.function\b/g, () => "tool_choice"],
];

function rename(text: string, origins: readonly string[]): string {
  let out = text;
  for (const [pattern, to] of RENAMES) out = out.replace(pattern, (_match, ...groups: unknown[]) => to(origins, ...groups.filter((g): g is string => typeof g === "string")));
  return out;
}

/**
 * An error from the chat side in the Responses API's words: its parameter
 * (and the mentions of it in the message) renamed. origins[k] is where chat
 * message k came from. Anything else passes unchanged.
 */
export function responsesError(error: unknown, origins: readonly string[]): unknown {
  if (!(error instanceof ApiError)) return error;
  return new ApiError(error.status, rename(error.message, origins), error.type, error.param === null ? null : rename(error.param, origins), error.code);
}
