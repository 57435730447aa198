// Tool calls forced by tool_choice, whose output a grammar shapes (the model's
// own call format plays no part):
// - a named function: the whole answer is the arguments object;
// - "required": the answer is a JSON list of {"name": ..., "parameters": {...}}
//   objects, one per call (at most one with parallel_tool_calls false).
// Both stream like the other parsers: the call's name first, then argument
// fragments as the model writes them.

import { JsonCall } from "./json-call.js";
import { StreamingToolParser } from "./streaming-parser.js";
import type { ToolCallEmitter } from "./tool-call.js";

export class NamedCallParser extends StreamingToolParser {
  private begun = false;

  constructor(
    private readonly emitter: ToolCallEmitter,
    private readonly name: string,
  ) {
    super();
  }

  protected step(): boolean {
    if (!this.begun && (this.held !== "" || this.final)) {
      this.begun = true;
      this.calls(this.emitter.begin(this.name));
    }
    this.calls(this.emitter.args(this.held));
    this.held = "";
    return false;
  }
}

export class RequiredCallsParser extends StreamingToolParser {
  private state: "open" | "item" | "call" | "separator" | "done" = "open";
  private call: JsonCall | null = null;

  constructor(private readonly emitter: ToolCallEmitter) {
    super();
  }

  protected step(): boolean {
    switch (this.state) {
      case "open":
        if (!this.skipSpace()) return false;
        if (this.held[0] !== "[") return this.rest();
        this.held = this.held.slice(1);
        this.state = "item";
        return true;
      case "item":
        if (!this.skipSpace()) return false;
        if (this.held[0] === "]") {
          this.held = this.held.slice(1);
          this.state = "done";
          return true;
        }
        this.call = new JsonCall(this.emitter, "");
        this.state = "call";
        return true;
      case "call": {
        const call = this.call as JsonCall;
        const { result, deltas } = call.feed(this.held);
        this.calls(deltas);
        this.held = this.held.slice(result.used);
        if (result.error !== null) return this.rest();
        if (!result.done) return false;
        this.state = "separator";
        return true;
      }
      case "separator":
        if (!this.skipSpace()) return false;
        if (this.held[0] === ",") this.state = "item";
        else if (this.held[0] === "]") this.state = "done";
        else return this.rest();
        this.held = this.held.slice(1);
        return true;
      case "done":
        return this.rest();
    }
  }

  /** Text the grammar should not have let through (or anything after the list): content. */
  private rest(): boolean {
    this.state = "done";
    this.content(this.held);
    this.held = "";
    return false;
  }
}
