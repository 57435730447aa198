// The tool fields of a chat request: `tools` (functions the model may call),
// `tool_choice` ("none" | "auto" | "required" | {"type": "function",
// "function": {"name": ...}}) and `parallel_tool_calls`, checked the way
// OpenAI and vLLM check them; and the conversation's earlier tool calls made
// ready for the chat template.

import type { TemplateMessage } from "../text/chat-template.js";
import type { ToolFunction } from "../tool-parsers/tool-call.js";
import { badRequest } from "./openai-error.js";

export type ToolChoice = { kind: "none" } | { kind: "auto" } | { kind: "required" } | { kind: "named"; name: string };

export interface ToolRequest {
  /** The functions offered, in request order. */
  functions: ToolFunction[];
  /** `tools` as the request gave them ({type, function}), for the chat template. */
  templateTools: Record<string, unknown>[];
  toolChoice: ToolChoice;
  /** false: at most one call. */
  parallelToolCalls: boolean;
}

/** OpenAI's rule for function names. */
const FUNCTION_NAME = /^[A-Za-z0-9_-]{1,64}$/;

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function parseTool(tool: unknown, i: number): { fn: ToolFunction; template: Record<string, unknown> } {
  const where = `tools[${i}]`;
  if (!isObject(tool)) throw badRequest(`${where} must be an object`, where);
  if (tool.type !== "function") throw badRequest(`${where}.type must be "function", got ${JSON.stringify(tool.type ?? null)}`, `${where}.type`);
  const fn = tool.function;
  if (!isObject(fn)) throw badRequest(`${where}.function must be an object`, `${where}.function`);
  if (typeof fn.name !== "string" || !FUNCTION_NAME.test(fn.name)) {
    throw badRequest(`${where}.function.name must be 1 to 64 letters, digits, underscores or dashes`, `${where}.function.name`);
  }
  if (fn.description != null && typeof fn.description !== "string") throw badRequest(`${where}.function.description must be a string`, `${where}.function.description`);
  if (fn.parameters != null && !isObject(fn.parameters)) {
    throw badRequest(`${where}.function.parameters must be a JSON schema object`, `${where}.function.parameters`);
  }
  if (fn.strict != null && typeof fn.strict !== "boolean") throw badRequest(`${where}.function.strict must be a boolean`, `${where}.function.strict`);
  const parsed: ToolFunction = { name: fn.name };
  if (typeof fn.description === "string") parsed.description = fn.description;
  if (isObject(fn.parameters)) parsed.parameters = fn.parameters;
  if (typeof fn.strict === "boolean") parsed.strict = fn.strict;
  return { fn: parsed, template: tool };
}

function parseToolChoice(raw: unknown, functions: readonly ToolFunction[]): ToolChoice {
  if (raw === undefined || raw === null) return functions.length > 0 ? { kind: "auto" } : { kind: "none" };
  if (raw === "none" || raw === "auto" || raw === "required") {
    if (raw !== "none" && functions.length === 0) throw badRequest(`tool_choice ${JSON.stringify(raw)} needs tools`, "tool_choice");
    return { kind: raw };
  }
  if (typeof raw === "string") throw badRequest(`tool_choice must be "none", "auto", "required" or a named function, got ${JSON.stringify(raw)}`, "tool_choice");
  if (!isObject(raw) || raw.type !== "function" || !isObject(raw.function) || typeof raw.function.name !== "string") {
    throw badRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice");
  }
  const name = raw.function.name;
  if (!functions.some((f) => f.name === name)) {
    const offered = functions.map((f) => f.name).join(", ");
    throw badRequest(`tool_choice names function ${JSON.stringify(name)}, which is not among tools (${offered || "none given"})`, "tool_choice.function.name");
  }
  return { kind: "named", name };
}

export function parseToolRequest(body: { tools?: unknown[] | null; tool_choice?: unknown; parallel_tool_calls?: boolean | null }): ToolRequest {
  const functions: ToolFunction[] = [];
  const templateTools: Record<string, unknown>[] = [];
  (body.tools ?? []).forEach((tool, i) => {
    const { fn, template } = parseTool(tool, i);
    if (functions.some((f) => f.name === fn.name)) throw badRequest(`tools[${i}]: function ${JSON.stringify(fn.name)} is given twice`, `tools[${i}].function.name`);
    functions.push(fn);
    templateTools.push(template);
  });
  return {
    functions,
    templateTools,
    toolChoice: parseToolChoice(body.tool_choice, functions),
    parallelToolCalls: body.parallel_tool_calls ?? true,
  };
}

/**
 * Chat templates expect an earlier call's arguments as an object (they
 * render it with tojson), while OpenAI clients send the JSON text: the text
 * is parsed where it holds an object (vLLM does the same). Messages are
 * copied, never changed in place.
 */
export function withParsedToolArguments(messages: readonly TemplateMessage[]): TemplateMessage[] {
  return messages.map((message) => {
    const calls = message.tool_calls;
    if (message.role !== "assistant" || !Array.isArray(calls)) return message;
    return {
      ...message,
      tool_calls: calls.map((call: unknown) => {
        if (!isObject(call) || !isObject(call.function) || typeof call.function.arguments !== "string") return call;
        try {
          const parsed: unknown = JSON.parse(call.function.arguments);
          return isObject(parsed) ? { ...call, function: { ...call.function, arguments: parsed } } : call;
        } catch {
          return call;
        }
      }),
    };
  });
}
