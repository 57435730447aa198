// The objects of OpenAI's Responses API as Baton writes them: conversation
// items (what a request's input holds and what a response outputs; a stored
// response's output becomes the next request's input as it is) and the
// response object itself. The shapes follow the `openai` clients' types
// (ResponseOutputMessage, ResponseFunctionToolCall, ResponseReasoningItem,
// Response), so both clients parse them.

import { randomBytes } from "node:crypto";

export type ItemStatus = "in_progress" | "completed" | "incomplete";

interface InputText {
  type: "input_text";
  text: string;
}

export interface OutputText {
  type: "output_text";
  text: string;
  annotations: unknown[];
  logprobs: unknown[];
}

interface InputImage {
  type: "input_image";
  image_url: string;
  detail: string;
}

interface Refusal {
  type: "refusal";
  refusal: string;
}

export type ContentPart = InputText | OutputText | InputImage | Refusal;

export type MessageRole = "user" | "system" | "developer" | "assistant";

interface MessageItem {
  id: string;
  type: "message";
  role: MessageRole;
  status: ItemStatus;
  content: ContentPart[];
}

export interface FunctionCallItem {
  id: string;
  type: "function_call";
  status: ItemStatus;
  call_id: string;
  name: string;
  arguments: string;
}

interface FunctionCallOutputItem {
  id: string;
  type: "function_call_output";
  status: ItemStatus;
  call_id: string;
  output: string;
}

export interface ReasoningText {
  type: "reasoning_text";
  text: string;
}

export interface ReasoningItem {
  id: string;
  type: "reasoning";
  status: ItemStatus;
  summary: { type: "summary_text"; text: string }[];
  content: ReasoningText[];
}

/** One item of a conversation, as stored (every item has an id). */
export type ConversationItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem;

/** What a response's output holds. */
export type OutputItem = (MessageItem & { role: "assistant" }) | FunctionCallItem | ReasoningItem;

type ResponseStatus = "completed" | "failed" | "in_progress" | "cancelled" | "queued" | "incomplete";

interface ResponseUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

/** A function tool in the Responses shape (flat, not chat's {type, function}). */
export interface FunctionTool {
  type: "function";
  name: string;
  description: string | null;
  parameters: Record<string, unknown> | null;
  strict: boolean | null;
}

export type ToolChoiceParam = "auto" | "none" | "required" | { type: "function"; name: string };

export type TextFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; name: string; schema: Record<string, unknown>; strict: boolean | null; description?: string };

export interface ResponseObject {
  id: string;
  object: "response";
  created_at: number;
  status: ResponseStatus;
  background: boolean;
  error: { code: string; message: string } | null;
  incomplete_details: { reason: "max_output_tokens" } | null;
  instructions: string | null;
  max_output_tokens: number | null;
  max_tool_calls: number | null;
  metadata: Record<string, string>;
  model: string;
  output: OutputItem[];
  parallel_tool_calls: boolean;
  previous_response_id: string | null;
  reasoning: { effort: string | null; summary: string | null };
  service_tier: string;
  store: boolean;
  temperature: number;
  text: { format: TextFormat; verbosity?: string };
  tool_choice: ToolChoiceParam;
  tools: FunctionTool[];
  top_logprobs: number;
  top_p: number;
  truncation: "disabled";
  usage: ResponseUsage | null;
  user: string | null;
  completed_at: number | null;
}

/** OpenAI's ids: a type prefix and random hex ("resp_...", "msg_...", "fc_...", "rs_..."). */
export function newItemId(prefix: "resp" | "msg" | "fc" | "fco" | "rs"): string {
  return `${prefix}_${randomBytes(24).toString("hex")}`;
}
