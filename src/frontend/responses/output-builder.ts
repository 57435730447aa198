// A response's output items built from its generated text as the chat
// machinery splits it (ChatPiece: reasoning, answer text, tool-call deltas),
// with the typed stream events that describe each step. One item is open at a
// time: a reasoning item (reasoning_text), a message (output_text) or a
// function_call (arguments); text of another kind closes it and opens the
// next. Each item goes: output_item.added, content_part.added (reasoning and
// messages), deltas, the part's and item's .done events. Collected and
// streamed responses are built the same way, so they hold the same items
// whatever the split of the text.

import type { ChatPiece } from "../chat-answer.js";
import type { ToolCallDelta } from "../../tool-parsers/tool-call.js";
import { newItemId, type FunctionCallItem, type ItemStatus, type OutputItem, type OutputText, type ReasoningItem, type ReasoningText } from "./items.js";

/** A stream event before its sequence_number is given. */
export type OutputEvent = { type: string } & Record<string, unknown>;

export interface EventSink {
  /** Whether anybody listens (a collected response skips building events). */
  readonly listening: boolean;
  event(event: OutputEvent): void;
}

type OpenItem =
  | { kind: "message"; index: number; item: OutputItem & { type: "message" }; part: OutputText }
  | { kind: "reasoning"; index: number; item: ReasoningItem; part: ReasoningText }
  | { kind: "function_call"; index: number; item: FunctionCallItem };

/** A copy for an event: later text must not change what an event said. */
function snapshot<T>(value: T): T {
  return structuredClone(value);
}

export class OutputBuilder {
  private open: OpenItem | null = null;
  /** Function-call items by the tool-call index of their deltas. */
  private readonly calls = new Map<number, { index: number; item: FunctionCallItem }>();

  constructor(
    /** The response's output list, filled in place. */
    readonly items: OutputItem[],
    private readonly sink: EventSink,
  ) {}

  push(piece: ChatPiece): void {
    if (piece.reasoning !== "") this.reasoning(piece.reasoning);
    if (piece.content !== "") this.text(piece.content);
    for (const call of piece.toolCalls) this.toolCall(call);
  }

  /** Ends the open item: "completed", or "incomplete" when the response was cut short. */
  close(status: ItemStatus): void {
    const open = this.open;
    if (open === null) return;
    this.open = null;
    const { index, item } = open;
    const base = { item_id: item.id, output_index: index };
    if (open.kind === "message") {
      this.send(() => ({ type: "response.output_text.done", ...base, content_index: 0, text: open.part.text, logprobs: [] }));
      this.send(() => ({ type: "response.content_part.done", ...base, content_index: 0, part: snapshot(open.part) }));
    } else if (open.kind === "reasoning") {
      this.send(() => ({ type: "response.reasoning_text.done", ...base, content_index: 0, text: open.part.text }));
      this.send(() => ({ type: "response.content_part.done", ...base, content_index: 0, part: snapshot(open.part) }));
    } else {
      this.send(() => ({ type: "response.function_call_arguments.done", ...base, name: open.item.name, arguments: open.item.arguments }));
    }
    item.status = status;
    this.send(() => ({ type: "response.output_item.done", output_index: index, item: snapshot(item) }));
  }

  private send(make: () => OutputEvent): void {
    if (this.sink.listening) this.sink.event(make());
  }

  private add(item: OutputItem): number {
    this.close("completed");
    const index = this.items.length;
    this.items.push(item);
    this.send(() => ({ type: "response.output_item.added", output_index: index, item: snapshot(item) }));
    return index;
  }

  private reasoning(text: string): void {
    let open = this.open;
    if (open?.kind !== "reasoning") {
      const item: ReasoningItem = { id: newItemId("rs"), type: "reasoning", status: "in_progress", summary: [], content: [] };
      const index = this.add(item);
      const part: ReasoningText = { type: "reasoning_text", text: "" };
      item.content.push(part);
      this.send(() => ({ type: "response.content_part.added", item_id: item.id, output_index: index, content_index: 0, part: snapshot(part) }));
      open = this.open = { kind: "reasoning", index, item, part };
    }
    open.part.text += text;
    const { item, index } = open;
    this.send(() => ({ type: "response.reasoning_text.delta", item_id: item.id, output_index: index, content_index: 0, delta: text }));
  }

  private text(text: string): void {
    let open = this.open;
    if (open?.kind !== "message") {
      const item: OutputItem & { type: "message" } = { id: newItemId("msg"), type: "message", role: "assistant", status: "in_progress", content: [] };
      const index = this.add(item);
      const part: OutputText = { type: "output_text", text: "", annotations: [], logprobs: [] };
      item.content.push(part);
      this.send(() => ({ type: "response.content_part.added", item_id: item.id, output_index: index, content_index: 0, part: snapshot(part) }));
      open = this.open = { kind: "message", index, item, part };
    }
    open.part.text += text;
    const { item, index } = open;
    this.send(() => ({ type: "response.output_text.delta", item_id: item.id, output_index: index, content_index: 0, delta: text, logprobs: [] }));
  }

  private toolCall(delta: ToolCallDelta): void {
    let call = this.calls.get(delta.index);
    if (delta.id !== undefined || call === undefined) {
      // A call's first delta carries its id and name.
      const item: FunctionCallItem = {
        id: newItemId("fc"),
        type: "function_call",
        status: "in_progress",
        call_id: delta.id ?? newItemId("fc"),
        name: delta.function.name ?? "",
        arguments: "",
      };
      const index = this.add(item);
      call = { index, item };
      this.calls.set(delta.index, call);
      this.open = { kind: "function_call", index, item };
    }
    const fragment = delta.function.arguments;
    if (fragment === "") return;
    call.item.arguments += fragment;
    const { item, index } = call;
    this.send(() => ({ type: "response.function_call_arguments.delta", item_id: item.id, output_index: index, delta: fragment }));
  }
}
