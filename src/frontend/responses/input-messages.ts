// A Responses conversation as chat messages, the form the chat template
// renders: instructions as a system message first; message items as messages
// (text parts as chat text parts, input_image as image_url parts, developer as
// system since chat templates rarely know "developer"); function_call items as
// tool_calls of one assistant message (joined to the assistant message right
// before them, as a chat assistant turn holds both); function_call_output
// items as tool messages; a reasoning item's text as the reasoning_content of
// the assistant turn that follows it (templates that show past reasoning read
// it there). A function_call_output must answer a function_call earlier in the
// conversation, as OpenAI requires.
//
// Each message remembers where it came from (an input item's param,
// "instructions", or "previous_response_id" for stored history), so an error
// the chat route raises about a message names the Responses parameter.

import { badRequest } from "../openai-error.js";
import type { ContentPart, ConversationItem } from "./items.js";

interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string | ChatPart[];
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
  reasoning_content?: string;
}

type ChatPart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string } };

/** A conversation item and the request parameter it came from. */
export interface PlacedItem {
  item: ConversationItem;
  param: string;
}

export interface ConversationMessages {
  messages: ChatMessage[];
  /** origins[k]: the parameter message k came from. */
  origins: string[];
}

function chatPart(part: ContentPart): ChatPart {
  switch (part.type) {
    case "input_text":
    case "output_text":
      return { type: "text", text: part.text };
    case "refusal":
      return { type: "text", text: part.refusal };
    case "input_image":
      return { type: "image_url", image_url: { url: part.image_url } };
  }
}

/** Text-only content as one string (what most templates expect); with images, the parts. */
function chatContent(parts: readonly ContentPart[]): string | ChatPart[] {
  const converted = parts.map(chatPart);
  if (converted.every((p) => p.type === "text")) return converted.map((p) => (p as { text: string }).text).join("\n");
  return converted;
}

export function conversationMessages(instructions: string | null, items: readonly PlacedItem[]): ConversationMessages {
  const messages: ChatMessage[] = [];
  const origins: string[] = [];
  const calls = new Set<string>();
  let reasoning: string | null = null;
  const push = (message: ChatMessage, origin: string): void => {
    messages.push(message);
    origins.push(origin);
  };
  const assistant = (origin: string): ChatMessage => {
    const message: ChatMessage = { role: "assistant", content: "" };
    if (reasoning !== null) message.reasoning_content = reasoning;
    reasoning = null;
    push(message, origin);
    return message;
  };
  if (instructions !== null) push({ role: "system", content: instructions }, "instructions");
  for (const { item, param } of items) {
    switch (item.type) {
      case "message": {
        if (item.role === "assistant") {
          assistant(param).content = chatContent(item.content);
          break;
        }
        reasoning = null;
        push({ role: item.role === "developer" ? "system" : item.role, content: chatContent(item.content) }, param);
        break;
      }
      case "function_call": {
        const last = messages[messages.length - 1];
        // Calls join the assistant turn right before them; otherwise they open one.
        const turn = last?.role === "assistant" && reasoning === null ? last : assistant(param);
        (turn.tool_calls ??= []).push({ id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } });
        calls.add(item.call_id);
        break;
      }
      case "function_call_output": {
        if (!calls.has(item.call_id)) {
          throw badRequest(`No tool call found for function call output with call_id ${item.call_id}.`, `${param}.call_id`);
        }
        reasoning = null;
        push({ role: "tool", tool_call_id: item.call_id, content: item.output }, param);
        break;
      }
      case "reasoning": {
        const text = item.content.map((c) => c.text).join("") || item.summary.map((s) => s.text).join("\n");
        if (text !== "") reasoning = reasoning === null ? text : reasoning + text;
        break;
      }
    }
  }
  return { messages, origins };
}
