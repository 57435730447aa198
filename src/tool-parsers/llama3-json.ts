// llama3_json (Llama 3.1 / 3.2 JSON tool calling): the whole answer is one or
// more call objects, optionally after <|python_tag|>, separated by ";":
//
//   {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}
//
// An answer that does not start with a call object (after whitespace and the
// tag) is all content, as is anything after the calls that is not another one.

import { JsonCall } from "./json-call.js";
import { StreamingToolParser } from "./streaming-parser.js";
import type { ToolCallEmitter } from "./tool-call.js";

const PYTHON_TAG = "<|python_tag|>";

export class Llama3JsonToolParser extends StreamingToolParser {
  private state: "start" | "call" | "between" | "content" = "start";
  private call: JsonCall | null = null;

  constructor(private readonly emitter: ToolCallEmitter) {
    super();
  }

  protected step(): boolean {
    switch (this.state) {
      case "start": {
        // Undecided while the text is blank or may still become the tag; nothing is consumed until then.
        const lead = this.held.length - this.held.trimStart().length;
        let rest = this.held.slice(lead);
        let prefix = this.held.slice(0, lead);
        if (rest.startsWith(PYTHON_TAG)) {
          prefix += PYTHON_TAG;
          rest = rest.slice(PYTHON_TAG.length);
          const more = rest.length - rest.trimStart().length;
          prefix += rest.slice(0, more);
          rest = rest.slice(more);
        }
        if (rest === "" || (rest !== "" && PYTHON_TAG.startsWith(rest) && prefix.trim() === "")) {
          if (!this.final) return false;
          this.state = "content";
          return true;
        }
        if (!rest.startsWith("{")) {
          this.state = "content";
          return true;
        }
        this.held = rest;
        this.call = new JsonCall(this.emitter, prefix);
        this.state = "call";
        return true;
      }
      case "call": {
        const fed = this.feedCall(this.call as JsonCall);
        if (fed === "more") return false;
        this.state = fed === "done" ? "between" : "content";
        return true;
      }
      case "between": {
        if (!this.skipSpace()) return false;
        const c = this.held[0];
        if (c === ";") {
          this.held = this.held.slice(1);
          return true;
        }
        if (c === "{") {
          this.call = new JsonCall(this.emitter, "");
          this.state = "call";
          return true;
        }
        this.state = "content";
        return true;
      }
      case "content":
        this.content(this.held);
        this.held = "";
        return false;
    }
  }
}
