// The body of POST /v1/responses, checked: top-level fields with zod (the
// chat routes' error style: every error names its parameter), input items one
// by one (an unknown item or content type is a 400 naming it, as OpenAI's),
// function tools, tool_choice and text.format in the Responses shape. Input
// items come out normalized to what a stored conversation holds (content as a
// list of parts, every item with an id), so a request's input and a stored
// response's output continue a conversation alike. Sampling, tools and
// structured output are checked again, with the chat route's own rules, when
// the request becomes a chat request (chat-request.ts).

import { z } from "zod";
import { badRequest } from "../openai-error.js";
import { parseWith, unknownKeys } from "../request-validation.js";
import {
  newItemId,
  type ContentPart,
  type ConversationItem,
  type FunctionTool,
  type ItemStatus,
  type MessageRole,
  type TextFormat,
  type ToolChoiceParam,
} from "./items.js";

export interface ResponsesRequest {
  model: string | null;
  /** This request's input items, normalized (a string input is one user message). */
  input: ConversationItem[];
  instructions: string | null;
  previousResponseId: string | null;
  store: boolean;
  background: boolean;
  stream: boolean;
  metadata: Record<string, string>;
  user: string | null;
  tools: FunctionTool[];
  toolChoice: ToolChoiceParam;
  parallelToolCalls: boolean;
  text: { format: TextFormat; verbosity?: string };
  reasoning: { effort: string | null; summary: string | null };
  maxOutputTokens: number | null;
  maxToolCalls: number | null;
  temperature: number | null;
  topP: number | null;
  serviceTier: string | null;
  /** Top-level body fields this endpoint does not know (ignored, logged once). */
  ignoredFields: string[];
}

const opt = <T extends z.ZodTypeAny>(schema: T) => schema.nullish();

/** OpenAI's metadata limits: 16 pairs, keys up to 64 characters, values up to 512. */
const MAX_METADATA_PAIRS = 16;

const responsesSchema = z.object({
  model: opt(z.string()),
  input: z.unknown(),
  instructions: opt(z.string()),
  previous_response_id: opt(z.string().min(1, "a non-empty string")),
  store: opt(z.boolean()),
  background: opt(z.boolean()),
  stream: opt(z.boolean()),
  stream_options: opt(z.object({ include_obfuscation: opt(z.boolean()) })),
  metadata: opt(z.record(z.string().max(512, "a string of at most 512 characters"))),
  user: opt(z.string()),
  safety_identifier: opt(z.string()),
  prompt_cache_key: opt(z.string()),
  prompt_cache_retention: opt(z.string()),
  service_tier: opt(z.string()),
  tools: opt(z.array(z.unknown())),
  tool_choice: z.unknown(),
  parallel_tool_calls: opt(z.boolean()),
  // Counts calls of built-in tools (OpenAI's), which Baton has none of: echoed only.
  max_tool_calls: opt(z.number().int().min(1, "at least 1")),
  text: opt(z.object({ format: opt(z.object({ type: z.string() }).passthrough()), verbosity: opt(z.string()) })),
  reasoning: opt(z.object({ effort: opt(z.string()), summary: opt(z.string()), generate_summary: opt(z.string()) })),
  max_output_tokens: opt(z.number().int().min(1, "at least 1")),
  temperature: opt(z.number().min(0, "in [0, 2]").max(2, "in [0, 2]")),
  top_p: opt(z.number().gt(0, "in (0, 1]").max(1, "in (0, 1]")),
  top_logprobs: opt(z.number().int().min(0, "in [0, 20]").max(20, "in [0, 20]")),
  truncation: opt(z.string()),
  include: opt(z.array(z.string())),
  conversation: z.unknown(),
  prompt: z.unknown(),
});

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function str(value: unknown, param: string, { nonEmpty = false } = {}): string {
  if (typeof value !== "string") throw badRequest(`${param} must be a string`, param);
  if (nonEmpty && value === "") throw badRequest(`${param} must not be empty`, param);
  return value;
}

const ROLES: readonly MessageRole[] = ["user", "assistant", "system", "developer"];
const ITEM_TYPES = ["message", "function_call", "function_call_output", "reasoning"];

function status(value: unknown, param: string): ItemStatus {
  if (value == null) return "completed";
  if (value === "completed" || value === "incomplete" || value === "in_progress") return value;
  throw badRequest(`${param}.status must be "completed", "incomplete" or "in_progress"`, `${param}.status`);
}

