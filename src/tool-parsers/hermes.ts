// hermes (Hermes 2 Pro, Qwen2.5, Qwen3): each call is a JSON object between
// <tool_call> and </tool_call>:
//
//   Let me check.<tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
//
// Text before the first call is content; whitespace between and after calls
// is dropped; other text after a call is content again. A <tool_call> whose
// body is not a call object is content.

import { JsonCall } from "./json-call.js";
import { StreamingToolParser } from "./streaming-parser.js";
import type { ToolCallEmitter } from "./tool-call.js";

const START = "<tool_call>";
const END = "</tool_call>";

export class HermesToolParser extends StreamingToolParser {
  private state: "content" | "call" | "close" | "between" = "content";
  private call: JsonCall | null = null;

  constructor(private readonly emitter: ToolCallEmitter) {
    super();
  }

  protected step(): boolean {
    switch (this.state) {
      case "content":
        if (this.contentUntil([START]) === null) return false;
        this.beginCall();
        return true;
      case "call": {
        const fed = this.feedCall(this.call as JsonCall);
        if (fed === "more") return false;
        // Not a call after all: what follows is content too.
        this.state = fed === "done" ? "close" : "content";
        return true;
      }
      case "close": {
        if (!this.skipSpace()) return false;
        const found = this.startsWith([END]);
        if (found === "wait") return false;
        this.state = "between";
        return true;
      }
      case "between": {
        if (!this.skipSpace()) return false;
        const found = this.startsWith([START]);
        if (found === "wait") return false;
        if (found === null) this.state = "content";
        else this.beginCall();
        return true;
      }
    }
  }

  private beginCall(): void {
    this.call = new JsonCall(this.emitter, START);
    this.state = "call";
  }
}