function contentPart(raw: unknown, param: string): ContentPart {
  if (!isObject(raw)) throw badRequest(`${param} must be a content part object`, param);
  switch (raw.type) {
    case "input_text":
      return { type: "input_text", text: str(raw.text, `${param}.text`) };
    case "output_text":
      return { type: "output_text", text: str(raw.text, `${param}.text`), annotations: Array.isArray(raw.annotations) ? raw.annotations : [], logprobs: [] };
    case "refusal":
      return { type: "refusal", refusal: str(raw.refusal, `${param}.refusal`) };
    case "input_image": {
      if (raw.image_url == null) {
        const why = raw.file_id != null ? "file_id images are not supported (this server keeps no files); give image_url" : "image_url is required";
        throw badRequest(`${param}: ${why}`, `${param}.image_url`);
      }
      const detail = raw.detail == null ? "auto" : str(raw.detail, `${param}.detail`);
      return { type: "input_image", image_url: str(raw.image_url, `${param}.image_url`, { nonEmpty: true }), detail };
    }
    case "input_file":
      throw badRequest(`${param}: input_file parts are not supported (only input_text and input_image)`, `${param}.type`);
    default:
      throw badRequest(`${param}.type: unknown content part type ${JSON.stringify(raw.type ?? null)} (expected input_text, input_image or output_text)`, `${param}.type`);
  }
}

function messageItem(raw: Record<string, unknown>, param: string): ConversationItem {
  const role = raw.role;
  if (typeof role !== "string" || !(ROLES as readonly string[]).includes(role)) {
    throw badRequest(`${param}.role must be one of ${ROLES.join(", ")}, got ${JSON.stringify(role ?? null)}`, `${param}.role`);
  }
  const textType = role === "assistant" ? "output_text" : "input_text";
  let content: ContentPart[];
  if (typeof raw.content === "string") {
    content = [textType === "output_text" ? { type: "output_text", text: raw.content, annotations: [], logprobs: [] } : { type: "input_text", text: raw.content }];
  } else if (Array.isArray(raw.content)) {
    content = raw.content.map((part, i) => contentPart(part, `${param}.content[${i}]`));
  } else {
    throw badRequest(`${param}.content must be a string or a list of content parts`, `${param}.content`);
  }
  const id = raw.id == null ? newItemId("msg") : str(raw.id, `${param}.id`);
  return { id, type: "message", role: role as MessageRole, status: status(raw.status, param), content };
}

/** A function_call_output's output: a string, or text parts (joined as chat joins them). */
function callOutput(value: unknown, param: string): string {
  if (typeof value === "string") return value;
  if (!Array.isArray(value)) throw badRequest(`${param} must be a string or a list of input_text parts`, param);
  return value
    .map((part, i) => {
      const where = `${param}[${i}]`;
      if (!isObject(part) || part.type !== "input_text") throw badRequest(`${where}: only input_text parts are supported in a function call's output`, where);
      return str(part.text, `${where}.text`);
    })
    .join("\n");
}

function textList<T extends "summary_text" | "reasoning_text">(value: unknown, param: string, type: T): { type: T; text: string }[] {
  if (value == null) return [];
  if (!Array.isArray(value)) throw badRequest(`${param} must be a list`, param);
  return value.map((part, i) => {
    const where = `${param}[${i}]`;
    if (!isObject(part) || part.type !== type) throw badRequest(`${where} must be a ${type} part`, where);
    return { type, text: str(part.text, `${where}.text`) };
  });
}

/** One input item, normalized; param is where it sits ("input[3]"). */
function parseInputItem(raw: unknown, param: string): ConversationItem {
  if (!isObject(raw)) throw badRequest(`${param} must be an object (an input item)`, param);
  // An "easy" message ({role, content}) may leave out its type.
  const type = raw.type ?? (raw.role !== undefined ? "message" : undefined);
  switch (type) {
    case "message":
      return messageItem(raw, param);
    case "function_call":
      return {
        id: raw.id == null ? newItemId("fc") : str(raw.id, `${param}.id`),
        type: "function_call",
        status: status(raw.status, param),
        call_id: str(raw.call_id, `${param}.call_id`, { nonEmpty: true }),
        name: str(raw.name, `${param}.name`, { nonEmpty: true }),
        arguments: str(raw.arguments, `${param}.arguments`),
      };
    case "function_call_output":
      return {
        id: raw.id == null ? newItemId("fco") : str(raw.id, `${param}.id`),
        type: "function_call_output",
        status: status(raw.status, param),
        call_id: str(raw.call_id, `${param}.call_id`, { nonEmpty: true }),
        output: callOutput(raw.output, `${param}.output`),
      };
    case "reasoning":
      return {
        id: raw.id == null ? newItemId("rs") : str(raw.id, `${param}.id`),
        type: "reasoning",
        status: status(raw.status, param),
        summary: textList(raw.summary, `${param}.summary`, "summary_text"),
        content: textList(raw.content, `${param}.content`, "reasoning_text"),
      };
    case undefined:
      throw badRequest(`${param}.type is required`, `${param}.type`);
    default:
      throw badRequest(`${param}.type: unsupported input item type ${JSON.stringify(type)} (supported: ${ITEM_TYPES.join(", ")})`, `${param}.type`);
  }
}

function parseInput(input: unknown): ConversationItem[] {
  if (input === undefined || input === null) throw badRequest("input is required", "input");
  if (typeof input === "string") return [{ id: newItemId("msg"), type: "message", role: "user", status: "completed", content: [{ type: "input_text", text: input }] }];
  if (!Array.isArray(input)) throw badRequest("input must be a string or a list of input items", "input");
  return input.map((item, i) => parseInputItem(item, `input[${i}]`));
}

function parseTool(raw: unknown, i: number): FunctionTool {
  const where = `tools[${i}]`;
  if (!isObject(raw)) throw badRequest(`${where} must be an object`, where);
  if (raw.type !== "function") {
    throw badRequest(`${where}.type: tool type ${JSON.stringify(raw.type ?? null)} is not supported (only "function" tools)`, `${where}.type`);
  }
  // The name, description, parameters and strict are checked by the chat route's rules (tool-request.ts).
  return {
    type: "function",
    name: raw.name as string,
    description: (raw.description ?? null) as string | null,
    parameters: (raw.parameters ?? null) as Record<string, unknown> | null,
    strict: (raw.strict ?? null) as boolean | null,
  };
}

function parseToolChoice(raw: unknown, tools: readonly FunctionTool[]): ToolChoiceParam {
  if (raw == null) return tools.length > 0 ? "auto" : "none";
  if (raw === "auto" || raw === "none" || raw === "required") return raw;
  if (isObject(raw) && raw.type === "function") return { type: "function", name: str(raw.name, "tool_choice.name", { nonEmpty: true }) };
  throw badRequest('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}', "tool_choice");
}

function parseTextFormat(format: ({ type: string } & Record<string, unknown>) | null | undefined): TextFormat {
  if (format == null || format.type === "text") return { type: "text" };
  if (format.type === "json_object") return { type: "json_object" };
  if (format.type !== "json_schema") {
    throw badRequest(`text.format.type ${JSON.stringify(format.type)} is not supported (text, json_object, json_schema)`, "text.format.type");
  }
  if (!isObject(format.schema)) throw badRequest("text.format.schema is required (a JSON schema object)", "text.format.schema");
  const name = format.name == null ? "response" : str(format.name, "text.format.name");
  if (format.strict != null && typeof format.strict !== "boolean") throw badRequest("text.format.strict must be a boolean", "text.format.strict");
  const out: TextFormat = { type: "json_schema", name, schema: format.schema, strict: (format.strict ?? null) as boolean | null };
  if (typeof format.description === "string") out.description = format.description;
  return out;
}

function parseMetadata(metadata: Record<string, string> | null | undefined): Record<string, string> {
  if (metadata == null) return {};
  const keys = Object.keys(metadata);
  if (keys.length > MAX_METADATA_PAIRS) throw badRequest(`metadata holds at most ${MAX_METADATA_PAIRS} pairs, got ${keys.length}`, "metadata");
  for (const key of keys) if (key.length > 64) throw badRequest(`metadata keys are at most 64 characters, got ${JSON.stringify(key.slice(0, 70))}...`, `metadata.${key}`);
  return metadata;
}

export function parseResponsesRequest(raw: unknown): ResponsesRequest {
  const body = parseWith(responsesSchema, raw);
  // What would change the output and is not implemented is refused by name.
  if (body.conversation != null) throw badRequest("conversation is not supported (this server has no Conversations API); use previous_response_id", "conversation");
  if (body.prompt != null) throw badRequest("prompt templates are not supported; give input and instructions", "prompt");
  if (body.truncation != null && body.truncation !== "disabled") throw badRequest(`truncation ${JSON.stringify(body.truncation)} is not supported (only "disabled")`, "truncation");
  if ((body.top_logprobs ?? 0) > 0) throw badRequest("top_logprobs is not supported on /v1/responses", "top_logprobs");
  if (body.include?.includes("message.output_text.logprobs")) throw badRequest('include "message.output_text.logprobs" is not supported', "include");
  const tools = (body.tools ?? []).map(parseTool);
  const store = body.store ?? true;
  const background = body.background ?? false;
  if (background && !store) throw badRequest("background responses must be stored: background requires store to be true", "background");
  return {
    model: body.model ?? null,
    input: parseInput(body.input),
    instructions: body.instructions ?? null,
    previousResponseId: body.previous_response_id ?? null,
    store,
    background,
    stream: body.stream ?? false,
    metadata: parseMetadata(body.metadata),
    user: body.user ?? null,
    tools,
    toolChoice: parseToolChoice(body.tool_choice, tools),
    parallelToolCalls: body.parallel_tool_calls ?? true,
    text: { format: parseTextFormat(body.text?.format), ...(body.text?.verbosity != null ? { verbosity: body.text.verbosity } : {}) },
    reasoning: { effort: body.reasoning?.effort ?? null, summary: body.reasoning?.summary ?? body.reasoning?.generate_summary ?? null },
    maxOutputTokens: body.max_output_tokens ?? null,
    maxToolCalls: body.max_tool_calls ?? null,
    temperature: body.temperature ?? null,
    topP: body.top_p ?? null,
    serviceTier: body.service_tier ?? null,
    ignoredFields: unknownKeys(responsesSchema, raw),
  };
}
